"""One Spark partition's writer without Spark: chunks, idempotent replays, counts, retries and pacing.

The fake producer keeps what each idempotency key stored, as the service does, so a replayed chunk
stores nothing; the clock and sleep are fakes, so retries and pacing cost no time.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from benchmarks.meter import CostMeter
from querator.config import DEFAULT_ENGINE
from querator.domain.errors import (
    NothingToLeaseError,
    QueueNotFoundError,
    RequestInProgressError,
    StoreThrottledError,
)
from querator.domain.model import MAX_PAYLOAD_BYTES, ROW_PAYLOAD_BYTES, QueueInfo
from querator.domain.positions import parse_position_id
from querator.domain.priority import BANDS, band_of
from querator.service import QueueService
from querator.spark.job import PartitionWriter, ProduceCounts
from querator.spark.mapping import ColumnMap, RowError, item_digest, row_key, row_to_item
from querator.spark.producer import ChunkReceipt, DirectProducer
from querator.spark.retry import RetryPolicy
from querator.storage.dynamodb import schema
from querator.storage.dynamodb.bulk import CHUNK_LEASE, ChunkWriter
from querator.storage.dynamodb.catalog import DynamoDBQueueCatalog
from querator.storage.dynamodb.log import DynamoDBClaimLog
from querator.storage.dynamodb.store import DynamoDBItemStore
from querator.testing import FakeClock, dynamodb_client, stored_items

if TYPE_CHECKING:
    from collections.abc import Sequence

    from querator.domain.model import Item, NewItem

pytestmark = pytest.mark.spark

COLUMNS = ColumnMap(payload=("body",), key="id")
PRIORITY_COLUMNS = ColumnMap(payload=("body",), key="id", priority="prio")
GROUP_COLUMNS = ColumnMap(payload=("body",), key="id", priority="prio", group="grp")


@dataclass
class FakeTime:
    now: float = 0.0
    slept: list[float] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@dataclass
class MemoryProducer:
    """Idempotent by key, like ``QueueService.produce``; ``faults`` are raised first, in order."""

    stored: dict[str, list[NewItem]] = field(default_factory=dict)
    faults: list[Exception] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    says_replayed: bool = True

    def produce(
        self, queue: str, items: Sequence[NewItem], *, idempotency_key: str, route: int = 0
    ) -> ChunkReceipt:
        self.calls.append(len(items))
        if self.faults:
            raise self.faults.pop(0)
        replayed = idempotency_key in self.stored
        self.stored.setdefault(idempotency_key, list(items))
        return ChunkReceipt(items=len(items), replayed=replayed if self.says_replayed else None)

    def check_queue(self, queue: str) -> int:
        return 1

    def items(self) -> list[NewItem]:
        return [item for items in self.stored.values() for item in items]


@dataclass(frozen=True)
class MemoryTarget:
    producer: MemoryProducer

    def connect(self) -> MemoryProducer:
        return self.producer


def records(
    count: int, *, invalid: int = 0, size: int = 10, priorities: bool = False, groups: bool = False
) -> list:
    """Sorted (sort key, item) records as the shuffle hands them over, with ``invalid`` RowErrors;
    with ``priorities``, row ``i`` has priority ``i mod 10``; with ``groups``, also group
    ``tenant-<i mod 7>`` (none when ``i mod 7`` is 0)."""
    out: list = []
    columns = GROUP_COLUMNS if groups else PRIORITY_COLUMNS if priorities else COLUMNS
    for i in range(count):
        group = f"tenant-{i % 7}" if i % 7 else None
        row = {"id": i, "body": f"{i:06d}".ljust(size, "x"), "prio": i % 10, "grp": group}
        item = row_to_item(row, columns)
        out.append(((0, row_key(row, columns, item, job_id="job"), item_digest(item)), item))
    out += [
        ((0, f"{n:064x}", "!"), RowError(row=f"id={n}", column="body", reason="bad")) for n in range(invalid)
    ]
    return sorted(out, key=lambda record: record[0])


def write(producer: MemoryProducer, recs: list, time: FakeTime | None = None, **options) -> ProduceCounts:
    time = time or FakeTime()
    writer = PartitionWriter(
        target=MemoryTarget(producer), queue="q", job_id="job", sleep=time.sleep, clock=time.clock, **options
    )
    (counts,) = list(writer(0, iter(recs)))
    return counts


def balanced(counts: ProduceCounts) -> bool:
    parts = counts.written + counts.skipped_duplicates + counts.confirmed + counts.invalid + counts.failed
    return parts == counts.rows


def test_a_partition_is_written_in_chunks_and_invalid_rows_are_counted_and_listed():
    producer = MemoryProducer()
    counts = write(producer, records(250, invalid=3), chunk_items=100)
    assert producer.calls == [100, 100, 50]
    assert (counts.rows, counts.written, counts.invalid, counts.chunks) == (253, 250, 3, 3)
    assert [e.row for e in counts.invalid_rows] == ["id=0", "id=1", "id=2"]
    assert balanced(counts)
    assert len(producer.items()) == 250


def test_the_same_partition_again_stores_nothing_and_counts_duplicates():
    producer = MemoryProducer()
    recs = records(250)
    write(producer, recs, chunk_items=100)
    again = write(producer, recs, chunk_items=100)
    assert (again.written, again.skipped_duplicates) == (0, 250)
    assert len(producer.items()) == 250


def test_a_partition_retried_after_a_crash_replays_what_was_stored():
    producer = MemoryProducer(faults=[])
    recs = records(300)
    # The first attempt stored the first chunk, then the task died (simulated by writing less).
    write(producer, recs[:100], chunk_items=100)
    retried = write(producer, recs, chunk_items=100)
    assert (retried.skipped_duplicates, retried.written) == (100, 200)
    assert len(producer.items()) == 300


def test_a_path_that_cannot_tell_replays_counts_items_as_confirmed():
    producer = MemoryProducer(says_replayed=False)
    counts = write(producer, records(150), chunk_items=100)
    assert (counts.written, counts.skipped_duplicates, counts.confirmed) == (0, 0, 150)
    assert balanced(counts)


def test_throttling_is_retried_with_backoff_then_succeeds():
    producer = MemoryProducer(faults=[StoreThrottledError(), StoreThrottledError()])
    time = FakeTime()
    counts = write(producer, records(100), time, retry=RetryPolicy(max_attempts=5, base_delay=1.0))
    assert (counts.written, counts.retries, counts.failed) == (100, 2, 0)
    assert len(time.slept) == 2
    assert time.slept[0] <= 1.0
    assert time.slept[1] <= 2.0


def test_when_retries_run_out_the_partition_stops_and_counts_the_rest_as_failed():
    producer = MemoryProducer(faults=[StoreThrottledError()] * 3)
    counts = write(producer, records(300), chunk_items=100, retry=RetryPolicy(max_attempts=3))
    assert (counts.written, counts.failed) == (0, 300)
    assert producer.calls == [100, 100, 100]  # three attempts of the first chunk, then nothing
    assert "gave up after 3 attempts" in counts.failures[0]
    assert balanced(counts)
    assert producer.items() == []


def test_a_refused_chunk_stops_the_partition_without_retrying():
    producer = MemoryProducer(faults=[QueueNotFoundError("gone")])
    counts = write(producer, records(150), chunk_items=100)
    assert (counts.written, counts.failed, counts.retries) == (0, 150, 0)
    assert producer.calls == [100]
    assert "gone" in counts.failures[0]


def test_a_chunk_in_progress_elsewhere_is_waited_for_and_not_charged_to_max_attempts():
    producer = MemoryProducer(faults=[RequestInProgressError()] * 5)
    counts = write(producer, records(100), retry=RetryPolicy(max_attempts=2))
    assert (counts.written, counts.retries, counts.failed) == (100, 5, 0)


def test_the_rate_limit_paces_the_partition():
    producer = MemoryProducer()
    time = FakeTime()
    write(producer, records(500), time, chunk_items=100, max_items_per_second=200)
    # Five chunks of 100 at 200 items/s: each chunk after the first waits half a second.
    assert time.slept == [0.5, 0.5, 0.5, 0.5]


def test_the_writer_paces_written_chunks_and_lets_replays_through():
    producer = MemoryProducer()
    time = FakeTime()
    # 100 one-unit items at 100 units a second: chunks of 25 go out a quarter of a second apart
    counts = write(producer, records(100), time, chunk_items=25, max_write_units_per_second=100.0)
    assert counts.written == 100
    assert time.slept == pytest.approx([0.25, 0.25, 0.25])
    # the same chunks again are replays: they stored nothing and are not held back
    again = FakeTime()
    replayed = write(producer, records(100), again, chunk_items=25, max_write_units_per_second=100.0)
    assert replayed.skipped_duplicates == 100
    assert again.slept == []


def test_chunks_stay_under_the_body_limit_for_large_payloads():
    producer = MemoryProducer()
    counts = write(producer, records(30, size=300_000))
    assert counts.written == 30
    # About 400 KB of base64 each: nine fit under the 4,000,000-byte budget, ten would not.
    assert producer.calls == [9, 9, 9, 3]


# -- the direct path's chunk writer against a moto server, on a fake clock ------------------------


class FaultyClient:
    """A DynamoDB client that counts calls and, while ``throttle`` says so, leaves every item of a
    batch write unprocessed (as a throttled partition does); or dies after ``die_after`` batches."""

    def __init__(self, inner: Any, *, throttle=None, die_after: int | None = None, fail=None) -> None:
        self._inner = inner
        self._throttle = throttle or (lambda call: False)
        self._die_after = die_after
        #: ``fail(operation, kwargs)``: True raises before the call (an executor dying there).
        self.fail = fail or (lambda name, kwargs: False)
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()

    def batch_write_item(self, **kwargs: Any) -> Any:
        with self._lock:
            self.calls["BatchWriteItem"] += 1
            call = self.calls["BatchWriteItem"]
            dying = self._die_after is not None and call > self._die_after
        if dying:
            raise RuntimeError("injected: the executor died in the middle of a chunk")
        if self._throttle(call):
            return {"UnprocessedItems": kwargs["RequestItems"]}
        return self._inner.batch_write_item(**kwargs)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)

        def counted(**kwargs: Any) -> Any:
            if self.fail(name, kwargs):
                raise RuntimeError(f"injected: the executor died before {name}")
            with self._lock:
                self.calls["".join(part.title() for part in name.split("_"))] += 1
            return method(**kwargs)

        return counted


@dataclass
class ChunkRig:
    client: FaultyClient
    raw: Any
    store: DynamoDBItemStore
    producer: DirectProducer
    clock: FakeClock
    items_table: str
    service: QueueService
    writer: ChunkWriter

    def stored(self) -> list[Item]:
        return stored_items(self.service, "q")

    def lease_all(self) -> list[Item]:
        """Leases until nothing is left; the items in the order they were handed out."""
        leased: list[Item] = []
        while True:
            try:
                leased += self.service.lease("q", batch_size=30, client_id="c").items
            except NothingToLeaseError:
                return leased


def chunk_rig(endpoint: str, *, engine: int = DEFAULT_ENGINE, **faults: Any) -> ChunkRig:
    """A queue of 2 partitions, a chunk writer for ``engine`` and a service (of that engine) that
    leases what it writes."""
    raw = dynamodb_client(endpoint)
    prefix = f"w{uuid.uuid4().hex[:8]}"
    schema.create_tables(raw, items_table=f"{prefix}-items", catalog_table=f"{prefix}-queues")
    clock = FakeClock()
    client = FaultyClient(raw, **faults)
    store = DynamoDBItemStore(raw, f"{prefix}-items")
    catalog = DynamoDBQueueCatalog(f"{prefix}-queues", host=endpoint, region="us-east-1")
    log = DynamoDBClaimLog(raw, f"{prefix}-items", sleep=clock.sleep) if engine == 3 else None
    service = QueueService(catalog=catalog, store=store, clock=clock, log=log)
    service.create_queue(
        QueueInfo(
            name="q",
            lease_timeout=timedelta(minutes=1),
            expire_timeout=timedelta(days=7),
            partitions=2,
            created_at=clock.now(),
            updated_at=clock.now(),
        )
    )
    writer = ChunkWriter(
        client,
        f"{prefix}-items",
        store=store,
        catalog=catalog,
        clock=clock,
        sleep=clock.sleep,
        in_flight=4,
        engine=engine,
    )
    return ChunkRig(
        client, raw, store, DirectProducer(service, writer), clock, f"{prefix}-items", service, writer
    )


def rig_writer(rig: ChunkRig, **options: Any) -> PartitionWriter:
    return PartitionWriter(
        target=MemoryTarget(rig.producer),  # type: ignore[arg-type]
        queue="q",
        job_id="job",
        sleep=rig.clock.sleep,
        clock=lambda: rig.clock.now().timestamp(),
        **options,
    )


@pytest.mark.server
def test_a_chunk_whose_writer_died_mid_write_is_resumed_at_once_by_its_retry(moto_server):
    # Engine v2's batch writes (v3's resumes: test_v3_a_chunk_interrupted_then_resumed_...)
    # GIVEN the first attempt stored 2 of the chunk's 8 batches (200 of 200 items) and died
    rig = chunk_rig(moto_server, engine=2, die_after=2)
    recs = records(200)
    with pytest.raises(RuntimeError, match="injected"):
        list(rig_writer(rig, retry=RetryPolicy(max_attempts=1))(0, iter(recs)))
    assert 0 < len(rig.stored()) < 200
    rig.client._die_after = None

    # WHEN the same task retries at once (the same owner)
    started = rig.clock.now()
    (counts,) = list(rig_writer(rig)(0, iter(recs)))

    # THEN it took its chunk over without waiting, wrote only the missing items, no duplicates
    assert rig.clock.now() - started < timedelta(seconds=1)
    assert (counts.written, counts.failed, counts.retries) == (200, 0, 0)
    payloads = sorted(item.payload for item in rig.stored())
    assert payloads == sorted(item.payload for _, item in recs)
    assert rig.client.calls["BatchGetItem"] == 2  # which of the 200 ids exist: 100 keys a request


@pytest.mark.server
def test_a_throttled_chunk_finishes_within_its_backoff_budget(moto_server):
    # GIVEN a queue partition that throttles 30 batch writes in a row, from the 3rd on (~3 s)
    # Engine v2's BatchWriteItem calls left unprocessed (v3 writes its packed rows one PutItem each)
    rig = chunk_rig(moto_server, engine=2, throttle=lambda call: 3 <= call < 33)
    recs = records(1000)
    started = rig.clock.now()

    (counts,) = list(rig_writer(rig)(0, iter(recs)))

    # THEN the chunk is stored once, within the retry policy's budget, not 15 minutes later
    assert (counts.written, counts.failed) == (1000, 0)
    assert rig.clock.now() - started < timedelta(seconds=60)
    assert sorted(i.payload for i in rig.stored()) == sorted(item.payload for _, item in recs)
    # One compact record claimed per attempt and finished once; no item written one by one
    assert rig.client.calls["UpdateItem"] <= counts.retries + 2
    assert rig.client.calls["PutItem"] == 0


@pytest.mark.server
def test_a_fresh_chunk_costs_43_requests_and_a_replay_one(moto_server):
    # Engine v2's requests (v3's: test_v3_a_chunk_of_1000_items_of_100_bytes_costs_...)
    rig = chunk_rig(moto_server, engine=2)
    recs = records(1000)
    (first,) = list(rig_writer(rig)(0, iter(recs)))
    fresh = sum(rig.client.calls.values())
    (again,) = list(rig_writer(rig)(0, iter(recs)))

    assert (first.written, again.written, again.skipped_duplicates) == (1000, 0, 1000)
    # The record, 40 batches of 25, the partition's counters (store, not counted here), the finish
    assert rig.client.calls["BatchWriteItem"] == 40
    assert fresh == 42  # + 1 counter update through the store's own client: 43
    assert sum(rig.client.calls.values()) - fresh == 1  # the replay: one refused claim
    assert len(rig.stored()) == 1000


@pytest.mark.server
def test_a_chunk_with_priorities_resumed_mid_write_regenerates_its_banded_ids_and_leases_in_order(
    moto_server,
):
    # GIVEN a chunk of 200 items of priorities 0-9 whose first attempt stored 2 of its 8 batches
    rig = chunk_rig(moto_server, engine=2, die_after=2)
    recs = records(200, priorities=True)
    with pytest.raises(RuntimeError, match="injected"):
        list(rig_writer(rig, retry=RetryPolicy(max_attempts=1))(0, iter(recs)))
    before = {item.id: item.payload for item in rig.stored()}
    assert 0 < len(before) < 200
    rig.client._die_after = None

    # WHEN its retry resumes it
    (counts,) = list(rig_writer(rig)(0, iter(recs)))

    # THEN the ids the first attempt stored are among the chunk's ids (the same bands and digits):
    # every row is stored once, with its priority
    assert (counts.written, counts.failed) == (200, 0)
    after = {item.id: item for item in rig.stored()}
    assert len(after) == 200
    assert all(after[item_id].payload == payload for item_id, payload in before.items())
    priority_of_payload = {item.payload: item.priority for _, item in recs}
    assert all(item.priority == priority_of_payload[item.payload] for item in after.values())
    assert {item.priority for item in after.values()} == set(range(10))

    # AND the bands were registered, so a lease hands out all of them: by priority, then the
    # chunk's order (the sort of the records)
    leased = rig.lease_all()
    chunk_order = [item.payload for _, item in recs]
    expected = sorted(
        chunk_order, key=lambda payload: (priority_of_payload[payload], chunk_order.index(payload))
    )
    assert [item.payload for item in leased] == expected


@pytest.mark.server
@pytest.mark.parametrize("engine", [2, 3])
def test_a_chunks_bands_are_registered_before_any_of_its_items_is_written(moto_server, engine):
    rig = chunk_rig(moto_server, engine=engine)
    register = rig.store.register_bands
    calls: list[tuple[set[str], int]] = []

    def watched(queue: str, partition: int, ids: Sequence[str], *, now: datetime) -> None:
        calls.append(({band_of(item_id) for item_id in ids}, len(rig.stored())))
        register(queue, partition, ids, now=now)

    rig.store.register_bands = watched  # type: ignore[method-assign]
    (counts,) = list(rig_writer(rig, chunk_items=100)(0, iter(records(200, priorities=True))))

    assert counts.written == 200
    # Each chunk's bands (every priority's: rows 0-199 have priorities i mod 10), with what was
    # stored when they were registered: nothing of this chunk yet
    assert calls == [(set(BANDS), 0), (set(BANDS), 100)]


@pytest.mark.server
def test_a_chunk_with_groups_resumed_mid_write_stores_every_item_once_with_its_group(moto_server):
    # GIVEN a chunk of 200 items of 7 groups (and none) whose first attempt stored 2 of its 8 batches
    rig = chunk_rig(moto_server, engine=2, die_after=2)
    recs = records(200, groups=True)
    with pytest.raises(RuntimeError, match="injected"):
        list(rig_writer(rig, retry=RetryPolicy(max_attempts=1))(0, iter(recs)))
    before = {item.id: item for item in rig.stored()}
    assert 0 < len(before) < 200
    rig.client._die_after = None

    # WHEN its retry resumes it
    (counts,) = list(rig_writer(rig)(0, iter(recs)))

    # THEN the items the first attempt stored are the ones the retry regenerated (same ids and
    # groups), and every row is stored once with its group and priority
    assert (counts.written, counts.failed) == (200, 0)
    after = {item.id: item for item in rig.stored()}
    assert len(after) == 200
    assert all(after[item_id] == item for item_id, item in before.items())
    expected = {item.payload: (item.group, item.priority) for _, item in recs}
    assert {item.payload: (item.group, item.priority) for item in after.values()} == expected
    assert {item.group for item in after.values()} == {""} | {f"tenant-{n}" for n in range(1, 7)}


# -- engine v3: chunks into the partitions' claim logs, packed ------------------------------------


def v3_items(count: int, *, size: int = 100, scheduled: set[int] = frozenset(), due=None) -> list[NewItem]:
    """``count`` items of ``size`` bytes, item ``i`` of priority ``i mod 10``; those in ``scheduled``
    due at ``due``."""
    from querator.domain.model import NewItem  # noqa: PLC0415 - a type elsewhere in this file

    return [
        NewItem(
            payload=f"{i:06d}".ljust(size, "x").encode(),
            priority=i % 10,
            enqueue_at=due if i in scheduled else None,
        )
        for i in range(count)
    ]


def log_rows(rig: ChunkRig) -> Counter[str]:
    """The claim logs' rows by kind (``packed``, ``filler``, ``schedule``, ``head``) and the items in
    packed rows (``packed items``); engine v2's item rows as ``v2 items``."""
    found: Counter[str] = Counter()
    pages = rig.raw.get_paginator("scan").paginate(TableName=rig.items_table)
    for row in (row for page in pages for row in page["Items"]):
        pk, sk = row["pk"]["S"], row["sk"]["S"]
        if f"{schema.SEPARATOR}{schema.LOG_MARK}" not in pk:
            found["v2 items"] += sk[:1] not in ("~", "") and "idem" not in pk
            continue
        if sk.startswith(schema.LOG_ROW_PREFIX):
            filler = schema.LOG_FILLER in row
            found["filler" if filler else "packed"] += 1
            found["packed items"] += 0 if filler else len(row[schema.LOG_ITEMS]["L"])
        elif sk.startswith(schema.LOG_SCHEDULE_PREFIX):
            found["schedule"] += 1
        elif sk == schema.LOG_HEAD_SK:
            found["head"] += 1
    return found


