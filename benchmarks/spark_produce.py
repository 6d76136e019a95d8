"""Spark bulk producer: rows/s of ``produce_dataframe`` against a plain boto3 ``batch_write_item`` loop.

Run ``uv run python -m benchmarks.spark_produce`` (``--rows N``, ``--partitions N``). Both sides write
the same rows (100-byte payloads) to the same single-threaded moto server on 127.0.0.1, each into
fresh tables:

- the loop: one thread, ``BatchWriteItem`` with 25 items a request (DynamoDB's maximum), items with
  nothing but keys and payload, ``UnprocessedItems`` resent; no idempotency, no queue rules;
- the job: a ``local[1]`` Spark session, ``produce_dataframe`` over the direct write path (mapping,
  shuffle and sort by row key, 1000-item idempotent produce calls through ``QueueService``), timed
  from the call to its return; the session and the Python worker are warmed up first and not timed.
- the re-run: the same job again, where every chunk is an idempotent replay that stores nothing;
- for reference, ``QueueService.produce`` called in a plain loop (1000-item idempotent calls, no
  Spark), which separates what Spark adds from what the product's item format and idempotency cost.

moto serves one request at a time, so the figures compare the client-side work and the number of
requests of each path, not DynamoDB's speed; the ratio is what to read.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from querator.clock import SystemClock
from querator.config import Settings
from querator.domain.model import MAX_BATCH, NewItem, QueueInfo
from querator.spark.job import produce_dataframe
from querator.spark.mapping import ColumnMap
from querator.spark.producer import DirectTarget
from querator.storage.dynamodb import schema
from querator.testing import (
    FAKE_AWS_ENV,
    build_service,
    dynamodb_client,
    local_spark_session,
    moto_server_process,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from pyspark.sql import SparkSession

    from querator.service import QueueService

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

ROWS = 10_000
PAYLOAD_BYTES = 100
BATCH_WRITE_LIMIT = 25


def make_rows(count: int) -> list[tuple[int, str]]:
    return [(i, f"{i:010d}".ljust(PAYLOAD_BYTES, "x")) for i in range(count)]


def loop_rows_per_second(client: DynamoDBClient, rows: list[tuple[int, str]]) -> float:
    """Write ``rows`` with a plain ``batch_write_item`` loop into a fresh table; rows/s."""
    table = f"loop-{uuid.uuid4().hex[:8]}"
    client.create_table(**schema.items_table_definition(table))
    started = time.perf_counter()
    for start in range(0, len(rows), BATCH_WRITE_LIMIT):
        pending: list[Any] = [
            {
                "PutRequest": {
                    "Item": {
                        schema.PK: {"S": "bench~0"},
                        schema.SK: {"S": f"{row_id:016x}"},
                        schema.PAYLOAD: {"B": body.encode()},
                    }
                }
            }
            for row_id, body in rows[start : start + BATCH_WRITE_LIMIT]
        ]
        while pending:
            reply = client.batch_write_item(RequestItems={table: pending})
            pending = list(reply.get("UnprocessedItems", {}).get(table, []))
    return len(rows) / (time.perf_counter() - started)


def new_queue(endpoint: str) -> tuple[QueueService, DirectTarget]:
    """Fresh tables with a 4-partition queue ``bench``; the driver's service and the executors' target."""
    prefix = f"b{uuid.uuid4().hex[:8]}"
    service = build_service(dynamodb_client(endpoint), clock=SystemClock(), prefix=prefix)
    now = datetime.now(UTC)
    service.create_queue(
        QueueInfo(
            name="bench",
            lease_timeout=timedelta(minutes=1),
            expire_timeout=timedelta(days=1),
            partitions=4,
            created_at=now,
            updated_at=now,
        )
    )
    settings = Settings(items_table=f"{prefix}-items", catalog_table=f"{prefix}-queues", region="us-east-1")
    return service, DirectTarget(settings=settings, endpoint_url=endpoint)


def service_rows_per_second(endpoint: str, rows: list[tuple[int, str]]) -> float:
    """``QueueService.produce`` in a loop, 1000 items a call with an idempotency key; rows/s."""
    service, _ = new_queue(endpoint)
    started = time.perf_counter()
    for start in range(0, len(rows), MAX_BATCH):
        items = [NewItem(payload=body.encode()) for _, body in rows[start : start + MAX_BATCH]]
        service.produce("bench", items, idempotency_key=f"loop-{start}")
    return len(rows) / (time.perf_counter() - started)


def job_rows_per_second(
    spark: SparkSession, endpoint: str, rows: list[tuple[int, str]], *, partitions: int
) -> tuple[float, float]:
    """Produce ``rows`` with the job into a fresh queue, then again; rows/s of both runs."""
    _, target = new_queue(endpoint)
    columns = ColumnMap(payload=("body",), key="id")
    # A fresh staging directory per measurement: job ids repeat between runs of the benchmark.
    staging = tempfile.mkdtemp(prefix="querator-bench-staging-")

    def produce(frame_rows: list[tuple[int, str]], job_id: str) -> float:
        frame = spark.createDataFrame(frame_rows, "id long, body string")
        started = time.perf_counter()
        counts = produce_dataframe(
            frame,
            queue="bench",
            columns=columns,
            target=target,
            job_id=job_id,
            staging_dir=staging,
            partitions=partitions,
        )
        elapsed = time.perf_counter() - started
        assert counts.written + counts.skipped_duplicates == len(frame_rows)  # noqa: S101
        return len(frame_rows) / elapsed

    produce(rows[:50], "warm-up")  # starts the Python worker and loads the classes; not measured
    return produce(rows, "bench"), produce(rows, "bench")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--partitions", type=int, default=1, help="Spark partitions of the job")
    args = parser.parse_args(argv)
    for name, value in FAKE_AWS_ENV.items():
        os.environ.setdefault(name, value)
    rows = make_rows(args.rows)
    with moto_server_process() as endpoint:
        spark = local_spark_session(master="local[1]", app="querator-spark-benchmark")
        try:
            loop = loop_rows_per_second(dynamodb_client(endpoint), rows)
            job, rerun = job_rows_per_second(spark, endpoint, rows, partitions=args.partitions)
        finally:
            spark.stop()
        direct = service_rows_per_second(endpoint, rows)
    print(f"{args.rows} rows of {PAYLOAD_BYTES} bytes, one single-threaded moto server on 127.0.0.1")
    print(f"{'path':<44} {'rows/s':>10} {'vs loop':>8}")
    print(f"{'boto3 batch_write_item loop (25 a request)':<44} {loop:>10.0f} {1.0:>8.2f}")
    label = f"produce_dataframe, {args.partitions} partition(s), local[1]"
    print(f"{label:<44} {job:>10.0f} {job / loop:>8.2f}")
    print(f"{'same job again (every chunk a replay)':<44} {rerun:>10.0f} {rerun / loop:>8.2f}")
    print(f"{'QueueService.produce loop, no Spark':<44} {direct:>10.0f} {direct / loop:>8.2f}")


if __name__ == "__main__":
    main()
