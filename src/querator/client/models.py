"""Python client: the values the client sends and returns, as frozen dataclasses.

Replies are decoded here: durations become ``timedelta``, timestamps aware ``datetime`` in UTC,
payloads ``bytes`` (base64 is a wire detail). A key the server leaves out is its zero value, as the
contract says. Only ``querator.api.durations`` is shared with the server: it is pure.
"""

from __future__ import annotations

import base64
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from querator.api.durations import format_duration, format_timestamp, parse_duration, parse_timestamp
from querator.domain.errors import InvalidRequestError

if TYPE_CHECKING:
    from collections.abc import Mapping

#: What a duration argument may be: a ``timedelta``, seconds, or a Go duration string sent verbatim
#: (so the server, not the client, is the one judge of its syntax).
Duration = timedelta | float | int | str
#: What a timestamp argument may be: an aware ``datetime``, or an RFC 3339 string sent verbatim.
Timestamp = datetime | str

#: Item priorities: 0-9, lower leases first; 5 when not given (a copy of ``querator.domain.priority``,
#: which tests/client checks it against, so the client needs no server code).
MIN_PRIORITY: Final = 0
MAX_PRIORITY: Final = 9
DEFAULT_PRIORITY: Final = 5
#: An item's group: at most this many bytes of UTF-8 (a copy of ``querator.domain.groups``).
MAX_GROUP_BYTES: Final = 128
#: A failure reason (``queue.retry``'s ``reason``): at most this many bytes of UTF-8 (a copy of
#: ``querator.domain.model.MAX_REASON_BYTES``).
MAX_REASON_BYTES: Final = 1024
_NOT_PRINTABLE: Final = frozenset({"Cc", "Cs", "Zl", "Zp"})
_ELLIPSIS: Final = "\u2026"


def duration_to_wire(value: Duration) -> str:
    """A Go duration string for the wire."""
    if isinstance(value, str):
        return value
    if isinstance(value, timedelta):
        return format_duration(value)
    return format_duration(timedelta(seconds=value))


def duration_seconds(value: Duration) -> float:
    """Seconds of a duration argument (a string is parsed as Go syntax; raises ``ValueError``)."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, str):
        try:
            return parse_duration(value).total_seconds()
        except InvalidRequestError as exc:
            # The helper is shared with the server, whose error type this is; callers get a ValueError.
            raise ValueError(str(exc)) from exc
    return float(value)


def timestamp_to_wire(value: Timestamp) -> str:
    """An RFC 3339 string for the wire (a naive ``datetime`` raises ``ValueError``)."""
    if isinstance(value, str):
        return value
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("timestamps must be timezone-aware")
    return format_timestamp(value)


def is_duration_text(value: object) -> bool:
    """Whether ``value`` is a Go duration string (``"30s"``); an RFC 3339 timestamp never is one."""
    if not isinstance(value, str):
        return False
    try:
        parse_duration(value)
    except InvalidRequestError:
        return False
    return True


def when_to_wire(
    body: dict[str, Any], at: Timestamp | Duration | None, delay: Duration | None, at_key: str, in_key: str
) -> None:
    """Put a time into ``body``: ``at`` as ``at_key`` (RFC 3339), or a delay as ``in_key``.

    ``at`` may be a delay too (a ``timedelta`` or a duration string such as ``"30s"``): it is sent as
    ``in_key``, counted from the server's clock, so ``retry_at=timedelta(seconds=30)`` and
    ``retry_at="30s"`` mean what they say. Both given, or a negative delay, raises ``ValueError``
    before anything is sent.
    """
    if isinstance(at, timedelta) or is_duration_text(at):
        if delay is not None:
            raise ValueError(f"give {at_key} or {in_key}, not both")
        at, delay = None, at
    if at is not None and delay is not None:
        raise ValueError(f"give {at_key} or {in_key}, not both")
    if delay is not None:
        if duration_seconds(delay) < 0:
            raise ValueError(f"{in_key} must not be negative, not {delay!r}")
        body[in_key] = duration_to_wire(delay)
    elif at is not None:
        if isinstance(at, (int, float)):
            raise ValueError(f"{at_key} must be a datetime, an RFC 3339 string or a delay, not {at!r}")
        body[at_key] = timestamp_to_wire(at)


def check_priority(value: object, what: str = "priority") -> int:
    """``value`` as a priority, or ``ValueError``: an ``int`` 0-9 (not a ``bool``, ``float`` or ``str``,
    which the server refuses too), checked before anything is sent."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer between 0 and 9, not {value!r}")
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ValueError(f"{what} must be between 0 and 9 (lower leases first), not {value}")
    return value


