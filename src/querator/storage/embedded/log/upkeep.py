"""Storage layer, engine v3's claim log in the embedded stores, the upkeep role: expired leases, the
schedule's promotion, ages, clearing and purging."""

from __future__ import annotations

from typing import TYPE_CHECKING

from querator.domain.model import timestamp_us, utc_from_timestamp_us
from querator.domain.positions import scheduled_id
from querator.ports.log import LeaseRun, LogAges
from querator.storage.embedded.log.base import _UNIQUE, LogEngineBase, _created
from querator.storage.embedded.log.codec import decode_scheduled

if TYPE_CHECKING:
    from datetime import datetime

    from querator.ports.log import LogKey


class LogUpkeep(LogEngineBase):
    """``LogUpkeepPort`` over ``LogRows``."""

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

    def skip_waiting(self, key: LogKey, *, now: datetime) -> int:
        # Holes among the skipped positions need no filler: a late writer finds them behind the
        # cursor and held by no lease, and moves to the tail (``_write_taken_in``).
        with self._write() as rows:
            skipped = rows.skip(key)
        if skipped is None:
            return 0
        cursor, tail, tombstones = skipped
        return tail - cursor - len(tombstones)

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
