"""HTTP wire layer: request and response messages of every endpoint (docs/api.md).

Requests accept snake_case keys and their camelCase spellings and refuse any other key; durations are
Go strings and timestamps RFC 3339. Each request turns itself into domain values (``to_domain``) and
each response is built from domain values (``from_domain``) and sent with ``to_wire()``. What a
message is (fields, validation, JSON Schema) is ``querator.api.wire``: plain Python, no pydantic
(docs/adr/0014-plain-python-wire-layer.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final, TypeVar

from querator.api.errors import body_too_large, unsupported_content
from querator.api.wire import (
    Base64,
    BodyError,
    Boolean,
    Choice,
    Duration,
    Integer,
    InvalidValueError,
    ListOf,
    Message,
    Nested,
    Number,
    Text,
    Timestamp,
    field,
)
from querator.domain import model as domain
from querator.domain.errors import InvalidRequestError
from querator.domain.groups import MAX_GROUP_BYTES, validate_group
from querator.domain.model import (
    DELIVERIES,
    FIFO,
    MAX_BATCH,
    MAX_LEASED_PER_GROUP_LIMIT,
    MAX_PAYLOAD_BYTES,
    MAX_REASON_BYTES,
)
from querator.domain.priority import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY
from querator.domain.ratelimit import MAX_RATE_LIMIT

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11+ (docs/adr/0021)

#: Default page size of the storage listings (contract: ``limit`` default 1000).
DEFAULT_LIST_LIMIT: Final = 1000
#: Default page size of ``queues.list``; the contract leaves it open, Querator uses 100.
DEFAULT_QUEUES_LIMIT: Final = 100


# -- kinds of field -----------------------------------------------------------------------------------


def _encodable(value: str) -> str:
    # A str built in Python may hold a lone surrogate ("\ud800"), which has no UTF-8 form; a body
    # with one is refused before this (wire.Message.from_json).
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(f"not encodable as UTF-8: {exc.reason}") from exc
    return value


#: A Go duration string on the wire, a ``timedelta`` in Python.
DURATION: Final = Duration()
#: A delay from the server's clock at the call (``retry_in``, ``enqueue_in``): a Go duration, 0 or more.
DELAY: Final = Duration(non_negative=True)
#: An RFC 3339 string on the wire (output in UTC with ``Z``), an aware ``datetime`` in Python.
TIMESTAMP: Final = Timestamp()
#: Standard base64 on the wire, ``bytes`` in Python.
PAYLOAD: Final = Base64()
TEXT: Final = Text()
UTF8: Final = Text(check=_encodable)
ID: Final = Text(min_length=1)
QUEUE_NAME: Final = Text(check=domain.validate_queue_name)
#: The name of a queue to create: no control characters either (queues created before that rule
#: keep theirs, so lookups use ``QUEUE_NAME``).
NEW_QUEUE_NAME: Final = Text(check=domain.validate_new_queue_name)
GROUP: Final = Text(check=validate_group)
#: A failure reason: at most ``MAX_REASON_BYTES`` of UTF-8, printable (``domain.validate_reason``).
REASON: Final = Text(check=domain.validate_reason)


def _last_reason(value: str) -> str:
    return domain.validate_reason(value, "last_reason")


COUNT: Final = Integer()
FLAG: Final = Boolean()
ITEM_IDS: Final = ListOf(TEXT, min_items=1, max_items=MAX_BATCH)
PARTITION: Final = Integer(ge=0)
#: 0-9, lower leases first; a JSON integer (``5.0``, ``"5"`` and ``true`` are refused).
PRIORITY: Final = Integer(ge=MIN_PRIORITY, le=MAX_PRIORITY, strict=True)
#: A queue's delivery: "fifo" (oldest first in each partition) or "fair" (round-robin across groups).
DELIVERY: Final = Choice(DELIVERIES, "must be 'fifo' or 'fair'")
#: In a fair queue, the most valid leases one group may hold; a JSON integer, 0 (no limit) or more.
MAX_LEASED_PER_GROUP: Final = Integer(ge=0, le=MAX_LEASED_PER_GROUP_LIMIT, strict=True)

#: Leases a second (a JSON number, fractions allowed), 0: no limit.
RATE_LIMIT: Final = Number(ge=0, le=MAX_RATE_LIMIT)

_PRIORITY_TEXT: Final = "0-9, lower leases first"
_DELIVERY_TEXT: Final = '"fifo" (default) or "fair": leases go round-robin across the groups'
_MAX_LEASED_TEXT: Final = "fair queues: the most valid leases one group may hold; 0 (default): no limit"
_RATE_LIMIT_TEXT: Final = (
    "Leases a second across the queue's partitions and consumers (a token bucket with a burst of"
    " one second's worth); 0 (default): no limit"
)
_RATE_LIMIT_PER_GROUP_TEXT: Final = "fair queues: leases a second of one group; 0 (default): no limit"
_NEXT_LEASE_AT_TEXT: Final = (
    "Present when the queue's rate limit has no lease left: when it has one again (a lease before"
    " it gets nothing)"
)
_ENQUEUE_IN_TEXT: Final = "Scheduled this long after the server's clock at the call; not with enqueue_at"
_RETRY_IN_TEXT: Final = "Back this long after the server's clock at the call; not with retry_at"
_GROUP_TEXT: Final = f'The item\'s group (a tenant, a customer): up to {MAX_GROUP_BYTES} bytes, "" is none'
_REASON_TEXT: Final = (
    f"Why the item failed (an error's type and message, say): up to {MAX_REASON_BYTES:,} bytes of UTF-8"
    " without control characters or line breaks; kept on the item as its last_reason, and counted in"
    ' its failures. Absent or "": no reason, and the item\'s last_reason and failures stay as they are'
)
_LAST_REASON_TEXT: Final = (
    "Why the item last failed: the reason a consumer's queue.retry gave, or the service's own"
    ' ("lease ran out"; when dead-lettered, "max attempts: ..." or "expired: ..." with the cause of its'
    " last attempt); absent when it never failed"
)
_FAILURES_TEXT: Final = "How many failures were recorded on the item (each set last_reason); absent: none"
_SOURCE_QUEUE_TEXT: Final = "In a dead-letter queue: the queue the item was dead-lettered from"


def _one_time(at: datetime | None, delay: timedelta | None, at_name: str, delay_name: str) -> None:
    # Both is a client bug: which time was meant would be a guess.
    if at is not None and delay is not None:
        raise InvalidValueError(f"give '{at_name}' or '{delay_name}', not both")


_ItemT = TypeVar("_ItemT")
_DomainT = TypeVar("_DomainT")


#: Fields of an item that a domain refusal names by path (``items[3].enqueue_at: ...``, as the wire
#: layer's own refusals do); others name the item (``items[3]: item payload is larger ...``, as
#: docs/api.md quotes it).
_PATHED_FIELDS = frozenset(
    {"enqueue_at", "enqueue_in", "retry_at", "retry_in", "reference", "encoding", "kind"}
)


def _each(items: Sequence[_ItemT], convert: Callable[[_ItemT], _DomainT]) -> list[_DomainT]:
    """``convert`` of every item; a refusal names the item (``items[3]: item payload is larger...``)
    or the item's field (``items[3].enqueue_at: enqueue_at must be before 3000``)."""
    converted = []
    for index, item in enumerate(items):
        try:
            converted.append(convert(item))
        except InvalidRequestError as exc:
            name = exc.context.get("field")
            where = f"items[{index}].{name}" if name in _PATHED_FIELDS else f"items[{index}]"
            raise type(exc)(f"{where}: {exc}", **exc.context) from exc
    return converted


