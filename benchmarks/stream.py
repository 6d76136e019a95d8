"""Produce-to-consumer latency on ``querator serve``: items pushed over the stream vs a long-poll.

    uv run python -m benchmarks.stream [--items 200]

For each of ``--items`` items, one at a time: the time from the produce call (its round trip included) to the
consumer holding the item, (a) pushed over ``/v1/stream`` and (b) returned by a waiting
``queue.lease`` long-poll (``request_timeout`` 5 s). Prints the median and the 95th percentile.
Local figures (this machine, SQLite in a temporary directory), not a deployed stack's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

from querator.client import Client
from querator.client.stream import Stream
from querator.testing import serve_process


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def streamed(url: str, client: Client, count: int) -> list[float]:
    client.create_queue("bench-stream", lease_timeout="30s", expire_timeout="1h")
    latencies = []
    with Stream(url, "bench-stream", credit=1) as stream:
        for n in range(count):
            produced = time.perf_counter()
            client.produce("bench-stream", [f"{n}"])
            lease = next(stream.leases(timeout=10))
            latencies.append(time.perf_counter() - produced)
            stream.complete(lease.partition, lease.ids)
    return latencies


def long_polled(client: Client, count: int) -> list[float]:
    client.create_queue("bench-poll", lease_timeout="30s", expire_timeout="1h")
    latencies = []

    def poll(holder: dict[str, float]) -> None:
        lease = client.lease("bench-poll", request_timeout="5s")
        holder["at"] = time.perf_counter()
        client.complete("bench-poll", lease.items)

    for n in range(count):
        holder: dict[str, float] = {}
        waiter = threading.Thread(target=poll, args=(holder,))
        waiter.start()
        time.sleep(0.05)  # the poll is waiting in the server when the item arrives
        produced = time.perf_counter()
        client.produce("bench-poll", [f"{n}"])
        waiter.join(timeout=10)
        latencies.append(holder["at"] - produced)
    return latencies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200)
    args = parser.parse_args(argv)
    with serve_process() as url, Client(url) as client:
        for name, latencies in (
            ("stream", streamed(url, client, args.items)),
            ("long-poll", long_polled(client, args.items)),
        ):
            print(
                f"{name:>9}: produce-to-consumer median {statistics.median(latencies) * 1000:.1f} ms,"
                f" p95 {percentile(latencies, 0.95) * 1000:.1f} ms ({len(latencies)} items)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
