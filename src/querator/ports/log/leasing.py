"""Ports, engine v3's claim log, the leasing role: claiming runs of positions, collecting their
holes, settling, renewing and reprioritizing what a lease holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from querator.ports.items import BatchResult

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from querator.domain.model import Item
    from querator.ports.items import Guard
    from querator.ports.log.items import LogKey


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


class LogLeasingPort(Protocol):
    """Leases of a log's positions: claimed, collected, settled, renewed, given a coming priority."""

    def claim(
        self,
        key: LogKey,
        *,
        count: int,
        deadline: datetime,
        now: datetime,
        max_leased: int | None = None,
        room: int | None = None,
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
        ``room``: the reply bytes the run may fill; the store takes at most ``room //
        reply_bytes_at_most(largest)`` positions with ``LogHead.largest`` as its own read of the head
        sees it, so an item larger than the caller's read of the head showed, appended since,
        cannot carry a lease reply past the cap.
        """
        ...

    def collect(self, key: LogKey, token: str, *, now: datetime) -> Claim:
        """Read the holes of ``token``'s record again: the ones now written come back as items; a
        hole whose claim is ``HOLE_TIMEOUT_S`` old or more is filled (done, never delivered). Returns
        the claim with only what this call found, and the holes still open."""
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
