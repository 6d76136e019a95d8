"""Storage layer, the DynamoDB item store's items role: the head row read, writes of new items
(batched, or one conditional put each), reads by key range and by id, guarded deletes and moves
(a two-item transaction each)."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from querator.domain.ids import ITEMS_END, key_after, visible_bound
from querator.domain.priority import lane_of
from querator.ports import BatchResult, Guard, LeaseRecord, Page, PartitionHead
from querator.storage.counters import CounterDeltas, scheduled_when_written, still_scheduled
from querator.storage.dynamodb import codec, expressions, schema
from querator.storage.dynamodb.base import (
    _TRANSACTION_RETRIES,
    CONDITION_FAILED,
    DynamoDBStoreBase,
    _last_below,
)
from querator.storage.dynamodb.errors import error_code, translate

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence
    from datetime import datetime

    from querator.domain.model import Item, ItemState
    from querator.ports import Move


class DynamoDBItems(DynamoDBStoreBase):
    """``ItemsPort`` on the items table."""

    def head(
        self, queue: str, partition: int, *, now: datetime, records: int = 0
    ) -> tuple[PartitionHead, list[LeaseRecord]]:
        # The head row sorts just before the lease records, so one Query reads it and the records
        # already due: a lease learns where to start and what to put back in one request.
        try:
            reply = self._client.query(
                TableName=self._table,
                KeyConditionExpression="pk = :pk AND sk BETWEEN :head AND :due",
                ExpressionAttributeValues={
                    ":pk": {"S": schema.partition_key(queue, partition)},
                    ":head": {"S": schema.HEAD_SK},
                    ":due": {"S": codec.lease_records_due(now)},
                },
                Limit=records + 1,
                ConsistentRead=True,
            )
        except ClientError as exc:
            raise translate(exc, "lease") from exc
        head_attrs = None
        found: list[LeaseRecord] = []
        for attrs in codec.rows(reply):
            if attrs[schema.SK]["S"] == schema.HEAD_SK:
                head_attrs = attrs
            elif len(found) < records:
                found.append(codec.decode_lease_record(attrs))
        return codec.decode_head(head_attrs), found

    def heads(self, queue: str, partitions: Sequence[int]) -> list[PartitionHead]:
        keys = [codec.head_key(queue, p) for p in partitions]
        found = {
            attrs[schema.PK]["S"]: attrs
            for attrs in self._batch_get(keys, projection=None, operation="stats")
        }
        return [codec.decode_head(found.get(schema.partition_key(queue, p))) for p in partitions]

    def put_new(self, queue: str, partition: int, items: Sequence[Item], *, now: datetime) -> None:
        self.register_bands(queue, partition, (item.id for item in items), now=now)
        requests = [{"PutRequest": {"Item": codec.encode_item(queue, partition, item)}} for item in items]
        self._batch_write(requests, "produce")
        self._count_added(queue, partition, items, now)

    def put_absent(
        self, queue: str, partition: int, items: Sequence[Item], *, now: datetime
    ) -> BatchResult[str]:
        result: BatchResult[str] = BatchResult()
        written = []
        self.register_bands(queue, partition, (item.id for item in items), now=now)
        for item in items:
            if self._put_if_absent(codec.encode_item(queue, partition, item)):
                written.append(item)
                result.applied.append(item.id)
            else:
                result.rejected.append(item.id)
        self._count_added(queue, partition, written, now)
        return result

    def count_added(self, queue: str, partition: int, items: Iterable[Item], *, now: datetime) -> None:
        """Count items a caller wrote itself (the Spark producer's chunk writer) in the partition's head."""
        self._count_added(queue, partition, items, now)

    def _count_added(self, queue: str, partition: int, items: Iterable[Item], now: datetime) -> None:
        counts = CounterDeltas()
        for item in items:
            counts.add(
                item.created_at,
                sign=1,
                leased=item.lease_deadline is not None,
                scheduled=scheduled_when_written(item, now),
            )
        # Every write of new items is production: produce, its resumption, import, the Spark writer.
        counts.produced = counts.items
        if counts.items:
            # The schedule mark starts at the partition's first write: the first schedule pass then
            # reads only what was written since, never the partition from its beginning.
            self._update_head(queue, partition, counts, init_marks=now, operation="produce")

    def _put_if_absent(self, attrs: codec.AttributeMap) -> bool:
        try:
            self._client.put_item(
                TableName=self._table,
                Item=attrs,
                ConditionExpression=expressions.PUT_ABSENT_CONDITION,
                ExpressionAttributeNames=expressions.PUT_ABSENT_NAMES,
            )
        except ClientError as exc:
            if error_code(exc) == CONDITION_FAILED:
                return False
            raise translate(exc, "put") from exc
        return True

    def scan(
        self,
        queue: str,
        partition: int,
        *,
        start: str,
        end: str,
        limit: int,
        available_at: datetime | None = None,
        never_leased: bool = False,
        scheduled_only: bool = False,
    ) -> Page:
        if start >= end:
            return Page(read_to=end)
        names = dict(expressions.STATE_PROJECTION_NAMES)
        values: dict[str, Any] = {
            ":pk": {"S": schema.partition_key(queue, partition)},
            ":last": {"S": _last_below(end)},
        }
        if start:
            condition = "pk = :pk AND sk BETWEEN :start AND :last"
            values[":start"] = {"S": start}
        else:
            condition = "pk = :pk AND sk <= :last"
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": condition,
            "ProjectionExpression": expressions.STATE_PROJECTION,
            "Limit": limit,
            # Candidates for conditional writes: a stale read would only spend writes on lost claims.
            "ConsistentRead": True,
        }
        filters: list[str] = []
        if available_at is not None:
            filters.append(f"({expressions.AVAILABLE_FILTER})")
            names.update(expressions.AVAILABLE_FILTER_NAMES)
            values[":now"] = codec.num(available_at)
        if never_leased:
            filters.append(f"({expressions.NEVER_LEASED_FILTER})")
            names.update(expressions.NEVER_LEASED_FILTER_NAMES)
        if scheduled_only:
            filters.append(f"({expressions.SCHEDULED_FILTER})")
            names.update(expressions.SCHEDULED_FILTER_NAMES)
        if filters:
            kwargs["FilterExpression"] = " AND ".join(filters)
        kwargs["ExpressionAttributeNames"] = names
        kwargs["ExpressionAttributeValues"] = values
        try:
            reply = self._client.query(**kwargs)
        except ClientError as exc:
            raise translate(exc, "scan") from exc
        last = codec.last_key(reply)
        return Page(
            items=[codec.decode_state(attrs) for attrs in codec.rows(reply)],
            read_to=end if last is None else key_after(str(last[schema.SK]["S"])),
            done=last is None,
            # What the key range held before the filter (DynamoDB's ScannedCount).
            evaluated=int(reply.get("ScannedCount", 0)),
        )

    def states(self, queue: str, partition: int, ids: Sequence[str]) -> list[ItemState]:
        keys = [codec.item_key(queue, partition, i) for i in dict.fromkeys(ids)]
        projection = (expressions.STATE_PROJECTION, expressions.STATE_PROJECTION_NAMES)
        # Eventually consistent, at half the units: these are a due lease record's ids, leased a
        # lease timeout ago, and whatever is done with them next is a guarded write.
        found = self._batch_get(keys, projection=projection, operation="lease", consistent=False)
        return [codec.decode_state(a) for a in found]

    def get_many(self, queue: str, partition: int, ids: Sequence[str]) -> dict[str, Item]:
        keys = [codec.item_key(queue, partition, i) for i in dict.fromkeys(ids)]
        items = (codec.decode_item(a) for a in self._batch_get(keys, projection=None, operation="get"))
        return {item.id: item for item in items}

    def list_items(
        self,
        queue: str,
        partition: int,
        *,
        limit: int,
        pivot: str = "",
        lower: str = "",
        upper: str = "",
        max_bytes: int | None = None,
    ) -> list[Item]:
        """Whole items in id order, from ``max(pivot, lower)`` inclusive to ``upper`` exclusive."""
        start = max(pivot, lower)
        last = _last_below(upper or ITEMS_END)
        if start > last:
            return []
        values: dict[str, Any] = {":pk": {"S": schema.partition_key(queue, partition)}, ":last": {"S": last}}
        if start:
            condition = "pk = :pk AND sk BETWEEN :start AND :last"
            values[":start"] = {"S": start}
        else:
            condition = "pk = :pk AND sk <= :last"
        items: list[Item] = []
        size = 0
        start_key: dict[str, Any] | None = None
        while len(items) < limit:
            kwargs: dict[str, Any] = {
                "TableName": self._table,
                "KeyConditionExpression": condition,
                "ExpressionAttributeValues": values,
                "Limit": limit - len(items),
            }
            if start_key is not None:
                kwargs["ExclusiveStartKey"] = start_key
            try:
                reply = self._client.query(**kwargs)
            except ClientError as exc:
                raise translate(exc, "list") from exc
            for attrs in codec.rows(reply):
                item = codec.decode_item(attrs)
                size += len(item.payload)
                if max_bytes is not None and items and size > max_bytes:
                    return items
                items.append(item)
            start_key = codec.last_key(reply)
            if start_key is None:
                break
        return items

    def iter_items(self, queue: str, partition: int, *, page_size: int = 500) -> Iterator[Item]:
        pivot = ""
        while True:
            page = self.list_items(queue, partition, limit=page_size + 1, pivot=pivot)
            yield from page[:page_size]
            if len(page) <= page_size:
                return
            pivot = page[page_size].id

    def get(self, queue: str, partition: int, item_id: str) -> Item | None:
        try:
            reply = self._client.get_item(
                TableName=self._table, Key=codec.item_key(queue, partition, item_id), ConsistentRead=True
            )
        except ClientError as exc:
            raise translate(exc, "get") from exc
        attrs = codec.returned(reply, "Item")
        return None if attrs is None else codec.decode_item(attrs)

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
        condition, names = ("", {}) if guard is Guard.ANY else expressions.GUARD_CONDITIONS[guard]

        def delete_one(item_id: str) -> tuple[str, codec.AttributeMap | None, bool]:
            kwargs: dict[str, Any] = {
                "TableName": self._table,
                "Key": codec.item_key(queue, partition, item_id),
                # Free with the write: what was deleted, so the counters lose exactly that.
                "ReturnValues": "ALL_OLD",
            }
            if condition:
                kwargs["ConditionExpression"] = condition
                kwargs["ExpressionAttributeNames"] = names
                if ":now" in condition:
                    kwargs["ExpressionAttributeValues"] = {":now": codec.num(now)}
            try:
                reply = self._client.delete_item(**kwargs)
            except ClientError as exc:
                if error_code(exc) == CONDITION_FAILED:
                    return item_id, None, False
                raise translate(exc, "delete") from exc
            return item_id, codec.returned(reply, "Attributes"), True

        results = self._each(delete_one, list(dict.fromkeys(ids)))
        removed = [codec.decode_state(attrs) for _, attrs, ok in results if ok and attrs]
        if removed:
            counts = CounterDeltas()
            mark = self._schedule_mark_if_needed(queue, partition, removed, now)
            for state in removed:
                counts.add(
                    state.created_at,
                    sign=-1,
                    leased=state.lease_deadline is not None,
                    scheduled=still_scheduled(state, mark),
                )
            if completed:
                counts.completed = len(removed)
            self._update_head(queue, partition, counts, operation="delete")
        return BatchResult(
            applied=[item_id for item_id, _, ok in results if ok],
            rejected=[item_id for item_id, _, ok in results if not ok],
        )

    def _schedule_mark_if_needed(
        self, queue: str, partition: int, states: Iterable[ItemState | Item], now: datetime
    ) -> str:
        """The schedule mark, read only when an item that was scheduled is among ``states``.

        Read rather than guessed from ``now``: a schedule pass with a later clock may have taken
        the item off the scheduled count already, and must not see it taken off twice.
        """
        if any(s.enqueue_at is not None for s in states):
            return self.head(queue, partition, now=now)[0].schedule_mark
        return visible_bound(now)

    def move(
        self, queue: str, partition: int, moves: Sequence[Move], *, guard: Guard, now: datetime
    ) -> BatchResult[str]:
        condition, names = expressions.GUARD_CONDITIONS[guard]
        # A replacement in a band or group lane its partition may not name yet (a retry with a new
        # priority, a dead letter, a redrive) registers it first; a requeue in its own band or lane
        # and partition does not (the item being moved keeps it from being dropped as empty).
        arriving: dict[tuple[str, int], set[str]] = defaultdict(set)
        for m in moves:
            lane = lane_of(m.replacement.id)
            elsewhere = (m.target_queue, m.target_partition) != (queue, partition)
            if lane and (lane != lane_of(m.item.id) or elsewhere):
                arriving[m.target_queue, m.target_partition].add(m.replacement.id)
        for (target_queue, target_partition), ids in arriving.items():
            self.register_bands(target_queue, target_partition, ids, now=now)

        def move_one(move: Move) -> bool:
            delete: dict[str, Any] = {
                "TableName": self._table,
                "Key": codec.item_key(queue, partition, move.item.id),
                "ConditionExpression": condition,
                "ExpressionAttributeNames": names,
            }
            if ":now" in condition:
                delete["ExpressionAttributeValues"] = {":now": codec.num(now)}
            put: dict[str, Any] = {
                "TableName": self._table,
                "Item": codec.encode_item(move.target_queue, move.target_partition, move.replacement),
                "ConditionExpression": expressions.PUT_ABSENT_CONDITION,
                "ExpressionAttributeNames": expressions.PUT_ABSENT_NAMES,
            }
            for attempt in range(_TRANSACTION_RETRIES + 1):
                try:
                    # The stubs' TypedDicts want literal keys; the dicts above are built incrementally.
                    transaction: Any = [{"Delete": delete}, {"Put": put}]
                    self._client.transact_write_items(TransactItems=transaction)
                except ClientError as exc:
                    reasons = [r.get("Code", "") for r in exc.response.get("CancellationReasons", [])]
                    cancelled = error_code(exc) == "TransactionCanceledException"
                    if cancelled and "ConditionalCheckFailed" in reasons:
                        return False  # the item is no longer in the guarded state: someone else acted
                    if cancelled and "TransactionConflict" in reasons and attempt < _TRANSACTION_RETRIES:
                        self._sleep(random.uniform(0, 0.01 * 2**attempt))  # noqa: S311
                        continue
                    raise translate(exc, "move") from exc
                return True
            return False  # pragma: no cover - the loop returns or raises

        done = self._each(move_one, list(moves))
        moved = [m for m, ok in zip(moves, done, strict=True) if ok]
        if moved:
            self._count_moves(queue, partition, moved, now)
        return BatchResult(
            applied=[m.item.id for m in moved],
            rejected=[m.item.id for m, ok in zip(moves, done, strict=True) if not ok],
        )

    def _count_moves(self, queue: str, partition: int, moved: Sequence[Move], now: datetime) -> None:
        deltas: dict[tuple[str, int], CounterDeltas] = defaultdict(CounterDeltas)
        mark = self._schedule_mark_if_needed(queue, partition, (m.item for m in moved), now)
        for m in moved:
            source = m.item
            deltas[queue, partition].add(
                source.created_at,
                sign=-1,
                leased=source.lease_deadline is not None,
                scheduled=still_scheduled(source, mark),
            )
            target = m.replacement
            deltas[m.target_queue, m.target_partition].add(
                target.created_at,
                sign=1,
                leased=target.lease_deadline is not None,
                scheduled=scheduled_when_written(target, now),
            )
        for (target_queue, target_partition), counts in deltas.items():
            marks = now if (target_queue, target_partition) != (queue, partition) else None
            self._update_head(target_queue, target_partition, counts, init_marks=marks, operation="move")
