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
- Fair queues (docs/adr/0080-priority-fair-redrive.md) keep each group lane's registration, cursor
  and sweep mark in a row of its own (``~R<lane>``) and a capped queue's group ledgers in rows
  ``~S<g>``; the head row only says that lanes exist (``gl``) and where each band's ring stands
  (``rg<band>``). A lease reads a band's lanes with one Query (``lanes``), so the head row does
  not grow with the groups; a FIFO queue's requests do not change (no lane, no extra request).
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
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import ClientError

from querator.domain.errors import QueratorError, StoreThrottledError
from querator.domain.ids import ITEMS_END, key_after, visible_bound
from querator.domain.priority import band_end, band_of, is_group_lane, lane_of, ledger_group
from querator.ports import (
    BatchResult,
    ClaimInterruptedError,
    GroupLedger,
    Guard,
    IdempotencyRecord,
    Lane,
    LeaseRecord,
    Page,
    PartitionHead,
    Recount,
)
from querator.storage.counters import (
    CounterDeltas,
    scheduled_until_claimed,
    scheduled_when_written,
    still_scheduled,
)
from querator.storage.dynamodb import codec, expressions, schema
from querator.storage.dynamodb.buckets import RateBuckets
from querator.storage.dynamodb.errors import error_code, translate, translating_no_reply

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    from mypy_boto3_dynamodb import DynamoDBClient

    from querator.domain.model import Item, ItemState
    from querator.domain.ratelimit import Grant, RateLimit
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
#: How long a band's or group lane's registration by this store spares it another write: far less
#: than the reaper's BAND_IDLE (``querator.service.tuning``; a test keeps them apart), so nothing it
#: wrote into a band or lane can be in one the reaper dropped.
REGISTRATION_REUSE = timedelta(minutes=5)
_REGISTERED_MAX = 10_000
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: Ledger entries one update removes: keeps the update expression far below DynamoDB's 4 KB. A
#: claim drops at most this many ended leases with it; the rest stay for a later claim (an entry
#: whose deadline passed is checked against its item anyway).
_LEDGER_REMOVALS = 100

T = TypeVar("T")
R = TypeVar("R")


def _last_below(end: str) -> str:
    """A key just below ``end`` that no item id lies between: ``BETWEEN`` is inclusive at both ends.

    Item ids are lowercase hex; ``~`` sorts after every hex digit, so ``<end minus one step>~`` sorts
    after every id below ``end`` and before ``end``.
    """
    return f"{end[:-1]}{chr(ord(end[-1]) - 1)}~"


def _call(write: Callable[[], None]) -> None:
    write()


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


