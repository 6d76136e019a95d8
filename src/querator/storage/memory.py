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
from querator.storage.embedded.log.base import HeadRow, PackedRow, RunRecord
from querator.storage.embedded.log.store import ClaimLogEngine
from querator.storage.embedded.store import SortedRowsStore

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from datetime import datetime

    from querator.domain.model import Item, ItemState, QueueInfo
    from querator.ports import IdempotencyRecord, LeaseRecord
    from querator.ports.log import LogKey


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


@dataclass(slots=True)
class _Log:
    """One claim log's rows: the head, packed rows by first position, lease records by token (which
    sorts by run) and by deadline, schedule rows by id (which sorts by due time)."""

    head: HeadRow
    firsts: list[int] = field(default_factory=list)
    rows: dict[int, PackedRow] = field(default_factory=dict)
    tokens: list[str] = field(default_factory=list)
    records: dict[str, RunRecord] = field(default_factory=dict)
    deadlines: list[tuple[int, str]] = field(default_factory=list)
    schedule_ids: list[str] = field(default_factory=list)
    schedule: dict[str, bytes] = field(default_factory=dict)


class _MemoryLogRows:
    """``log_engine.LogRows`` over sorted lists and dicts; the caller holds the store's lock.

    Every change pushes its inverse on ``undo``: a call that raises midway is rolled back whole, as
    SQLite's transaction is (the engine writes as it goes).
    """

    def __init__(self) -> None:
        self._logs: dict[LogKey, _Log] = {}
        self.undo: list[Callable[[], None]] = []

    def _log(self, key: LogKey) -> _Log | None:
        return self._logs.get(key)

    def head(self, key: LogKey) -> HeadRow | None:
        log = self._logs.get(key)
        return None if log is None else replace(log.head)

    def put_head(self, key: LogKey, head: HeadRow) -> None:
        log = self._logs[key]
        old = log.head
        log.head = replace(head)
        self.undo.append(lambda: setattr(log, "head", old))

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
        self.put_head(key, head)
        return start, head.cursor, head.tombstones

    def skip(self, key: LogKey) -> tuple[int, int, tuple[int, ...]] | None:
        log = self._logs.get(key)
        if log is None:
            return None
        head = log.head
        self.put_head(key, replace(head, cursor=head.tail, tombstones=()))
        return head.cursor, head.tail, head.tombstones

    def set_tombstones(self, key: LogKey, tombstones: tuple[int, ...]) -> None:
        self.put_head(key, replace(self._logs[key].head, tombstones=tombstones))

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

    def add_counts(
        self, key: LogKey, *, leases: int = 0, leased: int = 0, scheduled: int = 0, completed: int = 0
    ) -> None:
        head = replace(self._logs[key].head)
        head.leases += leases
        head.leased += leased
        head.scheduled += scheduled
        head.completed += completed
        self.put_head(key, head)

    def next_times(self, key: LogKey) -> tuple[int | None, str | None]:
        log = self._logs[key]
        return (log.deadlines[0][0] if log.deadlines else None), (
            log.schedule_ids[0] if log.schedule_ids else None
        )

    def rows(self, key: LogKey, start: int, end: int, limit: int) -> list[PackedRow]:
        log = self._logs.get(key)
        if log is None:
            return []
        first = max(bisect.bisect_right(log.firsts, start) - 1, 0)
        last = min(bisect.bisect_left(log.firsts, end, first), first + limit)
        return [log.rows[f] for f in log.firsts[first:last]]

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

    def records_due(self, key: LogKey, deadline_us: int, limit: int) -> list[RunRecord]:
        log = self._logs.get(key)
        if log is None:
            return []
        last = min(bisect.bisect_right(log.deadlines, (deadline_us, "~")), limit)
        return [log.records[t] for _, t in log.deadlines[:last]]

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

    @staticmethod
    def _record(log: _Log, record: RunRecord) -> None:
        log.records[record.token] = record
        bisect.insort(log.tokens, record.token)
        bisect.insort(log.deadlines, (record.deadline_us, record.token))

    @staticmethod
    def _unrecord(log: _Log, record: RunRecord) -> None:
        del log.records[record.token]
        del log.tokens[bisect.bisect_left(log.tokens, record.token)]
        del log.deadlines[bisect.bisect_left(log.deadlines, (record.deadline_us, record.token))]

    def drop_record(self, key: LogKey, token: str) -> None:
        log = self._logs[key]
        old = log.records.get(token)
        if old is not None:
            self._unrecord(log, old)
            self.undo.append(lambda: self._record(log, old))

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

    @staticmethod
    def _unschedule(log: _Log, item_id: str) -> None:
        del log.schedule[item_id]
        log.schedule_ids.remove(item_id)

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


class InMemoryClaimLog(ClaimLogEngine):
    """``ClaimLog`` in this process's memory; thread-safe, lost when the process ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows = _MemoryLogRows()

    @contextmanager
    def _read(self) -> Iterator[_MemoryLogRows]:
        with self._lock:
            self._rows.undo = []
            try:
                yield self._rows
            except BaseException:
                for undo in reversed(self._rows.undo):
                    undo()
                raise
            finally:
                self._rows.undo = []

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
