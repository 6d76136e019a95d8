"""HTTP wire layer: one small resolver per Lambda function, built from the route table.

Each function serves ``routes.for_function(name)``: an API Gateway REST proxy event goes in, a proxy
response comes out. The request body is parsed by ``schemas.parse_request``, because the contract
tells apart a body that is not understood (455) from a wrong value (400) and puts every error in its
envelope (docs/adr/0005-http-edge.md). Errors become the envelope here, once: domain errors through
``errors.STATUS_BY_ERROR``, anything else as a logged 500 with a generic message.

A scoped route (``/v1/queues/{queue}/<name>``) takes its queue from the event's ``pathParameters``,
which API Gateway fills with the segment decoded; it must be a name ``querator.api.paths`` calls
addressable, and the body may not name another queue (400 before the endpoint runs).

Routing is a lookup of method and path in the route table, so this module does it itself
rather than import Powertools' event handler, whose package import cost ~165 ms of every cold start
(measured; docs/adr/0013-cold-start.md). Logging, metrics and tracing stay Powertools'.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone
from functools import cache
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from querator.api import paths, routes, schemas
from querator.api.endpoints import ENDPOINTS, Call, idempotency_key, undone_on_failure
from querator.api.errors import WireError, error_response, unknown_path
from querator.domain.errors import QueratorError
from querator.observability import logger

if TYPE_CHECKING:
    from collections.abc import Callable

    from querator.config import Settings
    from querator.service import QueueService

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

_JSON = "application/json"
#: Replies from this status up are the service's fault: each is logged at error level with its cause.
SERVER_ERROR = 500

#: A proxy response: ``statusCode``, ``multiValueHeaders``, ``body``, ``isBase64Encoded``.
ProxyResponse = dict[str, Any]


class Request:
    """What a route's code reads of one proxy event: headers (any case), query, body, ids."""

    def __init__(self, event: dict[str, Any], context: Any) -> None:
        self.event = event
        self.context = context
        self.method = str(event.get("httpMethod") or "").upper()
        self.path = str(event.get("path") or "")
        headers: dict[str, str] = {}
        for name, values in (event.get("multiValueHeaders") or {}).items():
            if values:
                headers[name.lower()] = values[-1]
        for name, value in (event.get("headers") or {}).items():
            headers[name.lower()] = value
        self.headers = headers
        self.query: dict[str, str] = event.get("queryStringParameters") or {}
        self.request_id = str((event.get("requestContext") or {}).get("requestId") or "")
        #: The queue segment of a scoped route's path, as the path holds it (set by the resolver).
        self.segment: str | None = None

    def path_queue(self) -> str:
        """The queue of a scoped route: API Gateway's ``pathParameters.queue`` (already decoded), or
        for an event without it (a hand-made one) the path's segment decoded once; 400 unless it is
        addressable, so what the handler serves is the name IAM authorized, whatever the encoding."""
        given = (self.event.get("pathParameters") or {}).get(paths.QUEUE_PARAMETER)
        name = given if isinstance(given, str) else unquote(self.segment or "")
        return paths.check_addressable(name)


class FunctionApp:
    """The routes of one Lambda function; ``resolve`` is its entry point."""

    def __init__(
        self,
        handlers: dict[tuple[str, str], Callable[[Request], ProxyResponse]],
        *,
        service: Callable[[], QueueService] | None = None,
    ) -> None:
        self._handlers = handlers
        self._service = service

    def prepare(self) -> None:
        """Make the service (its clients): the work a first request would do before its own.
        ``observability.lambda_entry`` calls it in Lambda's init phase."""
        if self._service is not None:
            self._service()

    def resolve(self, event: dict[str, Any], context: Any) -> ProxyResponse:
        request = Request(event, context)
        try:
            handler = self._handlers.get((request.method, request.path))
            if handler is None:
                # A scoped path: its handler is keyed by the route's template.
                matched = routes.match(request.path)
                if matched is not None and matched[0].scoped:
                    handler = self._handlers.get((request.method, matched[0].path))
                    request.segment = matched[1]
            if handler is None:
                # A known path asked with another method is 400, an unknown one 501 (routes.resolve
                # raises), including a path another function serves (API Gateway never sends one).
                routes.resolve(request.method, request.path)
                raise unknown_path(request.method, request.path)
            return handler(request)
        except Exception as error:  # every error becomes the contract's envelope
            return _error(error, request)


def build_app(
    function: str, *, service: Callable[[], QueueService], settings: Callable[[], Settings]
) -> FunctionApp:
    """The resolver of one Lambda function.

    ``service`` and ``settings`` are called per request (they are cached by the caller), so
    importing a handler module creates no client and reads no environment.
    """
    served = routes.for_function(function)
    if not served:
        raise ValueError(f"no route is served by function {function!r}")
    return FunctionApp(
        {(route.method.upper(), route.path): _bind(route, service, settings) for route in served},
        service=service,
    )


