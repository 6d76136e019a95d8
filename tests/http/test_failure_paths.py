"""The local server's failure paths, on a server in this process (memory store): malformed framing
over a raw socket, a lease reply nobody can receive, a 5xx in the log, and stopping with requests
under way."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any
from unittest import mock
from urllib.parse import urlsplit

import pytest

from querator import bootstrap
from querator.domain.errors import StoreUnavailableError
from querator.localserver import REQUEST_LOGGER, LocalServer
from tests.http.conftest import Http, decoded, eventually, in_process_server

if TYPE_CHECKING:
    from collections.abc import Iterator

#: Small, so the 408 test waits a fraction of a second instead of the default 10 s.
BODY_TIMEOUT = 0.3


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with in_process_server(body_timeout=BODY_TIMEOUT) as local:
        yield local


@pytest.fixture
def http(server: LocalServer) -> Http:
    return Http(server.url)


def _address(server: LocalServer) -> tuple[str, int]:
    parts = urlsplit(server.url)
    assert parts.hostname == "127.0.0.1"
    assert parts.port is not None
    return parts.hostname, parts.port


def _raw(server: LocalServer, request: bytes, *, timeout: float = 5.0) -> tuple[int, dict[str, Any], bytes]:
    """Send ``request`` as is; the status, the JSON body, and what followed until the server closed."""
    with socket.create_connection(_address(server), timeout=timeout) as sock:
        sock.sendall(request)
        received = b""
        while chunk := sock.recv(65536):  # ends when the server closes the connection
            received += chunk
    head, _, rest = received.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    lines = head.lower().split(b"\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in lines if line.startswith(b"content-length:"))
    assert b"connection: close" in head.lower()
    return status, json.loads(rest[:length]), rest[length:]


def _post(path: str, body: bytes, *, length: str | None = None, extra: str = "") -> bytes:
    size = str(len(body)) if length is None else length
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {size}\r\n{extra}\r\n"
    ).encode() + body


LIST = b"{}"


@pytest.mark.parametrize(
    ("length", "extra", "says"),
    [
        ("-5", "", "Content-Length must be a number of bytes, not '-5'"),
        ("abc", "", "Content-Length must be a number of bytes, not 'abc'"),
        ("2", "Transfer-Encoding: chunked\r\n", "Transfer-Encoding is not supported"),
        ("2", "Content-Length: 3\r\n", "more than one Content-Length"),
    ],
)
def test_bad_framing_is_a_400_envelope_and_the_connection_closes(
    server: LocalServer, caplog: pytest.LogCaptureFixture, length: str, extra: str, says: str
) -> None:
    caplog.set_level(logging.DEBUG)
    # Whatever follows is not read as a request: where it would start is unknown.
    smuggled = _post("/v1/queues.list", LIST)
    status, body, after = _raw(server, _post("/v1/queues.list", LIST + smuggled, length=length, extra=extra))
    assert status == 400
    assert body["code"] == 400
    assert body["message"].startswith("Invalid request; ")
    assert says in body["message"]
    assert after == b""
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_body_shorter_than_its_length_is_a_408_after_the_read_timeout(server: LocalServer) -> None:
    started = time.monotonic()
    with socket.create_connection(_address(server), timeout=5) as sock:
        sock.sendall(_post("/v1/queues.list", b"{", length="2"))  # one byte of two, then silence
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    waited = time.monotonic() - started
    head, _, rest = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), head
    assert b"connection: close" in head.lower()
    body = json.loads(rest)
    assert body["code"] == 408
    assert body["message"].startswith("Request timeout; the body stopped arriving")
    assert BODY_TIMEOUT <= waited < 3, waited


def test_a_body_cut_short_by_the_client_is_a_400(server: LocalServer) -> None:
    with socket.create_connection(_address(server), timeout=5) as sock:
        sock.sendall(_post("/v1/queues.list", b"{", length="10"))
        sock.shutdown(socket.SHUT_WR)  # the client is done sending
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, rest = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), head
    assert "the body ended after 1 of 10 bytes" in json.loads(rest)["message"]


def test_a_lease_reply_nobody_can_receive_gives_its_items_back(
    server: LocalServer, http: Http, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)
    http.ok("/v1/queues.create", {"queue_name": "jobs", "lease_timeout": "5m", "expire_timeout": "1h"})
    lease = {"queue_name": "jobs", "batch_size": 5, "client_id": "gone", "request_timeout": "10s"}
    sock = socket.create_connection(_address(server), timeout=5)
    sock.sendall(_post("/v1/queue.lease", json.dumps(lease).encode()))
    # The lease waits on the empty queue; its client hangs up; then an item arrives. The waiting
    # lease sees nobody is left before it claims anything.
    eventually(lambda: server.waiting == 1)
    sock.close()
    http.ok("/v1/queue.produce", {"queue_name": "jobs", "items": [{"utf8": "a"}]})
    eventually(lambda: server.waiting == 0)

    # So it is leasable at once, its attempt not spent.
    again = {"queue_name": "jobs", "batch_size": 5, "client_id": "next", "request_timeout": "0s"}
    reply = http.ok("/v1/queue.lease", again)
    assert decoded(reply["items"]) == [b"a"]
    assert [item["attempts"] for item in reply["items"]] == [1]


def test_a_lease_whose_client_left_during_the_claim_gives_its_items_back(
    server: LocalServer, http: Http, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)
    http.ok("/v1/queues.create", {"queue_name": "jobs", "lease_timeout": "5m", "expire_timeout": "1h"})
    http.ok("/v1/queue.produce", {"queue_name": "jobs", "items": [{"utf8": "a"}]})
    service = bootstrap.get_service()
    claiming, hung_up = threading.Event(), threading.Event()
    real_lease = service.lease

    def slow_lease(*args: Any, **kwargs: Any) -> Any:
        leased = real_lease(*args, **kwargs)  # claimed for 5 minutes
        claiming.set()
        hung_up.wait(5)
        return leased

    lease = {"queue_name": "jobs", "batch_size": 5, "client_id": "gone"}
    with mock.patch.object(service, "lease", side_effect=slow_lease):
        sock = socket.create_connection(_address(server), timeout=5)
        sock.sendall(_post("/v1/queue.lease", json.dumps(lease).encode()))
        assert claiming.wait(5)
        sock.close()
        # The server's end has seen the close before the claim returns.
        eventually(lambda: any(c.gone for c in server._loop.connections))  # type: ignore[union-attr]
        hung_up.set()
        eventually(lambda: "not delivered" in caplog.text)

    again = {"queue_name": "jobs", "batch_size": 5, "client_id": "next"}
    reply = http.ok("/v1/queue.lease", again)
    assert decoded(reply["items"]) == [b"a"]
    assert [item["attempts"] for item in reply["items"]] == [1]
    assert "not delivered (the client closed the connection before the reply): 1 of 1" in caplog.text


@pytest.mark.allow_5xx
def test_a_5xx_is_logged_at_error_level_with_its_request_id_and_traceback(
    server: LocalServer, http: Http, caplog: pytest.LogCaptureFixture
) -> None:
    http.ok("/v1/queues.create", {"queue_name": "jobs", "lease_timeout": "1m", "expire_timeout": "1h"})
    failure = StoreUnavailableError("lease failed: the disk is on fire")
    with mock.patch.object(bootstrap.get_service(), "lease", side_effect=failure):
        reply = http.post("/v1/queue.lease", {"queue_name": "jobs", "batch_size": 1, "client_id": "c"})
    assert reply.status == 500
    request_id = reply.body["message"].removeprefix("Internal error; request id ")
    assert "fire" not in reply.body["message"]
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.levelno == logging.ERROR
    assert record.name == "querator"
    assert getattr(record, "request_id", None) == request_id
    assert getattr(record, "status", None) == 500
    assert request_id in record.getMessage()
    assert record.exc_info is not None
    assert record.exc_info[1] is failure
    assert "the disk is on fire" in caplog.text
    assert "Traceback" in logging.Formatter().format(record)


def test_stopping_answers_waiting_leases_at_once(server: LocalServer, http: Http) -> None:
    http.ok("/v1/queues.create", {"queue_name": "empty", "lease_timeout": "1m", "expire_timeout": "1h"})
    replies: list[int] = []

    def wait() -> None:
        body = {"queue_name": "empty", "batch_size": 1, "client_id": threading.current_thread().name}
        replies.append(http.post("/v1/queue.lease", {**body, "request_timeout": "20s"}).status)

    waiting = [threading.Thread(target=wait, name=f"waiter-{n}") for n in range(4)]
    for thread in waiting:
        thread.start()
    eventually(lambda: server.waiting == len(waiting))
    started = time.monotonic()
    server.stop()
    stopped = time.monotonic() - started
    for thread in waiting:
        thread.join(timeout=5)
    assert replies == [454] * len(waiting)
    # Parked leases are woken by the stop: far below their 20 s.
    assert stopped < 4, stopped


@pytest.mark.allow_5xx
def test_a_fault_of_the_local_server_itself_is_a_logged_500_not_a_dropped_connection(
    server: LocalServer, caplog: pytest.LogCaptureFixture
) -> None:
    with mock.patch("querator.localserver.events.proxy_event", side_effect=KeyError("planted")):
        status, body, _ = _raw(server, _post("/v1/queues.list", LIST))
    assert status == 500
    request_id = body["message"].removeprefix("Internal error; request id ")
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.name == "querator.localserver"
    assert getattr(record, "request_id", None) == request_id
    assert getattr(record, "status", None) == 500
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], KeyError)


def test_stopping_gives_requests_under_way_a_bounded_grace(
    server: LocalServer, http: Http, caplog: pytest.LogCaptureFixture
) -> None:
    http.ok("/v1/queues.create", {"queue_name": "jobs", "lease_timeout": "1m", "expire_timeout": "1h"})
    entered, release = threading.Event(), threading.Event()

    def stuck(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(10)
        return []

    with mock.patch.object(bootstrap.get_service(), "stats", side_effect=stuck):
        outcome: list[object] = []

        def call() -> None:
            try:
                outcome.append(http.post("/v1/queue.stats", {"queue_name": "jobs"}).status)
            except OSError as error:  # past the grace the connection closes unanswered
                outcome.append(error)

        caller = threading.Thread(target=call)
        caller.start()
        assert entered.wait(5)
        started = time.monotonic()
        server.stop(grace=0.3)
        stopped = time.monotonic() - started
        release.set()
        caller.join(5)
    # The stuck request did not hold the stop past its grace (and the server said so).
    assert stopped < 3, stopped
    assert len(outcome) == 1 and isinstance(outcome[0], OSError), outcome
    assert "stopped with 1 request(s) still under way after 0.3 s" in caplog.text


def test_connections_on_file_numbers_past_select_s_limit_are_served(server: LocalServer, http: Http) -> None:
    """select() fails on file numbers from 1024; the server waits with epoll. With this process
    (the server's too) holding 1,100 other files, every new connection gets a number past 1024: a
    lease, a long-poll woken by a produce, and a stream all work there."""
    http.ok("/v1/queues.create", {"queue_name": "jobs", "lease_timeout": "1m", "expire_timeout": "1h"})
    held: list[int] = []
    try:
        for _ in range(1100):
            held.append(os.open(os.devnull, os.O_RDONLY))
        assert min(held[-10:]) > 1024
        probe = socket.socket()
        assert probe.fileno() > 1024
        probe.close()
        replies: list[int] = []
        waiter = threading.Thread(
            target=lambda: replies.append(
                http.post(
                    "/v1/queue.lease",
                    {"queue_name": "jobs", "batch_size": 1, "client_id": "far", "request_timeout": "10s"},
                ).status
            )
        )
        waiter.start()
        eventually(lambda: server.waiting == 1)
        http.ok("/v1/queue.produce", {"queue_name": "jobs", "items": [{"utf8": "a"}]})
        waiter.join(10)
        assert replies == [200]
        from querator.client.stream import Stream  # noqa: PLC0415 - only here

        http.ok("/v1/queue.produce", {"queue_name": "jobs", "items": [{"utf8": "b"}]})
        with Stream(server.url, "jobs", credit=1) as stream:
            lease = next(stream.leases(timeout=10))
            assert len(lease.items) == 1
    finally:
        for number in held:
            os.close(number)


def _head_of(size: int) -> bytes:
    """A ``queues.list`` request whose line and headers, the blank line included, are ``size`` bytes."""
    bare = _post("/v1/queues.list", b"", extra="Connection: close\r\nX-Pad: \r\n")
    return _post("/v1/queues.list", LIST, extra=f"Connection: close\r\nX-Pad: {'p' * (size - len(bare))}\r\n")


def test_a_head_of_64_kib_is_served_and_one_byte_more_is_a_431(server: LocalServer) -> None:
    at_limit = _head_of(65_536)
    assert len(at_limit) - len(LIST) == 65_536
    status, body, _ = _raw(server, at_limit)
    assert status == 200, body

    status, body, _ = _raw(server, _head_of(65_537))
    assert status == 431
    assert body["message"] == "Request headers too large; the request line and headers are over 64 KiB"


def test_a_body_over_an_endpoints_limit_names_that_limit_and_an_unknown_path_stays_a_501(
    server: LocalServer,
) -> None:
    big = b"{" + b" " * 300_000 + b"}"
    status, body, _ = _raw(server, _post("/v1/queues.list", big, extra="Connection: close\r\n"))
    assert status == 413
    assert body["message"].endswith(f"body is {len(big)} bytes; this endpoint takes at most 262144")

    huge = b"{" + b" " * 5_000_001 + b"}"
    status, body, _ = _raw(server, _post("/v1/queues.list", huge, extra="Connection: close\r\n"))
    assert status == 413
    assert body["message"].endswith("this endpoint takes at most 262144")

    for payload in (big, huge):
        status, body, _ = _raw(server, _post("/v1/queue.frobnicate", payload, extra="Connection: close\r\n"))
        assert status == 501, body