def write_batches(
    client: DynamoDBClient,
    table: str,
    requests: list[dict[str, Any]],
    operation: str,
    *,
    sleep: Callable[[float], None],
) -> None:
    """``BatchWriteItem`` of ``requests`` (puts or deletes) in batches of 25, sending what the store
    left unprocessed again with full jitter, as AWS recommends; raises ``StoreThrottledError`` when
    some are still left after ``_UNPROCESSED_RETRIES`` tries (engine v2's produce, a log's purge)."""
    for start in range(0, len(requests), BATCH_WRITE_LIMIT):
        pending: list[Any] = requests[start : start + BATCH_WRITE_LIMIT]
        for attempt in range(_UNPROCESSED_RETRIES + 1):
            try:
                reply = client.batch_write_item(RequestItems={table: pending})
            except ClientError as exc:
                raise translate(exc, operation) from exc
            pending = codec.table_part(reply, "UnprocessedItems", table)
            if not pending:
                break
            if attempt == _UNPROCESSED_RETRIES:
                raise StoreThrottledError(
                    f"the store left {len(pending)} writes of {operation} unprocessed; retry"
                )
            sleep(random.uniform(0, min(1.0, 0.025 * 2**attempt)))  # noqa: S311


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
        #: (queue, partition, band or lane or "gl") -> when this store last registered it.
        self._registered: dict[tuple[str, int, str], datetime] = {}
        self._buckets = RateBuckets(self._client, table_name)

    def _each(self, function: Callable[[T], R], values: Sequence[T]) -> list[R]:
        """``function`` over ``values`` with up to ``concurrency`` in flight; results in order.

        The first error is raised after every call has finished, so no write is left in flight.
        """
        results, error = self._each_settled(function, values)
        if error is not None:
            raise error
        return results

    def _each_settled(
        self, function: Callable[[T], R], values: Sequence[T]
    ) -> tuple[list[R], Exception | None]:
        """``function`` over ``values``, for callers that must know what applied beside a failure:
        the results of the calls that returned (in order) and the first error.

        Run one at a time, the calls after a failure are not made; run concurrently, every call
        ends before this returns. An interrupt (a ``BaseException``, such as a Lambda timeout) is
        raised, once every call has ended: nothing after it may run.
        """
        results: list[R] = []
        if len(values) <= 1 or self._concurrency <= 1:
            for value in values:
                try:
                    results.append(function(value))
                except Exception as exc:  # returned to the caller with what applied before it
                    return results, exc
            return results, None
        with self._pool_lock:
            if self._pool is None:
                # Lazily, and once per store: a warm Lambda reuses its threads across invocations.
                self._pool = ThreadPoolExecutor(self._concurrency, thread_name_prefix="querator-store")
            pool = self._pool
        futures = [pool.submit(function, v) for v in values]
        error: Exception | None = None
        interrupt: BaseException | None = None
        for future in futures:
            try:
                results.append(future.result())
            except Exception as exc:  # returned to the caller, once every call has ended
                error = error or exc
            except BaseException as exc:  # raised below, once every call has ended
                interrupt = interrupt or exc
        if interrupt is not None:
            raise interrupt
        return results, error

    # -- the head row ------------------------------------------------------------------------------

    def _update_head(
        self,
        queue: str,
        partition: int,
        counts: CounterDeltas | None,
        *,
        cursor: str | None = None,
        ring: tuple[str, str] | None = None,
        init_marks: datetime | None = None,
        operation: str,
    ) -> None:
        """Add ``counts`` (and set a band's cursor, a band's ring, the initial marks) in one write;
        log, never raise."""
        adds, names, values = _add_clauses(counts) if counts is not None else ([], {}, {})
        sets: list[str] = []
        if cursor is not None:
            sets.append("#cur = :cur")
            names["#cur"] = schema.band_attribute(schema.HEAD_CURSOR, band_of(cursor))
            values[":cur"] = {"S": cursor}
        if ring is not None:
            sets.append("#rg = :rg")
            names["#rg"] = schema.band_attribute(schema.HEAD_RING, ring[0])
            values[":rg"] = {"S": ring[1]}
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
                found.extend(codec.table_part(reply, "Responses", self._table))
                pending = codec.unprocessed_keys(reply, self._table)
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
        ``now`` as their registration time (``bt<band>``), and their group lanes in lane rows
        (``t``, with ``gl`` on the head row), before items of those bands are written: a lease reads
        only the bands and lanes named, so an item written to one it does not name would never be
        leased. Raises when a write fails (the items are then not written); no request for
        priority 5 items outside group lanes, one for other bands, one more per group lane."""
        lanes = {lane_of(item_id) for item_id in ids}
        fresh = now - REGISTRATION_REUSE
        # What this store registered in the last REGISTRATION_REUSE needs no write: the reaper drops
        # only what nobody registered for BAND_IDLE (an hour), so the registration still holds.
        bands = sorted(
            band
            for band in {band_of(lane) for lane in lanes} - {""}
            if self._registered.get((queue, partition, band), _EPOCH) < fresh
        )
        group_lanes = sorted(
            lane
            for lane in lanes
            if is_group_lane(lane) and self._registered.get((queue, partition, lane), _EPOCH) < fresh
        )
        has_lanes = bool(group_lanes) and self._registered.get((queue, partition, "gl"), _EPOCH) < fresh
        if not bands and not group_lanes:
            return
        writes: list[Callable[[], None]] = []
        if bands or has_lanes:
            writes.append(
                partial(self._register_in_head, queue, partition, bands, has_lanes=has_lanes, now=now)
            )
        writes += [partial(self._register_lane, queue, partition, lane, now=now) for lane in group_lanes]
        self._each(_call, writes)
        with self._pool_lock:
            if len(self._registered) > _REGISTERED_MAX:
                self._registered.clear()
            for key in [*bands, *group_lanes, *(["gl"] if has_lanes else [])]:
                self._registered[queue, partition, key] = now

    def _register_in_head(
        self, queue: str, partition: int, bands: Sequence[str], *, has_lanes: bool, now: datetime
    ) -> None:
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        stamps = []
        for index, band in enumerate(bands):
            names[f"#bt{index}"] = schema.band_attribute(schema.HEAD_BAND_REGISTERED, band)
            stamps.append(f"#bt{index} = :now")
            values[":now"] = codec.num(now)
        if has_lanes:
            names["#gl"] = schema.HEAD_HAS_LANES
            stamps.append("#gl = :true")
            values[":true"] = {"BOOL": True}
        try:
            self._client.update_item(
                TableName=self._table,
                Key=codec.head_key(queue, partition),
                UpdateExpression=f"SET {', '.join(stamps)}",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            raise translate(exc, "produce") from exc

    def _register_lane(self, queue: str, partition: int, lane: str, *, now: datetime) -> None:
        try:
            self._client.update_item(
                TableName=self._table,
                Key=codec.lane_key(queue, partition, lane),
                UpdateExpression=expressions.LANE_REGISTER_UPDATE,
                ExpressionAttributeNames=expressions.LANE_NAMES,
                ExpressionAttributeValues={":now": codec.num(now)},
            )
        except ClientError as exc:
            raise translate(exc, "produce") from exc

    def drop_band(self, queue: str, partition: int, band: str, *, registered_before: datetime) -> bool:
        kwargs: dict[str, Any]
        if is_group_lane(band):
            # A group lane is its row: dropping it deletes the row (cursor and sweep mark with it).
            kwargs = {
                "Key": codec.lane_key(queue, partition, band),
                "ConditionExpression": expressions.LANE_DROP_CONDITION,
                "ExpressionAttributeNames": expressions.LANE_NAMES,
            }
            drop: Callable[..., Any] = self._client.delete_item
        else:
            kwargs = {
                "Key": codec.head_key(queue, partition),
                "UpdateExpression": "REMOVE #bt",
                "ConditionExpression": "#bt < :before",
                "ExpressionAttributeNames": {"#bt": schema.band_attribute(schema.HEAD_BAND_REGISTERED, band)},
            }
            drop = self._client.update_item
        try:
            # No registration since: a writer that registered the band has written its items by
            # then (registered_before is far enough back), so the caller's re-check sees them.
            drop(
                TableName=self._table,
                ExpressionAttributeValues={":before": codec.num(registered_before)},
                **kwargs,
            )
        except ClientError as exc:
            if error_code(exc) == CONDITION_FAILED:
                return False
            raise translate(exc, "reaper") from exc
        with self._pool_lock:
            # Registering it again (the reaper's second check found an item) must write.
            self._registered.pop((queue, partition, band), None)
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
        write_batches(self._client, self._table, requests, operation, sleep=self._sleep)

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
            yield from codec.rows(reply)
            last = codec.last_key(reply)
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
        token = secrets.token_bytes(8)
        values: codec.AttributeMap = {
            ":deadline": codec.num(lease_deadline),
            ":now": codec.num(now),
            ":one": {"N": "1"},
            ":claim": {"B": token},
        }

        def claim_one(item_id: str) -> Item | None:
            try:
                reply = self._client.update_item(
                    TableName=self._table,
                    Key=codec.item_key(queue, partition, item_id),
                    UpdateExpression=expressions.CLAIM_OWNED_UPDATE,
                    ConditionExpression=expressions.CLAIM_CONDITION,
                    ExpressionAttributeNames=expressions.CLAIM_OWNED_NAMES,
                    ExpressionAttributeValues=values,
                    # The write returns the whole item for free, so the scan reads only small attributes.
                    ReturnValues="ALL_NEW",
                    # A failed condition returns the item as it is, for free (no read).
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
            except ClientError as exc:
                if error_code(exc) == CONDITION_FAILED:
                    current = codec.returned(exc.response, "Item")
                    if current is not None and current.get(schema.CLAIM_TOKEN, {}).get("B") == token:
                        # botocore retried this claim after its reply was lost, and the first attempt
                        # had applied: the lease is this caller's, not a competitor's.
                        return codec.decode_item(current)
                    return None  # another consumer won this one
                raise translate(exc, "lease") from exc
            return codec.decode_item(reply["Attributes"])

        claimed, error = self._each_settled(claim_one, list(ids))
        if error is not None:
            # The claims that applied beside the failure are the caller's: it must know them, or
            # they would stay leased to nobody until their deadline (their attempt spent).
            raise ClaimInterruptedError([item for item in claimed if item is not None]) from error
        return BatchResult(
            applied=[item for item in claimed if item is not None],
            rejected=[item_id for item_id, item in zip(ids, claimed, strict=True) if item is None],
        )

    def note_leased(
        self,
        queue: str,
        partition: int,
        items: Sequence[Item],
        *,
        cursor: str | None,
        ring: tuple[str, str] | None = None,
    ) -> None:
        # Only the leased counters (the items were counted when they were written), and the
        # scheduled ones of items that came due since the last schedule pass: each leaves the
        # scheduled count as it enters the leased one. The mark is read after the claims (only when
        # a scheduled item is among them), as a delete reads it; the pass counts only items never
        # leased, so an item is taken off once (but for a pass whose read and write both fall
        # between a claim and this read: drift that the recount heals).
        mark: str | None = ""
        if any(item.enqueue_at is not None for item in items):
            try:
                mark = self.heads(queue, [partition])[0].schedule_mark
            except QueratorError as exc:
                # The items are leased already: a failed read costs the count (the recount heals it),
                # never the reply. They stay counted as scheduled until the recount.
                log.warning("schedule mark of %s~%d not read after lease: %s", queue, partition, exc)
                mark = None
        counts = CounterDeltas()
        for item in items:
            was_scheduled = mark is not None and scheduled_until_claimed(item, mark)
            counts.lease(item.created_at, was_scheduled=was_scheduled)
        in_lane = cursor is not None and is_group_lane(lane_of(cursor))
        # A band's cursor and the ring go with the counters; a group lane's cursor is on its row.
        writes: list[Callable[[], None]] = [
            partial(
                self._update_head,
                queue,
                partition,
                counts,
                cursor=None if in_lane else cursor,
                ring=ring,
                operation="lease",
            )
        ]
        if cursor is not None and in_lane:
            writes.append(partial(self._note_lane_cursor, queue, partition, cursor))
        self._each(_call, writes)

    def _note_lane_cursor(self, queue: str, partition: int, cursor: str) -> None:
        """Move a group lane's cursor; log, never raise (as the head row's cursor): a cursor left
        behind costs the next lease a longer read, never an item."""
        try:
            self._set_lane_mark(queue, partition, cursor, schema.LANE_CURSOR)
        except (ClientError, QueratorError) as exc:
            log.warning("cursor of %s~%d not moved to %s after lease: %s", queue, partition, cursor, exc)

    def _set_lane_mark(self, queue: str, partition: int, mark: str, attribute: str) -> bool:
        """``SET`` a group lane row's cursor or sweep mark to ``mark`` if the row exists (False: the
        reaper dropped the lane since; nothing to move). Raises ``ClientError`` on other failures."""
        try:
            self._client.update_item(
                TableName=self._table,
                Key=codec.lane_key(queue, partition, lane_of(mark)),
                UpdateExpression="SET #mark = :mark",
                ConditionExpression=expressions.LANE_EXISTS_CONDITION,
                ExpressionAttributeNames={**expressions.LANE_NAMES, "#mark": attribute},
                ExpressionAttributeValues={":mark": {"S": mark}},
            )
        except ClientError as exc:
            if error_code(exc) == CONDITION_FAILED:
                return False
            raise
        return True

    # -- fair delivery: group lanes and ledgers --------------------------------------------------

    def lanes(self, queue: str, partition: int, band: str, *, after: str, limit: int) -> list[Lane]:
        # A band's lane rows are ``~R<band>g`` + 16 hex digits: one key range, which no other
        # band's lanes enter (``~R.3g…`` and ``~Rp7g…`` sort outside ``~Rg…``'s range).
        start = schema.lane_sort_key(band_end(band))
        if after:
            # Lane rows have one length within a band: ``<after>0`` is past ``after`` and below the next.
            start = max(start, schema.lane_sort_key(key_after(after)))
        last = schema.lane_sort_key(band_end(band) + "~")
        if limit <= 0 or start > last:
            return []
        try:
            reply = self._client.query(
                TableName=self._table,
                KeyConditionExpression="pk = :pk AND sk BETWEEN :start AND :last",
                ExpressionAttributeValues={
                    ":pk": {"S": schema.partition_key(queue, partition)},
                    ":start": {"S": start},
                    ":last": {"S": last},
                },
                Limit=limit,
                ConsistentRead=True,
            )
        except ClientError as exc:
            raise translate(exc, "lease") from exc
        return [codec.decode_lane(attrs) for attrs in codec.rows(reply)]

    def with_lanes(self, queue: str, partition: int, head: PartitionHead) -> PartitionHead:
        if not head.has_lanes:
            return head  # no lane was ever registered: no request (FIFO queues)
        registered = dict(head.band_registered)
        cursors = dict(head.band_cursors)
        sweeps = dict(head.band_sweeps)
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :lanes)",
            "ExpressionAttributeValues": {
                ":pk": {"S": schema.partition_key(queue, partition)},
                ":lanes": {"S": schema.LANE_PREFIX},
            },
            "ConsistentRead": True,
        }
        for attrs in self._query_all(kwargs, "lanes"):
            lane = codec.decode_lane(attrs)
            registered[lane.lane] = lane.registered
            if schema.LANE_CURSOR in attrs:
                cursors[lane.lane] = attrs[schema.LANE_CURSOR]["S"]
            if schema.LANE_SWEEP in attrs:
                sweeps[lane.lane] = attrs[schema.LANE_SWEEP]["S"]
        return replace(head, band_registered=registered, band_cursors=cursors, band_sweeps=sweeps)

    def group_ledgers(self, queue: str, partition: int, groups: Sequence[str]) -> dict[str, GroupLedger]:
        wanted = list(dict.fromkeys(groups))
        keys = [codec.ledger_key(queue, partition, group) for group in wanted]
        prefix = len(schema.LEDGER_PREFIX)
        found = {
            attrs[schema.SK]["S"][prefix:]: attrs
            for attrs in self._batch_get(keys, projection=None, operation="lease")
        }
        return {group: codec.decode_ledger(found.get(group)) for group in wanted}

    def claim_in_group(
        self,
        queue: str,
        partition: int,
        item_id: str,
        *,
        version: int,
        forget: Sequence[str],
        lease_deadline: datetime,
        now: datetime,
    ) -> Item | None:
        deadline = codec.num(lease_deadline)
        claim: dict[str, Any] = {
            "TableName": self._table,
            "Key": codec.item_key(queue, partition, item_id),
            "UpdateExpression": expressions.CLAIM_UPDATE,
            "ConditionExpression": expressions.CLAIM_CONDITION,
            "ExpressionAttributeNames": expressions.CLAIM_NAMES,
            "ExpressionAttributeValues": {":deadline": deadline, ":now": codec.num(now), ":one": {"N": "1"}},
        }
        names = {**expressions.LEDGER_NAMES, "#e": schema.ledger_entry(item_id)}
        values: dict[str, Any] = {":deadline": deadline, ":next": {"N": str(version + 1)}}
        update = "SET #e = :deadline, #v = :next"
        dropped = [f for f in dict.fromkeys(forget) if f != item_id][:_LEDGER_REMOVALS]
        if dropped:
            for index, forgotten in enumerate(dropped):
                names[f"#f{index}"] = schema.ledger_entry(forgotten)
            update += " REMOVE " + ", ".join(f"#f{index}" for index in range(len(dropped)))
        if version:
            condition = expressions.LEDGER_VERSION_CONDITION
            values[":version"] = {"N": str(version)}
        else:
            condition = expressions.LEDGER_NEW_CONDITION
        ledger: dict[str, Any] = {
            "TableName": self._table,
            "Key": codec.ledger_key(queue, partition, ledger_group(item_id)),
            "UpdateExpression": update,
            "ConditionExpression": condition,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
        }
        for attempt in range(_TRANSACTION_RETRIES + 1):
            try:
                # The stubs' TypedDicts want literal keys; the dicts above are built incrementally.
                transaction: Any = [{"Update": claim}, {"Update": ledger}]
                self._client.transact_write_items(TransactItems=transaction)
            except ClientError as exc:
                reasons = [r.get("Code", "") for r in exc.response.get("CancellationReasons", [])]
                cancelled = error_code(exc) == "TransactionCanceledException"
                if cancelled and "ConditionalCheckFailed" in reasons:
                    return None  # the item was taken, or the ledger moved on: the caller reads again
                if cancelled and "TransactionConflict" in reasons and attempt < _TRANSACTION_RETRIES:
                    self._sleep(random.uniform(0, 0.01 * 2**attempt))  # noqa: S311
                    continue
                raise translate(exc, "lease") from exc
            # A transaction returns no attributes: the item is read back (strongly consistent).
            return self.get(queue, partition, item_id)
        return None  # pragma: no cover - the loop returns or raises

    def forget_leases(self, queue: str, partition: int, ids: Sequence[str]) -> None:
        by_group: dict[str, list[str]] = defaultdict(list)
        for item_id in dict.fromkeys(ids):
            if is_group_lane(lane_of(item_id)):
                by_group[ledger_group(item_id)].append(item_id)
        removals = [
            (group, members[start : start + _LEDGER_REMOVALS])
            for group, members in by_group.items()
            for start in range(0, len(members), _LEDGER_REMOVALS)
        ]

        def remove(removal: tuple[str, list[str]]) -> None:
            group, members = removal
            names = {**expressions.LEDGER_NAMES}
            for index, item_id in enumerate(members):
                names[f"#e{index}"] = schema.ledger_entry(item_id)
            try:
                self._client.update_item(
                    TableName=self._table,
                    Key=codec.ledger_key(queue, partition, group),
                    UpdateExpression="REMOVE " + ", ".join(f"#e{index}" for index in range(len(members))),
                    # No version check (a removal frees a slot, it never takes one); no new row.
                    ConditionExpression=expressions.LEDGER_EXISTS_CONDITION,
                    ExpressionAttributeNames=names,
                )
            except ClientError as exc:
                if error_code(exc) != CONDITION_FAILED:
                    log.warning("ledger of %s~%d/%s not updated: %s", queue, partition, group, exc)
            except QueratorError as exc:
                log.warning("ledger of %s~%d/%s not updated: %s", queue, partition, group, exc)

        self._each(remove, removals)

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
        keys = [{"DeleteRequest": {"Key": attrs}} for attrs in codec.rows(reply)]
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
                # A leased one left the scheduled count when it was claimed (note_leased).
                page = self.scan(
                    queue,
                    partition,
                    start=start,
                    end=end,
                    limit=1000,
                    scheduled_only=True,
                    never_leased=True,
                )
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
        if is_group_lane(lane_of(mark)):
            try:
                # A lane the reaper dropped since has no sweep to keep (False: nothing moved).
                self._set_lane_mark(queue, partition, mark, schema.LANE_SWEEP)
            except ClientError as exc:
                raise translate(exc, "reaper") from exc
            return
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

    # -- lease rate limits ------------------------------------------------------------------------

    def take_tokens(self, queue: str, bucket: str, *, wanted: int, limit: RateLimit, now: datetime) -> Grant:
        return self._buckets.take(queue, bucket, wanted=wanted, limit=limit, now=now)

    def return_tokens(self, queue: str, bucket: str, *, count: int, limit: RateLimit) -> None:
        self._buckets.give_back(queue, bucket, count=count, limit=limit)

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
                old = codec.returned(exc.response, "Item") or self._get_idempotency(queue, record.key)
                found = codec.decode_idempotency(record.key, old)
                if found is not None and not found.done and found.ids == record.ids:
                    # Our own record (ids are unique to the request that minted them): botocore
                    # retried this put after its reply was lost. What it replaced, if anything, went
                    # with that reply, so a dead writer's items, if there were any, are not resumed.
                    return True, None
                return False, found
            raise translate(exc, "produce") from exc
        # A new record replaced nothing: AWS and moto leave Attributes out, LocalStack sends {}.
        return True, codec.decode_idempotency(record.key, codec.returned(reply, "Attributes"))

    def _get_idempotency(self, queue: str, key: str) -> codec.AttributeMap | None:
        try:
            reply = self._client.get_item(
                TableName=self._table,
                Key={schema.PK: {"S": schema.idempotency_key(queue, key)}, schema.SK: {"S": schema.IDEM_SK}},
                ConsistentRead=True,
            )
        except ClientError as exc:
            raise translate(exc, "produce") from exc
        return codec.returned(reply, "Item")

    def finish_idempotent(
        self, queue: str, key: str, *, partition: int, ids: Sequence[str], done: bool = True
    ) -> None:
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
                    ":true": {"BOOL": done},
                    ":part": {"N": str(partition)},
                    ":ids": {"L": [{"S": item_id} for item_id in ids]},
                },
            )
        except ClientError as exc:
            raise translate(exc, "produce") from exc
