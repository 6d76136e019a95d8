"""Spark producer against a single-threaded moto server: every row once, re-runs and retried tasks
store nothing twice, invalid rows are reported, throttling ends in a clear failure with counts."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark import TaskContext, cloudpickle
from pyspark.sql import functions as F  # noqa: N812
from pyspark.sql import types as T  # noqa: N812

from querator.domain.errors import (
    NothingToLeaseError,
    QueratorError,
    QueueNotFoundError,
    StoreThrottledError,
)
from querator.domain.model import MAX_PAYLOAD_BYTES, ROW_PAYLOAD_BYTES
from querator.domain.priority import band_of
from querator.spark.job import (
    ProduceCounts,
    ProduceFailedError,
    produce_dataframe,
    spark_int_hash,
    spread_buckets,
)
from querator.spark.mapping import ColumnMap, row_key, row_to_item
from querator.spark.plan import PLAN_NAME, PlanMismatchError, RerunTooLateError, job_dir
from querator.spark.retry import RetryPolicy
from querator.testing import bucket_keys
from tests.spark.helpers import Store, count_items, create_queue, fresh_store, stored, stored_by_partition

if TYPE_CHECKING:
    from collections.abc import Sequence

    from querator.domain.model import Item, NewItem
    from querator.spark.producer import ChunkReceipt, DirectTarget, Producer

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

pytestmark = [pytest.mark.spark, pytest.mark.server]

# The fault-injecting targets below live in this test module, which the Python workers cannot
# import by name; cloudpickle ships them by value instead.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROWS = 10_000
COLUMNS = ColumnMap(payload=("body",), key="id", reference="ref", kind="kind")


def rows_frame(spark, count: int, *, start: int = 0):
    schema = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("body", T.StringType()),
            T.StructField("ref", T.StringType()),
            T.StructField("kind", T.StringType()),
        ]
    )
    data = [
        (i, f"payload {i} ✓ {'x' * (i % 50)}", f"ref-{i}", "order" if i % 2 else None)
        for i in range(start, start + count)
    ]
    return spark.createDataFrame(data, schema)


# -- 10,000 rows, then the same job again ---------------------------------------------------------


@dataclass
class Load:
    store: Store
    queue: str
    first: ProduceCounts
    after_first: dict[int, list[Item]]
    second: ProduceCounts
    count_after_second: int


@pytest.fixture(scope="module")
def ten_thousand(spark, moto_server: str) -> Load:
    store = fresh_store(moto_server)
    queue = create_queue(store.service, "bulk")
    frame = rows_frame(spark, ROWS)
    first = produce_dataframe(
        frame, queue=queue, columns=COLUMNS, target=store.target, staging_dir=store.staging, job_id="load-1"
    )
    # Reading 10,000 items back from moto takes many seconds: read them once, count them after.
    after_first = stored_by_partition(store.service, queue)
    second = produce_dataframe(
        frame, queue=queue, columns=COLUMNS, target=store.target, staging_dir=store.staging, job_id="load-1"
    )
    count_after_second = count_items(store, queue)
    return Load(
        store=store,
        queue=queue,
        first=first,
        after_first=after_first,
        second=second,
        count_after_second=count_after_second,
    )


def test_ten_thousand_rows_become_ten_thousand_items_with_payloads_intact(ten_thousand: Load):
    counts = ten_thousand.first
    assert (counts.rows, counts.written, counts.skipped_duplicates, counts.invalid, counts.failed) == (
        ROWS,
        ROWS,
        0,
        0,
        0,
    )
    items = [item for items in ten_thousand.after_first.values() for item in items]
    assert len(items) == ROWS
    by_reference = {item.reference: item for item in items}
    assert len(by_reference) == ROWS
    for i in range(ROWS):
        item = by_reference[f"ref-{i}"]
        assert item.payload == f"payload {i} ✓ {'x' * (i % 50)}".encode()
        assert item.kind == ("order" if i % 2 else "")


def test_items_are_spread_over_every_queue_partition(ten_thousand: Load):
    per_partition = {p: len(items) for p, items in ten_thousand.after_first.items()}
    assert sum(per_partition.values()) == ROWS
    assert min(per_partition.values()) > 0, per_partition


def test_running_the_same_job_again_adds_no_items(ten_thousand: Load):
    counts = ten_thousand.second
    assert (counts.rows, counts.written, counts.skipped_duplicates, counts.failed) == (ROWS, 0, ROWS, 0)
    assert ten_thousand.count_after_second == ROWS


def test_a_rerun_whose_input_arrives_in_other_splits_and_order_adds_nothing(spark, store: Store):
    queue = create_queue(store.service, "resplit", partitions=2)
    frame = rows_frame(spark, 600)
    # No key column: rows are identified by their content and the job id.
    columns = ColumnMap(payload=("body",), reference="ref")
    options = {"queue": queue, "columns": columns, "target": store.target, "job_id": "resplit"}
    options["staging_dir"] = store.staging
    first = produce_dataframe(frame.coalesce(1), partitions=3, chunk_items=100, **options)
    # The same rows read as 5 splits in reverse order (another cluster, other file splits).
    second = produce_dataframe(
        frame.repartition(5).orderBy(frame.id.desc()), partitions=3, chunk_items=100, **options
    )
    assert (first.written, second.written, second.skipped_duplicates) == (600, 0, 600)
    assert count_items(store, queue) == 600


def test_a_rerun_with_another_partition_count_adds_nothing(spark, store: Store):
    queue = create_queue(store.service, "repartitioned", partitions=2)
    frame = rows_frame(spark, 1000)
    options = {"queue": queue, "columns": COLUMNS, "target": store.target, "staging_dir": store.staging}
    # GIVEN a job stored 1,000 rows with 4 Spark partitions
    first = produce_dataframe(frame, job_id="grow", partitions=4, chunk_items=100, **options)
    # WHEN it is re-run on "a bigger cluster" with 7, then a smaller one with 1
    more = produce_dataframe(frame, job_id="grow", partitions=7, chunk_items=100, **options)
    fewer = produce_dataframe(frame, job_id="grow", partitions=1, chunk_items=100, **options)
    # THEN the chunks are the same ones (logical buckets, not Spark partitions) and nothing is added
    assert (first.written, more.written, more.skipped_duplicates) == (1000, 0, 1000)
    assert (fewer.written, fewer.skipped_duplicates) == (0, 1000)
    assert count_items(store, queue) == 1000


@pytest.mark.parametrize(("buckets", "writers"), [(2, 2), (12, 2), (50, 2), (12, 8), (3, 7), (256, 4)])
def test_buckets_are_spread_whole_and_evenly_over_the_writers(spark, buckets: int, writers: int):
    # GIVEN staged rows in `buckets` buckets (hashing the bucket itself put both of 2 buckets in
    # one of 2 partitions, and 8 of 12)
    staged = spark.range(buckets * 30).select((F.col("id") % buckets).cast("int").alias("bucket"))
    # WHEN they are spread over `writers` Spark partitions
    spread = spread_buckets(staged, writers)
    held = spread.rdd.mapPartitionsWithIndex(lambda i, rows: [(i, {row.bucket for row in rows})]).collect()
    # THEN every bucket is in exactly one partition, bucket b in partition b mod writers
    assert sorted(b for _, bs in held for b in bs) == list(range(buckets))
    assert all(b % writers == i for i, bs in held for b in bs)
    assert spread.rdd.getNumPartitions() == writers


def test_the_partitioning_hash_is_sparks(spark):
    # The writers' spread relies on computing Spark's hash of an int column without a Spark job.
    values = [*range(-300, 3000), 2**31 - 1, -(2**31)]
    hashed = spark.createDataFrame([(v,) for v in values], "v int").select(F.hash("v")).collect()
    assert [row[0] for row in hashed] == [spark_int_hash(v) for v in values]


def test_a_rerun_that_asks_for_another_plan_is_refused_before_writing(spark, store: Store):
    queue = create_queue(store.service, "replanned", partitions=1)
    frame = rows_frame(spark, 50)
    options = {"queue": queue, "columns": COLUMNS, "target": store.target, "staging_dir": store.staging}
    produce_dataframe(frame, job_id="fixed", chunk_items=10, **options)
    with pytest.raises(PlanMismatchError, match=r"chunk_items: 10 on the first run, 20 now"):
        produce_dataframe(frame, job_id="fixed", chunk_items=20, **options)
    other_key = ColumnMap(payload=("body",), key="ref")
    with pytest.raises(PlanMismatchError, match="columns"):
        produce_dataframe(frame, job_id="fixed", chunk_items=10, **{**options, "columns": other_key})
    assert count_items(store, queue) == 50


def test_a_rerun_after_the_stores_memory_of_the_chunks_is_refused(spark, store: Store):
    queue = create_queue(store.service, "late", partitions=1)
    frame = rows_frame(spark, 20)
    options = {"queue": queue, "columns": COLUMNS, "target": store.target, "staging_dir": store.staging}
    produce_dataframe(frame, job_id="late", **options)
    # GIVEN the first run's record says it was staged a day ago
    path = Path(store.staging) / "late" / "job.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "staged_at": record["staged_at"] - 24 * 3600}))
    Path(store.staging, "late", ".job.json.crc").unlink(missing_ok=True)
    # THEN a re-run is refused instead of storing the 20 rows again
    with pytest.raises(RerunTooLateError, match="24 hours"):
        produce_dataframe(frame, job_id="late", **options)
    assert count_items(store, queue) == 20


def test_expect_rows_that_the_source_does_not_hold_fails_before_writing(spark, store: Store):
    queue = create_queue(store.service, "expected", partitions=1)
    with pytest.raises(ProduceFailedError, match="1000 were expected"):
        produce_dataframe(
            rows_frame(spark, 999),
            queue=queue,
            columns=COLUMNS,
            target=store.target,
            staging_dir=store.staging,
            job_id="short",
            expect_rows=1000,
        )
    assert count_items(store, queue) == 0


def drifting_source(spark, marker: str, count: int):
    """Rows of a source that loses one row every time it is read again (a table being rewritten,
    a non-deterministic query): the first evaluation leaves ``marker`` behind."""

    def rows(index: int, numbers):
        seen = Path(marker).exists()
        if index == 0:
            Path(marker).touch()
        for n in numbers:
            if not (seen and n == 0):
                yield (n, f"drift {n}")

    rdd = spark.sparkContext.parallelize(range(count), 2).mapPartitionsWithIndex(rows)
    return spark.createDataFrame(rdd, "id long, body string")


def test_a_source_that_changes_when_recomputed_fails_the_job_instead_of_dropping_a_row(
    spark, store: Store, tmp_path
):
    queue = create_queue(store.service, "drifting", partitions=1)
    frame = drifting_source(spark, str(tmp_path / "read-once"), 300)
    # WHEN the source gives 300 rows to the upfront count and 299 to the plan
    with pytest.raises(ProduceFailedError, match="299 rows to the plan but 300 were counted"):
        produce_dataframe(
            frame,
            queue=queue,
            columns=ColumnMap(payload=("body",)),
            target=store.target,
            staging_dir=store.staging,
            job_id="drift",
        )
    # THEN the job failed before writing anything (never exit 0 with fewer rows)
    assert count_items(store, queue) == 0


def test_a_nondeterministic_source_and_a_task_lost_mid_write_store_every_row_once(spark, store: Store):
    queue = create_queue(store.service, "shuffled", partitions=2)
    # A source whose order (and split) is random on every evaluation, without a key column.
    frame = rows_frame(spark, 1200).repartition(3).orderBy(F.rand())
    # GIVEN Spark partition 0 dies after storing 3 chunks, and its retry recomputes its input
    counts = produce_dataframe(
        frame,
        queue=queue,
        columns=ColumnMap(payload=("body",), reference="ref"),
        target=DyingTarget(store.target, before_failure=3),
        staging_dir=store.staging,
        job_id="shuffled",
        partitions=2,
        chunk_items=100,
    )
    # THEN the retry read the staged plan: the same chunks, each row stored once
    assert (counts.rows, counts.failed) == (1200, 0)
    assert counts.written + counts.skipped_duplicates == 1200
    items = stored(store.service, queue)
    assert sorted(item.reference for item in items) == sorted(f"ref-{i}" for i in range(1200))


# -- a task that dies after writing part of its partition ------------------------------------------


class DiesOnFirstAttempt:
    """Stores ``before_failure`` chunks, then kills the task, on the first attempt of partition 0 only."""

    def __init__(self, inner: Producer, before_failure: int) -> None:
        self._inner = inner
        self._left = before_failure

    def produce(
        self, queue: str, items: Sequence[NewItem], *, idempotency_key: str, route: int = 0
    ) -> ChunkReceipt:
        context = TaskContext.get()
        if context is not None and context.partitionId() == 0 and context.attemptNumber() == 0:
            if self._left == 0:
                raise RuntimeError("injected: the executor died mid-partition")
            self._left -= 1
        return self._inner.produce(queue, items, idempotency_key=idempotency_key, route=route)

    def check_queue(self, queue: str) -> int:
        return self._inner.check_queue(queue)


@dataclass(frozen=True)
class DyingTarget:
    inner: DirectTarget
    before_failure: int

    def connect(self) -> DiesOnFirstAttempt:
        return DiesOnFirstAttempt(self.inner.connect(), self.before_failure)


def test_a_task_retried_after_writing_part_of_its_partition_leaves_no_duplicates(spark, store: Store):
    queue = create_queue(store.service, "retried", partitions=2)
    frame = rows_frame(spark, 1200)
    # GIVEN partition 0 of 2 (about 600 rows, chunks of 100) dies after storing 3 chunks
    counts = produce_dataframe(
        frame,
        queue=queue,
        columns=COLUMNS,
        target=DyingTarget(store.target, before_failure=3),
        staging_dir=store.staging,
        job_id="retry-job",
        partitions=2,
        chunk_items=100,
    )
    # THEN Spark's second attempt replays those 3 chunks (stored nothing) and writes the rest
    assert counts.skipped_duplicates == 300
    assert counts.written == 900
    assert counts.failed == 0
    items = stored(store.service, queue)
    assert len(items) == 1200
    assert len({item.reference for item in items}) == 1200


# -- invalid rows ----------------------------------------------------------------------------------


def test_invalid_rows_are_reported_with_their_reason_and_the_rest_is_stored(spark, store: Store):
    queue = create_queue(store.service, "mixed", partitions=1)
    schema = T.StructType(
        [
            T.StructField("id", T.StringType()),
            T.StructField("body", T.StringType()),
            T.StructField("at", T.StringType()),
        ]
    )
    frame = spark.createDataFrame(
        [
            ("ok-1", "fine", None),
            ("too-big", "x" * (MAX_PAYLOAD_BYTES + 1), None),
            ("bad-time", "fine", "next tuesday"),
            ("ok-2", "later", "2099-01-01T00:00:00Z"),
        ],
        schema,
    )
    columns = ColumnMap(payload=("body",), key="id", enqueue_at="at")
    counts = produce_dataframe(
        frame, queue=queue, columns=columns, target=store.target, staging_dir=store.staging, job_id="mixed"
    )
    assert (counts.rows, counts.written, counts.invalid, counts.failed) == (4, 2, 2, 0)
    reported = {error.row: error for error in counts.invalid_rows}
    assert set(reported) == {"id='too-big'", "id='bad-time'"}
    assert reported["id='too-big'"].column == "body"
    assert "bytes" in reported["id='too-big'"].reason
    assert reported["id='bad-time'"].column == "at"
    assert "timestamp" in reported["id='bad-time'"].reason
    items = stored(store.service, queue)
    assert sorted(item.payload for item in items) == [b"fine", b"later"]
    scheduled = [item for item in items if item.payload == b"later"]
    assert scheduled[0].enqueue_at == datetime(2099, 1, 1, tzinfo=UTC)


def test_a_spark_timestamp_column_keeps_its_instant_whatever_the_session_time_zone(spark, store: Store):
    queue = create_queue(store.service, "scheduled", partitions=1)
    at = datetime(2099, 6, 1, 12, 30, 15, 123456, tzinfo=UTC)
    schema = T.StructType([T.StructField("body", T.StringType()), T.StructField("at", T.TimestampType())])
    frame = spark.createDataFrame([("later", at)], schema)
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        counts = produce_dataframe(
            frame,
            queue=queue,
            columns=ColumnMap(payload=("body",), enqueue_at="at"),
            target=store.target,
            staging_dir=store.staging,
            job_id="tz",
        )
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    assert counts.written == 1
    (item,) = stored(store.service, queue)
    assert item.enqueue_at == at


# -- throttling ------------------------------------------------------------------------------------


class ThrottledAfter:
    """Passes ``allowed`` chunks through, then the store throttles every call."""

    def __init__(self, inner: Producer, allowed: int) -> None:
        self._inner = inner
        self._allowed = allowed
        self.calls = 0

    def produce(
        self, queue: str, items: Sequence[NewItem], *, idempotency_key: str, route: int = 0
    ) -> ChunkReceipt:
        if self._allowed == 0:
            self.calls += 1
            raise StoreThrottledError("injected: throttled")
        self._allowed -= 1
        return self._inner.produce(queue, items, idempotency_key=idempotency_key, route=route)

    def check_queue(self, queue: str) -> int:
        return self._inner.check_queue(queue)


@dataclass(frozen=True)
class ThrottledTarget:
    inner: DirectTarget
    allowed: int

    def connect(self) -> ThrottledAfter:
        return ThrottledAfter(self.inner.connect(), self.allowed)


def test_throttling_past_the_retry_budget_fails_with_counts_and_claims_nothing_unwritten(spark, store: Store):
    queue = create_queue(store.service, "throttled", partitions=1)
    frame = rows_frame(spark, 500)
    with pytest.raises(ProduceFailedError) as caught:
        produce_dataframe(
            frame,
            queue=queue,
            columns=COLUMNS,
            target=ThrottledTarget(store.target, allowed=1),
            staging_dir=store.staging,
            job_id="throttled",
            partitions=1,
            chunk_items=100,
            retry=RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=0.001),
        )
    counts = caught.value.counts
    assert (counts.rows, counts.written, counts.failed) == (500, 100, 400)
    assert counts.retries == 0  # the one failed chunk's attempts are in the failure, not retries
    assert "3 attempts" in counts.failures[0]
    assert "400" in str(caught.value)
    assert len(stored(store.service, queue)) == counts.written


def test_the_same_job_finishes_the_load_when_the_store_recovers(spark, store: Store):
    queue = create_queue(store.service, "recovers", partitions=1)
    frame = rows_frame(spark, 500)
    arguments = {"queue": queue, "columns": COLUMNS, "job_id": "recover", "partitions": 1, "chunk_items": 100}
    with pytest.raises(ProduceFailedError):
        produce_dataframe(
            frame,
            target=ThrottledTarget(store.target, allowed=2),
            staging_dir=store.staging,
            retry=RetryPolicy(max_attempts=1),
            **arguments,
        )
    counts = produce_dataframe(frame, target=store.target, staging_dir=store.staging, **arguments)
    assert (counts.written, counts.skipped_duplicates) == (300, 200)
    assert len(stored(store.service, queue)) == 500


def test_an_unknown_queue_fails_before_any_work(spark, store: Store):
    with pytest.raises(QueueNotFoundError):
        produce_dataframe(
            rows_frame(spark, 3),
            queue="nope",
            columns=COLUMNS,
            target=store.target,
            staging_dir=store.staging,
            job_id="j",
        )


def test_a_missing_column_is_named(spark, store: Store):
    queue = create_queue(store.service, "cols", partitions=1)
    with pytest.raises(ValueError, match="nothere"):
        produce_dataframe(
            rows_frame(spark, 3),
            queue=queue,
            columns=ColumnMap(payload=("nothere",)),
            target=store.target,
            staging_dir=store.staging,
            job_id="j",
        )


# -- priorities ------------------------------------------------------------------------------------

PRIORITY_COLUMNS = ColumnMap(payload=("body",), key="id", reference="ref", priority="prio")


def priority_of_row(i: int) -> int | None:
    """Row ``i``'s priority column: 0-9, then null (every 11th row)."""
    return None if i % 11 == 10 else i % 11


