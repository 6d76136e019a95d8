"""Engine v3's claim log on DynamoDB (``DynamoDBClaimLog``) through issue 35's workloads, v2 beside it.

    uv run python -m benchmarks.cost_v3 [--quick] [--json PATH]

Each workload produces its items with ``append`` in batches, then its consumers ``claim`` a batch
and ``settle`` it at once (produce -> lease -> complete) until nothing is left, on a moto server on
127.0.0.1, metered by ``benchmarks.meter.CostMeter`` (DynamoDB's published unit rules). v2 runs the
same workload through ``QueueService`` (``benchmarks.candidates_v3``'s runner). Printed per delivered
item: requests, write and read units, failed conditional writes per leased item, one partition's
ceiling and $ per million as ``benchmarks.candidates_v3`` computes them, and issue 35's targets.

The depth case: one lease of 10 (and its complete) right after 4,000 items of 100 B were produced
and leased in tens as fast as the store takes them, all still held (issue 35: <= 20 read units;
``--quick``: 1,000 for v3, 400 for v2).
The log is measured without a service above it: a service's catalog reads (one per call, the same
for any model) are left out of v2's figures too.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.candidates_v3 import (
    TARGETS,
    WORKLOADS,
    DepthRun,
    Figures,
    Report,
    Workload,
    depth_v2,
    figures_of,
    figures_table,
    identity,
    run_v2,
    tagged_payload,
)
from benchmarks.cost import metered_service, use_fake_credentials
from benchmarks.meter import CostMeter
from querator.domain.model import Item
from querator.ports import Guard
from querator.ports.log import Claim, LogKey, Settlement
from querator.storage.dynamodb import schema
from querator.storage.dynamodb.log import DynamoDBClaimLog
from querator.storage.dynamodb.log.base import _Found
from querator.testing import dynamodb_client, moto_server_process

if TYPE_CHECKING:
    from collections.abc import Sequence

UTC = timezone.utc
COUNT = 300
QUICK_COUNT = 40
CONTENTION_COUNT = 400
QUICK_CONTENTION_COUNT = 100
DEPTH = 4000
#: The depth cases under ``--quick``: filling 4,000 takes moto minutes (it copies the whole table
#: for each transaction and serializes every row it returns); the full run does 4,000 for both.
QUICK_DEPTH = 1000
QUICK_V2_DEPTH = 400
LEASE = timedelta(minutes=30)
EXPIRE = timedelta(hours=1)
NAME = "v3"


@dataclass
class Log:
    """A claim log on its own table of the moto server, metered; ``unmetered`` is the same log
    through a client the meter does not see (to fill a case quickly: the meter peeks at every
    write and query, which on moto costs as much as the call)."""

    log: DynamoDBClaimLog
    meter: CostMeter
    key: LogKey
    unmetered: DynamoDBClaimLog


class _Holder(DynamoDBClaimLog):
    """Claims that do not read their rows: the depth case's filling only needs the leases held
    (moto serializes a row of 100 items slowly enough to make a 4,000-item fill take minutes)."""

    def _guess(self, key: LogKey, head: Any, taken: int) -> Any:
        return _Found(), 0

    def _finish_claim(
        self,
        key: LogKey,
        record: Any,
        tombstones: Any,
        deadline: datetime,
        now: datetime,
        *,
        read: Any = None,
    ) -> Claim:
        return Claim(token=record.token, deadline=deadline)


def build(endpoint: str) -> Log:
    client = dynamodb_client(endpoint, max_pool=32)
    table = f"cost-v3-{secrets.token_hex(4)}"
    schema.create_tables(client, items_table=table, catalog_table=f"{table}-catalog")
    meter = CostMeter(dynamodb_client(endpoint, max_pool=32))
    meter.attach(client)
    meter.reset()
    key = LogKey(f"bench-{secrets.token_hex(3)}", 0)
    unmetered = _Holder(dynamodb_client(endpoint, max_pool=32), table)
    return Log(DynamoDBClaimLog(client, table), meter, key, unmetered)


def now() -> datetime:
    return datetime.now(UTC)


def produce(log: Log, payloads: Sequence[bytes], *, metered: bool = True) -> None:
    at = now()
    items = [Item(id="", payload=p, expire_deadline=at + EXPIRE, created_at=at) for p in payloads]
    (log.log if metered else log.unmetered).append(log.key, items, now=at)


def drain(log: Log, *, consumers: int, batch: int, limit: int) -> Counter[str]:
    """``consumers`` threads claim ``batch`` and settle it at once until three claims in a row
    find nothing (bounded by ``limit`` claims each)."""
    delivered: Counter[str] = Counter()
    lock = threading.Lock()

    def work() -> None:
        empty = 0
        for _ in range(limit):
            at = now()
            claim = log.log.claim(log.key, count=batch, deadline=at + LEASE, now=at)
            if not claim.items:
                empty += 1
                if empty == 3:
                    return
                continue
            empty = 0
            log.log.settle(
                log.key, [Settlement(id=i.id) for i in claim.items], guard=Guard.LEASE_VALID, now=now()
            )
            with lock:
                delivered.update(identity(i.payload) for i in claim.items)

    threads = [threading.Thread(target=work, name=f"consumer-{n}") for n in range(consumers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return delivered


def run_v3(endpoint: str, workload: Workload, count: int) -> Figures:
    log = build(endpoint)
    started = time.perf_counter()
    produced: list[str] = []
    for start in range(0, count, workload.batch):
        payloads = [tagged_payload(workload.payload) for _ in range(min(workload.batch, count - start))]
        produce(log, payloads)
        produced += [identity(p) for p in payloads]
    delivered = drain(log, consumers=workload.consumers, batch=workload.batch, limit=count)
    return figures_of(
        NAME, workload, produced, delivered, log.meter.snapshot(), time.perf_counter() - started
    )


def depth_v3(endpoint: str, held: int) -> DepthRun:
    log = build(endpoint)
    for _ in range(0, held + 10, 100):
        produce(log, [tagged_payload(100) for _ in range(100)], metered=False)
    for _ in range(held // 10):
        at = now()
        if not log.unmetered.claim(log.key, count=10, deadline=at + LEASE, now=at).token:
            raise RuntimeError("nothing to claim while filling")
    log.meter.reset()
    at = now()
    claim = log.log.claim(log.key, count=10, deadline=at + LEASE, now=at)
    reads = log.meter.snapshot().read_units
    log.log.settle(log.key, [Settlement(id=i.id) for i in claim.items], guard=Guard.LEASE_VALID, now=now())
    spent = log.meter.snapshot()
    return DepthRun(NAME, held, reads, spent.write_units, spent.requests, len(claim.items))


def measure(
    endpoint: str,
    *,
    count: int = COUNT,
    contention_count: int = CONTENTION_COUNT,
    workloads: Sequence[Workload] = WORKLOADS,
    depth: int = DEPTH,
    v2_depth: int = DEPTH,
) -> Report:
    # The depth cases first: moto copies every table for each transaction, so they fill faster on
    # an empty server.
    runs = [depth_v3(endpoint, depth), depth_v2(endpoint, v2_depth)] if depth else []
    metered = metered_service(endpoint, engine=2)
    figures: list[Figures] = []
    for workload in workloads:
        n = max(workload.batch, count if workload.consumers == 1 else contention_count)
        figures.append(run_v2(metered, workload, n))
        figures.append(run_v3(endpoint, workload, n))
    return Report(figures=figures, episodes=[], count=count, contention_count=contention_count, depth=runs)


def format_report(report: Report) -> str:
    lines = figures_table(report, title="Engine v3 (DynamoDBClaimLog) against v2", column="store", width=5)
    if report.depth:
        lines += [
            "",
            "One lease of 10 (RCU: the lease; WCU, requests: lease and complete) right after <held> items",
            "of 100 B were produced and leased in tens as fast as the store takes them, all still held:",
            f"{'store':<5} | {'held':>6} {'RCU':>6} {'WCU':>6} {'requests':>8} | {'leased':>6}",
        ]
        for d in report.depth:
            lines.append(
                f"{d.candidate:<5} | {d.held:>6,} {d.read_units:>6.1f} {d.write_units:>6.0f}"
                f" {d.requests:>8} | {d.delivered:>6}"
            )
    width = max(len(t.label) for t in TARGETS)
    lines += ["", "Issue 35's targets (value, + met / - not met):"]
    lines.append(f"{'target':<{width}} | " + " | ".join(f"{c:>10}" for c in report.candidates))
    for target in TARGETS:
        cells = []
        for c in report.candidates:
            try:
                value, met = target.check(report, c)
            except StopIteration:
                cells.append(f"{'n/a':>10}")
                continue
            cells.append(f"{value:>8.2f} {'+' if met else '-'}")
        lines.append(f"{target.label:<{width}} | " + " | ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_COUNT} items per case, at least a batch ({QUICK_CONTENTION_COUNT} with consumers);"
        f" depth cases at {QUICK_DEPTH} (v3) and {QUICK_V2_DEPTH} (v2)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures to PATH")
    args = parser.parse_args(argv)
    use_fake_credentials()
    count = QUICK_COUNT if args.quick else COUNT
    contention = QUICK_CONTENTION_COUNT if args.quick else CONTENTION_COUNT
    with moto_server_process() as endpoint:
        report = measure(
            endpoint,
            count=count,
            contention_count=contention,
            depth=QUICK_DEPTH if args.quick else DEPTH,
            v2_depth=QUICK_V2_DEPTH if args.quick else DEPTH,
        )
    print(format_report(report))
    if args.json is not None:
        document = {
            "benchmark": "cost_v3",
            "count": count,
            "contention_count": contention,
            "figures": [
                {
                    **asdict(f),
                    "write_units_per_item": f.write_units_per_item,
                    "read_units_per_item": f.read_units_per_item,
                    "requests_per_item": f.requests_per_item,
                    "failed_per_leased": f.failed_per_leased,
                    "ceiling": f.ceiling,
                    "dollars_per_million": f.dollars,
                    "dollars_per_million_rest": f.dollars_rest,
                }
                for f in report.figures
            ],
            "depth": [asdict(d) for d in report.depth],
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    broken = [f"{f.candidate} {f.workload.name}" for f in report.figures if not f.exactly_once]
    if broken:
        print(f"delivery broken in: {', '.join(broken)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
