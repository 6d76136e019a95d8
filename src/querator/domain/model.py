"""Domain layer: the queue's values.

Values are frozen; a state change is a new value. All datetimes are timezone-aware UTC: the
constructors refuse naive ones, so a local-time bug cannot slip into the ordering keys.
"""

from __future__ import annotations

import enum
import zlib
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from querator.domain.errors import InvalidRequestError
from querator.domain.groups import group_lane, validate_group
from querator.domain.priority import DEFAULT_PRIORITY, priority_of, validate_priority
from querator.domain.ratelimit import RateLimit, validate_rate_limit
from querator.domain.text import check_printable, clip_utf8

if TYPE_CHECKING:
    from collections.abc import Sequence

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

MAX_QUEUE_NAME_BYTES = 512
MAX_REFERENCE_BYTES = 2000
MAX_ATTEMPTS_LIMIT = 65536
MAX_BATCH = 1000
#: Upper bound on the partition count of one queue: a lease that finds nothing visits every partition.
MAX_PARTITIONS = 256
#: The largest payload of an item: 1 MiB, SQS's limit. Engine v3 on SQLite and memory keeps it in
#: its row; on DynamoDB a payload over ``ROW_PAYLOAD_BYTES`` goes to the payload bucket.
MAX_PAYLOAD_BYTES = 1_048_576
#: The largest payload a DynamoDB row holds in place (DynamoDB stores at most 400 KB per item; the
#: keys and attributes need some of it): the limit under engine v2, and on DynamoDB without a bucket.
ROW_PAYLOAD_BYTES = 380_000
#: Most bytes of UTF-8 in a failure reason (``queue.retry``'s ``reason``, ``Item.last_reason``).
MAX_REASON_BYTES = 1024
#: The most ``attempts`` and ``failures`` an imported item may carry: a stored row holds counts up to
#: 2**32 - 1 (engine v3's row codec), and the item's leases and failures after the import count on.
MAX_IMPORTED_COUNT = 2**31 - 1
#: Items whose ``reply_size`` is under this count as this much when a lease sizes its reply, so the
#: store need only record the size of larger ones.
REPLY_SIZE_THRESHOLD = 1024
#: What an item's fixed fields (id, deadlines, attempts, keys, JSON punctuation) add to a reply.
REPLY_ITEM_OVERHEAD = 400