def leased_payloads(rig: ChunkRig) -> Counter[bytes]:
    """Leases and completes until nothing is left: the payloads delivered."""
    delivered: Counter[bytes] = Counter()
    while True:
        try:
            lease = rig.service.lease("q", batch_size=30, client_id="c")
        except NothingToLeaseError:
            return delivered
        delivered.update(item.payload for item in lease.items)
        assert not rig.service.complete("q", lease.partition, [item.id for item in lease.items]).failed


@pytest.mark.server
def test_v3_a_fresh_chunk_is_packed_into_its_partitions_logs_and_leased_once_by_priority(moto_server):
    rig = chunk_rig(moto_server, engine=3)
    items = v3_items(200)

    outcome = rig.writer.write("q", items, chunk_key="c1", owner="task-1", route=1)

    assert (outcome.items, outcome.written, outcome.replayed, outcome.partition) == (200, 200, False, 1)
    rows = log_rows(rig)
    # One packed row per band (10 lanes of 20 items of ~100 B), no v2 row, one head per band
    assert (rows["packed"], rows["packed items"], rows["v2 items"], rows["head"]) == (10, 200, 0, 10)
    # Waiting, as old as they are (stats' ages count them from the take, as a produce's)
    rig.clock.advance(timedelta(seconds=30))
    (stats,) = [s for s in rig.service.stats("q") if s.total]
    assert (stats.total, stats.average_age) == (200, timedelta(seconds=30))
    leased = rig.lease_all()
    assert all(parse_position_id(item.id) is not None for item in leased)
    # By priority, then the chunk's order
    assert [item.payload for item in leased] == [
        item.payload for item in sorted(items, key=lambda item: (item.priority, items.index(item)))
    ]
    # The partition's logs count them as produced
    assert sum(p.produced for p in rig.service.stats("q")) == 200

    # A re-run of the job: the done record, one refused claim, nothing written
    calls = sum(rig.client.calls.values())
    again = rig.writer.write("q", items, chunk_key="c1", owner="run-2", route=0)
    assert (again.replayed, again.written, again.partition) == (True, 0, 1)
    assert sum(rig.client.calls.values()) - calls == 1
    assert log_rows(rig)["packed items"] == 200


