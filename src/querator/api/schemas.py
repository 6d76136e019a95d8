"""HTTP wire layer: request and response models of every endpoint (docs/api.md).

Requests accept snake_case keys and their camelCase spellings and refuse any other key; durations are
Go strings and timestamps RFC 3339. Each request turns itself into domain values (``to_domain``) and
each response is built from domain values (``from_domain``) and sent with ``to_wire()``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Annotated, Any, Final, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    Strict,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails, PydanticCustomError
from typing_extensions import Self  # typing.Self is Python 3.11+ (docs/adr/0021)

from querator.api.durations import format_duration, format_timestamp, parse_duration, parse_timestamp
from querator.api.errors import body_too_large, unsupported_content
from querator.domain import model as domain
from querator.domain.errors import InvalidRequestError
from querator.domain.groups import MAX_GROUP_BYTES, validate_group
from querator.domain.model import (
    DELIVERIES,
    FIFO,
    MAX_BATCH,
    MAX_LEASED_PER_GROUP_LIMIT,
    MAX_PAYLOAD_BYTES,
)
from querator.domain.priority import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY

#: Default page size of the storage listings (contract: ``limit`` default 1000).
DEFAULT_LIST_LIMIT: Final = 1000
#: Default page size of ``queues.list``; the contract leaves it open, Querator uses 100.
DEFAULT_QUEUES_LIMIT: Final = 100
#: pydantic error types that mean "the body is not a message we understand" (455), not "a value is
#: wrong" (400): broken JSON, a key the message does not define, a body that is not an object.
_UNSUPPORTED_TYPES: Final = frozenset({"json_invalid", "extra_forbidden"})
_NOT_AN_OBJECT_TYPES: Final = frozenset({"model_type", "model_attributes_type", "dict_type"})

ModelT = TypeVar("ModelT", bound=BaseModel)


# -- field types --------------------------------------------------------------------------------------


def _custom_error(kind: str, reason: str) -> PydanticCustomError:
    # The reason goes in the context, not the template: user input may contain '{...}'.
    return PydanticCustomError(kind, "{reason}", {"reason": reason})


def _to_duration(value: object) -> timedelta:
    if isinstance(value, timedelta):
        return value
    if not isinstance(value, str):
        raise _custom_error("duration_type", "must be a Go duration string such as '30s' or '1h30m'")
    try:
        return parse_duration(value)
    except InvalidRequestError as exc:
        raise _custom_error("duration_parsing", str(exc)) from exc


def _to_timestamp(value: object) -> datetime:
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise _custom_error("timestamp_naive", "must be timezone-aware")
        return value
    if not isinstance(value, str):
        raise _custom_error("timestamp_type", "must be an RFC 3339 string such as '2026-11-22T05:33:11Z'")
    try:
        return parse_timestamp(value)
    except InvalidRequestError as exc:
        raise _custom_error("timestamp_parsing", str(exc)) from exc


def _to_payload(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise _custom_error("base64_type", "must be a standard base64 string")
    # protojson writes padding but accepts input without it; so do we.
    padded = value + "=" * (-len(value) % 4)
    try:
        return base64.b64decode(padded, validate=True)
    except binascii.Error as exc:
        raise _custom_error("base64_decode", f"invalid standard base64: {exc}") from exc


def _encode_payload(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _check_group(value: str) -> str:
    try:
        return validate_group(value)
    except InvalidRequestError as exc:
        raise _custom_error("group", str(exc)) from exc


def _check_delivery(value: str) -> str:
    if value not in DELIVERIES:
        raise _custom_error("delivery", "must be 'fifo' or 'fair'")
    return value


def _check_queue_name(value: str) -> str:
    try:
        return domain.validate_queue_name(value)
    except InvalidRequestError as exc:
        raise _custom_error("queue_name", str(exc)) from exc


#: A Go duration string on the wire, a ``timedelta`` in Python.
GoDuration = Annotated[
    timedelta,
    PlainValidator(_to_duration),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema(
        {"type": "string", "description": "Go duration such as '30s' or '1h30m'", "examples": ["1m0s"]}
    ),
]
#: An RFC 3339 string on the wire (output in UTC with ``Z``), an aware ``datetime`` in Python.
Timestamp = Annotated[
    datetime,
    PlainValidator(_to_timestamp),
    PlainSerializer(format_timestamp, return_type=str),
    WithJsonSchema({"type": "string", "format": "date-time", "examples": ["2026-11-22T05:33:11.123456Z"]}),
]
#: Standard base64 on the wire, ``bytes`` in Python.
Payload = Annotated[
    bytes,
    PlainValidator(_to_payload),
    PlainSerializer(_encode_payload, return_type=str),
    WithJsonSchema({"type": "string", "contentEncoding": "base64"}),
]
QueueName = Annotated[str, AfterValidator(_check_queue_name)]
ItemIds = Annotated[list[str], Field(min_length=1, max_length=MAX_BATCH)]
Partition = Annotated[int, Field(ge=0)]
#: 0-9, lower leases first; a JSON integer (``5.0``, ``"5"`` and ``true`` are refused).
Priority = Annotated[
    int, Strict(), Field(ge=MIN_PRIORITY, le=MAX_PRIORITY, description="0-9, lower leases first")
]
#: A queue's delivery: "fifo" (oldest first in each partition) or "fair" (round-robin across groups).
Delivery = Annotated[
    str,
    Strict(),
    AfterValidator(_check_delivery),
    WithJsonSchema(
        {
            "type": "string",
            "enum": list(DELIVERIES),
            "description": '"fifo" (default) or "fair": leases go round-robin across the groups',
        }
    ),
]
#: In a fair queue, the most valid leases one group may hold; a JSON integer, 0 (no limit) or more.
MaxLeasedPerGroup = Annotated[
    int,
    Strict(),
    Field(
        ge=0,
        le=MAX_LEASED_PER_GROUP_LIMIT,
        description="fair queues: the most valid leases one group may hold; 0 (default): no limit",
    ),
]
#: An item's group: up to 128 bytes of printable UTF-8; "" (the default) is none.
Group = Annotated[
    str,
    AfterValidator(_check_group),
    Field(description=f'The item\'s group (a tenant, a customer): up to {MAX_GROUP_BYTES} bytes, "" is none'),
]


# -- bases --------------------------------------------------------------------------------------------


class WireRequest(BaseModel):
    """Base of every request body."""

    model_config = ConfigDict(
        extra="forbid",
        # populate_by_name=True in pydantic < 2.11 terms: accept snake_case names and camelCase aliases.
        validate_by_name=True,
        validate_by_alias=True,
        alias_generator=to_camel,
        # Error messages name the snake_case field, whichever spelling the client used.
        loc_by_alias=False,
        frozen=True,
        # Built on first use: a function builds only the models of its own routes (cold start).
        defer_build=True,
    )


class WireResponse(BaseModel):
    """Base of every response body: snake_case keys, ``None`` left out."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready body."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# -- queues -------------------------------------------------------------------------------------------


