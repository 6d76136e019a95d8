"""Storage layer: the in-memory store and catalog, the reference implementation of the ports.

Shipped in the package (like procrastinate's in-memory connector) for service unit tests, for
``querator serve --store memory`` and for ``querator.embedded``. One lock per store makes every
port call, and so every guarded write, atomic. Rows of a partition are a dict by id plus a sorted
list of ids, so a range read is a ``bisect`` and a slice: O(log n + k). Inserting or removing an id
shifts the list (a ``memmove``), which stays microseconds at 100,000 items a partition.
Everything is lost when the process ends.
"""

from __future__ import annotations

import bisect
import heapq
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from querator.domain.errors import ConflictError, QueueAlreadyExistsError, QueueNotFoundError
from querator.ports import PartitionHead
from querator.storage.engine import SortedRowsStore

if TYPE_CHECKING:
    from collections.abc import Iterator
    from datetime import datetime

    from querator.domain.model import Item, ItemState, QueueInfo
    from querator.ports import IdempotencyRecord, LeaseRecord


@dataclass(slots=True)
class _Partition:
    head: PartitionHead = field(default_factory=PartitionHead)
    has_head: bool = False
    ids: list[str] = field(default_factory=list)
    items: dict[str, Item] = field(default_factory=dict)
    record_keys: list[str] = field(default_factory=list)
    records: dict[str, LeaseRecord] = field(default_factory=dict)

    def empty(self) -> bool:
        return not self.items and not self.records and not self.has_head


class _MemoryRows:
    """``engine.Rows`` over dicts and sorted id lists; the caller holds the store's lock."""

    def __init__(self) -> None:
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self._idem: dict[tuple[str, str], tuple[IdempotencyRecord, int]] = {}
        #: (expiry, queue, key) of every record written; stale entries are skipped when popped.
        self._idem_expiry: list[tuple[int, str, str]] = []
        #: Lease rate-limit buckets by (queue, bucket): one per group that ever leased, dropped
        #: with the queue.
        self._buckets: dict[tuple[str, str], int] = {}

    def _get(self, queue: str, partition: int) -> _Partition | None:
        return self._partitions.get((queue, partition))

    def _make(self, queue: str, partition: int) -> _Partition:
        return self._partitions.setdefault((queue, partition), _Partition())

    def head(self, queue: str, partition: int) -> PartitionHead:
        part = self._get(queue, partition)
        return PartitionHead() if part is None else part.head

    def write_head(self, queue: str, partition: int, head: PartitionHead) -> None:
        part = self._make(queue, partition)
        part.head, part.has_head = head, True

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

    def bucket(self, queue: str, key: str) -> int | None:
        return self._buckets.get((queue, key))

    def put_bucket(self, queue: str, key: str, tat_us: int) -> None:
        self._buckets[queue, key] = tat_us


class InMemoryItemStore(SortedRowsStore):
    """``ItemStore`` in this process's memory; thread-safe, lost when the process ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows = _MemoryRows()

    @contextmanager
    def _read(self) -> Iterator[_MemoryRows]:
        with self._lock:
            yield self._rows

    _write = _read


class InMemoryQueueCatalog:
    """``QueueCatalog`` in this process's memory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[str, QueueInfo] = {}
        self._bookmark: str | None = None
        self._stream_key: str | None = None

    def create(self, info: QueueInfo) -> None:
        with self._lock:
            if info.name in self._queues:
                raise QueueAlreadyExistsError(f"queue '{info.name}' already exists")
            self._queues[info.name] = info

    def get(self, name: str) -> QueueInfo:
        with self._lock:
            info = self._queues.get(name)
        if info is None:
            raise QueueNotFoundError(f"queue '{name}' does not exist", queue=name)
        return info

    def list(self, *, pivot: str, limit: int) -> list[QueueInfo]:
        with self._lock:
            names = sorted(n for n in self._queues if n >= pivot)[:limit]
            return [self._queues[n] for n in names]

    def iterate(self) -> Iterator[QueueInfo]:
        with self._lock:
            queues = [self._queues[n] for n in sorted(self._queues)]
        yield from queues

    def replace(self, info: QueueInfo, *, expected_updated_at: datetime) -> None:
        with self._lock:
            current = self._queues.get(info.name)
            # Optimistic concurrency, as in the reference: the second of two updates must not undo
            # the first.
            if current is None or current.updated_at != expected_updated_at:
                raise ConflictError(f"queue '{info.name}' changed or was deleted meanwhile")
            self._queues[info.name] = info

    def mark_deleting(self, name: str) -> QueueInfo:
        with self._lock:
            current = self._queues.get(name)
            if current is None:
                raise QueueNotFoundError(f"queue '{name}' does not exist", queue=name)
            info = self._queues[name] = replace(current, deleting=True)
        return info

    def remove(self, name: str) -> None:
        with self._lock:
            self._queues.pop(name, None)

    def load_bookmark(self) -> str | None:
        return self._bookmark

    def save_bookmark(self, bookmark: str | None) -> None:
        self._bookmark = bookmark

    def stream_key(self, candidate: str | None) -> str | None:
        with self._lock:
            if self._stream_key is None:
                self._stream_key = candidate
            return self._stream_key
