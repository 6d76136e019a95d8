"""The waiting lease on a deployed stack: what its polling back-off costs in reads and in latency.

    uv run python -m benchmarks.longpoll_aws [--items 60] [--idle 120] [--poll-max 0.5 ...]

A long-polling consumer on AWS is a lease function waiting in ``Leaser.lease``: it reads the store,
sleeps ``POLL_FIRST`` (20 ms), reads again, doubling the sleep up to ``POLL_MAX``
(``querator.service.tuning``), until an item comes or the wait ends. Shorter sleeps find an item
sooner and read more. For each ``POLL_MAX`` this runs the service's own lease (its poll loop
patched to that ``POLL_MAX``) as the lease function does, on moto in process with every DynamoDB
request of the lease metered (``benchmarks.meter``: AWS's unit rules; items table and catalog), on a
simulated clock:

* every DynamoDB request takes ``ROUND_TRIP`` (5 ms, the in-region figure ``benchmarks.idle``
  assumes) of simulated time; the code's own CPU takes none;
* a lease's sleep moves the clock on, and a produce due within it runs at its time (one due while
  the lease is reading runs right after that request, at most a few ms late);
* one consumer, already waiting, calls ``queue.lease`` (batch 1, a 20 s wait: the deployed cap) again
  as soon as the previous call has returned and its item is completed;
* items arrive at random (a Poisson process, seeded) at 1 and 5 a second, ``--items`` of each; a
  fixed schedule would lock in step with the (deterministic) poll schedule and give every item the
  same latency. Latency runs from the produce call to the lease returning the item, the produce's
  own writes included. The idle regime waits ``--idle`` seconds on an empty queue.

Only the consumer's lease calls are metered: produce and complete cost the same whatever the
back-off. Prices: DynamoDB on demand $0.125 per million read units; the wait is billed Lambda time,
the lease function at 256 MB (``infra/timeouts.py``), arm64 $0.0000133334 per GB-second (the stack's
default architecture; x86_64's $0.0000166667 is 25 % more). Lambda's bill does not depend on the
back-off: a consumer waits as long whichever it is; it is there to put the reads in proportion.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from moto import mock_aws

from benchmarks.cost import use_fake_credentials
from benchmarks.idle import CHOSEN_MB, PRICE_GB_SECOND, PRICE_READ_UNIT, ROUND_TRIP
from benchmarks.meter import CostMeter
from benchmarks.stream import percentile
from querator.domain.errors import NothingToLeaseError
from querator.domain.model import NewItem, QueueInfo
from querator.service import lease as lease_module
from querator.service.tuning import POLL_FIRST, POLL_MAX
from querator.storage.dynamodb.catalog import DynamoDBQueueCatalog
from querator.testing import FakeClock, build_service, dynamodb_client

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from querator.service import QueueService

UTC = timezone.utc
#: The deployed long-poll: the lease function's wait cap (``leaseWaitCapSeconds``, default 20).
WAIT = timedelta(seconds=20)
POLL_MAXES = (0.1, 0.25, 0.5, 1.0, 2.0)
RATES = (1.0, 5.0)
PRICE_GB_SECOND_X86 = 0.0000166667
HOUR = 3600.0


class SimClock(FakeClock):
    """A fake clock that runs what is due while someone sleeps: ``sleep`` moves time on to each
    due action in turn, runs it, then on to the end of the sleep."""

    def __init__(self, start: datetime) -> None:
        super().__init__(start)
        self._due: list[tuple[datetime, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def at(self, when: datetime, action: Callable[[], None]) -> None:
        heapq.heappush(self._due, (when, next(self._order), action))

    def pending(self) -> int:
        return len(self._due)

    def sleep(self, seconds: float) -> None:
        until = self.now() + timedelta(seconds=seconds)
        while self._due and self._due[0][0] <= until:
            when, _, action = heapq.heappop(self._due)
            self._move_to(when)
            action()
        self._move_to(until)

    def _move_to(self, when: datetime) -> None:
        now = self.now()
        if when > now:
            self.advance(when - now)

    def round_trip(self, **_: Any) -> None:
        """A botocore ``after-call`` handler: each request takes ``ROUND_TRIP`` of simulated time."""
        self.advance(timedelta(seconds=ROUND_TRIP))


def arrivals(rate: float, count: int, seed: int) -> list[float]:
    """Seconds from the start at which ``count`` items arrive, at random at ``rate`` a second on
    average (exponential gaps: a Poisson process)."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    rng = random.Random(seed)
    return list(itertools.accumulate(rng.expovariate(rate) for _ in range(count)))


