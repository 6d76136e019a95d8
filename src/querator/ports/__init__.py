"""Ports: what the service needs from the outside world, as structural protocols.

The DynamoDB adapters in ``querator.storage.dynamodb`` implement them; the contract suite in
``tests/contract`` proves the behaviour against every store the tests can reach.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from querator.domain.priority import BANDS, band_of, band_start, priority_of

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence
    from datetime import datetime

    from querator.domain.model import Item, ItemState, QueueInfo
    from querator.domain.ratelimit import Grant, RateLimit


class Clock(Protocol):
    def now(self) -> datetime: ...

    def sleep(self, seconds: float) -> None: ...


class Guard(enum.Enum):
    """The state an item must still be in for a conditional write to apply.

    Each guard closes a race between two actors on the same item; the storage adapter turns it into
    a condition expression, so the check and the write are one atomic step.
    """

    #: The item was never leased under this id: two consumers racing for it cannot both win.
    NEVER_LEASED = "never_leased"
    #: The caller's lease is still valid: a consumer whose lease ran out can no longer act.
    LEASE_VALID = "lease_valid"
    #: The lease ran out: the item may be requeued or dead-lettered, once.
    LEASE_EXPIRED = "lease_expired"
    #: Not held by a valid lease (never leased, or the lease ran out): a valid lease is never taken.
    NOT_VALIDLY_LEASED = "not_validly_leased"
    #: Any state; the item may also be gone already (storage delete, destructive clear).
    ANY = "any"


Applied = TypeVar("Applied")


class ClaimInterruptedError(Exception):
    """A ``claim`` that failed after some of its ids were claimed: ``claimed`` are leased to the
    caller, who must give them back (or return them); the failure is the ``__cause__``.

    A store whose claim is one transaction (memory, SQLite) never raises it: it claims all or none.
    The DynamoDB store claims concurrently, so one write can fail while others applied.
    """

    def __init__(self, claimed: Sequence[Item]) -> None:
        super().__init__(f"claim failed after {len(claimed)} item(s) were claimed")
        self.claimed = list(claimed)


@dataclass(frozen=True, slots=True)
class BatchResult(Generic[Applied]):
    """What a batch write did, one shape for every batch method of the port: ``applied`` (ids, or the
    items written, in the order asked) and ``rejected`` (the ids whose guard or condition refused
    them). An id is in exactly one of the two."""

    applied: list[Applied] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class Page:
    """One page of a key-range read, oldest first.

    ``read_to`` is where the read stopped: every item id below it (and at or above the read's start)
    was evaluated, whether the filter returned it or not; ``evaluated`` counts them. ``done`` is
    True when the range ended.
    """

    items: list[ItemState] = field(default_factory=list)
    read_to: str = ""
    done: bool = True
    evaluated: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupLedger:
    """The leases a capped fair queue handed out in one group (``max_leased_per_group``): each
    id with its lease deadline as claimed, and a version every claim moves on. An entry may outlive
    its lease (a complete whose removal was lost) or undercount it (a renewal): callers check
    entries whose deadline passed against the items."""

    version: int = 0
    leases: Mapping[str, datetime] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionHead:
    """What a partition's head row holds (docs/adr/0050-engine-v2.md); zeros for a new partition.

    ``cursor``: every item id below it is leased, being settled, or gone, so a lease reads from it.
    ``sweep``: the straggler sweep has read every id below it. ``schedule_mark``: scheduled items
    with ids below it are no longer counted as scheduled. Counters are kept by the store in the same
    calls that write items; sums are of ``created_at`` in whole seconds since the epoch.
    """

    cursor: str = ""
    sweep: str = ""
    schedule_mark: str = ""
    #: The bands (``querator.domain.priority``) other than priority 5's that are in use, and when each
    #: was last registered (before items of it were written): a lease reads only these and priority
    #: 5's; the reaper drops one that has been empty and unregistered for ``BAND_IDLE``.
    band_registered: Mapping[str, datetime] = field(default_factory=dict)
    #: Cursors and sweep marks of the bands other than priority 5's (whose are ``cursor``/``sweep``),
    #: by band; each is a key inside its band.
    band_cursors: Mapping[str, str] = field(default_factory=dict)
    band_sweeps: Mapping[str, str] = field(default_factory=dict)
    items: int = 0
    leased: int = 0
    scheduled: int = 0
    created_sum: int = 0
    leased_created_sum: int = 0
    scheduled_created_sum: int = 0
    #: Items produced (or imported) into the partition and items completed in it, ever: cumulative
    #: counts that a recount leaves alone; sampled twice, they give the rates the console shows.
    produced: int = 0
    completed: int = 0
    #: Moves on with every counter update: a recount that saw no change between its start and its
    #: end counted a still picture and may replace the counters.
    version: int = 0
    #: The recount under way (``None``: none), and when the last one finished.
    recount: Recount | None = None
    recounted_at: datetime | None = None

    #: Group lanes (fair delivery, ``querator.domain.priority.lane_of``) were registered in the
    #: partition: leases, the reaper, clear and listings go lane by lane. Never unset.
    has_lanes: bool = False
    #: By band: the lane a fair lease served last (the next one starts after it).
    rings: Mapping[str, str] = field(default_factory=dict)
    #: The group ledgers, where a store keeps them in the head row (the embedded stores; DynamoDB
    #: keeps them in rows of their own): read them with ``ItemStore.group_ledgers``.
    group_ledgers: Mapping[str, GroupLedger] = field(default_factory=dict)

    @property
    def bands(self) -> frozenset[str]:
        """The bands other than priority 5's that are in use (and, where the store keeps them in
        the head row or ``ItemStore.with_lanes`` added them, the group lanes)."""
        return frozenset(self.band_registered)

    def leasable_bands(self) -> list[str]:
        """The bands that may hold items, highest priority first (priority 5's always)."""
        return [b for b in BANDS if b == "" or b in self.bands]

    def leasable_lanes(self) -> list[str]:
        """Every band and group lane that may hold items, in key order: each band, then its group
        lanes. Group lanes appear when the store holds them in the head row (the embedded stores)
        or after ``ItemStore.with_lanes``."""
        lanes = [lane for lane in self.band_registered if lane not in BANDS]
        return sorted(
            self.leasable_bands() + lanes,
            key=lambda lane: (priority_of(lane + "0" * 30), lane != band_of(lane), lane),
        )

    def cursor_in(self, band: str) -> str:
        """Where a lease reads ``band`` from: its cursor, or the band's start."""
        cursor = self.cursor if band == "" else self.band_cursors.get(band, "")
        return max(cursor, band_start(band))

    def sweep_in(self, band: str) -> str:
        """Where the straggler sweep of ``band`` goes on from."""
        sweep = self.sweep if band == "" else self.band_sweeps.get(band, "")
        return max(sweep, band_start(band))


@dataclass(frozen=True, slots=True, kw_only=True)
class Recount:
    """A recount of a partition's items, paged over reaper runs: how far it got and what it found."""

    #: The next id to read.
    position: str = ""
    #: ``PartitionHead.version`` when the recount started.
    version: int = 0
    items: int = 0
    leased: int = 0
    scheduled: int = 0
    created_sum: int = 0
    leased_created_sum: int = 0
    scheduled_created_sum: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Lane:
    """A group lane of a fair queue's partition (``querator.domain.priority.lane_of``)."""

    #: The key prefix: the band, ``g`` and the group's 16 hex digits.
    lane: str
    #: Where a lease reads the lane from: every id below it is leased, being settled, or gone.
    cursor: str
    #: When a write of items into the lane last registered it.
    registered: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRecord:
    """The ids one lease call may have claimed, filed under their lease deadline."""

    key: str
    deadline: datetime
    ids: list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Move:
    """Replace ``item`` (as read by the caller) with ``replacement`` in the target partition."""

    item: Item
    target_queue: str
    target_partition: int
    replacement: Item


@dataclass(frozen=True, slots=True, kw_only=True)
class IdempotencyRecord:
    """What a produce with an idempotency key stored, so a retry can answer without writing again."""

    key: str
    partition: int
    ids: list[str]
    #: False while the first request is still writing (or died while writing).
    done: bool
    started_at: datetime
    #: The queue's ``created_at`` when the record was written; a record of a deleted and re-created
    #: queue of the same name does not count.
    queue_created_at: datetime


class ItemStore(Protocol):
    """Items of every queue, by (queue name, partition). Every method raises on store failure.

    Every method that adds, leases, settles or removes items also keeps the partition's counters
    (``PartitionHead``); a counter write that fails after the items' write is logged, not raised
    (the items' write is what the caller asked for), and the drift it leaves is documented.
    """

    def put_new(self, queue: str, partition: int, items: Sequence[Item], *, now: datetime) -> None:
        """Durably write items under ids nobody else holds (fresh ids). All or raise."""
        ...

    def put_absent(
        self, queue: str, partition: int, items: Sequence[Item], *, now: datetime
    ) -> BatchResult[str]:
        """Write each item unless its id exists (rejected: ids that existed)."""
        ...

    def head(
        self, queue: str, partition: int, *, now: datetime, records: int = 0
    ) -> tuple[PartitionHead, list[LeaseRecord]]:
        """The partition's head row and up to ``records`` lease records due at ``now`` (one read)."""
        ...

    def heads(self, queue: str, partitions: Sequence[int]) -> list[PartitionHead]:
        """The head rows of many partitions, in the order asked."""
        ...

    def scan(
        self,
        queue: str,
        partition: int,
        *,
        start: str,
        end: str,
        limit: int,
        available_at: datetime | None = None,
        never_leased: bool = False,
        scheduled_only: bool = False,
    ) -> Page:
        """Item states with ids in ``[start, end)`` in id (FIFO) order, evaluating at most ``limit``.

        ``available_at``: only items not validly leased then; ``never_leased``: only items never
        leased; ``scheduled_only``: only items produced or retried for a later time.
        """
        ...

    def states(self, queue: str, partition: int, ids: Sequence[str]) -> list[ItemState]:
        """The states of the items that still exist among ``ids`` (any order)."""
        ...

    def list_items(
        self,
        queue: str,
        partition: int,
        *,
        limit: int,
        pivot: str = "",
        lower: str = "",
        upper: str = "",
        max_bytes: int | None = None,
    ) -> list[Item]:
        """Whole items in id order from ``max(pivot, lower)`` (inclusive) to ``upper`` (exclusive),
        stopping before the payloads returned would pass ``max_bytes`` (at least one item)."""
        ...

    def iter_items(self, queue: str, partition: int) -> Iterator[Item]: ...

    def get(self, queue: str, partition: int, item_id: str) -> Item | None: ...

    def get_many(self, queue: str, partition: int, ids: Sequence[str]) -> dict[str, Item]:
        """The items that exist among ``ids``, by id (strongly consistent)."""
        ...

    def record_lease(self, queue: str, partition: int, ids: Sequence[str], *, deadline: datetime) -> str:
        """File a lease record for ``ids`` under ``deadline`` before claiming them; returns its key."""
        ...

    def drop_lease_record(self, queue: str, partition: int, key: str) -> None: ...

    def claim(
        self,
        queue: str,
        partition: int,
        ids: Sequence[str],
        *,
        lease_deadline: datetime,
        now: datetime,
    ) -> BatchResult[Item]:
        """Lease each item that was never leased and has not expired; applied: the items won, in order.

        Claims run concurrently (bounded); counters are not touched: ``note_leased`` does that once
        per lease call. A failure after some ids were claimed raises ``ClaimInterruptedError`` with
        them (its cause is the failure), so the caller knows what it holds.
        """
        ...

    def note_leased(
        self,
        queue: str,
        partition: int,
        items: Sequence[Item],
        *,
        cursor: str | None,
        ring: tuple[str, str] | None = None,
    ) -> None:
        """Count ``items`` as leased and, when given, move the lease cursor of ``cursor``'s lane
        (``querator.domain.priority.lane_of``: a band, or a group lane) to ``cursor``, and set the
        ring of band ``ring[0]`` to lane ``ring[1]`` (the lane a fair lease served last)."""
        ...

    def lanes(self, queue: str, partition: int, band: str, *, after: str, limit: int) -> list[Lane]:
        """Up to ``limit`` group lanes of ``band`` registered in the partition, in key order, from
        the first after ``after`` (a lane; ``""``: from the band's first)."""
        ...

    def with_lanes(self, queue: str, partition: int, head: PartitionHead) -> PartitionHead:
        """``head`` with every group lane's registration, cursor and sweep mark in its band maps
        (O(lanes); for the reaper, clear and listings, not for leases)."""
        ...

    def group_ledgers(self, queue: str, partition: int, groups: Sequence[str]) -> dict[str, GroupLedger]:
        """The ledgers of ``groups`` (group lanes without their band: ``g`` + 16 hex digits)."""
        ...

    def claim_in_group(
        self,
        queue: str,
        partition: int,
        item_id: str,
        *,
        version: int,
        forget: Sequence[str],
        lease_deadline: datetime,
        now: datetime,
    ) -> Item | None:
        """Claim one item as ``claim`` does and enter it in its group's ledger, in one atomic step
        that holds only while the ledger is still at ``version`` (moving it on, and dropping the
        ``forget`` ids from it). ``None``: the item was taken, or the ledger moved (read it again)."""
        ...

    def forget_leases(self, queue: str, partition: int, ids: Sequence[str]) -> None:
        """Drop ids of group lanes from their ledgers (their leases ended); best-effort: a lost
        removal holds a slot until the lease's deadline."""
        ...

    def renew(
        self,
        queue: str,
        partition: int,
        ids: Sequence[str],
        *,
        lease_deadline: datetime,
        now: datetime,
    ) -> BatchResult[str]:
        """Move valid leases to ``lease_deadline`` (rejected: ids whose lease was not valid)."""
        ...

    def set_next_priority(
        self, queue: str, partition: int, ids: Sequence[str], *, priority: int, now: datetime
    ) -> BatchResult[str]:
        """Give validly leased items the priority they go back with (rejected: ids not validly
        leased); the lease, the id and the counters do not change."""
        ...

    def register_bands(self, queue: str, partition: int, ids: Iterable[str], *, now: datetime) -> None:
        """Name the bands of ``ids`` (other than priority 5's) in the partition's head row, and
        their group lanes (fair queues), as registered at ``now``, before items of those bands are
        written there (a lease reads only the bands and lanes named). Raises when it cannot; no
        write for priority 5 ids without a lane."""
        ...

    def drop_band(self, queue: str, partition: int, band: str, *, registered_before: datetime) -> bool:
        """Stop naming ``band`` (or a group lane) if it was last registered before
        ``registered_before``; whether it did. The caller checks the band is empty before and
        after (a write registered earlier may still land in between)."""
        ...

    def delete(
        self,
        queue: str,
        partition: int,
        ids: Sequence[str],
        *,
        guard: Guard,
        now: datetime,
        completed: bool = False,
    ) -> BatchResult[str]:
        """Delete items still in the guarded state (rejected: ids that failed the guard; with
        ``Guard.ANY`` an item already gone counts as applied). ``completed``: the deletion is
        ``queue.complete``'s, counted in the partition's ``completed``."""
        ...

    def move(
        self, queue: str, partition: int, moves: Sequence[Move], *, guard: Guard, now: datetime
    ) -> BatchResult[str]:
        """Atomically delete each item in the guarded state and write its replacement (applied and
        rejected: the moved items' ids)."""
        ...

    def purge_page(self, queue: str, partition: int, *, limit: int) -> int:
        """Delete up to ``limit`` rows of a partition (items and the rest); return how many (0: empty)."""
        ...

    def pass_schedule(
        self,
        queue: str,
        partition: int,
        *,
        old_mark: str,
        new_mark: str,
        now: datetime,
        bands: Sequence[str] = ("",),
    ) -> int:
        """Stop counting as scheduled the items between the marks (times, ``visible_bound``) in each
        of ``bands``; return how many came due."""
        ...

    def set_sweep(self, queue: str, partition: int, mark: str) -> None:
        """Move the sweep mark of ``mark``'s lane (a band, or a group lane) to ``mark``."""
        ...

    def save_recount(self, queue: str, partition: int, recount: Recount | None) -> None:
        """Keep a recount's progress in the head row (``None``: drop it, to start over)."""
        ...

    def finish_recount(self, queue: str, partition: int, recount: Recount, *, now: datetime) -> bool:
        """Replace the counters with the recount's if the head row's version is still the one the
        recount started at; either way the recount ends. Returns whether the counters changed."""
        ...

    def source_ids(self, queue: str, partition: int) -> set[str]: ...

    def take_tokens(self, queue: str, bucket: str, *, wanted: int, limit: RateLimit, now: datetime) -> Grant:
        """Take up to ``wanted`` tokens from a lease rate-limit bucket of ``queue`` (``bucket``:
        ``""`` the queue's, ``g`` + 16 hex digits a group's), refilled by ``now``, in one atomic
        step across every process (``querator.domain.ratelimit.take``). A bucket never taken from
        is full; one is stored only once taken from, and a store may forget one that is full again."""
        ...

    def return_tokens(self, queue: str, bucket: str, *, count: int, limit: RateLimit) -> None:
        """Give back ``count`` tokens taken and not used (best-effort: a lost return only delays
        later leases, never lets more through)."""
        ...

    def begin_idempotent(
        self, queue: str, record: IdempotencyRecord, *, stale_before: datetime, expires_at: datetime
    ) -> tuple[bool, IdempotencyRecord | None]:
        """Store ``record`` unless a live record with its key exists.

        Returns ``(stored, previous)``: ``stored`` is False when a live record won, which is then
        ``previous``; when True, ``previous`` is the dead record it replaced, if any.
        """
        ...

    def finish_idempotent(
        self, queue: str, key: str, *, partition: int, ids: Sequence[str], done: bool = True
    ) -> None:
        """Mark the record done with the receipt that retries of the request get; ``done=False``:
        only record ``ids`` and leave it in progress (engine v3 notes the positions it took before
        it writes them, so a retry after a crash writes those again)."""
        ...


class QueueCatalog(Protocol):
    """The queues and the reaper's bookmark."""

    def create(self, info: QueueInfo) -> None:
        """Raises ``QueueAlreadyExistsError``."""
        ...

    def get(self, name: str) -> QueueInfo:
        """Raises ``QueueNotFoundError``."""
        ...

    def list(self, *, pivot: str, limit: int) -> list[QueueInfo]: ...

    def iterate(self) -> Iterator[QueueInfo]: ...

    def replace(self, info: QueueInfo, *, expected_updated_at: datetime) -> None:
        """Write ``info`` if nobody changed the queue since ``expected_updated_at``."""
        ...

    def mark_deleting(self, name: str) -> QueueInfo: ...

    def remove(self, name: str) -> None: ...

    def load_bookmark(self) -> str | None: ...

    def save_bookmark(self, bookmark: str | None) -> None: ...

    def stream_key(self, candidate: str | None) -> str | None:
        """The key stream tickets are signed with: the stored one, else ``candidate`` once stored by
        a conditional write, so first uses that race agree on one key. ``candidate`` ``None``: only
        read (``None`` if no ticket was ever issued), for the stream's checks, which may not write."""
        ...