def check_group(value: object, what: str = "group") -> str:
    """``value`` as a group, or ``ValueError``: a ``str`` of at most 128 bytes of UTF-8 without
    control characters or line separators (``""``: none), checked before anything is sent."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, not {value!r}")
    if any(unicodedata.category(c) in _NOT_PRINTABLE for c in value):
        raise ValueError(f"{what} may not hold control characters: {value!r}")
    if len(value.encode()) > MAX_GROUP_BYTES:
        raise ValueError(f"{what} is longer than {MAX_GROUP_BYTES} bytes")
    return value


def check_reason(value: object, what: str = "reason") -> str:
    """``value`` as a failure reason, or ``ValueError``: a ``str`` of at most ``MAX_REASON_BYTES``
    bytes of UTF-8 without control characters or line breaks (``""``: none), checked before anything
    is sent. ``reason_text`` makes one of any text."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, not {value!r}")
    if any(unicodedata.category(c) in _NOT_PRINTABLE for c in value):
        raise ValueError(f"{what} may not hold control characters or line breaks: {value[:80]!r}")
    if len(value.encode()) > MAX_REASON_BYTES:
        raise ValueError(f"{what} is longer than {MAX_REASON_BYTES} bytes of UTF-8 ({len(value.encode())})")
    return value


def reason_text(text: str, *, keep_end: bool = False, limit: int = MAX_REASON_BYTES) -> str:
    """``text`` as a reason the server takes: each run of whitespace, control characters and line
    breaks one space, the ends stripped, and cut to ``limit`` bytes of UTF-8 (``MAX_REASON_BYTES``
    at most) at a character boundary (``…`` where it was cut): its start kept, or (``keep_end``) its
    end, as for the tail of a log."""
    limit = min(limit, MAX_REASON_BYTES)
    words = "".join(" " if c.isspace() or unicodedata.category(c) in _NOT_PRINTABLE else c for c in text)
    flat = " ".join(words.split())
    data = flat.encode()
    if len(data) <= limit:
        return flat
    room = limit - len(_ELLIPSIS.encode())
    if keep_end:
        return _ELLIPSIS + data[len(data) - room :].decode(errors="ignore")
    return data[:room].decode(errors="ignore") + _ELLIPSIS


def _duration(body: Mapping[str, Any], key: str) -> timedelta:
    value = body.get(key)
    return parse_duration(value) if isinstance(value, str) and value else timedelta(0)


def _timestamp(body: Mapping[str, Any], key: str) -> datetime | None:
    value = body.get(key)
    return parse_timestamp(value) if isinstance(value, str) and value else None


def _payload(body: Mapping[str, Any], key: str) -> bytes:
    value = body.get(key)
    if not value:
        return b""
    text = str(value)
    return base64.b64decode(text + "=" * (-len(text) % 4))


def _int(body: Mapping[str, Any], key: str) -> int:
    return int(body.get(key) or 0)


def _number(body: Mapping[str, Any], key: str) -> float:
    return float(body.get(key) or 0)


def _str(body: Mapping[str, Any], key: str) -> str:
    return str(body.get(key) or "")


def _priority(body: Mapping[str, Any]) -> int:
    # A server from before priorities sends none: every item it has is of the default priority.
    value = body.get("priority")
    return DEFAULT_PRIORITY if value is None else int(value)


