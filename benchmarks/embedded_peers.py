"""The embedded SQLite store in process against persist-queue and litequeue, in one interleaved run.

Run ``uv run --with persist-queue --with litequeue python -m benchmarks.local_stores --embedded``
(or ``python -m benchmarks.embedded_peers``; ``--quick`` for a smaller run). The peers are installed
for the benchmark only (``--with``): they are not dependencies of the project, and the run stops
with that command when one is missing.

Four queues, each in its own file of a temporary directory, with the same durability: WAL and
``synchronous=NORMAL`` (a commit survives the process being killed, not an OS crash; Querator's
default, litequeue's own setting, and set on persist-queue's connection, whose default is FULL):

- ``querator``: ``querator.embedded.Embedded("sqlite:PATH")``, the whole in-process path a user
  calls (client, request validation, service, store; the reaper thread running);
- ``claim log``: engine v3's ``SQLiteClaimLog`` through its port (``append``, ``claim`` + ``settle``),
  the store alone, without the service above it;
- ``persist-queue``: ``persistqueue.SQLiteAckQueue`` (``put``, ``get`` + ``ack``);
- ``litequeue``: ``litequeue.LiteQueue`` (``put``, ``pop`` + ``done``).

``count`` items of 100 B each per workload: ``produce b1`` (one item a call), ``produce b100``
(Querator: 100 items a call; litequeue: 100 ``put`` in one transaction; persist-queue has no batch
put, so none), then ``lease+complete b1`` (one item leased and completed a call; the peers have no
batch lease: their per-item get + ack). Each workload runs in ``rounds`` rounds, and in each round
every queue takes its share in turn (the order rotating), so a slow spell of the shared machine
falls on all four. Items/s is items over the summed time of a queue's rounds; each ratio is one of
Querator's (``querator``, then ``claim log``) items/s over the best peer's.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from querator.domain.model import UTC, Item
from querator.embedded import Embedded
from querator.ports import Guard
from querator.ports.log import LogKey, Settlement
from querator.storage.sqlite import SQLiteClaimLog, SQLiteDatabase

if TYPE_CHECKING:
    from collections.abc import Callable

COUNT = 10_000
QUICK_COUNT = 2_000
ROUNDS = 5
PAYLOAD = b"p" * 100
BATCH = 100
INSTALL = "uv run --with persist-queue --with litequeue python -m benchmarks.local_stores --embedded"
#: The workloads, in the order they run (the lease workload consumes what the produce ones wrote).
WORKLOADS = ("produce b1", "produce b100", "lease+complete b1")
#: What every queue is set to, said in the report.
DURABILITY = "WAL, synchronous=NORMAL"


class _Querator:
    name = "querator"

    def __init__(self, directory: Path) -> None:
        self._queue = Embedded(f"sqlite:{directory / 'querator.db'}")
        self._queue.create_queue("bench", lease_timeout="5m", expire_timeout="24h")

    def produce(self, count: int, batch: int) -> None:
        for start in range(0, count, batch):
            self._queue.produce("bench", [PAYLOAD] * min(batch, count - start))

    def deliver(self, count: int) -> None:
        for _ in range(count):
            lease = self._queue.lease("bench", 1)
            if not lease.items:
                raise RuntimeError("querator: nothing to lease")
            self._queue.complete("bench", lease.items)

    def close(self) -> None:
        self._queue.close()


class _ClaimLog:
    """Engine v3's SQLite claim log through its port (``SQLiteClaimLog``: append / claim / settle),
    without the service above it: the store's own speed, what issue 35's embedded rows measure."""

    name = "claim log"

    def __init__(self, directory: Path) -> None:
        self._database = SQLiteDatabase(directory / "claim-log.db")
        self._log = SQLiteClaimLog(self._database)
        self._key = LogKey("bench", 0)

    def produce(self, count: int, batch: int) -> None:
        now = datetime.now(UTC)
        item = Item(id="", payload=PAYLOAD, created_at=now, expire_deadline=now + timedelta(hours=24))
        for start in range(0, count, batch):
            self._log.append(self._key, [item] * min(batch, count - start), now=datetime.now(UTC))

    def deliver(self, count: int) -> None:
        for _ in range(count):
            now = datetime.now(UTC)
            claim = self._log.claim(self._key, count=1, deadline=now + timedelta(minutes=5), now=now)
            if not claim.items:
                raise RuntimeError("claim log: nothing to claim")
            self._log.settle(self._key, [Settlement(id=claim.items[0].id)], guard=Guard.LEASE_VALID, now=now)

    def close(self) -> None:
        self._database.close()


class _PersistQueue:
    name = "persist-queue"

    def __init__(self, directory: Path) -> None:
        # Installed for the benchmark only (not a project dependency, so not typed either).
        self._queue = importlib.import_module("persistqueue").SQLiteAckQueue(
            str(directory / "persist-queue"), auto_resume=False
        )
        # Its connection is WAL already; NORMAL as the others (sqlite3's default is FULL).
        self._queue._conn.execute("PRAGMA synchronous = NORMAL")  # no public setting

    def produce(self, count: int, batch: int) -> None:
        if batch != 1:
            raise ValueError("persist-queue has no batch put")
        for _ in range(count):
            self._queue.put(PAYLOAD)

    def deliver(self, count: int) -> None:
        for _ in range(count):
            item = self._queue.get(block=False, raw=True)
            self._queue.ack(id=item["pqid"])

    def close(self) -> None:
        self._queue.close()


class _LiteQueue:
    name = "litequeue"

    def __init__(self, directory: Path) -> None:
        # It sets WAL and synchronous=NORMAL itself.
        self._queue = importlib.import_module("litequeue").LiteQueue(str(directory / "litequeue.db"))
        self._payload = PAYLOAD.decode()  # it stores text

    def produce(self, count: int, batch: int) -> None:
        if batch == 1:
            for _ in range(count):
                self._queue.put(self._payload)
            return
        for start in range(0, count, batch):
            with self._queue.transaction(mode="IMMEDIATE"):
                for _ in range(min(batch, count - start)):
                    self._queue.put(self._payload)

    def deliver(self, count: int) -> None:
        for _ in range(count):
            message = self._queue.pop()
            if message is None:
                raise RuntimeError("litequeue: nothing to pop")
            self._queue.done(message.message_id)

    def close(self) -> None:
        self._queue.close()


PEERS: tuple[Callable[[Path], Any], ...] = (_PersistQueue, _LiteQueue)


def _check_peers() -> None:
    """Stop with the command that installs the peers when one is missing."""
    missing = []
    for module in ("persistqueue", "litequeue"):
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise SystemExit(
            f"benchmarks.embedded_peers needs {', '.join(missing)} (not a project dependency);"
            f" run\n  {INSTALL}"
        )


@dataclass
class Result:
    """Seconds and items per queue and workload, summed over the rounds."""

    seconds: dict[tuple[str, str], float] = field(default_factory=dict)
    items: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(self, queue: str, workload: str, items: int, seconds: float) -> None:
        key = (queue, workload)
        self.seconds[key] = self.seconds.get(key, 0.0) + seconds
        self.items[key] = self.items.get(key, 0) + items

    def rate(self, queue: str, workload: str) -> float | None:
        seconds = self.seconds.get((queue, workload))
        return None if seconds is None else self.items[(queue, workload)] / seconds


def _supports(queue: Any, workload: str) -> bool:
    return not (workload == "produce b100" and isinstance(queue, _PersistQueue))


def measure(count: int = COUNT, rounds: int = ROUNDS) -> tuple[Result, list[str]]:
    """Every workload over the three queues, interleaved; the result and the queues' names."""
    _check_peers()
    share = count // rounds
    result = Result()
    with tempfile.TemporaryDirectory(prefix="querator-peers-") as tmp:
        queues = [_Querator(Path(tmp)), _ClaimLog(Path(tmp)), *(peer(Path(tmp)) for peer in PEERS)]
        try:
            for workload in WORKLOADS:
                for round_ in range(rounds):
                    # Rotated each round: no queue always runs first (a cold cache) or last.
                    for queue in queues[round_ % len(queues) :] + queues[: round_ % len(queues)]:
                        if not _supports(queue, workload):
                            continue
                        started = time.perf_counter()
                        if workload == "lease+complete b1":
                            queue.deliver(share)
                        else:
                            queue.produce(share, BATCH if workload == "produce b100" else 1)
                        result.add(queue.name, workload, share, time.perf_counter() - started)
                print(f"  {workload}: done", file=sys.stderr, flush=True)
        finally:
            for queue in queues:
                queue.close()
    return result, [queue.name for queue in queues]


