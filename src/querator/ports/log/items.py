"""Ports, engine v3's claim log, the items role: appending items to a log (produce, in one step or
two), and reading and deleting them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from querator.domain.model import Item
    from querator.ports.items import BatchResult


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


class LogItemsPort(Protocol):
    """Items of a log: appended (at once, or at positions taken first), read, listed, deleted."""

    @property
    def payload_limit(self) -> int:
        """The largest payload the log stores (the service refuses larger ones before a write):
        ``MAX_PAYLOAD_BYTES``, or ``ROW_PAYLOAD_BYTES`` on DynamoDB without a payload bucket."""
        ...

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

    def take_positions(
        self, key: LogKey, count: int, *, now: datetime, created: int = 0, largest: int = 0
    ) -> list[str]:
        """The first half of ``append``: take ``count`` positions at the tail with one sequencer
        write and return their ids; nothing is written at them yet (they are holes until
        ``write_taken``). An idempotent produce records these ids before it writes, so a retry after
        a crash writes the same positions instead of new ones. ``created``: the sum of the
        ``created_at`` seconds of the items to be written there (``LogAges``; a store that counts
        waiting items' ages from the take, as DynamoDB's does, needs it then). ``largest``: the
        largest ``Item.reply_size`` among them; ``LogHead.largest`` is at least that before the
        positions exist, so a claim of them, written or still holes, is sized by it (the reply
        cap)."""
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

    def get(self, key: LogKey, ids: Sequence[str], *, now: datetime) -> dict[str, Item]:
        """The items ``ids`` name, as stored now (leased ones with their deadline and attempts as
        ``claim`` returned them): what a retry or a dead letter appends again. Ids that name nothing
        stored (settled, filled, deleted, unknown) are absent. Reads O(ids)."""
        ...

    def list_items(
        self,
        key: LogKey,
        *,
        after: str,
        limit: int,
        now: datetime,
        max_bytes: int | None = None,
        schedule: bool = True,
    ) -> list[Item]:
        """Up to ``limit`` stored items with ids after ``after``, in id order: leased (with their
        deadline) and waiting positions, then (``schedule``) scheduled items. Skips settled, filled
        and deleted positions; reads O(returned + records in the range).

        With ``max_bytes`` it may stop after the item that takes the payloads listed past
        ``max_bytes`` (so a page holds at most ``max_bytes`` and one item more). Fewer than ``limit``
        items holding at most ``max_bytes`` mean the range has no more: a page the store cut short
        (a DynamoDB Query answers at most 1 MB) is read on, never returned as the end."""
        ...

    def delete(self, key: LogKey, ids: Sequence[str], *, now: datetime) -> BatchResult[str]:
        """Remove items in any state: a waiting position is skipped by every later claim, a leased
        one is settled, a scheduled one is removed. Ids that name nothing stored are rejected."""
        ...
