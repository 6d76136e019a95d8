"""Throughput of the local service against the raw DynamoDB operations of the same workload.

Run ``uv run python -m benchmarks.throughput`` (``--quick`` for a smaller run); ``python -m
benchmarks`` runs it with everything else.

One single-threaded moto server is the store for three runs of one workload (produce ``count``
items of 100 B in requests of ``batch``, then lease ``batch`` and complete them, until empty), each
on its own queue, one partition, one client thread:

``raw``      the DynamoDB requests that workload needs, issued directly with boto3 to the same
             table: ``BatchWriteItem`` (25 a request) per produce; per lease one ``Query`` of due,
             un-leased items and one conditional ``UpdateItem`` per claimed item; per complete one
             conditional ``DeleteItem`` per item. The items and expressions are the product's own
             (``codec``, ``expressions``), so each request does the same work on the server.
``service``  ``QueueService`` in-process (the object the handlers call): adds the catalog read of
             every call, id minting, lifecycle decisions and decoding.
``http``     the in-process ``LocalServer`` over HTTP/1.1 keep-alive: adds the JSON wire, the API
             Gateway proxy event, the gateway's router and the wire layer's validation of the real handlers.

The ratio ``raw / x`` is how many times slower ``x`` is than the bare store requests: the overhead of
the service (and of the HTTP edge). moto answers in about a millisecond, far slower than a local
hash map and far faster than DynamoDB's network round trip, so the ratio is only meaningful as
"how much of the time is ours"; absolute items/s on moto say nothing about AWS (DESIGN.md).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import io
import json
import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from benchmarks.cost import payload_of, use_fake_credentials
from querator.domain.errors import NothingToLeaseError
from querator.domain.ids import IdFactory, visible_bound
from querator.domain.model import Item, NewItem, QueueInfo
from querator.ports import Guard
from querator.storage.dynamodb import codec, expressions, schema
from querator.testing import moto_server_process

if TYPE_CHECKING:
    from collections.abc import Callable

    from mypy_boto3_dynamodb import DynamoDBClient

    from querator.service import QueueService

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

COUNT = 400
QUICK_COUNT = 100
BATCHES = (1, 10)
PAYLOAD = 100
LEASE_TIMEOUT = timedelta(minutes=5)
EXPIRE_TIMEOUT = timedelta(hours=1)
BATCH_WRITE_LIMIT = 25
MODES = ("raw", "service", "http")
ROUNDS = 3


@dataclass(frozen=True)
class ThroughputRun:
    mode: str
    batch: int
    items: int
    produce_seconds: float
    consume_seconds: float

    @property
    def produce_rate(self) -> float:
        return self.items / self.produce_seconds if self.produce_seconds else float("nan")

    @property
    def consume_rate(self) -> float:
        """Items per second through lease + complete."""
        return self.items / self.consume_seconds if self.consume_seconds else float("nan")


class Workload:
    """Produce then consume ``count`` items; subclasses say how one request is made."""

    mode: str

    def produce(self, payloads: list[bytes]) -> None:
        raise NotImplementedError

    def lease(self, batch: int) -> tuple[int, list[str]]:
        """Lease up to ``batch``; returns (partition, ids), no ids when nothing is left."""
        raise NotImplementedError

    def complete(self, partition: int, ids: list[str]) -> None:
        raise NotImplementedError

    def run(self, *, batch: int, count: int) -> ThroughputRun:
        payload = payload_of(PAYLOAD)
        started = time.perf_counter()
        for start in range(0, count, batch):
            self.produce([payload] * min(batch, count - start))
        produced = time.perf_counter()
        consumed = 0
        for _ in range(count + 1):  # every lease returns an item until the queue is empty
            partition, ids = self.lease(batch)
            if not ids:
                break
            self.complete(partition, ids)
            consumed += len(ids)
        finished = time.perf_counter()
        if consumed != count:
            raise RuntimeError(f"{self.mode}: consumed {consumed} of {count} items")
        return ThroughputRun(self.mode, batch, count, produced - started, finished - produced)


class RawWorkload(Workload):
    """The store requests the service makes for the workload, without the service."""

    mode = "raw"

    def __init__(self, client: DynamoDBClient, table: str, queue: str) -> None:
        self._client, self._table, self._queue = client, table, queue
        self._ids = IdFactory()

    def produce(self, payloads: list[bytes]) -> None:
        now = datetime.now(UTC)
        requests: list[Any] = [
            {
                "PutRequest": {
                    "Item": codec.encode_item(
                        self._queue,
                        0,
                        Item(
                            id=self._ids.new_id(now),
                            payload=p,
                            expire_deadline=now + EXPIRE_TIMEOUT,
                            created_at=now,
                        ),
                    )
                }
            }
            for p in payloads
        ]
        for start in range(0, len(requests), BATCH_WRITE_LIMIT):
            pending = requests[start : start + BATCH_WRITE_LIMIT]
            while pending:
                reply = self._client.batch_write_item(RequestItems={self._table: pending})
                pending = list(reply.get("UnprocessedItems", {}).get(self._table, []))

    def lease(self, batch: int) -> tuple[int, list[str]]:
        now = datetime.now(UTC)
        page = self._client.query(
            TableName=self._table,
            KeyConditionExpression="pk = :pk AND sk < :bound",
            FilterExpression=expressions.AVAILABLE_FILTER,
            ProjectionExpression=expressions.STATE_PROJECTION,
            ExpressionAttributeNames={
                **expressions.STATE_PROJECTION_NAMES,
                **expressions.AVAILABLE_FILTER_NAMES,
            },
            ExpressionAttributeValues={
                ":pk": {"S": schema.partition_key(self._queue, 0)},
                ":bound": {"S": visible_bound(now)},
                ":now": codec.num(now),
            },
            Limit=min(1000, max(50, 2 * batch)),
        )
        values = {
            ":deadline": codec.num(now + LEASE_TIMEOUT),
            ":now": codec.num(now),
            ":one": {"N": "1"},
        }
        won = []
        for attrs in page.get("Items", [])[:batch]:
            item_id = attrs[schema.SK]["S"]
            self._client.update_item(
                TableName=self._table,
                Key=codec.item_key(self._queue, 0, item_id),
                UpdateExpression=expressions.CLAIM_UPDATE,
                ConditionExpression=expressions.CLAIM_CONDITION,
                ExpressionAttributeNames=expressions.CLAIM_NAMES,
                ExpressionAttributeValues=values,
                ReturnValues="ALL_NEW",
            )
            won.append(item_id)
        return 0, won

    def complete(self, partition: int, ids: list[str]) -> None:
        condition, names = expressions.GUARD_CONDITIONS[Guard.LEASE_VALID]
        now = datetime.now(UTC)
        for item_id in ids:
            self._client.delete_item(
                TableName=self._table,
                Key=codec.item_key(self._queue, partition, item_id),
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues={":now": codec.num(now)},
            )


class ServiceWorkload(Workload):
    mode = "service"

    def __init__(self, service: QueueService, queue: str) -> None:
        self._service, self._queue = service, queue

    def produce(self, payloads: list[bytes]) -> None:
        self._service.produce(self._queue, [NewItem(payload=p) for p in payloads])

    def lease(self, batch: int) -> tuple[int, list[str]]:
        try:
            lease = self._service.lease(self._queue, batch_size=batch, client_id="throughput")
        except NothingToLeaseError:
            return 0, []
        return lease.partition, [item.id for item in lease.items]

    def complete(self, partition: int, ids: list[str]) -> None:
        outcome = self._service.complete(self._queue, partition, ids)
        if outcome.failed:
            raise RuntimeError(f"complete failed: {outcome.failed[:3]}")


class HttpWorkload(Workload):
    """The contract's JSON API over one keep-alive connection."""

    mode = "http"

    def __init__(self, url: str, queue: str) -> None:
        parts = urlsplit(url)
        self._connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
        self._queue = queue

    def call(self, method: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self._connection.request(
            "POST", f"/v1/{method}", body=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        response = self._connection.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else {}

    def produce(self, payloads: list[bytes]) -> None:
        items = [{"bytes": base64.b64encode(p).decode()} for p in payloads]
        status, reply = self.call("queue.produce", {"queue_name": self._queue, "items": items})
        if status != 200:
            raise RuntimeError(f"produce: {status} {reply}")

    def lease(self, batch: int) -> tuple[int, list[str]]:
        status, reply = self.call(
            "queue.lease",
            {
                "queue_name": self._queue,
                "batch_size": batch,
                "client_id": "throughput",
                "request_timeout": "0s",
            },
        )
        if status == 454:
            return 0, []
        if status != 200:
            raise RuntimeError(f"lease: {status} {reply}")
        return int(reply.get("partition", 0)), [item["id"] for item in reply["items"]]

    def complete(self, partition: int, ids: list[str]) -> None:
        status, reply = self.call(
            "queue.complete", {"queue_name": self._queue, "partition": partition, "ids": ids}
        )
        if status != 200:
            raise RuntimeError(f"complete: {status} {reply}")

    def close(self) -> None:
        self._connection.close()


def measure(
    endpoint: str, *, batches: tuple[int, ...] = BATCHES, count: int = COUNT, rounds: int = ROUNDS
) -> list[ThroughputRun]:
    """Run the workload in every mode and batch against the moto server at ``endpoint``.

    Each mode runs ``rounds`` times, interleaved with the others (raw, service, http, raw, ...) on a
    fresh queue each time, so load from elsewhere on the machine falls on every mode alike; the
    figure kept per mode is the median round (by total time).
    """
    from querator import bootstrap  # noqa: PLC0415 - configured from the environment set just below
    from querator.config import EnvVar, load_settings  # noqa: PLC0415
    from querator.localserver import LocalServer  # noqa: PLC0415

    os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = endpoint
    os.environ.setdefault(EnvVar.REGION, "us-east-1")
    os.environ[EnvVar.ITEMS_TABLE] = "throughput-items"
    os.environ[EnvVar.CATALOG_TABLE] = "throughput-queues"
    os.environ[EnvVar.POWERTOOLS_METRICS_DISABLED] = "true"
    os.environ.setdefault(EnvVar.POWERTOOLS_LOG_LEVEL, "WARNING")
    server = LocalServer(port=0, reaper_interval=3600).start()
    try:
        service = bootstrap.get_service()
        client = bootstrap.get_client()
        table = load_settings().items_table
        factories: dict[str, Callable[[str], Workload]] = {
            "raw": lambda q: RawWorkload(client, table, q),
            "service": lambda q: ServiceWorkload(service, q),
            "http": lambda q: HttpWorkload(server.url, q),
        }
        runs = []
        for batch in batches:
            samples: dict[str, list[ThroughputRun]] = {mode: [] for mode in MODES}
            for round_ in range(rounds):
                for mode in MODES:
                    queue = f"tp-{mode}-{batch}-{round_}"
                    placeholder = datetime(2000, 1, 1, tzinfo=UTC)
                    service.create_queue(
                        QueueInfo(
                            name=queue,
                            lease_timeout=LEASE_TIMEOUT,
                            expire_timeout=EXPIRE_TIMEOUT,
                            created_at=placeholder,
                            updated_at=placeholder,
                        )
                    )
                    workload = factories[mode](queue)
                    # The handlers' Powertools metrics flush to stdout when their buffer fills; that
                    # output is the Lambda's, not this report's.
                    with contextlib.redirect_stdout(io.StringIO()):
                        samples[mode].append(workload.run(batch=batch, count=count))
                    if isinstance(workload, HttpWorkload):
                        workload.close()
            for mode in MODES:
                ordered = sorted(samples[mode], key=lambda r: r.produce_seconds + r.consume_seconds)
                runs.append(ordered[len(ordered) // 2])
        return runs
    finally:
        server.stop()


def ratios(runs: list[ThroughputRun], batch: int, mode: str) -> tuple[float, float]:
    """(produce, lease+complete) of ``raw`` items/s over ``mode`` items/s: how many times slower."""
    by_mode = {r.mode: r for r in runs if r.batch == batch}
    raw, other = by_mode["raw"], by_mode[mode]
    return raw.produce_rate / other.produce_rate, raw.consume_rate / other.consume_rate


def format_table(runs: list[ThroughputRun], count: int) -> str:
    lines = [
        f"Throughput, one client thread, {count} items of {PAYLOAD} B per run, one partition,"
        " single-threaded moto; the median of interleaved rounds",
        f"{'batch':>5} {'mode':<8} | {'produce items/s':>15} {'x raw':>6} |"
        f" {'lease+complete items/s':>22} {'x raw':>6}",
    ]
    lines.append("-" * len(lines[1]))
    for r in runs:
        produce, consume = ratios(runs, r.batch, r.mode)
        lines.append(
            f"{r.batch:>5} {r.mode:<8} | {r.produce_rate:>15.0f} {produce:>6.2f} |"
            f" {r.consume_rate:>22.0f} {consume:>6.2f}"
        )
    lines.append("x raw = raw items/s / this mode's items/s: how many times the bare store requests' speed.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_COUNT} items per run")
    args = parser.parse_args(argv)
    count = QUICK_COUNT if args.quick else COUNT
    use_fake_credentials()
    with moto_server_process() as endpoint:
        runs = measure(endpoint, count=count)
    print(format_table(runs, count))
    return 0


if __name__ == "__main__":
    sys.exit(main())