@contextmanager
def poll_shape(first: float, most: float) -> Iterator[None]:
    """The waiting lease's poll schedule (first sleep, doubling up to ``most``) for the block."""
    # The lease module's own names: ``Leaser.lease`` reads them at each call.
    patched = {"POLL_FIRST": first, "POLL_MAX": most}
    saved = {name: getattr(lease_module, name) for name in patched}
    for name, value in patched.items():
        setattr(lease_module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(lease_module, name, value)


@dataclass
class Run:
    """What one consumer's lease calls cost in one regime at one ``POLL_MAX``."""

    poll_max: float
    regime: str
    items: int = 0
    #: Simulated seconds spent inside lease calls.
    waiting: float = 0.0
    requests: int = 0
    read_units: float = 0.0
    latencies: list[float] = field(default_factory=list)

    def per_second(self, value: float) -> float:
        return value / self.waiting

    def per_item(self, value: float) -> float:
        return value / self.items if self.items else float("nan")

    def latency(self, share: float) -> float:
        return percentile(self.latencies, share) if self.latencies else float("nan")


class Bench:
    """One service on moto in process, its clients metered and on the simulated clock."""

    def __init__(self) -> None:
        self.clock = SimClock(datetime(2026, 1, 1, tzinfo=UTC))
        client = dynamodb_client()
        self.service: QueueService = build_service(client, clock=self.clock)
        self.meter = CostMeter(dynamodb_client())
        self.meter.attach(client)
        client.meta.events.register("after-call.dynamodb", self.clock.round_trip)
        catalog = self.service.catalog
        if not isinstance(catalog, DynamoDBQueueCatalog):
            raise TypeError(f"expected the DynamoDB catalog, got {type(catalog).__name__}")
        # PynamoDB's client for this thread (benchmarks/meter.py): the catalog reads are the lease's too.
        catalog_client = catalog._model._get_connection().connection.client
        self.meter.attach(catalog_client)
        catalog_client.meta.events.register("after-call.dynamodb", self.clock.round_trip)
        #: What the meter counted for produce and complete, which are not the waiting lease's.
        self._others = (0, 0.0)
        self._queues = itertools.count()

    def queue(self) -> str:
        name = f"wait-{next(self._queues):04d}"
        now = self.clock.now()
        self.service.create_queue(
            QueueInfo(
                name=name,
                lease_timeout=timedelta(minutes=5),
                expire_timeout=timedelta(hours=24),
                created_at=now,
                updated_at=now,
            )
        )
        # The first lookup fills the queue cache, as a running function's would have long ago.
        self.service.stats(name)
        return name

    def not_the_leases(self, action: Callable[..., object], *args: Any) -> None:
        """Run ``action(*args)`` (a produce or complete) and keep its requests out of the lease's count."""
        before = self.meter.snapshot()
        action(*args)
        after = self.meter.snapshot()
        requests, units = self._others
        self._others = (
            requests + after.requests - before.requests,
            units + after.read_units - before.read_units,
        )

    def lease_cost(self) -> tuple[int, float]:
        """Requests and read units of the lease calls since the last ``start``."""
        snapshot = self.meter.snapshot()
        return snapshot.requests - self._others[0], snapshot.read_units - self._others[1]

    def start(self) -> None:
        self.meter.reset()
        self._others = (0, 0.0)


def waiting(bench: Bench, poll_max: float, rate: float | None, *, items: int, idle: float, seed: int) -> Run:
    """One consumer long-polling a fresh queue: ``items`` arriving at ``rate`` a second, or (``rate``
    None) an empty queue for ``idle`` seconds."""
    queue = bench.queue()
    run = Run(poll_max, "idle queue" if rate is None else f"{rate:g} item/s")
    produced: dict[bytes, datetime] = {}
    # The consumer is waiting before the first item arrives (as on an idle queue).
    start = bench.clock.now() + timedelta(seconds=1)
    for n, at in enumerate(arrivals(rate, items, seed) if rate is not None else []):
        when = start + timedelta(seconds=at)

        def produce(payload: bytes = str(n).encode(), when: datetime = when) -> None:
            produced[payload] = when
            bench.not_the_leases(bench.service.produce, queue, [NewItem(payload=payload)])

        bench.clock.at(when, produce)
    # The idle regime: whole waits, as many as ``idle`` seconds hold.
    calls = max(1, round(idle / WAIT.total_seconds()))
    bench.start()
    while (run.items < items) if rate is not None else calls > 0:
        calls -= 1
        called = bench.clock.now()
        try:
            lease = bench.service.lease(queue, batch_size=1, client_id="consumer", timeout=WAIT)
        except NothingToLeaseError:
            run.waiting += (bench.clock.now() - called).total_seconds()
            continue
        returned = bench.clock.now()
        run.waiting += (returned - called).total_seconds()
        for item in lease.items:
            run.items += 1
            run.latencies.append((returned - produced[item.payload]).total_seconds())
        bench.not_the_leases(bench.service.complete, queue, lease.partition, [i.id for i in lease.items])
    if bench.clock.pending():
        raise RuntimeError("the run ended with produces still to come")
    run.requests, run.read_units = bench.lease_cost()
    return run


def measure(
    poll_maxes: Sequence[float], *, items: int, idle: float, seed: int = 7, first: float | None = POLL_FIRST
) -> list[Run]:
    """Every ``POLL_MAX`` against every regime (call inside ``mock_aws``); the same arrivals for
    every ``POLL_MAX``. ``first``: the first sleep (``None``: ``POLL_MAX``, no doubling)."""
    bench = Bench()
    runs = []
    for poll_max in poll_maxes:
        with poll_shape(poll_max if first is None else min(first, poll_max), poll_max):
            for n, rate in enumerate(RATES):
                runs.append(waiting(bench, poll_max, rate, items=items, idle=0, seed=seed + n))
            runs.append(waiting(bench, poll_max, None, items=0, idle=idle, seed=seed))
    return runs


def lambda_dollars(seconds: float, *, price: float = PRICE_GB_SECOND) -> float:
    """The lease function's duration bill for ``seconds`` of waiting (at its deployed memory)."""
    return seconds * CHOSEN_MB / 1024 * price


def units_table(runs: Sequence[Run]) -> str:
    lines = [
        "| POLL_MAX | regime | items | waited s | requests / waiting s | read units / waiting s"
        " | requests / item | read units / item | latency median ms | p95 ms |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        delivered = run.items > 0
        cells = [
            f"{run.poll_max:g} s",
            run.regime,
            str(run.items),
            f"{run.waiting:.0f}",
            f"{run.per_second(run.requests):.2f}",
            f"{run.per_second(run.read_units):.2f}",
            f"{run.per_item(run.requests):.1f}" if delivered else "",
            f"{run.per_item(run.read_units):.1f}" if delivered else "",
            f"{run.latency(0.5) * 1000:.0f}" if delivered else "",
            f"{run.latency(0.95) * 1000:.0f}" if delivered else "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def price_table(runs: Sequence[Run]) -> str:
    """Per idle consumer-hour, and per million items delivered at each rate: reads and Lambda."""
    by = {(run.poll_max, run.regime): run for run in runs}
    poll_maxes = sorted({run.poll_max for run in runs})
    rates = [f"{rate:g} item/s" for rate in RATES]
    header = ["POLL_MAX", "idle hour: reads $", "idle hour: Lambda $"]
    for rate in rates:
        header += [f"million at {rate}: reads $", f"million at {rate}: Lambda $"]
    lines = ["| " + " | ".join(header) + " |", "|---:|" + "---:|" * (len(header) - 1)]
    for poll_max in poll_maxes:
        idle = by[(poll_max, "idle queue")]
        cells = [
            f"{poll_max:g} s",
            f"{idle.per_second(idle.read_units) * HOUR * PRICE_READ_UNIT:.5f}",
            f"{lambda_dollars(HOUR):.4f}",
        ]
        for rate in rates:
            run = by[(poll_max, rate)]
            cells += [
                f"{run.per_item(run.read_units) * 1e6 * PRICE_READ_UNIT:.2f}",
                f"{lambda_dollars(run.per_item(run.waiting) * 1e6):.2f}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, default=60, help="items per rate (default 60)")
    parser.add_argument(
        "--idle", type=float, default=60.0, help="seconds on an empty queue, in 20 s waits (default 60)"
    )
    parser.add_argument(
        "--poll-max",
        type=float,
        action="append",
        help=f"repeatable (default {', '.join(map(str, POLL_MAXES))})",
    )
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument(
        "--first", type=float, default=POLL_FIRST, help=f"the first sleep (default {POLL_FIRST})"
    )
    shape.add_argument("--flat", action="store_true", help="no doubling: every sleep is POLL_MAX")
    args = parser.parse_args(argv)
    use_fake_credentials()
    started = time.perf_counter()
    first = None if args.flat else args.first
    with mock_aws():
        runs = measure(tuple(args.poll_max or POLL_MAXES), items=args.items, idle=args.idle, first=first)
    schedule = (
        "every sleep POLL_MAX" if first is None else f"sleeps doubling from {first * 1000:.0f} ms to POLL_MAX"
    )
    print(
        f"One long-polling consumer, {schedule} (deployed: {POLL_FIRST * 1000:.0f} ms to {POLL_MAX:g} s);"
        f" each DynamoDB request takes {ROUND_TRIP * 1000:.0f} ms of simulated time:\n"
    )
    print(units_table(runs))
    print(
        f"\nDollars: reads at $0.125 per million read units; Lambda, the wait at {CHOSEN_MB} MB, arm64"
        f" ${PRICE_GB_SECOND} per GB-s (x86_64: ${PRICE_GB_SECOND_X86}, 25 % more):\n"
    )
    print(price_table(runs))
    took = time.perf_counter() - started
    print(f"\n(seed 7, {args.items} items per rate, {args.idle:g} s idle; the run took {took:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
