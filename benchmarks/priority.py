"""DynamoDB cost per delivered item with priorities, beside plain FIFO.

Run ``uv run python -m benchmarks.priority`` (``--count N`` items per case, default 1,000).

Method: ``benchmarks.cost.run_case`` (the real ``QueueService`` on a single-threaded moto server,
every request metered by ``benchmarks.meter.CostMeter`` with AWS's unit rules): ``count`` items of
100 B produced in requests of ``batch``, then leased ``batch`` at a time and completed, on a fresh
one-partition queue per case. The cases differ only in the items' priorities:

* ``fifo``: every item of priority 5 (the default; the keys and costs of before priorities);
* ``one band``: every item of priority 2 (one band other than 5's in use);
* ``ten bands``: item ``n`` has priority ``n % 10`` (every band in use, each produce touching all).

Timings on moto mean nothing, so none are printed.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from benchmarks.cost import PHASES, metered_service, run_case, use_fake_credentials
from querator.testing import moto_server_process

if TYPE_CHECKING:
    from collections.abc import Callable

    from benchmarks.cost import CaseResult

PAYLOAD_BYTES = 100
BATCHES = (10, 100)
CASES: dict[str, Callable[[int], int] | None] = {
    "fifo": None,
    "one band": lambda n: 2,
    "ten bands": lambda n: n % 10,
}


def measure(endpoint: str, *, count: int) -> list[tuple[str, CaseResult]]:
    metered = metered_service(endpoint)
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
            )
            if result.duplicates or result.missing:
                raise RuntimeError(
                    f"{case} x{batch}: {result.duplicates} duplicates, {result.missing} missing"
                )
            results.append((case, result))
    return results


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
    args = parser.parse_args(argv)
    use_fake_credentials()
    with moto_server_process() as endpoint:
        results = measure(endpoint, count=args.count)
    sys.stdout.write(format_report(results, args.count) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
