"""The Lambda side of ``querator serve``: the events and context the real handlers receive.

Each HTTP request becomes an API Gateway REST (v1) proxy event and goes to the ``lambda_handler`` of
the function that serves its route in AWS (``routes.Route.function``), so the local server runs the
same code path as the deployed stack; the reaper gets an EventBridge scheduled event.
"""

from __future__ import annotations

import base64
import importlib
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qsl

from querator.config import EnvVar

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

#: A Lambda handler: ``(event, context) -> proxy response``.
Handler = Callable[[dict[str, Any], Any], dict[str, Any]]


#: A Lambda handler: ``(event, context) -> proxy response``.
@dataclass
class LocalContext:
    """The parts of the Lambda context that the handlers and Powertools read."""

    function_name: str
    timeout_seconds: float
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    memory_limit_in_mb: int = 1024
    function_version: str = "$LATEST"
    log_group_name: str = "local"
    log_stream_name: str = "local"
    started: float = field(default_factory=time.monotonic)

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:local:000000000000:function:querator-{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.timeout_seconds - (time.monotonic() - self.started)) * 1000))


def load_handler(function: str) -> Handler:
    """The ``lambda_handler`` of ``functions/<function>/handler.py``."""
    module = importlib.import_module(f"functions.{function}.handler")
    handler: Handler = module.lambda_handler
    return handler


def proxy_event(
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes,
    source_ip: str,
    query: str = "",
    *,
    resource: str | None = None,
    path_parameters: dict[str, str] | None = None,
) -> dict[str, Any]:
    """An API Gateway REST proxy event, as API Gateway builds it for a Lambda proxy integration.

    ``resource`` is the route's path template (``/v1/queues/{queue}/queue.produce``) and
    ``path_parameters`` its values, decoded, as API Gateway passes them; by default the path itself.
    """
    pairs = parse_qsl(query, keep_blank_values=True)
    try:
        text, encoded = body.decode("utf-8"), False
    except UnicodeDecodeError:
        # API Gateway base64-encodes a body it cannot pass as text; the handler decodes it again.
        text, encoded = base64.b64encode(body).decode("ascii"), True
    request_id = str(uuid.uuid4())
    return {
        "resource": resource or path,
        "path": path,
        "httpMethod": method,
        "headers": headers,
        "multiValueHeaders": {name: [value] for name, value in headers.items()},
        # API Gateway sends null, not {}, when there is no query string.
        "queryStringParameters": dict(pairs) or None,
        "multiValueQueryStringParameters": _multi(pairs) or None,
        "pathParameters": path_parameters or None,
        "stageVariables": None,
        "body": text if body else None,
        "isBase64Encoded": encoded,
        "requestContext": {
            "resourcePath": resource or path,
            "httpMethod": method,
            "path": f"/local{path}",
            "stage": "local",
            "requestId": request_id,
            "extendedRequestId": request_id,
            "requestTimeEpoch": int(time.time() * 1000),
            "identity": {"sourceIp": source_ip, "userAgent": headers.get("User-Agent", "")},
            "accountId": "000000000000",
            "apiId": "local",
            "protocol": "HTTP/1.1",
        },
    }


def _multi(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for name, value in pairs:
        values.setdefault(name, []).append(value)
    return values


def scheduled_event() -> dict[str, Any]:
    """An EventBridge scheduled event, as the reaper receives it in AWS."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "000000000000",
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": os.environ.get(EnvVar.REGION, "us-east-1"),
        "resources": ["arn:aws:events:local:000000000000:rule/querator-reaper"],
        "detail": {},
    }


def response_headers(result: dict[str, Any]) -> dict[str, str]:
    """The headers of a proxy response: ``headers`` and ``multiValueHeaders`` (last value wins)."""
    headers = {name: values[-1] for name, values in (result.get("multiValueHeaders") or {}).items() if values}
    headers.update(result.get("headers") or {})
    return headers
