"""The stream protocol's messages: what a consumer sends over the WebSocket and what it receives.

Every message is one JSON object in a text frame with a ``type`` (docs/api.md, "Streaming"):

client → server
    ``subscribe {queue_name, credit, client_id?, ticket?}``: start receiving leased items of one
    queue; the server may hold up to ``credit`` items leased for this connection at once. ``ticket``
    (``stream.ticket``) is what a deployed stack checks for per-queue access.
    ``credit {credit}``: return credit for items settled over the HTTP API.
    ``ping``: nothing but proof of life (API Gateway closes a connection idle for 10 minutes).
    ``complete {request_id, partition, ids}``, ``retry {request_id, partition, items}``,
    ``renew {request_id, partition, ids, lease_timeout?}``: as the HTTP calls; each id the call
    completed or retried returns its credit (``querator.stream.session.settlement``).

server → client
    ``subscribed {queue_name, credit}``; ``lease {queue_name, partition, items}`` (the shape of a
    ``queue.lease`` reply); ``part {id, index, bytes}`` (a deployed stack: the payload of an item
    too large for one 128 KB message, in order); ``ok {request_id, reply}``; ``error {request_id?,
    code, code_text, message}`` (the HTTP error envelope); ``pong`` (the answer to ``ping``).

A message is at most ``MAX_MESSAGE_BYTES`` (the HTTP API's limit for these calls' bodies; a deployed
stack's API Gateway allows 128 KB) and is refused when nested deeper than the JSON decoder goes, as
the HTTP API refuses such a body.

Pure: the local server and the Lambda functions share it; it validates shapes, the API validates
the rest (the same rules as over HTTP).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from querator.domain.errors import PayloadTooLargeError

#: Most items a connection may hold at once (a lease's batch limit).
MAX_CREDIT: Final = 1000
#: Largest client message, in bytes of UTF-8: the HTTP API's limit for the bodies of complete, retry
#: and renew (``querator.api.routes.SMALL_BODY_LIMIT``), which a message carries.
MAX_MESSAGE_BYTES: Final = 262_144
#: WebSocket close code for a message over the limit (RFC 6455 7.4.1, "message too big").
CLOSE_TOO_BIG: Final = 1009
#: Longest client_id, request_id and queue_name accepted before the API sees them.
_MAX_TEXT: Final = 512
#: A ``stream.ticket`` of a queue whose name is 512 bytes is 738 characters: expiry, name, signature.
_MAX_TICKET: Final = 1024


class ProtocolError(ValueError):
    """A message the protocol does not define; answered with a 400 ``error``, the connection stays."""


def too_big() -> str:
    """The ``error`` for a message over ``MAX_MESSAGE_BYTES`` (a 413, as the HTTP API answers a body
    over its limit), sent before the connection is closed with ``CLOSE_TOO_BIG``."""
    return error(
        413,
        "Request Entity Too Large",
        f"{PayloadTooLargeError.stable_class}; a stream message is at most {MAX_MESSAGE_BYTES} bytes",
    )


@dataclass(frozen=True, slots=True)
class Subscribe:
    queue_name: str
    credit: int
    client_id: str
    #: A ``stream.ticket`` naming ``queue_name`` ("": none sent).
    ticket: str = ""


@dataclass(frozen=True, slots=True)
class Credit:
    credit: int


@dataclass(frozen=True, slots=True)
class Ping:
    """Keeps a connection alive; answered with ``pong``."""


@dataclass(frozen=True, slots=True)
class Call:
    """``complete`` / ``retry`` / ``renew``: forwarded to the HTTP API's route of that name."""

    verb: str
    request_id: str
    partition: int
    body: dict[str, Any]
    #: The ids the call names: the connection stops holding them.
    ids: tuple[str, ...]


Message = Subscribe | Credit | Ping | Call

_CALL_FIELDS: Final = {
    "complete": {"ids"},
    "retry": {"items"},
    "renew": {"ids", "lease_timeout"},
}


def parse(text: str | bytes) -> Message:
    """One client message, or ``ProtocolError`` saying what is wrong with it.

    The size is the transport's to bound before it reads the whole message (``MAX_MESSAGE_BYTES``).
    """
    try:
        message = json.loads(text)
    except ValueError as error:
        raise ProtocolError(f"Invalid message; not JSON: {error}") from None
    except RecursionError:
        # "[[[[..." a hundred thousand deep: the decoder recurses once per level (as
        # querator.api.wire answers an HTTP body nested so deep).
        raise ProtocolError("Invalid message; not JSON: nested too deeply") from None
    if not isinstance(message, dict):
        raise ProtocolError("Invalid message; a message is a JSON object with a 'type'")
    kind = message.get("type")
    if kind == "subscribe":
        _only(message, {"type", "queue_name", "credit", "client_id", "ticket"})
        return Subscribe(
            queue_name=_text(message, "queue_name", required=True),
            credit=_credit(message),
            client_id=_text(message, "client_id"),
            ticket=_text(message, "ticket", limit=_MAX_TICKET),
        )
    if kind == "credit":
        _only(message, {"type", "credit"})
        return Credit(credit=_credit(message))
    if kind == "ping":
        _only(message, {"type"})
        return Ping()
    if kind in _CALL_FIELDS:
        _only(message, {"type", "request_id", "partition"} | _CALL_FIELDS[kind])
        partition = message.get("partition", 0)
        if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
            raise ProtocolError("Invalid message; partition must be a non-negative integer")
        body = {key: value for key, value in message.items() if key in _CALL_FIELDS[kind]}
        if kind == "retry":
            items = message.get("items")
            if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
                raise ProtocolError("Invalid message; retry needs items: [{id, retry_at?, dead?}]")
            ids = tuple(str(item.get("id", "")) for item in items)
        else:
            named = message.get("ids")
            if not isinstance(named, list) or not all(isinstance(i, str) for i in named):
                raise ProtocolError(f"Invalid message; {kind} needs ids: [...]")
            ids = tuple(named)
        return Call(
            verb=kind, request_id=_text(message, "request_id"), partition=partition, body=body, ids=ids
        )
    raise ProtocolError(
        f"Invalid message; unknown type {kind!r} (subscribe, credit, ping, complete, retry, renew)"
    )


def _only(message: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(message) - allowed)
    if extra:
        raise ProtocolError(f"Invalid message; unknown key(s) {', '.join(extra)} in {message['type']}")


def _text(message: dict[str, Any], key: str, *, required: bool = False, limit: int = _MAX_TEXT) -> str:
    value = message.get(key, "")
    if not isinstance(value, str) or len(value) > limit or (required and not value):
        need = "a non-empty string" if required else "a string"
        raise ProtocolError(f"Invalid message; {key} must be {need} of at most {limit} characters")
    return value


def _credit(message: dict[str, Any]) -> int:
    credit = message.get("credit")
    if not isinstance(credit, int) or isinstance(credit, bool) or not 1 <= credit <= MAX_CREDIT:
        raise ProtocolError(f"Invalid message; credit must be an integer from 1 to {MAX_CREDIT}")
    return credit


def encode(kind: str, **fields: Any) -> str:
    """A server message as the text of one frame."""
    return json.dumps({"type": kind, **fields}, separators=(",", ":"))


def error(code: int, code_text: str, message: str, *, request_id: str = "") -> str:
    """An ``error`` message: the HTTP error envelope, with the request it answers."""
    fields: dict[str, Any] = {"code": code, "code_text": code_text, "message": message}
    if request_id:
        fields["request_id"] = request_id
    return encode("error", **fields)