# -- bases --------------------------------------------------------------------------------------------


class WireRequest(Message):
    """Base of every request body: snake_case keys or their camelCase spellings, nothing else."""

    camel_case_keys = True


class WireResponse(Message):
    """Base of every response body: snake_case keys (or a field's alias), ``None`` left out."""


ModelT = TypeVar("ModelT", bound=WireRequest)


# -- queues -------------------------------------------------------------------------------------------


class CreateQueueRequest(WireRequest):
    """``queues.create``: a ``QueueInfo``; ``lease_timeout`` and ``expire_timeout`` are required."""

    queue_name: str = field(NEW_QUEUE_NAME)
    lease_timeout: timedelta = field(DURATION)
    expire_timeout: timedelta = field(DURATION)
    max_attempts: int = field(COUNT, default=0)
    dead_queue: str = field(TEXT, default="")
    reference: str = field(TEXT, default="")
    requested_partitions: int = field(COUNT, default=1)
    delivery: str = field(DELIVERY, default=FIFO, description=_DELIVERY_TEXT)
    max_leased_per_group: int = field(MAX_LEASED_PER_GROUP, default=0, description=_MAX_LEASED_TEXT)
    rate_limit: float = field(RATE_LIMIT, default=0.0, description=_RATE_LIMIT_TEXT)
    rate_limit_per_group: float = field(RATE_LIMIT, default=0.0, description=_RATE_LIMIT_PER_GROUP_TEXT)
    # Output-only fields of QueueInfo, accepted and ignored, so the body of a queues.info reply can be
    # sent back as is.
    created_at: datetime | None = field(TIMESTAMP, default=None, nullable=True)
    updated_at: datetime | None = field(TIMESTAMP, default=None, nullable=True)

    def to_domain(self, now: datetime) -> domain.QueueInfo:
        """The queue to create, stamped with ``now``. Raises ``InvalidRequestError`` on a bad field."""
        return domain.QueueInfo(
            name=self.queue_name,
            lease_timeout=self.lease_timeout,
            expire_timeout=self.expire_timeout,
            max_attempts=self.max_attempts,
            dead_queue=self.dead_queue,
            reference=self.reference,
            partitions=self.requested_partitions,
            delivery=self.delivery,
            max_leased_per_group=self.max_leased_per_group,
            rate_limit=self.rate_limit,
            rate_limit_per_group=self.rate_limit_per_group,
            created_at=now,
            updated_at=now,
        )


