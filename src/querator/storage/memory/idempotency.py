"""Storage layer, the in-memory store's idempotency role: records by (queue, key), and a heap of
their expiries."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from querator.storage.memory.base import MemoryRowsBase

if TYPE_CHECKING:
    from querator.ports import IdempotencyRecord


class MemoryIdempotencyRows(MemoryRowsBase):
    """The idempotency records of ``embedded.base.Rows`` in memory."""

    def idempotency(self, queue: str, key: str) -> tuple[IdempotencyRecord, int] | None:
        return self._idem.get((queue, key))

    def put_idempotency(self, queue: str, record: IdempotencyRecord, expires_s: int) -> None:
        self._idem[queue, record.key] = (record, expires_s)
        heapq.heappush(self._idem_expiry, (expires_s, queue, record.key))

    def drop_expired_idempotency(self, now_s: int, limit: int) -> None:
        while limit and self._idem_expiry and self._idem_expiry[0][0] < now_s:
            expires, queue, key = heapq.heappop(self._idem_expiry)
            found = self._idem.get((queue, key))
            if found is not None and found[1] == expires:
                del self._idem[queue, key]
                limit -= 1