@pytest.mark.server
@pytest.mark.parametrize(
    "dies_before",
    [
        # Taken, not noted: the retry takes others; these are holes, filled one row each (slow)
        pytest.param("the positions are noted", marks=pytest.mark.slow),
        "the first row is written",  # noted, nothing written
        "the third row is written",  # noted, two of ten rows written
        "the record is finished",  # everything written
    ],
)
def test_v3_a_chunk_interrupted_then_resumed_and_run_again_delivers_every_item_once(moto_server, dies_before):
    puts: list[int] = []

    def fail(name: str, kwargs: dict[str, Any]) -> bool:
        if not dying:
            return False
        if name == "put_item" and kwargs["Item"]["sk"]["S"].startswith(schema.LOG_ROW_PREFIX):
            puts.append(1)
            return (
                dies_before
                == ("the first row is written", "", "the third row is written")[min(len(puts) - 1, 2)]
            )
        update = kwargs.get("UpdateExpression", "")
        if name == "update_item" and dies_before == "the positions are noted":
            return "#pos" in update
        return name == "update_item" and dies_before == "the record is finished" and "#done = :true" in update

    dying = True
    rig = chunk_rig(moto_server, engine=3, fail=fail)
    items = v3_items(200)
    with pytest.raises(RuntimeError, match="injected"):
        rig.writer.write("q", items, chunk_key="c1", owner="task-1")
    dying = False

    # The task's retry resumes at once (the same owner), then a second run of the job replays it
    resumed = rig.writer.write("q", items, chunk_key="c1", owner="task-1")
    replayed = rig.writer.write("q", items, chunk_key="c1", owner="run-2")

    assert (resumed.replayed, replayed.replayed) == (False, True)
    # Holes the first attempt left (positions taken, never noted) are filled by the leases, after
    # HOLE_TIMEOUT_S on the fake clock; every item comes out exactly once
    assert leased_payloads(rig) == Counter(item.payload for item in items)
    rows = log_rows(rig)
    assert rows["packed items"] == 200
    assert rows["v2 items"] == 0


