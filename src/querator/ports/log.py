"""Ports: engine v3's claim log (docs/adr/0100-engine-v3-candidates.md).

A *log* is one lane of one partition (``LogKey``: a band, or a band and a group in a fair queue).
Its items sit at positions (``querator.domain.positions``) handed out once, in produce order, by a
sequencer in the log's *head*; items produced together are stored together in write-once *packed
rows*. A lease claims a *run* of positions after the head's *cursor* with one conditional write that
also files a *lease record* (a token, the positions it holds, their deadline); completing, retrying
and renewing write the record, not the items, and finished rows go by TTL. So a delivered item
costs a share of three small head writes and of the bytes of its row, not three writes of its own.

What the service sees, and every store keeps (the contract suite in ``tests/contract`` holds them to
it on every store):

- **Order.** A log hands out positions oldest first, to any number of consumers: concurrent claims
  get disjoint runs, each in position order, and a claim never fails because another one won (a
  fetch-and-add on the cursor, not a race per item).
- **Fencing.** An id is valid for one lease: a position is written once, an item that goes back to
  the queue is appended at a new position, and a settled position is done for good. A holder whose
  lease ran out, or whose position was settled, gets the id back as rejected.
- **Nothing held that was not returned.** A claim returns every position it took, either as an item
  or as a *hole* (see ``collect``): the run is the caller's to settle, or it expires.
- **A dead writer** (a produce that took positions and stopped before writing them) leaves a hole.
  A claim that meets one waits ``HOLE_TIMEOUT_S`` for it (``collect``), then fills it: the position
  is done, and a writer that was only late finds it taken and appends its items at new positions,
  so its call still succeeds and nothing lands behind the cursor.
- **Atomic moves.** Whatever settles a position and appends an item elsewhere (a retry, an expired
  lease going to the tail, a dead letter) does both or neither.
- **Costs** (DynamoDB): ``append`` one sequencer write plus the bytes of its rows; ``claim`` one head
  write plus reading the run's rows; ``settle``/``renew`` one write per record touched (a
  transaction when items move); reads O(what the call returns), never O(what the log holds).

Every method raises on a store error; a method that raised may have applied part of its work only
where its docstring says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from querator.ports import BatchResult

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from querator.domain.model import Item
    from querator.ports import Guard


@dataclass(frozen=True, slots=True, order=True)
class LogKey:
    """One log: ``lane`` is ``querator.domain.priority.lane_of`` of its items' ids (``""``: priority
    5 without groups)."""

    queue: str
    partition: int
    lane: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class LogHead:
    """What a log's head says; zeros for a log never written. One strong read of one small row.

    ``waiting`` positions are waiting: ``tail - cursor`` but for ``skipped`` (deleted while
    waiting), some of them holes being written. ``next_expiry`` and ``next_due`` are lower bounds:
    no record expires and no scheduled item is due before them (``None``: none at all), so a lease
    reads what is due only when they have passed.
    """

    #: The next position the sequencer hands out.
    tail: int = 0
    #: Every position below it is claimed (or was filled or deleted while waiting).
    cursor: int = 0
    #: Positions at or above the cursor that claims will skip (deleted, or moved, while waiting).
    skipped: int = 0
    #: Lease records in flight, and the positions they hold that are not settled yet.
    leases: int = 0
    leased: int = 0
    #: Items in the log's schedule (``enqueue_at``/``retry_at`` after the write).
    scheduled: int = 0
    next_expiry: datetime | None = None
    next_due: datetime | None = None
    #: The largest ``Item.reply_size`` ever appended: a lease sizes its claim under the reply cap with it.
    largest: int = 0
    #: Items written by ``append`` and ``write_taken`` (produce, import), and positions settled by
    #: ``settle(..., completed=True)``, ever: cumulative counts for the console's rates.
    produced: int = 0
    completed: int = 0

    @property
    def waiting(self) -> int:
        return self.tail - self.cursor - self.skipped


@dataclass(frozen=True, slots=True, kw_only=True)
class LogAges:
    """Sums of ``Item.created_at`` (whole seconds since the epoch) of a log's items, for the ages
    ``queue.stats`` reports: of the waiting ones, and of the leased ones not settled yet. Scheduled
    items count in neither. With ``LogHead.waiting`` and ``LogHead.leased`` they give the average
    ages to the second."""

    waiting_created: int = 0
    leased_created: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """A run of positions one ``claim`` took, filed as one lease record under ``token``.

    ``items`` are the positions written when the claim read them, in position order, with
    ``lease_deadline`` set and ``attempts`` counting this lease. ``holes`` are the ids of positions
    taken by a writer that has not written them yet: ``collect`` them.
    """

    token: str
    deadline: datetime
    items: list[Item] = field(default_factory=list)
    holes: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRun:
    """A lease record as ``expired`` finds it: its undone items (as ``claim`` returned them)."""

    token: str
    deadline: datetime
    items: list[Item] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class Settlement:
    """What happens to one leased position: ``to is None``: done (completed, or dropped); else
    ``item`` is appended to ``to`` (its tail, or its schedule when ``item.enqueue_at`` is later than
    the call's ``now``) in the same atomic step that marks the position done. ``item.id`` and
    ``item.lease_deadline`` are ignored: the target assigns an id, and the item waits unleased."""

    id: str
    to: LogKey | None = None
    item: Item | None = None


@dataclass(frozen=True, slots=True)
class Settled(BatchResult[str]):
    """What ``settle`` did: the ids applied and rejected, as every batch write says, and ``moved``:
    each applied id whose settlement moved its item (``to`` and ``item`` given), with the id the
    item got in ``to`` (a position there, or a scheduled id when it went to the schedule). A move's
    new id is the target's to assign, so only the store can say it: ``queue.reprioritize`` replies
    with it."""

    moved: dict[str, str] = field(default_factory=dict)


class ClaimReadError(Exception):
    """A claim that took its run (the cursor moved, the record is filed) and then failed before it
    returned the run's items (reading its rows, say): ``ids`` are the run's positions, held by
    ``token``'s record. The caller gives them back (``get``, then ``settle`` to the tail) or lets the
    record expire; ``cause`` is the store's error, which the caller reports.

    A store whose claim is one transaction (memory, SQLite) never raises it: it claims all or none.
    """

    def __init__(self, token: str, ids: Sequence[str], cause: BaseException) -> None:
        super().__init__(f"claim {token} took {len(ids)} position(s) and failed before returning them")
        self.token = token
        self.ids = list(ids)
        self.cause = cause


class ClaimLog(Protocol):
    """Engine v3's storage of items: one log per ``LogKey``."""

    def append(self, key: LogKey, items: Sequence[Item], *, now: datetime) -> list[Item]:
        """Store ``items`` at the tail, in order, and return them as stored, ids assigned (their
        ``id`` and ``lease_deadline`` are ignored). An item whose ``enqueue_at`` is later than
        ``now`` goes to the log's schedule instead, moved to the tail by ``promote`` when due: under
        its own ``id`` when that is a scheduled id of this log's lane due at its ``enqueue_at``
        (``querator.domain.positions.scheduled_id``: the service mints them, so items due at the
        same time keep their produce order), else under a new one.

        The items of one call are packed into as few rows as the store's row size allows. One
        sequencer write takes their positions, then the rows are written once each, in order; a row
        whose positions a lease filled meanwhile (this writer was taken for dead) is written at new
        positions, with every row after it. On an error some leading rows may be stored: their
        items will be delivered (a produce retried with its idempotency key does not write twice).
        """
        ...

    def take_positions(self, key: LogKey, count: int, *, now: datetime, created: int = 0) -> list[str]:
        """The first half of ``append``: take ``count`` positions at the tail with one sequencer
        write and return their ids; nothing is written at them yet (they are holes until
        ``write_taken``). An idempotent produce records these ids before it writes, so a retry after
        a crash writes the same positions instead of new ones. ``created``: the sum of the
        ``created_at`` seconds of the items to be written there (``LogAges``; a store that counts
        waiting items' ages from the take, as DynamoDB's does, needs it then)."""
        ...

    def write_taken(
        self, key: LogKey, ids: Sequence[str], items: Sequence[Item], *, now: datetime
    ) -> list[Item]:
        """The second half of ``append``: write ``items`` (one per id, in order, packed as
        ``append`` packs them) at the positions ``ids`` that ``take_positions`` returned, each row
        written once. A row whose position a lease filled meanwhile (this writer was taken for dead)
        is written at new positions at the tail, with every row after it; a row already written
        there by an earlier try of the same write is left as it is. Returns the items as stored."""
        ...

    def head(self, key: LogKey) -> LogHead:
        """The log's head (one strong read)."""
        ...

    def ages(self, key: LogKey) -> LogAges:
        """What the log's waiting and leased items' ages sum to (``queue.stats``; not on the hot
        path). Exact, but for one case a store may document: a position taken by a writer that died
        before writing it may count its items as waiting until the log is next empty."""
        ...

    def claim(
        self,
        key: LogKey,
        *,
        count: int,
        deadline: datetime,
        now: datetime,
        max_leased: int | None = None,
    ) -> Claim:
        """Take up to ``count`` positions after the cursor as one lease valid until ``deadline``.

        Fewer when fewer are waiting; none (an empty ``Claim``, ``token == ""``) when none are.
        ``max_leased``: take only as many as keep the log's unsettled leased positions
        (``LogHead.leased``) at or below it, checked in the claim's own write (a group lane's
        ``max_leased_per_group``): none when it is reached. Concurrent claims take disjoint runs and
        never fail because another one won. Positions deleted while waiting or filled are skipped
        (they count against ``count``: a claim stays O(count)). On an error after the cursor moved
        it raises ``ClaimReadError`` naming the run, so the caller can give it back at once (else
        the record expires like any lease, and its items go back to the tail then).
        """
        ...

    def collect(self, key: LogKey, token: str, *, now: datetime) -> Claim:
        """Read the holes of ``token``'s record again: the ones now written come back as items; a
        hole whose claim is ``HOLE_TIMEOUT_S`` old or more is filled (done, never delivered). Returns
        the claim with only what this call found, and the holes still open."""
        ...

    def promote(self, key: LogKey, *, now: datetime, limit: int) -> int:
        """Move up to ``limit`` scheduled items due at ``now`` to the tail, oldest due first, each
        move atomic (under a new id). Returns how many moved."""
        ...

    def expired(self, key: LogKey, *, now: datetime, limit: int) -> list[LeaseRun]:
        """Up to ``limit`` lease records whose deadline passed, oldest deadline first, with their
        undone items: a key range of what is due, never a read of valid leases. The caller settles
        them (to the tail, a dead-letter queue, or dropped) with ``Guard.LEASE_EXPIRED``; a hole of
        such a record is filled on the way (its writer is long dead)."""
        ...

    def settle(
        self,
        key: LogKey,
        settlements: Sequence[Settlement],
        *,
        guard: Guard,
        now: datetime,
        completed: bool = False,
    ) -> Settled:
        """Settle leased positions: each id must be an unsettled position of a lease record that
        ``guard`` admits (``LEASE_VALID``: deadline after ``now``; ``LEASE_EXPIRED``: at or before
        it; ``ANY``: either, and also a waiting position, which claims then skip, or a scheduled
        item, which leaves the schedule: how a waiting item is moved or reprioritized;
        ``NOT_VALIDLY_LEASED``: as ``ANY`` but not a lease whose deadline is after ``now``: how a
        dead letter is redriven without taking it from a consumer). Applied ids
        are settled for good; the others are rejected (unknown, stale, already settled, or refused
        by the guard). A record left with nothing unsettled is gone. Each record's settlements, with
        the appends they carry, are one atomic step (and each waiting or scheduled item's).
        ``completed``: the positions settled without a move count in ``LogHead.completed``
        (``queue.complete``), in the same write. The result names the id each moved item got
        (``Settled.moved``)."""
        ...

    def set_next_priority(
        self, key: LogKey, ids: Sequence[str], *, priority: int, now: datetime
    ) -> BatchResult[str]:
        """Give validly leased positions the priority they go back with (``queue.reprioritize`` of a
        leased item): kept with their lease record, so ``get``, ``expired`` and ``list_items``
        return them with ``Item.next_priority`` set, and the caller that puts them back (a retry,
        an expiry, a dead letter) sends them to ``Item.returning_priority``'s lane. Their ids, lease,
        deadline and attempts do not change; a renew that splits the record, and a settle of other
        positions of it, keep it. Rejected: ids not validly leased (waiting, scheduled, expired,
        settled, a hole, unknown). One write per record touched (DynamoDB: the head row, or the
        spilled record's row), after reading where the records are."""
        ...

    def renew(
        self, key: LogKey, ids: Sequence[str], *, deadline: datetime, now: datetime
    ) -> BatchResult[str]:
        """Move the deadline of validly leased positions to ``deadline``. All of a record's
        unsettled positions: its deadline moves. A part of them: they move to a new record with the
        new deadline (the rest keep theirs)."""
        ...

    def delete(self, key: LogKey, ids: Sequence[str], *, now: datetime) -> BatchResult[str]:
        """Remove items in any state: a waiting position is skipped by every later claim, a leased
        one is settled, a scheduled one is removed. Ids that name nothing stored are rejected."""
        ...

    def get(self, key: LogKey, ids: Sequence[str], *, now: datetime) -> dict[str, Item]:
        """The items ``ids`` name, as stored now (leased ones with their deadline and attempts as
        ``claim`` returned them): what a retry or a dead letter appends again. Ids that name nothing
        stored (settled, filled, deleted, unknown) are absent. Reads O(ids)."""
        ...

    def skip_waiting(self, key: LogKey, *, now: datetime) -> int:
        """Drop every waiting position at once (``queue.clear``): the cursor moves to the tail,
        so no claim reads them; their rows go by TTL. One head write, however many wait. Returns
        how many were dropped (deleted and filled positions not counted). Leased and scheduled
        items stay."""
        ...

    def list_items(self, key: LogKey, *, after: str, limit: int, now: datetime) -> list[Item]:
        """Up to ``limit`` stored items with ids after ``after``, in id order: leased (with their
        deadline) and waiting positions, then scheduled items. Skips settled, filled and deleted
        positions; reads O(returned + records in the range)."""
        ...

    def purge(self, key: LogKey, *, limit: int) -> int:
        """Delete up to ``limit`` rows of the log (its head last): a deleted queue's storage, paged.
        Returns how many rows went; 0 once the log is gone."""
        ...


__all__ = [
    "Claim",
    "ClaimLog",
    "ClaimReadError",
    "LeaseRun",
    "LogAges",
    "LogHead",
    "LogKey",
    "Settled",
    "Settlement",
]