def _error(error: Exception, request: Request) -> ProxyResponse:
    reply = error_response(error, request_id=request.request_id)
    if reply.status >= SERVER_ERROR and not isinstance(error, WireError):
        # The one place a 5xx is logged, at error level with its traceback: the reply says only
        # "Internal error; request id ...", so the log must hold the cause under that id. That
        # includes a domain error that maps to 500 (the store failing), not only an unexpected one.
        # A wire error's 501 is the contract's answer to a path that does not exist: the client's.
        # The id is in the message and in a key of its own: the correlation id Powertools adds is
        # shared by the threads of the local server, so it may be another request's there.
        context = _loggable(error) if isinstance(error, QueratorError) else {}
        logger.error(
            "%s %s failed with %d; request id %s",
            request.method,
            request.path,
            reply.status,
            request.request_id,
            exc_info=error,
            extra={
                "path": request.path,
                "status": reply.status,
                "request_id": request.request_id,
                "error": type(error).__name__,
                **context,
            },
        )
    elif isinstance(error, QueratorError) and error.context:
        logger.info("request refused", extra={"error": type(error).__name__, **_loggable(error)})
    return _json(reply.status, reply.body)


def _bind(
    route: routes.Route,
    service: Callable[[], QueueService],
    settings: Callable[[], Settings],
) -> Callable[[Request], ProxyResponse]:
    if route is routes.OPENAPI:
        return lambda _: _json(200, openapi_document())
    if route is routes.DOCS:

        def docs(request: Request) -> ProxyResponse:
            # Swagger UI shows "/docs?format=json" as the document's address (Powertools' page), so
            # that address serves the document, as it does behind Powertools' own Swagger route.
            if request.query.get("format") == "json":
                return _json(200, openapi_document())
            return _response(200, "text/html", swagger_page())

        return docs
    endpoint = ENDPOINTS[route.name]

    def serve(request: Request) -> ProxyResponse:
        parsed = None
        scoped_queue = request.path_queue() if route.scoped else None
        if route.request_model is not None:
            parsed = schemas.parse_request(
                route.request_model,
                _raw_body(request.event),
                content_type=request.headers.get("content-type"),
                limit=route.body_limit,
                queue_name=scoped_queue,
            )
        call = Call(
            now=datetime.now(UTC),
            wait_limit=_wait_limit(settings(), request.context),
            idempotency_key=idempotency_key(request.headers) if route.base is routes.PRODUCE else None,
            scoped_queue=scoped_queue,
        )
        # An error after the endpoint acted becomes the 500 it is, its effect undone first.
        with undone_on_failure(call, request.path):
            reply = endpoint(service(), parsed, call)
            return _json(200, reply.to_wire(), call.reply_headers)

    return serve


def _raw_body(event: dict[str, Any]) -> bytes:
    body = event.get("body") or ""
    if event.get("isBase64Encoded"):
        return base64.b64decode(body)
    return body.encode("utf-8") if isinstance(body, str) else bytes(body)


def _wait_limit(settings: Settings, context: Any) -> timedelta:
    """The platform cap on waiting, less than what the invocation has left (minus a second to reply)."""
    cap = settings.lease_wait_cap
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if remaining is not None:
        cap = min(cap, timedelta(milliseconds=max(0, remaining() - 1000)))
    return cap


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> ProxyResponse:
    return _response(status, _JSON, json.dumps(body, separators=(",", ":")), headers)


def _response(
    status: int, content_type: str, body: str, headers: dict[str, str] | None = None
) -> ProxyResponse:
    """A REST proxy response, headers as ``multiValueHeaders`` (what API Gateway v1 reads)."""
    multi = {"Content-Type": [content_type]}
    for name, value in (headers or {}).items():
        multi[name] = [value]
    return {"statusCode": status, "multiValueHeaders": multi, "body": body, "isBase64Encoded": False}


def _loggable(error: QueratorError) -> dict[str, str]:
    return {key: str(value) for key, value in error.context.items()}


@cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI document, built once per process (and its builder imported only then)."""
    from querator.api.openapi import build_openapi  # noqa: PLC0415 - only the meta function needs it

    return build_openapi()


@cache
def swagger_page() -> str:
    """Swagger UI with its script and style inlined from Powertools' package: no CDN needed."""
    # Imported here: it pulls in pydantic models that cost ~0.25 s of every cold start (measured).
    from importlib import resources  # noqa: PLC0415 - ~20 ms at import, for a page few ask for

    from aws_lambda_powertools.event_handler.openapi.swagger_ui.html import (  # noqa: PLC0415
        generate_swagger_html,
    )

    assets = resources.files("aws_lambda_powertools.event_handler.openapi.swagger_ui")
    return generate_swagger_html(
        # Inlined in a <script>: "</" would end it early, "<\/" is the same JSON string.
        spec=json.dumps(openapi_document()).replace("</", "<\\/"),
        swagger_js=assets.joinpath("swagger-ui-bundle.min.js").read_text(encoding="utf-8"),
        swagger_css=assets.joinpath("swagger-ui.min.css").read_text(encoding="utf-8"),
        swagger_base_url="",
        oauth2_config=None,
    )
