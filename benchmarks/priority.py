"""DynamoDB cost per delivered item with priorities, beside plain FIFO.

Run ``uv run python -m benchmarks.priority`` (``--count N`` items per case, default 1,000).

Method: ``benchmarks.cost.run_case`` (the real ``QueueService`` on a single-threaded moto server,
every request metered by ``benchmarks.meter.CostMeter`` with AWS's unit rules): ``count`` items of
100 B produced in requests of ``batch``, then leased ``batch`` at a time and completed, on a fresh
one-partition queue per case. The cases differ only in the items' priorities:

* ``fifo``: every item of priority 5 (the default; the keys and costs of before priorities);
* ``one band``: every item of priority 2 (one band other than 5's in use);
* ``ten bands``: item ``n`` has priority ``n % 10`` (every band in use, each produce touching all).
* ``fifo, grouped``: priority 5, every item with a 12-byte group of 100 tenants (``tenant-00042``):
  what carrying a group costs a FIFO queue.
* ``fair, 100 groups``: the same items in a ``delivery: "fair"`` queue (round-robin across groups);
* ``fair, 100 groups, cap 5``: with ``max_leased_per_group`` 5.

``--groups N`` adds three metered leases of 10 from a fair queue whose N groups each hold 10 ready
items of 1,000 B (moto in process): what a lease costs with many groups.

``--depth N`` adds the lease at depth: N valid leases of 1,000 B items of priority 1 ahead (written
straight into the table, with the head row a lease of them would have left), then 10 ready items of
priority 7; one lease of 10, metered (moto in process).

``--fair-depth N`` adds the fair lease at depth: a fair queue whose 1,000 groups hold N valid leases
of 1,000 B between them (written straight into the table), then 10 ready items each; three leases of
10, metered, once with each lane's cursor past its leased items (where the leases left it) and once
with every cursor at its lane's start (every cursor write after those leases lost; moto in process).
``--fair-ready R`` gives each group R ready items instead of 10 in the first case (900 with
``--fair-depth 100000``: 1,000,000 stored, 100,000 of them in flight).

Timings on moto mean nothing, so none are printed.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING

from moto import mock_aws

from benchmarks.cost import PHASES, metered_service, run_case, use_fake_credentials
from benchmarks.engine import HOUR, Bench
from querator.config import DEFAULT_ENGINE
from querator.domain.groups import group_lane
from querator.domain.ids import IdFactory
from querator.domain.model import Item, NewItem
from querator.domain.priority import DEFAULT_PRIORITY, lane_of
from querator.storage.dynamodb import codec, schema
from querator.testing import FakeClock, moto_server_process

if TYPE_CHECKING:
    from collections.abc import Callable

    from benchmarks.cost import CaseResult

PAYLOAD_BYTES = 100
BATCHES = (10, 100)
CASES: dict[str, Callable[[int], int] | None] = {
    "fifo": None,
    "one band": lambda n: 2,
    "ten bands": lambda n: n % 10,
    "fifo, grouped": None,
    "fair, 100 groups": None,
    "fair, 100 groups, cap 5": None,
}
#: Cases whose items carry a group: 100 tenants, a 12-byte group each (``tenant-00042``).
GROUPS: dict[str, Callable[[int], str]] = {
    case: lambda n: f"tenant-{n % 100:05d}"
    for case in ("fifo, grouped", "fair, 100 groups", "fair, 100 groups, cap 5")
}
#: The groups of ``--fair-depth``'s queue.
FAIR_DEPTH_GROUPS = 1000
#: Fair cases: (delivery, max_leased_per_group).
FAIR: dict[str, tuple[str, int]] = {"fair, 100 groups": ("fair", 0), "fair, 100 groups, cap 5": ("fair", 5)}


def measure(endpoint: str, *, count: int, engine: int = DEFAULT_ENGINE) -> list[tuple[str, CaseResult]]:
    metered = metered_service(endpoint, engine=engine)
    results = []
    for index, (case, priority_of) in enumerate(CASES.items()):
        for batch in BATCHES:
            # Same name length in every case: the queue name is part of every key.
            name = f"prio-{index}-{batch:04d}"
            result = run_case(
                metered,
                payload_bytes=PAYLOAD_BYTES,
                batch=batch,
                count=count,
                queue_name=name,
                priority_of=priority_of,
                group_of=GROUPS.get(case),
                delivery=FAIR.get(case, ("fifo", 0))[0],
                max_leased_per_group=FAIR.get(case, ("fifo", 0))[1],
            )
            if result.duplicates or result.missing:
                raise RuntimeError(
                    f"{case} x{batch}: {result.duplicates} duplicates, {result.missing} missing"
                )
            results.append((case, result))
    return results


def lease_at_depth(valid: int) -> tuple[int, float, int]:
    """Items leased, read units and requests of one lease of 10 priority-7 items behind ``valid``
    valid leases of priority 1 (moto in process; call inside ``mock_aws``)."""
    clock = FakeClock()
    bench = Bench(clock)
    bench.queue("q")
    now = clock.now()
    ids = IdFactory().new_ids(now, valid, 1)
    payload = b"x" * 1000
    leased = Item(
        id="",
        payload=payload,
        attempts=1,
        lease_deadline=now + HOUR,
        expire_deadline=now + 2 * HOUR,
        created_at=now,
    )
    bench.write_raw([codec.encode_item("q", 0, replace(leased, id=i)) for i in ids])
    bench.write_raw(
        [
            {
                schema.PK: {"S": schema.partition_key("q", 0)},
                schema.SK: {"S": schema.HEAD_SK},
                schema.band_attribute(schema.HEAD_BAND_REGISTERED, ".1"): codec.num(now),
                schema.band_attribute(schema.HEAD_CURSOR, ".1"): {"S": f"{ids[-1]}0"},
                schema.HEAD_ITEMS: {"N": str(valid)},
                schema.HEAD_LEASED: {"N": str(valid)},
            }
        ]
    )
    clock.advance(timedelta(seconds=2))
    bench.setup.produce("q", [NewItem(payload=payload, priority=7) for _ in range(10)])
    clock.advance(timedelta(seconds=2))
    bench.meter.reset()
    found = len(bench.metered.lease("q", batch_size=10, client_id="c").items)
    cost = bench.meter.snapshot()
    return found, cost.read_units, cost.requests


def _three_leases(bench: Bench) -> list[tuple[int, float, int]]:
    """Items leased, read units and requests of each of three metered leases of 10 in a row."""
    leases = []
    for _ in range(3):
        bench.meter.reset()
        found = len(bench.metered.lease("q", batch_size=10, client_id="c").items)
        cost = bench.meter.snapshot()
        leases.append((found, cost.read_units, cost.requests))
    return leases


def lease_with_groups(groups: int, per_group: int = 10) -> list[tuple[int, float, int]]:
    """Items leased, read units and requests of each of three leases of 10 from a fair queue whose
    ``groups`` groups each hold ``per_group`` ready items of 1,000 B (moto in process; call inside
    ``mock_aws``)."""
    clock = FakeClock()
    bench = Bench(clock)
    bench.queue("q", delivery="fair")
    payload = b"x" * 1000
    items = [
        NewItem(payload=payload, group=f"tenant-{g:05d}") for g in range(groups) for _ in range(per_group)
    ]
    for start in range(0, len(items), 1000):
        bench.setup.produce("q", items[start : start + 1000])
    clock.advance(timedelta(seconds=2))
    return _three_leases(bench)


def lease_fair_at_depth(
    valid: int, groups: int, *, cursors_moved: bool = True, ready: int = 10
) -> list[tuple[int, float, int]]:
    """Items leased, read units and requests of each of three leases of 10 from a fair queue whose
    ``groups`` groups hold ``valid`` valid leases of 1,000 B between them (written straight into the
    table) and then ``ready`` ready items each (produced through the service). ``cursors_moved``: each
    group lane's cursor stands past its leased items, where the leases that claimed them left it;
    else at the lane's start, as when every cursor write after those leases failed (the worst a lane
    read can meet). Moto in process; call inside ``mock_aws``."""
    clock = FakeClock()
    bench = Bench(clock)
    bench.queue("q", delivery="fair")
    now = clock.now()
    payload = b"x" * 1000
    ids = IdFactory()
    last_leased: dict[str, str] = {}
    rows = []
    for g in range(groups):
        group = f"tenant-{g:05d}"
        lane = group_lane(group)
        held = valid // groups + (1 if g < valid % groups else 0)
        lane_ids = ids.new_ids(now, held, DEFAULT_PRIORITY, lane=lane)
        leased = Item(
            id="",
            payload=payload,
            attempts=1,
            group=group,
            lease_deadline=now + HOUR,
            expire_deadline=now + 2 * HOUR,
            created_at=now,
        )
        rows += [codec.encode_item("q", 0, replace(leased, id=i)) for i in lane_ids]
        if lane_ids:
            last_leased[group] = lane_ids[-1]
    bench.write_raw(rows)
    clock.advance(timedelta(seconds=2))
    # A thousand at a time, each group's items in turn (as a busy producer would write them), so the
    # list of a million items never exists at once.
    for start in range(0, groups * ready, 1000):
        batch = range(start, min(start + 1000, groups * ready))
        bench.setup.produce("q", [NewItem(payload=payload, group=f"tenant-{n % groups:05d}") for n in batch])
    # What the leases of the valid items would have left on the partition: counted, and (when
    # cursors_moved) each lane's cursor just past its last leased item.
    head = codec.head_key("q", 0)
    bench.setup_client.update_item(
        TableName=bench.items_table,
        Key=head,
        UpdateExpression="ADD #n :v, #nl :v",
        ExpressionAttributeNames={"#n": schema.HEAD_ITEMS, "#nl": schema.HEAD_LEASED},
        ExpressionAttributeValues={":v": {"N": str(valid)}},
    )
    if cursors_moved:
        for last in last_leased.values():
            bench.setup_client.update_item(
                TableName=bench.items_table,
                Key=codec.lane_key("q", 0, lane_of(last)),
                UpdateExpression="SET #c = :c",
                ExpressionAttributeNames={"#c": schema.LANE_CURSOR},
                ExpressionAttributeValues={":c": {"S": last + "0"}},
            )
    clock.advance(timedelta(seconds=2))
    return _three_leases(bench)


def format_report(results: list[tuple[str, CaseResult]], count: int) -> str:
    lines = [
        f"Per delivered item, {count:,} items of {PAYLOAD_BYTES} B a case (produce -> lease -> complete):",
        "",
        "| case | batch | requests | write units | read units | produce WCU | lease RCU | lease requests |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case, result in results:
        lease_requests = result.phases["lease"].requests / result.delivered
        produce_wcu = result.per_item("write_units", "produce")
        lease_rcu = result.per_item("read_units", "lease")
        lines.append(
            f"| {case} | {result.batch} | {result.per_item('requests'):.2f}"
            f" | {result.per_item('write_units'):.2f} | {result.per_item('read_units'):.2f}"
            f" | {produce_wcu:.2f} | {lease_rcu:.2f} | {lease_requests:.2f} |"
        )
    lines += ["", f"(phases: {', '.join(PHASES)}; moto server; units by benchmarks.meter, AWS's rules)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=1000, help="items per case (default 1,000)")
    parser.add_argument("--depth", type=int, nargs="*", default=[], help="valid leases ahead (e.g. 100000)")
    parser.add_argument(
        "--groups", type=int, nargs="*", default=[], help="fair queue with N groups holding items"
    )
    parser.add_argument(
        "--fair-depth",
        type=int,
        nargs="*",
        default=[],
        help="valid leases held by a fair queue's 1,000 groups (e.g. 100000)",
    )
    parser.add_argument(
        "--fair-ready",
        type=int,
        default=10,
        help="ready items per group behind them, with the cursors past the leases (900: 1,000,000 stored"
        " with 100,000 in flight); the cursors-at-start rows keep 10",
    )
    args = parser.parse_args(argv)
    use_fake_credentials()
    if args.count:
        with moto_server_process() as endpoint:
            results = measure(endpoint, count=args.count)
        sys.stdout.write(format_report(results, args.count) + "\n")
    if args.depth:
        lines = [
            "",
            "One lease of 10 priority-7 items behind N valid leases of priority 1 (1,000 B items):",
            "",
            "| valid leases ahead | items leased | read units | requests |",
            "|---:|---:|---:|---:|",
        ]
        with mock_aws():
            for valid in args.depth:
                found, read_units, requests = lease_at_depth(valid)
                lines.append(f"| {valid:,} | {found} | {read_units:.1f} | {requests} |")
        sys.stdout.write("\n".join(lines) + "\n")
    if args.groups:
        lines = [
            "",
            "Leases of 10 from a fair queue whose N groups each hold 10 ready items (1,000 B):",
            "",
            "| groups | lease | items leased | read units | requests |",
            "|---:|---:|---:|---:|---:|",
        ]
        with mock_aws():
            for groups in args.groups:
                for n, (found, read_units, requests) in enumerate(lease_with_groups(groups), 1):
                    lines.append(f"| {groups:,} | {n} | {found} | {read_units:.1f} | {requests} |")
        sys.stdout.write("\n".join(lines) + "\n")
    if args.fair_depth:
        lines = [
            "",
            "Leases of 10 from a fair queue whose 1,000 groups hold N valid leases between them, then"
            " R ready items each (1,000 B):",
            "",
            "| valid leases | ready per group | stored | lane cursors | lease | items leased | read units"
            " | requests |",
            "|---:|---:|---:|---|---:|---:|---:|---:|",
        ]
        with mock_aws():
            for valid in args.fair_depth:
                for moved, label in ((True, "past the leases"), (False, "at the lanes' start")):
                    ready = args.fair_ready if moved else 10
                    leases = lease_fair_at_depth(valid, FAIR_DEPTH_GROUPS, cursors_moved=moved, ready=ready)
                    stored = valid + ready * FAIR_DEPTH_GROUPS
                    lines += [
                        f"| {valid:,} | {ready} | {stored:,} | {label} | {n} | {found} | {read_units:.1f}"
                        f" | {requests} |"
                        for n, (found, read_units, requests) in enumerate(leases, 1)
                    ]
        sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
