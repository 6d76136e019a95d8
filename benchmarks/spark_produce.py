"""Spark bulk producer: rows/s, write units and requests of ``produce_dataframe`` against a plain loop.

Run ``uv run python -m benchmarks.spark_produce`` (``--rows N``, ``--partitions N``). Both sides write
the same rows (100-byte payloads) to the same single-threaded moto server on 127.0.0.1, through the
same counting proxy, each into fresh tables:

- the loop: one thread, ``BatchWriteItem`` with 25 items a request (DynamoDB's maximum), the
  product's own encoded items (``codec.encode_item``), ``UnprocessedItems`` resent; no idempotency,
  no staging, no counters: the item floor;
- the job: a ``local[2]`` Spark session, ``produce_dataframe`` over the direct write path (count,
  staged plan, shuffle and sort by bucket, 1000-item chunks through the chunk writer), timed from
  the call to its return; the session and the Python workers are warmed up first and not timed;
- the re-run: the same job again, where every chunk is a replay that stores nothing;
- the writer alone: ``PartitionWriter`` in this process over the rows as the plan hands them over
  (the executors' part of the job without Spark's staging, shuffle and scheduling).

The job paces itself to 80 % of 1,000 write units a second per queue partition (DynamoDB's limit
per partition key; the loop, writing one key, would be held to 1,000 on AWS). The queue has 8
partitions by default, so the pacing (6,400 a second) stays above what moto serves here and the
figures compare the write paths, not the pacing.

The proxy counts DynamoDB requests by operation and estimates write units as DynamoDB bills them:
an item written by ``BatchWriteItem`` / ``PutItem`` costs one unit per started KB of its size
(attribute names plus values); an ``UpdateItem`` or a refused conditional write costs one (every
record this path updates, a chunk record or a partition's head row, is under 1 KB).

moto serves one request at a time, so the figures compare the client-side work and the number of
requests of each path, not DynamoDB's speed; the ratios are what to read.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import math
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from querator.clock import SystemClock
from querator.config import Settings
from querator.domain.model import Item, QueueInfo
from querator.spark.job import PartitionWriter, produce_dataframe
from querator.spark.mapping import ColumnMap, bucket_of, item_digest, row_key, row_to_item
from querator.spark.producer import DirectTarget
from querator.storage.dynamodb import codec, schema
from querator.testing import (
    FAKE_AWS_ENV,
    build_service,
    dynamodb_client,
    local_spark_session,
    moto_server_process,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

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
    """Write ``rows`` as the product's items with a plain ``batch_write_item`` loop; rows/s."""
    table = f"loop-{uuid.uuid4().hex[:8]}"
    client.create_table(**schema.items_table_definition(table))
    now = datetime.now(UTC)
    items = [
        Item(
            id=f"{row_id:030x}",
            payload=body.encode(),
            expire_deadline=now + timedelta(days=1),
            created_at=now,
        )
        for row_id, body in rows
    ]
    started = time.perf_counter()
    for start in range(0, len(items), BATCH_WRITE_LIMIT):
        pending: list[Any] = [
            {"PutRequest": {"Item": codec.encode_item("bench", 0, item)}}
            for item in items[start : start + BATCH_WRITE_LIMIT]
        ]
        while pending:
            reply = client.batch_write_item(RequestItems={table: pending})
            pending = list(reply.get("UnprocessedItems", {}).get(table, []))
    return len(rows) / (time.perf_counter() - started)


# -- counting what reaches the store -----------------------------------------------------------


def attribute_size(value: dict[str, Any]) -> int:
    """DynamoDB's size of an attribute value (its item-size rules, to the byte where it matters)."""
    (kind, inner), *_ = value.items()
    if kind == "S":
        return len(inner.encode())
    if kind == "B":
        return len(base64.b64decode(inner))
    if kind == "N":
        return len(inner.lstrip("-").replace(".", "")) // 2 + 1
    if kind in {"BOOL", "NULL"}:
        return 1
    if kind == "L":
        return 3 + sum(1 + attribute_size(v) for v in inner)
    if kind == "M":
        return 3 + sum(1 + len(k.encode()) + attribute_size(v) for k, v in inner.items())
    return sum(len(v.encode()) if isinstance(v, str) else 8 for v in inner)  # sets