class UpdateQueueRequest(WireRequest):
    """``queues.update``: only the fields present in the body change."""

    queue_name: str = field(QUEUE_NAME)
    lease_timeout: timedelta | None = field(DURATION, default=None, nullable=True)
    expire_timeout: timedelta | None = field(DURATION, default=None, nullable=True)
    max_attempts: int | None = field(COUNT, default=None, nullable=True)
    dead_queue: str | None = field(TEXT, default=None, nullable=True)
    reference: str | None = field(TEXT, default=None, nullable=True)
    requested_partitions: int | None = field(COUNT, default=None, nullable=True)
    delivery: str | None = field(DELIVERY, default=None, nullable=True, description=_DELIVERY_TEXT)
    max_leased_per_group: int | None = field(
        MAX_LEASED_PER_GROUP, default=None, nullable=True, description=_MAX_LEASED_TEXT
    )
    rate_limit: float | None = field(RATE_LIMIT, default=None, nullable=True, description=_RATE_LIMIT_TEXT)
    rate_limit_per_group: float | None = field(
        RATE_LIMIT, default=None, nullable=True, description=_RATE_LIMIT_PER_GROUP_TEXT
    )
    created_at: datetime | None = field(TIMESTAMP, default=None, nullable=True)
    updated_at: datetime | None = field(TIMESTAMP, default=None, nullable=True)

    def to_domain(self) -> domain.QueueUpdate:
        """The update; a field absent from the body (or ``null``) is ``None``: leave as is."""
        return domain.QueueUpdate(
            name=self.queue_name,
            lease_timeout=self.lease_timeout,
            expire_timeout=self.expire_timeout,
            max_attempts=self.max_attempts,
            dead_queue=self.dead_queue,
            reference=self.reference,
            partitions=self.requested_partitions,
            delivery=self.delivery,
            max_leased_per_group=self.max_leased_per_group,
            rate_limit=self.rate_limit,
            rate_limit_per_group=self.rate_limit_per_group,
        )


class QueueNameRequest(WireRequest):
    """A body that names one queue."""

    queue_name: str = field(QUEUE_NAME)


class QueueInfoRequest(QueueNameRequest):
    """``queues.info``."""


class DeleteQueueRequest(QueueNameRequest):
    """``queues.delete``: removes the queue and its items."""


class ListQueuesRequest(WireRequest):
    """``queues.list``: queues in name order from ``pivot`` (inclusive)."""

    pivot: str = field(TEXT, default="")
    limit: int = field(Integer(ge=1, le=MAX_BATCH), default=DEFAULT_QUEUES_LIMIT)


class QueueInfoResponse(WireResponse):
    """A ``QueueInfo`` as ``queues.info`` (and create / update) return it."""

    queue_name: str = field(TEXT)
    lease_timeout: timedelta = field(DURATION)
    expire_timeout: timedelta = field(DURATION)
    max_attempts: int = field(COUNT)
    dead_queue: str = field(TEXT)
    reference: str = field(TEXT)
    requested_partitions: int = field(COUNT)
    delivery: str = field(TEXT)
    max_leased_per_group: int = field(COUNT)
    rate_limit: float = field(RATE_LIMIT, description=_RATE_LIMIT_TEXT)
    rate_limit_per_group: float = field(RATE_LIMIT, description=_RATE_LIMIT_PER_GROUP_TEXT)
    created_at: datetime = field(TIMESTAMP)
    updated_at: datetime = field(TIMESTAMP)

    @classmethod
    def from_domain(cls, info: domain.QueueInfo) -> Self:
        return cls(
            queue_name=info.name,
            lease_timeout=info.lease_timeout,
            expire_timeout=info.expire_timeout,
            max_attempts=info.max_attempts,
            dead_queue=info.dead_queue,
            reference=info.reference,
            requested_partitions=info.partitions,
            delivery=info.delivery,
            max_leased_per_group=info.max_leased_per_group,
            rate_limit=info.rate_limit,
            rate_limit_per_group=info.rate_limit_per_group,
            created_at=info.created_at,
            updated_at=info.updated_at,
        )


