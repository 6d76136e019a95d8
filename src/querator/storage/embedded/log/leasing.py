"""Storage layer, engine v3's claim log in the embedded stores, the leasing role: claims, collecting
holes, settling, renewing and reprioritizing leased positions."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from querator.domain.model import Item, reply_bytes_at_most, timestamp_us, utc_from_timestamp_us
from querator.domain.positions import parse_position_id, parse_scheduled_id, position_id
from querator.ports import BatchResult, Guard
from querator.ports.log import Claim, Settled, Settlement
from querator.storage.embedded.log.base import (
    _FILLER,
    _HOLE_TIMEOUT_US,
    LogEngineBase,
    LogRows,
    PackedRow,
    RunRecord,
    _created,
    ranges,
    run_token,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from datetime import datetime

    from querator.ports.log import LogKey


def _guard_admits(guard: Guard, deadline_us: int, now_us: int) -> bool:
    """``guard`` on a lease record (every position of a record has been leased)."""
    if guard is Guard.ANY:
        return True
    if guard is Guard.LEASE_VALID:
        return deadline_us > now_us
    if guard in (Guard.LEASE_EXPIRED, Guard.NOT_VALIDLY_LEASED):
        return deadline_us <= now_us
    return False  # NEVER_LEASED


class LogLeasing(LogEngineBase):
    """``LogLeasingPort`` over ``LogRows``."""

    def claim(
        self,
        key: LogKey,
        *,
        count: int,
        deadline: datetime,
        now: datetime,
        max_leased: int | None = None,
        room: int | None = None,
    ) -> Claim:
        if count <= 0:
            return Claim(token="", deadline=deadline)
        with self._write() as rows:
            if room is not None:
                # Sized by the head as this transaction sees it: an item appended since the caller
                # read the head is either larger and counted here, or not in the run.
                head = rows.head(key)
                count = min(count, room // reply_bytes_at_most(0 if head is None else head.largest))
                if count <= 0:
                    return Claim(token="", deadline=deadline)
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
            gone, _ = LogEngineBase._items_at(rows, key, sorted(done), deadline=None, bump=0)
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
