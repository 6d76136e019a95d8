"""Storage layer, engine v3's claim log in memory, the items role: the sequencer, packed rows, the
schedule."""

from __future__ import annotations

import bisect
from dataclasses import replace
from typing import TYPE_CHECKING

from querator.storage.embedded.log.base import HeadRow, PackedRow
from querator.storage.memory.log.base import MemoryLogRowsBase, _Log

if TYPE_CHECKING:
    from collections.abc import Sequence

    from querator.ports.log import LogKey


class MemoryLogItemRows(MemoryLogRowsBase):
    """The items of ``embedded.log.base.LogRows`` in memory."""

    def take(
        self,
        key: LogKey,
        count: int,
        *,
        start: int,
        produce: bool,
        scheduled: int = 0,
        largest: int = 0,
        produced: int = 0,
    ) -> int:
        log = self._logs.get(key)
        if log is None:
            log = self._logs[key] = _Log(head=HeadRow(tail=start, cursor=start))
            self.undo.append(lambda: self._forget(key))
        head = replace(log.head)
        first = head.tail
        head.tail += count
        head.scheduled += scheduled
        head.largest = max(head.largest, largest)
        head.produced += (count if produce else 0) + produced
        self.put_head(key, head)
        return first

    def _forget(self, key: LogKey) -> None:
        self._logs.pop(key, None)

    def next_times(self, key: LogKey) -> tuple[int | None, str | None]:
        log = self._logs[key]
        return (log.deadlines[0][0] if log.deadlines else None), (
            log.schedule_ids[0] if log.schedule_ids else None
        )

    def put_rows(self, key: LogKey, rows: Sequence[PackedRow]) -> None:
        log = self._logs[key]
        for row in rows:
            if row.first in log.rows:
                raise RuntimeError(f"row {row.first} of {key} is written once")
            bisect.insort(log.firsts, row.first)
            log.rows[row.first] = row
            self.undo.append(lambda first=row.first: self._unput(log, first))  # type: ignore[misc]

    @staticmethod
    def _unput(log: _Log, first: int) -> None:
        del log.rows[first]
        log.firsts.remove(first)

    def scheduled(self, key: LogKey, after: str, until: str, limit: int) -> list[tuple[str, bytes]]:
        log = self._logs.get(key)
        if log is None:
            return []
        first = bisect.bisect_right(log.schedule_ids, after)
        last = min(bisect.bisect_right(log.schedule_ids, until, first), first + limit)
        return [(i, log.schedule[i]) for i in log.schedule_ids[first:last]]

    def put_scheduled(self, key: LogKey, item_id: str, blob: bytes) -> None:
        log = self._logs[key]  # the call's ``take`` made the head
        bisect.insort(log.schedule_ids, item_id)
        log.schedule[item_id] = blob
        self.undo.append(lambda: self._unschedule(log, item_id))

    def drop_scheduled(self, key: LogKey, item_id: str) -> bool:
        log = self._logs.get(key)
        if log is None or item_id not in log.schedule:
            return False
        blob = log.schedule[item_id]
        self._unschedule(log, item_id)

        def undo() -> None:
            bisect.insort(log.schedule_ids, item_id)
            log.schedule[item_id] = blob

        self.undo.append(undo)
        return True
