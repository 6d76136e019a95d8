"""Storage layer: the item store on one DynamoDB table (docs/adr/0050-engine-v2.md).

Adapter notes, where it deviates from or adds to the ``ItemStore`` port:

- Under one partition key live the items (ids sort in FIFO order), the partition's head row (lease
  cursor, marks, counters) and lease records keyed by deadline (``schema``). Every read is a key
  range of what the caller needs; nothing reads a partition whole except ``iter_items`` (tests,
  exports) and ``source_ids`` (import).
- Writes of fresh ids go out as ``BatchWriteItem`` (25 a request); unprocessed items are retried with
  backoff and, when retries run out, the call raises ``StoreThrottledError``: it never reports a
  write that did not happen.
- Every write that must not race is a single conditional request (``expressions``); a move between
  two keys is a two-item transaction, so an item is never lost or doubled between them. Batches of
  such writes (claims, completes, moves) run on a small thread pool, so a 1,000-item call costs
  tens of round trips, not a thousand.
- Counters are added in one ``UpdateItem`` per call and partition after the items' write. If that
  write fails the items' write still stands and the error is logged: a counter may drift, an item
  is never lost or reported wrongly.
- The boto3 client is injected; botocore's own retries (standard mode) sit below this code.
"""

from __future__ import annotations

import logging
import random
import secrets
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import ClientError

from querator.domain.errors import QueratorError, StoreThrottledError
from querator.domain.ids import ITEMS_END, key_after, visible_bound
from querator.domain.priority import band_of
from querator.ports import BatchResult, Guard, IdempotencyRecord, LeaseRecord, Page, PartitionHead, Recount
from querator.storage.counters import CounterDeltas, scheduled_when_written, still_scheduled
from querator.storage.dynamodb import codec, expressions, schema
from querator.storage.dynamodb.errors import error_code, translate, translating_no_reply

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence
    from datetime import datetime

    from mypy_boto3_dynamodb import DynamoDBClient

    from querator.domain.model import Item, ItemState
    from querator.ports import Move

log = logging.getLogger(__name__)

BATCH_WRITE_LIMIT = 25
BATCH_GET_LIMIT = 100
CONDITION_FAILED = "ConditionalCheckFailedException"
#: Conditional writes of one call in flight at once: enough to turn 1,000 claims into ~60 round
#: trips, few enough that one call does not hog a partition's 1,000 writes a second.
WRITE_CONCURRENCY = 16
_UNPROCESSED_RETRIES = 8
_TRANSACTION_RETRIES = 3

T = TypeVar("T")
R = TypeVar("R")


def _last_below(end: str) -> str:
    """A key just below ``end`` that no item id lies between: ``BETWEEN`` is inclusive at both ends.

    Item ids are lowercase hex; ``~`` sorts after every hex digit, so ``<end minus one step>~`` sorts
    after every id below ``end`` and before ``end``.
    """
    return f"{end[:-1]}{chr(ord(end[-1]) - 1)}~"


def _add_clauses(counts: CounterDeltas) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """The ``ADD`` clauses, names and values of the non-zero deltas, and a version step when any
    counter changes (a recount in progress learns of every change by it)."""
    pairs = [
        ("#n", counts.items),
        ("#nl", counts.leased),
        ("#ns", counts.scheduled),
        ("#ca", counts.created),
        ("#cl", counts.leased_created),
        ("#cs", counts.scheduled_created),
        ("#tp", counts.produced),
        ("#tc", counts.completed),
    ]
    used = [(name, value) for name, value in pairs if value]
    if used:
        used.append(("#ver", 1))
    parts = [f"{name} :{name[1:]}" for name, _ in used]
    known = {**expressions.HEAD_COUNT_UPDATE_NAMES, **expressions.HEAD_TOTAL_NAMES}
    names = {name: known[name] for name, _ in used}
    values = {f":{name[1:]}": {"N": str(value)} for name, value in used}
    return parts, names, values


