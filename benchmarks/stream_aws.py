"""The stream on a deployed stack: DynamoDB work, Lambda invocations and WebSocket messages per pushed item.

    uv run python -m benchmarks.stream_aws [--rounds 20]

The stream and dispatcher functions run in process over moto (``mock_aws``), with the events
API Gateway and DynamoDB Streams would send them; DynamoDB requests and units are counted by
``benchmarks.meter`` (DynamoDB's published rules), messages by a hook on the management API client.
One consumer with a credit of B (1, 10, 100), 100-byte items, two regimes:

- **arrival**: the queue is empty; each round B items are produced, the dispatcher is invoked with
  their inserts (one batch of stream records) and pushes them, and the consumer completes them in
  one ``complete`` message (whose credit coming back makes the stream function try to lease again
  and find nothing);
- **backlog**: the queue holds every round's items before the consumer subscribes; each
  ``complete`` message of B items brings the next B pushed by the same invocation.

Produce is the producer's cost whatever the consumer does, so it is not counted. Beside it, the same
lease + complete over HTTP (one ``queue.lease`` and one ``queue.complete`` call per B items). Prices
are us-east-1 on-demand, November 2026 (docs/capacity.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import boto3
from moto import mock_aws

from benchmarks.meter import CostMeter

REGION = "us-east-1"
ENDPOINT = "https://abcdef1234.execute-api.us-east-1.amazonaws.com/bench"
#: API Gateway WebSocket: $1.00 per million messages (counted in 32 KB units), $0.25 per million
#: connection-minutes; Lambda arm64 $0.0000133334 per GB-s and $0.20 per million requests;
#: DynamoDB on demand $0.625 per million write and $0.125 per million read units.
PRICE_MESSAGE = 1.00 / 1e6
PRICE_CONNECTION_MINUTE = 0.25 / 1e6
PRICE_WRITE_UNIT = 0.625 / 1e6
PRICE_READ_UNIT = 0.125 / 1e6
PRICE_LAMBDA_REQUEST = 0.20 / 1e6


#: What the functions read, as the stack would set it (tables by the names created here).
ENVIRONMENT = {
    "QUERATOR_ITEMS_TABLE": "items",
    "QUERATOR_CATALOG_TABLE": "queues",
    "QUERATOR_CONNECTIONS_TABLE": "connections",
    "QUERATOR_STREAM_ENDPOINT": ENDPOINT,
    "AWS_REGION": REGION,
    "AWS_DEFAULT_REGION": REGION,
    "POWERTOOLS_METRICS_DISABLED": "true",
    "POWERTOOLS_LOG_LEVEL": "WARNING",
}


@dataclass(frozen=True)
class Figures:
    path: str
    batch: int
    items: int
    requests: int
    write_units: float
    read_units: float
    invocations: int
    messages: int

    def per_item(self, value: float) -> float:
        return value / self.items


class Bench:
    """The stack's stream half in process: its tables, both functions, a meter, a message counter."""

    def __init__(self) -> None:
        os.environ.update(ENVIRONMENT)
        from querator import bootstrap  # noqa: PLC0415 - after the environment is set
        from querator.localserver import LocalContext  # noqa: PLC0415
        from querator.storage.dynamodb import schema  # noqa: PLC0415
        from querator.storage.dynamodb.connections import connections_table_definition  # noqa: PLC0415
        from querator.stream import aws  # noqa: PLC0415

        bootstrap.reset()
        aws._management_client.cache_clear()
        client = bootstrap.get_client()
        schema.create_tables(client, items_table="items", catalog_table="queues")
        client.create_table(**connections_table_definition("connections"))
        self.raw = boto3.client("dynamodb", region_name=REGION)
        self.seen: set[tuple[str, str]] = set()
        self.meter = CostMeter(self.raw)
        self.meter.attach(client)
        self.messages = 0
        management = aws._management_client(ENDPOINT, REGION)
        management.meta.events.register(
            "before-call.apigatewaymanagementapi.PostToConnection", self._count_message
        )
        self.context = LocalContext(function_name="bench", timeout_seconds=60)
        self.api = aws.InProcessApi(self.context)
        self.aws = aws
        self.invocations = 0

    def _count_message(self, params: dict[str, Any], **_: Any) -> None:
        # Billed per 32 KB of a message.
        self.messages += max(1, -(-len(params["body"]) // 32_768))

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        status, reply = self.api(path, body)
        if status not in (200, 454):
            raise RuntimeError(f"{path}: {status} {reply}")
        return reply

    def queue(self) -> str:
        name = f"bench-{uuid.uuid4().hex[:8]}"
        self.call("/v1/queues.create", {"queue_name": name, "lease_timeout": "5m", "expire_timeout": "24h"})
        return name

    def produce(self, queue: str, count: int) -> list[dict[str, Any]]:
        """Produce ``count`` 100-byte items; returns their INSERT records, as DynamoDB Streams would
        give them (the keys, read back through the un-metered client)."""
        self.call("/v1/queue.produce", {"queue_name": queue, "items": [{"utf8": "x" * 100}] * count})
        records = []
        for page in self.raw.get_paginator("scan").paginate(TableName="items"):
            for row in page["Items"]:
                key = (row["pk"]["S"], row["sk"]["S"])
                if key in self.seen or not key[0].startswith(f"{queue}~") or key[1].startswith("~"):
                    continue
                self.seen.add(key)
                records.append(
                    {"eventName": "INSERT", "dynamodb": {"Keys": {"pk": row["pk"], "sk": row["sk"]}}}
                )
        return records

    def message(self, connection: str, body: dict[str, Any]) -> None:
        self.invocations += 1
        event = {
            "requestContext": {"routeKey": "$default", "connectionId": connection},
            "body": json.dumps(body),
        }
        self.aws.websocket_event(event, self.context)

    def dispatch(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        self.invocations += 1
        return self.aws.dispatch_event({"Records": records}, self.context)

    def frames(self, connection: str) -> list[dict[str, Any]]:
        from moto.apigatewaymanagementapi.models import apigatewaymanagementapi_backends  # noqa: PLC0415
        from moto.core.models import DEFAULT_ACCOUNT_ID  # noqa: PLC0415

        held = apigatewaymanagementapi_backends[DEFAULT_ACCOUNT_ID][REGION].connections[connection]
        data, held.data = held.data.decode(), b""
        decoder, found, position = json.JSONDecoder(), [], 0
        while position < len(data):
            frame, position = decoder.raw_decode(data, position)
            found.append(frame)
        return found

    def start(self) -> None:
        self.meter.reset()
        self.messages = 0
        self.invocations = 0

    def figures(self, path: str, batch: int, items: int) -> Figures:
        snapshot = self.meter.snapshot()
        return Figures(
            path, batch, items, snapshot.requests, snapshot.write_units, snapshot.read_units,
            self.invocations, self.messages,
        )  # fmt: skip


def _leased_ids(frames: list[dict[str, Any]]) -> list[str]:
    return [item["id"] for frame in frames if frame["type"] == "lease" for item in frame["items"]]


def arrival(bench: Bench, batch: int, rounds: int) -> Figures:
    queue, connection = bench.queue(), f"arrival{batch}"
    bench.message(connection, {"type": "subscribe", "queue_name": queue, "credit": batch})
    bench.frames(connection)
    bench.start()
    for _ in range(rounds):
        records = _unmetered(bench, lambda: bench.produce(queue, batch))
        bench.dispatch(records)
        ids = _leased_ids(bench.frames(connection))
        if len(ids) != batch:
            raise RuntimeError(f"the dispatcher pushed {len(ids)} items, not {batch}")
        bench.message(connection, {"type": "complete", "request_id": "c", "partition": 0, "ids": ids})
        bench.frames(connection)
    return bench.figures("stream, items arriving at an idle queue", batch, batch * rounds)


def backlog(bench: Bench, batch: int, rounds: int) -> Figures:
    queue, connection = bench.queue(), f"backlog{batch}"
    for _ in range(rounds):
        bench.produce(queue, batch)
    bench.message(connection, {"type": "subscribe", "queue_name": queue, "credit": batch})
    ids = _leased_ids(bench.frames(connection))
    bench.start()
    done = 0
    while ids:
        bench.message(connection, {"type": "complete", "request_id": "c", "partition": 0, "ids": ids})
        done += len(ids)
        ids = _leased_ids(bench.frames(connection))
    return bench.figures("stream, a backlog", batch, done)


def long_poll(bench: Bench, batch: int, rounds: int) -> Figures:
    queue = bench.queue()
    for _ in range(rounds):
        bench.produce(queue, batch)
    bench.start()
    done = 0
    for _ in range(rounds):
        reply = bench.call(
            "/v1/queue.lease",
            {"queue_name": queue, "batch_size": batch, "client_id": "poll", "request_timeout": "0s"},
        )
        ids = [item["id"] for item in reply["items"]]
        bench.call("/v1/queue.complete", {"queue_name": queue, "partition": 0, "ids": ids})
        bench.invocations += 2
        done += len(ids)
    return bench.figures("HTTP lease + complete", batch, done)


def _unmetered(bench: Bench, action: Any) -> Any:
    """Run ``action`` (the producer's part) and take its requests back out of the meter's totals."""
    before = bench.meter.snapshot()
    result = action()
    after = bench.meter.snapshot()
    bench.meter._requests.subtract(
        {
            op: after.requests_by_operation.get(op, 0) - before.requests_by_operation.get(op, 0)
            for op in after.requests_by_operation
        }
    )
    bench.meter._write_units -= after.write_units - before.write_units
    bench.meter._read_units -= after.read_units - before.read_units
    return result


def report(rows: list[Figures]) -> str:
    lines = [
        "Per delivered item (100 B), the consumer's side only (produce not counted):",
        "",
        "| path | batch | DynamoDB requests | write units | read units | Lambda invocations | WS messages |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        cells = (
            f"{row.per_item(row.requests):.2f}",
            f"{row.per_item(row.write_units):.2f}",
            f"{row.per_item(row.read_units):.2f}",
            f"{row.per_item(row.invocations):.3f}",
            f"{row.per_item(row.messages):.3f}",
        )
        lines.append(f"| {row.path} | {row.batch} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="batches per case (default 20)")
    args = parser.parse_args(argv)
    started = datetime.now(timezone.utc)
    rows = []
    with mock_aws():
        bench = Bench()
        for batch in (1, 10, 100):
            rows.append(arrival(bench, batch, args.rounds))
            rows.append(backlog(bench, batch, args.rounds))
            rows.append(long_poll(bench, batch, args.rounds))
    print(report(rows))
    print(
        f"\n({args.rounds} rounds per case; {started:%Y-%m-%d}; moto in process, units by benchmarks.meter)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