class ListQueuesResponse(WireResponse):
    """``queues.list``: ``{"items": [QueueInfo...]}``."""

    items: list[QueueInfoResponse] = field(ListOf(Nested(QueueInfoResponse)))

    @classmethod
    def from_domain(cls, queues: Sequence[domain.QueueInfo]) -> Self:
        return cls(items=[QueueInfoResponse.from_domain(q) for q in queues])


# -- produce and lease --------------------------------------------------------------------------------


class ProduceItem(WireRequest):
    """One item of ``queue.produce``: the payload is ``bytes`` (base64) or ``utf8``, exactly one."""

    reference: str = field(TEXT, default="")
    encoding: str = field(TEXT, default="")
    kind: str = field(TEXT, default="")
    bytes: bytes | None = field(
        PAYLOAD,
        default=None,
        nullable=True,
        description=f"The payload, standard base64; at most {MAX_PAYLOAD_BYTES:,} bytes decoded",
    )
    utf8: str | None = field(
        UTF8,
        default=None,
        nullable=True,
        description=f"The payload as text; at most {MAX_PAYLOAD_BYTES:,} bytes of UTF-8.",
    )
    #: In the future: the item is scheduled until then.
    enqueue_at: datetime | None = field(TIMESTAMP, default=None, nullable=True)
    enqueue_in: timedelta | None = field(DELAY, default=None, nullable=True, description=_ENQUEUE_IN_TEXT)
    priority: int = field(PRIORITY, default=DEFAULT_PRIORITY, description=_PRIORITY_TEXT)
    group: str = field(GROUP, default="", description=_GROUP_TEXT)

    def check(self) -> None:
        _one_time(self.enqueue_at, self.enqueue_in, "enqueue_at", "enqueue_in")
        # Querator lets bytes win silently and stores an item with neither as an empty payload; the
        # contract says "bytes | utf8", so both, or neither (a misspelt key is a 455 already), is a
        # client bug worth reporting. An empty payload is still one key away: {"utf8": ""}.
        if self.bytes is not None and self.utf8 is not None:
            raise InvalidValueError("give either 'bytes' or 'utf8', not both")
        if self.bytes is None and self.utf8 is None:
            raise InvalidValueError("no payload: give 'bytes' (base64) or 'utf8' (an empty one is \"\")")

    def to_domain(self) -> domain.NewItem:
        """Raises ``InvalidRequestError`` when the payload or a text field is over its limit."""
        payload = self.bytes if self.bytes is not None else (self.utf8 or "").encode("utf-8")
        return domain.NewItem(
            payload=payload,
            reference=self.reference,
            encoding=self.encoding,
            kind=self.kind,
            enqueue_at=self.enqueue_at,
            enqueue_in=self.enqueue_in,
            priority=self.priority,
            group=self.group,
        )


class ProduceRequest(WireRequest):
    """``queue.produce``: 1-1000 items, stored together in one partition."""

    queue_name: str = field(QUEUE_NAME)
    request_timeout: timedelta | None = field(DURATION, default=None, nullable=True)
    items: list[ProduceItem] = field(ListOf(Nested(ProduceItem), min_items=1, max_items=MAX_BATCH))

    def to_domain(self) -> list[domain.NewItem]:
        return _each(self.items, ProduceItem.to_domain)


class LeaseRequest(WireRequest):
    """``queue.lease``: up to ``batch_size`` items of one partition, oldest first.

    ``request_timeout`` is ``None`` when absent; the handler applies its default and platform cap.
    """

    queue_name: str = field(QUEUE_NAME)
    batch_size: int = field(Integer(ge=1, le=MAX_BATCH))
    client_id: str = field(ID)
    request_timeout: timedelta | None = field(DURATION, default=None, nullable=True)