class DynamoDBItemStore:
    """Items of every queue in one table, a queue partition per partition key."""

    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        *,
        sleep: Callable[[float], None] = time.sleep,
        concurrency: int = WRITE_CONCURRENCY,
    ) -> None:
        self._client = translating_no_reply(client)
        self._table = table_name
        self._sleep = sleep
        self._concurrency = concurrency
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def _each(self, function: Callable[[T], R], values: Sequence[T]) -> list[R]:
        """``function`` over ``values`` with up to ``concurrency`` in flight; results in order.

        The first error is raised after every call has finished, so no write is left in flight.
        """
        if len(values) <= 1 or self._concurrency <= 1:
            return [function(v) for v in values]
        with self._pool_lock:
            if self._pool is None:
                # Lazily, and once per store: a warm Lambda reuses its threads across invocations.
                self._pool = ThreadPoolExecutor(self._concurrency, thread_name_prefix="querator-store")
            pool = self._pool
        futures = [pool.submit(function, v) for v in values]
        results: list[R] = []
        error: BaseException | None = None
        for future in futures:
            try:
                results.append(future.result())
            except BaseException as exc:  # re-raised below, once every call has ended
                error = error or exc
        if error is not None:
            raise error
        return results

    # -- the head row ------------------------------------------------------------------------------

    def _update_head(
        self,
        queue: str,
        partition: int,
        counts: CounterDeltas | None,
        *,
        cursor: str | None = None,
        init_marks: datetime | None = None,
        operation: str,
    ) -> None:
        """Add ``counts`` (and set the cursor / initial marks) in one write; log, never raise."""
        adds, names, values = _add_clauses(counts) if counts is not None else ([], {}, {})
        sets: list[str] = []
        if cursor is not None:
            sets.append("#cur = :cur")
            names["#cur"] = schema.band_attribute(schema.HEAD_CURSOR, band_of(cursor))
            values[":cur"] = {"S": cursor}
        if init_marks is not None:
            sets.append(expressions.HEAD_MARKS_INIT)
            names.update(expressions.HEAD_MARKS_NAMES)
            values[":mark"] = {"S": visible_bound(init_marks)}
            values[":now"] = codec.num(init_marks)
        if not adds and not sets:
            return
        clauses = [f"SET {', '.join(sets)}"] if sets else []
        clauses += [f"ADD {', '.join(adds)}"] if adds else []
        try:
            self._client.update_item(
                TableName=self._table,
                Key=codec.head_key(queue, partition),
                UpdateExpression=" ".join(clauses),
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
        except (ClientError, QueratorError) as exc:
            # The items' write stands; a lost counter update is drift in queue.stats, not data loss.
            log.warning("head row of %s~%d not updated after %s: %s", queue, partition, operation, exc)

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
        for attrs in reply.get("Items", []):
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

    def _batch_get(
        self,
        keys: list[codec.AttributeMap],
        *,
        projection: tuple[str, dict[str, str]] | None,
        operation: str,
        consistent: bool = True,
    ) -> list[codec.AttributeMap]:
        found: list[codec.AttributeMap] = []
        for start in range(0, len(keys), BATCH_GET_LIMIT):
            pending: list[Any] = keys[start : start + BATCH_GET_LIMIT]
            for attempt in range(_UNPROCESSED_RETRIES + 1):
                request: dict[str, Any] = {"Keys": pending, "ConsistentRead": consistent}
                if projection is not None:
                    request["ProjectionExpression"], request["ExpressionAttributeNames"] = projection
                try:
                    # The stubs' TypedDicts want literal keys; the request is built incrementally.
                    reply: Any = self._client.batch_get_item(RequestItems={self._table: request})  # type: ignore[dict-item]
                except ClientError as exc:
                    raise translate(exc, operation) from exc
                found.extend(reply.get("Responses", {}).get(self._table, []))
                pending = list(reply.get("UnprocessedKeys", {}).get(self._table, {}).get("Keys", []))
                if not pending:
                    break
                if attempt == _UNPROCESSED_RETRIES:
                    raise StoreThrottledError(
                        f"the store left {len(pending)} reads of {operation} unprocessed"
                    )
                self._sleep(random.uniform(0, min(1.0, 0.025 * 2**attempt)))  # noqa: S311
        return found

    def register_bands(self, queue: str, partition: int, ids: Iterable[str], *, now: datetime) -> None:
        """Name the bands of ``ids`` (other than priority 5's) in the partition's head row, with
        ``now`` as their registration time (``bt<band>``), before items of those bands are written:
        a lease reads only the bands the head row names, so an item written to a band it does not
        name would never be leased. Raises when the write fails (the items are then not written);
        no request for priority 5 items."""
        bands = sorted({band_of(i) for i in ids} - {""})
        if not bands:
            return
        names: dict[str, str] = {}
        stamps = []
        for index, band in enumerate(bands):
            names[f"#bt{index}"] = schema.band_attribute(schema.HEAD_BAND_REGISTERED, band)
            stamps.append(f"#bt{index} = :now")
        try:
            self._client.update_item(
                TableName=self._table,
                Key=codec.head_key(queue, partition),
                UpdateExpression=f"SET {', '.join(stamps)}",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues={":now": codec.num(now)},
            )
        except ClientError as exc:
            raise translate(exc, "produce") from exc

    def drop_band(self, queue: str, partition: int, band: str, *, registered_before: datetime) -> bool:
        try:
            self._client.update_item(
                TableName=self._table,
                Key=codec.head_key(queue, partition),
                UpdateExpression="REMOVE #bt",
                # No registration since: a writer that registered the band has written its items by
                # then (registered_before is far enough back), so the caller's re-check sees them.
                ConditionExpression="#bt < :before",
                ExpressionAttributeNames={"#bt": schema.band_attribute(schema.HEAD_BAND_REGISTERED, band)},
                ExpressionAttributeValues={":before": codec.num(registered_before)},
            )
        except ClientError as exc:
            if error_code(exc) == CONDITION_FAILED:
                return False
            raise translate(exc, "reaper") from exc
        return True

    # -- writes of new items ---------------------------------------------------------------------

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

    def _batch_write(self, requests: list[dict[str, Any]], operation: str) -> None:
        for start in range(0, len(requests), BATCH_WRITE_LIMIT):
            pending: list[Any] = requests[start : start + BATCH_WRITE_LIMIT]
            for attempt in range(_UNPROCESSED_RETRIES + 1):
                try:
                    reply = self._client.batch_write_item(RequestItems={self._table: pending})
                except ClientError as exc:
                    raise translate(exc, operation) from exc
                pending = list(reply.get("UnprocessedItems", {}).get(self._table, []))
                if not pending:
                    break
                if attempt == _UNPROCESSED_RETRIES:
                    raise StoreThrottledError(
                        f"the store left {len(pending)} writes of {operation} unprocessed; retry"
                    )
                # Full jitter, as AWS recommends for UnprocessedItems.
                self._sleep(random.uniform(0, min(1.0, 0.025 * 2**attempt)))  # noqa: S311

    # -- reads -----------------------------------------------------------------------------------

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
        last = reply.get("LastEvaluatedKey")
        return Page(
            items=[codec.decode_state(attrs) for attrs in reply.get("Items", [])],
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
            for attrs in reply.get("Items", []):
                item = codec.decode_item(attrs)
                size += len(item.payload)
                if max_bytes is not None and items and size > max_bytes:
                    return items
                items.append(item)
            start_key = reply.get("LastEvaluatedKey")
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
        attrs = reply.get("Item")
        return None if attrs is None else codec.decode_item(attrs)

    def source_ids(self, queue: str, partition: int) -> set[str]:
        found: set[str] = set()
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "pk = :pk AND sk < :end",
            "ProjectionExpression": "#src",
            "ExpressionAttributeNames": {"#src": schema.SOURCE_ID},
            "ExpressionAttributeValues": {
                ":pk": {"S": schema.partition_key(queue, partition)},
                ":end": {"S": ITEMS_END},
            },
        }
        for attrs in self._query_all(kwargs, "import"):
            if schema.SOURCE_ID in attrs:
                found.add(attrs[schema.SOURCE_ID]["S"])
        return found

    def _query_all(self, kwargs: dict[str, Any], operation: str) -> Iterator[codec.AttributeMap]:
        while True:
            try:
                reply = self._client.query(**kwargs)
            except ClientError as exc:
                raise translate(exc, operation) from exc
            yield from reply.get("Items", [])
            last = reply.get("LastEvaluatedKey")
            if last is None:
                return
            kwargs = {**kwargs, "ExclusiveStartKey": last}

    # -- leases ----------------------------------------------------------------------------------

    def record_lease(self, queue: str, partition: int, ids: Sequence[str], *, deadline: datetime) -> str:
        key = codec.lease_record_key(deadline, secrets.token_hex(8))
        try:
            self._client.put_item(
                TableName=self._table,
                Item=codec.encode_lease_record(queue, partition, key, list(ids), deadline),
            )
        except ClientError as exc:
            raise translate(exc, "lease") from exc
        return key

    def drop_lease_record(self, queue: str, partition: int, key: str) -> None:
        try:
            self._client.delete_item(
                TableName=self._table,
                Key={schema.PK: {"S": schema.partition_key(queue, partition)}, schema.SK: {"S": key}},
            )
        except ClientError as exc:
            raise translate(exc, "lease") from exc

    def claim(
        self, queue: str, partition: int, ids: Sequence[str], *, lease_deadline: datetime, now: datetime
    ) -> BatchResult[Item]:
        values = {":deadline": codec.num(lease_deadline), ":now": codec.num(now), ":one": {"N": "1"}}

        def claim_one(item_id: str) -> Item | None:
            try:
                reply = self._client.update_item(
                    TableName=self._table,
                    Key=codec.item_key(queue, partition, item_id),
                    UpdateExpression=expressions.CLAIM_UPDATE,
                    ConditionExpression=expressions.CLAIM_CONDITION,
                    ExpressionAttributeNames=expressions.CLAIM_NAMES,
                    ExpressionAttributeValues=values,
                    # The write returns the whole item for free, so the scan reads only small attributes.
                    ReturnValues="ALL_NEW",
                )
            except ClientError as exc:
                if error_code(exc) == CONDITION_FAILED:
                    return None  # another consumer won this one
                raise translate(exc, "lease") from exc
            return codec.decode_item(reply["Attributes"])

        claimed = self._each(claim_one, list(ids))
        return BatchResult(
            applied=[item for item in claimed if item is not None],
            rejected=[item_id for item_id, item in zip(ids, claimed, strict=True) if item is None],
        )

    def note_leased(self, queue: str, partition: int, items: Sequence[Item], *, cursor: str | None) -> None:
        counts = CounterDeltas()
        for item in items:
            counts.add(item.created_at, sign=1, leased=True, scheduled=False)
        # Only the leased counters: the items were already counted when they were written.
        counts.items = counts.created = 0
        self._update_head(queue, partition, counts, cursor=cursor, operation="lease")

    def renew(
        self, queue: str, partition: int, ids: Sequence[str], *, lease_deadline: datetime, now: datetime
    ) -> BatchResult[str]:
        values = {":deadline": codec.num(lease_deadline)}
        return self._update_leased(queue, partition, ids, expressions.RENEW_UPDATE, {}, values, now, "renew")

    def set_next_priority(
        self, queue: str, partition: int, ids: Sequence[str], *, priority: int, now: datetime
    ) -> BatchResult[str]:
        names = {"#np": schema.NEXT_PRIORITY}
        values = {":priority": {"N": str(priority)}}
        update = expressions.NEXT_PRIORITY_UPDATE
        return self._update_leased(queue, partition, ids, update, names, values, now, "reprioritize")

    def _update_leased(
        self,
        queue: str,
        partition: int,
        ids: Sequence[str],
        update: str,
        names: dict[str, str],
        values: dict[str, Any],
        now: datetime,
        operation: str,
    ) -> BatchResult[str]:
        """``update`` on each item whose lease is still valid, concurrently (rejected: the others)."""
        condition, guard_names = expressions.GUARD_CONDITIONS[Guard.LEASE_VALID]

        def update_one(item_id: str) -> str | None:
            try:
                self._client.update_item(
                    TableName=self._table,
                    Key=codec.item_key(queue, partition, item_id),
                    UpdateExpression=update,
                    ConditionExpression=condition,
                    ExpressionAttributeNames={**guard_names, **names},
                    ExpressionAttributeValues={**values, ":now": codec.num(now)},
                )
            except ClientError as exc:
                if error_code(exc) == CONDITION_FAILED:
                    return item_id
                raise translate(exc, operation) from exc
            return None

        refused = {i for i in self._each(update_one, list(ids)) if i is not None}
        return BatchResult(
            applied=[i for i in ids if i not in refused], rejected=[i for i in ids if i in refused]
        )

    # -- removals and moves ----------------------------------------------------------------------

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
            return item_id, reply.get("Attributes"), True

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
        # A replacement in a band its partition may not name yet (a retry with a new priority, a
        # dead letter, a redrive) registers it first; a requeue in its own band and partition does not.
        arriving: dict[tuple[str, int], set[str]] = defaultdict(set)
        for m in moves:
            band = band_of(m.replacement.id)
            elsewhere = (m.target_queue, m.target_partition) != (queue, partition)
            if band and (band != band_of(m.item.id) or elsewhere):
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

    def purge_page(self, queue: str, partition: int, *, limit: int) -> int:
        try:
            reply = self._client.query(
                TableName=self._table,
                KeyConditionExpression="pk = :pk",
                ProjectionExpression="pk, sk",
                ExpressionAttributeValues={":pk": {"S": schema.partition_key(queue, partition)}},
                Limit=limit,
            )
        except ClientError as exc:
            raise translate(exc, "purge") from exc
        keys = [{"DeleteRequest": {"Key": attrs}} for attrs in reply.get("Items", [])]
        # Deleted rows are gone from the next Query: the partition itself is the bookmark.
        self._batch_write(keys, "purge")
        return len(keys)

    # -- the reaper's marks ----------------------------------------------------------------------

    def pass_schedule(
        self,
        queue: str,
        partition: int,
        *,
        old_mark: str,
        new_mark: str,
        now: datetime,
        bands: Sequence[str] = ("",),
    ) -> int:
        counts = CounterDeltas()
        for band in bands:
            start, end = band + old_mark, band + new_mark
            while True:
                page = self.scan(queue, partition, start=start, end=end, limit=1000, scheduled_only=True)
                for state in page.items:
                    counts.add(state.created_at, sign=-1, leased=False, scheduled=True)
                if page.done:
                    break
                start = page.read_to
        counts.items = counts.created = 0
        adds, names, values = _add_clauses(counts)
        names.update({"#sm": schema.HEAD_SCHEDULE_MARK})
        values[":new"] = {"S": new_mark}
        update = "SET #sm = :new" + (f" ADD {', '.join(adds)}" if adds else "")
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "Key": codec.head_key(queue, partition),
            "UpdateExpression": update,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
        }
        if old_mark:
            kwargs["ConditionExpression"] = expressions.SCHEDULE_PASS_CONDITION
            values[":old"] = {"S": old_mark}
        else:
            kwargs["ConditionExpression"] = "attribute_not_exists(#sm)"
        try:
            self._client.update_item(**kwargs)
        except ClientError as exc:
            if error_code(exc) == CONDITION_FAILED:
                return 0  # another pass counted this range first
            raise translate(exc, "reaper") from exc
        return -counts.scheduled

    def save_recount(self, queue: str, partition: int, recount: Recount | None) -> None:
        if recount is None:
            update, values = "REMOVE #rc", None
        else:
            update, values = "SET #rc = :rc", {":rc": codec.encode_recount(recount)}
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "Key": codec.head_key(queue, partition),
            "UpdateExpression": update,
            "ExpressionAttributeNames": {"#rc": schema.HEAD_RECOUNT},
        }
        if values:
            kwargs["ExpressionAttributeValues"] = values
        try:
            self._client.update_item(**kwargs)
        except ClientError as exc:
            raise translate(exc, "reaper") from exc

    def finish_recount(self, queue: str, partition: int, recount: Recount, *, now: datetime) -> bool:
        values: dict[str, Any] = {
            ":n": {"N": str(recount.items)},
            ":nl": {"N": str(recount.leased)},
            ":ns": {"N": str(recount.scheduled)},
            ":ca": {"N": str(recount.created_sum)},
            ":cl": {"N": str(recount.leased_created_sum)},
            ":cs": {"N": str(recount.scheduled_created_sum)},
            ":at": codec.num(now),
            ":ver": {"N": str(recount.version)},
        }
        names = {
            **expressions.HEAD_COUNT_UPDATE_NAMES,
            "#ver": schema.HEAD_VERSION,
            "#rc": schema.HEAD_RECOUNT,
            "#rct": schema.HEAD_RECOUNTED_AT,
        }
        try:
            self._client.update_item(
                TableName=self._table,
                Key=codec.head_key(queue, partition),
                UpdateExpression=(
                    "SET #n = :n, #nl = :nl, #ns = :ns, #ca = :ca, #cl = :cl, #cs = :cs, #rct = :at"
                    " REMOVE #rc"
                ),
                # Only a still picture may replace the counters: any write since the recount began
                # moved the version, and its deltas are already in the counters (not in the recount).
                ConditionExpression=(
                    expressions.RECOUNT_CONDITION
                    if recount.version
                    else expressions.RECOUNT_FROM_ZERO_CONDITION
                ),
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            if error_code(exc) == CONDITION_FAILED:
                self.save_recount(queue, partition, None)
                return False
            raise translate(exc, "reaper") from exc
        return True

    def set_sweep(self, queue: str, partition: int, mark: str) -> None:
        try:
            self._client.update_item(
                TableName=self._table,
                Key=codec.head_key(queue, partition),
                UpdateExpression="SET #swp = :mark",
                ExpressionAttributeNames={"#swp": schema.band_attribute(schema.HEAD_SWEEP, band_of(mark))},
                ExpressionAttributeValues={":mark": {"S": mark}},
            )
        except ClientError as exc:
            raise translate(exc, "reaper") from exc

    # -- idempotent produce ----------------------------------------------------------------------

    def begin_idempotent(
        self, queue: str, record: IdempotencyRecord, *, stale_before: datetime, expires_at: datetime
    ) -> tuple[bool, IdempotencyRecord | None]:
        try:
            reply = self._client.put_item(
                TableName=self._table,
                Item=codec.encode_idempotency(queue, record, expires_at),
                ConditionExpression=expressions.IDEM_BEGIN_CONDITION,
                ExpressionAttributeNames=expressions.IDEM_BEGIN_NAMES,
                ExpressionAttributeValues={
                    ":qcreated": codec.num(record.queue_created_at),
                    ":now_s": {"N": str(int(record.started_at.timestamp()))},
                    ":false": {"BOOL": False},
                    ":stale": codec.num(stale_before),
                },
                # The record this one replaced, if any: a pending one whose writer died is resumed.
                ReturnValues="ALL_OLD",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if error_code(exc) == CONDITION_FAILED:
                returned: codec.AttributeMap | None = exc.response.get("Item")  # type: ignore[assignment]
                old = returned or self._get_idempotency(queue, record.key)
                return False, None if old is None else codec.decode_idempotency(record.key, old)
            raise translate(exc, "produce") from exc
        previous = reply.get("Attributes")
        return True, None if previous is None else codec.decode_idempotency(record.key, previous)

    def _get_idempotency(self, queue: str, key: str) -> codec.AttributeMap | None:
        try:
            reply = self._client.get_item(
                TableName=self._table,
                Key={schema.PK: {"S": schema.idempotency_key(queue, key)}, schema.SK: {"S": schema.IDEM_SK}},
                ConsistentRead=True,
            )
        except ClientError as exc:
            raise translate(exc, "produce") from exc
        return reply.get("Item")

    def finish_idempotent(self, queue: str, key: str, *, partition: int, ids: Sequence[str]) -> None:
        try:
            self._client.update_item(
                TableName=self._table,
                Key={schema.PK: {"S": schema.idempotency_key(queue, key)}, schema.SK: {"S": schema.IDEM_SK}},
                UpdateExpression="SET #done = :true, #part = :part, #ids = :ids",
                ExpressionAttributeNames={
                    "#done": schema.IDEM_DONE,
                    "#part": schema.IDEM_PARTITION,
                    "#ids": schema.IDEM_IDS,
                },
                ExpressionAttributeValues={
                    ":true": {"BOOL": True},
                    ":part": {"N": str(partition)},
                    ":ids": {"L": [{"S": item_id} for item_id in ids]},
                },
            )
        except ClientError as exc:
            raise translate(exc, "produce") from exc
