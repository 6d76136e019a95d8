"""Storage layer, the embedded stores' upkeep role: the reaper's marks, recounts and purges."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from querator.domain.ids import key_after
from querator.domain.priority import lane_of
from querator.storage.counters import CounterDeltas
from querator.storage.embedded.base import RowsStoreBase

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from querator.ports import PartitionHead, Recount


def _with_sweep(head: PartitionHead, mark: str) -> PartitionHead:
    lane = lane_of(mark)
    if lane == "":
        return replace(head, sweep=mark)
    return replace(head, band_sweeps={**head.band_sweeps, lane: mark})


class RowsUpkeep(RowsStoreBase):
    """``UpkeepPort`` over ``Rows``."""

    def purge_page(self, queue: str, partition: int, *, limit: int) -> int:
        with self._write() as rows:
            return rows.purge(queue, partition, limit)

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
        with self._write() as rows:
            head = rows.head(queue, partition)
            # Of two reapers that counted the same range, the second finds the mark moved.
            if head.schedule_mark != old_mark:
                return 0
            came = CounterDeltas()
            for band in bands:
                start, end = band + old_mark, band + new_mark
                while start < end:
                    read = rows.states(queue, partition, start, end, 1000)
                    for state in read:
                        # A leased one left the scheduled count when it was claimed (note_leased).
                        if state.enqueue_at is not None and state.lease_deadline is None:
                            came.add(state.created_at, sign=-1, leased=False, scheduled=True)
                    if len(read) < 1000:
                        break
                    start = key_after(read[-1].id)
            came.items = came.created = 0
            rows.write_head(queue, partition, replace(came.applied(head), schedule_mark=new_mark))
        return -came.scheduled

    def set_sweep(self, queue: str, partition: int, mark: str) -> None:
        with self._write() as rows:
            rows.write_head(queue, partition, _with_sweep(rows.head(queue, partition), mark))

    def save_recount(self, queue: str, partition: int, recount: Recount | None) -> None:
        with self._write() as rows:
            rows.write_head(queue, partition, replace(rows.head(queue, partition), recount=recount))

    def finish_recount(self, queue: str, partition: int, recount: Recount, *, now: datetime) -> bool:
        with self._write() as rows:
            head = rows.head(queue, partition)
            if head.version != recount.version:
                # A write overtook the recount: its deltas are in the counters, not in the recount.
                rows.write_head(queue, partition, replace(head, recount=None))
                return False
            rows.write_head(
                queue,
                partition,
                replace(
                    head,
                    items=recount.items,
                    leased=recount.leased,
                    scheduled=recount.scheduled,
                    created_sum=recount.created_sum,
                    leased_created_sum=recount.leased_created_sum,
                    scheduled_created_sum=recount.scheduled_created_sum,
                    recount=None,
                    recounted_at=now,
                ),
            )
            return True
