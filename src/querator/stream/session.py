"""One stream connection's state: its subscription, its credit and the items it holds.

Transport-independent: the local server's WebSocket and the Lambda stream functions drive it. It
acts only through the HTTP API's own routes (``api(path, body)``), so a pushed item is leased by the
same conditional claims as ``queue.lease`` and settled by the same calls: the stream adds delivery,
not a second set of rules.

Credit is the consumer's, never the server's guess: the session leases at most ``credit`` items; each
item it pushes takes one; each item it stops holding gives one back (settled over the stream, its
lease ran out, or the consumer returned credit after settling over HTTP). What a settle did is read
from the API's answer (``settlement``): an id is released only when the answer shows it was applied,
so a refused call never returns credit for items the consumer still holds.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Final

from querator.api.durations import parse_duration
from querator.domain.errors import InvalidRequestError, ItemNotLeasedError
from querator.stream import protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

_PATHS: Final = {
    "lease": "/v1/queue.lease",
    "complete": "/v1/queue.complete",
    "retry": "/v1/queue.retry",
    "renew": "/v1/queue.renew",
    "info": "/v1/queues.info",
}
_RELEASING: Final = frozenset({"complete", "retry"})
_STATUS_TEXT: Final = {400: "Bad Request", 500: "Internal Server Error"}
#: ``"<n> of <m> id(s) failed and were not applied: '<id>' (<reason>), ...; ..."``
#: (``querator.api.errors.failed_ids_error``): the count, then each failed id.
_FAILED_COUNT: Final = re.compile(r"(\d+) of \d+ id\(s\) failed")
_FAILED_ID: Final = re.compile(r"'([^']*)' \(")


def parse_timestamp(text: str) -> datetime:
    """An RFC 3339 timestamp of the API (``...Z``); ``fromisoformat`` takes ``Z`` only from 3.11."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(frozen=True, slots=True)
class Settlement:
    """What a ``complete`` / ``retry`` / ``renew`` over the stream did to the items a connection holds."""

    #: Ids no longer held: their credit comes back.
    released: tuple[str, ...] = ()
    #: New lease deadlines of renewed ids (never earlier than the store's).
    renewed: Mapping[str, datetime] = field(default_factory=dict)


def failed_ids(status: int, reply: Mapping[str, Any], ids: Sequence[str]) -> frozenset[str] | None:
    """The ids a per-id failure of a call naming ``ids`` lists (a 400 ``Item id is unknown, stale or
    not leased``; the others were applied), or ``None`` when the reply is not one or its list
    cannot be read for certain.

    The in-process API answers exactly what it answers over HTTP, and the failed ids are only in its
    message, as ``'<id>' (<reason>)``: read as the Python client reads them
    (``querator.client.errors.parse_failed_ids``). An item id never holds a quote; a call naming
    an id that does could make the list say anything, so it is not read, nor one whose count is off.
    """
    if not _is_per_id_failure(status, reply) or any("'" in item_id for item_id in ids):
        return None
    details = str(reply.get("message") or "").partition(";")[2]
    count = _FAILED_COUNT.search(details)
    listed = _FAILED_ID.findall(details)
    if count is None or int(count.group(1)) != len(listed):
        return None
    return frozenset(listed)


