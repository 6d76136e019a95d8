"""HTTP wire layer: the OpenAPI 3.1 document, built from ``ROUTES`` and the wire messages.

Generated, never hand-written, so it cannot drift from what the handlers accept. Request schemas use
the snake_case names (camelCase is accepted too but not advertised); every POST lists the contract's
error statuses with the error envelope.
"""

from __future__ import annotations

import copy
from collections.abc import Collection
from importlib import metadata
from typing import Any, Final, Literal

from querator.api import routes
from querator.api.errors import (
    BAD_REQUEST,
    INTERNAL_ERROR,
    PAYLOAD_TOO_LARGE,
    REQUEST_FAILED,
    RETRY_REQUEST,
    UNSUPPORTED_CONTENT,
    ErrorBody,
    code_text,
)
from querator.api.paths import QUEUE_PARAMETER
from querator.api.wire import Message

_REF: Final = "#/components/schemas/{model}"
_JSON: Final = "application/json"
#: What each error status means on this API (contract's table), for the response descriptions.
_ERROR_MEANING: Final = {
    BAD_REQUEST: "Invalid request, unknown queue, unknown or stale item id, item not leased.",
    PAYLOAD_TOO_LARGE: "Body over the endpoint's size limit.",
    REQUEST_FAILED: "Valid request that cannot succeed now (queue being deleted, dead-letter queue missing).",
    RETRY_REQUEST: "Try again: nothing to lease before the timeout, or throttled by the store.",
    UNSUPPORTED_CONTENT: (
        "Body empty or not JSON, a key the message does not define, or a non-JSON Content-Type."
    ),
    INTERNAL_ERROR: "Unexpected; the message is generic and the details are in the service log.",
}
#: A real message of each status ("<stable class>; <details>"), for the examples.
_EXAMPLE_MESSAGE: Final = {
    BAD_REQUEST: "Queue does not exist; queue 'orders' does not exist",
    PAYLOAD_TOO_LARGE: (
        "Request is over the size limit; body is 300000 bytes; this endpoint takes at most 262144"
    ),
    REQUEST_FAILED: "Queue is being deleted; queue 'orders' is being deleted",
    RETRY_REQUEST: "Nothing to lease before the request timeout",
    UNSUPPORTED_CONTENT: "Unsupported content; items[0].colour: unknown key",
    INTERNAL_ERROR: "Internal error; request id 3f0c2a8e-5b1d-4e0f-9a57-1c2d3e4f5a6b",
}
_POST_ERRORS: Final = (BAD_REQUEST, PAYLOAD_TOO_LARGE, REQUEST_FAILED, RETRY_REQUEST, UNSUPPORTED_CONTENT)

