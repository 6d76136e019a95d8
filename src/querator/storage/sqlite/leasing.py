"""Storage layer, the SQLite store's leasing role: a claim's check and write in one ``UPDATE ...
RETURNING``, a lease's counters and cursor in one ``UPDATE``, the ``lease_records`` table, and
lease rate-limit buckets (``rate_buckets``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from querator.domain.ids import join_ids, split_ids
from querator.domain.model import Item, timestamp_us, utc_from_timestamp_us
from querator.domain.priority import lane_of
from querator.ports import BatchResult, LeaseRecord, PartitionHead
from querator.storage.counters import CounterDeltas, scheduled_until_claimed
from querator.storage.embedded.leasing import RowsLeasing, open_before
from querator.storage.sqlite.base import _ITEM_COLUMNS, _RETURNING, SQLiteRowsBase, SQLiteStoreBase, _item

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime


_CLAIM_ITEM = (
    "UPDATE items SET lease_us = ?, attempts = attempts + 1"  # noqa: S608
    " WHERE queue = ? AND part = ? AND id = ? AND lease_us IS NULL AND expire_us > ?"
    f" RETURNING {_ITEM_COLUMNS}"
)


class SQLiteLeasingRows(SQLiteRowsBase):
    """The lease records and rate-limit buckets of ``embedded.base.Rows`` in SQLite, and the statements
    of SQLite's own claim and lease count."""

    def cursor_and_mark(self, queue: str, partition: int) -> tuple[str, str] | None:
        """The head's cursor (priority 5's) and schedule mark, read alone; ``None``: no head row."""
        known = self._heads.get((queue, partition))
        if known is not None:
            return known.cursor, known.schedule_mark
        row = self._c.execute(
            "SELECT cursor, schedule_mark FROM heads WHERE queue = ? AND part = ?", (queue, partition)
        ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    def note_claims(self, queue: str, partition: int, counts: CounterDeltas, cursor: str | None) -> None:
        """Add a lease's counters and set priority 5's cursor (``None``: it stays) in one ``UPDATE``
        of a head row that exists."""
        self._c.execute(
            "UPDATE heads SET leased = leased + ?, leased_created_sum = leased_created_sum + ?,"
            " scheduled = scheduled + ?, scheduled_created_sum = scheduled_created_sum + ?,"
            " version = version + ?, cursor = coalesce(?, cursor) WHERE queue = ? AND part = ?",
            (
                counts.leased,
                counts.leased_created,
                counts.scheduled,
                counts.scheduled_created,
                1 if counts.changed() else 0,
                cursor,
                queue,
                partition,
            ),
        )
        self._heads.pop((queue, partition), None)

    def claim_row(self, queue: str, partition: int, item_id: str, deadline_us: int, now_us: int) -> Any:
        """The item's row after leasing it until ``deadline_us``, if it was never leased and has not
        expired by ``now_us`` (``embedded.leasing``' claim condition, checked and written in one statement);
        ``None`` otherwise."""
        return self._c.execute(_CLAIM_ITEM, (deadline_us, queue, partition, item_id, now_us)).fetchone()

    def records_due(self, queue: str, partition: int, below: str, limit: int) -> list[LeaseRecord]:
        rows = self._c.execute(
            "SELECT key, deadline_us, ids FROM lease_records WHERE queue = ? AND part = ? AND key < ?"
            " ORDER BY key LIMIT ?",
            (queue, partition, below, limit),
        )
        return [
            LeaseRecord(
                key=key,
                deadline=utc_from_timestamp_us(deadline),
                ids=split_ids(ids),
            )
            for key, deadline, ids in rows
        ]

    def put_record(self, queue: str, partition: int, record: LeaseRecord) -> None:
        self._c.execute(
            "INSERT OR REPLACE INTO lease_records VALUES (?, ?, ?, ?, ?)",
            (queue, partition, record.key, timestamp_us(record.deadline), join_ids(record.ids)),
        )

    def drop_record(self, queue: str, partition: int, key: str) -> None:
        self._c.execute(
            "DELETE FROM lease_records WHERE queue = ? AND part = ? AND key = ?", (queue, partition, key)
        )

    def bucket(self, queue: str, key: str) -> int | None:
        row = self._c.execute(
            "SELECT tat_us FROM rate_buckets WHERE queue = ? AND bucket = ?", (queue, key)
        ).fetchone()
        return None if row is None else int(row[0])

    def put_bucket(self, queue: str, key: str, tat_us: int) -> None:
        self._c.execute("INSERT OR REPLACE INTO rate_buckets VALUES (?, ?, ?)", (queue, key, tat_us))


class SQLiteLeasing(RowsLeasing, SQLiteStoreBase):
    """``embedded.leasing``' claim and lease count, each in fewer statements."""

    def note_leased(
        self,
        queue: str,
        partition: int,
        items: Sequence[Item],
        *,
        cursor: str | None,
        ring: tuple[str, str] | None = None,
    ) -> None:
        # The engine's, reading of the head only the cursor and schedule mark and writing only the
        # counters and the cursor, for a lease in priority 5's band outside fair lanes (the usual
        # one); the engine's read and rewrite of the whole head for the others.
        if ring is not None or (cursor is not None and lane_of(cursor)):
            super().note_leased(queue, partition, items, cursor=cursor, ring=ring)
            return
        if not items and cursor is None:
            return
        with self._write() as rows:
            found = rows.cursor_and_mark(queue, partition)
            if found is None:
                self._note_leased_in(rows, queue, partition, items, cursor=cursor, ring=None)
                return
            old_cursor, mark = found
            counts = CounterDeltas()
            for item in items:
                # By the mark in this transaction: a schedule pass counts only items never leased.
                counts.lease(item.created_at, was_scheduled=scheduled_until_claimed(item, mark))
            if cursor is not None:
                cursor = open_before(rows, queue, partition, PartitionHead(cursor=old_cursor), cursor)
            rows.note_claims(queue, partition, counts, cursor)

    def claim(
        self, queue: str, partition: int, ids: Sequence[str], *, lease_deadline: datetime, now: datetime
    ) -> BatchResult[Item]:
        # The engine's, with each id's check and write one UPDATE ... RETURNING (not a read of the
        # whole row, a copy and a write of it back).
        if not _RETURNING:
            return super().claim(queue, partition, ids, lease_deadline=lease_deadline, now=now)
        result: BatchResult[Item] = BatchResult()
        deadline_us, now_us = timestamp_us(lease_deadline), timestamp_us(now)
        with self._write() as rows:
            for item_id in ids:
                row = rows.claim_row(queue, partition, item_id, deadline_us, now_us)
                if row is None:
                    result.rejected.append(item_id)
                else:
                    result.applied.append(_item(row))
        return result
