"""The stream on a deployed stack: subscriptions in the connections table, pushes through API Gateway.

Locally one thread owns a connection and keeps its state in memory (``querator.stream.session``). On
AWS every message and every push is a separate Lambda invocation, so a connection's subscription,
credit and held items live in a table (``querator.storage.dynamodb.connections``) and the
``Dispatcher`` works on them with conditional updates: it **reserves** credit before it leases, so
two invocations pushing to one connection can never push more than its credit between them.

What makes a push happen (docs/adr/0091-stream-on-aws.md):

- a ``subscribe``, a ``credit`` message, or a ``complete`` / ``retry`` over the stream (credit came
  back): the stream function pumps that connection at once;
- an item written to a queue (produce, retry, a lease that ran out and was put back): DynamoDB
  Streams invokes the dispatcher with the items' keys, and it pumps every subscriber of those queues
  that has credit;
- an item that becomes ready by time writes nothing: the dispatcher's scheduled sweep, once a
  minute like the reaper, reads each subscribed queue's counters (one ``queue.stats``) and pumps the
  subscriptions with credit of the queues that have unleased or scheduled items, and those owed
  credit: held leases that ran out, or a reservation left by a push that died before its hold.

Every lease is the HTTP API's own ``queue.lease`` (same claims, same fencing), settled by the same
``queue.complete`` / ``retry`` / ``renew``: the protocol (``querator.stream.protocol``) is the
local server's. A pushed lease larger than API Gateway's 128 KB message limit is split: items into
several ``lease`` frames, and an item too large for any frame into its ``lease`` frame (with
``parts``) followed by ``part`` frames that carry its payload in order.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Final, Protocol

from querator.domain.errors import InvalidRequestError
from querator.stream import protocol
from querator.stream.session import duration, parse_timestamp, settlement

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence

    from querator.storage.dynamodb.connections import Subscription

log = logging.getLogger(__name__)

#: API Gateway's WebSocket message limit is 128 KB; frames stay under it with room to spare.
MAX_FRAME_BYTES: Final = 120_000
#: Base64 characters of payload per ``part`` frame (a multiple of 4, so each part decodes alone).
PART_CHARS: Final = 96_000
_PATHS: Final = {
    "lease": "/v1/queue.lease",
    "complete": "/v1/queue.complete",
    "retry": "/v1/queue.retry",
    "renew": "/v1/queue.renew",
    "stats": "/v1/queue.stats",
    "info": "/v1/queues.info",
}
_STATUS_TEXT: Final = {400: "Bad Request", 500: "Internal Server Error"}

#: ``api(path, body) -> (status, reply body)``: one call of the HTTP API, in process.
Api = Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]]
#: ``post(connection_id, frame) -> delivered``; ``False``: the connection is gone.
Post = Callable[[str, str], bool]


class Connections(Protocol):
    """What the dispatcher needs of the connections table (``DynamoDBConnections``)."""

    def subscribe(self, connection_id: str, queue_name: str, client_id: str, credit: int) -> bool: ...
    def get(self, connection_id: str) -> Subscription | None: ...
    def subscribers(self, queue_name: str) -> Iterator[Subscription]: ...
    def all(self) -> Iterator[Subscription]: ...
    def add_credit(self, connection_id: str, credit: int, *, most: int) -> bool: ...
    def reserve(self, connection_id: str, credit: int) -> str | None: ...
    def hold(
        self, connection_id: str, leased: Mapping[str, datetime], unused: int, reservation: str
    ) -> bool: ...
    def give_back(self, connection_id: str, reservations: Mapping[str, int]) -> None: ...
    def release(self, connection_id: str, ids: Sequence[str]) -> int: ...
    def renewed(self, connection_id: str, deadlines: Mapping[str, datetime]) -> None: ...
    def delete(self, connection_id: str) -> None: ...


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class Dispatcher:
    """Handles one connection's messages and pushes leased items to subscribers."""

    def __init__(
        self,
        connections: Connections,
        api: Api,
        post: Post,
        *,
        now: Callable[[], datetime] = utc_now,
        check_ticket: Callable[[str, str], None] | None = None,
        tickets_required: bool = False,
    ) -> None:
        """``check_ticket(ticket, queue_name)`` raises ``InvalidRequestError`` for a ticket that does
        not let a stream onto the queue; ``tickets_required``: a subscribe without one is refused."""
        self._connections = connections
        self._api = api
        self._post = post
        self._now = now
        self._check_ticket = check_ticket
        self._tickets_required = tickets_required

    # -- the stream function: messages of one connection -------------------------------------------

    def _ticket_refusal(self, message: protocol.Subscribe) -> str | None:
        """The error frame refusing a subscribe, or ``None``. ``$connect``'s IAM grant names no queue:
        a ticket from the queue's (IAM-scoped) ``stream.ticket`` route is what names one."""
        if not message.ticket:
            if not self._tickets_required:
                return None
            return protocol.error(
                403,
                "Forbidden",
                f"Not allowed; subscribing to '{message.queue_name}' needs a ticket: send the 'ticket' "
                f"of POST /v1/queues/{message.queue_name}/stream.ticket",
            )
        if self._check_ticket is None:
            return None
        try:
            self._check_ticket(message.ticket, message.queue_name)
        except InvalidRequestError as error:
            return protocol.error(403, "Forbidden", f"Not allowed; {error}")
        return None

    def disconnect(self, connection_id: str) -> None:
        """The connection closed: forget it. Its leases run out and the items go back to the queue."""
        self._connections.delete(connection_id)

    def message(self, connection_id: str, text: str | bytes) -> None:
        """One client message: answered on the connection, then a push if it gave credit back."""
        if len(text.encode() if isinstance(text, str) else text) > protocol.MAX_MESSAGE_BYTES:
            # API Gateway closes a connection whose message is over 128 KB (1009) before it gets
            # here; the protocol's limit is checked all the same, should that limit ever grow.
            self._post(connection_id, protocol.too_big())
            return
        try:
            message = protocol.parse(text)
        except protocol.ProtocolError as error:
            self._post(connection_id, protocol.error(400, "Bad Request", str(error)))
            return
        if isinstance(message, protocol.Ping):
            self._post(connection_id, protocol.encode("pong"))
            return
        if isinstance(message, protocol.Subscribe):
            refused = self._ticket_refusal(message)
            if refused is not None:
                self._post(connection_id, refused)
                return
            # One queues.info (a read of the queue's catalog row): an unknown queue is refused here,
            # not answered "subscribed" and then failed by the first push.
            status, reply = self._api(_PATHS["info"], {"queue_name": message.queue_name})
            if status != 200:
                self._post(connection_id, _error(status, reply))
                return
            client_id = message.client_id or f"stream-{uuid.uuid4().hex[:16]}"
            if not self._connections.subscribe(connection_id, message.queue_name, client_id, message.credit):
                self._post(
                    connection_id, protocol.error(400, "Bad Request", "Invalid message; already subscribed")
                )
                return
            self._post(
                connection_id,
                protocol.encode("subscribed", queue_name=message.queue_name, credit=message.credit),
            )
            self.pump(connection_id)
            return
        subscription = self._connections.get(connection_id)
        if subscription is None:
            self._post(connection_id, protocol.error(400, "Bad Request", "Invalid message; subscribe first"))
            return
        if isinstance(message, protocol.Credit):
            self._connections.add_credit(connection_id, message.credit, most=protocol.MAX_CREDIT)
            self.pump(connection_id)
            return
        queue_name = subscription.queue_name
        body = {"queue_name": queue_name, "partition": message.partition, **message.body}
        status, reply = self._api(_PATHS[message.verb], body)
        settled = settlement(
            message,
            status,
            reply,
            subscription.held,
            lease_timeout=lambda: self._lease_timeout(queue_name),
            now=self._now,
        )
        if settled.released:
            self._connections.release(connection_id, settled.released)
        if settled.renewed:
            self._connections.renewed(connection_id, settled.renewed)
        if status == 200:
            self._post(connection_id, protocol.encode("ok", request_id=message.request_id, reply=reply))
        else:
            self._post(connection_id, _error(status, reply, request_id=message.request_id))
        if settled.released:
            self.pump(connection_id)

    def _lease_timeout(self, queue_name: str) -> timedelta | None:
        """The queue's ``lease_timeout`` (one ``queues.info``), when a renew did not say its own."""
        status, reply = self._api(_PATHS["info"], {"queue_name": queue_name})
        return duration(reply.get("lease_timeout")) if status == 200 else None

    # -- pushes -------------------------------------------------------------------------------------

    def pump(self, connection: str | Subscription) -> int:
        """Lease what the connection's credit allows, now, and push it; how many items were pushed."""
        subscription = self._connections.get(connection) if isinstance(connection, str) else connection
        if subscription is None:
            return 0
        cid = subscription.connection_id
        now = self._now()
        expired = subscription.expired(now)
        stale = subscription.stale_reservations(now)
        if expired or stale:
            if stale:
                # Pushes that died between their reserve and their hold (a Lambda timeout).
                self._connections.give_back(cid, stale)
            if expired:
                self._connections.release(cid, expired)
            subscription = self._connections.get(cid)
            if subscription is None:
                return 0
        credit = subscription.credit
        reservation = self._connections.reserve(cid, credit) if credit > 0 else None
        if reservation is None:
            return 0  # no credit, or another invocation took it first and is pushing
        status, reply = self._api(
            _PATHS["lease"],
            {
                "queue_name": subscription.queue_name,
                "batch_size": credit,
                # Unique per push: two pushes to one connection may lease at the same moment.
                "client_id": f"{subscription.client_id}-{uuid.uuid4().hex[:8]}",
                "request_timeout": "0s",
            },
        )
        items: list[dict[str, Any]] = reply.get("items", []) if status == 200 else []
        held = self._connections.hold(
            cid,
            {item["id"]: parse_timestamp(item["lease_deadline"]) for item in items},
            unused=credit - len(items),
            reservation=reservation,
        )
        if not held:
            return 0  # disconnected meanwhile: what was just leased comes back when the leases run out
        if status not in (200, 454):
            self._post(cid, _error(status, reply))
            if 400 <= status < 500:
                # The subscription cannot work (the queue was deleted): say why and end it.
                self._connections.delete(cid)
            return 0
        if not items:
            return 0
        for frame in lease_frames(reply):
            if not self._post(cid, frame):
                # Gone without a $disconnect yet: what it held comes back when the leases run out.
                log.info("connection %s is gone; its %d pushed item(s) will expire", cid, len(items))
                self._connections.delete(cid)
                return 0
        return len(items)

    def queues_written(self, queue_names: Iterable[str]) -> int:
        """Items were written to these queues: pump each of their subscribers that has credit or is
        owed some (``Subscription.owed``). Returns the items pushed."""
        pushed = 0
        for queue_name in sorted(set(queue_names)):
            for subscription in self._connections.subscribers(queue_name):
                if subscription.credit > 0 or subscription.owed(self._now()):
                    pushed += self.pump(subscription)
        return pushed

    def sweep(self) -> int:
        """Pump the subscriptions whose queue may have something ready: items that became ready by
        time (scheduled, or a lease that ran out before the reaper put it back) write nothing a
        stream could see. One ``queue.stats`` read per subscribed queue decides, so an idle
        subscriber costs a share of that read a minute, not a lease attempt; a subscription owed
        credit (a held lease ran out, a push died holding a reservation) is pumped anyway."""
        by_queue: dict[str, list[Subscription]] = {}
        for subscription in self._connections.all():
            by_queue.setdefault(subscription.queue_name, []).append(subscription)
        pushed = 0
        now = self._now()
        for queue_name, subscriptions in sorted(by_queue.items()):
            waiting = [s for s in subscriptions if s.credit > 0 or s.owed(now)]
            if not waiting:
                continue
            if not self._may_have_ready(queue_name):
                waiting = [s for s in waiting if s.owed(now)]
            for subscription in waiting:
                pushed += self.pump(subscription)
        return pushed

    def _may_have_ready(self, queue_name: str) -> bool:
        """Whether the queue's counters show unleased or scheduled items (or cannot be read: then
        the pump finds out)."""
        status, reply = self._api(_PATHS["stats"], {"queue_name": queue_name})
        if status != 200:
            return True
        partitions = [p for q in reply.get("logicalQueues", []) for p in q.get("partitions", [])]
        return any(
            p.get("total", 0) - p.get("total_leased", 0) > 0 or p.get("scheduled", 0) > 0 for p in partitions
        )


