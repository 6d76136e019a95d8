"""Engine v3's operations at the sizes users run, beside engine v2's (DESIGN.md, storage point 7).

Run ``uv run python -m benchmarks.engine_v3`` (the full sizes: 68 minutes here, 40 of them filling
v3's 100,000 held items), ``--quick`` (small sizes, about a minute), ``--json PATH`` to keep the
figures; ``--held``, ``--stored`` and ``--partitions`` choose the sizes. Every case runs through
the product's service (``QueueService``; engine v3 with ``DynamoDBClaimLog``, passed explicitly
whatever ``querator.config.DEFAULT_ENGINE`` says) on moto in-process, one fresh mock a case, and
meters one call at a time with ``benchmarks.meter.CostMeter`` (DynamoDB's published unit rules:
moto is only the functional store, its timings are not AWS's). The queue catalog (PynamoDB, one
read a call, the same for both engines) is not metered, as in ``benchmarks.engine``. Printed per
call: read units, write units and requests, and what the call did.

behind N items held in valid leases
    N items of 1,000 B, leased in leases of 10 (1 h) and all still held, and 10 more waiting
    (v3: produced 1,000 a call, then claimed 10 a call with the log's own ``ClaimLog.claim``,
    the claim a service lease makes, so the head keeps 32 records and spills the rest to rows;
    ``--fill lease`` leases through the service instead, which moto takes about four times as
    long over: 210 s for 10,000 held here, against 57 s; v2: written straight into the table as
    its leases leave them, ``benchmarks.engine.fill_valid_leases``). Then, metered: one reaper run, one
    ``queue.stats``, one lease of 10 and its complete through another service instance (the
    deployed stack's lease and items functions share no memory). ``found``: items the lease got.
over N stored items, none or 1 % due
    N items of 100 B waiting in one partition, produced 1,000 a call
    (``benchmarks.engine.fill_stored``); for "1 %", N/100 of them an ``expire_timeout`` earlier,
    so they are due to be dead-lettered. Metered: one reaper run (and how many it dead-lettered),
    one ``queue.stats``, one lease of 10 (and how many it found).
idle reaper pass
    a queue of P partitions whose items were all leased and completed: one reaper run over it,
    nothing due; the cost per partition is the difference between P and one partition over P - 1.

The time each fill took is printed with its row (moto's and this machine's, not AWS's).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from moto import mock_aws

from benchmarks.cost import use_fake_credentials
from benchmarks.engine import HOUR, Bench, fill_stored, fill_valid_leases
from querator.domain.errors import NothingToLeaseError
from querator.domain.model import NewItem
from querator.ports.log import LogKey
from querator.testing import FakeClock

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from querator.service import QueueService

T = TypeVar("T")

HELD = (100_000,)
STORED = (1_000_000,)
PARTITIONS = 10
QUICK_HELD = (2_000,)
QUICK_STORED = (20_000,)
QUICK_PARTITIONS = 4
DUE_FRACTIONS = (0.0, 0.01)
BATCH = 10
#: A reaper run's budget: more than any run here takes, so a run stops by itself, not by the clock.
REAP_BUDGET = timedelta(minutes=10)


@dataclass(frozen=True)
class Cost:
    """What one metered call cost."""

    read_units: float = 0.0
    write_units: float = 0.0
    requests: int = 0


@dataclass(frozen=True)
class BehindLeases:
    engine: int
    held: int
    fill: str
    fill_seconds: float
    reap: Cost
    stats: Cost
    #: What ``queue.stats`` said is leased (the held items).
    stats_leased: int
    lease: Cost
    found: int
    complete: Cost
    completed: int


@dataclass(frozen=True)
class OverStored:
    engine: int
    stored: int
    due: int
    fill_seconds: float
    reap: Cost
    #: Items the reaper run dead-lettered (or dropped: the queue has no dead-letter queue).
    reaped: int
    stats: Cost
    #: What ``queue.stats`` counted after the reaper run.
    stats_total: int
    lease: Cost
    found: int


@dataclass(frozen=True)
class IdlePass:
    engine: int
    partitions: int
    reap: Cost


@dataclass(frozen=True)
class Report:
    behind: list[BehindLeases]
    stored: list[OverStored]
    idle: list[IdlePass]


def metered(bench: Bench, call: Callable[[], T]) -> tuple[T, Cost]:
    """``call``'s result and what its requests through the metered client cost."""
    bench.meter.reset()
    result = call()
    snap = bench.meter.snapshot()
    return result, Cost(snap.read_units, snap.write_units, snap.requests)


