"""Ports, the leasing role: lease records, claims, renewals, a leased item's coming priority,
and lease rate limits.

A lease rate limit's tokens (``take_tokens``, ``return_tokens``) belong here: a lease takes them
before it claims and gives back what it did not use, and nothing else touches them (docs/adr/0081).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from querator.domain.model import Item
    from querator.domain.ratelimit import Grant, RateLimit
    from querator.ports.items import BatchResult


class ClaimInterruptedError(Exception):
    """A ``claim`` that failed after some of its ids were claimed: ``claimed`` are leased to the
    caller, who must give them back (or return them); the failure is the ``__cause__``.

    A store whose claim is one transaction (memory, SQLite) never raises it: it claims all or none.
    The DynamoDB store claims concurrently, so one write can fail while others applied.
    """

    def __init__(self, claimed: Sequence[Item]) -> None:
        super().__init__(f"claim failed after {len(claimed)} item(s) were claimed")
        self.claimed = list(claimed)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRecord:
    """The ids one lease call may have claimed, filed under their lease deadline."""

    key: str
    deadline: datetime
    ids: list[str]


class LeasingPort(Protocol):
    """Leases of items: filed, claimed, counted, renewed; and the tokens of lease rate limits."""

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
