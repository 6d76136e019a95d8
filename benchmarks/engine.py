"""What the operations that used to grow with a queue's contents cost now (docs/adr/0050-engine-v2.md).

Run ``uv run python -m benchmarks.engine`` (``--quick`` for small sizes, ``--json PATH`` to keep the
figures). Workloads, each on a fresh queue of one partition in moto in-process (units from AWS's
rules by ``benchmarks.meter``; moto is only the functional store, its timings are not AWS's):

lease behind N valid leases
    N items of 1,000 B are leased (1 h leases), 10 more are produced, and one lease of 10 is
    metered: read units, requests, and whether it found the 10. The valid leases are written
    straight into the table as the engine leaves them (leased items; for v2 the head row's cursor
    past them), because leasing 100,000 items through an engine that reads every valid lease on
    each call would take hours.
reaper run over N stored items, none or 1 % due
    N items of 100 B; for "1 %", N/100 of them were produced an ``expire_timeout`` earlier. One
    reaper run is metered; so are one ``queue.stats`` call and then one lease of 10, with the N
    items not due ready (``--reaper-sizes 1000000``: the sizes users run).
expiry to leasable
    a 1 s lease runs out on the system clock while a consumer polls every 20 ms: the time from the
    deadline to the consumer holding the item again, with no reaper running.

The module uses only ``QueueService``'s public methods and the storage codec, so the same file
measures the engine before v2: run it with the earlier ``src`` first on ``PYTHONPATH`` and
``--label v1`` (the ADR quotes both). Candidate C (a sparse index of available items,
``benchmarks.candidates.ModelC``) is measured for the lease workload: its lease reads only the index.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moto import mock_aws

from benchmarks.candidates import ModelC
from benchmarks.cost import use_fake_credentials
from benchmarks.meter import CostMeter
from querator.domain.errors import NothingToLeaseError
from querator.domain.ids import IdFactory
from querator.domain.model import Item, NewItem, QueueInfo
from querator.service import QueueService
from querator.storage.dynamodb import codec, schema
from querator.storage.dynamodb.store import DynamoDBItemStore
from querator.testing import FakeClock, SystemClock, build_service, dynamodb_client

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

    from benchmarks.meter import CostSnapshot

LEASE_SIZES = (4_000, 20_000, 100_000)
REAPER_SIZES = (5_000, 50_000, 500_000)
QUICK_LEASE_SIZES = (4_000,)
QUICK_REAPER_SIZES = (5_000,)
HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class LeaseBehind:
    model: str
    valid_leases: int
    found: int
    read_units: float
    requests: int


@dataclass(frozen=True)
class ReaperRun:
    stored: int
    due: int
    reap_read_units: float
    reap_write_units: float
    reap_requests: int
    dead_lettered: int
    stats_read_units: float
    stats_requests: int
    #: One lease of 10 after the reaper run, with the stored items not due ready behind it.
    lease_found: int = 0
    lease_read_units: float = 0.0
    lease_requests: int = 0


@dataclass(frozen=True)
class EngineReport:
    label: str
    lease: list[LeaseBehind]
    reaper: list[ReaperRun]
    expiry_to_leasable_ms: list[float]


def _store(client: DynamoDBClient, table: str) -> DynamoDBItemStore:
    try:
        # One write at a time: moto in-process is not safe for concurrent requests.
        return DynamoDBItemStore(client, table, concurrency=1)
    except TypeError:  # the engine before v2 wrote one at a time anyway
        return DynamoDBItemStore(client, table)


def _service(client: DynamoDBClient, clock: Any, engine: int) -> QueueService:
    try:
        return build_service(client, clock=clock, engine=engine)
    except TypeError:  # the engines before v3 had no choice to make
        if engine != 2:
            raise
        return build_service(client, clock=clock)


class Bench:
    """Two services over the same tables: one for setting up, one metered for the measured call.

    ``engine``: 2 (the item store alone) or 3 (with engine v3's claim log on the same table,
    ``benchmarks.engine_v3``), whatever ``querator.config.DEFAULT_ENGINE`` says.
    """

    def __init__(self, clock: Any, *, engine: int = 2) -> None:
        self.clock = clock
        self.engine = engine
        self.setup_client = dynamodb_client()
        self.client = dynamodb_client()
        self.setup = _service(self.setup_client, clock, engine)
        self.items_table = self.setup.store._table  # type: ignore[attr-defined,unused-ignore]
        self.meter = CostMeter(dynamodb_client())
        self.meter.attach(self.client)
        self.metered = self.service()

    def service(self) -> QueueService:
        """Another service instance over the same tables through the metered client (a Lambda of
        another function, say: it shares no process state with ``metered``)."""
        if self.engine == 2:
            return QueueService(
                catalog=self.setup.catalog, store=_store(self.client, self.items_table), clock=self.clock
            )
        # Imported here: the engine before v2 (``--label v1``) has no claim log.
        from querator.storage.dynamodb.log import DynamoDBClaimLog  # noqa: PLC0415

        return QueueService(
            catalog=self.setup.catalog,
            store=_store(self.client, self.items_table),
            clock=self.clock,
            log=DynamoDBClaimLog(self.client, self.items_table, concurrency=1),
        )

    def queue(self, name: str, **fields: Any) -> None:
        now = self.clock.now()
        fields.setdefault("lease_timeout", HOUR)
        fields.setdefault("expire_timeout", 2 * HOUR)
        self.setup.create_queue(QueueInfo(name=name, created_at=now, updated_at=now, **fields))

    def write_raw(self, rows: list[dict[str, Any]]) -> None:
        for start in range(0, len(rows), 25):
            pending: Any = [{"PutRequest": {"Item": r}} for r in rows[start : start + 25]]
            while pending:
                reply = self.setup_client.batch_write_item(RequestItems={self.items_table: pending})
                pending = reply.get("UnprocessedItems", {}).get(self.items_table, [])


def metered_lease(bench: Bench) -> tuple[int, CostSnapshot]:
    """One lease of 10 from queue ``q``, metered: the items it found (0 for a 454) and its cost."""
    bench.meter.reset()
    try:
        found = len(bench.metered.lease("q", batch_size=10, client_id="c").items)
    except NothingToLeaseError:
        found = 0
    return found, bench.meter.snapshot()


def fill_valid_leases(bench: Bench, valid: int, payload: bytes) -> None:
    """``valid`` items of queue ``q`` validly leased (1 h), written straight into the table as
    engine v2 leaves them, then 10 more produced, ready to lease."""
    clock = bench.clock
    now = clock.now()
    ids = IdFactory().new_ids(now, valid)
    bench.write_raw(
        [
            codec.encode_item(
                "q",
                0,
                Item(
                    id=i,
                    payload=payload,
                    attempts=1,
                    lease_deadline=now + HOUR,
                    expire_deadline=now + 2 * HOUR,
                    created_at=now,
                ),
            )
            for i in ids
        ]
    )
    head_sk = getattr(schema, "HEAD_SK", None)
    if head_sk is not None:  # v2: the cursor a lease of these items would have left past them
        bench.write_raw(
            [
                {
                    schema.PK: {"S": schema.partition_key("q", 0)},
                    schema.SK: {"S": head_sk},
                    "cur": {"S": f"{ids[-1]}0"},
                    "n": {"N": str(valid)},
                    "nl": {"N": str(valid)},
                }
            ]
        )
    clock.advance(timedelta(seconds=2))
    bench.setup.produce("q", [NewItem(payload=payload) for _ in range(10)])
    clock.advance(timedelta(seconds=2))


def lease_behind(valid: int) -> LeaseBehind:
    clock = FakeClock()
    bench = Bench(clock)
    bench.queue("q")
    fill_valid_leases(bench, valid, b"x" * 1000)
    found, cost = metered_lease(bench)
    return LeaseBehind("product", valid, found, cost.read_units, cost.requests)


def lease_behind_model_c(valid: int) -> LeaseBehind:
    client = dynamodb_client()
    model = ModelC(client, f"cand-c-{valid}")
    model.create_table()
    model.produce([b"x" * 1000 for _ in range(valid)])
    while sum(1 for _ in model.lease(1000)) == 1000:
        pass
    model.produce([b"x" * 1000 for _ in range(10)])
    meter = CostMeter(dynamodb_client())
    metered = ModelC(dynamodb_client(), model.table)
    meter.attach(metered.client)
    found = len(metered.lease(10))
    cost = meter.snapshot()
    return LeaseBehind("C (sparse index)", valid, found, cost.read_units, cost.requests)


def fill_stored(bench: Bench, stored: int, due: int) -> None:
    """Queue ``q`` (``expire_timeout`` 1 h) with ``stored`` items of 100 B produced through the
    service, 1,000 a call: the first ``due`` of them an ``expire_timeout`` earlier than the rest."""
    clock = bench.clock
    bench.queue("q", expire_timeout=HOUR, lease_timeout=timedelta(minutes=5))
    payload = b"y" * 100
    for start in range(0, due, 1000):
        bench.setup.produce("q", [NewItem(payload=payload) for _ in range(min(1000, due - start))])
    clock.advance(HOUR + timedelta(minutes=1))
    for start in range(due, stored, 1000):
        bench.setup.produce("q", [NewItem(payload=payload) for _ in range(min(1000, stored - start))])
    clock.advance(timedelta(seconds=2))


def reaper_run(stored: int, due_fraction: float, *, engine: int = 2) -> ReaperRun:
    clock = FakeClock()
    bench = Bench(clock, engine=engine)
    due = int(stored * due_fraction)
    fill_stored(bench, stored, due)
    bench.meter.reset()
    report = bench.metered.reap(clock.now(), timedelta(minutes=10))
    reap = bench.meter.snapshot()
    bench.meter.reset()
    bench.metered.stats("q")
    stats = bench.meter.snapshot()
    found, lease = metered_lease(bench)
    return ReaperRun(
        stored=stored,
        due=due,
        reap_read_units=reap.read_units,
        reap_write_units=reap.write_units,
        reap_requests=reap.requests,
        dead_lettered=report.deleted + report.dead_lettered,
        stats_read_units=stats.read_units,
        stats_requests=stats.requests,
        lease_found=found,
        lease_read_units=lease.read_units,
        lease_requests=lease.requests,
    )


def expiry_to_leasable(samples: int) -> list[float]:
    """Milliseconds from a lease's deadline to a polling consumer holding the item again."""
    clock = SystemClock()
    bench = Bench(clock)
    bench.queue("q", lease_timeout=timedelta(seconds=1))
    found: list[float] = []
    for _ in range(samples):
        bench.setup.produce("q", [NewItem(payload=b"z")])
        leased = bench.setup.lease("q", batch_size=1, client_id="first").items[0]
        assert leased.lease_deadline is not None  # noqa: S101 - a lease always sets it
        deadline = leased.lease_deadline.timestamp()
        for _ in range(500):  # bounded: 10 s of polling at most
            try:
                again = bench.setup.lease("q", batch_size=1, client_id="second").items[0]
            except NothingToLeaseError:
                time.sleep(0.02)
                continue
            found.append((time.time() - deadline) * 1000)
            bench.setup.complete("q", 0, [again.id])
            break
    return found