def item_priority(i: int) -> int:
    """The priority row ``i``'s item gets: a null priority is 5."""
    priority = priority_of_row(i)
    return 5 if priority is None else priority


def priority_frame(spark, count: int):
    """Rows whose priority cycles through 0-9 and null (``priority_of_row``)."""
    schema = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("body", T.StringType()),
            T.StructField("ref", T.StringType()),
            T.StructField("prio", T.IntegerType()),
        ]
    )
    data = [(i, f"payload {i}", f"ref-{i}", priority_of_row(i)) for i in range(count)]
    return spark.createDataFrame(data, schema)


def lease_all(service, queue: str) -> list[Item]:
    leased: list[Item] = []
    while True:
        try:
            leased += service.lease(queue, batch_size=50, client_id="c").items
        except NothingToLeaseError:
            return leased


def test_a_priority_column_orders_leases_by_priority_then_by_the_plans_order(spark, store: Store):
    queue = create_queue(store.service, "prioritized", partitions=1)
    frame = priority_frame(spark, 110)
    # Two chunks of one bucket, into the queue's one partition
    counts = produce_dataframe(
        frame,
        queue=queue,
        columns=PRIORITY_COLUMNS,
        target=store.target,
        staging_dir=store.staging,
        job_id="prio",
        chunk_items=60,
    )
    assert (counts.rows, counts.written, counts.invalid, counts.chunks) == (110, 110, 0, 2)

    leased = lease_all(store.service, queue)

    # The plan's order is the row keys' (one bucket); a null priority is 5
    def plan_order(i: int) -> str:
        row = {"id": i, "body": f"payload {i}", "ref": f"ref-{i}", "prio": None}
        return row_key(row, PRIORITY_COLUMNS, row_to_item(row, PRIORITY_COLUMNS), job_id="prio")

    priority = {f"ref-{i}": item_priority(i) for i in range(110)}
    expected = sorted(range(110), key=lambda i: (priority[f"ref-{i}"], plan_order(i)))
    assert [item.reference for item in leased] == [f"ref-{i}" for i in expected]
    assert all(item.priority == priority[item.reference] for item in leased)
    # Priority 5 ids carry no band in front (``querator.domain.priority``): what v2 and v3 ids share
    assert {band_of(item.id) for item in leased if item.priority == 5} == {""}


