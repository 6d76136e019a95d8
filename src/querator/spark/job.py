"""Spark producer, driver side: produce a DataFrame into a queue, exactly once per row or a failed job.

The plan (docs/adr/0020-spark-bulk-producer.md, amended by docs/adr/0022-spark-exactly-once.md):

1. Each row is mapped to a ``NewItem`` (``mapping.row_to_item``) and keyed by its logical bucket,
   its row key and the item's digest; a row that cannot be mapped is carried along as a ``RowError``
   and reported. The bucket count is fixed by the job record, not by Spark.
2. The keyed rows are staged as Parquet under ``<staging dir>/<job id>/plan`` and the job record is
   written (``querator.spark.plan``) before any item is; every later stage and every re-run reads
   the staged plan, so recomputation cannot move a row between chunks.
3. The staged rows are spread over Spark partitions by bucket (any count: a partition holds whole
   buckets) and sorted; each bucket is cut into chunks (``chunk_items`` items, at most the
   contract's body size) and each chunk is one idempotent produce call whose key names the job, the
   queue and the chunk's rows. A retried or speculative task, or a re-run with any partition count,
   sends the same chunks with the same keys, and the service stores each chunk once.
4. Every partition returns its counts; the driver adds them up, logs a summary, and raises
   ``ProduceFailedError`` (with the counts) when any row could not be confirmed stored, or when the
   rows accounted for differ from the rows planned (or ``expect_rows``).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from querator.api.durations import format_timestamp, parse_timestamp
from querator.domain.errors import QueratorError
from querator.domain.model import MAX_PAYLOAD_BYTES, NewItem
from querator.domain.priority import DEFAULT_PRIORITY
from querator.spark.mapping import (
    MAX_CHUNK_ITEMS,
    MAX_CHUNK_WIRE_BYTES,
    InvalidRowError,
    RowError,
    bucket_of,
    chunk_key,
    chunks_of,
    describe_row,
    item_digest,
    row_key,
    row_to_item,
    wire_size,
)
from querator.spark.plan import PLAN_NAME, JobRecord, job_dir, read_record, write_record
from querator.spark.producer import RUN_PROPERTY, payload_limit_of
from querator.spark.retry import RateLimiter, RetriesExhaustedError, RetryPolicy, call_with_retries

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from querator.spark.mapping import ColumnMap
    from querator.spark.producer import Producer, Target

log = logging.getLogger(__name__)

#: Logical buckets a job's rows are spread over at most, fixed in its job record on the first run.
#: Chunks are cut within a bucket, so a re-run with any Spark partition count finds the same chunks;
#: a Spark partition holds whole buckets, so no more than this many tasks write at once.
MAX_BUCKETS = 256
#: Full chunks per bucket the first run aims at: a bucket's last chunk is partly filled, so fewer
#: buckets mean fuller requests; more mean more writers (``plan_buckets``).
CHUNKS_PER_BUCKET = 4
#: Concurrent writers per queue partition when the caller does not say: a DynamoDB partition takes
#: 1,000 write units a second, about what one writer sends (docs/adr/0022), and a second one covers
#: a writer's round trips.
WRITERS_PER_QUEUE_PARTITION = 2
#: Share of a queue partition's 1,000 write units a second the job paces itself to by default,
#: leaving room for the queue's consumers and other producers.
PARTITION_WRITE_UNITS = 1000
PACING_SHARE = 0.8
#: Invalid rows and failures listed in the counts (all of them are counted).
MAX_REPORTED = 100
#: Spark's sort key of a row: its logical bucket, its row key, then the item's digest (which orders
#: rows sharing a key).
SortKey = tuple[int, str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceCounts:
    """What a produce run did; ``rows == written + skipped_duplicates + confirmed + invalid + failed``."""

    #: Rows read from the source.
    rows: int = 0
    #: Items this run stored.
    written: int = 0
    #: Items an earlier attempt or run had stored already (idempotent replays), stored nothing now.
    skipped_duplicates: int = 0
    #: Items confirmed stored by a write path that cannot tell whether this run or an earlier one
    #: stored them (HTTP: the produce reply is the same for a replay).
    confirmed: int = 0
    #: Rows that could not become items; the first ``MAX_REPORTED`` are in ``invalid_rows``.
    invalid: int = 0
    #: Valid rows not confirmed stored because retries ran out or the queue refused them.
    failed: int = 0
    #: Produce calls made (replays included).
    chunks: int = 0
    #: Extra attempts spent on throttling and in-progress replies.
    retries: int = 0
    invalid_rows: tuple[RowError, ...] = ()
    #: Why partitions stopped early, one line each.
    failures: tuple[str, ...] = ()

    def __add__(self, other: ProduceCounts) -> ProduceCounts:
        return ProduceCounts(
            rows=self.rows + other.rows,
            written=self.written + other.written,
            skipped_duplicates=self.skipped_duplicates + other.skipped_duplicates,
            confirmed=self.confirmed + other.confirmed,
            invalid=self.invalid + other.invalid,
            failed=self.failed + other.failed,
            chunks=self.chunks + other.chunks,
            retries=self.retries + other.retries,
            invalid_rows=(self.invalid_rows + other.invalid_rows)[:MAX_REPORTED],
            failures=(self.failures + other.failures)[:MAX_REPORTED],
        )

    def summary(self) -> str:
        confirmed = f"{self.confirmed} confirmed stored (new or replayed), " if self.confirmed else ""
        return (
            f"{self.rows} rows: {self.written} written, {self.skipped_duplicates} skipped as duplicates, "
            f"{confirmed}{self.invalid} invalid, {self.failed} failed ({self.chunks} produce calls, "
            f"{self.retries} retries)"
        )


class ProduceFailedError(Exception):
    """Some rows were not confirmed stored, or the rows accounted for are not the rows planned;
    ``counts`` says how many of each. Re-run with the same job id to finish without duplicates."""

    def __init__(self, counts: ProduceCounts, *, reason: str | None = None) -> None:
        first = counts.failures[0] if counts.failures else "unknown cause"
        what = reason or f"produce failed for {counts.failed} rows"
        super().__init__(f"{what}: {counts.summary()}; first failure: {first}")
        self.counts = counts


def produce_dataframe(
    df: DataFrame,
    *,
    queue: str,
    columns: ColumnMap,
    target: Target,
    job_id: str,
    staging_dir: str,
    partitions: int | None = None,
    buckets: int | None = None,
    chunk_items: int = MAX_CHUNK_ITEMS,
    retry: RetryPolicy | None = None,
    max_items_per_second: float | None = None,
    max_write_units_per_second: float | None = None,
    expect_rows: int | None = None,
    check_queue: bool = True,
) -> ProduceCounts:
    """Produce every row of ``df`` into ``queue`` exactly once, or raise.

    Parameters
    ----------
    columns
        Which columns make an item (``querator.spark.mapping.ColumnMap``).
    target
        The write path (``DirectTarget`` or ``HttpTarget``); connected inside each executor.
    job_id
        Names this load. Running the job again with the same job id stores nothing twice (within
        the service's 24 h idempotency window).
    staging_dir
        Durable storage the cluster can read and write (``s3://bucket/prefix``, HDFS, a local path
        in local mode): the staged plan and the job record go under ``<staging_dir>/<job_id>/``.
    partitions
        Spark partitions, i.e. concurrent writers at most; any count on any run. ``None``: derived
        from the cluster and the queue (``plan_partitions``).
    buckets, chunk_items
        Logical buckets and items per produce call; fixed on the first run (the job record).
        ``buckets=None``: derived from the row count on the first run (``plan_buckets``), the
        record's on a re-run.
    max_items_per_second
        Optional average rate limit per Spark partition.
    max_write_units_per_second
        Pacing per Spark partition in estimated write units; ``None``: 80 % of the queue's
        partitions' 1,000 write units a second, shared by the writers.
    expect_rows
        Rows the source holds; the job fails when the plan has another count. ``None``: the
        source is counted once, before it is staged.
    check_queue
        Look the queue up from the driver first, so a wrong name fails before any work.

    Raises
    ------
    ProduceFailedError
        Retries ran out, the queue refused a chunk, or the rows accounted for are not the rows
        planned; the error carries the counts.
    PlanMismatchError
        The job's first run fixed another queue, mapping, bucket count or chunk size, or
        (``RerunTooLateError``) it was more than 23 hours ago.
    ValueError
        A mapped column is missing or has a type that cannot be mapped, or an argument is invalid.
    """
    if not job_id or "/" in job_id:
        raise ValueError("job_id is required (without '/'): it is what makes a re-run store nothing twice")
    if not staging_dir:
        raise ValueError("staging_dir is required: the plan is staged there before anything is written")
    if partitions is not None and partitions < 1:
        raise ValueError("partitions must be at least 1")
    if buckets is not None and not 1 <= buckets <= MAX_BUCKETS:
        raise ValueError(f"buckets must be between 1 and {MAX_BUCKETS}")
    if not 1 <= chunk_items <= MAX_CHUNK_ITEMS:
        raise ValueError(f"chunk_items must be between 1 and {MAX_CHUNK_ITEMS}")
    if expect_rows is not None and expect_rows < 0:
        raise ValueError("expect_rows may not be negative")
    queue_partitions = target.connect().check_queue(queue) if check_queue else 1
    if columns.key is None:
        log.warning(
            "job %s has no key column: a row is identified by its content, so two equal rows are one "
            "row, and a re-run of this job id over a changed source is refused only if its plan "
            "differs; give --key for a stable identity",
            job_id,
        )
    spark = df.sparkSession
    wanted = JobRecord(
        job_id=job_id,
        queue=queue,
        # 0: not asked for; the first run derives it, a re-run takes the record's.
        buckets=buckets or 0,
        chunk_items=chunk_items,
        columns=_columns_record(columns),
        rows=-1,
    )
    record = read_record(spark, staging_dir, job_id)
    if record is None:
        record = _stage_plan(df, columns, wanted, staging_dir, expect_rows, payload_limit_of(target))
    else:
        record.check(wanted)
        record.check_window(time.time())
        if expect_rows is not None and expect_rows != record.rows:
            raise ProduceFailedError(
                ProduceCounts(rows=record.rows),
                reason=f"the plan staged by job {job_id}'s first run has {record.rows} rows, "
                f"not the {expect_rows} expected",
            )
        log.info("job %s: re-run over the plan its first run staged (%d rows)", job_id, record.rows)
    writers = partitions or plan_partitions(
        spark.sparkContext.defaultParallelism, queue_partitions=queue_partitions, buckets=record.buckets
    )
    pacing = max_write_units_per_second or (
        PACING_SHARE * PARTITION_WRITE_UNITS * queue_partitions / min(writers, record.buckets)
    )
    staged = spark.read.schema(plan_schema()).parquet(f"{job_dir(staging_dir, job_id)}/{PLAN_NAME}")
    # Spread by bucket (a Spark partition holds whole buckets) and sorted in the JVM: the rows cross
    # into Python once, in the writers. The staged files make both the same on every recomputation.
    ordered = spread_buckets(staged, writers).sortWithinPartitions("bucket", "row_key", "digest")
    writer = PartitionWriter(
        target=target,
        queue=queue,
        job_id=job_id,
        chunk_items=chunk_items,
        retry=retry or RetryPolicy(),
        max_items_per_second=max_items_per_second,
        max_write_units_per_second=pacing,
    )
    # Names this run for the chunk records' owners: a retried task takes its own chunks over at once.
    spark.sparkContext.setLocalProperty(
        RUN_PROPERTY, f"{spark.sparkContext.applicationId}/{uuid.uuid4().hex[:12]}"
    )
    try:
        reports = ordered.rdd.mapPartitionsWithIndex(_PlanWriter(writer)).collect()
    finally:
        spark.sparkContext.setLocalProperty(RUN_PROPERTY, None)  # type: ignore[arg-type]
    counts = sum(reports, ProduceCounts())
    log.info("produce job %s into %s: %s", job_id, queue, counts.summary())
    for error in counts.invalid_rows:
        log.warning("invalid row %s: %s", error.row, error.reason)
    if counts.failed:
        raise ProduceFailedError(counts)
    accounted = counts.written + counts.skipped_duplicates + counts.confirmed + counts.invalid
    if counts.rows != record.rows or accounted != record.rows:
        raise ProduceFailedError(
            counts,
            reason=f"job {job_id} planned {record.rows} rows but accounted for {accounted} of "
            f"{counts.rows} read back; re-run it with the same job id",
        )
    return counts


def plan_buckets(rows: int, chunk_items: int) -> int:
    """Logical buckets for a first run of ``rows`` rows: ``CHUNKS_PER_BUCKET`` full chunks each, at
    least 1 and at most ``MAX_BUCKETS``."""
    return max(1, min(MAX_BUCKETS, rows // (chunk_items * CHUNKS_PER_BUCKET)))


def plan_partitions(cluster_cores: int, *, queue_partitions: int, buckets: int) -> int:
    """Concurrent writers: every core of the cluster, but no more than the queue's partitions take
    (``WRITERS_PER_QUEUE_PARTITION`` each) and no more than there are buckets."""
    return max(1, min(cluster_cores, queue_partitions * WRITERS_PER_QUEUE_PARTITION, buckets))


def spread_buckets(staged: DataFrame, writers: int) -> DataFrame:
    """``staged`` repartitioned into ``writers`` Spark partitions, each holding whole buckets, and
    bucket ``b`` in partition ``b mod writers``, so every writer gets its share of the buckets.

    Correctness needs only the first: the partitioning expression is a function of the bucket, so a
    bucket never spans two partitions whatever Spark does with it. The second is for speed: Spark
    places a row in ``pmod(hash(expression), n)`` (Murmur3 with seed 42, what ``functions.hash``
    computes), and hashing the bucket itself put 8 of 12 buckets in one of 2 partitions, and both of
    2 in one (one writer doing all the work while the other idles). So the expression is, for each
    bucket, a number Spark's hash sends to partition ``b mod writers``, found with the same hash
    computed here (``spark_int_hash``; a Spark query for it cost 0.3 s, 5 % of a 10,000-row job).
    Were Spark's partitioning hash ever to change, the buckets would still be whole, only spread
    less evenly.
    """
    from pyspark.sql import functions as F  # noqa: N812, PLC0415 - pyspark only where Spark runs

    if writers == 1:
        return staged.repartition(1)
    found: dict[int, int] = {}
    # The first number that lands in each partition: about writers * ln(writers) candidates suffice.
    for value in range(64 * writers):
        found.setdefault(spark_int_hash(value) % writers, value)
    if len(found) < writers:
        # Not expected (Murmur3 spreads small integers well); the buckets stay whole either way.
        return staged.repartition(writers, "bucket")
    # ``pmod`` as SQL: ``functions.pmod`` is Spark 3.4+.
    lookup = ", ".join(str(found[p]) for p in range(writers))
    return staged.repartition(writers, F.expr(f"element_at(array({lookup}), pmod(bucket, {writers}) + 1)"))


def spark_int_hash(value: int, seed: int = 42) -> int:
    """Spark's ``hash`` of an ``int`` column value: Murmur3 x86 32-bit of 4 bytes, as a signed int
    (``Murmur3_x86_32.hashInt``, which ``HashPartitioning`` uses with seed 42)."""
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    k1 = rotl((value & mask) * 0xCC9E2D51 & mask, 15) * 0x1B873593 & mask
    h1 = (rotl(seed ^ k1, 13) * 5 + 0xE6546B64) & mask
    h1 ^= 4  # the input's length in bytes
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & mask
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & mask
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def _columns_record(columns: ColumnMap) -> dict[str, Any]:
    record: dict[str, Any] = {
        "payload": list(columns.payload),
        "key": columns.key,
        "reference": columns.reference,
        "kind": columns.kind,
        "encoding": columns.encoding,
        "enqueue_at": columns.enqueue_at,
        "default_kind": columns.default_kind,
        "default_encoding": columns.default_encoding,
    }
    if columns.priority is not None:
        # Only when there is one: a job without it has the record a first run before priorities
        # existed wrote, so its re-run is not refused.
        record["priority"] = columns.priority
    if columns.group is not None:
        # The same for the group column: a job without one keeps the record it had before groups.
        record["group"] = columns.group
    return record


def plan_schema() -> StructType:
    """The staged plan's columns: the sort key, then the item, or why the row is invalid.

    ``priority`` is null for priority 5, and in plans staged before items had priorities.
    ``group`` is null for an item without a group, and in plans staged before items had groups
    (Spark reads a column the files lack as null).
    """
    from pyspark.sql import types as T  # noqa: N812, PLC0415 - pyspark only where Spark runs

    return T.StructType(
        [
            T.StructField("bucket", T.IntegerType(), nullable=False),
            T.StructField("row_key", T.StringType(), nullable=False),
            T.StructField("digest", T.StringType(), nullable=False),
            T.StructField("payload", T.BinaryType()),
            T.StructField("reference", T.StringType()),
            T.StructField("encoding", T.StringType()),
            T.StructField("kind", T.StringType()),
            T.StructField("enqueue_at", T.StringType()),
            T.StructField("priority", T.IntegerType()),
            T.StructField("group", T.StringType()),
            T.StructField("error_row", T.StringType()),
            T.StructField("error_column", T.StringType()),
            T.StructField("error_reason", T.StringType()),
        ]
    )


def _stage_plan(
    df: DataFrame,
    columns: ColumnMap,
    wanted: JobRecord,
    staging_dir: str,
    expect_rows: int | None,
    payload_limit: int = MAX_PAYLOAD_BYTES,
) -> JobRecord:
    """First run: map and key every row, write them under the job id, then commit the job record."""
    spark: SparkSession = df.sparkSession
    source = df.select(*source_columns(df, columns))
    # Counted before staging: a source whose recomputation loses or repeats rows shows up as a
    # plan with another count, and the job stops before writing anything.
    expected = source.count() if expect_rows is None else expect_rows
    buckets = wanted.buckets or plan_buckets(expected, wanted.chunk_items)
    path = f"{job_dir(staging_dir, wanted.job_id)}/{PLAN_NAME}"
    prepared = source.rdd.map(
        _RowPreparer(columns=columns, job_id=wanted.job_id, buckets=buckets, payload_limit=payload_limit)
    )
    # overwrite: a plan without a job record is an earlier first run that died before committing it.
    # verifySchema off: the rows are ``_RowPreparer``'s tuples, typed by construction; checking
    # every field of every row against the schema in Python cost a third of the mapping.
    spark.createDataFrame(prepared, plan_schema(), verifySchema=False).write.mode("overwrite").parquet(path)
    rows = spark.read.parquet(path).count()
    if rows != expected:
        raise ProduceFailedError(
            ProduceCounts(rows=rows),
            reason=f"job {wanted.job_id}: the source gave {rows} rows to the plan but "
            f"{expected} were {'expected' if expect_rows is not None else 'counted'}; nothing was "
            "written (a source that changes while it is read, or non-deterministic recomputation)",
        )
    record = JobRecord(
        job_id=wanted.job_id,
        queue=wanted.queue,
        buckets=buckets,
        chunk_items=wanted.chunk_items,
        columns=wanted.columns,
        rows=rows,
        staged_at=time.time(),
    )
    write_record(spark, staging_dir, record)
    log.info("job %s: staged a plan of %d rows in %d buckets at %s", wanted.job_id, rows, buckets, path)
    return record


def source_columns(df: DataFrame, columns: ColumnMap) -> list[Column]:
    """The mapped columns of ``df``, with Spark timestamps turned into RFC 3339 text.

    A Spark ``TimestampType`` value reaches Python as a naive local datetime, which would lose its
    instant; formatting it in Spark with its offset keeps it.

    Raises
    ------
    ValueError
        A column is missing, ``enqueue_at`` is a timestamp without a time zone or a date,
        ``priority`` has a type that holds no integers (``_check_priority_type``), or ``group`` is
        not a string column (``_check_group_type``).
    """
    from pyspark.sql import functions as F  # noqa: N812, PLC0415 - pyspark only where Spark runs
    from pyspark.sql import types as spark_types  # noqa: PLC0415

    missing = [name for name in columns.source_columns if name not in df.columns]
    if missing:
        raise ValueError(f"column(s) {', '.join(missing)} not in the source; it has {', '.join(df.columns)}")
    types = {f.name: f.dataType for f in df.schema.fields}
    selected = []
    for name in columns.source_columns:
        column = F.col(f"`{name.replace('`', '``')}`")
        if name == columns.enqueue_at:
            kind = types[name]
            # TimestampNTZType is Spark 3.4+; Spark 3.3 (Glue 4.0) has only the zoned timestamp.
            zoneless = tuple(
                getattr(spark_types, n) for n in ("TimestampNTZType", "DateType") if hasattr(spark_types, n)
            )
            if isinstance(kind, zoneless):
                raise ValueError(
                    f"enqueue_at column {name} has type {kind.simpleString()}, which has no time zone; "
                    "cast it to timestamp or an RFC 3339 string"
                )
            if isinstance(kind, spark_types.TimestampType):
                column = F.date_format(column, "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX")
        if name == columns.priority:
            _check_priority_type(name, types[name])
        if name == columns.group:
            _check_group_type(name, types[name])
        selected.append(column.alias(name))
    return selected


def _check_priority_type(name: str, kind: Any) -> None:
    """Refuse, before any work, a priority column whose type holds no integers: a priority is an
    integer 0-9 (an integer type, a ``DECIMAL(p, 0)``, or text such as a CSV column's). Values out of
    range or text that is not an integer are invalid rows, as other bad values are."""
    from pyspark.sql import types as spark_types  # noqa: PLC0415 - pyspark only where Spark runs

    integral = isinstance(kind, spark_types.IntegralType) or (
        isinstance(kind, spark_types.DecimalType) and kind.scale == 0
    )
    if not (integral or isinstance(kind, spark_types.StringType | spark_types.NullType)):
        raise ValueError(
            f"priority column {name} has type {kind.simpleString()}; a priority is an integer 0-9: "
            "cast it to int"
        )


def _check_group_type(name: str, kind: Any) -> None:
    """Refuse, before any work, a group column that is not text: a group is a string (a number's
    text would depend on how it is formatted, so the caller casts it). Values too long or with
    control characters are invalid rows, as other bad values are."""
    from pyspark.sql import types as spark_types  # noqa: PLC0415 - pyspark only where Spark runs

    if not isinstance(kind, spark_types.StringType | spark_types.NullType):
        raise ValueError(
            f"group column {name} has type {kind.simpleString()}; a group is a string: cast it to string"
        )


@dataclass(frozen=True, slots=True)
class _PlanWriter:
    """Staged plan rows of one Spark partition → the partition writer (runs in the executors)."""

    writer: PartitionWriter

    def __call__(self, index: int, rows: Iterable[Any]) -> Iterator[ProduceCounts]:
        return self.writer(index, (_from_plan(row) for row in rows))


@dataclass(frozen=True, slots=True, kw_only=True)
class _RowPreparer:
    """Row → a row of the staged plan (``plan_schema``); runs in the executors."""

    columns: ColumnMap
    job_id: str
    buckets: int
    #: The target store's largest payload (``Target.payload_limit``): a larger one is an invalid row.
    payload_limit: int = MAX_PAYLOAD_BYTES

    def __call__(self, row: Any) -> tuple[Any, ...]:
        values: dict[str, Any] = row.asDict(recursive=True)
        try:
            item = row_to_item(values, self.columns, payload_limit=self.payload_limit)
            key = row_key(values, self.columns, item, job_id=self.job_id)
        except InvalidRowError as exc:
            described = describe_row(values, self.columns)
            # Invalid rows still need a stable place in the sort; they never reach a chunk.
            key = hashlib.sha256(repr(sorted(values.items())).encode()).hexdigest()
            column = str(exc.context.get("column", ""))
            bucket = bucket_of(key) % self.buckets
            return (bucket, key, "!", None, None, None, None, None, None, None, described, column, str(exc))
        enqueue_at = None if item.enqueue_at is None else format_timestamp(item.enqueue_at)
        return (
            bucket_of(key) % self.buckets,
            key,
            item_digest(item),
            bytearray(item.payload),
            item.reference,
            item.encoding,
            item.kind,
            enqueue_at,
            None if item.priority == DEFAULT_PRIORITY else item.priority,
            item.group or None,
            None,
            None,
            None,
        )


def _from_plan(row: Any) -> tuple[SortKey, NewItem | RowError]:
    """A staged plan row back into (sort key, item or error); runs in the executors.

    Unpacked by position (the columns of ``plan_schema``, in its order): a ``Row``'s attribute
    lookup searches its field names each time, eleven times a row.
    """
    (bucket, key_hex, digest, payload, reference, encoding, kind, enqueue_text, priority, group, *error) = row
    key: SortKey = (bucket, key_hex, digest)
    error_row, error_column, error_reason = error
    if error_reason is not None:
        return key, RowError(row=error_row or "", column=error_column or "", reason=error_reason)
    item = NewItem(
        payload=bytes(payload),
        reference=reference or "",
        encoding=encoding or "",
        kind=kind or "",
        enqueue_at=None if enqueue_text is None else parse_timestamp(enqueue_text),
        priority=DEFAULT_PRIORITY if priority is None else priority,
        group=group or "",
    )
    return key, item


def write_units(item: NewItem) -> int:
    """Estimated DynamoDB write units of storing the item (1 per started KB of item)."""
    return max(1, math.ceil(wire_size(item) / 1024))


@dataclass(slots=True)
class _Progress:
    """Counters of one partition while it is written."""

    rows: int = 0
    written: int = 0
    skipped_duplicates: int = 0
    confirmed: int = 0
    invalid: int = 0
    failed: int = 0
    chunks: int = 0
    retries: int = 0
    invalid_rows: list[RowError] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def counts(self) -> ProduceCounts:
        return ProduceCounts(
            rows=self.rows,
            written=self.written,
            skipped_duplicates=self.skipped_duplicates,
            confirmed=self.confirmed,
            invalid=self.invalid,
            failed=self.failed,
            chunks=self.chunks,
            retries=self.retries,
            invalid_rows=tuple(self.invalid_rows),
            failures=tuple(self.failures),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionWriter:
    """Produces one sorted Spark partition, chunk by chunk; yields the partition's counts.

    Runs in the executor: the producer is connected here, never pickled. Errors the retry policy
    gives up on stop the partition: its remaining rows count as failed, and nothing is counted as
    written unless the produce call returned.
    """

    target: Target
    queue: str
    job_id: str
    chunk_items: int = MAX_CHUNK_ITEMS
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_items_per_second: float | None = None
    #: Pacing in estimated write units (``write_units``); ``None``: not paced.
    max_write_units_per_second: float | None = None
    #: Injected for tests; the executors use the real ones.
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def __call__(
        self, index: int, records: Iterable[tuple[SortKey, NewItem | RowError]]
    ) -> Iterator[ProduceCounts]:
        progress = _Progress()
        items = self._valid_items(records, progress)
        limiter = RateLimiter(self.max_items_per_second, clock=self.clock, sleep=self.sleep)
        pacer = RateLimiter(self.max_write_units_per_second, clock=self.clock, sleep=self.sleep)
        producer: Producer | None = None
        stopped = False
        for route, chunk in self._chunks(items):
            if stopped:
                progress.failed += len(chunk)
                continue
            producer = producer or self.target.connect()
            limiter.acquire(len(chunk))
            # Waits out the share of the chunks written before; a replay wrote nothing and is free.
            pacer.acquire(0)
            written_before = progress.written
            if not self._produce(index, producer, chunk, progress, route):
                stopped = True
            elif progress.written > written_before:
                pacer.charge(sum(write_units(item) for _, item in chunk))
        counts = progress.counts()
        log.info("partition %d of job %s: %s", index, self.job_id, counts.summary())
        yield counts

    def _chunks(
        self, items: Iterable[tuple[SortKey, NewItem]]
    ) -> Iterator[tuple[int, list[tuple[SortKey, NewItem]]]]:
        """Chunks cut within each logical bucket, so they do not depend on which buckets share a
        Spark partition; each with its route (the bucket plus its place in the bucket: a plan's
        consecutive chunks go to consecutive queue partitions)."""
        for bucket, records in itertools.groupby(items, key=lambda record: record[0][0]):
            chunks = chunks_of(
                records,
                size_of=lambda r: wire_size(r[1]),
                max_items=self.chunk_items,
                max_bytes=MAX_CHUNK_WIRE_BYTES,
            )
            for ordinal, chunk in enumerate(chunks):
                yield bucket + ordinal, chunk

    def _produce(
        self,
        index: int,
        producer: Producer,
        chunk: list[tuple[SortKey, NewItem]],
        progress: _Progress,
        route: int = 0,
    ) -> bool:
        key = chunk_key(self.job_id, self.queue, (f"{rk}:{digest}" for (_, rk, digest), _ in chunk))
        items = [item for _, item in chunk]
        try:
            receipt, attempts = call_with_retries(
                lambda: producer.produce(self.queue, items, idempotency_key=key, route=route),
                policy=self.retry,
                sleep=self.sleep,
                clock=self.clock,
            )
        except (RetriesExhaustedError, QueratorError) as exc:
            progress.failed += len(chunk)
            progress.chunks += 1
            reason = f"partition {index}: a chunk of {len(chunk)} rows was not stored: {exc}"
            log.error("%s", reason)
            progress.failures.append(reason)
            return False
        progress.chunks += 1
        progress.retries += attempts - 1
        # Counted only now that the call returned: nothing is reported written that was not.
        if receipt.replayed is None:
            progress.confirmed += len(items)
        elif receipt.replayed:
            progress.skipped_duplicates += len(items)
        else:
            progress.written += len(items)
        return True

    @staticmethod
    def _valid_items(
        records: Iterable[tuple[SortKey, NewItem | RowError]], progress: _Progress
    ) -> Iterator[tuple[SortKey, NewItem]]:
        for key, value in records:
            progress.rows += 1
            if isinstance(value, RowError):
                progress.invalid += 1
                if len(progress.invalid_rows) < MAX_REPORTED:
                    progress.invalid_rows.append(value)
                continue
            yield key, value


__all__ = [
    "MAX_BUCKETS",
    "PartitionWriter",
    "ProduceCounts",
    "ProduceFailedError",
    "plan_buckets",
    "plan_partitions",
    "plan_schema",
    "produce_dataframe",
    "source_columns",
    "spark_int_hash",
    "spread_buckets",
    "write_units",
]
