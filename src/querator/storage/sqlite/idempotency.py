"""Storage layer, the SQLite store's idempotency role: the ``idempotency`` table, expired by
``expires_s``."""

from __future__ import annotations

from querator.domain.ids import join_ids, split_ids
from querator.domain.model import timestamp_us, utc_from_timestamp_us
from querator.ports import IdempotencyRecord
from querator.storage.sqlite.base import SQLiteRowsBase


class SQLiteIdempotencyRows(SQLiteRowsBase):
    """The idempotency records of ``embedded.base.Rows`` in SQLite."""

    def idempotency(self, queue: str, key: str) -> tuple[IdempotencyRecord, int] | None:
        row = self._c.execute(
            "SELECT part, ids, done, started_us, queue_created_us, expires_s FROM idempotency"
            " WHERE queue = ? AND key = ?",
            (queue, key),
        ).fetchone()
        if row is None:
            return None
        part, ids, done, started, created, expires = row
        record = IdempotencyRecord(
            key=key,
            partition=part,
            ids=split_ids(ids),
            done=bool(done),
            started_at=utc_from_timestamp_us(started),
            queue_created_at=utc_from_timestamp_us(created),
        )
        return record, expires

    def drop_expired_idempotency(self, now_s: int, limit: int) -> None:
        self._c.execute(
            "DELETE FROM idempotency WHERE (queue, key) IN"
            " (SELECT queue, key FROM idempotency WHERE expires_s < ? ORDER BY expires_s LIMIT ?)",
            (now_s, limit),
        )

    def put_idempotency(self, queue: str, record: IdempotencyRecord, expires_s: int) -> None:
        self._c.execute(
            "INSERT OR REPLACE INTO idempotency VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                queue,
                record.key,
                record.partition,
                join_ids(record.ids),
                int(record.done),
                timestamp_us(record.started_at),
                timestamp_us(record.queue_created_at),
                expires_s,
            ),
        )
