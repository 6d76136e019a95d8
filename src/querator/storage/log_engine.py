"""Storage layer: engine v3's claim log (``ports.log.ClaimLog``) over one transaction's rows, shared
by the embedded stores.

The in-memory and SQLite claim logs differ only in where rows live (``LogRows``); what each port
method means is written once here, in the model of docs/adr/0100-engine-v3-candidates.md (L-spill):

- a **head** per log: ``tail`` (the sequencer), ``cursor``, counters, the largest item, and the
  *tombstones* (waiting positions deleted, above the cursor);
- write-once **packed rows** keyed by their first position: the encoded items of one append, in
  order, up to ``ROW_BYTES`` (a *filler* row, with no items, marks positions filled after their
  writer was taken for dead);
- **lease records**, one per claim (and per part a renew split off), found by deadline (``expired``)
  and by position (``settle``): a record's token begins with the first position of the run it
  was claimed from, so the records holding a position are those of the latest run starting at or
  before it, one key range;
- **schedule rows** keyed by their scheduled id (lane, due time, random), so by due time.

DynamoDB keeps up to 32 records in the head and spills the rest to rows, to save a read; here every
record is a row of its own (an index lookup costs what a head decode would). A store may keep a head
field in another form when it reads the same (SQLite: ``storage.sqlite``'s notes). Every port call runs in
one transaction of the backing store, so claims never race and nothing is half applied; a hole can
still come from ``take_positions`` without ``write_taken`` (a writer in another process that died),
and ``collect`` fills it as the port says.
"""

from __future__ import annotations

import random
import secrets
import struct
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from querator.domain.model import Item, timestamp_us, utc_from_timestamp_us
from querator.domain.positions import (
    HOLE_TIMEOUT_S,
    POSITION_MARK,
    SCHEDULED_MARK,
    parse_position_id,
    parse_scheduled_id,
    position_id,
    scheduled_id,
)
from querator.ports import BatchResult, Guard
from querator.ports.log import Claim, LeaseRun, LogAges, LogHead, Settled, Settlement

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from contextlib import AbstractContextManager

    from querator.ports.log import LogKey

#: Most bytes of encoded items in one packed row (an item larger than that gets a row of its own).
ROW_BYTES = 16 * 1024
_HOLE_TIMEOUT_US = int(HOLE_TIMEOUT_S * 1_000_000)

# -- the encoding of items in a row -----------------------------------------------------------------
#
# A row's blob: the item count (u16), each item's end offset (u32, from the start of the items), then
# the items. An item: created, expire and enqueue time (i64 µs; enqueue ``_NONE`` when unset),
# attempts (u32), next priority (i8, -1: none), the byte lengths of reference, encoding, kind,
# source id, source queue and group (u16 each; all are under 2,000 bytes), those strings, and the
# payload (the rest). Its id is not stored: it is the position's. A lease deadline is not stored:
# it is the record's. 41 bytes beside the payload, so 100 items of 100 B make one row.
#
# An item that failed (``Item.failures``, ``Item.last_reason``) has ``_FAILED`` added to its next
# priority byte (31-41 then, never a priority) and, after its strings, its failure count (u32), the
# byte length of its reason (u16) and the reason: 6 bytes and the reason, only on items that failed,
# so the row of an item that never did is byte for byte what it was (and rows written before
# failures were kept read as they did).

_ITEM = struct.Struct("<qqqIb6H")
_FAILED = 32
_FAILURE = struct.Struct("<IH")
_ITEM_SIZE = _ITEM.size
_NO_LENGTHS = [0, 0, 0, 0, 0, 0]
_EPOCH = utc_from_timestamp_us(0)
_COUNT = struct.Struct("<H")
_NONE = -(2**63)
_FILLER = None


#: Recent times in µs: the items of one produce share their times (a dict hit costs a sixth of a
#: conversion; datetimes keep their hash).
_STAMPS: dict[datetime, int] = {}


def _stamp(value: datetime) -> int:
    us = _STAMPS.get(value)
    if us is None:
        if len(_STAMPS) > 256:
            _STAMPS.clear()
        us = _STAMPS[value] = timestamp_us(value)
    return us


def encode_item(item: Item) -> tuple[bytes, int]:
    """``item`` as stored in a row, and its ``reply_size`` (computed from the same bytes)."""
    enqueue = _NONE if item.enqueue_at is None else _stamp(item.enqueue_at)
    priority = -1 if item.next_priority is None else item.next_priority
    created, expire = _stamp(item.created_at), _stamp(item.expire_deadline)
    failed = item.failures or item.last_reason
    if not (
        item.reference
        or item.encoding
        or item.kind
        or item.source_id
        or item.source_queue
        or item.group
        or failed
    ):
        payload = item.payload
        return _ITEM.pack(created, expire, enqueue, item.attempts, priority, 0, 0, 0, 0, 0, 0) + payload, len(
            payload
        )
    parts = [
        s.encode() for s in (item.reference, item.encoding, item.kind, item.source_id, item.source_queue)
    ]
    group = item.group.encode()
    reason = item.last_reason.encode()
    header = _ITEM.pack(
        created,
        expire,
        enqueue,
        item.attempts,
        priority + _FAILED if failed else priority,
        *(len(p) for p in parts),
        len(group),
    )
    failure = _FAILURE.pack(item.failures, len(reason)) + reason if failed else b""
    reply = len(item.payload) + 2 * (len(parts[0]) + len(parts[1]) + len(parts[2]) + len(group) + len(reason))
    return b"".join((header, *parts, group, failure, item.payload)), reply


_ONE = struct.Struct("<HI")


def pack_row(encoded: Sequence[bytes]) -> bytes:
    """One row's blob from its items' encodings."""
    if len(encoded) == 1:
        data = encoded[0]
        return _ONE.pack(1, len(data)) + data
    ends, end = [], 0
    for data in encoded:
        end += len(data)
        ends.append(end)
    return b"".join((_COUNT.pack(len(encoded)), struct.pack(f"<{len(ends)}I", *ends), *encoded))