def test_a_task_retried_with_priorities_and_a_rerun_store_every_row_once(spark, store: Store):
    queue = create_queue(store.service, "prio-retried", partitions=2)
    frame = priority_frame(spark, 440)
    options = {"queue": queue, "columns": PRIORITY_COLUMNS, "staging_dir": store.staging}
    options |= {"job_id": "prio-retry", "partitions": 2, "buckets": 3, "chunk_items": 50}
    # GIVEN Spark partition 0 dies after storing 2 chunks, and Spark retries it
    first = produce_dataframe(frame, target=DyingTarget(store.target, before_failure=2), **options)
    # WHEN the job is run again with the same job id
    again = produce_dataframe(frame, target=store.target, **options)
    # THEN every row is stored once, with its priority
    assert (first.failed, first.skipped_duplicates, first.written) == (0, 100, 340)
    assert (again.written, again.skipped_duplicates) == (0, 440)
    items = stored(store.service, queue)
    assert sorted(item.reference for item in items) == sorted(f"ref-{i}" for i in range(440))
    priority = {f"ref-{i}": item_priority(i) for i in range(440)}
    assert all(item.priority == priority[item.reference] for item in items)


def test_a_priority_column_of_a_type_without_integers_is_refused_before_any_work(spark, store: Store):
    queue = create_queue(store.service, "prio-double", partitions=1)
    frame = spark.createDataFrame([("x", 1.0)], "body string, prio double")
    with pytest.raises(ValueError, match=r"priority column prio has type double.*cast it to int"):
        produce_dataframe(
            frame,
            queue=queue,
            columns=ColumnMap(payload=("body",), priority="prio"),
            target=store.target,
            staging_dir=store.staging,
            job_id="double",
        )
    assert count_items(store, queue) == 0


