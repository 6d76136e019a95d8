"""Every measurement in one command: ``uv run python -m benchmarks`` (``--quick`` for a smaller run).

Prints one report and writes it to ``docs/benchmarks.md`` with the machine and the date, and
refreshes the generated part of ``docs/capacity.md`` from the measured units. The sections:

1. cost per delivered item, happy path: payload 100 B / 1 KB / 10 KB x batch 1 / 10 / 100
   (``benchmarks.cost``);
2. cost per item of the retry, lease-expiry and dead-letter paths (``benchmarks.paths``);
3. throughput of the service (in-process and over HTTP) against the raw DynamoDB requests of the
   same workload on the same store (``benchmarks.throughput``);
4. contention: failed conditional writes per leased item with 1-16 consumers and 1 or 4
   partitions (``benchmarks.contention``);
5. cold start: import time of each handler against ``import boto3`` (``benchmarks.coldstart``);
6. what used to grow with a queue's contents: a lease behind N valid leases, the reaper and stats
   over N stored items, expiry to leasable (``benchmarks.engine``);
7. the capacity model fed with the measured units (``benchmarks.capacity``).

Sections 8 and later of ``docs/benchmarks.md`` (Spark, idle consumers, the stream on AWS,
priorities, redrive) come from their own modules' runs and are kept as they are.

Every store is a single-threaded moto server on 127.0.0.1: units are exact (computed from AWS's
rules), timings are not AWS's. Exits 1 if any run delivered an item twice or lost one.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from benchmarks import capacity, coldstart, contention, cost, engine, paths, throughput
from querator.testing import moto_server_process

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


@dataclass(frozen=True)
class Sizes:
    """How much each section measures; ``--quick`` shrinks all of them."""

    cost_payloads: tuple[int, ...]
    cost_batches: tuple[int, ...]
    cost_count: int
    path_payloads: tuple[int, ...]
    path_count: int
    throughput_batches: tuple[int, ...]
    throughput_count: int
    throughput_rounds: int
    contention_count: int
    contention_partitions: tuple[int, ...]
    coldstart_repeat: int
    engine_quick: bool
    #: Stored items of the reaper runs (500,000 takes minutes more: ``python -m benchmarks.engine``).
    engine_reaper_sizes: tuple[int, ...]


FULL = Sizes(
    cost_payloads=(100, 1024, 10240),
    cost_batches=(1, 10, 100),
    cost_count=100,
    path_payloads=(100, 1024, 10240),
    path_count=30,
    throughput_batches=(1, 10),
    throughput_count=50,
    throughput_rounds=3,
    contention_count=100,
    contention_partitions=(1, 4),
    coldstart_repeat=7,
    engine_quick=False,
    engine_reaper_sizes=(5_000, 50_000),
)
QUICK = Sizes(
    cost_payloads=(100, 1024, 10240),
    cost_batches=(1, 10),
    cost_count=20,
    path_payloads=(100,),
    path_count=10,
    throughput_batches=(10,),
    throughput_count=40,
    throughput_rounds=1,
    contention_count=40,
    contention_partitions=(1,),
    coldstart_repeat=2,
    engine_quick=True,
    engine_reaper_sizes=(5_000,),
)


def machine() -> str:
    return (
        f"{platform.platform()}, {platform.machine()}, {os.cpu_count()} CPUs,"
        f" Python {platform.python_version()} ({platform.python_implementation()})"
    )


def section(title: str, body: str, seconds: float) -> str:
    return f"## {title}\n\n```text\n{body}\n```\n\n_(section took {seconds:.0f} s)_\n"


def run(sizes: Sizes) -> tuple[list[str], list[capacity.Inputs], bool]:
    """Every section as markdown, the capacity inputs, and whether delivery was exactly once."""
    sections: list[str] = []
    sound = True

    started = time.perf_counter()
    with moto_server_process() as endpoint:
        report = cost.measure(
            endpoint, payloads=sizes.cost_payloads, batches=sizes.cost_batches, count=sizes.cost_count
        )
    sound &= all(not c.duplicates and not c.missing for c in report.cases)
    sections.append(
        section(
            "1. Cost per delivered item, happy path",
            cost.format_report(report, sizes.cost_count),
            time.perf_counter() - started,
        )
    )
    print(sections[-1], flush=True)

    started = time.perf_counter()
    with moto_server_process() as endpoint:
        results = paths.measure(endpoint, payloads=sizes.path_payloads, count=sizes.path_count)
    sound &= all(r.exactly_once for r in results)
    sections.append(
        section(
            "2. Cost per item: retry, lease expiry, dead letter",
            f"{paths.format_table(results, sizes.path_count)}\n{paths.floor_note()}",
            time.perf_counter() - started,
        )
    )
    print(sections[-1], flush=True)

    started = time.perf_counter()
    with moto_server_process() as endpoint:
        runs = throughput.measure(
            endpoint,
            batches=sizes.throughput_batches,
            count=sizes.throughput_count,
            rounds=sizes.throughput_rounds,
        )
    sections.append(
        section(
            "3. Throughput: the service against the raw DynamoDB requests",
            throughput.format_table(runs, sizes.throughput_count),
            time.perf_counter() - started,
        )
    )
    print(sections[-1], flush=True)

    started = time.perf_counter()
    cases = []
    with moto_server_process() as endpoint:
        for partitions in sizes.contention_partitions:
            for consumers in contention.CONSUMERS:
                cases.append(
                    contention.run(
                        endpoint,
                        consumers=consumers,
                        partitions=partitions,
                        batch=contention.BATCH,
                        count=sizes.contention_count,
                    )
                )
    sound &= all(c.exactly_once for c in cases)
    sections.append(
        section(
            "4. Contention: failed conditional writes per leased item",
            f"{sizes.contention_count} items of 100 B per case, lease batch {contention.BATCH}, lease then"
            f" complete; WCU and requests per item count lease + complete only (produce is the same"
            f" for every case)\n{contention.format_table(cases)}",
            time.perf_counter() - started,
        )
    )
    print(sections[-1], flush=True)

    started = time.perf_counter()
    times = coldstart.measure(sizes.coldstart_repeat)
    sections.append(
        section(
            "5. Cold start: handler import time", coldstart.format_table(times), time.perf_counter() - started
        )
    )
    print(sections[-1], flush=True)

    started = time.perf_counter()
    engine_report = engine.measure(
        quick=sizes.engine_quick, label="v2", reaper_sizes=list(sizes.engine_reaper_sizes)
    )
    sections.append(
        section(
            "6. At depth: lease behind valid leases, reaper and stats over stored items",
            engine.format_report(engine_report),
            time.perf_counter() - started,
        )
    )
    print(sections[-1], flush=True)

    inputs = [
        capacity.Inputs(
            case=c.name,
            wcu_per_item=c.per_item("write_units"),
            rcu_per_item=c.per_item("read_units") - c.per_item("catalog_read_units"),
            catalog_rcu_per_item=c.per_item("catalog_read_units"),
            hottest_wcu_per_item=c.hottest_key_write_units_per_item(),
        )
        for c in report.cases
        if c.payload_bytes in (100, 1024) and c.batch >= 10
    ]
    return sections, inputs, sound


#: Where the sections this command does not generate begin in docs/benchmarks.md: those measured by
#: their own modules (Spark, idle consumers, the stream on AWS, priorities, redrive), kept as they are.
KEPT_FROM = "## 8. "


def kept_sections(existing: str) -> str:
    """The part of an existing docs/benchmarks.md that this command does not generate ("" if none)."""
    at = existing.find(f"\n{KEPT_FROM}")
    return existing[at + 1 :].rstrip("\n") + "\n" if at >= 0 else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run in about 2 minutes")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ as it is")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    cost.use_fake_credentials()
    started = time.perf_counter()
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    sections, inputs, sound = run(sizes)
    total = time.perf_counter() - started
    capacity_doc = DOCS / "capacity.md"
    capacity_block = capacity.render(capacity.as_printed(inputs))
    document = "\n".join(
        [
            "# Benchmarks",
            "",
            f"Generated by `uv run python -m benchmarks{' --quick' if args.quick else ''}` on {when},"
            f" in {total:.0f} s.",
            "",
            f"Machine: {machine()}.",
            "",
            "Read this first: every store here is a single-threaded moto server on 127.0.0.1. Request",
            "counts and capacity units are exact for the requests made (computed by `benchmarks/meter.py`",
            "from DynamoDB's published rules); times and items/s are moto's and this machine's, not AWS's,",
            "and the machine is shared (other jobs ran at the same time), so timings are noisy. The",
            "capacity model built from these units is in [capacity.md](capacity.md).",
            "",
            *sections,
            "## 7. Capacity model inputs and results",
            "",
            capacity_block,
            "",
        ]
    )
    previous = DOCS / "benchmarks.md"
    kept = kept_sections(previous.read_text()) if previous.exists() else ""
    if kept:
        document = f"{document}\n{kept}"
    print(f"## 7. Capacity model\n\n{capacity_block}\n")
    print(f"total {total:.0f} s")
    if not args.no_write:
        DOCS.mkdir(exist_ok=True)
        (DOCS / "benchmarks.md").write_text(document)
        if capacity_doc.exists() and capacity.START in capacity_doc.read_text():
            capacity_doc.write_text(capacity.update_document(capacity_doc.read_text(), inputs))
        print(f"wrote {DOCS / 'benchmarks.md'} and the generated part of {capacity_doc}")
    if not sound:
        print("an item was delivered twice or lost: see the tables above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
