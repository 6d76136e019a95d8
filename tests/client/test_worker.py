"""The consumer worker against ``querator serve``: every item is processed and completed exactly once
or dead-lettered after ``max_attempts``, slow handlers keep their leases, and a stop (or SIGTERM, in a
child process) leaves nothing leased to a worker that is gone."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from querator.client import Client, DeadLetter, LeasedItem, QueueNotFoundError, WorkerReport

if TYPE_CHECKING:
    from collections.abc import Callable

QUICK_BACKOFF = {"backoff": lambda attempts: timedelta(milliseconds=50)}


def _wait_until(condition: Callable[[], bool], timeout: float, what: str, *, every: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def _drained(client: Client, queue_name: str) -> bool:
    stats = client.stats(queue_name)
    return stats.total == 0 and stats.scheduled == 0


def _consume_in_thread(
    client: Client, queue_name: str, handler: Callable[[LeasedItem], object], **options: object
) -> tuple[threading.Event, threading.Thread, list[WorkerReport]]:
    stop = threading.Event()
    reports: list[WorkerReport] = []
    thread = threading.Thread(
        target=lambda: reports.append(client.consume(queue_name, handler, stop=stop, **options)), daemon=True
    )
    thread.start()
    return stop, thread, reports


def _fails(payload: str, attempts: int) -> bool:
    """Deterministic 20 % failure rate: the same (item, attempt) always fails or always succeeds."""
    return int(hashlib.sha256(f"{payload}:{attempts}".encode()).hexdigest(), 16) % 5 == 0


def test_500_items_each_complete_exactly_once_or_dead_letter_after_max_attempts(
    client: Client, queue_name: str
) -> None:
    max_attempts = 3
    dead_queue = f"{queue_name}-dead"
    # A short lease, so slow handlers outlive it; not shorter, because the local server shares two
    # cores with everything else and answers in up to a second or two under load.
    client.create_queue(dead_queue, lease_timeout="4s", expire_timeout="1h")
    client.create_queue(
        queue_name,
        lease_timeout="4s",
        expire_timeout="1h",
        max_attempts=max_attempts,
        dead_queue=dead_queue,
        requested_partitions=2,
    )
    payloads = [f"item-{n:03d}" for n in range(500)]
    for start in range(0, 500, 100):
        client.produce(queue_name, payloads[start : start + 100])

    lock = threading.Lock()
    attempts_seen: dict[str, list[int]] = defaultdict(list)
    successes: Counter[str] = Counter()
    running: set[str] = set()
    overlaps: list[str] = []

    def handler(item: LeasedItem) -> None:
        payload = item.payload.decode()
        n = int(payload.split("-")[1])
        with lock:
            if payload in running:
                overlaps.append(payload)
            running.add(payload)
            attempts_seen[payload].append(item.attempts)
        try:
            if n % 50 == 7 and item.attempts == 1:
                # Past the 4 s lease: only the background renewals keep this item ours.
                time.sleep(4.5)
            if n % 97 == 3:
                raise DeadLetter("poison")
            if _fails(payload, item.attempts):
                raise RuntimeError("flaky")
        finally:
            with lock:
                running.discard(payload)
        with lock:
            successes[payload] += 1

    stop, thread, reports = _consume_in_thread(
        client, queue_name, handler, batch_size=10, concurrency=8, request_timeout=1.0, **QUICK_BACKOFF
    )
    # stats reads every item: poll it gently, the server is busy with the worker.
    _wait_until(lambda: _drained(client, queue_name), 170, "the queue to drain", every=1.0)
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
    report = reports[0]

    expected_dead: set[str] = set()
    for payload in payloads:
        n = int(payload.split("-")[1])
        if n % 97 == 3:
            expected_dead.add(payload)
            assert attempts_seen[payload] == [1]
            continue
        first_success = next((a for a in range(1, max_attempts + 1) if not _fails(payload, a)), None)
        if first_success is None:
            expected_dead.add(payload)
            assert attempts_seen[payload] == [1, 2, 3], payload
            assert successes[payload] == 0
        else:
            # Each attempt exactly once, in order, and success exactly once.
            assert attempts_seen[payload] == list(range(1, first_success + 1)), payload
            assert successes[payload] == 1, payload

    assert overlaps == []
    dead_letters = Counter(item.payload.decode() for item in client.iter_items(dead_queue))
    assert dead_letters == Counter(expected_dead)
    assert report.completed == 500 - len(expected_dead)
    assert report.dead_lettered == len(expected_dead)
    assert report.lost == report.unsettled == report.returned == 0
    assert report.leased == report.settled == sum(len(a) for a in attempts_seen.values())
    assert report.renewed >= 10
    print(f"\n500 items: {report.as_dict()}")


def test_a_slow_handler_keeps_its_lease_through_renewals(client: Client, queue_name: str) -> None:
    client.create_queue(queue_name, lease_timeout="2s", expire_timeout="1h")
    client.produce(queue_name, [b"slow"])
    seen: list[LeasedItem] = []

    def handler(item: LeasedItem) -> None:
        seen.append(item)
        time.sleep(4.5)

    report = client.consume(queue_name, handler, max_items=1, request_timeout=1.0)

    assert [item.attempts for item in seen] == [1]
    assert (report.completed, report.lost, report.stopped_by) == (1, 0, "max_items")
    assert report.renewed >= 2
    assert _drained(client, queue_name)


def test_dead_letter_on_a_chosen_exception(client: Client, queue_name: str) -> None:
    dead_queue = f"{queue_name}-dead"
    client.create_queue(dead_queue, lease_timeout="5s", expire_timeout="1h")
    client.create_queue(queue_name, lease_timeout="5s", expire_timeout="1h", dead_queue=dead_queue)
    client.produce(queue_name, [b"bad", b"good"])

    def handler(item: LeasedItem) -> None:
        if item.payload == b"bad":
            raise ValueError("cannot parse")

    report = client.consume(
        queue_name, handler, dead_letter_on=ValueError, idle_timeout=0.5, request_timeout=0.3
    )

    assert (report.completed, report.dead_lettered, report.failures, report.stopped_by) == (1, 1, 1, "idle")
    assert [i.payload for i in client.list_items(dead_queue)] == [b"bad"]


def test_a_failed_item_comes_back_after_the_backoff(client: Client, queue_name: str) -> None:
    client.create_queue(queue_name, lease_timeout="5s", expire_timeout="1h")
    client.produce(queue_name, [b"x"])
    attempts: list[int] = []

    def handler(item: LeasedItem) -> None:
        attempts.append(item.attempts)
        if item.attempts == 1:
            raise RuntimeError("once")

    report = client.consume(
        queue_name, handler, max_items=2, request_timeout=1.0, backoff=lambda _: timedelta(milliseconds=300)
    )

    assert attempts == [1, 2]
    assert (report.retried, report.completed) == (1, 1)


def test_a_stop_puts_running_items_back_at_once(client: Client, queue_name: str) -> None:
    client.create_queue(queue_name, lease_timeout="1m", expire_timeout="1h")
    client.produce(queue_name, [b"a", b"b"])
    started = threading.Event()
    release = threading.Event()

    def handler(item: LeasedItem) -> None:
        started.set()
        release.wait(10)

    stop, thread, reports = _consume_in_thread(
        client, queue_name, handler, concurrency=2, shutdown_timeout=0.2, request_timeout=0.5
    )
    _wait_until(lambda: client.stats(queue_name).total_leased == 2, 10, "both items leased")
    stop.set()
    thread.join(timeout=10)
    release.set()

    report = reports[0]
    assert (report.returned, report.completed, report.stopped_by) == (2, 0, "stop")
    # Back now, not in a minute when the lease would have run out.
    stats = client.stats(queue_name)
    assert (stats.total, stats.total_leased) == (2, 0)


def test_an_unknown_queue_fails_fast(client: Client, queue_name: str) -> None:
    with pytest.raises(QueueNotFoundError):
        client.consume(queue_name, lambda item: None)


def test_sigterm_mid_run_loses_nothing(
    client: Client, queue_name: str, served_url: str, tmp_path: Path
) -> None:
    client.create_queue(queue_name, lease_timeout="30s", expire_timeout="1h")
    payloads = [f"item-{n:03d}" for n in range(200)]
    for start in range(0, 200, 100):
        client.produce(queue_name, payloads[start : start + 100])
    log_path = tmp_path / "events.log"
    script = Path(__file__).with_name("worker_process.py")
    child = subprocess.Popen(  # noqa: S603 - our own script
        [sys.executable, str(script), served_url, queue_name, str(log_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:

        def events() -> list[tuple[str, str]]:
            if not log_path.exists():
                return []
            lines = log_path.read_text().splitlines()
            return [tuple(line.split(" ", 1)) for line in lines if " " in line]  # type: ignore[misc]

        def slow_item_running() -> bool:
            seen = events()
            done = {p for kind, p in seen if kind == "ok"}
            slow = {p for kind, p in seen if kind == "start" and p.endswith("0")}
            return len(done) >= 20 and bool(slow - done)

        _wait_until(slow_item_running, 60, "the worker to be mid-run with a slow item running")
        child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0
    report = json.loads(out.strip().splitlines()[-1])
    assert report["stopped_by"] == "SIGTERM"
    assert report["returned"] >= 1
    assert report["leased"] == report["settled"]

    # Nothing is leased to the worker that is gone: no waiting 30 s for its leases to run out.
    stats = client.stats(queue_name)
    assert stats.total_leased == 0
    remaining = [item.payload.decode() for item in client.iter_items(queue_name)]
    assert len(set(remaining)) == len(remaining)
    completed = set(payloads) - set(remaining)
    assert report["completed"] == len(completed)
    # Every completed item had a handler that succeeded. (Not the converse: a slow handler put back
    # at the stop may still have finished before the process exited; its item is delivered again.)
    assert completed <= {p for kind, p in events() if kind == "ok"}

    # And the rest is still there for the next worker.
    drained: list[str] = []
    client.consume(
        queue_name, lambda item: drained.append(item.payload.decode()), idle_timeout=0.5, request_timeout=0.3
    )
    assert sorted([*completed, *drained]) == payloads
    assert _drained(client, queue_name)


def test_an_idle_worker_stops_about_idle_timeout_after_its_last_item(client: Client, queue_name: str) -> None:
    # GIVEN the default 5 s lease wait and a queue that empties at once
    client.create_queue(queue_name, lease_timeout="5s", expire_timeout="1h")
    client.produce(queue_name, [b"only"])
    started = time.monotonic()
    # WHEN the worker may be idle for 0.5 s
    report = client.consume(queue_name, lambda item: None, idle_timeout=0.5)
    # THEN it stops soon after, not after a whole lease wait (it took 5.2 s)
    assert (report.completed, report.stopped_by) == (1, "idle")
    assert time.monotonic() - started < 4
