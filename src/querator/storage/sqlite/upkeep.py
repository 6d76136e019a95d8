"""Storage layer, the SQLite store's upkeep role: the purge of a partition's rows (and, with its
first partition, a queue's idempotency records and rate-limit buckets)."""

from __future__ import annotations

from querator.storage.sqlite.base import SQLiteRowsBase


class SQLiteUpkeepRows(SQLiteRowsBase):
    """The purge of ``embedded.base.Rows`` in SQLite."""

    def purge(self, queue: str, partition: int, limit: int) -> int:
        self._heads.pop((queue, partition), None)
        removed = 0
        for table, column in (("items", "id"), ("lease_records", "key")):
            keys = [
                row[0]
                for row in self._c.execute(
                    f"SELECT {column} FROM {table} WHERE queue = ? AND part = ? ORDER BY {column} LIMIT ?",  # noqa: S608
                    (queue, partition, limit - removed),
                )
            ]
            if keys:
                self._c.execute(
                    f"DELETE FROM {table} WHERE queue = ? AND part = ? AND {column} <= ?",  # noqa: S608
                    (queue, partition, keys[-1]),
                )
                removed += len(keys)
            if removed >= limit:
                return removed
        removed += self._c.execute(
            "DELETE FROM heads WHERE queue = ? AND part = ?", (queue, partition)
        ).rowcount
        if partition == 0 and removed < limit:
            # Idempotency records have no partition; the queue's go with its first partition, and so
            # do its rate-limit buckets.
            self._c.execute("DELETE FROM idempotency WHERE queue = ?", (queue,))
            self._c.execute("DELETE FROM rate_buckets WHERE queue = ?", (queue,))
        return removed
