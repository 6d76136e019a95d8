"""Storage layer, engine v3's claim log in SQLite, the upkeep role: skipping what waits, records by
deadline, the sums of ages in SQL, the purge."""

from __future__ import annotations

from typing import TYPE_CHECKING

from querator.storage.sqlite.log.base import _LEASE_COLUMNS, _LOG_KEY, SQLiteLogRowsBase, _run_record

if TYPE_CHECKING:
    from querator.ports.log import LogKey
    from querator.storage.embedded.log.base import RunRecord


_LOG_SKIP = f"UPDATE log_heads SET cursor = ?, tombstones = NULL WHERE {_LOG_KEY}"  # noqa: S608


_LOG_RECORDS_DUE = (
    f"SELECT {_LEASE_COLUMNS} FROM log_leases WHERE {_LOG_KEY} AND deadline_us <= ?"  # noqa: S608
    " ORDER BY deadline_us LIMIT ?"
)


_LOG_CREATED_SUMS = (
    f"SELECT (SELECT coalesce(sum(created), 0) FROM log_rows WHERE {_LOG_KEY} AND first >= ?),"  # noqa: S608
    f" (SELECT coalesce(sum(created), 0) FROM log_leases WHERE {_LOG_KEY})"
)


class SQLiteLogUpkeepRows(SQLiteLogRowsBase):
    """The upkeep of ``embedded.log.base.LogRows`` in SQLite."""

    __slots__ = ()

    def skip(self, key: LogKey) -> tuple[int, int, tuple[int, ...]] | None:
        head = self.head(key)
        if head is not None:
            self._c.execute(_LOG_SKIP, (head.tail, key.queue, key.partition, key.lane))
            return head.cursor, head.tail, head.tombstones
        return None

    def records_due(self, key: LogKey, deadline_us: int, limit: int) -> list[RunRecord]:
        rows = self._c.execute(_LOG_RECORDS_DUE, (key.queue, key.partition, key.lane, deadline_us, limit))
        return [_run_record(row) for row in rows]

    def created_sums(self, key: LogKey, start: int) -> tuple[int, int]:
        log = (key.queue, key.partition, key.lane)
        waiting, leased = self._c.execute(_LOG_CREATED_SUMS, (*log, start, *log)).fetchone()
        return int(waiting), int(leased)

    def purge(self, key: LogKey, limit: int) -> int:
        log = (key.queue, key.partition, key.lane)
        removed = 0
        for table, column in (("log_rows", "first"), ("log_leases", "token"), ("log_schedule", "id")):
            found = self._c.execute(
                f"SELECT {column} FROM {table} WHERE {_LOG_KEY} ORDER BY {column} LIMIT ?",  # noqa: S608
                (*log, limit - removed),
            ).fetchall()
            if found:
                self._c.execute(
                    f"DELETE FROM {table} WHERE {_LOG_KEY} AND {column} <= ?",  # noqa: S608
                    (*log, found[-1][0]),
                )
                removed += len(found)
            if removed >= limit:
                return removed
        return removed + self._c.execute(f"DELETE FROM log_heads WHERE {_LOG_KEY}", log).rowcount  # noqa: S608
