"""Storage layer, the DynamoDB item store, what its roles share: the request limits and retries, the
head row's counter update, batched reads and writes, and the base of the role mixins
(``DynamoDBStoreBase``)."""

from __future__ import annotations

import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import ClientError

from querator.domain.errors import QueratorError, StoreThrottledError
from querator.domain.ids import visible_bound
from querator.domain.priority import band_of, lane_of
from querator.storage.dynamodb import codec, expressions, schema
from querator.storage.dynamodb.buckets import RateBuckets
from querator.storage.dynamodb.errors import error_code, translate, translating_no_reply

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from mypy_boto3_dynamodb import DynamoDBClient

    from querator.ports import ItemStore
    from querator.storage.counters import CounterDeltas


#: The store's log records keep the name they have always had (its roles' modules log here).
log = logging.getLogger("querator.storage.dynamodb.store")


BATCH_WRITE_LIMIT = 25
BATCH_GET_LIMIT = 100
CONDITION_FAILED = "ConditionalCheckFailedException"
#: Conditional writes of one call in flight at once: enough to turn 1,000 claims into ~60 round
#: trips, few enough that one call does not hog a partition's 1,000 writes a second.
WRITE_CONCURRENCY = 16
_UNPROCESSED_RETRIES = 8
_TRANSACTION_RETRIES = 3
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


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


if TYPE_CHECKING:
    # The role mixins call one another's methods (a produce registers its bands): typed as the port.
    _Port = ItemStore
else:
    _Port = object


class DynamoDBStoreBase(_Port):
    """What the role mixins share: the client, the table, the thread pool, the registrations this
    store made, the rate buckets; and the requests several roles make."""

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

    def _batch_write(self, requests: list[dict[str, Any]], operation: str) -> None:
        write_batches(self._client, self._table, requests, operation, sleep=self._sleep)

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
