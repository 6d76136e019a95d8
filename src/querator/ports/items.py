"""Ports, the items role: writing, reading and removing a partition's items, and its head row.

``PartitionHead`` is what every role reads and moves (cursors, marks, counters, bands); the items
role reads it (``head``, ``heads``). ``Guard``, ``BatchResult`` and ``Move`` are shared by the
roles' guarded batch writes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from querator.domain.priority import BANDS, band_of, band_start, priority_of

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from datetime import datetime

    from querator.domain.model import Item, ItemState
    from querator.ports.lanes import GroupLedger
    from querator.ports.leasing import LeaseRecord
    from querator.ports.upkeep import Recount


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
class Move:
    """Replace ``item`` (as read by the caller) with ``replacement`` in the target partition."""

    item: Item
    target_queue: str
    target_partition: int
    replacement: Item


class ItemsPort(Protocol):
    """Items of every queue, by (queue name, partition): written, read, removed and moved."""

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
