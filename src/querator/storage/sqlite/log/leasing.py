"""Storage layer, engine v3's claim log in SQLite, the leasing role: the claim's fetch-and-add (one
``UPDATE ... RETURNING`` of the head), tombstones, the ``log_leases`` records by token."""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

from querator.domain.model import REPLY_SIZE_THRESHOLD
from querator.storage.sqlite.base import _RETURNING
from querator.storage.sqlite.log.base import (
    _LEASE_COLUMNS,
    _LOG_KEY,
    _RANGE,
    _ROWS_END,
    SQLiteLogRowsBase,
    _ints,
    _run_record,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from querator.ports.log import LogKey
    from querator.storage.embedded.log.base import RunRecord


#: A claim's fetch-and-add on the cursor, up to the tail, counting the run as one lease of it all.
_LOG_TAIL = f"max(tail, {_ROWS_END})"


#: A claim that reaches the tail leaves nothing waiting: the largest item size falls back to the
#: threshold (``HeadRow.largest``), as the statement sees the old values on its right-hand sides.
_LOG_ADVANCE = (
    f"UPDATE log_heads SET claimed = cursor, cursor = min(cursor + ?4, cursor + ?5 - leased, {_LOG_TAIL}),"  # noqa: S608
    f" leases = leases + 1, leased = leased + min(?4, ?5 - leased, {_LOG_TAIL} - cursor),"
    f" largest = CASE WHEN cursor + min(?4, ?5 - leased) >= {_LOG_TAIL}"
    f" THEN min(largest, {REPLY_SIZE_THRESHOLD}) ELSE largest END"
    f" WHERE queue = ?1 AND part = ?2 AND lane = ?3 AND cursor < {_LOG_TAIL} AND leased < ?5"
    " RETURNING claimed, cursor, tombstones"
)


_LOG_TOMBSTONES = f"UPDATE log_heads SET tombstones = ? WHERE {_LOG_KEY}"  # noqa: S608


#: No cap on a claim (``max_leased``).
_UNCAPPED = 2**62


_LOG_RECORD = f"SELECT {_LEASE_COLUMNS} FROM log_leases WHERE {_LOG_KEY} AND token = ?"  # noqa: S608


#: The records of runs that started at or before a position, latest first (tokens sort by run): the
#: caller reads them while they belong to the first one's run.
_LOG_RECORDS_BACK = (
    f"SELECT {_LEASE_COLUMNS} FROM log_leases WHERE {_LOG_KEY} AND token < ?"  # noqa: S608
    " ORDER BY token DESC"
)


_LOG_RECORDS_AFTER = (
    f"SELECT {_LEASE_COLUMNS} FROM log_leases WHERE {_LOG_KEY} AND token > ? ORDER BY token LIMIT ?"  # noqa: S608
)


_LOG_PUT_RECORD = "INSERT OR REPLACE INTO log_leases VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


_LOG_DROP_RECORD = f"DELETE FROM log_leases WHERE {_LOG_KEY} AND token = ?"  # noqa: S608


def _int_blob(values: Sequence[int]) -> bytes | None:
    return array("q", values).tobytes() if values else None


def _pending_blob(record: RunRecord) -> bytes:
    if len(record.pending) == 1:
        return _RANGE.pack(*record.pending[0])
    return array("q", [p for pair in record.pending for p in pair]).tobytes()


class SQLiteLogLeasingRows(SQLiteLogRowsBase):
    """The claims and lease records of ``embedded.log.base.LogRows`` in SQLite."""

    __slots__ = ()

    def advance(
        self, key: LogKey, count: int, max_leased: int | None = None
    ) -> tuple[int, int, tuple[int, ...]] | None:
        values = (key.queue, key.partition, key.lane, count, _UNCAPPED if max_leased is None else max_leased)
        if _RETURNING:
            row = self._c.execute(_LOG_ADVANCE, values).fetchone()
            return None if row is None else (row[0], row[1], _ints(row[2]))
        head = self.head(key)
        if head is None:
            return None
        self._c.execute(_LOG_ADVANCE.removesuffix(" RETURNING claimed, cursor, tombstones"), values)
        after = self.head(key)
        if after is None or after.cursor == head.cursor:
            return None
        return head.cursor, after.cursor, head.tombstones

    def set_tombstones(self, key: LogKey, tombstones: tuple[int, ...]) -> None:
        self._c.execute(_LOG_TOMBSTONES, (_int_blob(tombstones), key.queue, key.partition, key.lane))

    def record(self, key: LogKey, token: str) -> RunRecord | None:
        row = self._c.execute(_LOG_RECORD, (key.queue, key.partition, key.lane, token)).fetchone()
        return None if row is None else _run_record(row)

    def records_of_run(self, key: LogKey, position: int) -> list[RunRecord]:
        found: list[RunRecord] = []
        run = None
        query = (key.queue, key.partition, key.lane, f"{position + 1:016x}")
        for row in self._c.execute(_LOG_RECORDS_BACK, query):
            if run is None:
                run = row[0][:16]
            elif row[0][:16] != run:
                break
            found.append(_run_record(row))
        found.reverse()
        return found

    def records_after(self, key: LogKey, token: str, limit: int) -> list[RunRecord]:
        rows = self._c.execute(_LOG_RECORDS_AFTER, (key.queue, key.partition, key.lane, token, limit))
        return [_run_record(row) for row in rows]

    def put_record(self, key: LogKey, record: RunRecord) -> None:
        self._c.execute(
            _LOG_PUT_RECORD,
            (
                key.queue,
                key.partition,
                key.lane,
                record.token,
                record.run_end,
                record.deadline_us,
                record.claimed_us,
                _pending_blob(record),
                _int_blob(record.holes),
                record.created,
                _int_blob([n for pair in record.priorities for n in pair]),
            ),
        )

    def drop_record(self, key: LogKey, token: str) -> None:
        self._c.execute(_LOG_DROP_RECORD, (key.queue, key.partition, key.lane, token))
