"""Ports, the lanes role: the key ranges a lease reads in turn (docs/glossary.md): priority
bands, and a fair queue's group lanes with their ledgers (``max_leased_per_group``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from datetime import datetime

    from querator.domain.model import Item
    from querator.ports.items import PartitionHead


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupLedger:
    """The leases a capped fair queue handed out in one group (``max_leased_per_group``): each
    id with its lease deadline as claimed, and a version every claim moves on. An entry may outlive
    its lease (a complete whose removal was lost) or undercount it (a renewal): callers check
    entries whose deadline passed against the items."""

    version: int = 0
    leases: Mapping[str, datetime] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Lane:
    """A group lane of a fair queue's partition (``querator.domain.priority.lane_of``)."""

    #: The key prefix: the band, ``g`` and the group's 16 hex digits.
    lane: str
    #: Where a lease reads the lane from: every id below it is leased, being settled, or gone.
    cursor: str
    #: When a write of items into the lane last registered it.
    registered: datetime


class LanesPort(Protocol):
    """Bands and group lanes of a partition: registered, listed, dropped; group ledgers and the
    claims they admit."""

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