class CreateQueueRequest(WireRequest):
    """``queues.create``: a ``QueueInfo``; ``lease_timeout`` and ``expire_timeout`` are required."""

    queue_name: QueueName
    lease_timeout: GoDuration
    expire_timeout: GoDuration
    max_attempts: int = 0
    dead_queue: str = ""
    reference: str = ""
    requested_partitions: int = 1
    delivery: Delivery = FIFO
    max_leased_per_group: MaxLeasedPerGroup = 0
    # Output-only fields of QueueInfo, accepted and ignored, so the body of a queues.info reply can be
    # sent back as is.
    created_at: Timestamp | None = None
    updated_at: Timestamp | None = None

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
            created_at=now,
            updated_at=now,
        )


class UpdateQueueRequest(WireRequest):
    """``queues.update``: only the fields present in the body change."""

    queue_name: QueueName
    lease_timeout: GoDuration | None = None
    expire_timeout: GoDuration | None = None
    max_attempts: int | None = None
    dead_queue: str | None = None
    reference: str | None = None
    requested_partitions: int | None = None
    delivery: Delivery | None = None
    max_leased_per_group: MaxLeasedPerGroup | None = None
    created_at: Timestamp | None = None
    updated_at: Timestamp | None = None

    def to_domain(self) -> domain.QueueUpdate:
        """The update; a field absent from the body (or ``null``) is ``None``: leave as is."""

        def present(name: str) -> Any:
            return getattr(self, name) if name in self.model_fields_set else None

        return domain.QueueUpdate(
            name=self.queue_name,
            lease_timeout=present("lease_timeout"),
            expire_timeout=present("expire_timeout"),
            max_attempts=present("max_attempts"),
            dead_queue=present("dead_queue"),
            reference=present("reference"),
            partitions=present("requested_partitions"),
            delivery=present("delivery"),
            max_leased_per_group=present("max_leased_per_group"),
        )