# -- queues -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueInfo:
    """A queue's settings as ``queues.info`` returns them."""

    queue_name: str
    lease_timeout: timedelta
    expire_timeout: timedelta
    max_attempts: int = 0
    dead_queue: str = ""
    reference: str = ""
    requested_partitions: int = 1
    #: ``"fifo"``, or ``"fair"``: leases go round-robin across the groups with ready items.
    delivery: str = "fifo"
    #: In a fair queue, the most valid leases one group may hold (0: no limit).
    max_leased_per_group: int = 0
    #: Leases a second of the whole queue (0: no limit).
    rate_limit: float = 0.0
    #: In a fair queue, leases a second of each group (0: no limit).
    rate_limit_per_group: float = 0.0
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> QueueInfo:
        return cls(
            queue_name=_str(body, "queue_name"),
            lease_timeout=_duration(body, "lease_timeout"),
            expire_timeout=_duration(body, "expire_timeout"),
            max_attempts=_int(body, "max_attempts"),
            dead_queue=_str(body, "dead_queue"),
            reference=_str(body, "reference"),
            requested_partitions=_int(body, "requested_partitions") or 1,
            # A server from before fair delivery sends neither: its queues are all FIFO.
            delivery=_str(body, "delivery") or "fifo",
            max_leased_per_group=_int(body, "max_leased_per_group"),
            # A server from before rate limits sends neither: no limit.
            rate_limit=_number(body, "rate_limit"),
            rate_limit_per_group=_number(body, "rate_limit_per_group"),
            created_at=_timestamp(body, "created_at"),
            updated_at=_timestamp(body, "updated_at"),
        )

    def to_wire(self) -> dict[str, Any]:
        """The JSON shape (durations in Go form, timestamps RFC 3339), for output and ``queues.update``."""
        body: dict[str, Any] = {
            "queue_name": self.queue_name,
            "lease_timeout": format_duration(self.lease_timeout),
            "expire_timeout": format_duration(self.expire_timeout),
            "max_attempts": self.max_attempts,
            "dead_queue": self.dead_queue,
            "reference": self.reference,
            "requested_partitions": self.requested_partitions,
            "delivery": self.delivery,
            "max_leased_per_group": self.max_leased_per_group,
            "rate_limit": self.rate_limit,
            "rate_limit_per_group": self.rate_limit_per_group,
        }
        if self.created_at is not None:
            body["created_at"] = format_timestamp(self.created_at)
        if self.updated_at is not None:
            body["updated_at"] = format_timestamp(self.updated_at)
        return body


# -- produce ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class NewItem:
    """An item to produce. ``payload`` as ``str`` is sent as ``utf8``, as ``bytes`` as base64 ``bytes``.

    ``enqueue_at`` in the future makes the item scheduled: invisible to lease until then; so does
    ``enqueue_in``, a delay counted from the server's clock (a ``timedelta``, seconds or ``"30s"``).
    ``enqueue_at`` takes a delay too (``timedelta(minutes=5)`` or ``"5m"``), sent as ``enqueue_in``.
    ``priority`` is 0-9, lower leases first (5 by default); anything else raises ``ValueError``.
    ``group`` names a tenant, customer or endpoint the item belongs to (``check_group``).
    """

    payload: bytes | str = b""
    reference: str = ""
    encoding: str = ""
    kind: str = ""
    enqueue_at: Timestamp | timedelta | None = None
    enqueue_in: Duration | None = None
    priority: int = DEFAULT_PRIORITY
    group: str = ""

    def __post_init__(self) -> None:
        check_priority(self.priority)
        check_group(self.group)
        when_to_wire({}, self.enqueue_at, self.enqueue_in, "enqueue_at", "enqueue_in")

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        # Always one of the two, even when empty: the server refuses an item with no payload key.
        if isinstance(self.payload, str):
            body["utf8"] = self.payload
        else:
            body["bytes"] = base64.b64encode(self.payload).decode("ascii")
        # Left out when empty, as the group is: a server from before groups refuses unknown keys.
        for key in ("reference", "encoding", "kind", "group"):
            if value := getattr(self, key):
                body[key] = value
        when_to_wire(body, self.enqueue_at, self.enqueue_in, "enqueue_at", "enqueue_in")
        # Left out at the default: the body is the one a server from before priorities accepts.
        if self.priority != DEFAULT_PRIORITY:
            body["priority"] = self.priority
        return body


def as_new_item(value: NewItem | bytes | str) -> NewItem:
    """Accept a bare payload wherever an item is expected."""
    return value if isinstance(value, NewItem) else NewItem(payload=value)


