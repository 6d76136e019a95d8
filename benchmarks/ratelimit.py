"""Lease rate limits under 8 consumers: the rates achieved against the limits and their tolerance.

``uv run python -m benchmarks.ratelimit`` (about 70 s; ``--quick``: about 15 s) starts one
``querator serve`` (its default SQLite store, in a temporary directory; ``--url`` uses a running
server instead), creates a fair queue with ``rate_limit`` 20 and ``rate_limit_per_group`` 5
(``--rate``, ``--group-rate``), and produces into 10 groups: 3 "hot" groups with more items than
the run can lease, and 7 "small" groups that run dry about halfway. 8 consumer threads, each with
its own ``Client``, lease batches of 5 with a 2 s long-poll and complete what they get, for
``--duration`` seconds. So the run has two regimes: while the 10 groups have items, the queue's
limit binds (round-robin gives each group about 2 a second); once only the hot groups do, their
own limit binds (3 x 5 = 15 a second, under the queue's 20).

Every lease is timed by the server's clock (the item's ``lease_deadline`` minus the queue's
``lease_timeout``), so the figures are the limiter's, not the network's. Printed: leases a second
over the run and in 10-second windows, for the queue and each group; the most leases in any window
of 1 s and of 10 s against the stated bound (``rate * T + burst``, the burst one second's worth:
docs/adr/0081-lease-rate-limits.md); items leased twice or never (must be 0). The run fails
(exit 1) when a bound is broken, or when the queue's rate over its first regime is under 90% of
its limit (the consumers kept asking, so a limiter that under-delivers is a bug too).

``--cost`` measures instead what a limit adds to a lease call on DynamoDB (moto in process, units by
``benchmarks.meter``): requests, write and read units of one lease of 10 against the same lease
without a limit, for a FIFO queue and a fair queue of 10 groups.

Bounded: the consumers stop at the deadline (a waiting lease ends within its 2 s wait), and the
server it started is stopped by its PID.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

from querator.client import Client, NewItem
from querator.testing import serve_child

LEASE_TIMEOUT: Final = timedelta(minutes=5)
CONSUMERS: Final = 8
BATCH: Final = 5
POLL: Final = "2s"
HOT_GROUPS: Final = 3
SMALL_GROUPS: Final = 7
#: The queue's rate over the first regime must reach this share of its limit.
MIN_SHARE: Final = 0.9


@dataclass
class Run:
    """What the consumers leased: per item id, (server time of the lease, group)."""

    leases: dict[str, tuple[datetime, str]] = field(default_factory=dict)
    twice: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


def consumer(url: str, queue: str, run: Run, stop_at: float, number: int) -> None:
    with Client(url, client_id=f"bench-{number}") as client:
        while time.monotonic() < stop_at:
            try:
                lease = client.lease(queue, BATCH, request_timeout=POLL)
            except Exception as error:
                with run.lock:
                    run.errors[type(error).__name__] += 1
                time.sleep(0.1)
                continue
            if not lease.items:
                continue
            with run.lock:
                for item in lease.items:
                    if item.id in run.leases:
                        run.twice += 1
                    assert item.lease_deadline is not None  # noqa: S101 - the API always sends it
                    run.leases[item.id] = (item.lease_deadline - LEASE_TIMEOUT, item.group)
            try:
                client.complete(queue, lease.items)
            except Exception as error:
                with run.lock:
                    run.errors[f"complete: {type(error).__name__}"] += 1


def most_in_window(times: list[float], window: float) -> int:
    """The most events in any half-open window of ``window`` seconds (two pointers over sorted times)."""
    best, start = 0, 0
    for end, at in enumerate(times):
        while times[start] <= at - window:
            start += 1
        best = max(best, end - start + 1)
    return best


def bound(rate: float, window: float) -> int:
    """The most a bucket of ``rate`` a second with a burst of one second's worth (at least one)
    hands out in ``window`` seconds."""
    return int(rate * window) + max(1, int(rate))


@dataclass
class Report:
    lines: list[str]
    ok: bool


def report(run: Run, *, rate: float, group_rate: float, duration: float, produced: int) -> Report:
    lines: list[str] = []
    ok = True
    if not run.leases:
        return Report(["nothing was leased"], False)
    start = min(at for at, _ in run.leases.values())
    by_group: dict[str, list[float]] = defaultdict(list)
    every: list[float] = []
    for at, group in run.leases.values():
        seconds = (at - start).total_seconds()
        by_group[group].append(seconds)
        every.append(seconds)
    every.sort()
    for times in by_group.values():
        times.sort()
    groups = sorted(by_group, key=lambda g: (not g.startswith("hot"), g))
    windows = max(1, int(duration // 10))

    lines.append(
        f"{CONSUMERS} consumers, batch {BATCH}, long-poll {POLL}; rate_limit {rate:g}/s, "
        f"rate_limit_per_group {group_rate:g}/s; {HOT_GROUPS} hot + {SMALL_GROUPS} small groups, "
        f"{produced} items; leases timed by the server's clock over {duration:.0f} s"
    )
    lines.append("")
    header = f"{'':14} {'leased':>7} {'per s':>7} {'limit':>6} " + " ".join(
        f"{f'{10 * w}-{10 * w + 10}s':>7}" for w in range(windows)
    )
    lines.append(header)
    lines.append("-" * len(header))

    def row(name: str, times: list[float], limit: float) -> str:
        per_window = [sum(1 for t in times if 10 * w <= t < 10 * w + 10) / 10 for w in range(windows)]
        cells = " ".join(f"{v:7.2f}" for v in per_window)
        return f"{name:14} {len(times):7d} {len(times) / duration:7.2f} {limit:6g} {cells}"

    lines.append(row("queue", every, rate))
    for group in groups:
        lines.append(row(group, by_group[group], group_rate))
    lines.append("")
    lines.append(f"{'most leased in any window':40} {'1 s':>10} {'10 s':>10}")
    checks = [("queue", every, rate)] + [(g, by_group[g], group_rate) for g in groups]
    for name, times, limit in checks:
        cells = []
        for window in (1.0, 10.0):
            most, allowed = most_in_window(times, window), bound(limit, window)
            ok = ok and most <= allowed
            cells.append(f"{most:4d} <= {allowed:<4d}" if most <= allowed else f"{most:4d} > {allowed:<4d}!")
        lines.append(f"{name:40} {cells[0]:>10} {cells[1]:>10}")
    # The first regime: while every group had items (until the first small group ran dry).
    small_ends = [by_group[g][-1] for g in groups if not g.startswith("hot") and by_group[g]]
    first_end = min(small_ends) if small_ends else every[-1]
    if first_end >= 3:
        # After the first second: a full bucket's burst (one second's worth) comes on top at the start.
        first = sum(1 for t in every if 1 <= t < first_end) / (first_end - 1)
        share = first / rate
        lines.append("")
        lines.append(
            f"queue while all {HOT_GROUPS + SMALL_GROUPS} groups had items (1 s to {first_end:.1f} s,"
            f" after the first second's burst): {first:.2f}/s = {share:.0%} of the limit"
            f" (want >= {MIN_SHARE:.0%})"
        )
        ok = ok and share >= MIN_SHARE
    lines.append(f"leased twice: {run.twice}; errors: {dict(run.errors) or 0}")
    ok = ok and run.twice == 0 and not run.errors
    return Report(lines, ok)


@dataclass(frozen=True)
class CostCase:
    name: str
    fair: bool
    fields: dict[str, float]
    #: Leases made before the one measured (to empty a bucket, or to fill this process's view).
    before: int = 0
    groups: int = 10


COST_CASES: Final = (
    CostCase("fifo, no limit", False, {}),
    CostCase("fifo, rate_limit 100", False, {"rate_limit": 100}),
    CostCase("fifo, rate_limit 10, bucket seen empty", False, {"rate_limit": 10}, before=1),
    CostCase("fair 10 groups, no limit", True, {}),
    CostCase("fair 10 groups, rate_limit 100", True, {"rate_limit": 100}),
    CostCase("fair 10 groups, per group 100", True, {"rate_limit_per_group": 100}),
    CostCase("fair 10 groups, both", True, {"rate_limit": 100, "rate_limit_per_group": 100}),
    CostCase("fair 10 groups, per group 1, all seen empty", True, {"rate_limit_per_group": 1}, before=1),
    # The same lease among 20 times the groups (each of which leased once before, so has a bucket).
    CostCase(
        "fair 200 groups, per group 100, 20 leases before", True, {"rate_limit_per_group": 100}, 20, 200
    ),
)


def measure_cost() -> list[tuple[str, int, dict[str, int], float, float]]:
    """One lease of 10 per case, metered: (case, items, requests by operation, WCU, RCU)."""
    from moto import mock_aws  # noqa: PLC0415 - a test dependency, only this mode needs it

    from benchmarks.meter import CostMeter  # noqa: PLC0415
    from querator.domain.errors import NothingToLeaseError  # noqa: PLC0415
    from querator.domain.model import NewItem as DomainItem  # noqa: PLC0415
    from querator.domain.model import QueueInfo  # noqa: PLC0415
    from querator.testing import FakeClock, build_service, dynamodb_client  # noqa: PLC0415

    rows = []
    with mock_aws():
        clock = FakeClock()
        client, raw = dynamodb_client(), dynamodb_client()
        meter = CostMeter(raw)
        meter.attach(client)
        service = build_service(client, clock=clock)
        for number, case in enumerate(COST_CASES):
            name = f"cost-{number}"
            service.create_queue(
                QueueInfo(
                    name=name,
                    lease_timeout=timedelta(minutes=1),
                    expire_timeout=timedelta(hours=1),
                    delivery="fair" if case.fair else "fifo",
                    created_at=clock.now(),
                    updated_at=clock.now(),
                    **case.fields,  # type: ignore[arg-type]
                )
            )
            groups = [f"g{g}" for g in range(case.groups)] if case.fair else [""]
            produced = [
                DomainItem(payload=b"x" * 100, group=groups[n % len(groups)]) for n in range(4 * case.groups)
            ]
            for start in range(0, len(produced), 1000):
                service.produce(name, produced[start : start + 1000])
            clock.advance(timedelta(seconds=2))
            for _ in range(case.before):
                service.lease(name, batch_size=10, client_id="warm", timeout=timedelta(0))
            meter.reset()
            try:
                items = len(service.lease(name, batch_size=10, client_id="c", timeout=timedelta(0)).items)
            except NothingToLeaseError:  # held back by a limit: nothing leased is the figure
                items = 0
            cost = meter.snapshot()
            rows.append(
                (case.name, items, dict(cost.requests_by_operation), cost.write_units, cost.read_units)
            )
    return rows


def print_cost() -> int:
    rows = measure_cost()
    print("One lease of 10 (items of 100 B), DynamoDB (moto in process), metered by benchmarks.meter")
    print(f"{'case':46} {'items':>5} {'requests':>8} {'UpdateItem':>10} {'WCU':>6} {'RCU':>6}")
    for name, items, ops, wcu, rcu in rows:
        updates = ops.get("UpdateItem", 0)
        line = f"{name:46} {items:5d} {sum(ops.values()):8d} {updates:10d} {wcu:6.1f} {rcu:6.1f}"
        print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.ratelimit", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of leasing (default 60)")
    parser.add_argument("--quick", action="store_true", help="a 12 s run (the smoke test's)")
    parser.add_argument("--rate", type=float, default=20.0, help="rate_limit, leases a second")
    parser.add_argument("--group-rate", type=float, default=5.0, help="rate_limit_per_group")
    parser.add_argument("--url", help="a running querator serve (default: start one)")
    parser.add_argument("--cost", action="store_true", help="measure DynamoDB's cost of a limit instead")
    args = parser.parse_args(argv)
    if args.cost:
        return print_cost()
    duration = 12.0 if args.quick else args.duration
    if args.url:
        return run_against(args.url, args.rate, args.group_rate, duration)
    with serve_child() as child:
        return run_against(child.url, args.rate, args.group_rate, duration)


def run_against(url: str, rate: float, group_rate: float, duration: float) -> int:
    queue = f"ratelimit-{uuid.uuid4().hex[:8]}"
    # Enough for the hot groups to outlast the run at their limit; the small ones run dry about
    # halfway, when round-robin has given each about rate / 10 a second.
    hot = int(group_rate * duration) + 50
    small = max(1, int(rate / (HOT_GROUPS + SMALL_GROUPS) * duration / 2))
    with Client(url) as client:
        client.create_queue(
            queue,
            lease_timeout=LEASE_TIMEOUT,
            expire_timeout="1h",
            delivery="fair",
            rate_limit=rate,
            rate_limit_per_group=group_rate,
        )
        plan = [(f"hot-{g}", hot) for g in range(HOT_GROUPS)] + [
            (f"small-{g}", small) for g in range(SMALL_GROUPS)
        ]
        produced = 0
        for group, count in plan:
            for start in range(0, count, 500):
                n = min(500, count - start)
                client.produce(
                    queue, [NewItem(payload=f"{group} {start + i}", group=group) for i in range(n)]
                )
                produced += n
    run = Run()
    stop_at = time.monotonic() + duration
    threads = [
        threading.Thread(target=consumer, args=(url, queue, run, stop_at, n), daemon=True)
        for n in range(CONSUMERS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=duration + 30)
    result = report(run, rate=rate, group_rate=group_rate, duration=duration, produced=produced)
    print("\n".join(result.lines))
    print("\nresult:", "OK" if result.ok else "FAILED")
    with Client(url) as client:
        client.delete_queue(queue)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