class QueueNameRequest(WireRequest):
    """A body that names one queue."""

    queue_name: QueueName


class QueueInfoRequest(QueueNameRequest):
    """``queues.info``."""


class DeleteQueueRequest(QueueNameRequest):
    """``queues.delete``: removes the queue and its items."""


class ListQueuesRequest(WireRequest):
    """``queues.list``: queues in name order from ``pivot`` (inclusive)."""

    pivot: str = ""
    limit: int = Field(default=DEFAULT_QUEUES_LIMIT, ge=1, le=MAX_BATCH)


class QueueInfoResponse(WireResponse):
    """A ``QueueInfo`` as ``queues.info`` (and create / update) return it."""

    queue_name: str
    lease_timeout: GoDuration
    expire_timeout: GoDuration
    max_attempts: int
    dead_queue: str
    reference: str
    requested_partitions: int
    delivery: str
    max_leased_per_group: int
    created_at: Timestamp
    updated_at: Timestamp

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
            created_at=info.created_at,
            updated_at=info.updated_at,
        )


class ListQueuesResponse(WireResponse):
    """``queues.list``: ``{"items": [QueueInfo...]}``."""

    items: list[QueueInfoResponse]

    @classmethod
    def from_domain(cls, queues: Sequence[domain.QueueInfo]) -> Self:
        return cls(items=[QueueInfoResponse.from_domain(q) for q in queues])


# -- produce and lease --------------------------------------------------------------------------------


class ProduceItem(WireRequest):
    """One item of ``queue.produce``: the payload is ``bytes`` (base64) or ``utf8``, exactly one."""

    reference: str = ""
    encoding: str = ""
    kind: str = ""
    bytes: Payload | None = Field(
        default=None, description=f"The payload, standard base64; at most {MAX_PAYLOAD_BYTES:,} bytes decoded"
    )
    utf8: str | None = Field(
        default=None, description=f"The payload as text; at most {MAX_PAYLOAD_BYTES:,} bytes of UTF-8."
    )
    #: In the future: the item is scheduled until then.
    enqueue_at: Timestamp | None = None
    priority: Priority = DEFAULT_PRIORITY
    group: Group = ""

    @field_validator("utf8")
    @classmethod
    def _encodable(cls, value: str | None) -> str | None:
        # A JSON string may carry a lone surrogate ("\ud800"), which has no UTF-8 form.
        if value is not None:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise _custom_error("utf8", f"not encodable as UTF-8: {exc.reason}") from exc
        return value

    @model_validator(mode="after")
    def _one_payload(self) -> Self:
        # Querator lets bytes win silently and stores an item with neither as an empty payload; the
        # contract says "bytes | utf8", so both, or neither (a misspelt key is a 455 already), is a
        # client bug worth reporting. An empty payload is still one key away: {"utf8": ""}.
        if self.bytes is not None and self.utf8 is not None:
            raise _custom_error("payload_ambiguous", "give either 'bytes' or 'utf8', not both")
        if self.bytes is None and self.utf8 is None:
            raise _custom_error(
                "payload_missing", "no payload: give 'bytes' (base64) or 'utf8' (an empty one is \"\")"
            )
        return self

    def to_domain(self) -> domain.NewItem:
        """Raises ``InvalidRequestError`` when the payload or a text field is over its limit."""
        payload = self.bytes if self.bytes is not None else (self.utf8 or "").encode("utf-8")
        return domain.NewItem(
            payload=payload,
            reference=self.reference,
            encoding=self.encoding,
            kind=self.kind,
            enqueue_at=self.enqueue_at,
            priority=self.priority,
            group=self.group,
        )


