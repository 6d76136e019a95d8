"""``./run serve`` on a fresh environment: it says what it installs, installs what serving needs and
nothing else (no PySpark, CDK or test tools), and the server it starts answers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.server, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not on PATH")
def test_run_serve_installs_only_what_serving_needs(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    env = {
        **os.environ,
        # A fresh environment of its own, filled from uv's cache (no network in the tests).
        "UV_PROJECT_ENVIRONMENT": str(venv),
        "UV_OFFLINE": "1",
    }
    env.pop("AWS_ENDPOINT_URL_DYNAMODB", None)
    env.pop("VIRTUAL_ENV", None)
    child = subprocess.Popen(  # noqa: S603 - the repository's own script
        [str(ROOT / "run"), "serve", "--port", "0", "--quiet"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        assert line.startswith("Querator listening on http://127.0.0.1:"), (
            child.stderr.read() if child.stderr else ""
        )
        url = line.removeprefix("Querator listening on ")
        with urllib.request.urlopen(f"{url}/health", timeout=10) as reply:  # noqa: S310 - 127.0.0.1
            assert json.loads(reply.read()) == {"status": "pass"}
    finally:
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=30)
    assert err.startswith(f"./run serve: first run: installing what the server needs into {venv} ")
    site = next(venv.glob("lib/python*/site-packages"))
    installed = {path.name.lower() for path in site.iterdir()}
    assert {"moto", "boto3", "pydantic", "aws_lambda_powertools"} <= installed
    for absent in ("pytest", "pyspark", "aws_cdk", "mypy", "cfnlint", "sympy"):
        assert absent not in installed, absent
