"""Storage layer, engine v3's claim log in SQLite, what its roles share: the ``log_*`` tables' key,
the head and the rows read, the records' encoding, the base of the rows' role mixins
(``SQLiteLogRowsBase``) and of the store's (``SQLiteLogBase``)."""

from __future__ import annotations

import struct
from array import array
from typing import TYPE_CHECKING, Any

from querator.storage.embedded.log.base import HeadRow, LogEngineBase, PackedRow, RunRecord

if TYPE_CHECKING:
    import sqlite3

    from querator.ports.log import LogKey
    from querator.storage.sqlite.database import SQLiteDatabase


_LOG_KEY = "queue = ? AND part = ? AND lane = ?"
#: Where the rows end: an append of one row takes its positions from there in the statement that
#: writes it, so the head's ``tail`` is the sequencer's value for reservations (``take_positions``)
#: and larger appends only, and the log's tail is the larger of the two.
_ROWS_END = (
    "coalesce((SELECT r.first + r.count FROM log_rows r WHERE r.queue = ?1 AND r.part = ?2"
    " AND r.lane = ?3 ORDER BY r.first DESC LIMIT 1), 0)"
)
_LOG_HEAD = (
    f"SELECT max(tail, {_ROWS_END}), cursor, leases, leased, scheduled, largest, tombstones,"  # noqa: S608
    " produced - origin, completed"
    " FROM log_heads WHERE queue = ?1 AND part = ?2 AND lane = ?3"
)


_LOG_COUNTS = (
    "UPDATE log_heads SET leases = leases + ?, leased = leased + ?, scheduled = scheduled + ?,"  # noqa: S608
    f" completed = completed + ? WHERE {_LOG_KEY}"
)


#: The row holding ``start`` (the last one starting at or before it) and the ones starting before ``end``.
_LOG_ROWS = (
    f"SELECT first, count, items FROM log_rows WHERE {_LOG_KEY} AND first >= coalesce("  # noqa: S608
    f"(SELECT first FROM log_rows WHERE {_LOG_KEY} AND first <= ? ORDER BY first DESC LIMIT 1), ?)"
    " AND first < ? ORDER BY first LIMIT ?"
)
#: The same for a range of at most ``limit`` positions (so of at most ``limit`` rows), read backwards
#: from ``end`` down to the row holding ``start``: no subquery (a claim of one reads one row).
_LOG_ROWS_BACK = (
    f"SELECT first, count, items FROM log_rows WHERE {_LOG_KEY} AND first < ?"  # noqa: S608
    " ORDER BY first DESC LIMIT ?"
)
_LEASE_COLUMNS = "token, run_end, deadline_us, claimed_us, pending, holes, created, priorities"


def _ints(blob: bytes | None) -> tuple[int, ...]:
    return tuple(array("q", blob)) if blob else ()


_RANGE = struct.Struct("<qq")


def _run_record(row: Any) -> RunRecord:
    token, run_end, deadline_us, claimed_us, pending, holes, created, priorities = row
    if len(pending) == _RANGE.size:  # one range: most records
        ranges: tuple[tuple[int, int], ...] = (_RANGE.unpack(pending),)
    else:
        flat = array("q", pending)
        ranges = tuple(zip(flat[::2], flat[1::2], strict=True))
    given: tuple[tuple[int, int], ...] = ()
    if priorities:
        flat = array("q", priorities)
        given = tuple(zip(flat[::2], flat[1::2], strict=True))
    return RunRecord(
        token, int(token[:16], 16), run_end, deadline_us, claimed_us, ranges, _ints(holes), created, given
    )


class SQLiteLogRowsBase:
    """What the log rows' role mixins share: one connection inside a transaction, the head, the rows,
    the counters."""

    __slots__ = ("_c",)

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._c = connection

    def head(self, key: LogKey) -> HeadRow | None:
        row = self._c.execute(_LOG_HEAD, (key.queue, key.partition, key.lane)).fetchone()
        if row is None:
            return None
        # ``produced - origin`` read, the positions after the origin added: ``LogHead.produced``.
        return HeadRow(row[0], row[1], row[2], row[3], row[4], row[5], _ints(row[6]), row[0] + row[7], row[8])

    def add_counts(
        self, key: LogKey, *, leases: int = 0, leased: int = 0, scheduled: int = 0, completed: int = 0
    ) -> None:
        self._c.execute(
            _LOG_COUNTS, (leases, leased, scheduled, completed, key.queue, key.partition, key.lane)
        )

    def rows(self, key: LogKey, start: int, end: int, limit: int) -> list[PackedRow]:
        log = (key.queue, key.partition, key.lane)
        if end - start > limit:
            return [
                PackedRow(first, count, blob)
                for first, count, blob in self._c.execute(_LOG_ROWS, (*log, *log, start, start, end, limit))
            ]
        found = []
        for first, count, blob in self._c.execute(_LOG_ROWS_BACK, (*log, end, end - start)):
            found.append(PackedRow(first, count, blob))
            if first <= start:
                break
        found.reverse()
        return found


class SQLiteLogBase(LogEngineBase):
    """What the claim log's role mixins share: the database, and where each log's tail was after this
    object's last append of one row."""

    def __init__(self, database: SQLiteDatabase) -> None:
        self._db = database
        #: Where each log's tail was after this object's last append of one row: the next one writes
        #: there if it still is (``_LOG_APPEND_AT``, no RETURNING), else asks where it is.
        #: Keyed by the log key's fields (a dataclass hashes in Python, a tuple in C).
        self._tails: dict[tuple[str, int, str], int] = {}
