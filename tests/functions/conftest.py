"""Handler tests: real API Gateway / EventBridge events into the Lambda entry points, over moto."""

from __future__ import annotations

import base64
import contextlib
import copy
import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest
from moto import mock_aws

from querator import bootstrap
from querator.api import routes
from querator.config import EnvVar
from querator.localserver import LocalContext, response_headers
from querator.storage.dynamodb import schema
from querator.testing import s3_client

if TYPE_CHECKING:
    from collections.abc import Iterator

EVENTS = Path(__file__).parent.parent / "events"


def api_event(
    path: str, body: Any = None, *, method: str = "POST", headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """The recorded API Gateway REST proxy event, re-aimed at ``path`` with ``body``."""
    event: dict[str, Any] = json.loads((EVENTS / "apigw_rest_proxy.json").read_text())
    event = copy.deepcopy(event)
    event["resource"] = event["path"] = event["requestContext"]["resourcePath"] = path
    event["httpMethod"] = event["requestContext"]["httpMethod"] = method
    event["requestContext"]["path"] = f"/prod{path}"
    if headers is not None:
        event["headers"] = {**event["headers"], **headers}
        event["multiValueHeaders"] = {k: [v] for k, v in event["headers"].items()}
    if isinstance(body, bytes):
        event["body"], event["isBase64Encoded"] = base64.b64encode(body).decode(), True
    else:
        event["body"] = body if isinstance(body, str) or body is None else json.dumps(body)
    return event


def http_api_event(
    path: str, body: Any = None, *, method: str = "POST", headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """An HTTP API event in payload format 1.0 (``apiFlavour: http``, infra/constructs/http_api.py),
    re-aimed at ``path`` with ``body``: REST's shape plus ``version``, lower-case header names, the
    ``$default`` stage (no stage in ``path``), and ``$default`` as the resource of a catch-all miss."""
    event: dict[str, Any] = json.loads((EVENTS / "apigw_http_v1_proxy.json").read_text())
    event = copy.deepcopy(event)
    event["path"] = event["requestContext"]["path"] = path
    event["httpMethod"] = event["requestContext"]["httpMethod"] = method
    route = routes.by_path(path)
    routed = route is not None and route.method == method
    event["resource"] = event["requestContext"]["resourcePath"] = path if routed else "$default"
    event["requestContext"]["resourceId"] = f"{method} {path}" if routed else "$default"
    if headers is not None:
        lower = {name.lower(): value for name, value in headers.items()}
        event["headers"] = {**event["headers"], **lower}
        event["multiValueHeaders"] = {k: [v] for k, v in event["headers"].items()}
    if isinstance(body, bytes):
        event["body"], event["isBase64Encoded"] = base64.b64encode(body).decode(), True
    else:
        event["body"] = body if isinstance(body, str) or body is None else json.dumps(body)
    return event


class EventFactory(Protocol):
    def __call__(
        self, path: str, body: Any = None, *, method: str = "POST", headers: dict[str, str] | None = None
    ) -> dict[str, Any]: ...


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str]


class Api:
    """Invokes the function that serves each path, exactly as API Gateway would (its REST flavour, or
    the HTTP API's with ``event=http_api_event``)."""

    def __init__(self, event: EventFactory = api_event) -> None:
        self._event = event

    def call(
        self,
        path: str,
        body: Any = None,
        *,
        method: str = "POST",
        headers: dict[str, str] | None = None,
        function: str | None = None,
    ) -> Reply:
        matched = routes.match(path)  # a scoped path too: /v1/queues/<queue>/<route>
        name = function or (matched[0].function if matched else routes.Function.META)
        handler = importlib.import_module(f"functions.{name}.handler").lambda_handler
        result = handler(
            self._event(path, body, method=method, headers=headers),
            LocalContext(function_name=name, timeout_seconds=29),
        )
        text = result["body"]
        headers = response_headers(result)
        parsed = json.loads(text) if headers.get("Content-Type") == "application/json" else text
        return Reply(result["statusCode"], parsed, headers)

    def ok(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        reply = self.call(path, body, **kwargs)
        assert reply.status == 200, reply.body
        return reply.body


#: The functions' payload bucket (``QUERATOR_PAYLOAD_BUCKET``), on moto.
PAYLOAD_BUCKET = "functions-payloads"


def payload_objects() -> list[str]:
    """The keys in the functions' payload bucket."""
    reply = s3_client().list_objects_v2(Bucket=PAYLOAD_BUCKET)
    return [entry["Key"] for entry in reply.get("Contents", []) if "Key" in entry]


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    with _functions_over_moto(monkeypatch):
        yield Api()


@pytest.fixture
def http_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    """The same functions, invoked as the HTTP API flavour invokes them."""
    with _functions_over_moto(monkeypatch):
        yield Api(event=http_api_event)


@contextlib.contextmanager
def _functions_over_moto(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(EnvVar.ITEMS_TABLE, "items")
    monkeypatch.setenv(EnvVar.CATALOG_TABLE, "queues")
    monkeypatch.setenv(EnvVar.REGION, "us-east-1")
    monkeypatch.setenv(EnvVar.POWERTOOLS_METRICS_NAMESPACE, "QueratorTest")
    # As the stack's functions have it: payloads over 64 KiB, up to 1 MiB, go to this bucket.
    monkeypatch.setenv(EnvVar.PAYLOAD_BUCKET, PAYLOAD_BUCKET)
    with mock_aws():
        bootstrap.reset()
        schema.create_tables(bootstrap.get_client(), items_table="items", catalog_table="queues")
        s3_client().create_bucket(Bucket=PAYLOAD_BUCKET)
        yield
    bootstrap.reset()


def scheduled_event() -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / "eventbridge_scheduled.json").read_text())
    return event
