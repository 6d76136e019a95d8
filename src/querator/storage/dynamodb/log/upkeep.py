"""Storage layer, engine v3's claim log on DynamoDB, the upkeep role: expired records (in the head,
and spilled ones by their ``L`` rows), promoting due scheduled items, ages, clearing, purging."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from querator.domain.errors import StoreThrottledError
from querator.domain.model import timestamp_us, utc_from_timestamp_us
from querator.domain.positions import position_id
from querator.ports.log import LeaseRun, LogAges, LogKey
from querator.storage.dynamodb import schema
from querator.storage.dynamodb.log.base import (
    _RETRIES,
    AttributeMap,
    DynamoDBLogBase,
    _add_created,
    _Change,
    _ConflictError,
    _decode_head,
    _decode_spilled,
    _entry_object,
    _Head,
    _item,
    _key,
    _num,
    _numbers,
    _pk,
    _row_length,
    _row_position,
    _rows_pk,
    log,
    step_bound,
)
from querator.storage.dynamodb.objects import OBJECT_PAYLOAD_BYTES

#: Rows a clear reads a page to find the objects of what it ended, and the most pages one clear
#: reads: a clear stays one bounded call however much the log holds, and the objects of what it
#: cleared past them are left to the reaper's sweep (``PayloadObjects.sweep``).
_CLEAR_PAGE = 16
_CLEAR_PAGES = 64

if TYPE_CHECKING:
    from datetime import datetime


class DynamoDBLogUpkeep(DynamoDBLogBase):
    """``LogUpkeepPort`` on the items table."""

    def ages(self, key: LogKey) -> LogAges:
        head = self._head(key, "stats")
        waiting = head.tail - head.cursor - len(head.tombstones)
        # A writer that took positions and died left its items' ages in the waiting sum: once
        # nothing waits (or is leased) the sum is zero, whatever it says. Said, and written back
        # when the log is idle, conditional on the head as read, so a take or claim since wins.
        stale = (waiting <= 0 and head.waiting_created != 0) or (
            head.leased <= 0 and not head.records and not head.spilled and head.leased_created != 0
        )
        ages = LogAges(
            waiting_created=head.waiting_created if waiting > 0 else 0,
            leased_created=head.leased_created if head.leased > 0 else 0,
        )
        if stale and head.exists:
            change = _Change(_key(key, schema.LOG_HEAD_SK))
            tail, cur = change.name(schema.LOG_TAIL), change.name(schema.LOG_CURSOR)
            change.conditions += [
                f"{tail} = {change.value(_num(head.tail))}",
                f"{cur} = {change.value(_num(head.cursor))}",
            ]
            if waiting <= 0:
                change.sets.append(f"{change.name(schema.LOG_WAITING_CREATED)} = {change.value(_num(0))}")
            if head.leased <= 0 and not head.records and not head.spilled:
                nl = change.name(schema.LOG_LEASED)
                change.sets.append(f"{change.name(schema.LOG_LEASED_CREATED)} = {change.value(_num(0))}")
                change.conditions.append(f"attribute_not_exists({nl}) OR {nl} <= {change.value(_num(0))}")
            self._update(change, "stats")
        return ages

    def expired(self, key: LogKey, *, now: datetime, limit: int) -> list[LeaseRun]:
        now_us = timestamp_us(now)
        head = self._head(key, "expiry")
        due = [r for r in head.records.values() if r.deadline <= now_us]
        if head.spilled and limit > 0:
            rows, _ = self._query(
                "expiry",
                KeyConditionExpression="#pk = :pk AND #sk BETWEEN :lo AND :hi",
                ExpressionAttributeNames={"#pk": schema.PK, "#sk": schema.SK},
                ExpressionAttributeValues={
                    ":pk": _pk(key),
                    ":lo": {"S": schema.LOG_EXPIRY_PREFIX},
                    ":hi": {"S": f"{schema.LOG_EXPIRY_PREFIX}{now_us:014x}~"},
                },
                Limit=limit,
            )
            refs = [_key(key, row[schema.LOG_RECORD_REF]["S"]) for row in rows]
            due += [_decode_spilled(attrs) for attrs in self._batch_get(refs, "expiry")]
        due = sorted(due, key=lambda r: (r.deadline, r.token))[: max(limit, 0)]
        runs = []
        for record in due:
            open_positions = record.open()
            found = self._read_positions(key, open_positions, "expiry")
            holes = [p for p in open_positions if p not in found.items and p not in found.filled]
            if holes:
                # Its writer is long dead: fill on the way.
                filled = self._fill(key, holes, now, first=head.first)
                found.items.update(filled.items)
                found.filled |= filled.filled
            if found.filled or not found.items:
                head_change = _Change(_key(key, schema.LOG_HEAD_SK))
                actions: list[AttributeMap] = []
                settled = set(found.filled) | {p for p in open_positions if p not in found.items}
                self._record_change(key, record, head_change, actions, settled=settled)
                self._forget(key, record)
                try:
                    self._commit([head_change], actions, "expiry")
                except _ConflictError:
                    continue  # settled or renewed meanwhile: a later pass sees it as it is
            if not found.items:
                continue
            deadline = utc_from_timestamp_us(record.deadline)
            items = [
                replace(
                    record.coming(_item(found.items[p], position_id(key.lane, p)), p),
                    attempts=int(found.items[p].get(schema.ATTEMPTS, {"N": "0"})["N"]) + 1,
                    lease_deadline=deadline,
                )
                for p in open_positions
                if p in found.items
            ]
            runs.append(LeaseRun(token=record.token, deadline=deadline, items=self._with_payloads(items)))
        return runs

    def promote(self, key: LogKey, *, now: datetime, limit: int) -> int:
        now_us = timestamp_us(now)
        moved = 0
        for attempt in range(_RETRIES + 1):
            if moved >= limit:
                break
            head = self._head(key, "promote")
            if not head.scheduled:
                break
            rows, _ = self._query(
                "promote",
                KeyConditionExpression="#pk = :pk AND #sk BETWEEN :lo AND :hi",
                ExpressionAttributeNames={"#pk": schema.PK, "#sk": schema.SK},
                ExpressionAttributeValues={
                    ":pk": _pk(key),
                    ":lo": {"S": schema.LOG_SCHEDULE_PREFIX},
                    ":hi": {"S": f"{schema.LOG_SCHEDULE_PREFIX}{now_us:014x}~"},
                },
                Limit=min(limit - moved, 40),
            )
            if not rows:
                self._lower_next_due(key, head)
                break
            change = _Change(_key(key, schema.LOG_HEAD_SK))
            actions: list[AttributeMap] = [
                {
                    "Delete": {
                        "TableName": self._table,
                        "Key": _key(key, row[schema.SK]["S"]),
                        "ConditionExpression": "attribute_exists(#sk)",
                        "ExpressionAttributeNames": {"#sk": schema.SK},
                    }
                }
                for row in rows
            ]
            change.adds.append(f"{change.name(schema.LOG_SCHEDULED)} {change.value(_num(-len(rows)))}")
            # Read whole (a payload in the bucket too): the append sizes the log's claims by them.
            items = self._with_payloads(
                [_item({k: v for k, v in row.items() if k not in (schema.PK, schema.SK)}, "") for row in rows]
            )
            # Due: appended at the tail (``enqueue_at`` kept: when it was scheduled for).
            self._appends(key, head, change, {key: items}, now, actions)
            try:
                self._commit([change], actions, "promote")
            except _ConflictError:
                self._backoff(attempt)
                continue
            moved += len(rows)
        return moved

    def _lower_next_due(self, key: LogKey, head: _Head) -> None:
        """Move the head's next due time up to the schedule's first row, if nothing was scheduled
        since ``head`` was read (the schedule version): it stays a lower bound."""
        rows, _ = self._query(
            "promote",
            KeyConditionExpression="#pk = :pk AND begins_with(#sk, :s)",
            ExpressionAttributeNames={"#pk": schema.PK, "#sk": schema.SK},
            ExpressionAttributeValues={":pk": _pk(key), ":s": {"S": schema.LOG_SCHEDULE_PREFIX}},
            Limit=1,
        )
        change = _Change(_key(key, schema.LOG_HEAD_SK))
        nd, sv = change.name(schema.LOG_NEXT_DUE), change.name(schema.LOG_SCHEDULE_VERSION)
        if rows:
            change.sets.append(f"{nd} = {change.value(_num(int(rows[0][schema.SK]['S'][1:15], 16)))}")
        else:
            change.removes.append(nd)
        change.conditions.append(f"{sv} = {change.value(_num(head.schedule_version))}")
        self._update(change, "promote")

    def skip_waiting(self, key: LogKey, *, now: datetime) -> int:
        for attempt in range(_RETRIES + 1):
            head = self._head(key, "clear")
            if not head.exists or head.cursor >= head.tail:
                return 0
            dropped = [p for p in head.tombstones if head.cursor <= p < head.tail]
            change = _Change(_key(key, schema.LOG_HEAD_SK))
            cur = change.name(schema.LOG_CURSOR)
            change.sets.append(f"{cur} = {change.value(_num(head.tail))}")
            change.conditions.append(f"{cur} = {change.value(_num(head.cursor))}")
            # The waiting items' ages go with them; a take since the read added its own, which stay
            # (its positions are at or after the tail read, so they still wait).
            _add_created(change, waiting=-head.waiting_created)
            if dropped:
                change.deletes.append(
                    f"{change.name(schema.LOG_TOMBSTONES)} {change.value(_numbers(dropped))}"
                )
            if self._update(change, "clear") is None:
                self._backoff(attempt)
                continue
            if self._objects is not None and head.cursor < head.objects_end:
                self._release_cleared(key, head)
            return head.tail - head.cursor - len(dropped)
        raise StoreThrottledError("clear kept losing to concurrent claims; retry")

    def _release_cleared(self, key: LogKey, head: _Head) -> None:
        """The objects of the items a clear ended: those waiting when it cleared them, up to the
        log's ``objects_end`` (a tombstoned position's item was deleted or moved, with its object)."""
        end = min(head.tail, head.objects_end)
        position = head.cursor
        for _ in range(_CLEAR_PAGES):
            if position >= end:
                return
            rows = self._rows_forward(key, position, _CLEAR_PAGE)
            if not rows:
                return
            ended: list[str] = []
            for row in rows:
                at = _row_position(row)
                for offset, entry in enumerate(row.get(schema.LOG_ITEMS, {}).get("L", [])):
                    p = at + offset
                    object_key = _entry_object(entry["M"])
                    if object_key is not None and head.cursor <= p < end and p not in head.tombstones:
                        ended.append(object_key)
            self._release(ended, "clear")
            last = rows[-1]
            position = _row_position(last) + _row_length(last)
        if position < end:
            log.info("clear left payload objects to the sweep", extra={"from_position": position, "end": end})

    def _release_purged(self, key: LogKey) -> None:
        """Before a deleted queue's log goes: the objects of what it still held, waiting or leased,
        by the head's account, which names only live positions (a row also holds items that moved
        on, with their objects, to another queue). Then the head forgets its large size marks, so
        the purge's later calls (the head goes last) read nothing more for it."""
        attrs = self._read_head_attrs(key, "purge")
        head = _decode_head(attrs)
        if not attrs or head.first >= head.objects_end:
            return
        records = list(head.records.values())
        if head.spilled:
            records += self._every_spilled(key, "purge")
        live = {p for r in records for p in r.open()}
        live |= {p for p in range(head.cursor, head.tail) if p not in head.tombstones}
        self._release_positions(key, head, live, "purge")
        change = _Change(_key(key, schema.LOG_HEAD_SK))
        for name in attrs:
            step = schema.size_mark_step(name)
            if step is not None and step_bound(step) > OBJECT_PAYLOAD_BYTES:
                change.removes.append(change.name(name))
        change.conditions.append(f"attribute_exists({change.name(schema.LOG_TAIL)})")
        self._update(change, "purge")

    def sweep_payloads(self, *, now: datetime, limit: int) -> int:
        if self._objects is None:
            return 0
        return self._objects.sweep(now, limit=limit)

    def purge(self, key: LogKey, *, limit: int) -> int:
        if limit <= 0:
            return 0
        if self._objects is not None:
            self._release_purged(key)
        # The rows' key first (it holds nothing else), then the log's own, its head last.
        for pk in (_rows_pk(key), _pk(key)):
            rows, _ = self._query(
                "purge",
                KeyConditionExpression="#pk = :pk",
                ExpressionAttributeNames={"#pk": schema.PK, "#sk": schema.SK, "#po": schema.PAYLOAD_OBJECT},
                ExpressionAttributeValues={":pk": pk},
                ProjectionExpression="#pk, #sk, #po",
                Limit=limit + 1,
            )
            if not rows:
                continue
            if len(rows) <= limit or pk != _pk(key):
                # The rows' key, or the last page of the log's: everything read goes.
                chosen = rows[:limit]
            else:
                # The head goes last: other rows first.
                chosen = [r for r in rows if r[schema.SK]["S"] != schema.LOG_HEAD_SK][:limit]
            keys = [{schema.PK: r[schema.PK], schema.SK: r[schema.SK]} for r in chosen]
            # A scheduled item's row is live until it goes (a promoted or moved one's went then):
            # its object goes with it. Packed rows name none here (``_release_purged``).
            self._release((k for r in chosen if (k := _entry_object(r)) is not None), "purge")
            self._batch_delete(keys, "purge")
            return len(keys)
        return 0
