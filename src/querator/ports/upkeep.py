"""Ports, the upkeep role: what the reaper moves besides items (the schedule mark, sweep marks,
recounts) and the paged purge of a deleted queue's rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime


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


class UpkeepPort(Protocol):
    """The reaper's marks and recounts of a partition, and its purge."""

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

    def purge_page(self, queue: str, partition: int, *, limit: int) -> int:
        """Delete up to ``limit`` rows of a partition (items and the rest); return how many (0: empty)."""
        ...