@pytest.mark.server
def test_v3_a_resumed_chunk_whose_positions_a_lease_filled_moves_its_rows_to_the_tail(moto_server):
    # GIVEN a chunk that noted its positions and died before writing any row
    dying = True
    rig = chunk_rig(
        moto_server,
        engine=3,
        fail=lambda name, kwargs: (
            dying and name == "put_item" and kwargs["Item"]["sk"]["S"].startswith(schema.LOG_ROW_PREFIX)
        ),
    )
    items = v3_items(40)
    with pytest.raises(RuntimeError, match="injected"):
        rig.writer.write("q", items, chunk_key="c1", owner="task-1")
    dying = False
    # AND a lease that met its holes, waited HOLE_TIMEOUT_S (fake clock) and filled them
    assert rig.lease_all() == []
    assert log_rows(rig)["filler"] > 0

    # WHEN another run takes the chunk over once its lease ran out
    rig.clock.advance(CHUNK_LEASE + timedelta(seconds=1))
    resumed = rig.writer.write("q", items, chunk_key="c1", owner="run-2")

    # THEN its rows went to new positions at the tail: every item leased once
    assert resumed.written == 40
    assert leased_payloads(rig) == Counter(item.payload for item in items)


@pytest.mark.server
def test_v3_scheduled_items_go_to_the_schedule_once_across_a_resume(moto_server):
    # GIVEN a chunk of 100 items, 30 of them due in an hour, whose first attempt appended them to
    # their schedules and died before it noted its positions
    dying = True
    rig = chunk_rig(
        moto_server,
        engine=3,
        fail=lambda name, kwargs: (
            dying and name == "update_item" and "#pos" in kwargs.get("UpdateExpression", "")
        ),
    )
    due = rig.clock.now() + timedelta(hours=1)
    later = set(range(0, 100, 10)) | set(range(1, 100, 5))
    items = v3_items(100, scheduled=later, due=due)
    with pytest.raises(RuntimeError, match="injected"):
        rig.writer.write("q", items, chunk_key="c1", owner="task-1")
    assert log_rows(rig)["schedule"] == len(later)
    dying = False

    # WHEN its retry resumes it, later than it began
    rig.clock.advance(timedelta(seconds=5))
    rig.writer.write("q", items, chunk_key="c1", owner="task-1")

    # THEN each scheduled item is in a schedule once, and counted once
    assert log_rows(rig)["schedule"] == len(later)
    stats = rig.service.stats("q")
    assert sum(p.scheduled for p in stats) == len(later)
    # AND the others are leased now, the scheduled ones once due: every item once
    now_ready = leased_payloads(rig)
    assert now_ready == Counter(item.payload for n, item in enumerate(items) if n not in later)
    rig.clock.advance(timedelta(hours=1))
    assert leased_payloads(rig) == Counter(item.payload for n, item in enumerate(items) if n in later)