_END = struct.Struct("<I")
_ENDS = struct.Struct("<II")


def decode_items(
    blob: bytes, first: int, positions: Iterable[int], lane: str, *, deadline: datetime | None, bump: int
) -> list[Item]:
    """The items at ``positions`` of the row starting at ``first``, under their ids, with
    ``deadline`` and attempts + ``bump``. Reads only those items' bytes (a claim of one item from a
    row of a hundred decodes one)."""
    base = 2 + 4 * _COUNT.unpack_from(blob)[0]
    # The items of one row mostly share their times: each converted once.
    times: dict[int, datetime] = {}
    found = []
    for position in positions:
        index = position - first
        if index:
            start, end = _ENDS.unpack_from(blob, 4 * index - 2)
        else:
            start, end = 0, _END.unpack_from(blob, 2)[0]
        start += base
        created, expire, enqueue, attempts, priority, *lengths = _ITEM.unpack_from(blob, start)
        at = start + _ITEM_SIZE
        if lengths == _NO_LENGTHS:
            reference = encoding = kind = source_id = source_queue = group = ""
        else:
            strings = []
            for length in lengths:
                strings.append(blob[at : at + length].decode())
                at += length
            reference, encoding, kind, source_id, source_queue, group = strings
        last_reason, failures = "", 0
        if priority >= _FAILED - 1:
            priority -= _FAILED
            failures, length = _FAILURE.unpack_from(blob, at)
            at += _FAILURE.size
            last_reason = blob[at : at + length].decode()
            at += length
        created_at = times.get(created)
        if created_at is None:
            created_at = times[created] = _EPOCH + timedelta(microseconds=created)
        expire_at = times.get(expire)
        if expire_at is None:
            expire_at = times[expire] = _EPOCH + timedelta(microseconds=expire)
        found.append(
            Item(
                id=f"{lane}{POSITION_MARK}{position:016x}",
                payload=blob[at : base + end],
                reference=reference,
                encoding=encoding,
                kind=kind,
                source_id=source_id,
                source_queue=source_queue,
                group=group,
                last_reason=last_reason,
                failures=failures,
                attempts=attempts + bump,
                lease_deadline=deadline,
                expire_deadline=expire_at,
                created_at=created_at,
                enqueue_at=None if enqueue == _NONE else _EPOCH + timedelta(microseconds=enqueue),
                next_priority=None if priority < 0 else priority,
            )
        )
    return found


def decode_scheduled(blob: bytes, item_id: str) -> Item:
    """A schedule row's item (a row of one) under its scheduled id."""
    item = decode_items(blob, 0, [0], "", deadline=None, bump=0)[0]
    return with_id(item, item_id)


# -- rows ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class HeadRow:
    """A log's head as stored."""

    tail: int = 0
    cursor: int = 0
    leases: int = 0
    leased: int = 0
    scheduled: int = 0
    largest: int = 0
    #: Waiting positions deleted (at or above the cursor), sorted; dropped as the cursor passes.
    tombstones: tuple[int, ...] = ()
    produced: int = 0
    completed: int = 0


@dataclass(frozen=True, slots=True)
class PackedRow:
    """Positions ``[first, first + count)``: a row's blob (``pack_row``), or ``None``: a filler."""

    first: int
    count: int
    blob: bytes | None
    #: The largest ``Item.reply_size`` in the row.
    largest: int = 0
    #: The sum of its items' ``created_at`` in whole seconds (``LogAges``; 0 for a filler).
    created: int = 0

    @property
    def end(self) -> int:
        return self.first + self.count


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A lease record: the unsettled positions of one run, as ``[start, end)`` ranges."""

    token: str
    run_start: int
    run_end: int
    deadline_us: int
    claimed_us: int
    pending: tuple[tuple[int, int], ...]
    #: Pending positions not written when claimed (and not found written since).
    holes: tuple[int, ...] = ()
    #: The sum of the pending items' ``created_at`` in whole seconds (``LogAges``; holes add nothing
    #: until they are found written).
    created: int = 0
    #: ``(position, priority)`` of pending positions given the priority they go back with
    #: (``set_next_priority``), by position.
    priorities: tuple[tuple[int, int], ...] = ()

    def positions(self) -> list[int]:
        return [p for start, end in self.pending for p in range(start, end)]

    def priorities_of(self, positions: Iterable[int]) -> tuple[tuple[int, int], ...]:
        """``priorities`` of ``positions`` only (what a record keeps when others leave it)."""
        if not self.priorities:
            return ()
        kept = set(positions)
        return tuple(pair for pair in self.priorities if pair[0] in kept)

    def with_priorities(self, items: dict[int, Item]) -> dict[int, Item]:
        """``items`` (by position) with the priorities they go back with."""
        for position, priority in self.priorities:
            item = items.get(position)
            if item is not None:
                items[position] = replace(item, next_priority=priority)
        return items

    def holds(self, position: int) -> bool:
        return any(start <= position < end for start, end in self.pending)

    @property
    def size(self) -> int:
        if len(self.pending) == 1:
            return self.pending[0][1] - self.pending[0][0]
        return sum(end - start for start, end in self.pending)


def ranges(positions: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Sorted positions as ``[start, end)`` ranges."""
    found: list[list[int]] = []
    for p in positions:
        if found and found[-1][1] == p:
            found[-1][1] = p + 1
        else:
            found.append([p, p + 1])
    return tuple((start, end) for start, end in found)


#: Tokens' random parts: they tell apart the records of one run (its splits), which a lock orders;
#: never guessed for access (an id is what a holder shows), so not ``secrets`` (a system call each).
_TOKENS = random.Random()  # noqa: S311


def run_token(run_start: int) -> str:
    """A new record's token: the run's first position (so tokens sort by run) and a random part."""
    return f"{run_start:016x}{_TOKENS.getrandbits(48):012x}"


