"""Storage layer, the in-memory store's leasing role: lease records by key (deadline), and lease
rate-limit buckets."""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from querator.storage.memory.base import MemoryRowsBase

if TYPE_CHECKING:
    from querator.ports import LeaseRecord


class MemoryLeasingRows(MemoryRowsBase):
    """The lease records and rate-limit buckets of ``embedded.base.Rows`` in memory."""

    def records_due(self, queue: str, partition: int, below: str, limit: int) -> list[LeaseRecord]:
        part = self._get(queue, partition)
        if part is None:
            return []
        last = min(bisect.bisect_left(part.record_keys, below), limit)
        return [part.records[k] for k in part.record_keys[:last]]

    def put_record(self, queue: str, partition: int, record: LeaseRecord) -> None:
        part = self._make(queue, partition)
        if record.key not in part.records:
            bisect.insort(part.record_keys, record.key)
        part.records[record.key] = record

    def drop_record(self, queue: str, partition: int, key: str) -> None:
        part = self._get(queue, partition)
        if part is None or part.records.pop(key, None) is None:
            return
        del part.record_keys[bisect.bisect_left(part.record_keys, key)]

    def bucket(self, queue: str, key: str) -> int | None:
        return self._buckets.get((queue, key))

    def put_bucket(self, queue: str, key: str, tat_us: int) -> None:
        self._buckets[queue, key] = tat_us