def reply_bytes_at_most(size: int) -> int:
    """What an item of ``Item.reply_size`` ``size`` adds to a lease reply at most: base64 payload
    and strings, plus its fixed part (every item counts as at least ``REPLY_SIZE_THRESHOLD``)."""
    return 4 * -(-max(size, REPLY_SIZE_THRESHOLD) // 3) + REPLY_ITEM_OVERHEAD


#: The latest time a client may schedule an item for. An item id holds its visible-at time in 14 hex
#: digits of microseconds (until the year 4253, ``querator.domain.ids``), and deadlines add at most a
#: Go duration (~292 years) to it; a later time would overflow both.
LATEST_SCHEDULE = datetime(3000, 1, 1, tzinfo=UTC)


def check_schedulable(value: datetime, what: str) -> datetime:
    """Return ``value`` in UTC, refusing naive datetimes and times from ``LATEST_SCHEDULE`` on."""
    value = check_aware(value, what)
    if value >= LATEST_SCHEDULE:
        raise InvalidRequestError(f"{what} must be before {LATEST_SCHEDULE.year}", field=what)
    return value


def check_delay(value: timedelta, what: str) -> timedelta:
    """Return ``value``, refusing a negative delay (``0``: now)."""
    if not isinstance(value, timedelta):
        raise InvalidRequestError(f"{what} must be a duration", field=what)
    if value < timedelta(0):
        raise InvalidRequestError(f"{what} must not be negative", field=what)
    return value


def check_one_time(at: datetime | None, delay: timedelta | None, at_name: str, delay_name: str) -> None:
    """Refuse a time given both ways: which one is meant would be a guess."""
    if at is not None and delay is not None:
        raise InvalidRequestError(f"give {at_name} or {delay_name}, not both", field=delay_name)


def resolve_time(at: datetime | None, delay: timedelta | None, now: datetime, what: str) -> datetime | None:
    """The absolute time of ``at`` or of ``now + delay`` (``None`` when neither is given).

    A relative delay is counted from the server's clock at the call (``now``), never the caller's.
    """
    if delay is None:
        return at
    return check_schedulable(now + delay, what)


def check_aware(value: datetime, what: str) -> datetime:
    """Return ``value`` in UTC, refusing naive datetimes."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidRequestError(f"{what} must be timezone-aware", field=what)
    return value.astimezone(UTC)


def validate_reason(value: object, what: str = "reason") -> str:
    """``value`` as a failure reason, or ``InvalidRequestError`` naming ``what``: a string of at most
    ``MAX_REASON_BYTES`` bytes of UTF-8 without control characters or line separators (shown on one
    line in listings, the CLI's tables and the console, as queue names are)."""
    if not isinstance(value, str):
        raise InvalidRequestError(f"{what} must be a string", field=what)
    check_printable(value, what)
    if len(value.encode()) > MAX_REASON_BYTES:
        raise InvalidRequestError(
            f"{what} is longer than {MAX_REASON_BYTES} bytes of UTF-8 ({len(value.encode())})", field=what
        )
    return value


def check_item_limits(payload: bytes, *, reference: str, encoding: str, kind: str) -> None:
    """Refuse an item's payload or text fields over their limits (docs/api.md "Limits"): what a
    produced item and an imported one are both held to."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise InvalidRequestError(f"item payload is larger than {MAX_PAYLOAD_BYTES} bytes", field="payload")
    for name, value in (("reference", reference), ("encoding", encoding), ("kind", kind)):
        if len(value.encode()) > MAX_REFERENCE_BYTES:
            raise InvalidRequestError(f"item {name} is longer than {MAX_REFERENCE_BYTES} bytes", field=name)


def check_payload_limit(payloads: Sequence[bytes], limit: int) -> None:
    """Refuse the first of ``payloads`` (a request's items, in order) over ``limit``, the store's
    (``ClaimLog.payload_limit``; ``ROW_PAYLOAD_BYTES`` under engine v2), naming the item, before
    anything is written."""
    for index, payload in enumerate(payloads):
        if len(payload) > limit:
            raise InvalidRequestError(
                f"items[{index}]: item payload is larger than {limit} bytes", field="payload"
            )


def validate_queue_name(name: str, what: str = "queue_name") -> str:
    """``name`` if it can name a queue; ``what``: the field that gave it (``dead_queue``...)."""
    if not name:
        raise InvalidRequestError(f"{what} is required", field=what)
    if len(name.encode()) > MAX_QUEUE_NAME_BYTES:
        raise InvalidRequestError(f"{what} is longer than {MAX_QUEUE_NAME_BYTES} bytes", field=what)
    # '~' separates the queue name from the partition in storage keys, so it cannot be in a name.
    if "~" in name or any(ch.isspace() for ch in name):
        raise InvalidRequestError(f"{what} may not contain whitespace or '~'", field=what, value=name)
    return name


def validate_new_queue_name(name: str) -> str:
    """``validate_queue_name``, and no control characters (as a group): the name a new queue takes.

    A queue name is shown in listings, logs and the console. Names that already exist are not
    checked for it (``validate_queue_name`` alone): a queue created before the rule must stay
    readable and deletable, and a lookup of a name nobody could create just finds no queue.
    """
    return check_printable(validate_queue_name(name), "queue_name")


FIFO = "fifo"
FAIR = "fair"
DELIVERIES = (FIFO, FAIR)
#: The most ``max_leased_per_group`` may be.
MAX_LEASED_PER_GROUP_LIMIT = 1_000_000


def validate_delivery(delivery: str, max_leased_per_group: int) -> None:
    if delivery not in DELIVERIES:
        raise InvalidRequestError("delivery must be 'fifo' or 'fair'", field="delivery")
    if isinstance(max_leased_per_group, bool) or not 0 <= max_leased_per_group <= MAX_LEASED_PER_GROUP_LIMIT:
        raise InvalidRequestError(
            f"max_leased_per_group must be between 0 and {MAX_LEASED_PER_GROUP_LIMIT}",
            field="max_leased_per_group",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueInfo:
    """A queue in the catalog."""

    name: str
    lease_timeout: timedelta
    expire_timeout: timedelta
    max_attempts: int = 0
    dead_queue: str = ""
    reference: str = ""
    partitions: int = 1
    created_at: datetime
    updated_at: datetime
    #: Set while ``queues.delete`` removes the items; the queue refuses work meanwhile.
    deleting: bool = False
    #: ``"fifo"``, or ``"fair"``: leases go round-robin across the groups with ready items.
    delivery: str = FIFO
    #: In a fair queue, the most valid leases one group may hold (0: no limit).
    max_leased_per_group: int = 0
    #: Leases a second across the queue's partitions and consumers (0: no limit); a token bucket
    #: with a burst of one second's worth (``querator.domain.ratelimit``).
    rate_limit: float = 0.0
    #: In a fair queue, leases a second of one group (0: no limit), a bucket per group.
    rate_limit_per_group: float = 0.0

    @property
    def fair(self) -> bool:
        return self.delivery == FAIR

    @property
    def queue_rate(self) -> RateLimit | None:
        """The queue's lease rate limit, if it has one."""
        return RateLimit(self.rate_limit) if self.rate_limit else None

    @property
    def group_rate(self) -> RateLimit | None:
        """The lease rate limit of each group, if the queue has one."""
        return RateLimit(self.rate_limit_per_group) if self.rate_limit_per_group else None

    def lane_for(self, group: str) -> str:
        """Where an item of ``group`` goes in its band: the group's lane in a fair queue; the band
        itself in a FIFO queue, and for items without a group (one group of their own)."""
        return group_lane(group) if self.fair and group else ""

    def __post_init__(self) -> None:
        validate_queue_name(self.name)
        if self.lease_timeout <= timedelta(0):
            raise InvalidRequestError("lease_timeout must be greater than zero", field="lease_timeout")
        if self.expire_timeout <= timedelta(0):
            raise InvalidRequestError("expire_timeout must be greater than zero", field="expire_timeout")
        if self.lease_timeout > self.expire_timeout:
            raise InvalidRequestError(
                "lease_timeout may not be longer than expire_timeout", field="lease_timeout"
            )
        validate_delivery(self.delivery, self.max_leased_per_group)
        object.__setattr__(self, "rate_limit", validate_rate_limit(self.rate_limit, "rate_limit"))
        object.__setattr__(
            self,
            "rate_limit_per_group",
            validate_rate_limit(self.rate_limit_per_group, "rate_limit_per_group"),
        )
        if self.rate_limit_per_group and not self.fair:
            # A FIFO queue's lease reads items by their place, not by group: a limit per group
            # there would have to read every item's group (and skip whole runs of one group).
            raise InvalidRequestError(
                "rate_limit_per_group needs delivery 'fair'", field="rate_limit_per_group"
            )
        if not 0 <= self.max_attempts <= MAX_ATTEMPTS_LIMIT:
            raise InvalidRequestError(
                f"max_attempts must be between 0 and {MAX_ATTEMPTS_LIMIT}", field="max_attempts"
            )
        if not 1 <= self.partitions <= MAX_PARTITIONS:
            raise InvalidRequestError(
                f"requested_partitions must be between 1 and {MAX_PARTITIONS}",
                field="requested_partitions",
            )
        if len(self.reference.encode()) > MAX_REFERENCE_BYTES:
            raise InvalidRequestError(
                f"reference is longer than {MAX_REFERENCE_BYTES} bytes", field="reference"
            )
        if self.dead_queue:
            validate_queue_name(self.dead_queue, "dead_queue")
            if self.dead_queue == self.name:
                raise InvalidRequestError("dead_queue may not be the queue itself", field="dead_queue")
        check_aware(self.created_at, "created_at")
        check_aware(self.updated_at, "updated_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueUpdate:
    """The fields of ``queues.update``; ``None`` means "not in the request, leave as is"."""

    name: str
    lease_timeout: timedelta | None = None
    expire_timeout: timedelta | None = None
    max_attempts: int | None = None
    dead_queue: str | None = None
    reference: str | None = None
    partitions: int | None = None
    delivery: str | None = None
    max_leased_per_group: int | None = None
    rate_limit: float | None = None
    rate_limit_per_group: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NewItem:
    """An item as a producer hands it in."""

    payload: bytes = b""
    reference: str = ""
    encoding: str = ""
    kind: str = ""
    #: When set and in the future, the item is scheduled: invisible to lease until then.
    enqueue_at: datetime | None = None
    #: The same, relative: scheduled this long after the server's clock at the produce call.
    enqueue_in: timedelta | None = None
    #: 0-9, lower leases first (``querator.domain.priority``).
    priority: int = DEFAULT_PRIORITY
    #: The item's group (``querator.domain.groups``); ``""``: none.
    group: str = ""

    def __post_init__(self) -> None:
        validate_priority(self.priority)
        validate_group(self.group)
        if self.enqueue_in is not None:
            check_delay(self.enqueue_in, "enqueue_in")
            check_one_time(self.enqueue_at, self.enqueue_in, "enqueue_at", "enqueue_in")
        check_item_limits(self.payload, reference=self.reference, encoding=self.encoding, kind=self.kind)
        if self.enqueue_at is not None:
            object.__setattr__(self, "enqueue_at", check_schedulable(self.enqueue_at, "enqueue_at"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Item:
    """An item as stored in one partition of a queue.

    ``id`` is the item's place in its partition and is valid for one lease: an item that goes back
    to the queue is written again under a new id (see ``querator.domain.ids``).
    """

    id: str
    payload: bytes = b""
    reference: str = ""
    encoding: str = ""
    kind: str = ""
    attempts: int = 0
    #: Set once the item is leased; a deadline in the past means the lease ran out.
    lease_deadline: datetime | None = None
    expire_deadline: datetime
    created_at: datetime
    #: The time the item was scheduled for, when it was produced or retried with one.
    enqueue_at: datetime | None = None
    #: The item's id in the queue it was dead-lettered or imported from.
    source_id: str = ""
    #: The queue a dead letter came from (where ``queue.redrive`` sends it back); empty otherwise,
    #: and on dead letters stored before redrive existed.
    source_queue: str = ""
    #: A priority given by ``queue.reprioritize`` while the item was leased: it goes back to the
    #: queue (or to the dead-letter queue) with this one. ``None``: with its own.
    next_priority: int | None = None
    #: The item's group (``querator.domain.groups``); ``""``: none.
    group: str = ""
    #: Why the item last failed: the reason a consumer gave ``queue.retry``, or the service's own
    #: (``querator.domain.reasons``); ``""``: it never failed. Kept through retries, dead-lettering
    #: and redrive; stored only when set, so an item that never fails stores nothing more.
    last_reason: str = ""
    #: How many failures were recorded on the item (each one set ``last_reason``).
    failures: int = 0
    #: Where the store keeps a payload too large for its row (on DynamoDB, the S3 object's key:
    #: ``querator.storage.dynamodb.objects``); ``""``: in the row. A store sets it when it reads the
    #: item; a move keeps it, so the moved item keeps its object. Not part of the item's value.
    payload_object: str = field(default="", compare=False, repr=False)

    @property
    def priority(self) -> int:
        """0-9, lower leases first: part of the id (its band), so it moves with the item's place."""
        return priority_of(self.id)

    @property
    def returning_priority(self) -> int:
        """The priority the item has when it goes back to a queue: a reprioritized one's new one."""
        return self.priority if self.next_priority is None else self.next_priority

    def is_leased(self, now: datetime) -> bool:
        return self.lease_deadline is not None and self.lease_deadline > now

    def landing_partition(self, partitions: int) -> int:
        """The partition of a queue with ``partitions`` this item lands in when it moves there (a
        dead letter, a redrive): always the same one for the same item, so a move repeated after a
        failure meets its first try."""
        return zlib.crc32(self.id.encode()) % partitions

    def as_redriven(self, *, new_id: str, now: datetime, expire_deadline: datetime) -> Item:
        """This dead letter as a new item back in a queue under ``new_id``: what it carries, its
        priority (by its new id) and group kept; attempts from 0 and created ``now``, so
        ``expire_timeout`` counts from now; its old id kept as where it came from."""
        return Item(
            id=new_id,
            payload=self.payload,
            payload_object=self.payload_object,
            reference=self.reference,
            encoding=self.encoding,
            kind=self.kind,
            group=self.group,
            attempts=0,
            created_at=now,
            expire_deadline=expire_deadline,
            source_id=self.id,
            last_reason=self.last_reason,
            failures=self.failures,
        )

    def as_dead_letter(self, *, new_id: str, source_queue: str, expire_deadline: datetime) -> Item:
        """This item as it enters a dead-letter queue under ``new_id``: what it carries, its
        attempts and creation time kept, its id and queue kept as where it came from."""
        return Item(
            id=new_id,
            payload=self.payload,
            payload_object=self.payload_object,
            reference=self.reference,
            encoding=self.encoding,
            kind=self.kind,
            group=self.group,
            attempts=self.attempts,
            created_at=self.created_at,
            expire_deadline=expire_deadline,
            source_id=self.id,
            source_queue=source_queue,
            last_reason=self.last_reason,
            failures=self.failures,
        )

    def with_failure(self, reason: str) -> Item:
        """This item with one more failure, ``reason`` (clipped to ``MAX_REASON_BYTES``) its last."""
        return replace(self, last_reason=clip_utf8(reason, MAX_REASON_BYTES), failures=self.failures + 1)

    def reply_size(self) -> int:
        """Bytes the item's variable fields may add to a reply: the payload, and its strings twice
        (JSON escapes can double them). Leases keep their replies under the cap with it."""
        strings = sum(
            len(s.encode()) for s in (self.reference, self.encoding, self.kind, self.group, self.last_reason)
        )
        return len(self.payload) + 2 * strings

    def state(self) -> ItemState:
        """What a range read returns of this item (stores record ``reply_size`` from the threshold on)."""
        size = self.reply_size()
        return ItemState(
            id=self.id,
            attempts=self.attempts,
            lease_deadline=self.lease_deadline,
            expire_deadline=self.expire_deadline,
            created_at=self.created_at,
            enqueue_at=self.enqueue_at,
            payload_size=size if size >= REPLY_SIZE_THRESHOLD else 0,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemState:
    """The few attributes that lifecycle decisions need; what a lease scan reads."""

    id: str
    attempts: int = 0
    lease_deadline: datetime | None = None
    expire_deadline: datetime
    created_at: datetime
    #: Set when the item was produced or retried for a later time (it counts as scheduled until due).
    enqueue_at: datetime | None = None
    #: ``Item.reply_size`` when it is ``REPLY_SIZE_THRESHOLD`` or more; 0 means "less than that".
    payload_size: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """The reply of a lease: items of one partition, oldest first."""

    queue_name: str
    partition: int
    items: list[Item] = field(default_factory=list)
    #: Set when the queue's rate limit has no lease left now: the first time one is there again
    #: (a lease before it gets nothing, or waits for it).
    next_lease_at: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryRequest:
    id: str
    #: ``None``: back to the tail now; otherwise scheduled for that time.
    retry_at: datetime | None = None
    #: The same, relative: scheduled this long after the server's clock at the retry call.
    retry_in: timedelta | None = None
    #: Straight to the dead-letter queue (deleted when the queue has none).
    dead: bool = False
    #: The priority the item goes back with (``None``: the one it has; doq's nack with a priority).
    priority: int | None = None
    #: Why the consumer gives the item back (``validate_reason``); ``""``: no reason, and the item's
    #: ``last_reason`` and ``failures`` stay as they are.
    reason: str = ""

    def __post_init__(self) -> None:
        validate_reason(self.reason)
        if self.priority is not None:
            validate_priority(self.priority)
        if self.retry_at is not None:
            object.__setattr__(self, "retry_at", check_schedulable(self.retry_at, "retry_at"))
        if self.retry_in is not None:
            check_delay(self.retry_in, "retry_in")
            check_one_time(self.retry_at, self.retry_in, "retry_at", "retry_in")


@dataclass(frozen=True, slots=True, kw_only=True)
class IdFailure:
    """Why one id of a complete / retry / renew request was not applied."""

    id: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchOutcome:
    """Per-id result of complete / retry: everything not listed in ``failed`` was applied."""

    applied: list[str] = field(default_factory=list)
    failed: list[IdFailure] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class Reprioritized:
    """``queue.reprioritize``: each applied id with the id the item has now (the same when it did
    not move: a leased item, or one that already had the priority), and the ids not applied."""

    ids: dict[str, str] = field(default_factory=dict)
    failed: list[IdFailure] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class RedriveOutcome:
    """What one ``queue.redrive`` call did."""

    #: Items moved out of the dead-letter queue by this call.
    moved: int
    #: Items still to move, from the dead-letter queue's counters after this call: leased dead
    #: letters and those this call did not reach. Stranded items seen by this call are not counted.
    remaining: int
    #: Items left in place because the queue they came from no longer exists (or, for dead letters
    #: stored before redrive recorded it, is not known: more than one queue dead-letters here).
    stranded: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Renewal:
    id: str
    lease_deadline: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class RenewOutcome:
    queue_name: str
    partition: int
    items: list[Renewal] = field(default_factory=list)
    failed: list[IdFailure] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionStats:
    partition: int
    total: int = 0
    total_leased: int = 0
    scheduled: int = 0
    average_age: timedelta = timedelta(0)
    average_leased_age: timedelta = timedelta(0)
    #: Items produced (or imported) and items completed, ever (cumulative; rates come from samples).
    produced: int = 0
    completed: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceReceipt:
    """Where a produce landed; returned again for a retried idempotent produce."""

    queue_name: str
    partition: int
    ids: list[str]
    #: True when an earlier request with the same idempotency key stored these items and this
    #: request stored nothing (bulk producers count such items as duplicates skipped).
    replayed: bool = False


class ClearScope(enum.Flag):
    """What ``queue.clear`` removes."""

    #: Items that are not leased and not scheduled.
    QUEUE = enum.auto()
    #: Scheduled items.
    SCHEDULED = enum.auto()
    #: Leased items too (with ``QUEUE``).
    DESTRUCTIVE = enum.auto()


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageItem:
    """An item for ``storage/items.import``: written verbatim, under a new id."""

    payload: bytes = b""
    reference: str = ""
    encoding: str = ""
    kind: str = ""
    attempts: int = 0
    lease_deadline: datetime | None = None
    expire_deadline: datetime | None = None
    created_at: datetime | None = None
    enqueue_at: datetime | None = None
    #: The same, relative to the server's clock at the import call.
    enqueue_in: timedelta | None = None
    source_id: str = ""
    priority: int = DEFAULT_PRIORITY
    group: str = ""
    #: A dead letter's source queue, last failure reason and failure count, as a listing gives them.
    source_queue: str = ""
    last_reason: str = ""
    failures: int = 0

    def __post_init__(self) -> None:
        validate_priority(self.priority)
        validate_group(self.group)
        validate_reason(self.last_reason, "last_reason")
        check_printable(self.source_queue, "source_queue")
        # The limits a produced item has (``NewItem``, docs/api.md "Limits"): an import is stored
        # as a produce is, so what a produce refuses (a DynamoDB item over 400 KB, a string the row
        # codec cannot hold) an import refuses too, naming the item, before anything is written.
        check_item_limits(self.payload, reference=self.reference, encoding=self.encoding, kind=self.kind)
        # An item id and a queue name as a listing gives them are far shorter; the row codecs hold
        # strings of at most 65,535 bytes, and a DynamoDB item at most 400 KB.
        if len(self.source_id.encode()) > MAX_REFERENCE_BYTES:
            raise InvalidRequestError(
                f"item source_id is longer than {MAX_REFERENCE_BYTES} bytes", field="source_id"
            )
        if len(self.source_queue.encode()) > MAX_QUEUE_NAME_BYTES:
            raise InvalidRequestError(
                f"item source_queue is longer than {MAX_QUEUE_NAME_BYTES} bytes", field="source_queue"
            )
        if self.failures < 0:
            raise InvalidRequestError("failures must not be negative", field="failures")
        for count in ("attempts", "failures"):
            if not 0 <= getattr(self, count) <= MAX_IMPORTED_COUNT:
                raise InvalidRequestError(f"{count} must be between 0 and {MAX_IMPORTED_COUNT}", field=count)
        if self.expire_deadline is not None:
            # Every deadline the service gives is far earlier; a row's TTL is counted from it.
            object.__setattr__(
                self, "expire_deadline", check_schedulable(self.expire_deadline, "expire_deadline")
            )
        if self.enqueue_at is not None:
            object.__setattr__(self, "enqueue_at", check_schedulable(self.enqueue_at, "enqueue_at"))
        if self.enqueue_in is not None:
            check_delay(self.enqueue_in, "enqueue_in")
            check_one_time(self.enqueue_at, self.enqueue_in, "enqueue_at", "enqueue_in")


#: The epoch of stored times, made once: every stored time converts through it (hot paths).
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def utc_from_timestamp_us(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def timestamp_us(value: datetime) -> int:
    # Aware in any zone counts from the same epoch; only a naive time is refused (check_aware's rule).
    if value.tzinfo is not UTC:
        value = check_aware(value, "timestamp")
    return (value - _EPOCH) // _MICROSECOND
