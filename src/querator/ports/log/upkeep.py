"""Ports, engine v3's claim log, the upkeep role: what the reaper and the lease's upkeep do to a
log (expired leases, due scheduled items), its items' ages for ``queue.stats``, clearing and purging.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from datetime import datetime

    from querator.domain.model import Item
    from querator.ports.log.items import LogKey


@dataclass(frozen=True, slots=True, kw_only=True)
class LogAges:
    """Sums of ``Item.created_at`` (whole seconds since the epoch) of a log's items, for the ages
    ``queue.stats`` reports: of the waiting ones, and of the leased ones not settled yet. Scheduled
    items count in neither. With ``LogHead.waiting`` and ``LogHead.leased`` they give the average
    ages to the second."""

    waiting_created: int = 0
    leased_created: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRun:
    """A lease record as ``expired`` finds it: its undone items (as ``claim`` returned them)."""

    token: str
    deadline: datetime
    items: list[Item] = field(default_factory=list)


class LogUpkeepPort(Protocol):
    """A log's expired leases, schedule, ages, clearing and purge."""

    def sweep_payloads(self, *, now: datetime, limit: int) -> int:
        """Delete up to ``limit`` stored payloads no item can need any more (a store that keeps
        payloads apart from rows: a writer that died between the two, a delete that failed);
        returns how many. A store that keeps every payload in its rows has none: 0."""
        ...

    def expired(self, key: LogKey, *, now: datetime, limit: int) -> list[LeaseRun]:
        """Up to ``limit`` lease records whose deadline passed, oldest deadline first, with their
        undone items: a key range of what is due, never a read of valid leases. The caller settles
        them (to the tail, a dead-letter queue, or dropped) with ``Guard.LEASE_EXPIRED``; a hole of
        such a record is filled on the way (its writer is long dead)."""
        ...

    def promote(self, key: LogKey, *, now: datetime, limit: int) -> int:
        """Move up to ``limit`` scheduled items due at ``now`` to the tail, oldest due first, each
        move atomic (under a new id). Returns how many moved."""
        ...

    def ages(self, key: LogKey) -> LogAges:
        """What the log's waiting and leased items' ages sum to (``queue.stats``; not on the hot
        path). Exact, but for one case a store may document: a position taken by a writer that died
        before writing it may count its items as waiting until the log is next empty."""
        ...

    def skip_waiting(self, key: LogKey, *, now: datetime) -> int:
        """Drop every waiting position at once (``queue.clear``): the cursor moves to the tail,
        so no claim reads them; their rows go by TTL. One head write, however many wait. Returns
        how many were dropped (deleted and filled positions not counted). Leased and scheduled
        items stay."""
        ...

    def purge(self, key: LogKey, *, limit: int) -> int:
        """Delete up to ``limit`` rows of the log (its head last): a deleted queue's storage, paged.
        Returns how many rows went; 0 once the log is gone."""
        ...