def item_units(item: dict[str, Any]) -> int:
    size = sum(len(name.encode()) + attribute_size(value) for name, value in item.items())
    return max(1, math.ceil(size / 1024))


class Meter:
    """Requests by operation and estimated write units, as the proxy saw them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.write_units = 0
        self.items_written = 0

    def note(self, operation: str, body: dict[str, Any], status: int) -> None:
        units = items = 0
        if operation == "BatchWriteItem" and status == 200:
            for requests in body.get("RequestItems", {}).values():
                for request in requests:
                    if "PutRequest" in request:
                        units += item_units(request["PutRequest"]["Item"])
                        items += 1
        elif operation == "PutItem":
            units = item_units(body["Item"])
        elif operation in {"UpdateItem", "DeleteItem"}:
            units = 1
        with self._lock:
            self.requests[operation] += 1
            self.write_units += units
            self.items_written += items

    def snapshot(self) -> tuple[Counter[str], int, int]:
        with self._lock:
            return Counter(self.requests), self.write_units, self.items_written


@contextmanager
def counting_proxy(endpoint: str, meter: Meter) -> Iterator[str]:
    """An HTTP proxy on 127.0.0.1 in front of ``endpoint`` that notes every DynamoDB call."""
    target = urlsplit(endpoint)
    local = threading.local()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in separate writes: with Nagle's algorithm each request would wait
        # for a delayed ACK (~40 ms), which would slow a sequential client far more than a parallel one.
        disable_nagle_algorithm = True

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            connection = getattr(local, "connection", None)
            if connection is None:
                connection = local.connection = http.client.HTTPConnection(
                    target.hostname or "127.0.0.1", target.port
                )
                connection.connect()
                assert connection.sock is not None  # noqa: S101
                connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in {"host", "connection"}}
            connection.request("POST", self.path, body=body, headers=headers)
            reply = connection.getresponse()
            data = reply.read()
            operation = self.headers.get("X-Amz-Target", ".").rsplit(".", 1)[-1]
            meter.note(operation, json.loads(body or b"{}"), reply.status)
            self.send_response(reply.status)
            for name, value in reply.getheaders():
                if name.lower() not in {"content-length", "connection", "transfer-encoding"}:
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            del args  # quiet

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def new_queue(endpoint: str, partitions: int = 4) -> tuple[QueueService, DirectTarget]:
    """Fresh tables with a queue ``bench``; the driver's service and the executors' target."""
    prefix = f"b{uuid.uuid4().hex[:8]}"
    service = build_service(dynamodb_client(endpoint), clock=SystemClock(), prefix=prefix)
    now = datetime.now(UTC)
    service.create_queue(
        QueueInfo(
            name="bench",
            lease_timeout=timedelta(minutes=1),
            expire_timeout=timedelta(days=1),
            partitions=partitions,
            created_at=now,
            updated_at=now,
        )
    )
    settings = Settings(items_table=f"{prefix}-items", catalog_table=f"{prefix}-queues", region="us-east-1")
    return service, DirectTarget(settings=settings, endpoint_url=endpoint)


@dataclass(frozen=True)
class JobRun:
    rows_per_second: float
    requests: Counter[str]
    write_units: int


def job_runs(
    spark: SparkSession,
    endpoint: str,
    meter: Meter,
    rows: list[tuple[int, str]],
    *,
    partitions: int | None,
    queue_partitions: int,
) -> tuple[JobRun, JobRun]:
    """Produce ``rows`` with the job into a fresh queue, then again; rows/s and what each run sent."""
    _, target = new_queue(endpoint, queue_partitions)
    columns = ColumnMap(payload=("body",), key="id")
    # A fresh staging directory per measurement: job ids repeat between runs of the benchmark.
    staging = tempfile.mkdtemp(prefix="querator-bench-staging-")

    def produce(frame_rows: list[tuple[int, str]], job_id: str) -> JobRun:
        frame = spark.createDataFrame(frame_rows, "id long, body string")
        before, units_before, _ = meter.snapshot()
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
        after, units_after, _ = meter.snapshot()
        assert counts.written + counts.skipped_duplicates == len(frame_rows)  # noqa: S101
        return JobRun(len(frame_rows) / elapsed, after - before, units_after - units_before)

    try:
        produce(rows[:50], "warm-up")  # starts the Python workers and loads the classes; not measured
        return produce(rows, "bench"), produce(rows, "bench")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def writer_run(endpoint: str, meter: Meter, rows: list[tuple[int, str]], *, queue_partitions: int) -> JobRun:
    """The executors' part alone: ``PartitionWriter`` over the rows as the plan hands them over, in
    this process, no Spark (separates the write path from Spark's staging, shuffle and scheduling)."""
    _, target = new_queue(endpoint, queue_partitions)
    columns = ColumnMap(payload=("body",), key="id")
    records: list[Any] = []
    for row_id, body in rows:
        row = {"id": row_id, "body": body}
        item = row_to_item(row, columns)
        key = row_key(row, columns, item, job_id="writer")
        records.append(((bucket_of(key) % 2, key, item_digest(item)), item))
    records.sort(key=lambda record: record[0])
    writer = PartitionWriter(target=target, queue="bench", job_id="writer")
    before, units_before, _ = meter.snapshot()
    started = time.perf_counter()
    (counts,) = list(writer(0, iter(records)))
    elapsed = time.perf_counter() - started
    after, units_after, _ = meter.snapshot()
    assert counts.written == len(rows)  # noqa: S101
    return JobRun(len(rows) / elapsed, after - before, units_after - units_before)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--partitions", type=int, help="Spark partitions of the job (default: derived)")
    parser.add_argument("--master", default="local[2]", help="Spark master of the job")
    parser.add_argument(
        "--queue-partitions",
        type=int,
        default=8,
        help="the queue's partitions: the job paces itself to 800 write units a second per partition, "
        "which DynamoDB would enforce and moto does not (8: above what moto serves here)",
    )
    args = parser.parse_args(argv)
    for name, value in FAKE_AWS_ENV.items():
        os.environ.setdefault(name, value)
    rows = make_rows(args.rows)
    meter = Meter()
    with moto_server_process() as moto, counting_proxy(moto, meter) as endpoint:
        spark = local_spark_session(master=args.master, app="querator-spark-benchmark")
        try:
            before, loop_units_before, _ = meter.snapshot()
            loop = loop_rows_per_second(dynamodb_client(endpoint), rows)
            after, loop_units, _ = meter.snapshot()
            loop_requests = sum((after - before).values())
            loop_units -= loop_units_before
            job, rerun = job_runs(
                spark,
                endpoint,
                meter,
                rows,
                partitions=args.partitions,
                queue_partitions=args.queue_partitions,
            )
        finally:
            spark.stop()
        alone = writer_run(endpoint, meter, rows, queue_partitions=args.queue_partitions)
    floor = loop_units / args.rows
    print(f"{args.rows} rows of {PAYLOAD_BYTES} bytes, one single-threaded moto server, Spark {args.master}")
    print(f"{'path':<40} {'rows/s':>8} {'vs loop':>8} {'WCU/row':>8} {'vs floor':>8} {'req/1000':>9}")
    for label, rate, units, requests in (
        ("batch_write_item loop (the floor)", loop, loop_units, loop_requests),
        ("produce_dataframe, first run", job.rows_per_second, job.write_units, sum(job.requests.values())),
        (
            "same job again (every chunk a replay)",
            rerun.rows_per_second,
            rerun.write_units,
            sum(rerun.requests.values()),
        ),
        ("PartitionWriter alone, no Spark", alone.rows_per_second, alone.write_units, alone.requests.total()),
    ):
        print(
            f"{label:<40} {rate:>8.0f} {rate / loop:>8.2f} {units / args.rows:>8.4f} "
            f"{units / args.rows / floor:>8.4f} {requests * 1000 / args.rows:>9.1f}"
        )
    print("first run's requests:", dict(sorted(job.requests.items())))
    print("re-run's requests:   ", dict(sorted(rerun.requests.items())))


if __name__ == "__main__":
    main()
