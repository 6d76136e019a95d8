"""Storage layer, engine v3's claim log on DynamoDB, the items role: the sequencer and packed rows of
an append, the schedule, the head, reads and listings, deletes (tombstones of waiting positions)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from querator.domain.errors import StoreThrottledError
from querator.domain.model import timestamp_us, utc_from_timestamp_us
from querator.domain.positions import (
    POSITION_MARK,
    SCHEDULED_MARK,
    parse_position_id,
    parse_scheduled_id,
    position_id,
)
from querator.ports import BatchResult, Guard
from querator.ports.log import LogHead, LogKey, Settlement
from querator.storage.dynamodb import codec, schema
from querator.storage.dynamodb.errors import translate
from querator.storage.dynamodb.log.base import (
    _RETRIES,
    AttributeMap,
    DynamoDBLogBase,
    _add_created,
    _Change,
    _decode_head,
    _entry,
    _entry_object,
    _entry_payload_bytes,
    _entry_seconds,
    _filler,
    _item,
    _key,
    _num,
    _numbers,
    _ordered,
    _pack,
    _pk,
    _row,
    _row_length,
    _row_position,
    _schedule_sk,
    _scheduled_id_for,
    _seconds,
    size_step,
)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime
    from typing import Any

    from querator.domain.model import Item


#: Positions ``get`` reads with one read of the rows between them when they are this close (a row
#: of small items holds ~100 of them), else apart: so a read never spans what nobody asked for.
_GET_GAP = 64
#: Waiting positions one head write deletes (each a condition of it: DynamoDB takes 4 KB of them).
_TOMBSTONES_PER_WRITE = 40


def _clusters(positions: Sequence[int], gap: int) -> list[list[int]]:
    """Sorted ``positions`` in runs whose neighbours are at most ``gap`` apart."""
    runs: list[list[int]] = []
    for position in positions:
        if runs and position - runs[-1][-1] <= gap:
            runs[-1].append(position)
        else:
            runs.append([position])
    return runs


class DynamoDBLogItems(DynamoDBLogBase):
    """``LogItemsPort`` on the items table."""

    def append(self, key: LogKey, items: Sequence[Item], *, now: datetime) -> list[Item]:
        now_us = timestamp_us(now)
        later_at = [
            n for n, item in enumerate(items) if item.enqueue_at is not None and item.enqueue_at > now
        ]
        ready_at = [n for n in range(len(items)) if n not in set(later_at)]
        stored: list[Item | None] = [None] * len(items)
        if ready_at:
            # Large payloads go to the bucket before the positions are taken: a bucket that
            # fails the upload fails the produce with no position taken (no hole for a claim to wait
            # out, nothing counted). ``write_taken`` finds them uploaded.
            ready, _, _ = self._stored([items[n] for n in ready_at])
            ids = self._take(
                key, len(ready), now_us, max(i.reply_size() for i in ready), created=_seconds(ready)
            )
            for n, item in zip(ready_at, self.write_taken(key, ids, ready, now=now), strict=True):
                stored[n] = item
        if later_at:
            for n, item in zip(later_at, self._schedule(key, [items[n] for n in later_at], now), strict=True):
                stored[n] = item
        return [item for item in stored if item is not None]

    def take_positions(
        self, key: LogKey, count: int, *, now: datetime, created: int = 0, largest: int = 0
    ) -> list[str]:
        return self._take(key, count, timestamp_us(now), largest, created=created)

    def _take(
        self, key: LogKey, count: int, now_us: int, largest: int, *, produced: bool = True, created: int = 0
    ) -> list[str]:
        """The sequencer write; it also counts the items as produced (``produced``: not for a late
        writer's second positions) and adds their ``created`` seconds to the waiting items' (a late
        writer's second positions add none: its first take did), so counting costs no write of its
        own. ``largest`` (the items' largest reply size) marks its size step's end at the new tail
        in the same write (``_waiting_largest``), so a claim is sized by it from the take on."""
        change = _Change(_key(key, schema.LOG_HEAD_SK))
        tail, cur = change.name(schema.LOG_TAIL), change.name(schema.LOG_CURSOR)
        records, starts = change.name(schema.LOG_RECORDS), change.name(schema.LOG_STARTS)
        now_v, empty = change.value(_num(now_us)), change.value({"M": {}})
        # The sequencer: never fails. A new log starts at the microsecond clock (positions of a queue
        # created again under the same name start above its earlier life's).
        change.sets += [
            f"{tail} = if_not_exists({tail}, {now_v}) + {change.value(_num(count))}",
            f"{cur} = if_not_exists({cur}, {now_v})",
            f"{change.name(schema.LOG_FIRST)} = if_not_exists({change.name(schema.LOG_FIRST)}, {now_v})",
            f"{records} = if_not_exists({records}, {empty})",
            f"{starts} = if_not_exists({starts}, {empty})",
        ]
        if produced:
            change.adds.append(f"{change.name(schema.LOG_PRODUCED)} {change.value(_num(count))}")
        step = size_step(largest)
        if step is not None:
            # The new tail, from the same tail the sequencer adds to (were one SET's actions applied
            # in order, it would be the tail after, which marks further: still a bound).
            ends = f"if_not_exists({tail}, {now_v}) + {change.value(_num(count))}"
            change.sets.append(f"{change.name(schema.log_size_mark(step))} = {ends}")
        _add_created(change, waiting=created)
        head = _decode_head(self._update(change, "produce", returns="ALL_NEW"))
        first = head.tail - count
        return [position_id(key.lane, first + n) for n in range(count)]

    def write_taken(
        self, key: LogKey, ids: Sequence[str], items: Sequence[Item], *, now: datetime
    ) -> list[Item]:
        positions = [self._position(key, item_id) for item_id in ids]
        # Large payloads go to the bucket before the rows that name them: a row never names
        # an object that is not there. A writer that dies between the two leaves objects nothing
        # names, which the reaper's sweep deletes past their time.
        items, _, _ = self._stored(items)
        entries = [_entry(item) for item in items]
        spans = _pack(entries)
        unused: list[str] = []

        def put(span: range) -> bool:
            row = _row(key, positions[span.start], [entries[i] for i in span], [items[i] for i in span])
            if self._put_absent(row, "produce"):
                return True
            # Taken: by a filler (this writer was taken for dead), or by an earlier try of this
            # same write (an idempotent produce retried), which stays as it is.
            there = self._get_row(key, positions[span.start])
            ours = there is not None and schema.LOG_FILLER not in there
            if ours:
                # The earlier try's row names its own objects: the ones this try made are unused.
                unused.extend(k for i in span if (k := items[i].payload_object))
            return ours

        if self._concurrency <= 1 or len(spans) <= 1:
            # One at a time, in order: the first row found filled stops the write, and it and every
            # row after it go to new positions (the port's order for a writer taken for dead).
            written: list[bool] = []
            for span in spans:
                # After a filled row: not written here, moved with it.
                written.append(put(span) if not written or written[-1] else False)
        else:
            # In parallel (a big append): a row found filled moves; rows after it that were written
            # stay where they are (delivered once all the same, ahead of the moved row).
            written = self._each(put, spans)
        stored = [
            replace(item, id=position_id(key.lane, positions[n]), lease_deadline=None)
            for n, item in enumerate(items)
        ]
        late = [i for span, ok in zip(spans, written, strict=True) if not ok for i in span]
        given_up = [span for n, span in enumerate(spans) if not written[n] and n and not written[n - 1]]
        for span in given_up:
            # A row after the filled one, never written: its positions are filled now, by this
            # writer (they are its own), so no claim waits HOLE_TIMEOUT for them.
            self._put_absent(_filler(key, positions[span.start], now, len(span)), "produce")
        self._release(unused, "produce")
        if late:
            # A lease took this writer for dead and filled the row's first position: its items (and,
            # written one at a time, the rows after it) go to new positions at the tail.
            moved = [items[i] for i in late]
            again = self.write_taken(
                key,
                self._take(
                    key, len(moved), timestamp_us(now), max(i.reply_size() for i in moved), produced=False
                ),
                moved,
                now=now,
            )
            for index, item in zip(late, again, strict=True):
                stored[index] = item
        return stored

    def _schedule(self, key: LogKey, items: Sequence[Item], now: datetime) -> list[Item]:
        items, _, _ = self._stored(items)
        stored = [replace(item, id=_scheduled_id_for(key.lane, item), lease_deadline=None) for item in items]
        self._each(
            lambda item: self._put_absent(
                {**_key(key, _schedule_sk(item.id, key.lane)), **_entry(item)}, "produce"
            ),
            stored,
        )
        earliest = min(timestamp_us(item.enqueue_at) for item in items if item.enqueue_at is not None)
        # Count them, and lower the head's next due time (a lower bound) when these are due sooner.
        for lower in (True, False):
            change = _Change(_key(key, schema.LOG_HEAD_SK))
            change.adds += [
                f"{change.name(schema.LOG_PRODUCED)} {change.value(_num(len(items)))}",
                f"{change.name(schema.LOG_SCHEDULED)} {change.value(_num(len(items)))}",
                f"{change.name(schema.LOG_SCHEDULE_VERSION)} {change.value(_num(1))}",
            ]
            if lower:
                nd, due = change.name(schema.LOG_NEXT_DUE), change.value(_num(earliest))
                change.sets.append(f"{nd} = {due}")
                change.conditions.append(f"attribute_not_exists({nd}) OR {nd} > {due}")
            if self._update(change, "produce") is not None:
                break
        return stored

    def head(self, key: LogKey) -> LogHead:
        head = self._head(key, "stats")
        expiries = [r.deadline for r in head.records.values()]
        if head.spilled and head.spilled_expiry is not None:
            expiries.append(head.spilled_expiry)
        return LogHead(
            tail=head.tail,
            cursor=head.cursor,
            skipped=sum(1 for p in head.tombstones if head.cursor <= p < head.tail),
            leases=len(head.records) + head.spilled,
            leased=head.leased,
            scheduled=head.scheduled,
            next_expiry=utc_from_timestamp_us(min(expiries)) if expiries else None,
            next_due=utc_from_timestamp_us(head.next_due)
            if head.scheduled and head.next_due is not None
            else None,
            largest=head.largest,
            produced=head.produced,
            completed=head.completed,
        )

    def get(self, key: LogKey, ids: Sequence[str], *, now: datetime) -> dict[str, Item]:
        found: dict[str, Item] = {}
        positions: dict[int, str] = {}
        scheduled: list[str] = []
        for item_id in dict.fromkeys(ids):
            parsed = parse_position_id(item_id)
            if parsed is not None and parsed[0] == key.lane:
                positions[parsed[1]] = item_id
            elif (sched := parse_scheduled_id(item_id)) is not None and sched[0] == key.lane:
                scheduled.append(item_id)
        if positions:
            head = self._head(key, "get")
            records = self._locate(key, head, sorted(positions), "get")
            wanted = [
                p
                for p in positions
                if p in records or (head.cursor <= p < head.tail and p not in head.tombstones)
            ]
            # One read of the rows under each cluster of nearby positions (a retry of a whole lease
            # reads its run's rows once), not one per id: O(rows holding them).
            read: dict[int, AttributeMap] = {}
            for cluster in _clusters(sorted(wanted), _GET_GAP):
                read.update(self._read_positions(key, cluster, "get").items)
            for p in wanted:
                if p not in read:
                    continue
                item = _item(read[p], positions[p])
                record = records.get(p)
                if record is not None:
                    item = replace(
                        record.coming(item, p),
                        attempts=item.attempts + 1,
                        lease_deadline=utc_from_timestamp_us(record.deadline),
                    )
                found[positions[p]] = item
        if scheduled:
            keys = [_key(key, _schedule_sk(item_id, key.lane)) for item_id in scheduled]
            for attrs in self._batch_get(keys, "get"):
                item_id = f"{key.lane}{SCHEDULED_MARK}{attrs[schema.SK]['S'][1:]}"
                found[item_id] = _item(
                    {k: v for k, v in attrs.items() if k not in (schema.PK, schema.SK)}, item_id
                )
        wanted_ids = [item_id for item_id in ids if item_id in found]
        return dict(zip(wanted_ids, self._with_payloads([found[i] for i in wanted_ids]), strict=True))

    def list_items(
        self,
        key: LogKey,
        *,
        after: str,
        limit: int,
        now: datetime,
        max_bytes: int | None = None,
        schedule: bool = True,
    ) -> list[Item]:
        if limit <= 0:
            return []
        page = _Page(limit, max_bytes)
        position_floor = f"{key.lane}{POSITION_MARK}"
        schedule_floor = f"{key.lane}{SCHEDULED_MARK}"
        if after < schedule_floor:
            head = self._head(key, "list")
            records = list(head.records.values())
            if head.spilled:
                records += self._every_spilled(key, "list")
            held = {p: r for r in records for p in r.open()}
            parsed = parse_position_id(after) if after >= position_floor else None
            first = parsed[1] + 1 if parsed is not None and parsed[0] == key.lane else 0
            lowest = min([*held, head.cursor])
            position = max(first, lowest)
            while position < head.tail and not page.full:
                rows = self._rows_forward(key, position, limit)
                if not rows:
                    break
                for row in rows:
                    at = _row_position(row)
                    if schema.LOG_FILLER in row:
                        continue
                    for offset, entry in enumerate(row.get(schema.LOG_ITEMS, {}).get("L", [])):
                        p = at + offset
                        if p < position or page.full:
                            continue
                        item = _item(entry["M"], position_id(key.lane, p))
                        size = _entry_payload_bytes(entry["M"])
                        if p in held:
                            # As the claim handed it out: this lease's attempt counted (the row
                            # keeps the attempts before it), as ``get`` shows it.
                            page.add(
                                replace(
                                    held[p].coming(item, p),
                                    attempts=item.attempts + 1,
                                    lease_deadline=utc_from_timestamp_us(held[p].deadline),
                                ),
                                size,
                            )
                        elif head.cursor <= p < head.tail and p not in head.tombstones:
                            page.add(item, size)
                last = rows[-1]
                length = _row_length(last)
                position = _row_position(last) + length
        if schedule and not page.full:
            start = _schedule_sk(after, key.lane) if after > schedule_floor else schema.LOG_SCHEDULE_PREFIX
            # A Query answers at most 1 MB: a page of large items comes back short of its Limit with
            # a key to go on from, which is read on (a short page is not the schedule's end). The
            # first may hold ``after`` itself.
            extra = 1
            start_key: AttributeMap | None = None
            while True:
                more: dict[str, Any] = {} if start_key is None else {"ExclusiveStartKey": start_key}
                rows, start_key = self._query(
                    "list",
                    KeyConditionExpression="#pk = :pk AND #sk BETWEEN :lo AND :hi",
                    ExpressionAttributeNames={"#pk": schema.PK, "#sk": schema.SK},
                    ExpressionAttributeValues={
                        ":pk": _pk(key),
                        ":lo": {"S": start},
                        ":hi": {"S": f"{schema.LOG_SCHEDULE_PREFIX}~"},
                    },
                    Limit=limit - len(page.items) + extra,
                    **more,
                )
                extra = 0
                for attrs in rows:
                    item_id = f"{key.lane}{SCHEDULED_MARK}{attrs[schema.SK]['S'][1:]}"
                    if item_id > after and not page.full:
                        entry = {k: v for k, v in attrs.items() if k not in (schema.PK, schema.SK)}
                        page.add(_item(entry, item_id), _entry_payload_bytes(entry))
                if start_key is None or page.full:
                    break
        return self._with_payloads(page.items)

    def delete(self, key: LogKey, ids: Sequence[str], *, now: datetime) -> BatchResult[str]:
        result: BatchResult[str] = BatchResult()
        positions: dict[int, str] = {}
        for item_id in ids:
            parsed = parse_position_id(item_id)
            if parsed is not None and parsed[0] == key.lane and parsed[1] not in positions:
                positions[parsed[1]] = item_id
            elif (due := parse_scheduled_id(item_id)) is not None and due[0] == key.lane:
                if self._delete_scheduled(key, item_id):
                    result.applied.append(item_id)
                else:
                    result.rejected.append(item_id)
            else:
                result.rejected.append(item_id)
        for attempt in range(_RETRIES + 1):
            if not positions:
                return _ordered(result, ids)
            head = self._head(key, "delete")
            waiting = sorted(
                p for p in positions if head.cursor <= p < head.tail and p not in head.tombstones
            )
            leased = [p for p in positions if p < head.cursor]
            for p in [p for p in positions if p >= head.tail or p in head.tombstones]:
                result.rejected.append(positions.pop(p))
            if leased:
                settled = self.settle(
                    key, [Settlement(id=positions[p]) for p in leased], guard=Guard.ANY, now=now
                )
                result.applied.extend(settled.applied)
                result.rejected.extend(settled.rejected)
                for p in leased:
                    positions.pop(p)
            if not waiting:
                continue
            found = self._read_positions(key, waiting, "delete")
            for p in [p for p in waiting if p not in found.items]:
                result.rejected.append(positions.pop(p))
            waiting = [p for p in waiting if p in found.items]
            if not waiting:
                continue
            for at in range(0, len(waiting), _TOMBSTONES_PER_WRITE):
                chunk = waiting[at : at + _TOMBSTONES_PER_WRITE]
                change = _Change(_key(key, schema.LOG_HEAD_SK))
                tb = change.name(schema.LOG_TOMBSTONES)
                change.adds.append(f"{tb} {change.value(_numbers(chunk))}")
                # Still waiting: a claim that took them meanwhile makes this a settle of leased ones;
                # and not deleted by another call meanwhile, whose tombstone took their ages already.
                cursor_bound = change.value(_num(chunk[0]))
                change.conditions.append(f"{change.name(schema.LOG_CURSOR)} <= {cursor_bound}")
                change.conditions += [f"NOT contains({tb}, {change.value(_num(p))})" for p in chunk]
                _add_created(change, waiting=-_entry_seconds(found.items[p] for p in chunk))
                if self._update(change, "delete") is None:
                    self._backoff(attempt)
                    break  # read the head again for the rest
                for p in chunk:
                    result.applied.append(positions.pop(p))
                self._release(
                    (k for p in chunk if (k := _entry_object(found.items[p])) is not None), "delete"
                )
        if positions:
            raise StoreThrottledError("delete kept losing to concurrent claims; retry")
        return _ordered(result, ids)

    def _delete_scheduled(self, key: LogKey, item_id: str) -> bool:
        try:
            reply = self._client.delete_item(
                TableName=self._table, Key=_key(key, _schedule_sk(item_id, key.lane)), ReturnValues="ALL_OLD"
            )
        except ClientError as exc:
            raise translate(exc, "delete") from exc
        old = codec.returned(reply, "Attributes")
        if old is None:
            return False
        change = _Change(_key(key, schema.LOG_HEAD_SK))
        change.adds.append(f"{change.name(schema.LOG_SCHEDULED)} {change.value(_num(-1))}")
        self._update(change, "delete")
        if (ended := _entry_object(old)) is not None:
            self._release([ended], "delete")
        return True


class _Page:
    """The items a listing gathers: up to ``limit``, and (``max_bytes``) until their payloads pass
    ``max_bytes``, the item that passes it listed last (``ClaimLog.list_items``)."""

    __slots__ = ("items", "limit", "room")

    def __init__(self, limit: int, max_bytes: int | None) -> None:
        self.items: list[Item] = []
        self.limit = limit
        self.room = max_bytes

    @property
    def full(self) -> bool:
        return len(self.items) >= self.limit or (self.room is not None and self.room < 0)

    def add(self, item: Item, payload_bytes: int) -> None:
        """``payload_bytes``: the item's payload size (read before a payload in the bucket is)."""
        self.items.append(item)
        if self.room is not None:
            self.room -= payload_bytes
