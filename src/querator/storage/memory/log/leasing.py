"""Storage layer, engine v3's claim log in memory, the leasing role: the claim's fetch-and-add, lease
records by token (so by run)."""

from __future__ import annotations

import bisect
from dataclasses import replace
from typing import TYPE_CHECKING

from querator.domain.model import REPLY_SIZE_THRESHOLD
from querator.storage.memory.log.base import MemoryLogRowsBase

if TYPE_CHECKING:
    from querator.ports.log import LogKey
    from querator.storage.embedded.log.base import RunRecord


class MemoryLogLeasingRows(MemoryLogRowsBase):
    """The claims and lease records of ``embedded.log.base.LogRows`` in memory."""

    def advance(
        self, key: LogKey, count: int, max_leased: int | None = None
    ) -> tuple[int, int, tuple[int, ...]] | None:
        log = self._logs.get(key)
        if max_leased is not None:
            count = min(count, max_leased - (0 if log is None else log.head.leased))
        if log is None or log.head.cursor >= log.head.tail or count <= 0:
            return None
        head = replace(log.head)
        start, head.cursor = head.cursor, min(head.cursor + count, head.tail)
        head.leases += 1
        head.leased += head.cursor - start
        if head.cursor >= head.tail:
            # Nothing waits: the largest item size falls back to the threshold (``HeadRow.largest``).
            head.largest = min(head.largest, REPLY_SIZE_THRESHOLD)
        self.put_head(key, head)
        return start, head.cursor, head.tombstones

    def set_tombstones(self, key: LogKey, tombstones: tuple[int, ...]) -> None:
        self.put_head(key, replace(self._logs[key].head, tombstones=tombstones))

    def record(self, key: LogKey, token: str) -> RunRecord | None:
        log = self._logs.get(key)
        return None if log is None else log.records.get(token)

    def records_of_run(self, key: LogKey, position: int) -> list[RunRecord]:
        log = self._logs.get(key)
        if log is None:
            return []
        at = bisect.bisect_left(log.tokens, f"{position + 1:016x}")
        if at == 0:
            return []
        run = log.tokens[at - 1][:16]
        first = bisect.bisect_left(log.tokens, run)
        return [log.records[t] for t in log.tokens[first:at]]

    def records_after(self, key: LogKey, token: str, limit: int) -> list[RunRecord]:
        log = self._logs.get(key)
        if log is None:
            return []
        at = bisect.bisect_right(log.tokens, token)
        return [log.records[t] for t in log.tokens[at : at + limit]]

    def put_record(self, key: LogKey, record: RunRecord) -> None:
        log = self._logs[key]
        old = log.records.get(record.token)
        if old is not None:
            self._unrecord(log, old)
        self._record(log, record)

        def undo() -> None:
            self._unrecord(log, record)
            if old is not None:
                self._record(log, old)

        self.undo.append(undo)

    def drop_record(self, key: LogKey, token: str) -> None:
        log = self._logs[key]
        old = log.records.get(token)
        if old is not None:
            self._unrecord(log, old)
            self.undo.append(lambda: self._record(log, old))
