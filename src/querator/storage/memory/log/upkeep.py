"""Storage layer, engine v3's claim log in memory, the upkeep role: records by deadline, skipping what
waits, the sums for ages, the purge."""

from __future__ import annotations

import bisect
from dataclasses import replace
from typing import TYPE_CHECKING

from querator.storage.memory.log.base import MemoryLogRowsBase

if TYPE_CHECKING:
    from querator.ports.log import LogKey
    from querator.storage.embedded.log.base import RunRecord


class MemoryLogUpkeepRows(MemoryLogRowsBase):
    """The upkeep of ``embedded.log.base.LogRows`` in memory."""

    def skip(self, key: LogKey) -> tuple[int, int, tuple[int, ...]] | None:
        log = self._logs.get(key)
        if log is None:
            return None
        head = log.head
        self.put_head(key, replace(head, cursor=head.tail, tombstones=()))
        return head.cursor, head.tail, head.tombstones

    def records_due(self, key: LogKey, deadline_us: int, limit: int) -> list[RunRecord]:
        log = self._logs.get(key)
        if log is None:
            return []
        last = min(bisect.bisect_right(log.deadlines, (deadline_us, "~")), limit)
        return [log.records[t] for _, t in log.deadlines[:last]]

    def created_sums(self, key: LogKey, start: int) -> tuple[int, int]:
        log = self._log(key)
        if log is None:
            return 0, 0
        at = bisect.bisect_left(log.firsts, start)
        return (
            sum(log.rows[f].created for f in log.firsts[at:]),
            sum(record.created for record in log.records.values()),
        )

    def purge(self, key: LogKey, limit: int) -> int:
        log = self._logs.get(key)
        if log is None:
            return 0
        removed = 0
        for first in log.firsts[:limit]:
            del log.rows[first]
        removed += len(log.firsts[:limit])
        del log.firsts[:limit]
        for token in list(log.tokens[: limit - removed]):
            self._unrecord(log, log.records[token])
            removed += 1
        for item_id in list(log.schedule_ids[: limit - removed]):
            self._unschedule(log, item_id)
            removed += 1
        if removed < limit:
            del self._logs[key]
            removed += 1
        # A purge is paged and idempotent: one that raised is simply called again, so no undo.
        return removed