@pytest.mark.server
@pytest.mark.parametrize("named", [True, False], ids=["record names engine 2", "record from before v3"])
def test_v3_a_chunk_begun_on_engine_v2_is_resumed_on_v2_by_a_v3_writer(moto_server, named):
    # GIVEN a chunk an engine v2 writer began (2 of its 8 batches) and died in
    rig = chunk_rig(moto_server, engine=2, die_after=2)
    recs = [item for _, item in records(200)]
    with pytest.raises(RuntimeError, match="injected"):
        rig.writer.write("q", recs, chunk_key="c1", owner="task-1")
    rig.client._die_after = None
    if not named:
        # A record written before engine v3 names no engine
        pages = rig.raw.get_paginator("scan").paginate(TableName=rig.items_table)
        (record,) = [row for page in pages for row in page["Items"] if "eng" in row]
        rig.raw.update_item(
            TableName=rig.items_table,
            Key={"pk": record["pk"], "sk": record["sk"]},
            UpdateExpression="REMOVE eng",
        )

    # WHEN a writer of engine v3 resumes it: it stays engine v2's, every item once
    rig.writer.engine = 3
    outcome = rig.writer.write("q", recs, chunk_key="c1", owner="task-1")
    assert outcome.replayed is False
    rows = log_rows(rig)
    assert (rows["v2 items"], rows["packed items"]) == (200, 0)
    assert len(rig.stored()) == 200


