"""Storage layer: bulk loads (the Spark producer's direct path), one chunk into one queue partition,
with a compact chunk record.

The Spark job (``querator.spark.producer``) drives it; every DynamoDB call it makes is here, beside
the store's own, so the storage package stays the only code that speaks DynamoDB.

``QueueService.produce`` keeps, per idempotent call, a record holding every item id (~31 KB for
1,000 items) and lets a half-written call be taken over only when that record is 15 minutes old.
For bulk loads that turned a few seconds of throttling into a 15-minute stall and +6 % write units
(issue 14). The bulk path writes each chunk with its own small record instead
(docs/adr/0022-spark-exactly-once.md):

- The record (~250 bytes, one write unit) holds what regenerates the chunk's item ids: the time
  they were minted, the first sequence number, the node, the queue partition; plus an owner token
  and a lease time. Its key hashes the chunk's idempotency key and the queue's creation time.
- ``claim`` is one conditional ``UpdateItem``: it creates the record, or takes over a pending one
  whose owner is this same Spark task (a retry resumes at once) or whose lease ran out. Fields
  already there are kept (``if_not_exists``), so a resumed chunk regenerates the same ids.
- An item's id is its priority's band (``querator.domain.priority``), then the time, the chunk's
  first sequence number plus the item's place in the chunk, and the node: the record fixes the
  digits, the staged plan fixes each item's priority, so a resumed chunk regenerates every id with
  its band, and within a priority the items keep the chunk's order. Bands other than priority 5's
  are registered in the partition's head row before any item is written (no request when all
  items are of priority 5): a lease reads only the bands the head row names.
- Items are written with ``BatchWriteItem``, several requests in flight; a resumed chunk first
  reads which of its ids exist (``BatchGetItem``, consistent) and writes only the others.
- ``finish`` marks the record done; a later attempt or re-run of a done chunk writes nothing.

Fresh chunk of 1,000 items: 1 + 40 + 1 (counters) + 1 requests, 1,000 + 3 write units (+ 1 request
and write unit when it holds priorities other than 5).

Engine v3 (``engine=3``; ``querator.config.DEFAULT_ENGINE`` decides, the Spark CLI's ``--engine``
overrides): the chunk goes to its partition's claim logs (``querator.ports.log``), packed, exactly
once all the same (``ChunkWriter._write_logs``):

- the record names its engine when it is created, so a chunk keeps the engine it began with (a
  pending record from before v3, which names none, stays engine v2's);
- scheduled items go to their logs' schedules under ``scheduled_id_of`` their regenerated ids: the
  ids are derived from the record, not recorded, so a re-append is recognised (a resume reads
  which are there first, so the logs' heads count each once). One gap, as for the service's
  idempotent produce: an item appended, then promoted (due) before a resume that finds it gone
  from the schedule, is appended again; the window is from the first append to the record's
  positions update, milliseconds, and only for items due that soon;
- per lane, one ``take_positions``, noted in the record as (lane, first, count), a few bytes a lane,
  before ``write_taken`` writes there: a resumed attempt or a re-run writes the same positions, a
  row already there is left as it is, and a row whose position a lease filled meanwhile (the writer
  was taken for dead) goes to the tail.

Fresh chunk of 1,000 items of 100 bytes, priority 5 (``tests/spark/test_writer.py``, measured with
``benchmarks.meter``): engine v2 1,003 write units (1.003 an item) in 43 requests; engine v3 146 write
units (0.146 an item: ~140 bytes an item in rows of up to 16 KB, plus the record, the sequencer,
the positions noted and the finish) in 13 requests; + 1 request per further lane.

The item store's own part of the bulk load role is here too (``DynamoDBBulkLoad``, a mixin of
``store.DynamoDBItemStore``): the source ids an import (``queue.import``) reads before it writes.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

import botocore.session
from botocore.config import Config
from botocore.exceptions import ClientError

from querator.config import DEFAULT_ENGINE, ENGINES
from querator.domain import lifecycle
from querator.domain.errors import (
    QueratorError,
    QueueDeletingError,
    RequestInProgressError,
    StoreThrottledError,
)
from querator.domain.ids import ITEMS_END, IdFactory, time_key
from querator.domain.model import Item, timestamp_us, utc_from_timestamp_us
from querator.domain.positions import parse_position_id, position_id, scheduled_id_of
from querator.domain.priority import band, lane_of, unbanded
from querator.ports.log import LogKey
from querator.storage.dynamodb import codec, schema
from querator.storage.dynamodb.base import CONDITION_FAILED, DynamoDBStoreBase
from querator.storage.dynamodb.errors import error_code, translate
from querator.storage.dynamodb.log import DynamoDBClaimLog
from querator.storage.dynamodb.objects import PayloadObjects

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from mypy_boto3_s3 import S3Client

    from querator.domain.model import NewItem, QueueInfo
    from querator.ports import Clock, QueueCatalog
    from querator.ports.log import ClaimLog
    from querator.storage.dynamodb.store import DynamoDBItemStore

#: A pending chunk record whose owner has not finished within this long may be taken over by any
#: attempt (another run of the job); the owner's own retry takes it over at once.
CHUNK_LEASE = timedelta(seconds=60)
#: How long a chunk record is kept: the service's idempotency window.
RECORD_TTL = timedelta(hours=24)
#: ``BatchWriteItem`` requests in flight per writer (25 items each).
IN_FLIGHT = 8
#: DynamoDB's limits per request.
BATCH_WRITE_ITEMS = 25
BATCH_GET_KEYS = 100
#: Attempts of one batch request whose items come back unprocessed (throttling), with full jitter.
UNPROCESSED_ATTEMPTS = 8
UNPROCESSED_BASE_DELAY = 0.05
UNPROCESSED_MAX_DELAY = 2.0
#: How long a writer trusts its copy of a queue's catalog record (as the service does, ADR 0008).
QUEUE_CACHE_SECONDS = 1.0
_SEQ_DIGITS = 10
_NODE_DIGITS = 6
_TIME_DIGITS = 14
#: The engine of a chunk record that names none (written before engine v3 existed).
_V2 = ENGINES[0]

# The chunk record's attributes (items table, beside the service's idempotency records).
_OWNER = "own"
_LEASE = "lease"
_PARTITION = "part"
_MINTED = "minted"
_SEQ = "seq"
_NODE = "node"
_COUNT = "n"
_DONE = "done"
#: Engine v3 only: the engine the chunk is written for (absent: 2, records from before v3), and the
#: positions it took, per lane: a list of (lane, first position, count).
_ENGINE = "eng"
_POSITIONS = "pos"
_LANE, _FIRST = "l", "f"


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkPlan:
    """What a chunk record fixes: where the chunk goes and which ids its items get."""

    partition: int
    minted_at: datetime
    seq: int
    node: int
    count: int
    #: The engine the chunk is written for (``querator.config.DEFAULT_ENGINE`` decides a new one).
    engine: int = ENGINES[0]
    #: Engine v3: the positions the chunk took, per lane, as (lane, first position, count); ``None``
    #: until they are taken and recorded.
    positions: tuple[tuple[str, int, int], ...] | None = None

    def items(self, queue: QueueInfo, new_items: Sequence[NewItem]) -> list[Item]:
        """The chunk's items, with the same ids on every attempt: each id is the item's priority
        band (and its group's lane in a fair queue), then the digits this plan fixes (time, ``seq``
        + the item's place, node)."""
        items = []
        for index, new in enumerate(new_items):
            scheduled = new.enqueue_at is not None and new.enqueue_at > self.minted_at
            visible = new.enqueue_at if scheduled and new.enqueue_at is not None else self.minted_at
            item_id = (
                f"{band(new.priority)}{queue.lane_for(new.group)}{time_key(visible)}"
                f"{self.seq + index:0{_SEQ_DIGITS}x}{self.node:0{_NODE_DIGITS}x}"
            )
            items.append(
                Item(
                    id=item_id,
                    payload=new.payload,
                    reference=new.reference,
                    encoding=new.encoding,
                    kind=new.kind,
                    group=new.group,
                    expire_deadline=lifecycle.expire_deadline(visible, queue.expire_timeout),
                    created_at=self.minted_at,
                    enqueue_at=visible if scheduled else None,
                )
            )
        return items


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkOutcome:
    """What one chunk write did."""

    items: int
    #: True: an earlier attempt or run finished the chunk and this one wrote nothing.
    replayed: bool
    partition: int
    #: Items this attempt wrote (fewer than ``items`` when it resumed a half-written chunk).
    written: int


class ChunkWriter:
    """Writes chunks straight into the items table; one per worker process, shared by its tasks."""

    def __init__(
        self,
        client: Any,
        table: str,
        *,
        store: DynamoDBItemStore,
        catalog: QueueCatalog,
        clock: Clock,
        sleep: Callable[[float], None] = time.sleep,
        in_flight: int = IN_FLIGHT,
        rng: random.Random | None = None,
        engine: int = DEFAULT_ENGINE,
        log: ClaimLog | None = None,
    ) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine is one of {ENGINES}, not {engine!r}")
        self._client = client
        self._table = table
        self._store = store
        #: The engine new chunks are written for (a resumed chunk keeps its record's).
        self.engine = engine
        # Always there, whatever ``engine`` says: a chunk a run of engine v3 began is resumed in
        # its logs by any later attempt.
        self._log: ClaimLog = log or DynamoDBClaimLog(client, table, concurrency=max(in_flight, 1))
        self._catalog = catalog
        self._clock = clock
        self._sleep = sleep
        self._ids = IdFactory()
        self._rng = rng or random.Random()  # noqa: S311 - spreading retries, not security
        self._pool = (
            ThreadPoolExecutor(in_flight, thread_name_prefix="querator-chunk") if in_flight > 1 else None
        )
        self._lock = threading.Lock()
        self._queues: dict[str, tuple[float, QueueInfo]] = {}

    # -- the queue ------------------------------------------------------------------------------

    def queue(self, name: str) -> QueueInfo:
        """The queue's catalog record, read at most once a second per writer."""
        now = time.monotonic()
        with self._lock:
            cached = self._queues.get(name)
        if cached is not None and now - cached[0] < QUEUE_CACHE_SECONDS:
            return cached[1]
        info = self._catalog.get(name)
        if info.deleting:
            raise QueueDeletingError(f"queue '{name}' is being deleted", queue=name)
        with self._lock:
            self._queues[name] = (now, info)
        return info

    # -- one chunk ------------------------------------------------------------------------------

    def write(
        self, queue_name: str, new_items: Sequence[NewItem], *, chunk_key: str, owner: str, route: int = 0
    ) -> ChunkOutcome:
        """Store ``new_items`` once under ``chunk_key``; ``owner`` names the Spark task writing it.

        A new chunk goes to queue partition ``route mod partitions`` (the job gives consecutive
        chunks consecutive routes, so they fill the partitions evenly); a resumed one to where its
        record says.

        Raises
        ------
        RequestInProgressError
            Another owner holds the chunk and its lease has not run out: retry later.
        StoreThrottledError
            Batch requests stayed throttled; the record stays pending and the owner's retry resumes.
        """
        queue = self.queue(queue_name)
        key = self._record_key(queue, chunk_key)
        now = self._clock.now()
        # Only the digits after the band are kept (the same for every priority); ``ChunkPlan.items``
        # puts each item's band in front of them.
        first = unbanded(self._ids.new_ids(now, len(new_items))[0])
        proposed = ChunkPlan(
            partition=route % queue.partitions,
            minted_at=now,
            seq=int(first[_TIME_DIGITS : _TIME_DIGITS + _SEQ_DIGITS], 16),
            node=int(first[_TIME_DIGITS + _SEQ_DIGITS :], 16),
            count=len(new_items),
            # A fair queue's items go to their groups' lane logs (``plan.items`` puts each item's
            # lane in its id), as the service's produce writes them.
            engine=self.engine,
        )
        claimed, plan, done = self._claim(queue.name, key, proposed, owner, now)
        if not claimed:
            if done:
                return ChunkOutcome(items=plan.count, replayed=True, partition=plan.partition, written=0)
            raise RequestInProgressError("another attempt is writing this chunk; retry when its lease ends")
        if plan.count != len(new_items):
            raise QueratorError(f"chunk record {key} is for {plan.count} items, not {len(new_items)}")
        if plan.engine != _V2:
            written = self._write_logs(queue, key, plan, new_items, owner, now, resumed=plan != proposed)
            self._finish(queue.name, key)
            return ChunkOutcome(items=plan.count, replayed=False, partition=plan.partition, written=written)
        items = plan.items(queue, new_items)
        resumed = plan != proposed
        if resumed:
            present = self._existing_ids(queue.name, plan.partition, [item.id for item in items])
            items = [item for item in items if item.id not in present]
        # Before any item of a band is written: a lease reads only the bands the head row names.
        # On a resume too (the first attempt may have died before it), an idempotent ``ADD``.
        self._store.register_bands(queue.name, plan.partition, [item.id for item in items], now=now)
        self._write_items(queue.name, plan.partition, items)
        if items:
            self._store.count_added(queue.name, plan.partition, items, now=plan.minted_at)
        self._finish(queue.name, key)
        return ChunkOutcome(items=plan.count, replayed=False, partition=plan.partition, written=len(items))

    def _write_logs(
        self,
        queue: QueueInfo,
        key: str,
        plan: ChunkPlan,
        new_items: Sequence[NewItem],
        owner: str,
        now: datetime,
        *,
        resumed: bool,
    ) -> int:
        """Engine v3: the chunk into its partition's claim logs, once; returns the items written
        (all of them, on a resume too: the log leaves rows already there as they are).

        In this order, so that every step a resumed chunk repeats writes what the first did:

        1. the bands named in the partition's head row (an idempotent ``ADD``);
        2. scheduled items (``enqueue_at`` after ``minted_at``) appended to their logs' schedules
           under ``scheduled_id_of`` their regenerated ids: an item already there is recognised,
           and on a resume read first (``get``) so the logs count each once;
        3. per lane, positions taken once (``take_positions``) and recorded in the chunk record
           (lane, first, count), which also says that step 2 is done: a resume skips it;
        4. per lane, ``write_taken`` at the recorded positions: a row an earlier attempt wrote is
           left as it is; one whose position a lease filled meanwhile goes to the tail.
        """
        items = plan.items(queue, new_items)
        self._store.register_bands(queue.name, plan.partition, [item.id for item in items], now=now)
        by_lane: dict[str, list[Item]] = {}
        for item in items:
            by_lane.setdefault(lane_of(item.id), []).append(item)
        positions = plan.positions
        if positions is None:
            for lane, lane_items in by_lane.items():
                later = [
                    replace(item, id=scheduled_id_of(item.id))
                    for item in lane_items
                    if item.enqueue_at is not None
                ]
                if later:
                    log = LogKey(queue.name, plan.partition, lane)
                    self._schedule(log, later, plan.minted_at, resumed=resumed, now=now)
            taken: list[tuple[str, int, int]] = []
            for lane, lane_items in by_lane.items():
                ready = [item for item in lane_items if item.enqueue_at is None]
                if ready:
                    # Their ages count as waiting from the take (``LogAges``), as a produce's do.
                    created = sum(timestamp_us(item.created_at) // 1_000_000 for item in ready)
                    ids = self._log.take_positions(
                        LogKey(queue.name, plan.partition, lane),
                        len(ready),
                        now=now,
                        created=created,
                        largest=max(item.reply_size() for item in ready),
                    )
                    taken.append((lane, _position(ids[0]), len(ids)))
            positions = self._record_positions(queue.name, key, owner, tuple(taken))
        for lane, first, count in positions:
            ready_items = [item for item in by_lane.get(lane, []) if item.enqueue_at is None]
            if len(ready_items) != count:
                raise QueratorError(f"chunk record {key} holds {count} positions of lane {lane!r}")
            self._log.write_taken(
                LogKey(queue.name, plan.partition, lane),
                [position_id(lane, first + n) for n in range(count)],
                ready_items,
                now=now,
            )
        return plan.count

    def _schedule(
        self, log: LogKey, later: list[Item], minted_at: datetime, *, resumed: bool, now: datetime
    ) -> None:
        """Append ``later`` to ``log``'s schedule, but for those an earlier attempt put there."""
        if resumed:
            # An earlier attempt may have appended some: read which (the log would recognise them,
            # but count them twice).
            present = self._log.get(log, [item.id for item in later], now=now)
            later = [item for item in later if item.id not in present]
        if later:
            # As of ``minted_at``: every one of them is due after it, so each goes to the schedule
            # under its own id, however late this attempt runs.
            self._log.append(log, later, now=minted_at)

    def _record_positions(
        self, queue: str, key: str, owner: str, taken: tuple[tuple[str, int, int], ...]
    ) -> tuple[tuple[str, int, int], ...]:
        """Note ``taken`` in the chunk record unless positions are noted already (another attempt
        of the same owner got there first: its positions are the ones written, and ``taken`` stay
        holes a lease fills). Returns the positions noted."""
        entries = [
            {"M": {_LANE: {"S": lane}, _FIRST: {"N": str(first)}, _COUNT: {"N": str(count)}}}
            for lane, first, count in taken
        ]
        try:
            reply = self._client.update_item(
                TableName=self._table,
                Key=self._key(queue, key),
                UpdateExpression="SET #pos = if_not_exists(#pos, :pos)",
                ConditionExpression="#own = :own AND #done = :false",
                ExpressionAttributeNames={"#pos": _POSITIONS, "#own": _OWNER, "#done": _DONE},
                ExpressionAttributeValues={
                    ":pos": {"L": entries},
                    ":own": {"S": owner},
                    ":false": {"BOOL": False},
                },
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if error_code(exc) != CONDITION_FAILED:
                raise translate(exc, "produce") from exc
            raise RequestInProgressError("another attempt took this chunk over; retry") from exc
        noted = _plan(reply["Attributes"]).positions
        assert noted is not None  # noqa: S101 - set by this very update
        return noted

    @staticmethod
    def _record_key(queue: QueueInfo, chunk_key: str) -> str:
        # The queue's creation time: a queue deleted and made again under the same name starts afresh.
        text = f"{chunk_key}|{timestamp_us(queue.created_at)}"
        return "chunk-" + hashlib.sha256(text.encode()).hexdigest()[:32]

    def _key(self, queue: str, key: str) -> dict[str, Any]:
        return {schema.PK: {"S": schema.idempotency_key(queue, key)}, schema.SK: {"S": schema.IDEM_SK}}

    def _claim(
        self, queue: str, key: str, proposed: ChunkPlan, owner: str, now: datetime, *, legacy: bool = False
    ) -> tuple[bool, ChunkPlan, bool]:
        """(claimed, the record's plan, done): create the record or take a pending one over.

        A record names the engine its chunk is written for, set when it is created; one written
        before engine v3 names none (its chunk is engine v2's). Taking such a record over must not
        name one, so the usual claim admits only records that name theirs, and a pending record
        without one is taken over by a second call (``legacy``) that leaves it as it is.
        """
        values = {
            ":own": {"S": owner},
            ":lease": codec.num(now + CHUNK_LEASE),
            ":now": codec.num(now),
            ":part": {"N": str(proposed.partition)},
            ":minted": codec.num(proposed.minted_at),
            ":seq": {"N": str(proposed.seq)},
            ":node": {"N": str(proposed.node)},
            ":n": {"N": str(proposed.count)},
            ":false": {"BOOL": False},
            ":ttl": {"N": str(int((now + RECORD_TTL).timestamp()))},
        }
        names = {
            "#pk": schema.PK,
            "#own": _OWNER,
            "#lease": _LEASE,
            "#part": _PARTITION,
            "#minted": _MINTED,
            "#seq": _SEQ,
            "#node": _NODE,
            "#n": _COUNT,
            "#done": _DONE,
            "#ttl": schema.TTL,
            "#eng": _ENGINE,
        }
        # Fields already there are kept: a resumed chunk regenerates the ids it started with.
        update = (
            "SET #own = :own, #lease = :lease, #part = if_not_exists(#part, :part), "
            "#minted = if_not_exists(#minted, :minted), #seq = if_not_exists(#seq, :seq), "
            "#node = if_not_exists(#node, :node), #n = if_not_exists(#n, :n), "
            "#done = if_not_exists(#done, :false), #ttl = if_not_exists(#ttl, :ttl)"
        )
        takeover = "#done = :false AND (#own = :own OR #lease < :now)"
        if legacy:
            condition = f"attribute_exists(#pk) AND attribute_not_exists(#eng) AND {takeover}"
        else:
            values[":eng"] = {"N": str(proposed.engine)}
            update += ", #eng = if_not_exists(#eng, :eng)"
            condition = f"attribute_not_exists(#pk) OR (attribute_exists(#eng) AND {takeover})"
        try:
            reply = self._client.update_item(
                TableName=self._table,
                Key=self._key(queue, key),
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if error_code(exc) != CONDITION_FAILED:
                raise translate(exc, "produce") from exc
            old: dict[str, Any] | None = exc.response.get("Item")  # type: ignore[assignment]
            old = old or self._get(queue, key)
            if old is None:  # gone between the two calls (TTL): try again
                raise RequestInProgressError("the chunk record changed; retry") from exc
            done = bool(old[_DONE]["BOOL"])
            if not legacy and not done and _ENGINE not in old:
                return self._claim(queue, key, proposed, owner, now, legacy=True)
            return False, _plan(old), done
        return True, _plan(reply["Attributes"]), False

    def _get(self, queue: str, key: str) -> dict[str, Any] | None:
        try:
            reply = self._client.get_item(
                TableName=self._table, Key=self._key(queue, key), ConsistentRead=True
            )
        except ClientError as exc:
            raise translate(exc, "produce") from exc
        item: dict[str, Any] | None = reply.get("Item")
        return item

    def _finish(self, queue: str, key: str) -> None:
        # Unconditional: every item of the chunk is stored by now, whoever owns the record.
        try:
            self._client.update_item(
                TableName=self._table,
                Key=self._key(queue, key),
                UpdateExpression="SET #done = :true",
                ExpressionAttributeNames={"#done": _DONE},
                ExpressionAttributeValues={":true": {"BOOL": True}},
            )
        except ClientError as exc:
            raise translate(exc, "produce") from exc

    # -- items ----------------------------------------------------------------------------------

    def _existing_ids(self, queue: str, partition: int, ids: Sequence[str]) -> set[str]:
        """Which of ``ids`` are stored (consistent reads, keys only)."""
        present: set[str] = set()
        for start in range(0, len(ids), BATCH_GET_KEYS):
            pending: dict[str, Any] = {
                self._table: {
                    "Keys": [
                        codec.item_key(queue, partition, i) for i in ids[start : start + BATCH_GET_KEYS]
                    ],
                    "ConsistentRead": True,
                    "ProjectionExpression": "#sk",
                    "ExpressionAttributeNames": {"#sk": schema.SK},
                }
            }
            for attempt in range(UNPROCESSED_ATTEMPTS):
                try:
                    reply = self._client.batch_get_item(RequestItems=pending)
                except ClientError as exc:
                    raise translate(exc, "produce") from exc
                rows = reply.get("Responses", {}).get(self._table, [])
                present.update(row[schema.SK]["S"] for row in rows)
                pending = reply.get("UnprocessedKeys") or {}
                if not pending:
                    break
                self._backoff(attempt)
            else:
                raise StoreThrottledError("the store left keys of a chunk unread; retry")
        return present

    def _write_items(self, queue: str, partition: int, items: Sequence[Item]) -> None:
        batches = [
            [
                {"PutRequest": {"Item": codec.encode_item(queue, partition, item)}}
                for item in items[i : i + BATCH_WRITE_ITEMS]
            ]
            for i in range(0, len(items), BATCH_WRITE_ITEMS)
        ]
        if self._pool is None or len(batches) <= 1:
            for batch in batches:
                self._write_batch(batch)
            return
        futures = [self._pool.submit(self._write_batch, batch) for batch in batches]
        error: BaseException | None = None
        for future in futures:
            try:
                future.result()
            except BaseException as exc:  # re-raised once every request has ended
                error = error or exc
        if error is not None:
            raise error

    def _write_batch(self, requests: list[dict[str, Any]]) -> None:
        pending = requests
        for attempt in range(UNPROCESSED_ATTEMPTS):
            try:
                reply = self._client.batch_write_item(RequestItems={self._table: pending})
            except ClientError as exc:
                raise translate(exc, "produce") from exc
            pending = list(reply.get("UnprocessedItems", {}).get(self._table, []))
            if not pending:
                return
            self._backoff(attempt)
        raise StoreThrottledError(f"the store left {len(pending)} items of a chunk unwritten; retry")

    def _backoff(self, attempt: int) -> None:
        # Full jitter, as AWS recommends for unprocessed items.
        with self._lock:
            delay = self._rng.uniform(0, min(UNPROCESSED_MAX_DELAY, UNPROCESSED_BASE_DELAY * 2**attempt))
        self._sleep(delay)


def _plan(attrs: dict[str, Any]) -> ChunkPlan:
    noted = attrs.get(_POSITIONS)
    return ChunkPlan(
        partition=int(attrs[_PARTITION]["N"]),
        minted_at=utc_from_timestamp_us(int(attrs[_MINTED]["N"])),
        seq=int(attrs[_SEQ]["N"]),
        node=int(attrs[_NODE]["N"]),
        count=int(attrs[_COUNT]["N"]),
        # A record from before engine v3 names no engine: its chunk is engine v2's.
        engine=int(attrs[_ENGINE]["N"]) if _ENGINE in attrs else _V2,
        positions=None
        if noted is None
        else tuple(
            (e["M"][_LANE]["S"], int(e["M"][_FIRST]["N"]), int(e["M"][_COUNT]["N"])) for e in noted["L"]
        ),
    )


def _position(item_id: str) -> int:
    parsed = parse_position_id(item_id)
    if parsed is None:  # the log hands out position ids only
        raise QueratorError(f"not a position id: {item_id!r}")
    return parsed[1]


class DynamoDBBulkLoad(DynamoDBStoreBase):
    """``BulkLoadPort`` on the items table: the item store's part of bulk loads."""

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


#: Standard retry mode backs off on throttling below our own retries; the pool holds every batch
#: request a chunk writer keeps in flight, plus the record and counter calls.
BULK_CLIENT_CONFIG = Config(
    retries={"mode": "standard", "max_attempts": 4},
    connect_timeout=5,
    read_timeout=30,
    max_pool_connections=IN_FLIGHT + 4,
)


def bulk_client(region: str | None, endpoint_url: str | None = None) -> Any:
    """A DynamoDB client for a bulk writer (one per Spark worker process).

    ``endpoint_url`` ``None`` leaves the endpoint to botocore, which honours
    ``AWS_ENDPOINT_URL_DYNAMODB`` in the executor's environment. botocore's own session, as
    ``boto3.client`` uses underneath, without importing boto3's resource machinery.
    """
    return botocore.session.Session().create_client(
        "dynamodb", region_name=region, endpoint_url=endpoint_url, config=BULK_CLIENT_CONFIG
    )


def bulk_payloads(region: str | None, bucket: str, endpoint_url: str | None = None) -> PayloadObjects | None:
    """The payload bucket of a bulk writer (``None`` without one: payloads stay within a row's).

    ``endpoint_url``: a local store's (moto serves the bucket beside the tables); ``None`` leaves
    it to botocore, which honours ``AWS_ENDPOINT_URL_S3``. A local endpoint is addressed by path.
    """
    if not bucket:
        return None
    local = endpoint_url is not None or bool(os.environ.get("AWS_ENDPOINT_URL_S3"))
    config = BULK_CLIENT_CONFIG.merge(Config(s3={"addressing_style": "path" if local else "auto"}))
    client = botocore.session.Session().create_client(
        "s3", region_name=region, endpoint_url=endpoint_url, config=config
    )
    return PayloadObjects(cast("S3Client", client), bucket, concurrency=IN_FLIGHT)


__all__ = [
    "BULK_CLIENT_CONFIG",
    "CHUNK_LEASE",
    "ChunkOutcome",
    "ChunkPlan",
    "ChunkWriter",
    "DynamoDBBulkLoad",
    "bulk_client",
    "bulk_payloads",
]