# -- groups ------------------------------------------------------------------------------------------

GROUP_COLUMNS = ColumnMap(payload=("body",), key="id", reference="ref", group="grp")
#: Rows whose group is not a group: 129 bytes of UTF-8 (65 characters), a line break.
BAD_GROUPS = {7: "é" * 64 + "x", 19: "two\nlines"}


def group_of_row(i: int) -> str | None:
    """Row ``i``'s group column: three tenants, then null (every 4th row), and the bad ones."""
    if i in BAD_GROUPS:
        return BAD_GROUPS[i]
    return None if i % 4 == 3 else f"tenant-{i % 4}"


def group_frame(spark, count: int):
    schema = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("body", T.StringType()),
            T.StructField("ref", T.StringType()),
            T.StructField("grp", T.StringType()),
        ]
    )
    data = [(i, f"payload {i}", f"ref-{i}", group_of_row(i)) for i in range(count)]
    return spark.createDataFrame(data, schema)


def test_a_group_column_reaches_the_stored_items_through_a_retried_task_and_a_rerun(spark, store: Store):
    queue = create_queue(store.service, "grouped", partitions=2)
    frame = group_frame(spark, 442)
    options = {"queue": queue, "columns": GROUP_COLUMNS, "staging_dir": store.staging}
    options |= {"job_id": "grouped", "partitions": 2, "buckets": 3, "chunk_items": 50}
    # GIVEN Spark partition 0 dies after storing 2 chunks, and Spark retries it
    first = produce_dataframe(frame, target=DyingTarget(store.target, before_failure=2), **options)
    # WHEN the job is run again with the same job id
    again = produce_dataframe(frame, target=store.target, **options)

    # THEN the rows with a bad group are reported, not produced
    assert (first.rows, first.invalid, first.failed) == (442, 2, 0)
    assert (first.skipped_duplicates, first.written) == (100, 340)
    assert (again.written, again.skipped_duplicates, again.invalid) == (0, 440, 2)
    reported = {error.row: error for error in first.invalid_rows}
    assert set(reported) == {"id=7", "id=19"}
    assert {error.column for error in reported.values()} == {"grp"}
    assert "longer than 128 bytes" in reported["id=7"].reason
    assert "control characters" in reported["id=19"].reason
    # AND every other row is stored once, with its group (a null group: none)
    items = stored(store.service, queue)
    valid = [i for i in range(442) if i not in BAD_GROUPS]
    assert sorted(item.reference for item in items) == sorted(f"ref-{i}" for i in valid)
    group = {f"ref-{i}": group_of_row(i) or "" for i in valid}
    assert {item.reference: item.group for item in items} == group
    assert {item.group for item in items} == {"tenant-0", "tenant-1", "tenant-2", ""}


