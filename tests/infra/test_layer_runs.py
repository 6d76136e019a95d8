"""The built artifacts run: every function, from its own folder plus the layer, on the runtime's Python.

Each handler is invoked in a CPython 3.12 process started with ``-S`` whose ``sys.path`` holds only
the function folder, the layer and the runtime's SDK (boto3 at the locked version), against a
single-threaded moto server. A module the layer strips but a handler needs, a dependency missing
from the lock export, or a wheel for the wrong Python fails here instead of in Lambda. The layer is
built for this machine's architecture (x86_64 here); the arm64 build differs only in the platform of
the same pinned wheels, which ``test_layer_build.py`` checks.
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import platform
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from querator.config import METRICS_NAMESPACE, SERVICE_NAME, EnvVar
from querator.storage.dynamodb import schema
from querator.testing import dynamodb_client

pytestmark = pytest.mark.infra

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("lambda_driver.py")
EVENTS = ROOT / "tests" / "events"
RUNTIME = "python3.12"


def _runtime_python() -> str | None:
    """A working CPython 3.12 (a pyenv shim on PATH may exist without a usable interpreter)."""
    candidates = [str(p) for p in sorted(Path.home().glob(".pyenv/versions/3.12*/bin/python3.12"))]
    candidates += [found] if (found := shutil.which("python3.12")) else []
    for candidate in candidates:
        probe = subprocess.run(  # noqa: S603 - probing a candidate interpreter
            [candidate, "-S", "-c", "import sys; print(sys.version_info[:2] == (3, 12))"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        if probe.stdout.strip() == "True":
            return candidate
    return None


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    python = _runtime_python()
    if python is None:
        pytest.skip("no CPython 3.12 on this machine to stand in for the Lambda runtime")
    root = tmp_path_factory.mktemp("lambda")
    architecture = "arm64" if platform.machine() in {"aarch64", "arm64"} else "x86_64"
    subprocess.run(  # noqa: S603 - the project's build script with fixed arguments
        [sys.executable, str(ROOT / "layers/core/build.py"), "--runtime", RUNTIME,
         "--architecture", architecture, "--out", str(root / "layer")],
        cwd=ROOT, check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    # What the Lambda runtime provides and the layer leaves out: boto3 and its dependencies.
    platform_tag = ("aarch64" if architecture == "arm64" else "x86_64") + "-manylinux_2_28"
    uv = shutil.which("uv")
    assert uv, "uv is not on PATH"
    subprocess.run(  # noqa: S603
        [uv, "pip", "install", "--quiet", "--only-binary", ":all:", "--python-version", "3.12",
         "--python-platform", platform_tag, "--target", str(root / "runtime"),
         f"boto3=={importlib.metadata.version('boto3')}"],
        cwd=ROOT, check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return {"python": python, "layer": str(root / "layer" / "python"), "runtime": str(root / "runtime")}


@pytest.fixture(scope="module")
def tables(moto_server: str) -> dict[str, str]:
    prefix = f"layer-{uuid.uuid4().hex[:8]}"
    names = {"items_table": f"{prefix}-items", "catalog_table": f"{prefix}-catalog"}
    schema.create_tables(dynamodb_client(moto_server), **names)
    return {**names, "endpoint": moto_server}


def api_event(method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    event: dict[str, Any] = copy.deepcopy(json.loads((EVENTS / "apigw_rest_proxy.json").read_text()))
    event["resource"] = event["path"] = event["requestContext"]["resourcePath"] = path
    event["httpMethod"] = event["requestContext"]["httpMethod"] = method
    event["body"] = None if body is None else json.dumps(body)
    return event


def invoke(
    artifacts: dict[str, str], tables: dict[str, str], steps: list[tuple[str, dict[str, Any]]]
) -> list[Any]:
    env = {
        "PATH": "/usr/bin:/bin",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_DYNAMODB": tables["endpoint"],
        EnvVar.ITEMS_TABLE: tables["items_table"],
        EnvVar.CATALOG_TABLE: tables["catalog_table"],
        EnvVar.POWERTOOLS_SERVICE_NAME: SERVICE_NAME,
        EnvVar.POWERTOOLS_METRICS_NAMESPACE: METRICS_NAMESPACE,
        EnvVar.POWERTOOLS_TRACE_DISABLED: "true",
    }
    plan = {
        "functions_root": str(ROOT / "functions"),
        "layer": artifacts["layer"],
        "runtime": artifacts["runtime"],
        "steps": [{"function": function, "event": event} for function, event in steps],
    }
    result = subprocess.run(  # noqa: S603 - a standard interpreter running the driver next to this file
        [artifacts["python"], "-S", str(DRIVER)],
        input=json.dumps(plan), env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("RESULTS ")]
    results: list[Any] = json.loads(line.removeprefix("RESULTS "))
    return results


def test_every_function_runs_from_its_folder_and_the_layer_on_the_runtime_python(
    artifacts: dict[str, str], tables: dict[str, str]
) -> None:
    queue = f"q{uuid.uuid4().hex[:8]}"
    # GIVEN a queue with two items, through meta, queues, produce and lease
    health, created, produced, leased = invoke(
        artifacts,
        tables,
        [
            ("meta", api_event("GET", "/health")),
            ("queues", api_event("POST", "/v1/queues.create",
                                 {"queue_name": queue, "lease_timeout": "30s", "expire_timeout": "1h"})),
            ("produce", api_event("POST", "/v1/queue.produce",
                                  {"queue_name": queue, "items": [{"utf8": "a"}, {"utf8": "b"}]})),
            ("lease", api_event("POST", "/v1/queue.lease",
                                {"queue_name": queue, "batch_size": 2, "client_id": "layer",
                                 "request_timeout": "1s"})),
        ],
    )  # fmt: skip
    assert [r["statusCode"] for r in (health, created, produced, leased)] == [200, 200, 200, 200]
    lease = json.loads(leased["body"])
    assert len(lease["items"]) == 2
    # WHEN the items are completed through items, counted through admin, and the reaper runs
    scheduled = json.loads((EVENTS / "eventbridge_scheduled.json").read_text())
    ids = [item["id"] for item in lease["items"]]
    completed, stats, reaped = invoke(
        artifacts,
        tables,
        [
            ("items", api_event("POST", "/v1/queue.complete",
                                {"queue_name": queue, "partition": lease.get("partition", 0), "ids": ids})),
            ("admin", api_event("POST", "/v1/queue.stats", {"queue_name": queue})),
            ("reaper", scheduled),
        ],
    )  # fmt: skip
    # THEN each answered as in the handler tests: the queue is empty and the reaper finished
    assert completed["statusCode"] == 200, completed
    assert stats["statusCode"] == 200, stats
    partitions = [p for q in json.loads(stats["body"])["logicalQueues"] for p in q["partitions"]]
    assert sum(p.get("total", 0) for p in partitions) == 0
    assert isinstance(reaped, dict)