@contextmanager
def lighter_moto() -> Iterator[None]:
    """moto's DynamoDB without the two costs that grow with the whole table, as its own requests.

    moto backs a ``TransactWriteItems`` up by deep-copying the table once per item of it, so a spill
    of 16 lease records (33 items) in a table of 100,000 items copies it 33 times; and a ``Query``
    walks every item of the table, then sizes every item of the partition, before its key
    condition picks any. Either makes a fill of 100,000 leases take hours. While this is in force a
    transaction backs up only the items it touches (and puts them back when it is cancelled: the same
    outcome, a transaction writes only its own items), and a query of the table (no index) is given
    only the partition's items its key condition admits, which moto then sorts, pages and limits as
    before. Requests and replies are unchanged, and so are the meter's units.
    """
    from moto.dynamodb import models  # noqa: PLC0415 - moto's internals, only while patched
    from moto.dynamodb.models import table as tables  # noqa: PLC0415

    backend_class, table_class = models.DynamoDBBackend, tables.Table
    transact, query = backend_class.transact_write_items, table_class.query

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        saved: list[tuple[str, dict[str, Any], Any]] = []
        for entry in transact_items:
            _, op = next(iter(entry.items()))
            table_name = op.get("TableName")
            if table_name not in self.tables:
                continue
            table = self.tables[table_name]
            if "Key" in op:
                key = op["Key"]
            else:
                attrs = op["Item"]
                key = {table.hash_key_attr: attrs[table.hash_key_attr]}
                if table.range_key_attr is not None:
                    key[table.range_key_attr] = attrs[table.range_key_attr]
            before = self.get_item(table_name, key)
            saved.append((table_name, key, None if before is None else before.to_json()["Attributes"]))

        def no_table_copy(value: Any, *args: Any) -> Any:
            return value if isinstance(value, table_class) else copy.deepcopy(value, *args)

        # moto's module calls ``copy.deepcopy``: for this call, a ``copy`` that leaves tables alone.
        vars(models)["copy"] = _Namespace(deepcopy=no_table_copy)
        try:
            transact(self, transact_items)
        except Exception:
            for table_name, key, attrs in reversed(saved):
                self.delete_item(table_name, key)
                if attrs is not None:
                    self.put_item(table_name, copy.deepcopy(attrs))
            raise
        finally:
            vars(models)["copy"] = copy

    def partition_query(
        self: Any, hash_key: Any, range_comparison: Any, range_objs: Any, *args: Any, **kwargs: Any
    ) -> Any:
        index_name = args[4] if len(args) > 4 else kwargs.get("index_name")
        if index_name or hash_key is None or not self.range_key_attr or hash_key not in self.items:
            return query(self, hash_key, range_comparison, range_objs, *args, **kwargs)
        admits = _string_range(range_comparison, range_objs)
        partition = {
            sort_key: item
            for sort_key, item in self.items[hash_key].items()
            if admits is None or admits(item.range_key)
        }
        everything = self.items
        self.items = {hash_key: partition}
        try:
            return query(self, hash_key, range_comparison, range_objs, *args, **kwargs)
        finally:
            self.items = everything

    backend_class.transact_write_items = transact_write_items  # type: ignore[method-assign]
    table_class.query = partition_query  # type: ignore[method-assign]
    try:
        yield
    finally:
        backend_class.transact_write_items = transact  # type: ignore[method-assign]
        table_class.query = query  # type: ignore[method-assign]


