"""What the event-loop server promises beyond the API: waiting long-polls woken by produce, one wake
per item (not a herd), a connection ceiling answered 503, and streams closed 1001 on SIGTERM.

In-process servers (memory store) where the test needs to see inside; ``querator serve`` children
where it needs a signal. Every wait polls with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from typing import TYPE_CHECKING, Any
from unittest import mock
from urllib.parse import urlsplit

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from querator import bootstrap
from querator.client.stream import Stream, stream_url
from querator.config import EnvVar
from querator.service.logs import is_log_id
from querator.testing import serve_process
from tests.http.conftest import Http, eventually, in_process_server

if TYPE_CHECKING:
    from collections.abc import Iterator

    from querator.localserver import LocalServer

pytestmark = pytest.mark.server

DEADLINE = 15.0


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[LocalServer]:
    with in_process_server(max_connections=getattr(request, "param", 10_000)) as local:
        yield local


@pytest.fixture
def http(server: LocalServer) -> Http:
    return Http(server.url)


def _create(http: Http, name: str = "jobs") -> None:
    http.ok("/v1/queues.create", {"queue_name": name, "lease_timeout": "1m", "expire_timeout": "1h"})


class Attempts:
    """Counts the lease calls the handlers make (each one reads the store)."""

    def __init__(self, service: Any) -> None:
        self.count = 0
        self._lock = threading.Lock()
        self._lease = service.lease

    def lease(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.count += 1
        return self._lease(*args, **kwargs)


def _long_polls(http: Http, count: int, replies: list[Any], *, name: str = "jobs") -> list[threading.Thread]:
    def poll(n: int) -> None:
        body = {"queue_name": name, "batch_size": 1, "client_id": f"c{n}", "request_timeout": "10s"}
        replies.append(http.post("/v1/queue.lease", body))

    threads = [threading.Thread(target=poll, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    return threads


def test_a_produce_wakes_one_waiting_long_poll_per_item_not_all(server: LocalServer, http: Http) -> None:
    _create(http)
    replies: list[Any] = []
    threads = _long_polls(http, 8, replies)
    eventually(lambda: server.waiting == 8)
    attempts = Attempts(bootstrap.get_service())
    with mock.patch.object(bootstrap.get_service(), "lease", side_effect=attempts.lease):
        http.ok("/v1/queue.produce", {"queue_name": "jobs", "items": [{"utf8": "a"}, {"utf8": "b"}]})
        eventually(lambda: len(replies) == 2)
        # The two woken leased one item each (all they asked for), so each passed a wake on: at
        # most four lease calls, where waking every waiter would make eight.
        eventually(lambda: server.waiting == 6)
    assert sorted(r.status for r in replies) == [200, 200]
    assert 2 <= attempts.count <= 4, attempts.count
    server.stop()  # the six still waiting answer now
    for thread in threads:
        thread.join(DEADLINE)
    assert sorted(r.status for r in replies) == [200] * 2 + [454] * 6


def test_idle_waiting_costs_lease_calls_per_queue_not_per_waiter(server: LocalServer, http: Http) -> None:
    _create(http)
    replies: list[Any] = []
    threads = _long_polls(http, 20, replies)
    eventually(lambda: server.waiting == 20)
    attempts = Attempts(bootstrap.get_service())
    probes: list[str] = []
    waiters = server._loop.waiters  # type: ignore[union-attr]
    real_probe = waiters._probe

    def probe(queue_name: str) -> None:
        probes.append(queue_name)
        real_probe(queue_name)

    with (
        mock.patch.object(bootstrap.get_service(), "lease", side_effect=attempts.lease),
        mock.patch.object(waiters, "_probe", side_effect=probe),
    ):
        # Counted from a probe on, when the waiters' first calls are long done.
        eventually(lambda: len(probes) >= 1)
        first = attempts.count
        eventually(lambda: len(probes) >= 5)
        seen = attempts.count - first
    # A probe wakes one waiter of the queue: one lease call per probe, whatever the number waiting.
    assert seen <= 5, seen
    server.stop()
    for thread in threads:
        thread.join(DEADLINE)
    assert [r.status for r in replies] == [454] * 20


def test_a_waiting_long_poll_finds_a_scheduled_item_coming_due(server: LocalServer, http: Http) -> None:
    _create(http)
    replies: list[Any] = []
    threads = _long_polls(http, 1, replies)
    eventually(lambda: server.waiting == 1)
    # Due in a second: no write wakes the waiter when it comes due; the queue's probe does.
    http.ok("/v1/queue.produce", {"queue_name": "jobs", "items": [{"utf8": "later", "enqueue_at": _in(1)}]})
    threads[0].join(DEADLINE)
    assert [r.status for r in replies] == [200]


def _in(seconds: float) -> str:
    from datetime import datetime, timedelta, timezone  # noqa: PLC0415 - only here

    return (datetime.now(timezone.utc) + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def _connect(server: LocalServer) -> socket.socket:
    parts = urlsplit(server.url)
    assert parts.hostname is not None and parts.port is not None
    return socket.create_connection((parts.hostname, parts.port), timeout=DEADLINE)


def _request(sock: socket.socket, head: str) -> bytes:
    """Send a request head; what came back until the server closed or a whole reply arrived."""
    sock.sendall(head.encode())
    received = b""
    while b"\r\n\r\n" not in received or len(received.partition(b"\r\n\r\n")[2]) < _length(received):
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += chunk
    return received


def _length(received: bytes) -> int:
    for line in received.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


HEALTH = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
UPGRADE = (
    "GET /v1/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
)


@pytest.mark.parametrize("server", [3], indirect=True)
def test_past_the_ceiling_a_connection_is_answered_503_never_dropped(server: LocalServer) -> None:
    held = [_connect(server) for _ in range(3)]
    try:
        for sock in held:  # each is open and served (keep-alive)
            assert _request(sock, HEALTH).startswith(b"HTTP/1.1 200 ")
        eventually(lambda: server.open_connections == 3)
        for head in (HEALTH, UPGRADE):
            with _connect(server) as extra:
                reply = _request(extra, head)
                status, _, rest = reply.partition(b"\r\n\r\n")
                assert status.startswith(b"HTTP/1.1 503 "), reply
                assert b"Retry-After: 1" in status and b"Connection: close" in status
                body = json.loads(rest)
                assert b'", "' not in rest  # as compact as the handlers' envelopes
                assert body["code"] == 503
                assert body["message"].startswith("Service unavailable; the server holds its limit of 3")
                assert body["code_text"] == "Service Unavailable"
                assert extra.recv(1) == b""  # then closed, cleanly
        # One goes: room for one more again.
        held.pop().close()
        eventually(lambda: server.open_connections == 2)
        with _connect(server) as again:
            assert _request(again, HEALTH).startswith(b"HTTP/1.1 200 ")
    finally:
        for sock in held:
            sock.close()


@pytest.mark.slow
def test_sigterm_closes_every_open_stream_with_1001() -> None:
    codes: list[int | None] = []
    with contextlib.ExitStack() as open_streams:
        with serve_process("--store", "memory") as url:
            Http(url).ok(
                "/v1/queues.create", {"queue_name": "q", "lease_timeout": "1m", "expire_timeout": "1h"}
            )
            streams = [
                open_streams.enter_context(connect(stream_url(url), open_timeout=DEADLINE)) for _ in range(3)
            ]
            for ws in streams:
                ws.send(json.dumps({"type": "subscribe", "queue_name": "q", "credit": 1}))
                assert json.loads(ws.recv(timeout=DEADLINE))["type"] == "subscribed"
        # serve_process sent SIGTERM and waited for the child to exit.
        for ws in streams:
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=DEADLINE)
            codes.append(closed.value.rcvd.code if closed.value.rcvd is not None else None)
    assert codes == [1001, 1001, 1001]


def test_a_produce_on_engine_v3_wakes_a_waiting_stream_with_the_logs_items() -> None:
    # A server on engine v3's claim logs (``QUERATOR_ENGINE=3``): the stream is woken by the produce
    # call, whatever engine stores its items.
    with mock.patch.dict(os.environ, {EnvVar.ENGINE: "3"}), in_process_server() as server:
        http = Http(server.url)
        _create(http)
        woken: list[tuple[str, int]] = []
        waiters = server._loop.waiters  # type: ignore[union-attr]
        notify = waiters.notify

        def spied(queue_name: str, count: int) -> None:
            woken.append((queue_name, count))
            notify(queue_name, count)

        with Stream(server.url, "jobs", credit=5) as stream, mock.patch.object(waiters, "notify", spied):
            eventually(lambda: server.waiting == 1)
            http.ok("/v1/queue.produce", {"queue_name": "jobs", "items": [{"utf8": "a"}, {"utf8": "b"}]})
            lease = next(stream.leases(timeout=DEADLINE))
            assert [item.payload for item in lease.items] == [b"a", b"b"]
            assert all(is_log_id(item.id) for item in lease.items)
            assert ("jobs", 2) in woken
            stream.complete(lease.partition, lease.ids)
