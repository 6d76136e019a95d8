"""HTTP wire layer: one Powertools REST resolver per Lambda function, built from the route table.

Each function serves ``routes.for_function(name)``. The resolver routes; the request body is parsed
by ``schemas.parse_request`` rather than by the resolver's own validation, because the contract
tells apart a body that is not understood (455) from a wrong value (400) and puts every error in its
envelope, which the resolver's 422 cannot do (docs/adr/0005-http-edge.md). Errors become the
envelope here, once: domain errors through ``errors.STATUS_BY_ERROR``, anything else as a logged 500
with a generic message.
"""

from __future__ import annotations

import base64
import json
import re
from datetime import datetime, timedelta, timezone
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError

from querator.api import routes, schemas
from querator.api.endpoints import ENDPOINTS, Call, idempotency_key
from querator.api.errors import WireError, error_response, unknown_path
from querator.api.openapi import build_openapi
from querator.domain.errors import QueratorError
from querator.observability import logger

if TYPE_CHECKING:
    from collections.abc import Callable

    from querator.config import Settings
    from querator.service import QueueService

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

_JSON = "application/json"


def build_app(
    function: str, *, service: Callable[[], QueueService], settings: Callable[[], Settings]
) -> APIGatewayRestResolver:
    """The resolver of one Lambda function.

    ``service`` and ``settings`` are called per request (they are cached by the caller), so
    importing a handler module creates no client and reads no environment.
    """
    app = APIGatewayRestResolver(strip_prefixes=None)
    served = routes.for_function(function)
    if not served:
        raise ValueError(f"no route is served by function {function!r}")
    for route in served:
        # The route table's paths contain dots, which the resolver would read as regex wildcards.
        app.route(rule=re.escape(route.path), method=route.method)(_bind(app, route, service, settings))

    @app.not_found
    def _not_found(_: NotFoundError) -> Response[str]:
        event = app.current_event
        # A known path asked with another method is 400, an unknown one 501 (routes.resolve raises).
        routes.resolve(event.http_method, event.path)
        raise unknown_path(event.http_method, event.path)

    def _error(error: Exception) -> Response[str]:
        request_id = app.current_event.request_context.request_id
        if not isinstance(error, QueratorError | WireError):
            # The one place an unexpected error is logged; the reply says only "Internal error".
            logger.exception("unhandled error", extra={"path": app.current_event.path})
        elif isinstance(error, QueratorError) and error.context:
            logger.info("request refused", extra={"error": type(error).__name__, **_loggable(error)})
        reply = error_response(error, request_id=request_id)
        return _json(reply.status, reply.body)

    # Matched through the MRO, so every exception ends here (the resolver would re-raise it: a 502).
    app.exception_handler(Exception)(_error)
    return app


def _bind(
    app: APIGatewayRestResolver,
    route: routes.Route,
    service: Callable[[], QueueService],
    settings: Callable[[], Settings],
) -> Callable[[], Response[str]]:
    if route is routes.OPENAPI:
        return lambda: _json(200, openapi_document())
    if route is routes.DOCS:

        def docs() -> Response[str]:
            # Swagger UI shows "/docs?format=json" as the document's address (Powertools' page), so
            # that address serves the document, as it does behind Powertools' own Swagger route.
            query = app.current_event.query_string_parameters or {}
            if query.get("format") == "json":
                return _json(200, openapi_document())
            return Response(status_code=200, content_type="text/html", body=swagger_page())

        return docs
    endpoint = ENDPOINTS[route.name]

    def serve() -> Response[str]:
        event = app.current_event
        request = None
        if route.request_model is not None:
            request = schemas.parse_request(
                route.request_model,
                _raw_body(event.raw_event),
                content_type=event.headers.get("content-type"),  # case-insensitive lookup
                limit=route.body_limit,
            )
        call = Call(
            now=datetime.now(UTC),
            wait_limit=_wait_limit(settings(), app.lambda_context),
            idempotency_key=idempotency_key(event.headers) if route is routes.PRODUCE else None,
        )
        reply = endpoint(service(), request, call)
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


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response[str]:
    return Response(
        status_code=status,
        content_type=_JSON,
        body=json.dumps(body, separators=(",", ":")),
        headers=headers or None,
    )


def _loggable(error: QueratorError) -> dict[str, str]:
    return {key: str(value) for key, value in error.context.items()}


@cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI document, built once per process."""
    return build_openapi()


@cache
def swagger_page() -> str:
    """Swagger UI with its script and style inlined from Powertools' package: no CDN needed."""
    # Imported here: it pulls in pydantic models that cost ~0.25 s of every cold start (measured).
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