def test_the_engine_is_the_configured_default_unless_the_cli_says():
    from querator.spark.cli import direct_target, produce_parser  # noqa: PLC0415

    base = ["--source", "s", "--queue", "q", "--items-table", "items", "--catalog-table", "queues"]
    base += ["--region", "us-east-1", "--payload", "body", "--job-id", "j", "--staging-dir", "staging"]
    assert direct_target(produce_parser().parse_args(base)).engine == DEFAULT_ENGINE
    assert direct_target(produce_parser().parse_args([*base, "--engine", "3"])).engine == 3
    with pytest.raises(SystemExit):
        produce_parser().parse_args([*base, "--engine", "4"])


@pytest.mark.slow
@pytest.mark.server
def test_v3_a_chunk_of_1000_items_of_100_bytes_costs_a_fifth_of_v2s_write_units(moto_server):
    from querator.domain.model import NewItem  # noqa: PLC0415 - a type elsewhere in this file

    items = [NewItem(payload=f"{i:06d}".ljust(100, "x").encode()) for i in range(1000)]
    units: dict[int, float] = {}
    requests: dict[int, int] = {}
    for engine in (2, 3):
        rig = chunk_rig(moto_server, engine=engine)
        meter = CostMeter(dynamodb_client(moto_server))
        meter.attach(rig.raw)
        rig.writer.write("q", items, chunk_key="c1", owner="task-1")
        cost = meter.snapshot()
        units[engine], requests[engine] = cost.write_units, cost.requests
        rows = log_rows(rig)
        assert (rows["v2 items"], rows["packed items"]) == ((1000, 0) if engine == 2 else (0, 1000))

    # v2: a row per item (1 unit each) + record, counters, finish: 1,003 units in 43 requests.
    # v3: ~140 B an item in rows of up to 16 KB + record, sequencer, positions noted, finish: 146
    # units in 13 requests (moto server, benchmarks.meter's rules)
    assert units[2] >= 1000
    assert units[3] <= 0.2 * units[2]
    assert requests[3] < requests[2]
    print(f"write units per item: v2 {units[2] / 1000:.3f}, v3 {units[3] / 1000:.3f}; requests {requests}")


