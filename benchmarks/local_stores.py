"""``querator serve`` on each store: items/s at depth, and resident memory once idle.

Run ``uv run python -m benchmarks.local_stores`` (``--quick`` for a smaller run; ``--depths
0,10000,100000`` for the deep case; ``--idle 600`` for the issue's ten idle minutes).

``--embedded`` runs the in-process comparison instead: ``querator.embedded`` on SQLite and engine
v3's SQLite claim log (through its port) against persist-queue and litequeue, interleaved
(``benchmarks.embedded_peers``; the peers are installed for the run only: ``uv run --with
persist-queue --with litequeue python -m benchmarks.local_stores --embedded``).

For each store (``sqlite`` in a temporary file, ``sqlite-full`` the same with ``?sync=full``,
``memory``, ``dynamodb`` = the embedded
single-threaded moto server) one ``querator serve`` child process, driven over HTTP by the Python
client from one thread. For each depth, a fresh queue is filled with ``depth`` items of 100 B (in
produce calls of 1,000), then:

- ``produce bN``: ``count`` items of 100 B in produce calls of N items;
- ``lease+complete bN``: lease N items, complete them, until ``count`` items were delivered (the
  queue keeps about ``depth`` items behind them).

RSS is the server's resident memory (``/proc/<pid>/status``) after the runs and again after ``idle``
seconds with nothing to do but the reaper (every second): it should stay flat.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks import embedded_peers
from querator.client import Client

if TYPE_CHECKING:
    from collections.abc import Iterator

STORES = ("sqlite", "memory", "dynamodb")
DEPTHS = (0, 10_000)
BATCHES = (10, 100)
COUNT = 1000
QUICK_COUNT = 200
IDLE_SECONDS = 20.0
PAYLOAD = b"p" * 100


@dataclass
class Row:
    store: str
    depth: int
    fill_s: float
    produce: dict[int, float]
    deliver: dict[int, float]


@contextlib.contextmanager
def serve(store: str, workdir: Path) -> Iterator[tuple[str, int]]:
    """``querator serve --store`` in a child process; yields its URL and PID, then SIGTERM by PID."""
    url_arg = {
        "sqlite": f"sqlite:{workdir / 'bench.db'}",
        # Every commit flushed to disk: what a 200 survives an OS crash or a power cut with.
        "sqlite-full": f"sqlite:{workdir / 'bench.db'}?sync=full",
    }.get(store, store)
    child = subprocess.Popen(  # noqa: S603 - our own module, fixed arguments
        [sys.executable, "-m", "querator.cli", "serve", "--port", "0", "--quiet", "--store", url_arg],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert child.stdout is not None  # noqa: S101
        line = child.stdout.readline().strip()
        if not line.startswith("Querator listening on "):
            raise RuntimeError(f"querator serve --store {url_arg} did not start: {line!r}")
        yield line.removeprefix("Querator listening on "), child.pid
    finally:
        child.terminate()
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _produce(client: Client, queue: str, count: int, batch: int) -> float:
    started = time.perf_counter()
    for start in range(0, count, batch):
        client.produce(queue, [PAYLOAD] * min(batch, count - start))
    return count / (time.perf_counter() - started)


def _deliver(client: Client, queue: str, count: int, batch: int) -> float:
    started = time.perf_counter()
    done = 0
    while done < count:
        lease = client.lease(queue, min(batch, count - done), request_timeout="2s")
        if not lease.items:
            raise RuntimeError(f"{queue}: nothing to lease after {done} of {count}")
        client.complete(queue, lease.items)
        done += len(lease.items)
    return count / (time.perf_counter() - started)


def measure_store(
    store: str, depths: tuple[int, ...], count: int, idle: float
) -> tuple[list[Row], float, float]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="querator-bench-") as tmp, serve(store, Path(tmp)) as (url, pid):
        with Client(url, timeout=300) as client:
            for depth in depths:
                queue = f"bench-{depth}"
                client.create_queue(queue, lease_timeout="5m", expire_timeout="24h")
                started = time.perf_counter()
                _produce(client, queue, depth, 1000) if depth else None
                fill = time.perf_counter() - started
                # Past the cursor's lag (1 s), so leases may move the cursor over the fill.
                time.sleep(1.5)
                produce = {b: _produce(client, queue, count, b) for b in BATCHES}
                time.sleep(1.5)
                deliver = {b: _deliver(client, queue, count, b) for b in BATCHES}
                rows.append(Row(store, depth, fill, produce, deliver))
                print(f"  {store} depth {depth:,}: done", file=sys.stderr, flush=True)
        loaded = rss_mb(pid)
        time.sleep(idle)
        return rows, loaded, rss_mb(pid)


def report(results: list[tuple[list[Row], float, float]], idle: float) -> str:
    head = (
        f"{'store':9} {'depth':>7} | {'fill s':>7} | "
        + " ".join(f"{'produce b' + str(b):>12}" for b in BATCHES)
        + " | "
        + " ".join(f"{'lease+cmpl b' + str(b):>15}" for b in BATCHES)
        + f" | {'RSS MB':>7} {'idle':>7}"
    )
    lines = ["local server, items/s over HTTP (one client thread, 100 B items)", head, "-" * len(head)]
    for rows, loaded, idle_rss in results:
        for n, row in enumerate(rows):
            memory = f"{loaded:7.0f} {idle_rss:7.0f}" if n == len(rows) - 1 else " " * 15
            lines.append(
                f"{row.store:9} {row.depth:>7,} | {row.fill_s:7.1f} | "
                + " ".join(f"{row.produce[b]:12,.0f}" for b in BATCHES)
                + " | "
                + " ".join(f"{row.deliver[b]:15,.0f}" for b in BATCHES)
                + f" | {memory}"
            )
    lines.append(
        f"RSS: the server's resident memory after the runs, and after {idle:g} s idle (reaper only)."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_COUNT} items per run")
    parser.add_argument(
        "--stores", default=",".join(STORES), help="comma-separated: sqlite,sqlite-full,memory,dynamodb"
    )
    parser.add_argument("--depths", default=",".join(map(str, DEPTHS)), help="items already queued")
    parser.add_argument("--idle", type=float, default=IDLE_SECONDS, metavar="SECONDS")
    parser.add_argument(
        "--embedded",
        action="store_true",
        help="in process instead: SQLite against persist-queue and litequeue (benchmarks.embedded_peers)",
    )
    args = parser.parse_args(argv)
    if args.embedded:
        return embedded_peers.main(["--quick"] if args.quick else [])
    count = QUICK_COUNT if args.quick else COUNT
    depths = tuple(int(d) for d in args.depths.split(","))
    results = [measure_store(s, depths, count, args.idle) for s in args.stores.split(",")]
    print(report(results, args.idle))
    return 0


if __name__ == "__main__":
    sys.exit(main())
