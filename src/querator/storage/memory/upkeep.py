"""Storage layer, the in-memory store's upkeep role: the purge of a partition's rows."""

from __future__ import annotations

import heapq

from querator.storage.memory.base import MemoryRowsBase


class MemoryUpkeepRows(MemoryRowsBase):
    """The purge of ``embedded.base.Rows`` in memory."""

    def purge(self, queue: str, partition: int, limit: int) -> int:
        part = self._get(queue, partition)
        if part is None:
            self._drop_idempotency(queue, partition)
            return 0
        gone = part.ids[:limit]
        del part.ids[:limit]
        for item_id in gone:
            del part.items[item_id]
        left = limit - len(gone)
        keys = part.record_keys[:left]
        del part.record_keys[:left]
        for key in keys:
            del part.records[key]
        removed = len(gone) + len(keys)
        if removed < limit and part.has_head:
            part.has_head = False
            removed += 1
        if part.empty():
            # Nothing of a deleted queue stays behind, so memory comes back.
            del self._partitions[queue, partition]
        return removed

    def _drop_idempotency(self, queue: str, partition: int) -> None:
        # Idempotency records have no partition; the queue's go with its first partition's purge.
        if partition == 0:
            for bucket in [k for k in self._buckets if k[0] == queue]:
                del self._buckets[bucket]
            for key in [k for k in self._idem if k[0] == queue]:
                del self._idem[key]
            self._idem_expiry = [e for e in self._idem_expiry if e[1] != queue]
            heapq.heapify(self._idem_expiry)
