"""Storage layer, engine v3's claim log in the embedded stores, what every role uses: the rows as
stored (``HeadRow``, ``PackedRow``, ``RunRecord``), the rows a store gives (``LogRows``), and the
base of the role mixins (``LogEngineBase``) with the steps several roles take: an append inside a
transaction, reading positions, finding the record that holds one, settling a record's holes."""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from querator.domain.model import MAX_PAYLOAD_BYTES, Item, timestamp_us
from querator.domain.positions import HOLE_TIMEOUT_S, parse_scheduled_id, position_id, scheduled_id
from querator.storage.embedded.log.codec import (
    _CREATED,
    ROW_BYTES,
    decode_items,
    encode_item,
    pack_row,
    with_id,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from contextlib import AbstractContextManager
    from datetime import datetime

    from querator.ports import Guard
    from querator.ports.log import ClaimLog, LogKey, Settled, Settlement


_HOLE_TIMEOUT_US = int(HOLE_TIMEOUT_S * 1_000_000)


_FILLER = None


@dataclass(slots=True)
class HeadRow:
    """A log's head as stored."""

    tail: int = 0
    cursor: int = 0
    leases: int = 0
    leased: int = 0
    scheduled: int = 0
    #: The largest ``Item.reply_size`` that may wait, for sizing claims (the reply cap): raised by
    #: every append (and take) in its transaction, and back to ``REPLY_SIZE_THRESHOLD`` by a claim
    #: that leaves nothing waiting (a retry or an expiry that puts a large item back raises it).
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


_ROWS_PAGE = 64

#: ``scheduled_id``'s random part is below this.
_UNIQUE = 16**10


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


if TYPE_CHECKING:

    class _Port(ClaimLog, Protocol):
        """The port, and what one role's code calls of another's beyond it."""

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
            """The leasing role's (``leasing.LogLeasing._settle_in``), which the items role's
            ``delete`` calls."""
            ...

else:
    _Port = object


class LogEngineBase(_Port):
    """What the role mixins share: the transactions a store provides (``_read``, ``_write``), and
    the steps several roles take."""

    @property
    def payload_limit(self) -> int:
        """A packed row holds a payload of any size, so the API's limit is the log's."""
        return MAX_PAYLOAD_BYTES

    def sweep_payloads(self, *, now: datetime, limit: int) -> int:
        """Every payload is in its row, which goes with its item: nothing is left to sweep."""
        return 0

    def _read(self) -> AbstractContextManager[LogRows]:
        raise NotImplementedError

    def _write(self) -> AbstractContextManager[LogRows]:
        raise NotImplementedError

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
