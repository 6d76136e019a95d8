"""Storage layer, the SQLite store, what its roles share: the columns and conversions of items and
heads, the base of the rows' role mixins (``SQLiteRowsBase``: the head row) and of the store's
(``SQLiteStoreBase``)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from querator.domain.model import Item, ItemState, timestamp_us, utc_from_timestamp_us
from querator.ports import PartitionHead, Recount
from querator.storage.embedded.base import RowsStoreBase
from querator.storage.sqlite.lanes import _decode_bands, _encode_bands

if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from datetime import datetime

    from querator.storage.sqlite.store import _SQLiteRows


# Statements below are built from these constant column lists (never from values: those are bound),
# hence the S608 waivers.
_STATE_COLUMNS = "id, attempts, lease_us, expire_us, created_us, enqueue_us, size"
_ITEM_COLUMNS = (
    f"{_STATE_COLUMNS}, payload, reference, encoding, kind, source_id, source_queue, next_priority,"
    " item_group, last_reason, failures"
)
_HEAD_COLUMNS = (
    "cursor, sweep, schedule_mark, items, leased, scheduled, created_sum, leased_created_sum,"
    " scheduled_created_sum, version, recount, recounted_us, bands, produced, completed"
)


def _us(value: datetime | None) -> int | None:
    return None if value is None else timestamp_us(value)


# Rows become items and states on every lease (a page of 50 or more): the conversions are inlined,
# from one epoch made once, rather than a call or two per column (docs/adr/0060-embedded-stores.md).
_EPOCH = utc_from_timestamp_us(0)


def _state(row: Any) -> ItemState:
    lease_us, enqueue_us = row[2], row[5]
    return ItemState(
        id=row[0],
        attempts=row[1],
        lease_deadline=None if lease_us is None else _EPOCH + timedelta(microseconds=lease_us),
        expire_deadline=_EPOCH + timedelta(microseconds=row[3]),
        created_at=_EPOCH + timedelta(microseconds=row[4]),
        enqueue_at=None if enqueue_us is None else _EPOCH + timedelta(microseconds=enqueue_us),
        payload_size=row[6],
    )


def _item(row: Any) -> Item:
    lease_us, enqueue_us = row[2], row[5]
    return Item(
        id=row[0],
        attempts=row[1],
        lease_deadline=None if lease_us is None else _EPOCH + timedelta(microseconds=lease_us),
        expire_deadline=_EPOCH + timedelta(microseconds=row[3]),
        created_at=_EPOCH + timedelta(microseconds=row[4]),
        enqueue_at=None if enqueue_us is None else _EPOCH + timedelta(microseconds=enqueue_us),
        payload=bytes(row[7]),
        reference=row[8],
        encoding=row[9],
        kind=row[10],
        source_id=row[11],
        source_queue=row[12],
        next_priority=row[13],
        group=row[14],
        last_reason=row[15] or "",
        failures=row[16] or 0,
    )


#: ``RETURNING`` (SQLite 3.35, 2021) lets a claim or a delete check, write and read its row in one
#: statement; an older library takes the engine's read-then-write (the same result, two statements).
_RETURNING = sqlite3.sqlite_version_info >= (3, 35)


class SQLiteRowsBase:
    """What the rows' role mixins share: one connection inside a transaction, and the head rows it
    read or wrote."""

    def __init__(self, connection: sqlite3.Connection, states: dict[tuple[Any, ...], ItemState]) -> None:
        self._c = connection
        #: Rows of the items table as read -> their state (``states``), shared by the store's calls.
        self._states = states
        #: The head rows this transaction read or wrote: a call that reads its head twice (a
        #: delete: its schedule mark first, its counters last) reads and decodes it once.
        self._heads: dict[tuple[str, int], PartitionHead] = {}

    def head(self, queue: str, partition: int) -> PartitionHead:
        known = self._heads.get((queue, partition))
        if known is None:
            known = self._heads[(queue, partition)] = self._read_head(queue, partition)
        return known

    def _read_head(self, queue: str, partition: int) -> PartitionHead:
        row = self._c.execute(
            f"SELECT {_HEAD_COLUMNS} FROM heads WHERE queue = ? AND part = ?",  # noqa: S608
            (queue, partition),
        ).fetchone()
        if row is None:
            return PartitionHead()
        return PartitionHead(
            cursor=row[0],
            sweep=row[1],
            schedule_mark=row[2],
            items=row[3],
            leased=row[4],
            scheduled=row[5],
            created_sum=row[6],
            leased_created_sum=row[7],
            scheduled_created_sum=row[8],
            version=row[9],
            recount=None if row[10] is None else Recount(**json.loads(row[10])),
            recounted_at=None if row[11] is None else utc_from_timestamp_us(row[11]),
            **_decode_bands(row[12]),
            produced=row[13],
            completed=row[14],
        )

    def write_head(self, queue: str, partition: int, head: PartitionHead) -> None:
        self._heads[(queue, partition)] = head
        self._c.execute(
            f"INSERT OR REPLACE INTO heads (queue, part, {_HEAD_COLUMNS})"  # noqa: S608
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                queue,
                partition,
                head.cursor,
                head.sweep,
                head.schedule_mark,
                head.items,
                head.leased,
                head.scheduled,
                head.created_sum,
                head.leased_created_sum,
                head.scheduled_created_sum,
                head.version,
                None if head.recount is None else json.dumps(asdict(head.recount)),
                None if head.recounted_at is None else timestamp_us(head.recounted_at),
                _encode_bands(head),
                head.produced,
                head.completed,
            ),
        )


class SQLiteStoreBase(RowsStoreBase):
    """What the store's role mixins share: transactions whose rows are SQLite's (``store._SQLiteRows``),
    with statements of their own beside ``embedded.base.Rows``'s."""

    if TYPE_CHECKING:

        def _read(self) -> AbstractContextManager[_SQLiteRows]: ...

        def _write(self) -> AbstractContextManager[_SQLiteRows]: ...