def test_a_group_column_that_is_not_text_is_refused_before_any_work(spark, store: Store):
    queue = create_queue(store.service, "group-long", partitions=1)
    frame = spark.createDataFrame([("x", 42)], "body string, grp long")
    with pytest.raises(ValueError, match=r"group column grp has type bigint.*cast it to string"):
        produce_dataframe(
            frame,
            queue=queue,
            columns=ColumnMap(payload=("body",), group="grp"),
            target=store.target,
            staging_dir=store.staging,
            job_id="group-long",
        )
    assert count_items(store, queue) == 0


class RefusesEverything:
    """A producer whose every call is refused (not worth retrying): the job stages its plan, then fails."""

    def produce(
        self, queue: str, items: Sequence[NewItem], *, idempotency_key: str, route: int = 0
    ) -> ChunkReceipt:
        raise QueratorError("injected: refused")

    def check_queue(self, queue: str) -> int:
        return 1


@dataclass(frozen=True)
class RefusingTarget:
    def connect(self) -> RefusesEverything:
        return RefusesEverything()


def test_a_plan_staged_before_groups_existed_is_read_and_produced_without_groups(spark, store: Store):
    queue = create_queue(store.service, "old-plan", partitions=1)
    frame = priority_frame(spark, 30)
    options = {"queue": queue, "columns": PRIORITY_COLUMNS, "staging_dir": store.staging, "job_id": "old"}
    # GIVEN a first run that staged its plan and stored nothing
    with pytest.raises(ProduceFailedError):
        produce_dataframe(frame, target=RefusingTarget(), check_queue=False, **options)
    # AND its plan rewritten as one staged before items had groups: no group column at all
    plan = f"{job_dir(store.staging, 'old')}/{PLAN_NAME}"
    staged = spark.read.parquet(plan)
    assert "group" in staged.columns
    staged.drop("group").write.parquet(f"{plan}-old")
    shutil.rmtree(plan)
    Path(f"{plan}-old").rename(plan)
    assert "group" not in spark.read.parquet(plan).columns

    # WHEN the job is run again
    counts = produce_dataframe(frame, target=store.target, **options)

    # THEN the old plan is read: every row stored, without a group, with its priority
    assert (counts.rows, counts.written, counts.invalid, counts.failed) == (30, 30, 0, 0)
    items = stored(store.service, queue)
    assert sorted(item.reference for item in items) == sorted(f"ref-{i}" for i in range(30))
    assert {item.group for item in items} == {""}
    assert all(item.priority == item_priority(int(item.reference[4:])) for item in items)