class LeaseItem(WireResponse):
    """One leased item; ``attempts`` counts this lease too."""

    id: str = field(TEXT)
    attempts: int = field(COUNT)
    priority: int = field(COUNT, default=DEFAULT_PRIORITY)
    group: str = field(TEXT, default="")
    lease_deadline: datetime | None = field(TIMESTAMP, default=None)
    reference: str = field(TEXT, default="")
    encoding: str = field(TEXT, default="")
    kind: str = field(TEXT, default="")
    bytes: bytes = field(PAYLOAD, default=b"")
    # Left out unless the item failed before: a lease of items that never failed replies as it did.
    last_reason: str | None = field(TEXT, default=None, description=_LAST_REASON_TEXT)
    failures: int | None = field(COUNT, default=None, description=_FAILURES_TEXT)

    @classmethod
    def from_domain(cls, item: domain.Item) -> Self:
        return cls(
            id=item.id,
            attempts=item.attempts,
            priority=item.priority,
            group=item.group,
            lease_deadline=item.lease_deadline,
            reference=item.reference,
            encoding=item.encoding,
            kind=item.kind,
            bytes=item.payload,
            last_reason=item.last_reason or None,
            failures=item.failures or None,
        )


class LeaseResponse(WireResponse):
    """``queue.lease`` reply: items of one partition."""

    queue_name: str = field(TEXT)
    partition: int = field(COUNT)
    items: list[LeaseItem] = field(ListOf(Nested(LeaseItem)))
    next_lease_at: datetime | None = field(TIMESTAMP, default=None, description=_NEXT_LEASE_AT_TEXT)

    @classmethod
    def from_domain(cls, lease: domain.Lease) -> Self:
        return cls(
            queue_name=lease.queue_name,
            partition=lease.partition,
            items=[LeaseItem.from_domain(i) for i in lease.items],
            next_lease_at=lease.next_lease_at,
        )


# -- complete, retry, renew ---------------------------------------------------------------------------


class CompleteRequest(WireRequest):
    """``queue.complete``: delete leased items."""

    queue_name: str = field(QUEUE_NAME)
    partition: int = field(PARTITION, default=0)
    request_timeout: timedelta | None = field(DURATION, default=None, nullable=True)
    ids: list[str] = field(ITEM_IDS)


class RetryItem(WireRequest):
    """One item of ``queue.retry``: back now, at ``retry_at`` (or ``retry_in`` from now), or (``dead``)
    to the dead-letter queue."""

    id: str = field(ID)
    retry_at: datetime | None = field(TIMESTAMP, default=None, nullable=True)
    retry_in: timedelta | None = field(DELAY, default=None, nullable=True, description=_RETRY_IN_TEXT)
    dead: bool = field(FLAG, default=False)
    #: The priority the item goes back with; absent: the one it has.
    priority: int | None = field(PRIORITY, default=None, nullable=True, description=_PRIORITY_TEXT)
    reason: str = field(REASON, default="", description=_REASON_TEXT)

    def check(self) -> None:
        _one_time(self.retry_at, self.retry_in, "retry_at", "retry_in")

    def to_domain(self) -> domain.RetryRequest:
        return domain.RetryRequest(
            id=self.id,
            retry_at=self.retry_at,
            retry_in=self.retry_in,
            dead=self.dead,
            priority=self.priority,
            reason=self.reason,
        )


class RetryRequest(WireRequest):
    """``queue.retry``: put leased items back."""

    queue_name: str = field(QUEUE_NAME)
    partition: int = field(PARTITION, default=0)
    items: list[RetryItem] = field(ListOf(Nested(RetryItem), min_items=1, max_items=MAX_BATCH))

    def to_domain(self) -> list[domain.RetryRequest]:
        return _each(self.items, RetryItem.to_domain)


class RenewRequest(WireRequest):
    """``queue.renew``: set leases to end at now + ``lease_timeout`` (``None``: the queue's); counted
    from now, not from the old deadline, so a short ``lease_timeout`` shortens a lease."""

    queue_name: str = field(QUEUE_NAME)
    partition: int = field(PARTITION, default=0)
    ids: list[str] = field(ITEM_IDS)
    lease_timeout: timedelta | None = field(DURATION, default=None, nullable=True)


class RenewedItem(WireResponse):
    id: str = field(TEXT)
    lease_deadline: datetime = field(TIMESTAMP)


class RenewResponse(WireResponse):
    """``queue.renew`` reply: the renewed ids and their new deadlines."""

    queue_name: str = field(TEXT)
    partition: int = field(COUNT)
    items: list[RenewedItem] = field(ListOf(Nested(RenewedItem)))

    @classmethod
    def from_domain(cls, outcome: domain.RenewOutcome) -> Self:
        return cls(
            queue_name=outcome.queue_name,
            partition=outcome.partition,
            items=[RenewedItem(id=r.id, lease_deadline=r.lease_deadline) for r in outcome.items],
        )


class ReprioritizeRequest(WireRequest):
    """``queue.reprioritize``: give waiting or scheduled items a new priority (a new id each), and
    leased ones the priority they go back with (their id and lease stay)."""

    queue_name: str = field(QUEUE_NAME)
    partition: int = field(PARTITION, default=0)
    ids: list[str] = field(ITEM_IDS)
    priority: int = field(PRIORITY, description=_PRIORITY_TEXT)


