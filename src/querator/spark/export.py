"""Spark export: a queue's items (for example a dead-letter queue's) into Parquet for analysis.

One Spark task per queue partition pages through it with ``QueueService.list_items`` and
``list_scheduled`` (the ``storage/items.list`` use cases), inside the executor. It is a read, not a
snapshot: items leased, completed or produced while the export runs may or may not be in it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from querator.clock import SystemClock
from querator.spark.plan import filesystem

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from querator.domain.model import Item
    from querator.service import QueueService
    from querator.spark.producer import DirectTarget

log = logging.getLogger(__name__)

#: ``storage/items.list`` pages hold at most this many items.
PAGE_SIZE = 1000


def export_schema() -> StructType:
    """The Parquet columns: the contract's ``storage/items.list`` fields plus queue and partition
    (``source_queue``, ``last_reason`` and ``failures`` null when empty)."""
    from pyspark.sql import types as T  # noqa: N812, PLC0415 - pyspark only where Spark runs

    return T.StructType(
        [
            T.StructField("queue", T.StringType(), nullable=False),
            T.StructField("partition", T.IntegerType(), nullable=False),
            T.StructField("id", T.StringType(), nullable=False),
            T.StructField("source_id", T.StringType()),
            T.StructField("scheduled", T.BooleanType(), nullable=False),
            T.StructField("attempts", T.IntegerType(), nullable=False),
            T.StructField("is_leased", T.BooleanType(), nullable=False),
            T.StructField("lease_deadline", T.TimestampType()),
            T.StructField("expire_deadline", T.TimestampType()),
            T.StructField("created_at", T.TimestampType()),
            T.StructField("enqueue_at", T.TimestampType()),
            T.StructField("reference", T.StringType()),
            T.StructField("encoding", T.StringType()),
            T.StructField("kind", T.StringType()),
            T.StructField("payload", T.BinaryType()),
            # Why items failed (a dead-letter queue's export is read for that): null when they did
            # not. Last, so the files of an export made before them read with this schema too.
            T.StructField("source_queue", T.StringType()),
            T.StructField("last_reason", T.StringType()),
            T.StructField("failures", T.IntegerType()),
        ]
    )


def iter_partition(service: QueueService, queue: str, partition: int) -> Iterator[tuple[Item, bool]]:
    """Every item of one partition, in FIFO order, then the scheduled ones; each with ``scheduled``."""
    for scheduled, lister in ((False, service.list_items), (True, service.list_scheduled)):
        pivot = ""
        while True:
            page = lister(queue, partition, pivot=pivot, limit=PAGE_SIZE)
            # ``pivot`` is inclusive: the first item of a later page is the last of the one before.
            fresh = [item for item in page if item.id != pivot]
            yield from ((item, scheduled) for item in fresh)
            # A short page is not the end: a listing also stops before its reply would pass the
            # reply cap (large payloads), so only a page with nothing new is.
            if not fresh:
                break
            pivot = page[-1].id


@dataclass(frozen=True, slots=True)
class _PartitionReader:
    target: DirectTarget
    queue: str

    def __call__(self, partition: int) -> Iterator[tuple[Any, ...]]:
        service = self.target.service()
        # The export is an edge, like a handler: it reads the clock once, for ``is_leased``.
        now = SystemClock().now()
        for item, scheduled in iter_partition(service, self.queue, partition):
            yield (
                self.queue,
                partition,
                item.id,
                item.source_id or None,
                scheduled,
                item.attempts,
                item.is_leased(now),
                item.lease_deadline,
                item.expire_deadline,
                item.created_at,
                item.enqueue_at,
                item.reference,
                item.encoding,
                item.kind,
                bytearray(item.payload),
                item.source_queue or None,
                item.last_reason or None,
                item.failures or None,
            )


def parquet_files(spark: SparkSession, path: str) -> list[str]:
    """The Parquet files directly under ``path`` (none when it does not exist yet)."""
    fs, directory = filesystem(spark, path)
    if not fs.exists(directory):
        return []
    return [
        status.getPath().toString()
        for status in fs.listStatus(directory)
        if status.isFile() and status.getPath().getName().endswith(".parquet")
    ]


def export_queue(
    spark: SparkSession, *, queue: str, target: DirectTarget, path: str, mode: str = "errorifexists"
) -> int:
    """Write every item of ``queue`` to Parquet at ``path``; return how many rows this call wrote.

    Counted in the Parquet files this call added to ``path``, not in the whole path: in append mode
    the path also holds earlier exports.

    Raises
    ------
    QueueNotFoundError
        The queue does not exist (checked from the driver before any task starts).
    """
    partitions = target.service().get_queue(queue).partitions
    rows = spark.sparkContext.parallelize(range(partitions), partitions).flatMap(
        _PartitionReader(target, queue)
    )
    before = set(parquet_files(spark, path))
    spark.createDataFrame(rows, export_schema()).write.mode(mode).parquet(path)
    # Overwrite may reuse no name (each write's files carry its job's UUID), so "added" is exact.
    added = sorted(set(parquet_files(spark, path)) - before)
    count = spark.read.schema(export_schema()).parquet(*added).count() if added else 0
    log.info("exported %d items of %s (%d partitions) to %s", count, queue, partitions, path)
    return count


__all__ = ["PAGE_SIZE", "export_queue", "export_schema", "iter_partition", "parquet_files"]