#: One short request per route, shown in the document and checked against the models by the tests.
EXAMPLES: Final[dict[str, dict[str, Any]]] = {
    "queues.create": {
        "queue_name": "orders",
        "lease_timeout": "1m",
        "expire_timeout": "24h",
        "max_attempts": 5,
        "dead_queue": "orders-dead",
        "requested_partitions": 4,
        "delivery": "fair",
        "max_leased_per_group": 10,
        "rate_limit": 20,
        "rate_limit_per_group": 5,
    },
    "queues.update": {"queue_name": "orders", "lease_timeout": "5m"},
    "queues.info": {"queue_name": "orders"},
    "queues.list": {"pivot": "", "limit": 100},
    "queues.delete": {"queue_name": "orders"},
    "queue.produce": {
        "queue_name": "orders",
        "items": [
            {"reference": "account-0001", "kind": "order-v1", "encoding": "json", "utf8": '{"id": 1}'},
            {"bytes": "aGVsbG8=", "enqueue_at": "2026-11-22T05:33:11Z"},
            {"utf8": "urgent", "priority": 0, "group": "tenant-42"},
            {"utf8": "in five minutes", "enqueue_in": "5m"},
        ],
    },
    "queue.lease": {
        "queue_name": "orders",
        "batch_size": 10,
        "client_id": "worker-1",
        "request_timeout": "15s",
    },
    "queue.complete": {"queue_name": "orders", "partition": 0, "ids": ["0006442f1a2b3c4d00000000010a1b2c"]},
    "queue.retry": {
        "queue_name": "orders",
        "partition": 0,
        "items": [
            {"id": "0006442f1a2b3c4d00000000010a1b2c", "retry_at": "2026-11-22T06:00:00Z"},
            {"id": "0006442f1a2b3c4d00000000020a1b2c", "dead": True},
            {"id": "0006442f1a2b3c4d00000000030a1b2c", "priority": 8},
            {"id": "0006442f1a2b3c4d00000000040a1b2c", "retry_in": "30s"},
        ],
    },
    "queue.renew": {
        "queue_name": "orders",
        "partition": 0,
        "ids": ["0006442f1a2b3c4d00000000010a1b2c"],
        "lease_timeout": "2m",
    },
    "queue.reprioritize": {
        "queue_name": "orders",
        "partition": 0,
        "ids": ["0006442f1a2b3c4d00000000010a1b2c"],
        "priority": 1,
    },
    "queue.stats": {"queue_name": "orders"},
    "stream.ticket": {"queue_name": "orders"},
    "queue.clear": {"queue_name": "orders", "queue": True, "scheduled": True},
    "queue.redrive": {"queue_name": "orders-dead", "to": "orders", "limit": 1000},
    "storage/items.list": {"queue_name": "orders", "partition": 0, "limit": 100},
    "storage/scheduled.list": {"queue_name": "orders", "partition": 0},
    "storage/items.import": {
        "queue_name": "orders",
        "partition": 0,
        "items": [{"source_id": "0006442f1a2b3c4d00000000010a1b2c", "attempts": 1, "payload": "aGVsbG8="}],
    },
    "storage/items.delete": {
        "queue_name": "orders",
        "partition": 0,
        "ids": ["0006442f1a2b3c4d00000000010a1b2c"],
    },
}

_IDEMPOTENCY_KEY: Final = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "A retried produce with the same key returns the first reply instead of storing twice.",
    "schema": {"type": "string", "maxLength": 256},
}

#: The queue of a scoped route (``/v1/queues/{queue}/<route>``), what an IAM policy on the path grants.
_QUEUE_PARAMETER: Final = {
    "name": QUEUE_PARAMETER,
    "in": "path",
    "required": True,
    "description": (
        "The queue this call is on; the body's queue_name may be left out, and naming another queue "
        "is a 400. Only names of ASCII letters, digits, '.', '_' and '-' (not '.' or '..') have a "
        "scoped path; other queues are served by the plain route."
    ),
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,512}$"},
}

_REPLAYED_HEADER: Final = {
    "description": (
        "Sent when the request had an Idempotency-Key: 'true' when an earlier request with the key "
        "stored the items and this one stored nothing, else 'false'."
    ),
    "schema": {"type": "string", "enum": ["true", "false"]},
}


def _schemas(
    messages: Collection[type[Message]],
) -> tuple[dict[type[Message], dict[str, Any]], dict[str, Any]]:
    """A ``$ref`` to each message's schema, and the schemas (theirs and those they nest)."""
    defs: dict[str, Any] = {}
    refs = {m: m.schema_ref(defs, _REF) for m in sorted(messages, key=lambda m: m.__name__)}
    return refs, dict(sorted(defs.items()))