# -- lease, complete, retry, renew --------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Produced:
    """What ``queue.produce`` said beyond success."""

    #: With an idempotency key: ``True`` when an earlier request with the key stored the items and
    #: this one stored nothing, ``False`` when this one stored them; ``None`` without a key (or from
    #: a server that does not say).
    replayed: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LeasedItem:
    """One leased item. ``id`` is valid for this lease only; ``attempts`` counts this lease too."""

    id: str
    attempts: int
    lease_deadline: datetime | None
    payload: bytes
    reference: str = ""
    encoding: str = ""
    kind: str = ""
    #: The partition it was leased from: complete / retry / renew must name it.
    partition: int = 0
    #: 0-9, lower leases first.
    priority: int = DEFAULT_PRIORITY
    #: As produced; ``""``: none.
    group: str = ""
    #: Why the item last failed (a consumer's ``retry`` reason, or the server's own, such as
    #: ``"lease ran out"``) and how many failures it had; ``""`` and 0 when it never failed.
    last_reason: str = ""
    failures: int = 0

    @classmethod
    def from_wire(cls, body: Mapping[str, Any], *, partition: int) -> LeasedItem:
        return cls(
            id=_str(body, "id"),
            attempts=_int(body, "attempts"),
            lease_deadline=_timestamp(body, "lease_deadline"),
            payload=_payload(body, "bytes"),
            reference=_str(body, "reference"),
            encoding=_str(body, "encoding"),
            kind=_str(body, "kind"),
            partition=partition,
            priority=_priority(body),
            group=_str(body, "group"),
            last_reason=_str(body, "last_reason"),
            failures=_int(body, "failures"),
        )

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "attempts": self.attempts,
            "priority": self.priority,
            "group": self.group,
            "lease_deadline": format_timestamp(self.lease_deadline) if self.lease_deadline else None,
            "reference": self.reference,
            "encoding": self.encoding,
            "kind": self.kind,
            "bytes": base64.b64encode(self.payload).decode("ascii"),
        }
        # As the server sends them: only for an item that failed before.
        if self.last_reason:
            body["last_reason"] = self.last_reason
        if self.failures:
            body["failures"] = self.failures
        return body


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """A ``queue.lease`` reply: items of one partition, oldest first; empty when nothing was leasable."""

    queue_name: str
    partition: int = 0
    items: tuple[LeasedItem, ...] = ()
    #: Set when the queue's rate limit has no lease left: when it has one again (a lease before
    #: then gets nothing). Also on an empty ``Lease`` that the rate limit held back.
    next_lease_at: datetime | None = None

    def __len__(self) -> int:
        return len(self.items)

    @property
    def ids(self) -> list[str]:
        return [item.id for item in self.items]

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> Lease:
        partition = _int(body, "partition")
        return cls(
            queue_name=_str(body, "queue_name"),
            partition=partition,
            items=tuple(LeasedItem.from_wire(i, partition=partition) for i in body.get("items") or ()),
            next_lease_at=_timestamp(body, "next_lease_at"),
        )

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "queue_name": self.queue_name,
            "partition": self.partition,
            "items": [item.to_wire() for item in self.items],
        }
        if self.next_lease_at is not None:
            body["next_lease_at"] = format_timestamp(self.next_lease_at)
        return body


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryItem:
    """One item of ``queue.retry``: back now, at ``retry_at`` (scheduled), after ``retry_in`` (a delay
    from the server's clock: a ``timedelta``, seconds or ``"30s"``), or ``dead`` (dead letter).
    ``retry_at`` takes a delay too (``timedelta(seconds=30)`` or ``"30s"``), sent as ``retry_in``.

    ``priority`` (0-9) puts it back with that priority instead of its own; ``None`` keeps its own.
    ``reason`` says why (``check_reason``: at most 1,024 bytes, one line; ``reason_text`` makes one
    of any text): the server keeps it as the item's ``last_reason`` and counts a failure; ``""``
    records nothing.
    """

    id: str
    retry_at: Timestamp | timedelta | None = None
    retry_in: Duration | None = None
    dead: bool = False
    priority: int | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if self.priority is not None:
            check_priority(self.priority)
        check_reason(self.reason)
        when_to_wire({}, self.retry_at, self.retry_in, "retry_at", "retry_in")

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id}
        when_to_wire(body, self.retry_at, self.retry_in, "retry_at", "retry_in")
        if self.dead:
            body["dead"] = True
        if self.priority is not None:
            body["priority"] = self.priority
        # Left out when empty: a server from before reasons refuses unknown keys.
        if self.reason:
            body["reason"] = self.reason
        return body