class ProduceRequest(WireRequest):
    """``queue.produce``: 1-1000 items, stored together in one partition."""

    queue_name: QueueName
    request_timeout: GoDuration | None = None
    items: list[ProduceItem] = Field(min_length=1, max_length=MAX_BATCH)

    def to_domain(self) -> list[domain.NewItem]:
        return [item.to_domain() for item in self.items]


class LeaseRequest(WireRequest):
    """``queue.lease``: up to ``batch_size`` items of one partition, oldest first.

    ``request_timeout`` is ``None`` when absent; the handler applies its default and platform cap.
    """

    queue_name: QueueName
    batch_size: int = Field(ge=1, le=MAX_BATCH)
    client_id: str = Field(min_length=1)
    request_timeout: GoDuration | None = None


class LeaseItem(WireResponse):
    """One leased item; ``attempts`` counts this lease too."""

    id: str
    attempts: int
    priority: int = DEFAULT_PRIORITY
    group: str = ""
    lease_deadline: Timestamp | None = None
    reference: str = ""
    encoding: str = ""
    kind: str = ""
    bytes: Payload = b""

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
        )


class LeaseResponse(WireResponse):
    """``queue.lease`` reply: items of one partition."""

    queue_name: str
    partition: int
    items: list[LeaseItem]

    @classmethod
    def from_domain(cls, lease: domain.Lease) -> Self:
        return cls(
            queue_name=lease.queue_name,
            partition=lease.partition,
            items=[LeaseItem.from_domain(i) for i in lease.items],
        )


# -- complete, retry, renew ---------------------------------------------------------------------------


class CompleteRequest(WireRequest):
    """``queue.complete``: delete leased items."""

    queue_name: QueueName
    partition: Partition = 0
    request_timeout: GoDuration | None = None
    ids: ItemIds


class RetryItem(WireRequest):
    """One item of ``queue.retry``: back now, at ``retry_at``, or (``dead``) to the dead-letter queue."""

    id: str = Field(min_length=1)
    retry_at: Timestamp | None = None
    dead: bool = False
    #: The priority the item goes back with; absent: the one it has.
    priority: Priority | None = None

    def to_domain(self) -> domain.RetryRequest:
        return domain.RetryRequest(id=self.id, retry_at=self.retry_at, dead=self.dead, priority=self.priority)


class RetryRequest(WireRequest):
    """``queue.retry``: put leased items back."""

    queue_name: QueueName
    partition: Partition = 0
    items: list[RetryItem] = Field(min_length=1, max_length=MAX_BATCH)

    def to_domain(self) -> list[domain.RetryRequest]:
        return [item.to_domain() for item in self.items]


class RenewRequest(WireRequest):
    """``queue.renew``: set leases to end at now + ``lease_timeout`` (``None``: the queue's); counted
    from now, not from the old deadline, so a short ``lease_timeout`` shortens a lease."""

    queue_name: QueueName
    partition: Partition = 0
    ids: ItemIds
    lease_timeout: GoDuration | None = None


class RenewedItem(WireResponse):
    id: str
    lease_deadline: Timestamp


class RenewResponse(WireResponse):
    """``queue.renew`` reply: the renewed ids and their new deadlines."""

    queue_name: str
    partition: int
    items: list[RenewedItem]

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

    queue_name: QueueName
    partition: Partition = 0
    ids: ItemIds
    priority: Priority


class ReprioritizedItem(WireResponse):
    id: str
    new_id: str