@pytest.mark.server
@pytest.mark.parametrize("cap", [0, 2], ids=["uncapped", "two per group"])
def test_v3_a_fair_queues_chunk_goes_to_its_groups_lane_logs_and_leases_round_robin(moto_server, cap):
    # GIVEN a fair queue (capped at two leased items per group, or not) and a chunk of 50 items of
    # 7 groups (one of them ungrouped), every priority 0
    rig = chunk_rig(moto_server, engine=3)
    now = rig.clock.now()
    rig.service.create_queue(
        QueueInfo(
            name="fair",
            lease_timeout=timedelta(minutes=1),
            expire_timeout=timedelta(days=7),
            partitions=1,
            delivery="fair",
            max_leased_per_group=cap,
            created_at=now,
            updated_at=now,
        )
    )
    recs = [replace(item, priority=0) for _, item in records(50, groups=True)]

    # WHEN the chunk is written, then written again (a re-run of the job)
    assert rig.writer.write("fair", recs, chunk_key="c1", owner="task-1").written == 50
    assert rig.writer.write("fair", recs, chunk_key="c1", owner="run-2").replayed is True

    # THEN it is packed into one lane log per group, no v2 row
    rows = log_rows(rig)
    assert (rows["v2 items"], rows["packed items"], rows["head"]) == (0, 50, 7)
    # AND a lease of 7 takes one item of each group, as the service's fair produce would give it
    first = rig.service.lease("fair", batch_size=7, client_id="c")
    assert sorted(item.group for item in first.items) == sorted({item.group for item in recs})
    # AND with a cap, no group holds more than two leased items however many are asked for
    if cap:
        more = rig.service.lease("fair", batch_size=50, client_id="c")
        held = Counter(item.group for item in [*first.items, *more.items] if item.group)
        assert held and max(held.values()) == cap
        ids = [item.id for item in [*first.items, *more.items]]
        assert not rig.service.complete("fair", 0, ids).failed
    else:
        assert not rig.service.complete("fair", 0, [item.id for item in first.items]).failed
    # AND every item is delivered exactly once
    delivered = Counter(item.payload for item in first.items)
    if cap:
        delivered.update(item.payload for item in more.items)
    while True:
        try:
            lease = rig.service.lease("fair", batch_size=30, client_id="c")
        except NothingToLeaseError:
            break
        delivered.update(item.payload for item in lease.items)
        assert not rig.service.complete("fair", 0, [item.id for item in lease.items]).failed
    assert delivered == Counter(item.payload for item in recs)