def lease_frames(reply: Mapping[str, Any], *, limit: int = MAX_FRAME_BYTES) -> list[str]:
    """A ``queue.lease`` reply as ``lease`` frames of at most ``limit`` bytes, each with as many items
    as fit; an item that fits in no frame alone goes with its payload left out (``bytes: ""``,
    ``parts: n``), followed by the ``part`` frames that carry it."""
    head = {"queue_name": reply.get("queue_name", ""), "partition": reply.get("partition", 0)}
    empty = len(protocol.encode("lease", **head, items=[]).encode())
    frames: list[str] = []
    batch: list[dict[str, Any]] = []
    size = empty

    def flush() -> None:
        nonlocal batch, size
        if batch:
            frames.append(protocol.encode("lease", **head, items=batch))
        batch, size = [], empty

    for item in reply.get("items", []):
        item_size = len(json.dumps(item, separators=(",", ":")).encode()) + 1
        if empty + item_size > limit:
            flush()
            payload = str(item.get("bytes") or "")
            parts = [payload[n : n + PART_CHARS] for n in range(0, len(payload), PART_CHARS)]
            frames.append(
                protocol.encode("lease", **head, items=[{**item, "bytes": "", "parts": len(parts)}])
            )
            frames.extend(
                protocol.encode("part", id=item["id"], index=index, bytes=chunk)
                for index, chunk in enumerate(parts)
            )
            continue
        if size + item_size > limit:
            flush()
        batch.append(item)
        size += item_size
    flush()
    return frames


def _error(status: int, reply: Mapping[str, Any], *, request_id: str = "") -> str:
    return protocol.error(
        status,
        str(reply.get("code_text") or _STATUS_TEXT.get(status, "Error")),
        str(reply.get("message") or "request failed"),
        request_id=request_id,
    )
