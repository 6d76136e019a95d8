"""What a failure reason costs on DynamoDB: per retried item, a retry with a reason against the same
retry without one (docs/adr/0101-failure-reasons.md).

Run ``uv run python -m benchmarks.reasons`` (engine v2) and ``... --engine 3`` (the claim log).

Method
------
* The real ``QueueService`` over a single-threaded moto server, every request metered by
  ``benchmarks.meter.CostMeter`` (DynamoDB's published unit rules), as ``benchmarks.cost`` does.
* Each case is one payload size and batch size, run twice on fresh queues: with ``reason=""`` and
  with a reason of ``--reason-bytes`` (100) bytes. ``count`` items are produced, leased ``batch`` at
  a time and retried (to the tail now), leased again and completed: the retry, the second lease and
  the complete are metered apart. Then as many items are leased and retried ``dead`` into a
  dead-letter queue, and the dead letters listed. The stored bytes of a retried item (its row on
  engine v2, its share of the packed row on v3) and of a dead letter are read back with an
  un-metered client.
* The happy path (produce, lease, complete of items that never fail) is ``benchmarks.cost``'s: the
  items of this benchmark never failed before their first retry, so what it shows beyond the retry
  is only what the reason adds.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.cost import (
    PhaseCost,
    PhaseMeter,
    add_engine_argument,
    metered_service,
    payload_of,
    use_fake_credentials,
)
from benchmarks.cost import _stored_size as stored_size
from querator.domain.model import NewItem, QueueInfo, RetryRequest
from querator.testing import moto_server_process

if TYPE_CHECKING:
    from benchmarks.cost import MeteredService

UTC = timezone.utc
PHASES = ("retry", "lease", "complete", "dead")
PAYLOADS = (100, 1000)
BATCHES = (1, 10)
COUNT = 100
REASON_BYTES = 100


@dataclass(frozen=True)
class Run:
    """One pass of a case: units and requests per retried item by phase, stored bytes per item."""

    reason_bytes: int
    requests: dict[str, float]
    write_units: dict[str, float]
    read_units: dict[str, float]
    retried_item_bytes: int
    dead_letter_bytes: int


def run_pass(
    metered: MeteredService, *, payload_bytes: int, batch: int, count: int, reason: str, tag: str
) -> Run:
    service = metered.service
    placeholder = datetime(2000, 1, 1, tzinfo=UTC)
    # Fixed width, as benchmarks.cost's: the queue name is in every key.
    name, dead = f"why-{tag}", f"why-{tag}-d"
    for queue, dead_queue in ((dead, ""), (name, dead)):
        service.create_queue(
            QueueInfo(
                name=queue,
                lease_timeout=timedelta(minutes=5),
                expire_timeout=timedelta(hours=1),
                dead_queue=dead_queue,
                created_at=placeholder,
                updated_at=placeholder,
            )
        )
    phases = PhaseMeter(metered)
    phases.totals = {p: PhaseCost() for p in PHASES}
    payload = payload_of(payload_bytes)
    for start in range(0, count, batch):
        service.produce(name, [NewItem(payload=payload) for _ in range(min(batch, count - start))])
    partition = 0
    for _ in range(0, count, batch):
        lease = service.lease(name, batch_size=batch, client_id="why")
        partition = lease.partition
        with phases.phase("retry"):
            outcome = service.retry(
                name, partition, [RetryRequest(id=i.id, reason=reason) for i in lease.items]
            )
        if outcome.failed:
            raise RuntimeError(f"retry failed: {outcome.failed[:3]}")
    retried = service.list_items(name, partition, limit=1)[0]
    retried_bytes = stored_size(service, metered.raw, name, partition, retried.id)
    if retried.last_reason != reason:
        raise RuntimeError(f"the retried item says {retried.last_reason!r}, not {reason!r}")
    for _ in range(0, count, batch):
        with phases.phase("lease"):
            lease = service.lease(name, batch_size=batch, client_id="why")
        with phases.phase("complete"):
            service.complete(name, lease.partition, [i.id for i in lease.items])
    for start in range(0, count, batch):
        service.produce(name, [NewItem(payload=payload) for _ in range(min(batch, count - start))])
    for _ in range(0, count, batch):
        lease = service.lease(name, batch_size=batch, client_id="why")
        with phases.phase("dead"):
            service.retry(
                name, lease.partition, [RetryRequest(id=i.id, dead=True, reason=reason) for i in lease.items]
            )
    letter = service.list_items(dead, 0, limit=1)[0]
    dead_bytes = stored_size(service, metered.raw, dead, 0, letter.id)
    per = float(count)
    # Catalog reads (the queue cache refreshing on the wall clock) left out: the same for any item.
    totals = phases.totals
    return Run(
        reason_bytes=len(reason.encode()),
        requests={p: (totals[p].requests - totals[p].catalog_requests) / per for p in PHASES},
        write_units={p: totals[p].write_units / per for p in PHASES},
        read_units={p: (totals[p].read_units - totals[p].catalog_read_units) / per for p in PHASES},
        retried_item_bytes=retried_bytes,
        dead_letter_bytes=dead_bytes,
    )


def measure(
    endpoint: str,
    *,
    engine: int,
    count: int,
    reason_bytes: int,
    payloads: tuple[int, ...] = PAYLOADS,
    batches: tuple[int, ...] = BATCHES,
) -> list[dict[str, object]]:
    metered = metered_service(endpoint, engine=engine)
    reason = ("ValueError: " + "x" * reason_bytes)[:reason_bytes]
    cases = []
    for payload_bytes in payloads:
        for batch in batches:
            tag = f"{payload_bytes:04d}-{batch:03d}"
            plain = run_pass(
                metered, payload_bytes=payload_bytes, batch=batch, count=count, reason="", tag=f"{tag}-n"
            )
            given = run_pass(
                metered, payload_bytes=payload_bytes, batch=batch, count=count, reason=reason, tag=f"{tag}-r"
            )
            cases.append(
                {
                    "payload_bytes": payload_bytes,
                    "batch": batch,
                    "without": asdict(plain),
                    "with": asdict(given),
                }
            )
    return cases


def format_report(cases: list[dict[str, object]], *, engine: int, count: int, reason_bytes: int) -> str:
    header = (
        f"{'case':<10} | {'phase':<8} | {'WCU no reason':>13} {'with':>6} {'+':>6} | {'RCU no reason':>13}"
        f" {'with':>6} {'+':>6} | {'req':>5} {'with':>5}"
    )
    lines = [
        f"engine v{engine}: a retry with a {reason_bytes}-byte reason against one without, per retried item"
        f" (N={count} a case, 1 partition)",
        header,
        "-" * len(header),
    ]
    for case in cases:
        plain, given = case["without"], case["with"]
        assert isinstance(plain, dict) and isinstance(given, dict)  # noqa: S101 - built above
        name = f"{case['payload_bytes']}B x{case['batch']}"
        for phase in PHASES:
            w0, w1 = plain["write_units"][phase], given["write_units"][phase]
            r0, r1 = plain["read_units"][phase], given["read_units"][phase]
            q0, q1 = plain["requests"][phase], given["requests"][phase]
            lines.append(
                f"{name:<10} | {phase:<8} | {w0:>13.2f} {w1:>6.2f} {w1 - w0:>+6.2f} | {r0:>13.2f} {r1:>6.2f}"
                f" {r1 - r0:>+6.2f} | {q0:>5.2f} {q1:>5.2f}"
            )
        item0, item1 = plain["retried_item_bytes"], given["retried_item_bytes"]
        dead0, dead1 = plain["dead_letter_bytes"], given["dead_letter_bytes"]
        lines.append(
            f"{name:<10} | stored   | retried item {item0} -> {item1} B ({item1 - item0:+d}),"
            f" dead letter {dead0} -> {dead1} B ({dead1 - dead0:+d})"
        )
    lines += [
        "",
        "retry = the queue.retry calls (to the tail now); lease / complete = the next lease of the retried",
        "items and its complete; dead = queue.retry with dead: true into a dead-letter queue. Units per",
        "retried item by benchmarks.meter's rules, catalog reads left out (requests too); stored = bytes of",
        "the item as stored after the call (engine v3: its share of the packed row).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=COUNT, help=f"items per case (default {COUNT})")
    parser.add_argument(
        "--reason-bytes", type=int, default=REASON_BYTES, help="bytes of the reason (default 100)"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures to PATH")
    add_engine_argument(parser)
    args = parser.parse_args(argv)
    use_fake_credentials()
    with moto_server_process() as endpoint:
        cases = measure(endpoint, engine=args.engine, count=args.count, reason_bytes=args.reason_bytes)
    print(format_report(cases, engine=args.engine, count=args.count, reason_bytes=args.reason_bytes))
    if args.json is not None:
        args.json.write_text(json.dumps({"engine": args.engine, "cases": cases}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
