"""One stream connection's state: its subscription, its credit and the items it holds.

Transport-independent: the local server's WebSocket and the Lambda stream functions drive it. It
acts only through the HTTP API's own routes (``api(path, body)``), so a pushed item is leased by the
same conditional claims as ``queue.lease`` and settled by the same calls: the stream adds delivery,
not a second set of rules.

Credit is the consumer's, never the server's guess: the session leases at most ``credit`` items; each
item it pushes takes one; each item it stops holding gives one back (settled over the stream, its
lease ran out, or the consumer returned credit after settling over HTTP).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Final

from querator.stream import protocol

if TYPE_CHECKING:
    from collections.abc import Callable

_PATHS: Final = {
    "lease": "/v1/queue.lease",
    "complete": "/v1/queue.complete",
    "retry": "/v1/queue.retry",
    "renew": "/v1/queue.renew",
}
_RELEASING: Final = frozenset({"complete", "retry"})
_STATUS_TEXT: Final = {400: "Bad Request", 500: "Internal Server Error"}


def parse_timestamp(text: str) -> datetime:
    """An RFC 3339 timestamp of the API (``...Z``); ``fromisoformat`` takes ``Z`` only from 3.11."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class StreamSession:
    """What one connection is subscribed to and holds; every method returns the frames to send."""

    def __init__(
        self, api: Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]], *, now: Callable[[], datetime]
    ) -> None:
        """``api(path, body) -> (status, reply body)`` makes one call of the HTTP API."""
        self._api = api
        self._now = now
        self.queue_name: str | None = None
        self.client_id = ""
        #: How many more items may be pushed.
        self.credit = 0
        #: Items pushed and not yet settled: id -> lease deadline.
        self.held: dict[str, datetime] = {}

    @property
    def subscribed(self) -> bool:
        return self.queue_name is not None

    def receive(self, text: str | bytes) -> list[str]:
        """Handle one client message."""
        try:
            message = protocol.parse(text)
        except protocol.ProtocolError as error:
            return [protocol.error(400, "Bad Request", str(error))]
        if isinstance(message, protocol.Ping):
            return [protocol.encode("pong")]
        if isinstance(message, protocol.Subscribe):
            if self.subscribed:
                return [
                    protocol.error(
                        400, "Bad Request", f"Invalid message; already subscribed to '{self.queue_name}'"
                    )
                ]
            self.queue_name = message.queue_name
            self.client_id = message.client_id or f"stream-{uuid.uuid4().hex[:16]}"
            self.credit = message.credit
            return [protocol.encode("subscribed", queue_name=message.queue_name, credit=message.credit)]
        if not self.subscribed:
            return [protocol.error(400, "Bad Request", "Invalid message; subscribe first")]
        if isinstance(message, protocol.Credit):
            self.credit = min(protocol.MAX_CREDIT - len(self.held), self.credit + message.credit)
            return []
        return [self._call(message)]

    def _call(self, call: protocol.Call) -> str:
        body = {"queue_name": self.queue_name, "partition": call.partition, **call.body}
        status, reply = self._api(_PATHS[call.verb], body)
        if call.verb in _RELEASING:
            # Completed, retried, or refused because the lease is gone: held no longer, either way.
            for item_id in call.ids:
                if self.held.pop(item_id, None) is not None:
                    self.credit += 1
        elif status == 200:
            for item in reply.get("items", []):
                if item.get("id") in self.held and item.get("lease_deadline"):
                    self.held[item["id"]] = parse_timestamp(item["lease_deadline"])
        if status == 200:
            return protocol.encode("ok", request_id=call.request_id, reply=reply)
        return _error(status, reply, request_id=call.request_id)

    def release_expired(self) -> None:
        """Give back the credit of held items whose lease ran out (they went back to the queue)."""
        now = self._now()
        for item_id, deadline in list(self.held.items()):
            if deadline <= now:
                del self.held[item_id]
                self.credit += 1

    def pump(self) -> list[str]:
        """Lease what the credit allows, now, without waiting: a ``lease`` frame or nothing."""
        self.release_expired()
        if not self.subscribed or self.credit <= 0:
            return []
        status, reply = self._api(
            _PATHS["lease"],
            {
                "queue_name": self.queue_name,
                "batch_size": self.credit,
                "client_id": self.client_id,
                "request_timeout": "0s",
            },
        )
        if status == 200:
            for item in reply.get("items", []):
                self.held[item["id"]] = parse_timestamp(item["lease_deadline"])
            self.credit -= len(reply.get("items", []))
            return [protocol.encode("lease", **reply)]
        if status == 454:
            return []
        if 400 <= status < 500:
            # The subscription cannot work (unknown queue, bad client_id): say why and end it.
            self.queue_name = None
        return [_error(status, reply)]

    def next_deadline(self) -> datetime | None:
        """When the earliest held lease runs out (its credit comes back then), if any."""
        return min(self.held.values(), default=None)


def _error(status: int, reply: dict[str, Any], *, request_id: str = "") -> str:
    return protocol.error(
        status,
        str(reply.get("code_text") or _STATUS_TEXT.get(status, "Error")),
        str(reply.get("message") or "request failed"),
        request_id=request_id,
    )


def utc_now() -> datetime:
    return datetime.now(timezone.utc)
