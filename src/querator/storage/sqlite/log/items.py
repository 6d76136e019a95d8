"""Storage layer, engine v3's claim log in SQLite, the items role: the sequencer (one statement makes
the head or adds to its tail), packed rows, an append of one row in one statement, the schedule."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from querator.domain.positions import POSITION_MARK
from querator.storage.embedded.log.codec import ROW_BYTES, created_of, encode_item, pack_row, with_id
from querator.storage.embedded.log.items import LogItems
from querator.storage.sqlite.base import _RETURNING
from querator.storage.sqlite.database import _store_error
from querator.storage.sqlite.log.base import _LOG_KEY, _ROWS_END, SQLiteLogBase, SQLiteLogRowsBase

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from querator.domain.model import Item
    from querator.ports.log import LogKey
    from querator.storage.embedded.log.base import PackedRow


#: The sequencer: one statement makes the head or adds to its tail, and says where the run starts.
_LOG_TAKE = (
    "INSERT INTO log_heads VALUES (?1, ?2, ?3, ?4 + ?5, ?4, 0, 0, ?6, ?7, NULL, ?4, ?4, ?8, 0)"  # noqa: S608
    f" ON CONFLICT (queue, part, lane) DO UPDATE SET tail = max(tail, {_ROWS_END}) + ?5,"
    " scheduled = scheduled + ?6, largest = max(largest, ?7), produced = produced + ?8 RETURNING tail"
)


#: The head's tail for an append of one row whose largest item (?5) the head's ``largest`` covers;
#: NULL otherwise (no head, or a larger item: the engine's path, which raises it).
_HEAD_TAIL = (
    "(SELECT CASE WHEN ?5 <= largest THEN tail END FROM log_heads"
    " WHERE queue = ?1 AND part = ?2 AND lane = ?3)"
)


#: An append of one row in one statement: at the log's tail (the larger of the head's and the rows'
#: end); where the head has no tail for it (``_HEAD_TAIL``) the position is NULL, and the insert fails
#: with nothing written.
_LOG_APPEND_ROW = (
    f"INSERT INTO log_rows VALUES (?1, ?2, ?3, max({_HEAD_TAIL}, {_ROWS_END}), ?4, ?5, ?6, ?7)"  # noqa: S608
    " RETURNING first"
)


#: The same at the position the caller expects the tail at (?6), NULL when the tail is elsewhere.
#: Without RETURNING it costs a third less.
_LOG_APPEND_AT = (
    f"INSERT INTO log_rows VALUES (?1, ?2, ?3, CASE WHEN ?6 = max({_HEAD_TAIL}, {_ROWS_END})"  # noqa: S608
    " THEN ?6 END, ?4, ?5, ?7, ?8)"
)


_LOG_TIMES = (
    f"SELECT (SELECT min(deadline_us) FROM log_leases WHERE {_LOG_KEY}),"  # noqa: S608
    f" (SELECT min(id) FROM log_schedule WHERE {_LOG_KEY})"
)


_LOG_PUT_ROW = "INSERT INTO log_rows VALUES (?, ?, ?, ?, ?, ?, ?, ?)"


_LOG_SCHEDULED = (
    f"SELECT id, item FROM log_schedule WHERE {_LOG_KEY} AND id > ? AND id <= ? ORDER BY id LIMIT ?"  # noqa: S608
)


_LOG_PUT_SCHEDULED = "INSERT INTO log_schedule VALUES (?, ?, ?, ?, ?)"


_LOG_DROP_SCHEDULED = f"DELETE FROM log_schedule WHERE {_LOG_KEY} AND id = ?"  # noqa: S608


#: An append of more items than this cannot fill one row (41 bytes each at least): the engine's path.
_ONE_ROW_ITEMS = ROW_BYTES // 41


class SQLiteLogItemRows(SQLiteLogRowsBase):
    """The items of ``embedded.log.base.LogRows`` in SQLite."""

    __slots__ = ()

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
        # Positions that are not a produce's are taken out of ``produced`` (the schema's note).
        adjust = produced if produce else produced - count
        values = (key.queue, key.partition, key.lane, start, count, scheduled, largest, adjust)
        if _RETURNING:
            tail = self._c.execute(_LOG_TAKE, values).fetchone()[0]
        else:
            self._c.execute(_LOG_TAKE.removesuffix(" RETURNING tail"), values)
            tail = self._c.execute(
                "SELECT tail FROM log_heads WHERE queue = ? AND part = ? AND lane = ?", values[:3]
            ).fetchone()[0]
        return int(tail) - count

    def next_times(self, key: LogKey) -> tuple[int | None, str | None]:
        log = (key.queue, key.partition, key.lane)
        expiry, due = self._c.execute(_LOG_TIMES, log + log).fetchone()
        return expiry, due

    def put_rows(self, key: LogKey, rows: Sequence[PackedRow]) -> None:
        log = (key.queue, key.partition, key.lane)
        if len(rows) == 1:
            row = rows[0]
            self._c.execute(_LOG_PUT_ROW, (*log, row.first, row.count, row.largest, row.blob, row.created))
            return
        self._c.executemany(
            _LOG_PUT_ROW, [(*log, row.first, row.count, row.largest, row.blob, row.created) for row in rows]
        )

    def scheduled(self, key: LogKey, after: str, until: str, limit: int) -> list[tuple[str, bytes]]:
        rows = self._c.execute(_LOG_SCHEDULED, (key.queue, key.partition, key.lane, after, until, limit))
        return [(item_id, blob) for item_id, blob in rows]

    def put_scheduled(self, key: LogKey, item_id: str, blob: bytes) -> None:
        self._c.execute(_LOG_PUT_SCHEDULED, (key.queue, key.partition, key.lane, item_id, blob))

    def drop_scheduled(self, key: LogKey, item_id: str) -> bool:
        return bool(
            self._c.execute(_LOG_DROP_SCHEDULED, (key.queue, key.partition, key.lane, item_id)).rowcount
        )


class SQLiteLogItems(LogItems, SQLiteLogBase):
    """``embedded.log.items``' append, in one statement when it fills one row."""

    def append(self, key: LogKey, items: Sequence[Item], *, now: datetime) -> list[Item]:
        # The engine's, as one statement in a transaction of its own when the items are due now and
        # fill one row (a produce of up to ~100 small items): no BEGIN, no COMMIT, no head write (the
        # head's ``largest`` covers them, else the engine's path raises it).
        if not items or len(items) > _ONE_ROW_ITEMS:
            return super().append(key, items, now=now)
        encoded = []
        size = largest = created = 0
        for item in items:
            if item.enqueue_at is not None and item.enqueue_at > now:
                return super().append(key, items, now=now)
            data, reply = encode_item(item)
            encoded.append(data)
            size += len(data)
            largest = max(largest, reply)
            created += created_of(data)
        if size > ROW_BYTES:
            return super().append(key, items, now=now)
        blob = pack_row(encoded)
        log = (key.queue, key.partition, key.lane)
        expected = self._tails.get(log)
        try:
            connection = self._db._checkout()
        except sqlite3.Error as exc:
            raise _store_error(exc, "store") from exc
        try:
            first = None
            if expected is not None:
                try:
                    connection.execute(
                        _LOG_APPEND_AT,
                        (*log, len(items), largest, expected, blob, created),
                    )
                    first = expected
                except sqlite3.IntegrityError:
                    pass  # another writer moved the tail since: where it is now
            if first is None:
                first = connection.execute(
                    _LOG_APPEND_ROW, (*log, len(items), largest, blob, created)
                ).fetchone()[0]
        except sqlite3.IntegrityError:
            # No tail for it (NOT NULL failed; nothing written): the log's first write, or an item
            # larger than any before, which the head must learn of.
            return super().append(key, items, now=now)
        except sqlite3.Error as exc:
            raise _store_error(exc, "store") from exc
        finally:
            self._db._checkin(connection)
        self._tails[log] = first + len(items)
        lane = key.lane
        return [with_id(item, f"{lane}{POSITION_MARK}{p:016x}") for p, item in enumerate(items, first)]