def settlement(
    call: protocol.Call,
    status: int,
    reply: Mapping[str, Any],
    held: Mapping[str, datetime],
    *,
    lease_timeout: Callable[[], timedelta | None],
    now: Callable[[], datetime],
) -> Settlement:
    """Which held items ``call`` released or renewed, from the API's answer ``status`` / ``reply``.

    Each rule keeps "never more items held than credit": when in doubt an id stays held until its
    known deadline (or a later one), never released early.

    - 200: every id was applied (an id of another partition would have failed): complete and retry
      release them; renew gives each its new deadline.
    - a per-id failure (``failed_ids``): the ids not named were applied. The named ones stay held
      until their deadline: their lease ran out (the deadline passed, so they are released at once)
      or was never this partition's (the consumer named the wrong one: the item is still leased).
      A renew does not say when the applied ids' leases end now: the store set them all to its now
      + the timeout asked (or the queue's, ``lease_timeout()``: one ``queues.info``), and ``now()``
      read after the call is no earlier than its now, so that deadline is never early.
    - a refused call (any other 4xx) applied nothing. A 5xx may have applied some or none: complete
      and retry release nothing (the items stay held until their deadline), and a renew, like a
      per-id failure whose ids cannot be read, counts every named id as renewed (the later deadline
      is the safe side).
    """
    named = [item_id for item_id in dict.fromkeys(call.ids) if item_id in held]
    if not named:
        return Settlement()
    failed = failed_ids(status, reply, call.ids)
    if call.verb in _RELEASING:
        if status == 200:
            return Settlement(released=tuple(named))
        if failed is not None:
            return Settlement(released=tuple(i for i in named if i not in failed))
        return Settlement()
    if status == 200:
        return Settlement(
            renewed={
                str(item["id"]): parse_timestamp(str(item["lease_deadline"]))
                for item in reply.get("items", [])
                if item.get("id") in held and item.get("lease_deadline")
            }
        )
    if failed is None and status < 500 and not _is_per_id_failure(status, reply):
        return Settlement()  # refused whole: nothing was renewed
    # Some or all renewed, to the store's now + the timeout; a shorter timeout shortens the lease.
    asked = call.body.get("lease_timeout")
    timeout = duration(asked) if asked else lease_timeout()
    if timeout is None:
        return Settlement()
    deadline = now() + timeout
    if failed is None:
        # Renewed or not, unknown: whichever deadline is later.
        return Settlement(renewed={i: max(deadline, held[i]) for i in named})
    return Settlement(renewed={i: deadline for i in named if i not in failed})


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
        #: The queue's ``lease_timeout`` as read at subscribe (``queues.info``).
        self._lease_timeout: timedelta | None = None

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
            # One queues.info (one read of the queue's catalog row) so an unknown queue is refused
            # here, not answered "subscribed" and then failed by the first lease.
            status, reply = self._api(_PATHS["info"], {"queue_name": message.queue_name})
            if status != 200:
                return [_error(status, reply)]
            self._lease_timeout = duration(reply.get("lease_timeout"))
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
        queue_name = str(self.queue_name)
        body = {"queue_name": queue_name, "partition": call.partition, **call.body}
        status, reply = self._api(_PATHS[call.verb], body)
        settled = settlement(
            call, status, reply, self.held, lease_timeout=self._queue_lease_timeout, now=self._now
        )
        for item_id in settled.released:
            if self.held.pop(item_id, None) is not None:
                self.credit += 1
        for item_id, deadline in settled.renewed.items():
            if item_id in self.held:
                self.held[item_id] = deadline
        if status == 200:
            return protocol.encode("ok", request_id=call.request_id, reply=reply)
        return _error(status, reply, request_id=call.request_id)

    def _queue_lease_timeout(self) -> timedelta | None:
        """The queue's ``lease_timeout`` now (it may have been updated since the subscribe), else as
        read at subscribe."""
        status, reply = self._api(_PATHS["info"], {"queue_name": str(self.queue_name)})
        current = duration(reply.get("lease_timeout")) if status == 200 else None
        return current or self._lease_timeout

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


def _is_per_id_failure(status: int, reply: Mapping[str, Any]) -> bool:
    stable = str(reply.get("message") or "").partition(";")[0].strip()
    return status == 400 and stable == ItemNotLeasedError.stable_class


def duration(text: object) -> timedelta | None:
    """A Go duration of a reply, or ``None`` when it is missing or not one."""
    try:
        return parse_duration(text) if isinstance(text, str) else None
    except InvalidRequestError:
        return None


def _error(status: int, reply: dict[str, Any], *, request_id: str = "") -> str:
    return protocol.error(
        status,
        str(reply.get("code_text") or _STATUS_TEXT.get(status, "Error")),
        str(reply.get("message") or "request failed"),
        request_id=request_id,
    )


def utc_now() -> datetime:
    return datetime.now(timezone.utc)