@pytest.mark.server
def test_v3_a_chunk_of_large_items_keeps_a_lease_reply_under_the_cap(moto_server):
    import json  # noqa: PLC0415 - only this test builds the wire reply

    from querator.api import schemas  # noqa: PLC0415
    from querator.domain.model import NewItem  # noqa: PLC0415 - a type elsewhere in this file
    from querator.service import MAX_REPLY_BYTES  # noqa: PLC0415

    # GIVEN a chunk of 20 items of 300,000 bytes (8 MB of base64 in all), written by the bulk path,
    # which takes its positions before it writes them
    rig = chunk_rig(moto_server, engine=3)
    items = [NewItem(payload=bytes([i]) * 300_000) for i in range(20)]
    rig.writer.write("q", items, chunk_key="c1", owner="task-1", route=0)

    # WHEN a consumer asks for all of them at once
    lease = rig.service.lease("q", batch_size=20, client_id="c")

    # THEN the reply is sized by them: under the cap, and the rest leased once later
    assert 0 < len(lease.items) < 20
    assert len(json.dumps(schemas.LeaseResponse.from_domain(lease).to_wire()).encode()) <= MAX_REPLY_BYTES
    rest = rig.lease_all()
    assert sorted(item.payload[0] for item in [*lease.items, *rest]) == list(range(20))


def test_the_payload_bucket_sets_the_largest_row_the_cli_takes(monkeypatch):
    from querator.spark.cli import direct_target, produce_parser  # noqa: PLC0415

    monkeypatch.delenv("QUERATOR_PAYLOAD_BUCKET", raising=False)
    base = ["--source", "s", "--queue", "q", "--items-table", "items", "--catalog-table", "queues"]
    base += ["--region", "us-east-1", "--payload", "body", "--job-id", "j", "--staging-dir", "staging"]
    without = direct_target(produce_parser().parse_args(base))
    assert (without.settings.payload_bucket, without.payload_limit) == ("", ROW_PAYLOAD_BYTES)
    bucket = direct_target(produce_parser().parse_args([*base, "--payload-bucket", "stack-payloads"]))
    assert (bucket.settings.payload_bucket, bucket.payload_limit) == ("stack-payloads", MAX_PAYLOAD_BYTES)
    v2 = direct_target(produce_parser().parse_args([*base, "--payload-bucket", "b", "--engine", "2"]))
    assert v2.payload_limit == ROW_PAYLOAD_BYTES
