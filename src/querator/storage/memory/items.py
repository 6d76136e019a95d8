"""Storage layer, the in-memory store's items role: items by id and in id order."""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from querator.storage.memory.base import MemoryRowsBase, _Partition

if TYPE_CHECKING:
    from querator.domain.model import Item, ItemState


class MemoryItemRows(MemoryRowsBase):
    """The items of ``embedded.base.Rows`` in memory."""

    def item(self, queue: str, partition: int, item_id: str) -> Item | None:
        part = self._get(queue, partition)
        return None if part is None else part.items.get(item_id)

    def put(self, queue: str, partition: int, item: Item) -> None:
        part = self._make(queue, partition)
        if item.id not in part.items:
            bisect.insort(part.ids, item.id)
        part.items[item.id] = item

    def remove(self, queue: str, partition: int, item_id: str) -> None:
        part = self._get(queue, partition)
        if part is None or part.items.pop(item_id, None) is None:
            return
        at = bisect.bisect_left(part.ids, item_id)
        del part.ids[at]

    def _range(self, part: _Partition, start: str, end: str, limit: int) -> list[str]:
        first = bisect.bisect_left(part.ids, start)
        last = min(bisect.bisect_left(part.ids, end, first), first + limit)
        return part.ids[first:last]

    def items(self, queue: str, partition: int, start: str, end: str, limit: int) -> list[Item]:
        part = self._get(queue, partition)
        if part is None:
            return []
        return [part.items[i] for i in self._range(part, start, end, limit)]

    def states(self, queue: str, partition: int, start: str, end: str, limit: int) -> list[ItemState]:
        return [item.state() for item in self.items(queue, partition, start, end, limit)]