class ReprioritizedItem(WireResponse):
    id: str = field(TEXT)
    new_id: str = field(TEXT)


class ReprioritizeResponse(WireResponse):
    """``queue.reprioritize`` reply: every id of the request with the id the item has now."""

    queue_name: str = field(TEXT)
    partition: int = field(COUNT)
    items: list[ReprioritizedItem] = field(ListOf(Nested(ReprioritizedItem)))

    @classmethod
    def from_domain(cls, queue_name: str, partition: int, outcome: domain.Reprioritized) -> Self:
        return cls(
            queue_name=queue_name,
            partition=partition,
            items=[ReprioritizedItem(id=old, new_id=new) for old, new in outcome.ids.items()],
        )


class StreamTicketRequest(QueueNameRequest):
    """``stream.ticket``: a ticket that lets a stream subscribe to this queue."""


class StreamTicketResponse(WireResponse):
    """The ticket to send in the stream's ``subscribe``, and until when it is good."""

    ticket: str = field(TEXT)
    expires_at: datetime = field(TIMESTAMP)


class OkResponse(WireResponse):
    """``{"code": 200}``: Querator's reply to every call with nothing else to return (produce,
    complete, retry, queues.create / update / delete, clear, storage/items.delete)."""

    code: int = field(COUNT, default=200)


# -- stats and clear ----------------------------------------------------------------------------------


class StatsRequest(QueueNameRequest):
    """``queue.stats``."""


class PartitionStatsResponse(WireResponse):
    partition: int = field(COUNT)
    #: Items that are not scheduled, leased or not.
    total: int = field(COUNT)
    total_leased: int = field(COUNT)
    scheduled: int = field(COUNT)
    average_age: timedelta = field(DURATION)
    average_leased_age: timedelta = field(DURATION)
    #: Items produced (or imported) into the partition and items completed in it, ever: two
    #: samples of these give produce and complete rates.
    produced: int = field(COUNT, default=0)
    completed: int = field(COUNT, default=0)

    @classmethod
    def from_domain(cls, stats: domain.PartitionStats) -> Self:
        return cls(
            partition=stats.partition,
            total=stats.total,
            total_leased=stats.total_leased,
            scheduled=stats.scheduled,
            average_age=stats.average_age,
            average_leased_age=stats.average_leased_age,
            produced=stats.produced,
            completed=stats.completed,
        )


class LogicalQueueStats(WireResponse):
    partitions: list[PartitionStatsResponse] = field(ListOf(Nested(PartitionStatsResponse)))


class StatsResponse(WireResponse):
    """``queue.stats`` reply in Querator's shape: one logical queue holding every partition."""

    queue_name: str = field(TEXT)
    # The one camelCase key of the contract: Querator's proto has no json_name for it.
    logical_queues: list[LogicalQueueStats] = field(
        ListOf(Nested(LogicalQueueStats)), wire_name="logicalQueues"
    )

    @classmethod
    def from_domain(cls, queue_name: str, stats: Sequence[domain.PartitionStats]) -> Self:
        partitions = [PartitionStatsResponse.from_domain(s) for s in stats]
        return cls(queue_name=queue_name, logical_queues=[LogicalQueueStats(partitions=partitions)])


class ClearRequest(WireRequest):
    """``queue.clear``: ``queue`` and / or ``scheduled`` is required; ``destructive`` adds leased items."""

    queue_name: str = field(QUEUE_NAME)
    queue: bool = field(FLAG, default=False)
    scheduled: bool = field(FLAG, default=False)
    destructive: bool = field(FLAG, default=False)

    def check(self) -> None:
        if not (self.queue or self.scheduled):
            raise InvalidValueError("set 'queue' or 'scheduled' (or both)")

    def to_domain(self) -> domain.ClearScope:
        scope = domain.ClearScope(0)
        if self.queue:
            scope |= domain.ClearScope.QUEUE
        if self.scheduled:
            scope |= domain.ClearScope.SCHEDULED
        if self.destructive:
            scope |= domain.ClearScope.DESTRUCTIVE
        return scope


# -- redrive -----------------------------------------------------------------------------------------


class RedriveRequest(WireRequest):
    """``queue.redrive``: move up to ``limit`` items of a dead-letter queue back, to ``to`` when given,
    else each to the queue it was dead-lettered from."""

    queue_name: str = field(QUEUE_NAME)
    to: str | None = field(TEXT, default=None, nullable=True)
    limit: int = field(Integer(ge=1, le=MAX_BATCH), default=MAX_BATCH)


