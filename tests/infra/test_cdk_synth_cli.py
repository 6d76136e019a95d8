"""``npx cdk synth`` as a user runs it on a fresh clone: offline, no AWS credentials, real assets.

``./run test`` installs the pinned CLI (``npm ci``) first; the layer comes from ``layers/core/build.py``
(cached by source hash). Network access is cut by pointing every proxy at a closed local port, so a
synth that tried to reach AWS or a registry would fail here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from infra.permissions import FUNCTION_NAMES

pytestmark = pytest.mark.infra

ROOT = Path(__file__).resolve().parents[2]
CDK_CLI = ROOT / "node_modules" / ".bin" / "cdk"
DEAD_PROXY = "http://127.0.0.1:9"


def offline_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CDK_"))}
    env.update(
        HTTP_PROXY=DEAD_PROXY,
        HTTPS_PROXY=DEAD_PROXY,
        http_proxy=DEAD_PROXY,
        https_proxy=DEAD_PROXY,
        NO_PROXY="",
        UV_OFFLINE="1",
        AWS_EC2_METADATA_DISABLED="true",
        JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20",
    )
    return env


@pytest.fixture(scope="module")
def cli_synth(built_layer: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert CDK_CLI.exists(), "node_modules is missing: run `npm ci` (./run test does)"
    assert shutil.which("uv"), "uv is not on PATH (cdk.json runs the app with uv)"
    outdir = tmp_path_factory.mktemp("cdk-cli") / "cdk.out"
    result = subprocess.run(  # noqa: S603 - the pinned CLI with fixed arguments
        [str(CDK_CLI), "synth", "--quiet", "--output", str(outdir)],
        cwd=ROOT,
        env=offline_environment(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return outdir


def test_cdk_synth_writes_the_dev_stack_offline_without_credentials(cli_synth: Path) -> None:
    template = json.loads((cli_synth / "querator-dev.template.json").read_text(encoding="utf-8"))
    functions = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]
    assert len(functions) == len(FUNCTION_NAMES)
    report = json.loads((cli_synth / "validation-report.json").read_text(encoding="utf-8"))
    assert report["pluginReports"] == []


def test_cdk_synth_packages_the_built_layer_and_each_functions_own_folder(cli_synth: Path) -> None:
    assets = json.loads((cli_synth / "querator-dev.assets.json").read_text(encoding="utf-8"))["files"]
    folders = [
        cli_synth / asset["source"]["path"]
        for asset in assets.values()
        if asset["source"].get("packaging") == "zip"
    ]
    layers = [f for f in folders if (f / "python" / "querator" / "__init__.py").is_file()]
    assert len(layers) == 1
    assert not (layers[0] / ".build-stamp.json").exists()
    handlers = [f for f in folders if (f / "handler.py").is_file()]
    assert len(handlers) == len(FUNCTION_NAMES)
    for folder in handlers:
        assert not list(folder.rglob("__pycache__"))
