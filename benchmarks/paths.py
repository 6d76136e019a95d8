"""DynamoDB cost per item of the paths beside the happy path: retry, lease expiry, dead letter.

Run ``uv run python -m benchmarks.paths`` (``--quick`` for a smaller run); ``python -m benchmarks``
runs it with everything else. Same method as ``benchmarks.cost`` (the real ``QueueService`` on a
single-threaded moto server, every request metered by ``benchmarks.meter.CostMeter``), but on a fake
clock, so a lease can run out without waiting. Each path ends every item exactly once:

``retry``        produce, lease, ``queue.retry`` (back to the tail now), lease again, complete.
``expiry``       produce, lease, the lease runs out, lease again (the lease scan requeues the item
                 under a new id at the tail and claims it later), complete.
``dead (retry)`` produce, lease, ``queue.retry`` with ``dead: true``: into the dead-letter queue.
``dead (reaper)`` ``max_attempts`` 1: produce, lease, the lease runs out, the reaper moves the item
                 to the dead-letter queue.

Figures are per item that reached its end (completed, or stored in the dead-letter queue), catalog
reads included. Each item carries its identity in the first bytes of its payload, so the run checks
that every produced item ended exactly once although requeues give it new ids.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from benchmarks.cost import PhaseCost, PhaseMeter, metered_service, payload_of, use_fake_credentials
from benchmarks.meter import write_units
from querator.config import DEFAULT_ENGINE
from querator.domain.errors import NothingToLeaseError
from querator.domain.model import NewItem, QueueInfo, RetryRequest
from querator.testing import FakeClock, moto_server_process, stored_items

if TYPE_CHECKING:
    from collections.abc import Sequence

    from benchmarks.cost import MeteredService
    from querator.service import QueueService

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

PATHS = ("retry", "expiry", "dead (retry)", "dead (reaper)")
PAYLOADS = (100, 1024, 10240)
BATCH = 10
COUNT = 100
QUICK_COUNT = 30
LEASE_TIMEOUT = timedelta(seconds=60)
EXPIRE_TIMEOUT = timedelta(hours=1)
_ID_BYTES = 8


@dataclass(frozen=True)
class PathResult:
    """The cost of one path at one payload size."""

    path: str
    payload_bytes: int
    batch: int
    produced: int
    #: Items that reached the path's end (completed or dead-lettered), counted by identity.
    ended: int
    #: Identities that ended more than once, or never: both must be 0.
    duplicates: int
    missing: int
    phases: dict[str, PhaseCost]

    @property
    def name(self) -> str:
        return f"{self.path} {self.payload_bytes}B x{self.batch}"

    def per_item(self, attr: str, phase: str | None = None) -> float:
        if phase is None:
            total = float(sum(getattr(p, attr) for p in self.phases.values()))
        else:
            total = float(getattr(self.phases.get(phase, PhaseCost()), attr))
        return total / self.ended if self.ended else float("nan")

    @property
    def exactly_once(self) -> bool:
        return self.ended == self.produced and not self.duplicates and not self.missing


def tagged_payload(identity: int, size: int) -> bytes:
    """A payload of ``size`` bytes whose first bytes name the item (survives requeues and moves)."""
    return f"{identity:0{_ID_BYTES}d}".encode() + payload_of(max(0, size - _ID_BYTES))


def identity_of(payload: bytes) -> int:
    return int(payload[:_ID_BYTES])


def _queue(name: str, *, dead_queue: str = "", max_attempts: int = 0) -> QueueInfo:
    placeholder = datetime(2000, 1, 1, tzinfo=UTC)  # the service stamps its own times
    return QueueInfo(
        name=name,
        lease_timeout=LEASE_TIMEOUT,
        expire_timeout=EXPIRE_TIMEOUT,
        max_attempts=max_attempts,
        dead_queue=dead_queue,
        created_at=placeholder,
        updated_at=placeholder,
    )


def _lease_all(
    service: QueueService, phases: PhaseMeter, name: str, batch: int, limit: int
) -> list[tuple[int, dict[str, int]]]:
    """Lease until nothing is left; returns (partition, {id: identity}) per lease, at most ``limit``."""
    leases = []
    for _ in range(limit):
        try:
            with phases.phase("lease"):
                lease = service.lease(name, batch_size=batch, client_id="path-benchmark")
        except NothingToLeaseError:
            break
        leases.append((lease.partition, {item.id: identity_of(item.payload) for item in lease.items}))
    return leases


def _drain(service: QueueService, name: str) -> Counter[int]:
    """Identities of every item stored in the queue (un-metered use of the service is fine here:
    the meter was snapshot already)."""
    return Counter(identity_of(i.payload) for i in stored_items(service, name))


def run_path(
    metered: MeteredService, clock: FakeClock, *, path: str, payload_bytes: int, batch: int, count: int
) -> PathResult:
    """Run one path on fresh queues and return its metered cost per item."""
    service = metered.service
    tag = f"{PATHS.index(path)}-{payload_bytes:05d}-{batch:04d}"
    name, dead = f"path-{tag}", f"dead-{tag}"
    dead_path = path.startswith("dead")
    if dead_path:
        service.create_queue(_queue(dead))
    service.create_queue(
        _queue(name, dead_queue=dead if dead_path else "", max_attempts=1 if path == "dead (reaper)" else 0)
    )
    phases = PhaseMeter(metered)
    for start in range(0, count, batch):
        chunk = [
            NewItem(payload=tagged_payload(i, payload_bytes)) for i in range(start, min(count, start + batch))
        ]
        with phases.phase("produce"):
            service.produce(name, chunk)

    bound = 4 * count + 10  # every lease returns at least one item; a bug cannot loop forever
    ended: Counter[int] = Counter()
    first = _lease_all(service, phases, name, batch, bound)
    if path == "retry":
        for partition, ids in first:
            with phases.phase("retry"):
                outcome = service.retry(name, partition, [RetryRequest(id=i) for i in ids])
            _check(outcome.failed, path)
    elif path == "dead (retry)":
        for partition, ids in first:
            with phases.phase("retry"):
                outcome = service.retry(name, partition, [RetryRequest(id=i, dead=True) for i in ids])
            _check(outcome.failed, path)
    else:
        clock.advance(LEASE_TIMEOUT + timedelta(seconds=1))
        if path == "dead (reaper)":
            with phases.phase("reap"):
                service.reap(clock.now(), timedelta(minutes=5))
    if dead_path:
        ended = _drain(service, dead)
        leftover = _drain(service, name)
    else:
        for partition, leased in _lease_all(service, phases, name, batch, bound):
            with phases.phase("complete"):
                outcome = service.complete(name, partition, list(leased))
            _check(outcome.failed, path)
            ended.update(leased.values())
        leftover = _drain(service, name)
    produced = set(range(count))
    return PathResult(
        path=path,
        payload_bytes=payload_bytes,
        batch=batch,
        produced=count,
        ended=sum(ended.values()),
        duplicates=sum(n - 1 for n in ended.values() if n > 1) + sum(leftover.values()),
        missing=len(produced - set(ended)),
        phases=phases.totals,
    )


def _check(failed: Sequence[object], path: str) -> None:
    if failed:
        raise RuntimeError(f"{path}: ids not applied on an uncontended path: {failed[:3]}")


def measure(
    endpoint: str,
    *,
    paths: Sequence[str] = PATHS,
    payloads: Sequence[int] = PAYLOADS,
    batch: int = BATCH,
    count: int = COUNT,
    engine: int = DEFAULT_ENGINE,
) -> list[PathResult]:
    clock = FakeClock()
    metered = metered_service(endpoint, clock=clock, engine=engine)
    return [
        run_path(metered, clock, path=p, payload_bytes=size, batch=batch, count=count)
        for size in payloads
        for p in paths
    ]


def format_table(results: Sequence[PathResult], count: int) -> str:
    header = (
        f"{'path':<14} {'payload':>7} {'batch':>5} | {'req/item':>8} {'WCU/item':>8} {'RCU/item':>8}"
        f" | {'WCU by phase':<54} | {'once':>4}"
    )
    lines = [
        f"DynamoDB cost per item that reached its end, beside the happy path (N={count} per case)",
        header,
        "-" * len(header),
    ]
    for r in results:
        by_phase = " ".join(
            f"{p}={r.per_item('write_units', p):.2f}" for p, cost in r.phases.items() if cost.requests
        )
        lines.append(
            f"{r.path:<14} {r.payload_bytes:>7} {r.batch:>5} | {r.per_item('requests'):>8.2f}"
            f" {r.per_item('write_units'):>8.2f} {r.per_item('read_units'):>8.2f} | {by_phase:<54} |"
            f" {'yes' if r.exactly_once else 'NO':>4}"
        )
    return "\n".join(lines)


def floor_note() -> str:
    return (
        "A requeue (retry, expiry) or a dead-letter move is one transaction per lease record (the"
        " record's settle, the target head's tail, the moved items' packed rows; 2x units): its"
        f" units grow with the moved bytes, at least 2 x {write_units(0)} per call, not per item."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_COUNT} items per case")
    args = parser.parse_args(argv)
    count = QUICK_COUNT if args.quick else COUNT
    use_fake_credentials()
    with moto_server_process() as endpoint:
        results = measure(endpoint, count=count)
    print(format_table(results, count))
    return 0 if all(r.exactly_once for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