#: The queues that are Querator's, each compared with the best peer.
OURS = ("querator", "claim log")


def report(result: Result, names: list[str], count: int, rounds: int) -> str:
    ours = [name for name in names if name in OURS]
    head = (
        f"{'workload':18} | "
        + " ".join(f"{name:>14}" for name in names)
        + " | "
        + " ".join(f"{name + '/best peer':>20}" for name in ours)
    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        f"embedded, in process: items/s, {count:,} items of 100 B per workload in {rounds} interleaved"
        f" rounds; every queue {DURABILITY}; load average at the end {load} ({os.cpu_count()} CPUs)",
        head,
        "-" * len(head),
    ]
    for workload in WORKLOADS:
        rates = {name: result.rate(name, workload) for name in names}
        peers = [rate for name, rate in rates.items() if name not in OURS and rate is not None]
        ratios = []
        for name in ours:
            rate = rates[name]
            ratios.append(f"{rate / max(peers):19.2f}x" if rate is not None and peers else f"{'-':>20}")
        lines.append(
            f"{workload:18} | "
            + " ".join(f"{rate:14,.0f}" if rate is not None else f"{'-':>14}" for rate in rates.values())
            + " | "
            + " ".join(ratios)
        )
    lines.append(
        "querator: Embedded('sqlite:PATH'), produce b100 = 100 items a call; claim log: engine v3's"
        " SQLiteClaimLog through its port (append; claim 1 + settle); persist-queue: SQLiteAckQueue"
        " (no batch put); litequeue: LiteQueue, b100 = 100 puts in one transaction. lease+complete b1:"
        " lease 1 + complete / claim + settle / get + ack / pop + done."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_COUNT:,} items per workload")
    parser.add_argument("--count", type=int, help=f"items per workload (default {COUNT:,})")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    count = args.count or (QUICK_COUNT if args.quick else COUNT)
    result, names = measure(count, args.rounds)
    print(report(result, names, count, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