def _string_range(comparison: str | None, objs: Sequence[Any]) -> Callable[[Any], bool] | None:
    """A fast test of a string sort key against a key condition on strings, or ``None`` (admit
    every item: moto's own test still applies)."""
    if comparison is None or not objs or any(o.type != "S" for o in objs):
        return None
    values = [o.value for o in objs]
    tests: dict[str, Callable[[str], bool]] = {
        "BETWEEN": lambda v: values[0] <= v <= values[-1],
        "BEGINS_WITH": lambda v: v.startswith(values[0]),
        "EQ": lambda v: v == values[0],
        "=": lambda v: v == values[0],
        "LT": lambda v: v < values[0],
        "<": lambda v: v < values[0],
        "LE": lambda v: v <= values[0],
        "<=": lambda v: v <= values[0],
        "GT": lambda v: v > values[0],
        ">": lambda v: v > values[0],
        "GE": lambda v: v >= values[0],
        ">=": lambda v: v >= values[0],
    }
    test = tests.get(comparison.upper())
    if test is None:
        return None
    return lambda key: key is None or key.type != "S" or test(key.value)


class _Namespace:
    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


# -- behind N held leases ---------------------------------------------------------------------------


def hold_v3(bench: Bench, held: int, payload: bytes, *, via: str) -> None:
    """``held`` items of queue ``q`` produced 1,000 a call and leased ``BATCH`` a call (``via``:
    ``lease``, the service's lease; ``claim``, the log's ``ClaimLog.claim``), then ``BATCH`` more
    produced, waiting."""
    clock = bench.clock
    for start in range(0, held, 1000):
        bench.setup.produce("q", [NewItem(payload=payload) for _ in range(min(1000, held - start))])
    clock.advance(timedelta(seconds=2))
    log = bench.setup.log
    assert log is not None  # noqa: S101 - an engine 3 bench
    key = LogKey("q", 0)
    for _ in range(held // BATCH):
        if via == "lease":
            got = len(bench.setup.lease("q", batch_size=BATCH, client_id="filler").items)
        else:
            now = clock.now()
            got = len(log.claim(key, count=BATCH, deadline=now + HOUR, now=now).items)
        if got != BATCH:
            raise RuntimeError(f"a lease while filling got {got} items, not {BATCH}")
    clock.advance(timedelta(seconds=2))
    bench.setup.produce("q", [NewItem(payload=payload) for _ in range(BATCH)])
    clock.advance(timedelta(seconds=2))


def lease_one(service: QueueService) -> tuple[int, list[str]]:
    """One lease of ``BATCH`` from ``q``: its partition and ids (none for a 454)."""
    try:
        lease = service.lease("q", batch_size=BATCH, client_id="measured")
    except NothingToLeaseError:
        return 0, []
    return lease.partition, [item.id for item in lease.items]


def behind_leases(engine: int, held: int, *, via: str = "claim") -> BehindLeases:
    bench = Bench(FakeClock(), engine=engine)
    bench.queue("q")
    payload = b"x" * 1000
    started = time.perf_counter()
    if engine == 2:
        fill = "rows written raw"
        fill_valid_leases(bench, held, payload)
    else:
        fill = "service leases" if via == "lease" else "ClaimLog.claim"
        hold_v3(bench, held, payload, via=via)
    fill_seconds = time.perf_counter() - started
    _, reap = metered(bench, lambda: bench.metered.reap(bench.clock.now(), REAP_BUDGET))
    stats, stats_cost = metered(bench, lambda: bench.metered.stats("q"))
    (partition, ids), lease = metered(bench, lambda: lease_one(bench.metered))
    other = bench.service()
    outcome, complete = metered(bench, lambda: other.complete("q", partition, ids))
    return BehindLeases(
        engine=engine,
        held=held,
        fill=fill,
        fill_seconds=fill_seconds,
        reap=reap,
        stats=stats_cost,
        stats_leased=sum(s.total_leased for s in stats),
        lease=lease,
        found=len(ids),
        complete=complete,
        completed=len(outcome.applied),
    )


# -- over N stored items ----------------------------------------------------------------------------


def over_stored(engine: int, stored: int, due_fraction: float) -> OverStored:
    bench = Bench(FakeClock(), engine=engine)
    due = int(stored * due_fraction)
    started = time.perf_counter()
    fill_stored(bench, stored, due)
    fill_seconds = time.perf_counter() - started
    report, reap = metered(bench, lambda: bench.metered.reap(bench.clock.now(), REAP_BUDGET))
    stats, stats_cost = metered(bench, lambda: bench.metered.stats("q"))
    (_, ids), lease = metered(bench, lambda: lease_one(bench.metered))
    return OverStored(
        engine=engine,
        stored=stored,
        due=due,
        fill_seconds=fill_seconds,
        reap=reap,
        reaped=report.deleted + report.dead_lettered,
        stats=stats_cost,
        stats_total=sum(s.total for s in stats),
        lease=lease,
        found=len(ids),
    )


# -- an idle queue's reaper pass --------------------------------------------------------------------


def idle_pass(engine: int, partitions: int) -> IdlePass:
    """A reaper run over a queue of ``partitions`` whose every partition held items, all leased and
    completed since: nothing is due."""
    bench = Bench(FakeClock(), engine=engine)
    bench.queue("q", partitions=partitions)
    service = bench.setup
    for partition in range(partitions):
        # The producer picks a partition; produce until each has had items (bounded).
        for _ in range(50 * partitions):
            if any(s.partition == partition and s.total for s in service.stats("q")):
                break
            service.produce("q", [NewItem(payload=b"z" * 100) for _ in range(BATCH)])
    while True:
        try:
            lease = service.lease("q", batch_size=100, client_id="drain")
        except NothingToLeaseError:
            break
        service.complete("q", lease.partition, [item.id for item in lease.items])
    if any(s.total for s in service.stats("q")):
        raise RuntimeError("the idle queue still holds items")
    bench.clock.advance(timedelta(seconds=2))
    _, reap = metered(bench, lambda: bench.metered.reap(bench.clock.now(), REAP_BUDGET))
    return IdlePass(engine=engine, partitions=partitions, reap=reap)


# -- the run -----------------------------------------------------------------------------------------


def measure(
    *,
    held: Sequence[int],
    stored: Sequence[int],
    partitions: int,
    via: str = "claim",
    engines: Sequence[int] = (3, 2),
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Every case on each engine (v3 first), each in a moto mock of its own (its memory goes with
    it)."""
    use_fake_credentials()
    say = progress or (lambda _: None)
    report = Report(behind=[], stored=[], idle=[])
    with lighter_moto():
        for n in held:
            for engine in engines:
                with mock_aws():
                    report.behind.append(behind_leases(engine, n, via=via))
                say(f"behind {n:,} held, v{engine}: {report.behind[-1]}")
        for n in stored:
            for fraction in DUE_FRACTIONS:
                for engine in engines:
                    with mock_aws():
                        report.stored.append(over_stored(engine, n, fraction))
                    say(f"over {n:,} stored, {fraction:.0%} due, v{engine}: {report.stored[-1]}")
        for engine in engines:
            for p in sorted({1, partitions}):
                with mock_aws():
                    report.idle.append(idle_pass(engine, p))
                say(f"idle pass, {p} partition(s), v{engine}: {report.idle[-1]}")
    return report


def per_partition(report: Report, engine: int) -> Cost | None:
    """An idle reaper pass's cost per partition: the slope between the fewest and most partitions."""
    runs = sorted((r for r in report.idle if r.engine == engine), key=lambda r: r.partitions)
    if len(runs) < 2:
        return None
    low, high = runs[0], runs[-1]
    span = high.partitions - low.partitions
    return Cost(
        (high.reap.read_units - low.reap.read_units) / span,
        (high.reap.write_units - low.reap.write_units) / span,
        round((high.reap.requests - low.reap.requests) / span),
    )


def _units(cost: Cost) -> str:
    return f"{cost.read_units:,.1f} | {cost.write_units:,.0f} | {cost.requests:,}"


def format_report(report: Report) -> str:
    lines = [
        "### Engine v3 beside v2 at depth: one call's read units, write units and requests",
        "",
        f"One reaper run, one `queue.stats`, one lease of {BATCH} and its complete (another instance),"
        f" behind N items of 1,000 B held in valid leases of {BATCH} (one partition):",
        "",
        "| engine | held | fill | fill s | reaper RCU | WCU | req | stats RCU | WCU | req | leased"
        " | lease RCU | WCU | req | found | complete RCU | WCU | req | completed |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for b in report.behind:
        lines.append(
            f"| v{b.engine} | {b.held:,} | {b.fill} | {b.fill_seconds:,.0f} | {_units(b.reap)} |"
            f" {_units(b.stats)} | {b.stats_leased:,} | {_units(b.lease)} | {b.found} |"
            f" {_units(b.complete)} | {b.completed} |"
        )
    lines += [
        "",
        f"One reaper run, one `queue.stats` and one lease of {BATCH} over N items of 100 B waiting"
        " in one partition, of them `due` past `expire_timeout` (the lease after the reaper run):",
        "",
        "| engine | stored | due | fill s | reaper RCU | WCU | req | reaped | stats RCU | WCU | req"
        " | counted | lease RCU | WCU | req | found |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in report.stored:
        lines.append(
            f"| v{s.engine} | {s.stored:,} | {s.due:,} | {s.fill_seconds:,.0f} | {_units(s.reap)} |"
            f" {s.reaped:,} | {_units(s.stats)} | {s.stats_total:,} | {_units(s.lease)} | {s.found} |"
        )
    lines += [
        "",
        "One reaper run over an idle queue (every item leased and completed; nothing due):",
        "",
        "| engine | partitions | reaper RCU | WCU | req |",
        "|---|---|---|---|---|",
    ]
    for engine in sorted({r.engine for r in report.idle}, reverse=True):
        for r in (r for r in report.idle if r.engine == engine):
            lines.append(f"| v{engine} | {r.partitions} | {_units(r.reap)} |")
        slope = per_partition(report, engine)
        if slope is not None:
            lines.append(f"| v{engine} | per partition | {_units(slope)} |")
    lines += [
        "",
        "RCU, WCU: read and write units by DynamoDB's published rules (`benchmarks.meter`), catalog"
        " reads not counted; req: DynamoDB requests; fill s: seconds the case's fill took on moto.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"small sizes: {QUICK_HELD[0]:,} held, {QUICK_STORED[0]:,} stored,"
        f" {QUICK_PARTITIONS} partitions",
    )
    parser.add_argument("--held", type=int, nargs="*", help=f"items held in leases (default {HELD[0]:,})")
    parser.add_argument("--stored", type=int, nargs="*", help=f"items stored (default {STORED[0]:,})")
    parser.add_argument("--partitions", type=int, help=f"the idle queue's partitions (default {PARTITIONS})")
    parser.add_argument(
        "--fill",
        choices=("lease", "claim"),
        default="claim",
        help="v3's held leases: with ClaimLog.claim (default) or through the service's lease",
    )
    parser.add_argument("--engine", type=int, nargs="*", choices=(2, 3), help="engines to run (default both)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures to PATH")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    report = measure(
        held=args.held if args.held is not None else (QUICK_HELD if args.quick else HELD),
        stored=args.stored if args.stored is not None else (QUICK_STORED if args.quick else STORED),
        partitions=args.partitions or (QUICK_PARTITIONS if args.quick else PARTITIONS),
        via=args.fill,
        engines=args.engine or (3, 2),
        progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True),
    )
    print(format_report(report))
    print(f"\n(took {time.perf_counter() - started:,.0f} s)")
    if args.json is not None:
        args.json.write_text(json.dumps({"benchmark": "engine_v3", **asdict(report)}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
