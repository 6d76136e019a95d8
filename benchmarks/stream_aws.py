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
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import boto3
from moto import mock_aws

from benchmarks.idle import CHOSEN_MB, MONTH, call_seconds, lambda_cost
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
#: The REST API's requests (the long-poll path): $3.50 per million.
PRICE_REST_REQUEST = 3.50 / 1e6


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
    #: CPU seconds the invocations took in this process (for Lambda's duration).
    cpu: float = 0.0

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
        self.cpu = 0.0

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

    def message(self, connection: str, body: dict[str, Any] | None, route: str = "$default") -> None:
        self.invocations += 1
        event = {
            "requestContext": {"routeKey": route, "connectionId": connection},
            "body": None if body is None else json.dumps(body),
        }
        started = time.process_time()
        self.aws.websocket_event(event, self.context)
        self.cpu += time.process_time() - started

    def dispatch(self, records: list[dict[str, Any]] | None) -> dict[str, Any]:
        """The dispatcher with stream records, or (``None``) its scheduled sweep."""
        self.invocations += 1
        started = time.process_time()
        result = self.aws.dispatch_event({"Records": records} if records is not None else {}, self.context)
        self.cpu += time.process_time() - started
        return result

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
        self.cpu = 0.0

    def figures(self, path: str, batch: int, items: int) -> Figures:
        snapshot = self.meter.snapshot()
        return Figures(
            path, batch, items, snapshot.requests, snapshot.write_units, snapshot.read_units,
            self.invocations, self.messages, self.cpu,
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
    body = {"queue_name": queue, "batch_size": batch, "client_id": "poll", "request_timeout": "0s"}
    for _ in range(rounds):
        started = time.process_time()
        reply = bench.call("/v1/queue.lease", body)
        ids = [item["id"] for item in reply["items"]]
        bench.call("/v1/queue.complete", {"queue_name": queue, "partition": 0, "ids": ids})
        bench.cpu += time.process_time() - started
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


#: API Gateway ends a WebSocket connection after 2 hours and one idle for 10 minutes: the client
#: reconnects every 2 hours and pings after 9 minutes without sending (``KEEPALIVE_SECONDS``).
RECONNECTS_A_MONTH = MONTH / 7200
PINGS_A_MONTH = MONTH / 540
SWEEPS_A_MONTH = MONTH / 60


def idle_month(bench: Bench) -> dict[str, Figures]:
    """One subscriber of an empty queue: a reconnect ($connect, subscribe, $disconnect), a ping, and
    a sweep with it as the only subscription (the sweep runs once a minute per stack)."""
    for batch in (1, 10, 100):  # the other cases' consumers leave: one subscriber, as described
        for name in (f"arrival{batch}", f"backlog{batch}"):
            bench.message(name, None, "$disconnect")
    queue, connection = bench.queue(), "idle"
    found = {}
    bench.start()
    bench.message(connection, None, "$connect")
    bench.message(connection, {"type": "subscribe", "queue_name": queue, "credit": 10})
    bench.message(connection, None, "$disconnect")
    found["reconnect"] = bench.figures("reconnect", 10, 1)
    bench.message(connection, {"type": "subscribe", "queue_name": queue, "credit": 10})
    bench.frames(connection)
    bench.start()
    bench.message(connection, {"type": "ping"})
    found["ping"] = bench.figures("ping", 10, 1)
    bench.start()
    bench.dispatch(None)
    found["sweep"] = bench.figures("sweep", 10, 1)
    return found


def _month_cost(calls: float, figures: Figures) -> tuple[float, float, float]:
    """Lambda, DynamoDB and API Gateway dollars of ``calls`` repetitions of what ``figures`` measured."""
    per_invocation = call_seconds(
        figures.cpu * 1000 / max(1, figures.invocations),
        figures.requests / max(1, figures.invocations),
        CHOSEN_MB,
    )
    invocations = figures.invocations * calls
    lam = lambda_cost(per_invocation * invocations, CHOSEN_MB, invocations)
    dynamo = calls * (figures.write_units * PRICE_WRITE_UNIT + figures.read_units * PRICE_READ_UNIT)
    return lam, dynamo, calls * figures.messages * PRICE_MESSAGE


def idle_report(found: dict[str, Figures]) -> str:
    lines = [
        "One idle stream consumer for a month (a 1-partition queue; stream functions at 256 MB):",
        "",
        "| part | times a month | Lambda $ | DynamoDB $ | API Gateway $ |",
        "|---|---:|---:|---:|---:|",
    ]
    total = [0.0, 0.0, 0.0]
    for name, calls in (
        ("reconnect", RECONNECTS_A_MONTH),
        ("ping", PINGS_A_MONTH),
        ("sweep", SWEEPS_A_MONTH),
    ):
        cost = _month_cost(calls, found[name])
        total = [a + b for a, b in zip(total, cost, strict=True)]
        lines.append(f"| {name} | {calls:,.0f} | {cost[0]:.4f} | {cost[1]:.4f} | {cost[2]:.4f} |")
    minutes = MONTH / 60 * PRICE_CONNECTION_MINUTE
    lines.append(f"| connection minutes | {MONTH / 60:,.0f} | | | {minutes:.4f} |")
    lines.append(f"| **total** | | {total[0]:.4f} | {total[1]:.4f} | {total[2] + minutes:.4f} |")
    lines.append("")
    lines.append(f"Total: ${sum(total) + minutes:.3f} a month.")
    for name, figures in found.items():
        lines.append(
            f"{name}: {figures.invocations} invocation(s), {figures.requests} DynamoDB requests, "
            f"{figures.write_units:.1f} write and {figures.read_units:.1f} read units, "
            f"{figures.messages} message(s), {figures.cpu * 1000:.0f} ms CPU here"
        )
    return "\n".join(lines)


def million_report(rows: list[Figures]) -> str:
    lines = [
        "A million delivered items (100 B), the consumer's side (produce is the same either way):",
        "",
        "| path | batch | Lambda $ | DynamoDB $ | API Gateway $ | total $ |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        per_call = call_seconds(
            row.cpu * 1000 / max(1, row.invocations), row.requests / max(1, row.invocations), CHOSEN_MB
        )
        invocations = row.per_item(row.invocations) * 1e6
        lam = lambda_cost(per_call * invocations, CHOSEN_MB, invocations)
        dynamo = 1e6 * (
            row.per_item(row.write_units) * PRICE_WRITE_UNIT + row.per_item(row.read_units) * PRICE_READ_UNIT
        )
        gateway = 1e6 * row.per_item(row.messages) * PRICE_MESSAGE
        if row.path.startswith("HTTP"):
            gateway = invocations * PRICE_REST_REQUEST
        total = lam + dynamo + gateway
        lines.append(f"| {row.path} | {row.batch} | {lam:.2f} | {dynamo:.2f} | {gateway:.2f} | {total:.2f} |")
    return "\n".join(lines)


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
        idle = idle_month(bench)
    print(report(rows))
    print()
    print(million_report(rows))
    print()
    print(idle_report(idle))
    print(
        f"\n({args.rounds} rounds per case; {started:%Y-%m-%d}; moto in process, units by benchmarks.meter)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
