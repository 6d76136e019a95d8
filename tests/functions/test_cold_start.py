"""What a cold start does: no boto3 on the functions' path, one loader for both DynamoDB clients,
no pydantic, and the clients made in Lambda's init phase, not on the first request
(docs/adr/0013-cold-start.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from moto import mock_aws

from querator import bootstrap, observability
from querator.api import routes
from querator.api.gateway import build_app
from querator.config import EnvVar, in_lambda, load_settings
from querator.localserver import LocalContext
from querator.storage.dynamodb import schema
from querator.storage.dynamodb.catalog import DynamoDBQueueCatalog

ROOT = Path(__file__).resolve().parents[2]
HANDLERS = sorted(p.parent.name for p in (ROOT / "functions").glob("*/handler.py"))


def _fresh_interpreter(code: str) -> Any:
    """What ``code`` prints last (JSON), run by a fresh interpreter outside Lambda: in this one other
    tests may have imported or built what the caller checks."""
    env = {k: v for k, v in os.environ.items() if k != "LAMBDA_TASK_ROOT"}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(  # noqa: S603 - our interpreter running our own lines
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_every_function_handler_imports_without_boto3_or_s3transfer():
    # boto3's import brings s3transfer and its resource machinery, which no function uses; the
    # functions make their clients from botocore's session (bootstrap.make_client).
    code = (
        "import importlib, json, sys\n"
        f"for name in {HANDLERS!r}:\n"
        "    importlib.import_module(f'functions.{name}.handler')\n"
        "print(json.dumps(sorted(m for m in ('boto3', 's3transfer') if m in sys.modules)))\n"
    )
    assert _fresh_interpreter(code) == []
    assert len(HANDLERS) >= 9


def test_no_function_handler_imports_pydantic():
    # pydantic's import and models cost about 0.55x import boto3 of every cold start; the wire layer
    # is plain Python (docs/adr/0014-plain-python-wire-layer.md). Only the meta function's Swagger
    # page (Powertools) may bring it, on the request that asks for the page.
    code = (
        "import importlib, json, sys\n"
        f"for name in {HANDLERS!r}:\n"
        "    importlib.import_module(f'functions.{name}.handler')\n"
        "roots = ('pydantic', 'pydantic_core')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in roots)))\n"
    )
    assert _fresh_interpreter(code) == []


def test_the_catalog_reads_service_models_through_the_store_clients_loader():
    with mock_aws():
        session = bootstrap.botocore_session()
        try:
            catalog = DynamoDBQueueCatalog("queues-loader", region="us-east-1")
            catalog.share_loader(session)
            connection = catalog._model._get_connection().connection
            assert connection.session is not session
            assert connection.session.get_component("data_loader") is session.get_component("data_loader")
        finally:
            bootstrap.reset()


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, False),
        ({"LAMBDA_TASK_ROOT": "/var/task"}, True),
        ({"LAMBDA_TASK_ROOT": "/var/task", "AWS_SAM_LOCAL": "true"}, False),
        ({"LAMBDA_TASK_ROOT": "/var/task", "AWS_CHALICE_CLI_MODE": "true"}, False),
    ],
)
def test_in_lambda_follows_the_task_root_and_ignores_emulators(environ, expected):
    assert in_lambda(environ) is expected


def _echo(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return {"statusCode": 200, "body": json.dumps(event)}


def test_prepare_runs_at_wrapping_time_in_lambda_only(monkeypatch):
    calls: list[str] = []
    monkeypatch.delenv("LAMBDA_TASK_ROOT", raising=False)
    observability.lambda_entry(_echo, correlation_id_path=None, prepare=lambda: calls.append("outside"))
    assert calls == []
    monkeypatch.setenv("LAMBDA_TASK_ROOT", "/var/task")
    monkeypatch.setenv(EnvVar.POWERTOOLS_TRACE_DISABLED, "true")
    observability.lambda_entry(_echo, correlation_id_path=None, prepare=lambda: calls.append("in lambda"))
    assert calls == ["in lambda"]


def test_a_failed_prepare_is_logged_and_leaves_the_handler_working(monkeypatch, caplog):
    monkeypatch.setenv("LAMBDA_TASK_ROOT", "/var/task")
    monkeypatch.setenv(EnvVar.POWERTOOLS_TRACE_DISABLED, "true")

    def failing() -> None:
        raise RuntimeError("no tables configured")

    handler = observability.lambda_entry(_echo, correlation_id_path=None, prepare=failing)
    [record] = [r for r in caplog.records if r.getMessage() == observability.WARM_UP_FAILED]
    assert record.levelname == "WARNING"
    assert record.exc_info is not None
    reply = handler({"ping": 1}, LocalContext(function_name="echo", timeout_seconds=3))
    assert reply["statusCode"] == 200
    assert json.loads(reply["body"]) == {"ping": 1}


def test_a_function_app_makes_its_service_on_prepare_not_when_built():
    made: list[str] = []
    app = build_app(routes.Function.LEASE, service=lambda: made.append("service"), settings=load_settings)
    assert made == []
    app.prepare()
    assert made == ["service"]


def test_the_lease_handler_made_in_lambda_has_its_clients_before_the_first_request(monkeypatch):
    monkeypatch.setenv(EnvVar.ITEMS_TABLE, "items")
    monkeypatch.setenv(EnvVar.CATALOG_TABLE, "queues")
    monkeypatch.setenv(EnvVar.REGION, "us-east-1")
    monkeypatch.setenv("LAMBDA_TASK_ROOT", str(ROOT / "functions" / "lease"))
    monkeypatch.setenv(EnvVar.POWERTOOLS_TRACE_DISABLED, "true")
    with mock_aws():
        bootstrap.reset()
        try:
            app = build_app(routes.Function.LEASE, service=bootstrap.get_service, settings=load_settings)
            assert bootstrap.get_service.cache_info().currsize == 0
            observability.lambda_entry(app.resolve, prepare=app.prepare)
            assert bootstrap.get_service.cache_info().currsize == 1
            assert bootstrap.get_client.cache_info().currsize == 1
            # The prepared service serves: a lease on a queue that does not exist is the 400 it
            # would be on a first request.
            schema.create_tables(bootstrap.get_client(), items_table="items", catalog_table="queues")
            reply = app.resolve(
                {
                    "httpMethod": "POST",
                    "path": "/v1/queue.lease",
                    "headers": {"Content-Type": "application/json"},
                    "body": json.dumps({"queue_name": "nope", "batch_size": 1, "client_id": "c"}),
                    "requestContext": {},
                },
                None,
            )
            assert reply["statusCode"] == 400
            assert "does not exist" in json.loads(reply["body"])["message"]
        finally:
            bootstrap.reset()
