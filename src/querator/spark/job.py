"""Spark producer, driver side: produce a DataFrame into a queue, exactly once per row.

The plan (docs/adr/0020-spark-bulk-producer.md):

1. Each row is mapped to a ``NewItem`` (``mapping.row_to_item``) and keyed by its row key and the
   item's digest; a row that cannot be mapped is carried along as a ``RowError`` and reported.
2. The keyed rows are hash-partitioned by row key into ``partitions`` Spark partitions and sorted
   within each, so every partition holds the same rows in the same order on every attempt.
3. Each partition is cut into chunks (``chunk_items`` items, at most the contract's body size) and
   each chunk is one idempotent produce call whose key names the job, the queue and the chunk's
   rows. A retried or speculative task, or a re-run of the job, sends the same chunks with the
   same keys, and the service stores each chunk once.
4. Every partition returns its counts; the driver adds them up, logs a summary, and raises
   ``ProduceFailedError`` (with the counts) when any row could not be confirmed stored.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from querator.domain.errors import QueratorError
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
from querator.spark.retry import RateLimiter, RetriesExhaustedError, RetryPolicy, call_with_retries

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from pyspark.sql import Column, DataFrame

    from querator.domain.model import NewItem
    from querator.spark.mapping import ColumnMap
    from querator.spark.producer import Producer, Target

log = logging.getLogger(__name__)

#: Spark partitions the rows are spread over when the caller does not say. It is part of the job's
#: identity: a re-run must use the same count to find its earlier chunks (docs/adr/0020), so it is a
#: constant rather than something derived from the cluster or the input's file splits.
DEFAULT_PARTITIONS = 8
#: Invalid rows and failures listed in the counts (all of them are counted).
MAX_REPORTED = 100
#: Spark's sort key of a row: its row key, then the item's digest (which orders rows sharing a key).
SortKey = tuple[str, str]


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
    """Some rows were not confirmed stored; ``counts`` says how many of each. Re-run with the same
    job id (and the same partitions and chunk size) to finish without duplicates."""

    def __init__(self, counts: ProduceCounts) -> None:
        first = counts.failures[0] if counts.failures else "unknown cause"
        super().__init__(
            f"produce failed for {counts.failed} rows: {counts.summary()}; first failure: {first}"
        )
        self.counts = counts


def produce_dataframe(
    df: DataFrame,
    *,
    queue: str,
    columns: ColumnMap,
    target: Target,
    job_id: str,
    partitions: int = DEFAULT_PARTITIONS,
    chunk_items: int = MAX_CHUNK_ITEMS,
    retry: RetryPolicy | None = None,
    max_items_per_second: float | None = None,
    check_queue: bool = True,
) -> ProduceCounts:
    """Produce every row of ``df`` into ``queue`` exactly once.

    Parameters
    ----------
    columns
        Which columns make an item (``querator.spark.mapping.ColumnMap``).
    target
        The write path (``DirectTarget`` or ``HttpTarget``); connected inside each executor.
    job_id
        Names this load. Running the job again with the same job id, ``partitions`` and
        ``chunk_items`` stores nothing twice (within the service's 24 h idempotency window).
    partitions
        Spark partitions, i.e. concurrent writers at most.
    max_items_per_second
        Optional average rate limit per Spark partition.
    check_queue
        Look the queue up from the driver first, so a wrong name fails before any work.

    Returns
    -------
    ProduceCounts
        Written, skipped as duplicates and invalid rows (the invalid ones listed, up to a limit).

    Raises
    ------
    ProduceFailedError
        Retries ran out, or the queue refused a chunk; the error carries the counts.
    ValueError
        A mapped column is missing or has a type that cannot be mapped.
    """
    if not job_id:
        raise ValueError("job_id is required: it is what makes a re-run store nothing twice")
    if partitions < 1:
        raise ValueError("partitions must be at least 1")
    if not 1 <= chunk_items <= MAX_CHUNK_ITEMS:
        raise ValueError(f"chunk_items must be between 1 and {MAX_CHUNK_ITEMS}")
    if check_queue:
        target.connect().check_queue(queue)
    source = df.select(*source_columns(df, columns))
    keyed = source.rdd.map(_RowPreparer(columns=columns, job_id=job_id))
    ordered = keyed.repartitionAndSortWithinPartitions(partitions, partitionFunc=_partition_of)
    writer = PartitionWriter(
        target=target,
        queue=queue,
        job_id=job_id,
        chunk_items=chunk_items,
        retry=retry or RetryPolicy(),
        max_items_per_second=max_items_per_second,
    )
    reports = ordered.mapPartitionsWithIndex(writer).collect()
    counts = sum(reports, ProduceCounts())
    log.info("produce job %s into %s: %s", job_id, queue, counts.summary())
    for error in counts.invalid_rows:
        log.warning("invalid row %s: %s", error.row, error.reason)
    if counts.failed:
        raise ProduceFailedError(counts)
    return counts


def source_columns(df: DataFrame, columns: ColumnMap) -> list[Column]:
    """The mapped columns of ``df``, with Spark timestamps turned into RFC 3339 text.

    A Spark ``TimestampType`` value reaches Python as a naive local datetime, which would lose its
    instant; formatting it in Spark with its offset keeps it.

    Raises
    ------
    ValueError
        A column is missing, or ``enqueue_at`` is a timestamp without a time zone or a date.
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
        selected.append(column.alias(name))
    return selected


def _partition_of(key: SortKey) -> int:
    return bucket_of(key[0])


@dataclass(frozen=True, slots=True, kw_only=True)
class _RowPreparer:
    """Row → (sort key, item or error); runs in the executors before the shuffle."""

    columns: ColumnMap
    job_id: str

    def __call__(self, row: Any) -> tuple[SortKey, NewItem | RowError]:
        values: dict[str, Any] = row.asDict(recursive=True)
        try:
            item = row_to_item(values, self.columns)
            return (row_key(values, self.columns, item, job_id=self.job_id), item_digest(item)), item
        except InvalidRowError as exc:
            described = describe_row(values, self.columns)
            error = RowError(row=described, column=str(exc.context.get("column", "")), reason=str(exc))
            # Invalid rows still need a stable place in the sort; they never reach a chunk.
            return (hashlib.sha256(repr(sorted(values.items())).encode()).hexdigest(), "!"), error


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
    #: Injected for tests; the executors use the real ones.
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def __call__(
        self, index: int, records: Iterable[tuple[SortKey, NewItem | RowError]]
    ) -> Iterator[ProduceCounts]:
        progress = _Progress()
        items = self._valid_items(records, progress)
        chunks = chunks_of(
            items,
            size_of=lambda r: wire_size(r[1]),
            max_items=self.chunk_items,
            max_bytes=MAX_CHUNK_WIRE_BYTES,
        )
        limiter = RateLimiter(self.max_items_per_second, clock=self.clock, sleep=self.sleep)
        producer: Producer | None = None
        stopped = False
        for chunk in chunks:
            if stopped:
                progress.failed += len(chunk)
                continue
            producer = producer or self.target.connect()
            limiter.acquire(len(chunk))
            if not self._produce(index, producer, chunk, progress):
                stopped = True
        counts = progress.counts()
        log.info("partition %d of job %s: %s", index, self.job_id, counts.summary())
        yield counts

    def _produce(
        self, index: int, producer: Producer, chunk: list[tuple[SortKey, NewItem]], progress: _Progress
    ) -> bool:
        key = chunk_key(self.job_id, self.queue, (f"{rk}:{digest}" for (rk, digest), _ in chunk))
        items = [item for _, item in chunk]
        try:
            receipt, attempts = call_with_retries(
                lambda: producer.produce(self.queue, items, idempotency_key=key),
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
    "DEFAULT_PARTITIONS",
    "PartitionWriter",
    "ProduceCounts",
    "ProduceFailedError",
    "produce_dataframe",
    "source_columns",
]
