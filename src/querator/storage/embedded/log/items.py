"""Storage layer, engine v3's claim log in the embedded stores, the items role: appends (at once, or
at positions taken first), the head, reads, listings and deletes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from querator.domain.model import Item, timestamp_us, utc_from_timestamp_us
from querator.domain.positions import (
    POSITION_MARK,
    SCHEDULED_MARK,
    parse_position_id,
    parse_scheduled_id,
    position_id,
)
from querator.ports import BatchResult, Guard
from querator.ports.log import LogHead, Settlement
from querator.storage.embedded.log.base import (
    _ROWS_PAGE,
    HeadRow,
    LogEngineBase,
    LogRows,
    PackedRow,
    RunRecord,
    _pack,
    token_run,
)
from querator.storage.embedded.log.codec import decode_items, decode_scheduled, encode_item, with_id

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from querator.ports.log import LogKey


_RECORDS_PAGE = 100


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


class LogItems(LogEngineBase):
    """``LogItemsPort`` over ``LogRows``."""

    def append(self, key: LogKey, items: Sequence[Item], *, now: datetime) -> list[Item]:
        with self._write() as rows:
            return self._append_in(rows, key, items, now, produced=True)

    def take_positions(
        self, key: LogKey, count: int, *, now: datetime, created: int = 0, largest: int = 0
    ) -> list[str]:
        # ``created`` is not needed here: a row keeps its items' sum when it is written (``ages``).
        with self._write() as rows:
            first = rows.take(key, count, start=timestamp_us(now), produce=False, largest=largest)
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

    def list_items(
        self,
        key: LogKey,
        *,
        after: str,
        limit: int,
        now: datetime,
        max_bytes: int | None = None,
        schedule: bool = True,
    ) -> list[Item]:
        listed = self._list(key, after=after, limit=limit, schedule=schedule)
        if max_bytes is None:
            return listed
        # As ``ClaimLog.list_items`` says: up to the item that takes the payloads past ``max_bytes``.
        for n, item in enumerate(listed):
            max_bytes -= len(item.payload)
            if max_bytes < 0:
                return listed[: n + 1]
        return listed

    def _list(self, key: LogKey, *, after: str, limit: int, schedule: bool) -> list[Item]:
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
            if schedule and len(listed) < limit:
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

    def delete(self, key: LogKey, ids: Sequence[str], *, now: datetime) -> BatchResult[str]:
        with self._write() as rows:
            return self._settle_in(rows, key, [Settlement(id=i) for i in ids], guard=Guard.ANY, now=now)