def token_run(token: str) -> int:
    return int(token[:16], 16)


class LogRows(Protocol):
    """One transaction's view of the claim logs' rows. Positions are ``int``; times µs."""

    def head(self, key: LogKey) -> HeadRow | None: ...

    def advance(
        self, key: LogKey, count: int, max_leased: int | None = None
    ) -> tuple[int, int, tuple[int, ...]] | None:
        """The claim's fetch-and-add: move the cursor over up to ``count`` waiting positions (and
        no more than keep ``leased`` at or below ``max_leased``) and count them as one more lease of
        all of them; ``(start, end, tombstones)`` of the run (the tombstones are the head's, all at
        or after ``start``), ``None`` when none wait or the cap is reached."""
        ...

    def skip(self, key: LogKey) -> tuple[int, int, tuple[int, ...]] | None:
        """Move the cursor to the tail and drop the tombstones; ``(cursor, tail, tombstones)`` as
        they were, ``None`` for a log without a head."""
        ...

    def set_tombstones(self, key: LogKey, tombstones: tuple[int, ...]) -> None: ...

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
        """Fetch-and-add ``count`` on the tail (a new head's tail starts at ``start``); the first
        position taken. ``produce``: they are a produce's positions (``LogHead.produced`` counts
        them), not a move's or a reservation's; ``produced``: items produced beyond them (scheduled,
        or written at positions reserved before). Adds ``scheduled`` and raises ``largest``."""
        ...

    def add_counts(
        self, key: LogKey, *, leases: int = 0, leased: int = 0, scheduled: int = 0, completed: int = 0
    ) -> None: ...

    def next_times(self, key: LogKey) -> tuple[int | None, str | None]:
        """The earliest record deadline and the first scheduled id (``None``: none)."""
        ...

    def rows(self, key: LogKey, start: int, end: int, limit: int) -> list[PackedRow]:
        """Up to ``limit`` rows, by first position, from the one holding ``start`` (the last one
        starting at or before it, which may end before it) to the last starting before ``end``."""
        ...

    def put_rows(self, key: LogKey, rows: Sequence[PackedRow]) -> None: ...

    def record(self, key: LogKey, token: str) -> RunRecord | None: ...

    def records_of_run(self, key: LogKey, position: int) -> list[RunRecord]:
        """The records of the latest run that started at or before ``position``."""
        ...

    def records_after(self, key: LogKey, token: str, limit: int) -> list[RunRecord]:
        """Up to ``limit`` records with tokens after ``token``, in token (run) order."""
        ...

    def records_due(self, key: LogKey, deadline_us: int, limit: int) -> list[RunRecord]:
        """Up to ``limit`` records with deadlines at or before ``deadline_us``, earliest first."""
        ...

    def put_record(self, key: LogKey, record: RunRecord) -> None:
        """Insert or replace the record under its token."""
        ...

    def drop_record(self, key: LogKey, token: str) -> None: ...

    def scheduled(self, key: LogKey, after: str, until: str, limit: int) -> list[tuple[str, bytes]]:
        """Up to ``limit`` schedule rows ``(id, blob)`` with ids in ``(after, until]``, in id order."""
        ...

    def put_scheduled(self, key: LogKey, item_id: str, blob: bytes) -> None: ...

    def drop_scheduled(self, key: LogKey, item_id: str) -> bool:
        """Remove a schedule row; whether there was one."""
        ...

    def purge(self, key: LogKey, limit: int) -> int:
        """Delete up to ``limit`` rows of the log (rows, records, schedule, then the head)."""
        ...

    def created_sums(self, key: LogKey, start: int) -> tuple[int, int]:
        """``LogAges``' parts the store sums: the ``created`` of the rows starting at or after
        ``start``, and of every lease record."""
        ...


# -- the engine ---------------------------------------------------------------------------------------

_RECORDS_PAGE = 100
_ROWS_PAGE = 64
#: ``scheduled_id``'s random part is below this.
_UNIQUE = 16**10


def _guard_admits(guard: Guard, deadline_us: int, now_us: int) -> bool:
    """``guard`` on a lease record (every position of a record has been leased)."""
    if guard is Guard.ANY:
        return True
    if guard is Guard.LEASE_VALID:
        return deadline_us > now_us
    if guard in (Guard.LEASE_EXPIRED, Guard.NOT_VALIDLY_LEASED):
        return deadline_us <= now_us
    return False  # NEVER_LEASED


def created_of(data: bytes) -> int:
    """An encoded item's ``created_at`` in whole seconds (the first field of ``encode_item``'s)."""
    created: int = _CREATED.unpack_from(data)[0]
    return created // 1_000_000


_CREATED = struct.Struct("<q")


def _pack(positions: Sequence[int], encoded: Sequence[tuple[bytes, int]]) -> list[PackedRow]:
    """Rows of consecutive positions holding up to ``ROW_BYTES`` of items each, in order;
    ``encoded``: each item's bytes and reply size (``encode_item``)."""
    rows: list[PackedRow] = []
    first = size = largest = created = 0
    batch: list[bytes] = []
    for position, (data, reply) in zip(positions, encoded, strict=True):
        if batch and (size + len(data) > ROW_BYTES or position != first + len(batch)):
            rows.append(PackedRow(first, len(batch), pack_row(batch), largest, created))
            batch, size, largest, created = [], 0, 0, 0
        if not batch:
            first = position
        batch.append(data)
        size += len(data)
        largest = max(largest, reply)
        created += _CREATED.unpack_from(data)[0] // 1_000_000
    if batch:
        rows.append(PackedRow(first, len(batch), pack_row(batch), largest, created))
    return rows