def _in_queue(ref: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """The ``$ref`` of a scoped route's request: the plain one's schema with ``queue_name``
    optional, since the path names the queue (``<Model>InQueue``, added to ``defs`` once)."""
    name = ref["$ref"].rsplit("/", 1)[1]
    scoped = f"{name}InQueue"
    if scoped not in defs:
        schema = copy.deepcopy(defs[name])
        schema["title"] = scoped
        schema["required"] = [key for key in schema.get("required", []) if key != "queue_name"]
        if not schema["required"]:
            del schema["required"]
        schema["description"] = (
            f"{schema.get('description', '')} On a scoped path the body may leave `queue_name` out; "
            "if it names one, it must be the path's."
        ).strip()
        defs[scoped] = schema
    return {"$ref": _REF.format(model=scoped)}


def _operation_id(route: routes.Route) -> str:
    plain = route.name.replace("/", "_").replace(".", "_")
    return f"{plain}_in_queue" if route.scoped else plain


def _error_response(status: int) -> dict[str, Any]:
    return {
        "description": f"{code_text(status)}: {_ERROR_MEANING[status]}",
        "content": {
            _JSON: {
                "schema": {"$ref": _REF.format(model="ErrorBody")},
                "example": {
                    "code": status,
                    "code_text": code_text(status),
                    "message": _EXAMPLE_MESSAGE[status],
                },
            }
        },
    }


def build_openapi(*, version: str | None = None, server_url: str | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 document of every route in ``routes.ROUTES``.

    ``version`` defaults to the installed package's; ``server_url`` adds a ``servers`` entry.
    """
    requests = {r.request_model for r in routes.ROUTES if r.request_model is not None}
    responses = {r.response_model for r in routes.ROUTES if r.response_model is not None} | {ErrorBody}
    # Requests are documented by field name (snake_case, as the contract spells keys; camelCase is
    # accepted too); responses by the key they write (the one alias, logicalQueues).
    refs, defs = _schemas(requests | responses)

    paths: dict[str, Any] = {}
    for route in routes.ROUTES:
        operation: dict[str, Any] = {
            "operationId": _operation_id(route),
            "summary": route.summary,
            "tags": [route.function],
        }
        if route.scoped:
            operation["description"] = (
                f"POST /v1/{route.name} for the queue in the path, so that an IAM policy on this "
                "path can grant one queue or a prefix of queues."
            )
        if route.request_model is not None:
            schema = _in_queue(refs[route.request_model], defs) if route.scoped else refs[route.request_model]
            operation["requestBody"] = {
                "required": True,
                "description": f"At most {route.body_limit:,} bytes.",
                "content": {
                    _JSON: {
                        "schema": schema,
                        "example": EXAMPLES.get(route.name, {}),
                    }
                },
            }
        parameters = [_QUEUE_PARAMETER] if route.scoped else []
        if route.base is routes.PRODUCE:
            parameters.append(_IDEMPOTENCY_KEY)
        if parameters:
            operation["parameters"] = parameters
        ok_schema: dict[str, Any] = (
            refs[route.response_model]
            if route.response_model is not None
            else {"type": "string"}
            if route is routes.DOCS
            else {"type": "object"}
        )
        media = "text/html" if route is routes.DOCS else _JSON
        operation["responses"] = {"200": {"description": "OK", "content": {media: {"schema": ok_schema}}}}
        statuses = (*_POST_ERRORS, INTERNAL_ERROR) if route.method == "POST" else (INTERNAL_ERROR,)
        if route.base is routes.PRODUCE:
            operation["responses"]["200"]["headers"] = {"Idempotency-Replayed": _REPLAYED_HEADER}
        for status in statuses:
            operation["responses"][str(status)] = {"$ref": f"#/components/responses/Error{status}"}
        method: Literal["get", "post"] = "post" if route.method == "POST" else "get"
        paths.setdefault(route.path, {})[method] = operation

    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "querator",
            "version": version or _package_version(),
            "description": (
                # Markdown: code spans keep "<stable class>" from being read (and dropped) as HTML.
                "A lease (reservation) FIFO queue. Every call is POST with a JSON body; durations are "
                "Go strings (`30s`, `1h30m`), timestamps RFC 3339. Errors carry "
                '`{"code", "code_text", "message"}` with `message` = `"<stable class>; <details>"`: '
                "split it on the first `;`. The reference is docs/api.md in the repository."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": dict(sorted(defs.items())),
            "responses": {
                f"Error{status}": _error_response(status) for status in (*_POST_ERRORS, INTERNAL_ERROR)
            },
        },
    }
    if server_url:
        document["servers"] = [{"url": server_url}]
    return document


def _package_version() -> str:
    try:
        return metadata.version("querator")
    except metadata.PackageNotFoundError:
        # Running from a source tree that was never installed (e.g. a bare Lambda zip).
        return "0.0.0"