class RedriveResponse(WireResponse):
    """``queue.redrive`` reply: call again until ``remaining`` is 0."""

    moved: int = field(COUNT)
    remaining: int = field(COUNT)
    stranded: int = field(COUNT)

    @classmethod
    def from_domain(cls, outcome: domain.RedriveOutcome) -> Self:
        return cls(moved=outcome.moved, remaining=outcome.remaining, stranded=outcome.stranded)


# -- storage inspection -------------------------------------------------------------------------------


class ListItemsRequest(WireRequest):
    """``storage/items.list``: one partition in FIFO order from ``pivot`` (an item id, inclusive)."""

    queue_name: str = field(QUEUE_NAME)
    partition: int = field(PARTITION, default=0)
    pivot: str = field(TEXT, default="")
    limit: int = field(Integer(ge=1, le=MAX_BATCH), default=DEFAULT_LIST_LIMIT)


class ListScheduledRequest(ListItemsRequest):
    """``storage/scheduled.list``: the scheduled items of one partition, in the order they come due."""


class StorageItemResponse(WireResponse):
    """An item as stored, for inspection."""

    id: str = field(TEXT)
    source_id: str = field(TEXT, default="")
    # Left out when empty: a listing of items that never failed nor were dead-lettered is as it was.
    source_queue: str | None = field(TEXT, default=None, description=_SOURCE_QUEUE_TEXT)
    is_leased: bool = field(FLAG, default=False)
    lease_deadline: datetime | None = field(TIMESTAMP, default=None)
    expire_deadline: datetime = field(TIMESTAMP)
    created_at: datetime = field(TIMESTAMP)
    enqueue_at: datetime | None = field(TIMESTAMP, default=None)
    attempts: int = field(COUNT, default=0)
    priority: int = field(COUNT, default=DEFAULT_PRIORITY)
    group: str = field(TEXT, default="")
    reference: str = field(TEXT, default="")
    encoding: str = field(TEXT, default="")
    kind: str = field(TEXT, default="")
    payload: bytes = field(PAYLOAD, default=b"")
    last_reason: str | None = field(TEXT, default=None, description=_LAST_REASON_TEXT)
    failures: int | None = field(COUNT, default=None, description=_FAILURES_TEXT)

    @classmethod
    def from_domain(cls, item: domain.Item, now: datetime) -> Self:
        """``now`` decides ``is_leased``: a deadline in the past is a lease that ran out."""
        return cls(
            id=item.id,
            source_id=item.source_id,
            source_queue=item.source_queue or None,
            last_reason=item.last_reason or None,
            failures=item.failures or None,
            is_leased=item.is_leased(now),
            lease_deadline=item.lease_deadline,
            expire_deadline=item.expire_deadline,
            created_at=item.created_at,
            enqueue_at=item.enqueue_at,
            attempts=item.attempts,
            priority=item.priority,
            group=item.group,
            reference=item.reference,
            encoding=item.encoding,
            kind=item.kind,
            payload=item.payload,
        )


class ListItemsResponse(WireResponse):
    """``storage/items.list`` and ``storage/scheduled.list`` reply."""

    items: list[StorageItemResponse] = field(ListOf(Nested(StorageItemResponse)))

    @classmethod
    def from_domain(cls, items: Sequence[domain.Item], now: datetime) -> Self:
        return cls(items=[StorageItemResponse.from_domain(i, now) for i in items])