def _created(items: Iterable[Item]) -> int:
    return sum(timestamp_us(item.created_at) // 1_000_000 for item in items)


def with_id(item: Item, item_id: str) -> Item:
    """``item`` as a log stores it under ``item_id`` (a lease deadline is a record's, not an item's)."""
    # ``dataclasses.replace`` reads the fields by name first: this is half its time.
    return Item(
        id=item_id,
        payload=item.payload,
        reference=item.reference,
        encoding=item.encoding,
        kind=item.kind,
        attempts=item.attempts,
        lease_deadline=None,
        expire_deadline=item.expire_deadline,
        created_at=item.created_at,
        enqueue_at=item.enqueue_at,
        source_id=item.source_id,
        source_queue=item.source_queue,
        next_priority=item.next_priority,
        group=item.group,
        last_reason=item.last_reason,
        failures=item.failures,
    )


class ClaimLogEngine:
    """``ClaimLog`` over ``LogRows``; subclasses provide ``_read`` and ``_write`` transactions."""

    def _read(self) -> AbstractContextManager[LogRows]:
        raise NotImplementedError

    def _write(self) -> AbstractContextManager[LogRows]:
        raise NotImplementedError

    # -- appends -----------------------------------------------------------------------------------

    def append(self, key: LogKey, items: Sequence[Item], *, now: datetime) -> list[Item]:
        with self._write() as rows:
            return self._append_in(rows, key, items, now, produced=True)

    def take_positions(self, key: LogKey, count: int, *, now: datetime, created: int = 0) -> list[str]:
        # ``created`` is not needed here: a row keeps its items' sum when it is written (``ages``).
        with self._write() as rows:
            first = rows.take(key, count, start=timestamp_us(now), produce=False)
        return [position_id(key.lane, p) for p in range(first, first + count)]

    def write_taken(
        self, key: LogKey, ids: Sequence[str], items: Sequence[Item], *, now: datetime
    ) -> list[Item]:
        # The items go to positions whatever their ``enqueue_at``: the writer took positions.
        if len(ids) != len(items):
            raise ValueError("write_taken needs one id per item")
        positions = []
        for item_id in ids:
            parsed = parse_position_id(item_id)
            if parsed is None or parsed[0] != key.lane:
                raise ValueError(f"{item_id!r} is not a position of this log")
            positions.append(parsed[1])
        with self._write() as rows:
            encoded = [encode_item(item) for item in items]
            placed = self._write_taken_in(rows, key, positions, encoded, now=now)
        return [with_id(item, position_id(key.lane, p)) for item, p in zip(items, placed, strict=True)]

    def _append_in(
        self, rows: LogRows, key: LogKey, items: Sequence[Item], now: datetime, *, produced: bool
    ) -> list[Item]:
        """``append`` inside a transaction already open. ``produced``: a produce (counted in
        ``LogHead.produced``; a scheduled item keeps a scheduled id it was given), else a move (a
        retry, an expiry, a promotion: a new id)."""
        if not items:
            return []
        now_us = timestamp_us(now)
        lane = key.lane
        later = [i for i, item in enumerate(items) if item.enqueue_at is not None and item.enqueue_at > now]
        if not later:
            encoded = [encode_item(item) for item in items]
            largest = max(size for _, size in encoded)
            first = rows.take(key, len(items), start=now_us, produce=produced, largest=largest)
            rows.put_rows(key, _pack(range(first, first + len(items)), encoded))
            return [with_id(item, position_id(lane, p)) for p, item in enumerate(items, first)]
        stored: list[Item | None] = [None] * len(items)
        largest = 0
        schedule = []
        for i in later:
            item = items[i]
            assert item.enqueue_at is not None  # noqa: S101 - chosen for it above
            due_us = timestamp_us(item.enqueue_at)
            given = parse_scheduled_id(item.id) if produced else None
            # The service mints scheduled ids so that items due together keep their produce order.
            item_id = (
                item.id if given == (lane, due_us) else scheduled_id(lane, due_us, secrets.randbelow(_UNIQUE))
            )
            data, size = encode_item(item)
            largest = max(largest, size)
            schedule.append((item_id, pack_row([data])))
            stored[i] = with_id(item, item_id)
        now_indexes = [i for i in range(len(items)) if stored[i] is None]
        encoded = [encode_item(items[i]) for i in now_indexes]
        largest = max([largest, *(size for _, size in encoded)])
        first = rows.take(
            key,
            len(now_indexes),
            start=now_us,
            produce=produced,
            scheduled=len(later),
            largest=largest,
            produced=len(later) if produced else 0,
        )
        for item_id, blob in schedule:
            rows.put_scheduled(key, item_id, blob)
        rows.put_rows(key, _pack(range(first, first + len(now_indexes)), encoded))
        for p, i in enumerate(now_indexes, first):
            stored[i] = with_id(items[i], position_id(lane, p))
        return [item for item in stored if item is not None]

    def _write_taken_in(
        self,
        rows: LogRows,
        key: LogKey,
        positions: Sequence[int],
        encoded: Sequence[tuple[bytes, int]],
        *,
        now: datetime,
    ) -> list[int]:
        """Write the items at ``positions``, row by row; a row that finds one of its positions
        filled, or passed by the cursor without a lease holding it as a hole (``skip_waiting``),
        moves to new positions at the tail with every row after it. A row found written as it
        would be (an earlier try of this write) is left as it is. Where each item went."""
        packed = _pack(positions, encoded)
        head = rows.head(key)
        cursor = 0 if head is None else head.cursor
        runs: dict[int, list[RunRecord]] = {}
        done = written = 0
        fresh: list[PackedRow] = []
        for row in packed:
            found = [f for f in rows.rows(key, row.first, row.end, row.count + 1) if f.end > row.first]
            if (
                found
                and len(found) == 1
                and found[0].blob is not None
                and (found[0].first, found[0].count) == (row.first, row.count)
            ):
                done += row.count  # written by an earlier try
                continue
            if found or any(
                p < cursor and not self._hole_held(rows, key, p, runs) for p in range(row.first, row.end)
            ):
                rest = len(encoded) - done
                largest = max(size for _, size in encoded)
                first = rows.take(
                    key, rest, start=timestamp_us(now), produce=True, largest=largest, produced=written
                )
                moved = list(range(first, first + rest))
                rows.put_rows(key, fresh + _pack(moved, encoded[done:]))
                return list(positions[:done]) + moved
            fresh.append(row)
            done += row.count
            written += row.count
        if fresh:
            rows.put_rows(key, fresh)
        largest = max((size for _, size in encoded), default=0)
        rows.take(key, 0, start=timestamp_us(now), produce=False, largest=largest, produced=written)
        return list(positions)

    def _hole_held(self, rows: LogRows, key: LogKey, position: int, runs: dict[int, list[RunRecord]]) -> bool:
        """Whether a lease holds ``position`` (below the cursor) as a hole it waits for."""
        record = self._record_holding(rows, key, position, runs)
        return record is not None and position in record.holes

    # -- reads -------------------------------------------------------------------------------------

    def head(self, key: LogKey) -> LogHead:
        with self._read() as rows:
            head = rows.head(key)
            if head is None:
                return LogHead()
            expiry, due = rows.next_times(key)
        return LogHead(
            tail=head.tail,
            cursor=head.cursor,
            skipped=len(head.tombstones),
            leases=head.leases,
            leased=head.leased,
            scheduled=head.scheduled,
            next_expiry=None if expiry is None else utc_from_timestamp_us(expiry),
            next_due=None if due is None else _due_of(due),
            largest=head.largest,
            produced=head.produced,
            completed=head.completed,
        )

    def ages(self, key: LogKey) -> LogAges:
        # Waiting: the rows from the cursor on (a sum the store keeps per row), less the part of the
        # row holding the cursor before it and the positions deleted while waiting; leased: the
        # records' sums. A stats call's read, O(rows waiting) in the store's own sum, not decoded.
        with self._read() as rows:
            head = rows.head(key)
            if head is None:
                return LogAges()
            waiting, leased = rows.created_sums(key, head.cursor)
            holding = rows.rows(key, head.cursor, head.cursor + 1, 1)
            if holding and holding[0].first < head.cursor < holding[0].end:
                row = holding[0]
                found, _ = self._items_at(rows, key, range(head.cursor, row.end), deadline=None, bump=0)
                waiting += _created(found.values())
            if head.tombstones:
                buried, _ = self._items_at(rows, key, list(head.tombstones), deadline=None, bump=0)
                waiting -= _created(buried.values())
        return LogAges(waiting_created=waiting, leased_created=leased)

    @staticmethod
    def _items_at(
        rows: LogRows, key: LogKey, positions: Sequence[int], *, deadline: datetime | None, bump: int
    ) -> tuple[dict[int, Item], set[int]]:
        """The items stored at ``positions`` (sorted, of one run: a bounded range), and the ones
        filled (a filler row). The rest are holes."""
        found: dict[int, Item] = {}
        filled: set[int] = set()
        if not positions:
            return found, filled
        lane = key.lane
        at, end = positions[0], positions[-1] + 1
        index = 0
        while at < end and index < len(positions):
            page = rows.rows(key, at, end, _ROWS_PAGE)
            for row in page:
                while index < len(positions) and positions[index] < row.first:
                    index += 1  # a hole
                wanted = []
                while index < len(positions) and positions[index] < row.end:
                    wanted.append(positions[index])
                    index += 1
                if not wanted:
                    continue
                if row.blob is None:
                    filled.update(wanted)
                    continue
                items = decode_items(row.blob, row.first, wanted, lane, deadline=deadline, bump=bump)
                found.update(zip(wanted, items, strict=True))
            if len(page) < _ROWS_PAGE:
                break
            at = page[-1].end
        return found, filled

    def get(self, key: LogKey, ids: Sequence[str], *, now: datetime) -> dict[str, Item]:
        found: dict[str, Item] = {}
        with self._read() as rows:
            head = rows.head(key)
            if head is None:
                return found
            runs: dict[int, list[RunRecord]] = {}
            for item_id in dict.fromkeys(ids):
                scheduled = parse_scheduled_id(item_id)
                if scheduled is not None and scheduled[0] == key.lane:
                    for sid, blob in rows.scheduled(key, _before(item_id), item_id, 1):
                        if sid == item_id:
                            found[sid] = decode_scheduled(blob, sid)
                    continue
                parsed = parse_position_id(item_id)
                if parsed is None or parsed[0] != key.lane:
                    continue
                p = parsed[1]
                if p >= head.cursor:
                    if p < head.tail and p not in head.tombstones:
                        items, _ = self._items_at(rows, key, [p], deadline=None, bump=0)
                        if p in items:
                            found[item_id] = items[p]
                    continue
                record = self._record_holding(rows, key, p, runs)
                if record is not None and p not in record.holes:
                    items, _ = self._items_at(
                        rows, key, [p], deadline=utc_from_timestamp_us(record.deadline_us), bump=1
                    )
                    if p in items:
                        found[item_id] = record.with_priorities(items)[p]
        return found

    def list_items(self, key: LogKey, *, after: str, limit: int, now: datetime) -> list[Item]:
        lane = key.lane
        listed: list[Item] = []
        if limit <= 0:
            return listed
        with self._read() as rows:
            head = rows.head(key)
            if head is None:
                return listed
            start = _first_position_after(lane, after)
            if start is not None and start < head.cursor:
                self._list_leased(rows, key, start, head.cursor, limit, listed)
            if start is not None and len(listed) < limit:
                self._list_waiting(rows, key, max(start, head.cursor), head, limit, listed)
            if len(listed) < limit:
                mark = lane + SCHEDULED_MARK
                for sid, blob in rows.scheduled(key, max(after, mark), mark + "~", limit - len(listed)):
                    listed.append(decode_scheduled(blob, sid))
        return listed

    def _list_leased(
        self, rows: LogRows, key: LogKey, start: int, cursor: int, limit: int, listed: list[Item]
    ) -> None:
        # Runs come in position order, each whole (the records of one run, its splits, interleave).
        found: list[Item] = []
        records = rows.records_of_run(key, start)
        while True:
            for record in records:
                positions = [p for p in record.positions() if start <= p < cursor and p not in record.holes]
                deadline = utc_from_timestamp_us(record.deadline_us)
                items, _ = self._items_at(rows, key, positions, deadline=deadline, bump=1)
                record.with_priorities(items)
                found.extend(items[p] for p in positions if p in items)
            if len(found) >= limit:
                break
            after = max(r.token for r in records) if records else f"{start:016x}"
            # A record holds at least one position: a page of ``limit`` is enough, but for splits.
            size = min(_RECORDS_PAGE, limit - len(found) + 1)
            page = rows.records_after(key, after, size)
            if not page:
                break
            if len(page) == size:
                # The last run may go on in the next page: it is read whole there.
                last_run = token_run(page[-1].token)
                whole = [r for r in page if token_run(r.token) != last_run]
                page = whole or rows.records_of_run(key, last_run)
            records = page
        found.sort(key=lambda item: item.id)
        listed.extend(found[:limit])

    def _list_waiting(
        self, rows: LogRows, key: LogKey, start: int, head: HeadRow, limit: int, listed: list[Item]
    ) -> None:
        at = start
        tombstones = set(head.tombstones)
        while at < head.tail and len(listed) < limit:
            page = rows.rows(key, at, head.tail, _ROWS_PAGE)
            for row in page:
                if row.blob is None or row.end <= at:
                    continue
                wanted = [p for p in range(max(row.first, at), row.end) if p not in tombstones]
                wanted = wanted[: limit - len(listed)]
                listed.extend(decode_items(row.blob, row.first, wanted, key.lane, deadline=None, bump=0))
                if len(listed) >= limit:
                    return
            if len(page) < _ROWS_PAGE:
                return
            at = page[-1].end

    # -- claims ------------------------------------------------------------------------------------

    def claim(
        self,
        key: LogKey,
        *,
        count: int,
        deadline: datetime,
        now: datetime,
        max_leased: int | None = None,
    ) -> Claim:
        if count <= 0:
            return Claim(token="", deadline=deadline)
        with self._write() as rows:
            run = rows.advance(key, count, max_leased)
            if run is None:
                return Claim(token="", deadline=deadline)
            start, end, tombstones = run
            wanted: Sequence[int] = range(start, end)
            skipped = [p for p in tombstones if p < end]
            if skipped:
                wanted = [p for p in wanted if p not in skipped]
                rows.set_tombstones(key, tombstones[len(skipped) :])
            items, filled = self._items_at(rows, key, wanted, deadline=deadline, bump=1)
            held = [p for p in wanted if p not in filled] if filled else wanted
            holes = tuple(p for p in held if p not in items) if len(items) < len(held) else ()
            # ``advance`` counted the whole run as one lease: less what it does not hold.
            if len(held) < end - start:
                rows.add_counts(key, leases=0 if held else -1, leased=len(held) - (end - start))
            token = ""
            if held:
                token = run_token(start)
                record = RunRecord(
                    token=token,
                    run_start=start,
                    run_end=end,
                    deadline_us=timestamp_us(deadline),
                    claimed_us=timestamp_us(now),
                    pending=((start, end),) if held is wanted and not skipped else ranges(held),
                    holes=holes,
                    created=_created(items.values()),
                )
                rows.put_record(key, record)
        return Claim(
            token=token,
            deadline=deadline,
            items=list(items.values()) if len(items) == len(held) else [items[p] for p in held if p in items],
            holes=[position_id(key.lane, p) for p in holes],
        )

    def collect(self, key: LogKey, token: str, *, now: datetime) -> Claim:
        with self._write() as rows:
            record = rows.record(key, token)
            if record is None:
                return Claim(token=token, deadline=now)
            deadline = utc_from_timestamp_us(record.deadline_us)
            if not record.holes:
                return Claim(token=token, deadline=deadline)
            timed_out = timestamp_us(now) - record.claimed_us >= _HOLE_TIMEOUT_US
            items, still = self._settle_holes(rows, key, record, deadline=deadline, fill=timed_out)
        return Claim(
            token=token, deadline=deadline, items=items, holes=[position_id(key.lane, p) for p in still]
        )

    def _settle_holes(
        self, rows: LogRows, key: LogKey, record: RunRecord, *, deadline: datetime, fill: bool
    ) -> tuple[list[Item], tuple[int, ...]]:
        """Read ``record``'s holes again: the written ones become items of the lease; with ``fill``
        the rest are filled (done, and a late writer of them moves to the tail). Writes the record
        (and drops it when nothing is left); returns the items found and the holes still open."""
        holes = record.holes
        items, filled = self._items_at(rows, key, list(holes), deadline=deadline, bump=1)
        # A hole found filled was filled by this log already (another collect): done as well.
        still = tuple(p for p in holes if p not in items)
        if fill and still:
            rows.put_rows(
                key, [PackedRow(a, b - a, _FILLER) for a, b in ranges(p for p in still if p not in filled)]
            )
            done = set(still)
            pending = ranges(p for p in record.positions() if p not in done)
            still = ()
            if pending:
                kept = record.priorities_of(p for p in record.positions() if p not in done)
                rows.put_record(
                    key,
                    replace(
                        record,
                        pending=pending,
                        holes=(),
                        priorities=kept,
                        created=record.created + _created(items.values()),
                    ),
                )
                rows.add_counts(key, leased=-len(done))
            else:
                rows.drop_record(key, record.token)
                rows.add_counts(key, leases=-1, leased=-len(done))
        elif still != holes:
            rows.put_record(
                key, replace(record, holes=still, created=record.created + _created(items.values()))
            )
        return [items[p] for p in holes if p in items], still

    def expired(self, key: LogKey, *, now: datetime, limit: int) -> list[LeaseRun]:
        runs: list[LeaseRun] = []
        with self._write() as rows:
            for record in rows.records_due(key, timestamp_us(now), limit):
                deadline = utc_from_timestamp_us(record.deadline_us)
                if record.holes:
                    self._settle_holes(rows, key, record, deadline=deadline, fill=True)
                    found = rows.record(key, record.token)
                    if found is None:
                        continue
                    record = found  # noqa: PLW2901 - the same record, its holes settled
                positions = record.positions()
                items, _ = self._items_at(rows, key, positions, deadline=deadline, bump=1)
                record.with_priorities(items)
                runs.append(
                    LeaseRun(
                        token=record.token,
                        deadline=deadline,
                        items=[items[p] for p in positions if p in items],
                    )
                )
        return runs

    # -- settling ----------------------------------------------------------------------------------

    @staticmethod
    def _record_holding(
        rows: LogRows, key: LogKey, position: int, runs: dict[int, list[RunRecord]]
    ) -> RunRecord | None:
        """The record holding ``position`` unsettled, through ``runs`` (the records of the runs read
        so far in this call, by their first position, as changed by it)."""
        for run_start, records in runs.items():
            if records and run_start <= position < records[0].run_end:
                break
        else:
            records = rows.records_of_run(key, position)
            if not records:
                return None
            runs[records[0].run_start] = records
        for record in records:
            if record.holds(position):
                return record
        return None

    def settle(
        self,
        key: LogKey,
        settlements: Sequence[Settlement],
        *,
        guard: Guard,
        now: datetime,
        completed: bool = False,
    ) -> Settled:
        with self._write() as rows:
            return self._settle_in(rows, key, settlements, guard=guard, now=now, completed=completed)

    def _settle_in(
        self,
        rows: LogRows,
        key: LogKey,
        settlements: Sequence[Settlement],
        *,
        guard: Guard,
        now: datetime,
        completed: bool = False,
    ) -> Settled:
        """``settle`` inside a transaction already open: leased positions by their record's
        deadline; with ``ANY`` and ``NOT_VALIDLY_LEASED`` also waiting positions (a tombstone) and
        scheduled items (their schedule row goes)."""
        result = Settled()
        now_us = timestamp_us(now)
        settled: dict[str, tuple[RunRecord, set[int]]] = {}
        runs: dict[int, list[RunRecord]] = {}
        moves: dict[LogKey, list[tuple[str, Item]]] = {}
        seen: set[str] = set()
        unleased = guard in (Guard.ANY, Guard.NOT_VALIDLY_LEASED)
        head = rows.head(key) if unleased else None
        tombstones = set(head.tombstones) if head is not None else set()
        buried = unscheduled = done = 0
        for settlement in settlements:
            item_id = settlement.id
            if item_id in seen:
                continue
            seen.add(item_id)
            applied = False
            scheduled = parse_scheduled_id(item_id) if head is not None else None
            if scheduled is not None:
                applied = scheduled[0] == key.lane and rows.drop_scheduled(key, item_id)
                unscheduled += applied
            else:
                parsed = parse_position_id(item_id)
                if parsed is None or parsed[0] != key.lane:
                    pass
                elif head is not None and parsed[1] >= head.cursor:
                    # Waiting: a tombstone every later claim skips (a hole names nothing stored).
                    p = parsed[1]
                    if (
                        p < head.tail
                        and p not in tombstones
                        and self._items_at(rows, key, [p], deadline=None, bump=0)[0]
                    ):
                        tombstones.add(p)
                        buried += 1
                        applied = True
                else:
                    record = self._record_holding(rows, key, parsed[1], runs)
                    if record is not None and _guard_admits(guard, record.deadline_us, now_us):
                        # Ids are unique here (``seen``), and so are their positions.
                        settled.setdefault(record.token, (record, set()))[1].add(parsed[1])
                        applied = True
            if not applied:
                result.rejected.append(item_id)
                continue
            result.applied.append(item_id)
            if settlement.to is not None and settlement.item is not None:
                moves.setdefault(settlement.to, []).append((item_id, settlement.item))
            else:
                done += 1
        self._settle_positions(rows, key, settled.values(), completed=done if completed else 0)
        if buried:
            assert head is not None  # noqa: S101 - only read from it
            rows.set_tombstones(key, tuple(sorted(tombstones)))
        if unscheduled:
            rows.add_counts(key, scheduled=-unscheduled)
        for target, entries in moves.items():
            stored = self._append_in(rows, target, [item for _, item in entries], now, produced=False)
            result.moved.update(zip((i for i, _ in entries), (item.id for item in stored), strict=True))
        return result

    def _held(
        self, rows: LogRows, key: LogKey, item_id: str, runs: dict[int, list[RunRecord]]
    ) -> tuple[RunRecord, int] | None:
        parsed = parse_position_id(item_id)
        if parsed is None or parsed[0] != key.lane:
            return None
        record = self._record_holding(rows, key, parsed[1], runs)
        return None if record is None else (record, parsed[1])

    @staticmethod
    def _settle_positions(
        rows: LogRows, key: LogKey, settled: Iterable[tuple[RunRecord, set[int]]], *, completed: int = 0
    ) -> None:
        """Mark the positions of each record done: a hole among them is filled (its writer, if it
        was only late, moves to the tail); a record left with nothing is dropped."""
        leases = leased = 0
        for record, done in settled:
            holes = [p for p in record.holes if p in done]
            if holes:
                rows.put_rows(key, [PackedRow(a, b - a, _FILLER) for a, b in ranges(holes)])
            leased -= len(done)
            if record.size == len(done):
                rows.drop_record(key, record.token)
                leases -= 1
                continue
            left = [p for p in record.positions() if p not in done]
            # A part of the record settles: what its items' ages added goes (a read of their rows).
            gone, _ = ClaimLogEngine._items_at(rows, key, sorted(done), deadline=None, bump=0)
            rows.put_record(
                key,
                replace(
                    record,
                    pending=ranges(left),
                    holes=tuple(p for p in record.holes if p not in done),
                    priorities=record.priorities_of(left),
                    # Never below zero: a record written before schema 8 kept no sum.
                    created=max(record.created - _created(gone.values()), 0),
                ),
            )
        if leases or leased or completed:
            rows.add_counts(key, leases=leases, leased=leased, completed=completed)

    def renew(
        self, key: LogKey, ids: Sequence[str], *, deadline: datetime, now: datetime
    ) -> BatchResult[str]:
        result: BatchResult[str] = BatchResult()
        now_us, deadline_us = timestamp_us(now), timestamp_us(deadline)
        with self._write() as rows:
            runs: dict[int, list[RunRecord]] = {}
            chosen: dict[str, tuple[RunRecord, set[int]]] = {}
            for item_id in dict.fromkeys(ids):
                held = self._held(rows, key, item_id, runs)
                if held is None or held[0].deadline_us <= now_us:
                    result.rejected.append(item_id)
                    continue
                chosen.setdefault(held[0].token, (held[0], set()))[1].add(held[1])
                result.applied.append(item_id)
            split = 0
            for record, positions in chosen.values():
                if len(positions) == record.size:
                    rows.put_record(key, replace(record, deadline_us=deadline_us))
                    continue
                # A part of the record: it moves to a record of its own (the same run), with what
                # its items' ages add.
                left = [p for p in record.positions() if p not in positions]
                moved, _ = self._items_at(rows, key, sorted(positions), deadline=None, bump=0)
                moved_created = min(_created(moved.values()), record.created)
                rows.put_record(
                    key,
                    replace(
                        record,
                        pending=ranges(left),
                        holes=tuple(p for p in record.holes if p not in positions),
                        priorities=record.priorities_of(left),
                        created=record.created - moved_created,
                    ),
                )
                rows.put_record(
                    key,
                    replace(
                        record,
                        token=run_token(record.run_start),
                        deadline_us=deadline_us,
                        pending=ranges(sorted(positions)),
                        holes=tuple(p for p in record.holes if p in positions),
                        priorities=record.priorities_of(positions),
                        created=moved_created,
                    ),
                )
                split += 1
            if split:
                rows.add_counts(key, leases=split)
        return result

    def set_next_priority(
        self, key: LogKey, ids: Sequence[str], *, priority: int, now: datetime
    ) -> BatchResult[str]:
        result: BatchResult[str] = BatchResult()
        now_us = timestamp_us(now)
        with self._write() as rows:
            runs: dict[int, list[RunRecord]] = {}
            chosen: dict[str, tuple[RunRecord, set[int]]] = {}
            for item_id in dict.fromkeys(ids):
                held = self._held(rows, key, item_id, runs)
                # A hole is not the holder's yet (``get`` does not return it): nothing to give.
                if held is None or held[0].deadline_us <= now_us or held[1] in held[0].holes:
                    result.rejected.append(item_id)
                    continue
                chosen.setdefault(held[0].token, (held[0], set()))[1].add(held[1])
                result.applied.append(item_id)
            for record, positions in chosen.values():
                given = dict(record.priorities)
                given.update(dict.fromkeys(positions, priority))
                rows.put_record(key, replace(record, priorities=tuple(sorted(given.items()))))
        return result

    def delete(self, key: LogKey, ids: Sequence[str], *, now: datetime) -> BatchResult[str]:
        with self._write() as rows:
            return self._settle_in(rows, key, [Settlement(id=i) for i in ids], guard=Guard.ANY, now=now)

    def skip_waiting(self, key: LogKey, *, now: datetime) -> int:
        # Holes among the skipped positions need no filler: a late writer finds them behind the
        # cursor and held by no lease, and moves to the tail (``_write_taken_in``).
        with self._write() as rows:
            skipped = rows.skip(key)
        if skipped is None:
            return 0
        cursor, tail, tombstones = skipped
        return tail - cursor - len(tombstones)

    # -- the schedule --------------------------------------------------------------------------------

    def promote(self, key: LogKey, *, now: datetime, limit: int) -> int:
        lane = key.lane
        until = scheduled_id(lane, timestamp_us(now), _UNIQUE - 1)
        with self._write() as rows:
            due = rows.scheduled(key, "", until, limit)
            if not due:
                return 0
            items = []
            for sid, blob in due:
                rows.drop_scheduled(key, sid)
                items.append(decode_scheduled(blob, sid))
            rows.add_counts(key, scheduled=-len(due))
            self._append_in(rows, key, items, now, produced=False)
        return len(due)

    def purge(self, key: LogKey, *, limit: int) -> int:
        with self._write() as rows:
            return rows.purge(key, limit)


def _before(item_id: str) -> str:
    """A string just below ``item_id`` (for an inclusive range that starts at it)."""
    return item_id[:-1] + chr(ord(item_id[-1]) - 1) + "~"


def _due_of(sid: str) -> datetime:
    parsed = parse_scheduled_id(sid)
    assert parsed is not None  # noqa: S101 - the schedule holds scheduled ids only
    return utc_from_timestamp_us(parsed[1])


def _first_position_after(lane: str, after: str) -> int | None:
    """The first position whose id sorts after ``after`` (``None``: none does)."""
    parsed = parse_position_id(after)
    if parsed is not None and parsed[0] == lane:
        return parsed[1] + 1
    mark = lane + POSITION_MARK
    if after < mark:
        return 0
    if not after.startswith(mark):
        return None
    digits = after[len(mark) :][:16]
    try:
        value = int(digits.ljust(16, "0"), 16)
    except ValueError:
        return None
    # A shorter id sorts before its padding; a full one at its value.
    return value if len(digits) < 16 else value + 1


__all__ = [
    "ROW_BYTES",
    "ClaimLogEngine",
    "HeadRow",
    "LogRows",
    "PackedRow",
    "RunRecord",
    "decode_items",
    "encode_item",
    "pack_row",
    "with_id",
]