# -- large payloads --------------------------------------------------------------------------------


def test_rows_of_1_mib_are_stored_through_the_payload_bucket_and_exported_whole(spark, store: Store):
    queue = create_queue(store.service, "big", partitions=1)
    schema = T.StructType([T.StructField("id", T.StringType()), T.StructField("body", T.BinaryType())])
    bodies = {f"b{n}": bytes([65 + n]) * MAX_PAYLOAD_BYTES for n in range(3)}
    frame = spark.createDataFrame([(key, bytearray(body)) for key, body in bodies.items()], schema)

    counts = produce_dataframe(
        frame,
        queue=queue,
        columns=ColumnMap(payload=("body",), key="id"),
        target=store.target,
        staging_dir=store.staging,
        job_id="big",
    )

    assert (counts.written, counts.invalid, counts.failed) == (3, 0, 0)
    assert sorted(item.payload for item in stored(store.service, queue)) == sorted(bodies.values())
    objects = store.service.log.payloads  # type: ignore[union-attr]
    assert len(bucket_keys(objects)) == 3
    leased = store.service.lease(queue, batch_size=3, client_id="c")
    assert store.service.complete(queue, leased.partition, [item.id for item in leased.items]).applied
    assert stored(store.service, queue) == [] and bucket_keys(objects) == []


def test_without_a_payload_bucket_a_row_over_a_rows_limit_is_an_invalid_row(spark, store: Store):
    queue = create_queue(store.service, "no-bucket", partitions=1)
    target = replace(store.target, settings=replace(store.target.settings, payload_bucket=""))
    assert target.payload_limit == ROW_PAYLOAD_BYTES
    schema = T.StructType([T.StructField("id", T.StringType()), T.StructField("body", T.StringType())])
    frame = spark.createDataFrame(
        [("fits", "x" * ROW_PAYLOAD_BYTES), ("over", "x" * (ROW_PAYLOAD_BYTES + 1))], schema
    )

    counts = produce_dataframe(
        frame,
        queue=queue,
        columns=ColumnMap(payload=("body",), key="id"),
        target=target,
        staging_dir=store.staging,
        job_id="no-bucket",
    )

    assert (counts.written, counts.invalid) == (1, 1)
    assert counts.invalid_rows[0].row == "id='over'"
    assert f"more than {ROW_PAYLOAD_BYTES}" in counts.invalid_rows[0].reason
