"""Storage layer, the SQLite store's catalog: the ``queues`` table, and the reaper's bookmark and the
stream key in ``querator_meta``."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from querator.domain.errors import ConflictError, QueueAlreadyExistsError, QueueNotFoundError
from querator.domain.model import QueueInfo, timestamp_us, utc_from_timestamp_us

if TYPE_CHECKING:
    from collections.abc import Iterator
    from datetime import datetime

    from querator.storage.sqlite.database import SQLiteDatabase


_SELECT_QUEUE = (
    "SELECT name, lease_us, expire_us, max_attempts, dead_queue, reference, partitions, created_us,"
    " updated_us, deleting, delivery, max_leased_per_group, rate_limit, rate_limit_per_group"
    " FROM queues WHERE name = ?"
)


_QUEUE_COLUMNS = (
    "name, lease_us, expire_us, max_attempts, dead_queue, reference, partitions, created_us, updated_us,"
    " deleting, delivery, max_leased_per_group, rate_limit, rate_limit_per_group"
)


def _queue_row(info: QueueInfo) -> tuple[Any, ...]:
    return (
        info.name,
        info.lease_timeout // timedelta(microseconds=1),
        info.expire_timeout // timedelta(microseconds=1),
        info.max_attempts,
        info.dead_queue,
        info.reference,
        info.partitions,
        timestamp_us(info.created_at),
        timestamp_us(info.updated_at),
        int(info.deleting),
        info.delivery,
        info.max_leased_per_group,
        info.rate_limit,
        info.rate_limit_per_group,
    )


def _queue_info(row: Any) -> QueueInfo:
    return QueueInfo(
        name=row[0],
        lease_timeout=timedelta(microseconds=row[1]),
        expire_timeout=timedelta(microseconds=row[2]),
        max_attempts=row[3],
        dead_queue=row[4],
        reference=row[5],
        partitions=row[6],
        created_at=utc_from_timestamp_us(row[7]),
        updated_at=utc_from_timestamp_us(row[8]),
        deleting=bool(row[9]),
        delivery=row[10],
        max_leased_per_group=row[11],
        rate_limit=row[12],
        rate_limit_per_group=row[13],
    )


class SQLiteQueueCatalog:
    """``QueueCatalog`` in a ``SQLiteDatabase`` (the ``queues`` table; the bookmark in the meta table)."""

    def __init__(self, database: SQLiteDatabase) -> None:
        self._db = database

    def create(self, info: QueueInfo) -> None:
        with self._db.transaction(write=True, operation="queues.create") as c:
            # Two creates of one name race: the write lock orders them, the second finds the first.
            if c.execute("SELECT 1 FROM queues WHERE name = ?", (info.name,)).fetchone():
                raise QueueAlreadyExistsError(f"queue '{info.name}' already exists")
            c.execute(
                f"INSERT INTO queues ({_QUEUE_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",  # noqa: S608
                _queue_row(info),
            )

    def get(self, name: str) -> QueueInfo:
        with self._db.transaction(write=False, operation="queues.info") as c:
            row = c.execute(_SELECT_QUEUE, (name,)).fetchone()
        if row is None:
            raise QueueNotFoundError(f"queue '{name}' does not exist", queue=name)
        return _queue_info(row)

    def list(self, *, pivot: str, limit: int) -> list[QueueInfo]:
        with self._db.transaction(write=False, operation="queues.list") as c:
            rows = c.execute(
                f"SELECT {_QUEUE_COLUMNS} FROM queues WHERE name >= ? ORDER BY name LIMIT ?",  # noqa: S608
                (pivot, limit),
            ).fetchall()
        return [_queue_info(row) for row in rows]

    def iterate(self) -> Iterator[QueueInfo]:
        pivot = ""
        while True:
            page = self.list(pivot=pivot, limit=101)
            yield from page[:100]
            if len(page) <= 100:
                return
            pivot = page[100].name

    def replace(self, info: QueueInfo, *, expected_updated_at: datetime) -> None:
        with self._db.transaction(write=True, operation="queues.update") as c:
            # Optimistic concurrency: the second of two updates that read the same version fails.
            changed = c.execute(
                f"UPDATE queues SET ({_QUEUE_COLUMNS}) = (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"  # noqa: S608
                " WHERE name = ? AND updated_us = ?",
                (*_queue_row(info), info.name, timestamp_us(expected_updated_at)),
            ).rowcount
        if not changed:
            raise ConflictError(f"queue '{info.name}' changed or was deleted meanwhile")

    def mark_deleting(self, name: str) -> QueueInfo:
        with self._db.transaction(write=True, operation="queues.delete") as c:
            row = c.execute(_SELECT_QUEUE, (name,)).fetchone()
            if row is None:
                raise QueueNotFoundError(f"queue '{name}' does not exist", queue=name)
            c.execute("UPDATE queues SET deleting = 1 WHERE name = ?", (name,))
        return replace(_queue_info(row), deleting=True)

    def remove(self, name: str) -> None:
        with self._db.transaction(write=True, operation="queues.delete") as c:
            c.execute("DELETE FROM queues WHERE name = ?", (name,))

    def load_bookmark(self) -> str | None:
        with self._db.transaction(write=False, operation="reaper") as c:
            row = c.execute("SELECT value FROM querator_meta WHERE key = 'reaper_bookmark'").fetchone()
        return row[0] if row and row[0] else None

    def save_bookmark(self, bookmark: str | None) -> None:
        with self._db.transaction(write=True, operation="reaper") as c:
            c.execute("INSERT OR REPLACE INTO querator_meta VALUES ('reaper_bookmark', ?)", (bookmark or "",))

    def stream_key(self, candidate: str | None) -> str | None:
        with self._db.transaction(write=False, operation="stream.ticket") as c:
            row = c.execute("SELECT value FROM querator_meta WHERE key = 'stream_key'").fetchone()
        if row:
            return str(row[0])
        if candidate is None:
            return None
        with self._db.transaction(write=True, operation="stream.ticket") as c:
            # The write lock orders racing first uses: the second keeps the first's key.
            c.execute("INSERT OR IGNORE INTO querator_meta VALUES ('stream_key', ?)", (candidate,))
            row = c.execute("SELECT value FROM querator_meta WHERE key = 'stream_key'").fetchone()
        return str(row[0])
