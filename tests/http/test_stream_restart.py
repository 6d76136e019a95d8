"""A streaming consumer across a restart of ``querator serve`` (issue 32, point 5): the server gets
SIGTERM with streams open, a new one starts on the same port and SQLite file, and the worker
(``Client.stream``) streams again from the new server without losing an item. Waits poll with a
deadline."""

from __future__ import annotations

import socket
import threading
import time
from typing import TYPE_CHECKING

import pytest

from querator.client import Client, LeasedItem
from querator.client import stream as stream_module
from querator.client.stream import SharedStream, Stream
from querator.testing import serve_process

if TYPE_CHECKING:
    from collections.abc import Callable

    from querator.client.worker import WorkerReport

pytestmark = pytest.mark.slow

#: Bounds every wait: two server starts and a back-off capped at 5 s fit well inside.
DEADLINE = 60.0
#: The close code of a server that stops: 1001 "server stopping", sent to every stream on the way out
#: (a connection that just ends would be 1006, which the client treats alike).
GONE = {1001}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"not within {DEADLINE} s: {what}"
        time.sleep(0.05)


def test_a_stream_worker_streams_again_after_the_server_restarts(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN: a server on a fixed port and a SQLite file; a worker streaming from it; every
    # subscribe that worked and every item pushed, with when
    serve = ("--store", f"sqlite:{tmp_path / 'querator.db'}", "--port", str(_free_port()))
    subscribed_at: list[float] = []
    pushed: list[tuple[float, str]] = []
    real_open = SharedStream.open
    real_feed = stream_module._Assembler.feed

    def recording_open(self: SharedStream) -> SharedStream:
        opened = real_open(self)
        subscribed_at.append(time.monotonic())
        return opened

    def recording_feed(self: stream_module._Assembler, message: dict) -> list:
        leases = real_feed(self, message)
        pushed.extend((time.monotonic(), item.id) for lease in leases for item in lease.items)
        return leases

    monkeypatch.setattr(stream_module.SharedStream, "open", recording_open)
    monkeypatch.setattr(stream_module._Assembler, "feed", recording_feed)
    handled: dict[bytes, list[str]] = {}
    lock = threading.Lock()
    stop = threading.Event()
    reports: list[WorkerReport] = []

    def handle(item: LeasedItem) -> None:
        with lock:
            handled.setdefault(item.payload, []).append(item.id)

    with serve_process(*serve) as url, Client(url) as api:
        api.create_queue("jobs", lease_timeout="2s", expire_timeout="1h")
        worker_client = Client(url)
        worker = threading.Thread(
            target=lambda: reports.append(
                worker_client.stream("jobs", handle, credit=3, stop=stop, handle_signals=False)
            ),
            daemon=True,
        )
        worker.start()
        api.produce("jobs", [f"before {n}" for n in range(10)])
        _until(lambda: len(handled) == 10, "the first ten items handled")
        # A second consumer's stream, open and idle when the server stops.
        bystander = Stream(url, "jobs", credit=1).open()
        # WHEN: the server gets SIGTERM (serve_process's exit: terminate() by PID, then it waits
        # for the child to exit by itself) ...
    stopped_at = time.monotonic()

    # THEN: the open streams are told the server went away (1001), not left to time out
    assert list(bystander.leases(timeout=DEADLINE)) == []
    assert bystander.closed_by is not None
    assert bystander.closed_by.code in GONE, bystander.closed_by
    bystander.close()
    assert worker.is_alive()  # the worker keeps going while the server is away

    # ... and a new server starts on the same port and file, where more items are produced
    with serve_process(*serve) as again, Client(again) as api:
        restarted_at = time.monotonic()
        _until(lambda: any(at > restarted_at for at in subscribed_at), "the worker subscribed again")
        api.produce("jobs", [f"after {n}" for n in range(10)])
        expected = {f"{when} {n}".encode() for when in ("before", "after") for n in range(10)}
        _until(lambda: set(handled) == expected, "every item handled")
        _until(lambda: api.stats("jobs").total == 0, "every item completed")
        stop.set()
        worker.join(timeout=DEADLINE)
        assert not worker.is_alive()
    worker_client.close()

    (report,) = reports
    # The worker streamed again after the restart: subscribed twice, and the items produced on the
    # new server were pushed to it, not long-polled.
    assert report.subscribed >= 2
    assert min(subscribed_at[1:]) > stopped_at
    pushed_after = {item_id for at, item_id in pushed if at > restarted_at}
    for n in range(10):
        assert set(handled[f"after {n}".encode()]) <= pushed_after, n
    assert report.closed_by.split(" ")[0] in {str(code) for code in GONE}, report.closed_by
    assert report.stopped_by == "stop"
    assert report.leased == report.settled
