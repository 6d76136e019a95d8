"""The consumer worker over the stream (``consume(mode="stream")``, ``Client.stream``) against
``querator serve``: the credit bounds what the server holds, every item reaches one handler, a stop
puts back what was pushed, and a dropped connection falls back to long-polling without losing or
doubling an item. Waits poll with a deadline."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from querator.client import Client, ConnectionFailedError, DeadLetter, LeasedItem
from querator.client import stream as stream_module
from querator.client.stream import SharedStream, StreamUnavailableError
from querator.testing import serve_process

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from querator.client.worker import WorkerReport

DEADLINE = 20.0


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serve_process("--store", "memory", "--reaper-interval", "0.5") as url:
        yield url


@pytest.fixture
def api(server: str) -> Iterator[Client]:
    with Client(server) as client:
        yield client


def fresh_queue(api: Client, **options: Any) -> str:
    name = f"sw-{uuid.uuid4().hex[:8]}"
    api.create_queue(name, lease_timeout=options.pop("lease_timeout", "30s"), expire_timeout="1h", **options)
    return name


def test_every_item_reaches_one_handler_and_the_server_holds_no_more_than_the_credit(
    server: str, api: Client
) -> None:
    # GIVEN: 40 items waiting, and a watcher with its own client
    queue = fresh_queue(api)
    api.produce(queue, [f"job {n}" for n in range(40)])
    lock = threading.Lock()
    seen: list[bytes] = []
    running = [0]
    most_running = [0]
    most_leased = [0]

    def handle(item: LeasedItem) -> None:
        with lock:
            running[0] += 1
            most_running[0] = max(most_running[0], running[0])
        with Client(server) as watcher:
            leased = watcher.stats(queue).total_leased
        with lock:
            most_leased[0] = max(most_leased[0], leased)
            seen.append(item.payload)
            running[0] -= 1

    # WHEN: a worker streams them with a credit of 4
    with Client(server) as client:
        report = client.stream(queue, handle, credit=4, max_items=40, handle_signals=False)

    # THEN: each item was handled once, never more than 4 at a time, never more than 4 held
    assert report.transport == "stream"
    assert sorted(seen) == sorted(f"job {n}".encode() for n in range(40))
    assert (report.leased, report.completed, report.settled) == (40, 40, 40)
    assert most_running[0] <= 4
    assert most_leased[0] <= 4
    assert api.stats(queue).total == 0


def test_items_produced_while_the_worker_waits_are_pushed_and_failures_are_retried_or_dead_lettered(
    server: str, api: Client
) -> None:
    dead = fresh_queue(api)
    queue = fresh_queue(api, dead_queue=dead, max_attempts=2)
    attempts: dict[bytes, int] = {}

    def handle(item: LeasedItem) -> None:
        attempts[item.payload] = item.attempts
        if item.payload == b"poison":
            raise DeadLetter("cannot be done")
        if item.payload == b"flaky" and item.attempts == 1:
            raise RuntimeError("first try fails")

    def produce_later() -> None:
        time.sleep(0.3)  # the worker is subscribed and idle by then
        api.produce(queue, ["ok", "poison", "flaky"])

    producer = threading.Thread(target=produce_later)
    producer.start()
    with Client(server) as client:
        report = client.consume(
            queue,
            handle,
            mode="stream",
            concurrency=2,
            max_items=4,
            handle_signals=False,
            backoff=lambda attempts: timedelta(milliseconds=100),
        )
    producer.join()

    assert report.transport == "stream"
    assert (report.completed, report.retried, report.dead_lettered) == (2, 1, 1)
    assert attempts == {b"ok": 1, b"poison": 1, b"flaky": 2}
    assert api.stats(queue).total == 0
    assert api.stats(dead).total == 1


def test_a_stop_puts_back_every_item_pushed_to_the_worker(server: str, api: Client) -> None:
    queue = fresh_queue(api)
    api.produce(queue, [f"job {n}" for n in range(20)])
    stop = threading.Event()
    handled: list[bytes] = []

    def handle(item: LeasedItem) -> None:
        handled.append(item.payload)
        stop.set()  # the first handler stops the worker; the other pushed items go back

    with Client(server) as client:
        report = client.stream(queue, handle, credit=3, stop=stop, handle_signals=False)

    assert report.stopped_by == "stop"
    assert report.leased == report.settled
    assert report.completed == len(handled)
    stats = api.stats(queue)
    assert stats.total_leased == 0
    assert stats.total == 20 - report.completed


def _cut_after_first_item(
    monkeypatch: pytest.MonkeyPatch, *, reopen: bool
) -> tuple[list[SharedStream], list[bytes], threading.Lock]:
    """Streams opened by the worker; the first one is cut when its first item is handled. With
    ``reopen=False`` every later open fails as on a server without a stream."""
    opened: list[SharedStream] = []
    real_open = SharedStream.open

    def recording_open(self: SharedStream) -> SharedStream:
        if opened and not reopen:
            raise StreamUnavailableError("no stream any more", sent=False)
        opened.append(self)
        return real_open(self)

    monkeypatch.setattr(stream_module.SharedStream, "open", recording_open)
    return opened, [], threading.Lock()


@pytest.mark.parametrize("reopen", [True, False])
def test_a_dropped_stream_is_opened_again_or_long_polled_and_loses_nothing(
    server: str, api: Client, monkeypatch: pytest.MonkeyPatch, reopen: bool
) -> None:
    # GIVEN: the worker's stream will be cut once its first item is handled
    queue = fresh_queue(api, lease_timeout="2s")
    api.produce(queue, [f"job {n}" for n in range(10)])
    opened, completed, lock = _cut_after_first_item(monkeypatch, reopen=reopen)

    def handle(item: LeasedItem) -> None:
        with lock:
            if not completed and opened and opened[0]._socket is not None:  # the cut
                opened[0]._socket.close()
            completed.append(item.payload)

    # WHEN: the worker runs until it has handled ten items
    with Client(server) as client:
        report = client.stream(queue, handle, credit=3, max_items=10, handle_signals=False)

    # THEN: it subscribed again (or long-polled when it could not); the items in flight on the cut
    # connection came back when their leases ran out; each payload was completed once
    assert report.transport == ("stream" if reopen else "stream, then poll")
    assert len(opened) == (2 if reopen else 1)
    deadline = time.monotonic() + DEADLINE
    while api.stats(queue).total and time.monotonic() < deadline:
        time.sleep(0.1)
    assert api.stats(queue).total == 0
    assert sorted(completed) == sorted(f"job {n}".encode() for n in range(10))
    assert report.completed + report.lost + report.unsettled == report.leased


def test_a_ping_is_answered_and_keeps_the_subscription(server: str, api: Client) -> None:
    queue = fresh_queue(api)
    with SharedStream(server, queue, credit=1, keepalive=0.3) as stream:
        deadline = time.monotonic() + DEADLINE
        while stream.pongs < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # idle: the reader pings about every 0.3 s, the server answers each
        assert stream.pongs >= 2
        api.produce(queue, ["after pings"])
        lease = next(stream.leases(timeout=DEADLINE))
        assert [item.payload for item in lease.items] == [b"after pings"]
        stream.complete(lease.partition, lease.ids)


def _failing_reopens(
    monkeypatch: pytest.MonkeyPatch, failures: int | None
) -> tuple[list[str], list[SharedStream]]:
    """Every try to open a stream, in order (``"ok"`` or ``"refused"``), and the streams opened.
    The first try opens; the next ``failures`` tries (``None``: all) fail as on a server that is
    away, and the later ones open again."""
    tries: list[str] = []
    streams: list[SharedStream] = []
    real_open = SharedStream.open

    def open_or_refuse(self: SharedStream) -> SharedStream:
        refused = len(tries) > 0 and (failures is None or len(tries) <= failures)
        tries.append("refused" if refused else "ok")
        if refused:
            raise ConnectionFailedError("connection refused", sent=False)
        streams.append(self)
        return real_open(self)

    monkeypatch.setattr(stream_module.SharedStream, "open", open_or_refuse)
    return tries, streams


def _in_thread(target: Callable[[], WorkerReport]) -> tuple[threading.Thread, list[WorkerReport]]:
    reports: list[WorkerReport] = []
    thread = threading.Thread(target=lambda: reports.append(target()), daemon=True)
    thread.start()
    return thread, reports


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"not within {DEADLINE} s: {what}"
        time.sleep(0.05)


def test_a_stream_that_cannot_be_opened_again_is_tried_with_back_off_while_the_worker_polls(
    server: str, api: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN: a streaming worker whose stream is cut at its first item, and three tries to
    # subscribe again that fail (a server restarting) before one works
    queue = fresh_queue(api, lease_timeout="2s")
    api.produce(queue, [f"first {n}" for n in range(6)])
    tries, streams = _failing_reopens(monkeypatch, failures=3)
    handled: list[bytes] = []
    lock = threading.Lock()
    stop = threading.Event()

    def handle(item: LeasedItem) -> None:
        with lock:
            if not handled and streams[0]._socket is not None:  # the cut
                streams[0]._socket.close()
            handled.append(item.payload)

    with Client(server) as client:
        thread, reports = _in_thread(
            lambda: client.stream(queue, handle, credit=2, stop=stop, handle_signals=False)
        )
        # WHEN: the worker gets its stream back after the failed tries
        _until(lambda: tries.count("ok") >= 2, "subscribed again")
        # THEN: what is produced now is handled too, and so is every item of the first batch
        api.produce(queue, [f"second {n}" for n in range(4)])
        expected = {f"first {n}".encode() for n in range(6)} | {f"second {n}".encode() for n in range(4)}
        _until(lambda: expected <= set(handled), "every item handled")
        stop.set()
        thread.join(timeout=DEADLINE)
    assert not thread.is_alive()
    (report,) = reports
    # It did not give up after one failed try: it tried until a subscribe worked, then streamed.
    assert tries == ["ok", "refused", "refused", "refused", "ok"]
    assert report.subscribed == 2
    assert report.transport == "stream, then poll"
    assert report.stopped_by == "stop"
    # Held items settled over HTTP once the stream was gone; none went uncounted.
    assert report.leased == report.settled
    _until(lambda: api.stats(queue).total == 0, "the queue emptied (items of the cut come back)")


def test_a_stop_while_the_stream_cannot_be_opened_ends_the_worker_promptly(
    server: str, api: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN: a worker whose stream was cut and cannot be opened again (tries keep failing)
    queue = fresh_queue(api)
    api.produce(queue, ["only"])
    tries, streams = _failing_reopens(monkeypatch, failures=None)
    stop = threading.Event()

    def handle(item: LeasedItem) -> None:
        if streams[0]._socket is not None:
            streams[0]._socket.close()

    with Client(server) as client:
        thread, reports = _in_thread(
            lambda: client.stream(queue, handle, credit=1, stop=stop, handle_signals=False)
        )
        _until(lambda: tries.count("refused") >= 3, "three failed tries")

        # WHEN: it is stopped during the back-off
        stopped_at = time.monotonic()
        stop.set()
        thread.join(timeout=DEADLINE)

    # THEN: it ends within a lease call's wait at most (here the back-off is under a second)
    assert not thread.is_alive()
    assert time.monotonic() - stopped_at < 3.0
    (report,) = reports
    assert (report.stopped_by, report.subscribed, report.transport) == ("stop", 1, "stream, then poll")
