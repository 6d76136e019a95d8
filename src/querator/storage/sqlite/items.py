"""Storage layer, the SQLite store's items role: the ``items`` table, a produce's rows in one
statement, its counters in one ``UPDATE``, a guarded delete in one ``DELETE ... RETURNING``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from querator.domain.model import REPLY_SIZE_THRESHOLD, Item, ItemState, timestamp_us
from querator.domain.priority import lane_of
from querator.ports import BatchResult, Guard
from querator.storage.counters import CounterDeltas, scheduled_when_written, still_scheduled
from querator.storage.embedded.items import RowsItems
from querator.storage.sqlite.base import (
    _ITEM_COLUMNS,
    _RETURNING,
    _STATE_COLUMNS,
    SQLiteRowsBase,
    SQLiteStoreBase,
    _item,
    _state,
    _us,
)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime


#: Converted rows kept by a store (``_SQLiteRows.states``): a few pages of many partitions, a few MB.
_KNOWN_STATES = 20_000


#: ``embedded.base._guard_holds`` as a condition on the row; each statement binds the time (maybe unused).
_GUARD_CONDITIONS = {
    Guard.ANY: "? IS NOT NULL",
    Guard.NEVER_LEASED: "lease_us IS NULL AND ? IS NOT NULL",
    Guard.LEASE_VALID: "lease_us > ?",
    Guard.LEASE_EXPIRED: "lease_us <= ?",
    Guard.NOT_VALIDLY_LEASED: "(lease_us IS NULL OR lease_us <= ?)",
}


_REMOVE_GUARDED = {
    guard: f"DELETE FROM items WHERE queue = ? AND part = ? AND id = ? AND {condition}"  # noqa: S608
    f" RETURNING {_STATE_COLUMNS}"
    for guard, condition in _GUARD_CONDITIONS.items()
}


_COUNT_PRODUCED = (
    "UPDATE heads SET items = items + ?, leased = leased + ?, scheduled = scheduled + ?,"
    " created_sum = created_sum + ?, leased_created_sum = leased_created_sum + ?,"
    " scheduled_created_sum = scheduled_created_sum + ?, produced = produced + ?, version = version + 1"
    " WHERE queue = ? AND part = ? AND schedule_mark != '' AND recounted_us IS NOT NULL AND cursor <= ?"
)


_PUT_ITEM = (
    f"INSERT OR REPLACE INTO items (queue, part, {_ITEM_COLUMNS})"  # noqa: S608
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)


def _item_row(queue: str, partition: int, item: Item) -> tuple[Any, ...]:
    size = item.reply_size()
    return (
        queue,
        partition,
        item.id,
        item.attempts,
        _us(item.lease_deadline),
        timestamp_us(item.expire_deadline),
        timestamp_us(item.created_at),
        _us(item.enqueue_at),
        size if size >= REPLY_SIZE_THRESHOLD else 0,
        item.payload,
        item.reference,
        item.encoding,
        item.kind,
        item.source_id,
        item.source_queue,
        item.next_priority,
        item.group,
        # NULL (one byte of the row's header each) unless the item failed.
        item.last_reason or None,
        item.failures or None,
    )


class SQLiteItemRows(SQLiteRowsBase):
    """The items of ``embedded.base.Rows`` in SQLite, and the statements of SQLite's own produce and
    delete."""

    def item(self, queue: str, partition: int, item_id: str) -> Item | None:
        row = self._c.execute(
            f"SELECT {_ITEM_COLUMNS} FROM items WHERE queue = ? AND part = ? AND id = ?",  # noqa: S608
            (queue, partition, item_id),
        ).fetchone()
        return None if row is None else _item(row)

    def put(self, queue: str, partition: int, item: Item) -> None:
        self._c.execute(_PUT_ITEM, _item_row(queue, partition, item))

    def put_all(self, queue: str, partition: int, items: Sequence[Item]) -> None:
        """``put`` of every item, in one statement run over them (a produce of 100 is one call
        into SQLite, not 100)."""
        self._c.executemany(_PUT_ITEM, [_item_row(queue, partition, item) for item in items])

    def count_produced(self, queue: str, partition: int, items: Sequence[Item], now: datetime) -> bool:
        """``embedded.items``' counting of new items as one ``UPDATE`` of the head's counters, for the usual
        produce: the head has its schedule mark and recount clock, every item is in priority 5's band
        without a group lane, and none lands below the cursor, so there is nothing to register or
        pull back and only counters change. ``False``, nothing written, otherwise (the engine's way)."""
        if not items or any(lane_of(item.id) for item in items):
            return False
        counts = CounterDeltas()
        for item in items:
            counts.add(
                item.created_at,
                sign=1,
                leased=item.lease_deadline is not None,
                scheduled=scheduled_when_written(item, now),
            )
        changed = self._c.execute(
            _COUNT_PRODUCED,
            (
                counts.items,
                counts.leased,
                counts.scheduled,
                counts.created,
                counts.leased_created,
                counts.scheduled_created,
                counts.items,  # every write of new items is production, as in the engine
                queue,
                partition,
                min(item.id for item in items),
            ),
        ).rowcount
        self._heads.pop((queue, partition), None)
        return changed > 0

    def schedule_mark(self, queue: str, partition: int) -> str:
        """The head's schedule mark, read alone (a delete needs no more of the head before it counts)."""
        known = self._heads.get((queue, partition))
        if known is not None:
            return known.schedule_mark
        row = self._c.execute(
            "SELECT schedule_mark FROM heads WHERE queue = ? AND part = ?", (queue, partition)
        ).fetchone()
        return "" if row is None else str(row[0])

    def add_counts(self, queue: str, partition: int, counts: CounterDeltas) -> bool:
        """``counts.applied`` to the head row in place, one ``UPDATE``; ``False`` (nothing written)
        when the partition has no head row yet."""
        changed = self._c.execute(
            "UPDATE heads SET items = items + ?, leased = leased + ?, scheduled = scheduled + ?,"
            " created_sum = created_sum + ?, leased_created_sum = leased_created_sum + ?,"
            " scheduled_created_sum = scheduled_created_sum + ?, produced = produced + ?,"
            " completed = completed + ?, version = version + ? WHERE queue = ? AND part = ?",
            (
                counts.items,
                counts.leased,
                counts.scheduled,
                counts.created,
                counts.leased_created,
                counts.scheduled_created,
                counts.produced,
                counts.completed,
                1 if counts.changed() else 0,
                queue,
                partition,
            ),
        ).rowcount
        self._heads.pop((queue, partition), None)
        return changed > 0

    def remove_guarded(self, queue: str, partition: int, item_id: str, guard: Guard, now_us: int) -> Any:
        """Delete the item if ``guard`` holds: its state row (``_STATE_COLUMNS``) as it was, or
        ``None`` (it is not there, or the guard does not hold)."""
        return self._c.execute(_REMOVE_GUARDED[guard], (queue, partition, item_id, now_us)).fetchone()

    def remove(self, queue: str, partition: int, item_id: str) -> None:
        self._c.execute(
            "DELETE FROM items WHERE queue = ? AND part = ? AND id = ?", (queue, partition, item_id)
        )

    def items(self, queue: str, partition: int, start: str, end: str, limit: int) -> list[Item]:
        rows = self._c.execute(
            f"SELECT {_ITEM_COLUMNS} FROM items WHERE queue = ? AND part = ? AND id >= ? AND id < ?"  # noqa: S608
            " ORDER BY id LIMIT ?",
            (queue, partition, start, end, limit),
        )
        return [_item(row) for row in rows]

    def states(self, queue: str, partition: int, start: str, end: str, limit: int) -> list[ItemState]:
        rows = self._c.execute(
            f"SELECT {_STATE_COLUMNS} FROM items WHERE queue = ? AND part = ? AND id >= ? AND id < ?"  # noqa: S608
            " ORDER BY id LIMIT ?",
            (queue, partition, start, end, limit),
        )
        # A lease of one reads a page of 50 or more from its lane's cursor, so consecutive leases
        # read the same waiting rows again: a row read before (the same values) gives the same
        # state, an immutable value, without building it again.
        known = self._states
        found = []
        for row in rows:
            state = known.get(row)
            if state is None:
                state = known[row] = _state(row)
            found.append(state)
        if len(known) > _KNOWN_STATES:
            known.clear()
        return found


class SQLiteItems(RowsItems, SQLiteStoreBase):
    """``embedded.items``' produce and delete, each in fewer statements."""

    def put_new(self, queue: str, partition: int, items: Sequence[Item], *, now: datetime) -> None:
        # The engine's, with the rows written by one statement (executemany) rather than one each.
        with self._write() as rows:
            rows.put_all(queue, partition, items)
            # Most produces change only counters: one UPDATE, not a read, decode and rewrite of the head.
            if not rows.count_produced(queue, partition, items, now):
                self._count_added(rows, queue, partition, items, now)

    def delete(
        self,
        queue: str,
        partition: int,
        ids: Sequence[str],
        *,
        guard: Guard,
        now: datetime,
        completed: bool = False,
    ) -> BatchResult[str]:
        # The engine's, with each id's guard and delete one DELETE ... RETURNING what the counters
        # need (not a read of the whole row first).
        if not _RETURNING:
            return super().delete(queue, partition, ids, guard=guard, now=now, completed=completed)
        result: BatchResult[str] = BatchResult()
        counts = CounterDeltas()
        now_us = timestamp_us(now)
        with self._write() as rows:
            mark = rows.schedule_mark(queue, partition)
            for item_id in dict.fromkeys(ids):
                row = rows.remove_guarded(queue, partition, item_id, guard, now_us)
                if row is None:
                    # Not there (fine for Guard.ANY: gone already), or the guard does not hold.
                    (result.applied if guard is Guard.ANY else result.rejected).append(item_id)
                    continue
                result.applied.append(item_id)
                state = _state(row)
                counts.add(
                    state.created_at,
                    sign=-1,
                    leased=state.lease_deadline is not None,
                    scheduled=still_scheduled(state, mark),
                )
            if completed:
                counts.completed = -counts.items
            # Only counters change: added in place, unless there is no head row to add them to.
            if counts.items and not rows.add_counts(queue, partition, counts):
                rows.write_head(queue, partition, counts.applied(rows.head(queue, partition)))
        return result