def measure(*, quick: bool, label: str, reaper_sizes: list[int] | None = None) -> EngineReport:
    use_fake_credentials()
    lease_sizes = QUICK_LEASE_SIZES if quick else LEASE_SIZES
    sizes = reaper_sizes or (QUICK_REAPER_SIZES if quick else REAPER_SIZES)
    with mock_aws():
        lease = []
        for n in lease_sizes:
            lease.append(lease_behind(n))
            print(f"  lease behind {n}: {lease[-1]}", file=sys.stderr, flush=True)
        if label != "v1":
            for n in lease_sizes[:2]:
                lease.append(lease_behind_model_c(n))
                print(f"  model C behind {n}: {lease[-1]}", file=sys.stderr, flush=True)
        reaper = []
        for n in sizes:
            for fraction in (0.0, 0.01):
                reaper.append(reaper_run(n, fraction))
                print(f"  reaper {n} {fraction}: {reaper[-1]}", file=sys.stderr, flush=True)
        latency = expiry_to_leasable(3 if quick else 7)
    return EngineReport(label=label, lease=lease, reaper=reaper, expiry_to_leasable_ms=latency)


def format_report(report: EngineReport) -> str:
    lines = [
        f"### Engine ({report.label}): costs that used to grow with what a queue holds",
        "",
        "One lease of 10 behind N valid leases of 1,000 B items (one partition):",
        "",
        "| model | valid leases | items found | read units | requests |",
        "|---|---|---|---|---|",
    ]
    for r in report.lease:
        model = report.label if r.model == "product" else r.model
        lines.append(f"| {model} | {r.valid_leases:,} | {r.found} | {r.read_units:,.1f} | {r.requests} |")
    lines += [
        "",
        "One reaper run, one `queue.stats` call and one lease of 10 over N stored items of 100 B (one"
        " partition; the lease after the run, with the items not due ready):",
        "",
        "| stored | due | reaper read units | reaper write units | reaper requests | dead-lettered"
        " | stats read units | stats requests | lease: found | read units | requests |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in report.reaper:
        lines.append(
            f"| {run.stored:,} | {run.due:,} | {run.reap_read_units:,.1f} | {run.reap_write_units:,.0f} |"
            f" {run.reap_requests:,} | {run.dead_lettered:,} | {run.stats_read_units:,.1f} |"
            f" {run.stats_requests} | {run.lease_found} | {run.lease_read_units:,.1f} |"
            f" {run.lease_requests} |"
        )
    if report.expiry_to_leasable_ms:
        median = statistics.median(report.expiry_to_leasable_ms)
        lines += [
            "",
            f"Expiry to leasable (no reaper, a consumer polling every 20 ms): median {median:.0f} ms,"
            f" max {max(report.expiry_to_leasable_ms):.0f} ms over {len(report.expiry_to_leasable_ms)}"
            " leases.",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="the smallest size of each workload")
    parser.add_argument("--label", default="v2", help="what the report calls the engine measured")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    parser.add_argument(
        "--reaper-sizes",
        type=int,
        nargs="*",
        help="stored items of the reaper runs (default: 5,000 to 500,000)",
    )
    args = parser.parse_args(argv)
    report = measure(quick=args.quick, label=args.label, reaper_sizes=args.reaper_sizes)
    print(format_report(report))
    if args.json:
        args.json.write_text(json.dumps(asdict(report), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