class ReprioritizeResponse(WireResponse):
    """``queue.reprioritize`` reply: every id of the request with the id the item has now."""

    queue_name: str
    partition: int
    items: list[ReprioritizedItem]

    @classmethod
    def from_domain(cls, queue_name: str, partition: int, outcome: domain.Reprioritized) -> Self:
        return cls(
            queue_name=queue_name,
            partition=partition,
            items=[ReprioritizedItem(id=old, new_id=new) for old, new in outcome.ids.items()],
        )


class OkResponse(WireResponse):
    """``{"code": 200}``: Querator's reply to every call with nothing else to return (produce,
    complete, retry, queues.create / update / delete, clear, storage/items.delete)."""

    code: int = 200


# -- stats and clear ----------------------------------------------------------------------------------


class StatsRequest(QueueNameRequest):
    """``queue.stats``."""


class PartitionStatsResponse(WireResponse):
    partition: int
    #: Items that are not scheduled, leased or not.
    total: int
    total_leased: int
    scheduled: int
    average_age: GoDuration
    average_leased_age: GoDuration
    #: Items produced (or imported) into the partition and items completed in it, ever: two
    #: samples of these give produce and complete rates.
    produced: int = 0
    completed: int = 0

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
    partitions: list[PartitionStatsResponse]


class StatsResponse(WireResponse):
    """``queue.stats`` reply in Querator's shape: one logical queue holding every partition."""

    queue_name: str
    # The one camelCase key of the contract: Querator's proto has no json_name for it.
    logical_queues: list[LogicalQueueStats] = Field(serialization_alias="logicalQueues")

    @classmethod
    def from_domain(cls, queue_name: str, stats: Sequence[domain.PartitionStats]) -> Self:
        partitions = [PartitionStatsResponse.from_domain(s) for s in stats]
        return cls(queue_name=queue_name, logical_queues=[LogicalQueueStats(partitions=partitions)])


class ClearRequest(WireRequest):
    """``queue.clear``: ``queue`` and / or ``scheduled`` is required; ``destructive`` adds leased items."""

    queue_name: QueueName
    queue: bool = False
    scheduled: bool = False
    destructive: bool = False

    @model_validator(mode="after")
    def _something_to_clear(self) -> Self:
        if not (self.queue or self.scheduled):
            raise _custom_error("clear_scope", "set 'queue' or 'scheduled' (or both)")
        return self

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

    queue_name: QueueName
    to: str | None = None
    limit: int = Field(default=MAX_BATCH, ge=1, le=MAX_BATCH)


class RedriveResponse(WireResponse):
    """``queue.redrive`` reply: call again until ``remaining`` is 0."""

    moved: int
    remaining: int
    stranded: int

    @classmethod
    def from_domain(cls, outcome: domain.RedriveOutcome) -> Self:
        return cls(moved=outcome.moved, remaining=outcome.remaining, stranded=outcome.stranded)


# -- storage inspection -------------------------------------------------------------------------------


class ListItemsRequest(WireRequest):
    """``storage/items.list``: one partition in FIFO order from ``pivot`` (an item id, inclusive)."""

    queue_name: QueueName
    partition: Partition = 0
    pivot: str = ""
    limit: int = Field(default=DEFAULT_LIST_LIMIT, ge=1, le=MAX_BATCH)


class ListScheduledRequest(ListItemsRequest):
    """``storage/scheduled.list``: the scheduled items of one partition, in the order they come due."""


