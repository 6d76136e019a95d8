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
import json
import subprocess
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


@pytest.fixture(scope="module")
def artifacts(lambda_runtime: tuple[str, Path], host_layer: Path) -> dict[str, str]:
    """The runtime's Python and SDK, and the layer built for this machine (conftest, shared)."""
    python, sdk = lambda_runtime
    return {"python": python, "layer": str(host_layer / "python"), "runtime": str(sdk)}


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
