"""Storage layer, the embedded stores' items role: writes of new items, reads, deletes and moves."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from querator.domain.ids import ITEMS_END, key_after, visible_bound
from querator.domain.priority import lane_of
from querator.ports import BatchResult, Guard, LeaseRecord, Page, PartitionHead
from querator.storage.counters import CounterDeltas, scheduled_when_written, still_scheduled
from querator.storage.embedded.base import Rows, RowsStoreBase, _guard_holds
from querator.storage.embedded.lanes import _with_bands
from querator.storage.embedded.leasing import _lane_cursor, _with_cursor

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence
    from datetime import datetime

    from querator.domain.model import Item, ItemState
    from querator.ports import Move


def _admitting(head: PartitionHead, ids: Iterable[str]) -> PartitionHead:
    """``head`` with each lane's cursor pulled back to the oldest of ``ids`` written below it.

    Ids are minted before the write transaction begins; one that waited for the write lock (another
    writer of the same file held it) can land below a cursor that a lease moved meanwhile, where no
    lease would read it until the sweep, two minutes later. Pulled back in the same transaction as
    the write, the cursor keeps its promise (every id below it is leased, being settled or gone) and
    the late item is the next one leased, in FIFO order. The next lease re-reads what lies between
    (what was claimed while the writer waited).
    """
    oldest: dict[str, str] = {}
    for item_id in ids:
        lane = lane_of(item_id)
        if item_id < oldest.get(lane, ITEMS_END):
            oldest[lane] = item_id
    for lane, item_id in oldest.items():
        if item_id < _lane_cursor(head, lane):
            head = _with_cursor(head, item_id)
    return head


class RowsItems(RowsStoreBase):
    """``ItemsPort`` over ``Rows``."""

    def put_new(self, queue: str, partition: int, items: Sequence[Item], *, now: datetime) -> None:
        with self._write() as rows:
            for item in items:
                rows.put(queue, partition, item)
            self._count_added(rows, queue, partition, items, now)

    def put_absent(
        self, queue: str, partition: int, items: Sequence[Item], *, now: datetime
    ) -> BatchResult[str]:
        result: BatchResult[str] = BatchResult()
        with self._write() as rows:
            written = []
            for item in items:
                # A put never replaces a live item (the reference's PUT_ABSENT_CONDITION).
                if rows.item(queue, partition, item.id) is None:
                    rows.put(queue, partition, item)
                    written.append(item)
                    result.applied.append(item.id)
                else:
                    result.rejected.append(item.id)
            self._count_added(rows, queue, partition, written, now)
        return result

    @staticmethod
    def _count_added(rows: Rows, queue: str, partition: int, items: Sequence[Item], now: datetime) -> None:
        counts = CounterDeltas()
        for item in items:
            counts.add(
                item.created_at,
                sign=1,
                leased=item.lease_deadline is not None,
                scheduled=scheduled_when_written(item, now),
            )
        # Every write of new items is production (produce, its resumption, import), as in the reference.
        counts.produced = counts.items
        if counts.items:
            head = rows.head(queue, partition)
            # The schedule mark starts at the partition's first write (as in the reference).
            mark = head.schedule_mark or visible_bound(now)
            # ... and so does the clock of its first recount, a recount period later.
            recounted = head.recounted_at or now
            rows.write_head(
                queue,
                partition,
                _admitting(
                    _with_bands(
                        counts.applied(head, schedule_mark=mark, recounted_at=recounted),
                        (item.id for item in items),
                        now,
                    ),
                    (item.id for item in items),
                ),
            )

    def head(
        self, queue: str, partition: int, *, now: datetime, records: int = 0
    ) -> tuple[PartitionHead, list[LeaseRecord]]:
        with self._read() as rows:
            due = rows.records_due(queue, partition, visible_bound(now), records) if records else []
            return rows.head(queue, partition), due

    def heads(self, queue: str, partitions: Sequence[int]) -> list[PartitionHead]:
        with self._read() as rows:
            return [rows.head(queue, p) for p in partitions]

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
        if start >= end:
            return Page(read_to=end)
        with self._read() as rows:
            # One more than the limit tells whether the range ended (DynamoDB may say "not done" on
            # an exact fit; the caller reads an empty page then, here it need not).
            read = rows.states(queue, partition, start, end, limit + 1)
        done = len(read) <= limit
        read = read[:limit]
        found = [
            s
            for s in read
            if (available_at is None or s.lease_deadline is None or s.lease_deadline <= available_at)
            and (not never_leased or s.lease_deadline is None)
            and (not scheduled_only or s.enqueue_at is not None)
        ]
        return Page(
            items=found, read_to=end if done else key_after(read[-1].id), done=done, evaluated=len(read)
        )

    def states(self, queue: str, partition: int, ids: Sequence[str]) -> list[ItemState]:
        with self._read() as rows:
            found = (rows.item(queue, partition, i) for i in dict.fromkeys(ids))
            return [item.state() for item in found if item is not None]

    def get_many(self, queue: str, partition: int, ids: Sequence[str]) -> dict[str, Item]:
        with self._read() as rows:
            found = (rows.item(queue, partition, i) for i in dict.fromkeys(ids))
            return {item.id: item for item in found if item is not None}

    def get(self, queue: str, partition: int, item_id: str) -> Item | None:
        with self._read() as rows:
            return rows.item(queue, partition, item_id)

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
        start, end = max(pivot, lower), upper or ITEMS_END
        if start >= end:
            return []
        with self._read() as rows:
            found = rows.items(queue, partition, start, end, limit)
        if max_bytes is None:
            return found
        kept: list[Item] = []
        size = 0
        for item in found:
            size += len(item.payload)
            if kept and size > max_bytes:
                break
            kept.append(item)
        return kept

    def iter_items(self, queue: str, partition: int, *, page_size: int = 500) -> Iterator[Item]:
        pivot = ""
        while True:
            page = self.list_items(queue, partition, limit=page_size + 1, pivot=pivot)
            yield from page[:page_size]
            if len(page) <= page_size:
                return
            pivot = page[page_size].id

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
        result: BatchResult[str] = BatchResult()
        counts = CounterDeltas()
        with self._write() as rows:
            mark = rows.head(queue, partition).schedule_mark
            for item_id in dict.fromkeys(ids):
                item = rows.item(queue, partition, item_id)
                if not _guard_holds(item, guard, now):
                    result.rejected.append(item_id)
                    continue
                result.applied.append(item_id)
                if item is None:
                    continue  # Guard.ANY: gone already is fine
                rows.remove(queue, partition, item_id)
                counts.add(
                    item.created_at,
                    sign=-1,
                    leased=item.lease_deadline is not None,
                    scheduled=still_scheduled(item, mark),
                )
            if completed:
                counts.completed = -counts.items
            if counts.items:
                rows.write_head(queue, partition, counts.applied(rows.head(queue, partition)))
        return result

    def move(
        self, queue: str, partition: int, moves: Sequence[Move], *, guard: Guard, now: datetime
    ) -> BatchResult[str]:
        result: BatchResult[str] = BatchResult()
        deltas: dict[tuple[str, int], CounterDeltas] = {}
        with self._write() as rows:
            mark = rows.head(queue, partition).schedule_mark
            for move in moves:
                item = rows.item(queue, partition, move.item.id)
                target = (move.target_queue, move.target_partition)
                # Delete in the guarded state and put where nothing lives, or neither (a transaction).
                if (
                    not _guard_holds(item, guard, now)
                    or item is None
                    or rows.item(*target, move.replacement.id)
                ):
                    result.rejected.append(move.item.id)
                    continue
                rows.remove(queue, partition, item.id)
                rows.put(*target, move.replacement)
                result.applied.append(move.item.id)
                deltas.setdefault((queue, partition), CounterDeltas()).add(
                    item.created_at,
                    sign=-1,
                    leased=item.lease_deadline is not None,
                    scheduled=still_scheduled(item, mark),
                )
                deltas.setdefault(target, CounterDeltas()).add(
                    move.replacement.created_at,
                    sign=1,
                    leased=move.replacement.lease_deadline is not None,
                    scheduled=scheduled_when_written(move.replacement, now),
                )
            arrived: dict[tuple[str, int], list[str]] = {}
            for move in moves:
                if move.item.id in result.applied:
                    target = (move.target_queue, move.target_partition)
                    arrived.setdefault(target, []).append(move.replacement.id)
            for (target_queue, target_partition), counts in deltas.items():
                head = counts.applied(rows.head(target_queue, target_partition))
                if (target_queue, target_partition) != (queue, partition) and not head.schedule_mark:
                    head = replace(head, schedule_mark=visible_bound(now))
                came = arrived.get((target_queue, target_partition), [])
                head = _admitting(_with_bands(head, came, now), came)
                rows.write_head(target_queue, target_partition, head)
        return result