class StorageItemResponse(WireResponse):
    """An item as stored, for inspection."""

    id: str
    source_id: str = ""
    is_leased: bool = False
    lease_deadline: Timestamp | None = None
    expire_deadline: Timestamp
    created_at: Timestamp
    enqueue_at: Timestamp | None = None
    attempts: int = 0
    priority: int = DEFAULT_PRIORITY
    group: str = ""
    reference: str = ""
    encoding: str = ""
    kind: str = ""
    payload: Payload = b""

    @classmethod
    def from_domain(cls, item: domain.Item, now: datetime) -> Self:
        """``now`` decides ``is_leased``: a deadline in the past is a lease that ran out."""
        return cls(
            id=item.id,
            source_id=item.source_id,
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

    items: list[StorageItemResponse]

    @classmethod
    def from_domain(cls, items: Sequence[domain.Item], now: datetime) -> Self:
        return cls(items=[StorageItemResponse.from_domain(i, now) for i in items])


class ImportItem(WireRequest):
    """One item of ``storage/items.import``, written verbatim under a new id.

    Takes every key that a listing returns, so a page of ``storage/items.list`` can be imported as
    is; ``id`` and ``is_leased`` are accepted and ignored (the id is new, the lease is its deadline).
    """

    id: str = ""
    source_id: str = ""
    is_leased: bool = False
    lease_deadline: Timestamp | None = None
    expire_deadline: Timestamp | None = None
    created_at: Timestamp | None = None
    enqueue_at: Timestamp | None = None
    attempts: int = Field(default=0, ge=0)
    priority: Priority = DEFAULT_PRIORITY
    group: Group = ""
    reference: str = ""
    encoding: str = ""
    kind: str = ""
    payload: Payload = b""

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
            source_id=self.source_id,
            priority=self.priority,
            group=self.group,
        )


class ImportItemsRequest(WireRequest):
    """``storage/items.import``: items are skipped when their ``source_id`` is already in the partition."""

    queue_name: QueueName
    partition: Partition = 0
    items: list[ImportItem] = Field(min_length=1, max_length=MAX_BATCH)

    def to_domain(self) -> list[domain.StorageItem]:
        return [item.to_domain() for item in self.items]


class ImportedItem(WireResponse):
    id: str


class ImportItemsResponse(WireResponse):
    """``storage/items.import`` reply: the new ids (Querator's ``items`` shape, other fields omitted)."""

    items: list[ImportedItem]

    @classmethod
    def from_domain(cls, ids: Sequence[str]) -> Self:
        return cls(items=[ImportedItem(id=i) for i in ids])


class DeleteItemsRequest(WireRequest):
    """``storage/items.delete``: deletes in any state; deleting twice succeeds."""

    queue_name: QueueName
    partition: Partition = 0
    ids: ItemIds


# -- meta ---------------------------------------------------------------------------------------------


class HealthResponse(WireResponse):
    """``GET /health``."""

    status: str = "pass"


# -- parsing ------------------------------------------------------------------------------------------


def _location(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _describe(details: Sequence[ErrorDetails]) -> str:
    parts = []
    for detail in details:
        where = _location(detail["loc"])
        message = "unknown key" if detail["type"] == "extra_forbidden" else detail["msg"]
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


def _is_unsupported(detail: ErrorDetails) -> bool:
    return detail["type"] in _UNSUPPORTED_TYPES or (
        not detail["loc"] and detail["type"] in _NOT_AN_OBJECT_TYPES
    )


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
) -> ModelT:
    """Decode a request body into ``model``, applying the contract's wire rules in order.

    An empty body is ``{}`` (all defaults). Raises ``WireError`` (455) when the content type is not
    JSON, the body is not a JSON object, or it has a key the message does not define;
    ``PayloadTooLargeError`` (413) when it is over ``limit`` bytes; ``InvalidRequestError`` (400) for
    a wrong value, naming the field(s).
    """
    if not is_json_content_type(content_type):
        raise unsupported_content(f"Content-Type {content_type!r} is not application/json")
    raw = body.encode("utf-8") if isinstance(body, str) else (body or b"")
    if limit is not None and len(raw) > limit:
        raise body_too_large(len(raw), limit)
    if not raw.strip():
        raw = b"{}"
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        details = exc.errors(include_url=False)
        # Not understanding the body is the cause of the other errors (a misspelt key also shows up
        # as a missing field), so a 455 names only what was not understood.
        unsupported = [d for d in details if _is_unsupported(d)]
        if unsupported:
            raise unsupported_content(_describe(unsupported)) from exc
        raise InvalidRequestError(_describe(details)) from exc
