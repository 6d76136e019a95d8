"""Produce-to-consumer latency on ``querator serve``, as a user sees it: stream against long-poll.

    uv run python -m benchmarks.stream [--rate 1 --rate 5] [--items 60] [--url URL]

Two consumers wait before anything is produced, as a worker on an idle queue does: one holds a
stream (``/v1/stream``) with credit, the other long-polls (``queue.lease`` with ``request_timeout``
20 s, called again as soon as the previous call returns). One producer thread produces one item at a
time on a fixed schedule of ``--rate`` items a second into each consumer's queue, the two schedules
half a period apart so their produce calls never overlap. An item's latency runs from just before
its produce call (round trip included) to its consumer holding it, both clocks this process's
``time.perf_counter``. Every consumer completes what it holds at once. Each rate (1 and 5 a second
by default, both in one run) gets ``--items`` items per consumer after one warm-up item each; the
default run takes about 90 s.

The server is a ``querator serve`` child on SQLite in a temporary directory unless ``--url`` names a
running one (its queues are created with a random suffix and deleted afterwards). Local figures, this
machine's, not a deployed stack's (``benchmarks.longpoll_aws`` models a stack's long-poll).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from querator.client import Client
from querator.client.stream import Stream
from querator.testing import serve_process

if TYPE_CHECKING:
    from collections.abc import Sequence

#: A waiting long-poll's ``request_timeout``: the deployed lease function's wait cap.
POLL_WAIT = "20s"
#: The stream consumer's credit: more than it ever holds here, so credit never delays a push.
CREDIT = 10
DEFAULT_RATES = (1.0, 5.0)
DEFAULT_ITEMS = 60
#: How long, after its last produce, a consumer may take to hold every item before the run fails.
DRAIN_SECONDS = 30.0


def percentile(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile: the smallest value at least ``share`` of ``values`` are at or
    below (p95 of 100 values is the 95th smallest)."""
    if not values:
        raise ValueError("no values")
    if not 0 < share <= 1:
        raise ValueError("share must be in (0, 1]")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def schedule(rate: float, items: int, *, phase: float = 0.0) -> list[float]:
    """When each of ``items`` produces starts, in seconds from the run's start: ``rate`` a second,
    the first at ``phase`` periods (``phase=0.5``: half a period after another schedule's)."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    period = 1.0 / rate
    return [(n + phase) * period for n in range(items)]


@dataclass(frozen=True)
class Summary:
    rate: float
    consumer: str
    latencies: tuple[float, ...]
    #: Items produced that the consumer never held within ``DRAIN_SECONDS`` of the last produce.
    missing: int

    @property
    def median(self) -> float:
        return statistics.median(self.latencies)

    @property
    def p95(self) -> float:
        return percentile(self.latencies, 0.95)

    @property
    def max(self) -> float:
        return max(self.latencies)


class _Consumer:
    """One waiting consumer in a thread of its own: records when it holds each item, by payload."""

    name = ""

    def __init__(self, url: str, queue: str, expected: int) -> None:
        self.url = url
        self.queue = queue
        self.expected = expected
        self.held: dict[str, float] = {}
        self.ready = threading.Event()
        self.done = threading.Event()
        #: Set by the main thread when it stops waiting for this consumer.
        self.stop = threading.Event()
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"bench-{self.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            self.consume()
        except BaseException as error:  # reported by the main thread
            self.failure = error
        finally:
            self.ready.set()
            self.done.set()

    def consume(self) -> None:
        raise NotImplementedError

    def _hold(self, payloads: list[bytes]) -> None:
        now = time.perf_counter()
        for payload in payloads:
            self.held.setdefault(payload.decode(), now)
        if len(self.held) >= self.expected:
            self.done.set()


class _Streamed(_Consumer):
    """A stream with credit: items are pushed to it; it completes each lease over the stream."""

    name = "stream"

    def consume(self) -> None:
        with Stream(self.url, self.queue, credit=CREDIT) as stream:
            self.ready.set()
            while not self.done.is_set() and not self.stop.is_set():
                # Short receive windows, so a stop is seen within one.
                for lease in stream.leases(timeout=0.5):
                    self._hold([item.payload for item in lease.items])
                    stream.complete(lease.partition, lease.ids)
                    if self.done.is_set():
                        return


class _LongPolled(_Consumer):
    """A long-poll that calls ``queue.lease`` again as soon as the previous call returns."""

    name = "long-poll"

    def consume(self) -> None:
        with Client(self.url) as client:
            while not self.done.is_set() and not self.stop.is_set():
                self.ready.set()  # about to wait in the server
                lease = client.lease(self.queue, request_timeout=POLL_WAIT)
                if lease.items:
                    self._hold([item.payload for item in lease.items])
                    client.complete(self.queue, lease.items)


def _wait_all(events: Sequence[threading.Event], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    return all(event.wait(max(0.0, deadline - time.monotonic())) for event in events)


def _check(consumers: Sequence[_Consumer]) -> None:
    for consumer in consumers:
        if consumer.failure is not None:
            raise RuntimeError(f"the {consumer.name} consumer failed") from consumer.failure


def measure_rate(url: str, producer: Client, rate: float, items: int) -> list[Summary]:
    """One rate: both consumers waiting, ``items`` produced into each queue on the schedule."""
    suffix = uuid.uuid4().hex[:8]
    streamed = _Streamed(url, f"bench-stream-{suffix}", items + 1)
    polled = _LongPolled(url, f"bench-poll-{suffix}", items + 1)
    consumers: list[_Consumer] = [streamed, polled]
    for consumer in consumers:
        producer.create_queue(consumer.queue, lease_timeout="30s", expire_timeout="1h")
    try:
        for consumer in consumers:
            consumer.start()
        if not _wait_all([c.ready for c in consumers], 10.0):
            raise RuntimeError("a consumer did not start within 10 s")
        _check(consumers)
        # A warm-up item each (not counted): the first produce and push of a queue do one-off work.
        for consumer in consumers:
            producer.produce(consumer.queue, ["warm-up"])
        deadline = time.monotonic() + 10.0
        while not all("warm-up" in c.held for c in consumers):
            _check(consumers)
            if time.monotonic() > deadline:
                raise RuntimeError("the warm-up items were not delivered within 10 s")
            time.sleep(0.01)
        produced: dict[str, dict[str, float]] = {c.name: {} for c in consumers}
        plan = sorted(
            [(at, 0, n) for n, at in enumerate(schedule(rate, items))]
            + [(at, 1, n) for n, at in enumerate(schedule(rate, items, phase=0.5))]
        )
        # The long-poll's next call is in the server by the time the first item comes.
        start = time.perf_counter() + 0.2
        for at, which, n in plan:
            consumer = consumers[which]
            pause = start + at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            before = time.perf_counter()
            producer.produce(consumer.queue, [str(n)])
            produced[consumer.name][str(n)] = before
        _wait_all([c.done for c in consumers], DRAIN_SECONDS)
        _check(consumers)
    finally:
        for consumer in consumers:
            consumer.stop.set()
        for consumer in consumers:
            consumer.join(1.0)
        for consumer in consumers:
            # A long-poll still waiting (an item lost) is answered when its queue goes.
            with contextlib.suppress(Exception):
                producer.delete_queue(consumer.queue)
    return [
        Summary(
            rate=rate,
            consumer=consumer.name,
            latencies=tuple(
                consumer.held[payload] - at
                for payload, at in produced[consumer.name].items()
                if payload in consumer.held
            ),
            missing=sum(payload not in consumer.held for payload in produced[consumer.name]),
        )
        for consumer in consumers
    ]


def measure(url: str, rates: Sequence[float], items: int) -> list[Summary]:
    with Client(url) as producer:
        return [summary for rate in rates for summary in measure_rate(url, producer, rate, items)]


def format_table(summaries: Sequence[Summary]) -> str:
    lines = [
        "| rate | consumer | items | median ms | p95 ms | max ms |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for s in summaries:
        if not s.latencies:
            lines.append(f"| {s.rate:g}/s | {s.consumer} | 0 | | | |")
            continue
        lines.append(
            f"| {s.rate:g}/s | {s.consumer} | {len(s.latencies)} | {s.median * 1000:.1f} |"
            f" {s.p95 * 1000:.1f} | {s.max * 1000:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rate", type=float, action="append", help="items a second (repeatable; default 1 and 5)"
    )
    parser.add_argument(
        "--items", type=int, default=DEFAULT_ITEMS, help=f"items per consumer and rate ({DEFAULT_ITEMS})"
    )
    parser.add_argument("--url", help="an already running server (default: a querator serve child)")
    args = parser.parse_args(argv)
    rates = tuple(args.rate or DEFAULT_RATES)
    started = time.perf_counter()
    if args.url:
        summaries = measure(args.url, rates, args.items)
    else:
        with serve_process() as url:
            summaries = measure(url, rates, args.items)
    print("Produce-to-consumer latency, from just before the produce call to the consumer holding the item:")
    print()
    print(format_table(summaries))
    took = time.perf_counter() - started
    print(f"\n(stream credit {CREDIT}; long-poll request_timeout {POLL_WAIT}; the run took {took:.0f} s)")
    lost = sum(s.missing for s in summaries)
    if lost:
        print(f"{lost} item(s) never reached their consumer within {DRAIN_SECONDS:.0f} s", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