@dataclass(frozen=True, slots=True, kw_only=True)
class RenewedItem:
    id: str
    lease_deadline: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Renewal:
    """A ``queue.renew`` reply: the renewed ids and their new deadlines."""

    queue_name: str
    partition: int
    items: tuple[RenewedItem, ...] = ()

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> Renewal:
        return cls(
            queue_name=_str(body, "queue_name"),
            partition=_int(body, "partition"),
            items=tuple(
                RenewedItem(id=_str(i, "id"), lease_deadline=_timestamp(i, "lease_deadline"))
                for i in body.get("items") or ()
            ),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Redriven:
    """A ``queue.redrive`` reply: how many dead letters this call moved, how many are still to
    move (call again until 0), and how many stay because their source queue no longer exists."""

    moved: int
    remaining: int
    stranded: int

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> Redriven:
        return cls(
            moved=_int(body, "moved"), remaining=_int(body, "remaining"), stranded=_int(body, "stranded")
        )


# -- stats --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionStats:
    partition: int
    #: Items that are not scheduled, leased or not.
    total: int = 0
    total_leased: int = 0
    scheduled: int = 0
    average_age: timedelta = timedelta(0)
    average_leased_age: timedelta = timedelta(0)
    #: Items produced (or imported) and completed since the partition was created (0 from a
    #: server that does not count them): sample twice for rates.
    produced: int = 0
    completed: int = 0

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> PartitionStats:
        return cls(
            partition=_int(body, "partition"),
            total=_int(body, "total"),
            total_leased=_int(body, "total_leased"),
            scheduled=_int(body, "scheduled"),
            average_age=_duration(body, "average_age"),
            average_leased_age=_duration(body, "average_leased_age"),
            produced=_int(body, "produced"),
            completed=_int(body, "completed"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueStats:
    """``queue.stats``, flattened: Querator's one logical queue is an implementation detail."""

    queue_name: str
    partitions: tuple[PartitionStats, ...] = ()

    @property
    def total(self) -> int:
        return sum(p.total for p in self.partitions)

    @property
    def total_leased(self) -> int:
        return sum(p.total_leased for p in self.partitions)

    @property
    def scheduled(self) -> int:
        return sum(p.scheduled for p in self.partitions)

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> QueueStats:
        logical = body.get("logicalQueues") or body.get("logical_queues") or ()
        partitions = [PartitionStats.from_wire(p) for queue in logical for p in queue.get("partitions") or ()]
        return cls(
            queue_name=_str(body, "queue_name"),
            partitions=tuple(sorted(partitions, key=lambda p: p.partition)),
        )


# -- storage inspection -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredItem:
    """An item as stored (``storage/items.list``); can be passed back to ``import_items``."""

    id: str
    payload: bytes
    source_id: str = ""
    is_leased: bool = False
    lease_deadline: datetime | None = None
    expire_deadline: datetime | None = None
    created_at: datetime | None = None
    enqueue_at: datetime | None = None
    attempts: int = 0
    reference: str = ""
    encoding: str = ""
    kind: str = ""
    #: 0-9, lower leases first.
    priority: int = DEFAULT_PRIORITY
    #: As produced; ``""``: none.
    group: str = ""
    #: In a dead-letter queue: the queue the item came from.
    source_queue: str = ""
    #: Why the item last failed and how many failures it had (``""`` and 0: it never failed).
    last_reason: str = ""
    failures: int = 0

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> StoredItem:
        return cls(
            id=_str(body, "id"),
            payload=_payload(body, "payload"),
            source_id=_str(body, "source_id"),
            source_queue=_str(body, "source_queue"),
            last_reason=_str(body, "last_reason"),
            failures=_int(body, "failures"),
            is_leased=bool(body.get("is_leased")),
            lease_deadline=_timestamp(body, "lease_deadline"),
            expire_deadline=_timestamp(body, "expire_deadline"),
            created_at=_timestamp(body, "created_at"),
            enqueue_at=_timestamp(body, "enqueue_at"),
            attempts=_int(body, "attempts"),
            reference=_str(body, "reference"),
            encoding=_str(body, "encoding"),
            kind=_str(body, "kind"),
            priority=_priority(body),
            group=_str(body, "group"),
        )

    def to_wire(self) -> dict[str, Any]:
        """The listing's JSON shape; ``storage/items.import`` accepts it as is."""
        body: dict[str, Any] = {
            "id": self.id,
            "source_id": self.source_id,
            "is_leased": self.is_leased,
            "attempts": self.attempts,
            "priority": self.priority,
            "group": self.group,
            "reference": self.reference,
            "encoding": self.encoding,
            "kind": self.kind,
            "payload": base64.b64encode(self.payload).decode("ascii"),
        }
        for key in ("lease_deadline", "expire_deadline", "created_at", "enqueue_at"):
            value = getattr(self, key)
            if value is not None:
                body[key] = format_timestamp(value)
        # Left out when empty, as the server does: a server from before them refuses the keys.
        for key in ("source_queue", "last_reason", "failures"):
            if value := getattr(self, key):
                body[key] = value
        return body


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportedItems:
    """``storage/items.import`` reply: the new ids, in request order (skipped items are left out)."""

    ids: tuple[str, ...] = field(default_factory=tuple)