class ImportItem(WireRequest):
    """One item of ``storage/items.import``, written verbatim under a new id.

    Takes every key that a listing returns, so a page of ``storage/items.list`` can be imported as
    is; ``id`` and ``is_leased`` are accepted and ignored (the id is new, the lease is its deadline).
    """

    id: str = field(TEXT, default="")
    source_id: str = field(TEXT, default="")
    source_queue: str = field(TEXT, default="", description=_SOURCE_QUEUE_TEXT)
    is_leased: bool = field(FLAG, default=False)
    lease_deadline: datetime | None = field(TIMESTAMP, default=None, nullable=True)
    expire_deadline: datetime | None = field(TIMESTAMP, default=None, nullable=True)
    created_at: datetime | None = field(TIMESTAMP, default=None, nullable=True)
    enqueue_at: datetime | None = field(TIMESTAMP, default=None, nullable=True)
    enqueue_in: timedelta | None = field(DELAY, default=None, nullable=True, description=_ENQUEUE_IN_TEXT)
    attempts: int = field(Integer(ge=0), default=0)
    priority: int = field(PRIORITY, default=DEFAULT_PRIORITY, description=_PRIORITY_TEXT)
    group: str = field(GROUP, default="", description=_GROUP_TEXT)
    reference: str = field(TEXT, default="")
    encoding: str = field(TEXT, default="")
    kind: str = field(TEXT, default="")
    payload: bytes = field(PAYLOAD, default=b"")
    last_reason: str = field(Text(check=_last_reason), default="", description=_LAST_REASON_TEXT)
    failures: int = field(Integer(ge=0), default=0, description=_FAILURES_TEXT)

    def check(self) -> None:
        _one_time(self.enqueue_at, self.enqueue_in, "enqueue_at", "enqueue_in")

    def to_domain(self) -> domain.StorageItem:
        return domain.StorageItem(
            payload=self.payload,
            reference=self.reference,
            encoding=self.encoding,
            kind=self.kind,
            attempts=self.attempts,
            lease_deadline=self.lease_deadline,
            expire_deadline=self.expire_deadline,
            created_at=self.created_at,
            enqueue_at=self.enqueue_at,
            enqueue_in=self.enqueue_in,
            source_id=self.source_id,
            priority=self.priority,
            group=self.group,
            source_queue=self.source_queue,
            last_reason=self.last_reason,
            failures=self.failures,
        )


class ImportItemsRequest(WireRequest):
    """``storage/items.import``: items are skipped when their ``source_id`` is already in the partition."""

    queue_name: str = field(QUEUE_NAME)
    partition: int = field(PARTITION, default=0)
    items: list[ImportItem] = field(ListOf(Nested(ImportItem), min_items=1, max_items=MAX_BATCH))

    def to_domain(self) -> list[domain.StorageItem]:
        return _each(self.items, ImportItem.to_domain)


class ImportedItem(WireResponse):
    id: str = field(TEXT)


class ImportItemsResponse(WireResponse):
    """``storage/items.import`` reply: the new ids (Querator's ``items`` shape, other fields omitted)."""

    items: list[ImportedItem] = field(ListOf(Nested(ImportedItem)))

    @classmethod
    def from_domain(cls, ids: Sequence[str]) -> Self:
        return cls(items=[ImportedItem(id=i) for i in ids])


class DeleteItemsRequest(WireRequest):
    """``storage/items.delete``: deletes in any state; deleting twice succeeds."""

    queue_name: str = field(QUEUE_NAME)
    partition: int = field(PARTITION, default=0)
    ids: list[str] = field(ITEM_IDS)


# -- meta ---------------------------------------------------------------------------------------------


class HealthResponse(WireResponse):
    """``GET /health``."""

    status: str = field(TEXT, default="pass")


# -- parsing ------------------------------------------------------------------------------------------


def is_json_content_type(content_type: str | None) -> bool:
    """``application/json`` (any parameters) or a ``+json`` type; a missing header is let through.

    A missing header is accepted because some HTTP tools send none for a JSON body; the body must
    still parse as JSON.
    """
    if content_type is None or not content_type.strip():
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def parse_request(
    model: type[ModelT],
    body: str | bytes | None,
    *,
    content_type: str | None = None,
    limit: int | None = None,
    queue_name: str | None = None,
) -> ModelT:
    """Decode a request body into ``model``, applying the contract's wire rules in order.

    Raises ``WireError`` (455) when the content type is not JSON, the body is empty or not a JSON
    object, or it has a key the message does not define;
    ``PayloadTooLargeError`` (413) when it is over ``limit`` bytes; ``InvalidRequestError`` (400) for
    a wrong value, naming the field(s). ``queue_name`` is a scoped route's queue: the body's
    ``queue_name`` may be left out and must not name another queue (``Message.from_json``).
    """
    if not is_json_content_type(content_type):
        raise unsupported_content(f"Content-Type {content_type!r} is not application/json")
    raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else (body or b"")
    if limit is not None and len(raw) > limit:
        raise body_too_large(len(raw), limit)
    if not raw or raw.isspace():  # not raw.strip(): that copies a body of up to 5 MB
        # Not JSON, so a 455 as the contract says of any such body; "all defaults" is spelled {}.
        raise unsupported_content("the body is empty: send a JSON object ({} for all defaults)")
    try:
        return model.from_json(raw, queue_name=queue_name)
    except BodyError as exc:
        if exc.not_understood:
            # Not understanding the body is the cause of the other problems (a misspelt key also
            # shows up as a missing field), so a 455 names only what was not understood.
            not_understood = [str(p) for p in exc.problems if p.not_understood]
            raise unsupported_content("; ".join(not_understood) or str(exc)) from exc
        raise InvalidRequestError(str(exc)) from exc
