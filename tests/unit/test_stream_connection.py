"""The local server's stream connection (``querator.stream.local``) on a socket pair: message limits,
the close on the server stopping, and how each end of a connection is logged.

The client side is ``wsproto``'s client, so frames are masked as a browser's are; the connection
runs on an event loop in a thread of its own and every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import threading
from typing import TYPE_CHECKING, Any

import pytest
from wsproto.connection import Connection, ConnectionType
from wsproto.events import CloseConnection, TextMessage

from querator.localserver.waiting import Waiters
from querator.stream import local, protocol
from querator.stream.local import StreamConnection

if TYPE_CHECKING:
    from collections.abc import Iterator

DEADLINE = 10.0


def fake_api(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    if path == "/v1/queues.info":
        return 200, {"queue_name": body["queue_name"], "lease_timeout": "30s"}
    return 454, {
        "code": 454,
        "code_text": "Retry Request",
        "message": "Valid request that cannot succeed now",
    }


class Client:
    """The client end of a socket pair, speaking WebSocket with wsproto."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.settimeout(DEADLINE)
        self.ws = Connection(ConnectionType.CLIENT)
        self.closed: CloseConnection | None = None

    def send(self, text: str) -> None:
        self.sock.sendall(self.ws.send(TextMessage(data=text)))

    def messages(self) -> Iterator[dict[str, Any]]:
        """Messages received until the server closes (its close frame, or the socket's end)."""
        while self.closed is None:
            data = self.sock.recv(1 << 16)
            if not data:
                return
            self.ws.receive_data(data)
            for event in self.ws.events():
                if isinstance(event, TextMessage):
                    yield json.loads(event.data)
                elif isinstance(event, CloseConnection):
                    self.closed = event
                    return

    def next(self) -> dict[str, Any]:
        return next(self.messages())


class Served:
    """A ``StreamConnection`` on the server end of a socket pair, on an event loop in a thread."""

    def __init__(self, server_end: socket.socket) -> None:
        self.loop = asyncio.new_event_loop()
        self.stopping = asyncio.Event()
        self._server_end = server_end
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._run(),), daemon=True)

    async def _run(self) -> str:
        reader, writer = await asyncio.open_connection(sock=self._server_end)
        try:
            return await StreamConnection(
                reader,
                writer,
                api=fake_api,
                run=lambda call: self.loop.run_in_executor(None, call),
                waiters=Waiters(self.loop),
                stopping=self.stopping,
            ).run()
        finally:
            writer.close()
            await asyncio.sleep(0)  # the transport closes its socket on the next turn of the loop

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stopping.set)


@pytest.fixture
def served() -> Iterator[tuple[Client, Served]]:
    server_end, client_end = socket.socketpair()
    served = Served(server_end)
    served.thread.start()
    try:
        yield Client(client_end), served
    finally:
        client_end.close()
        served.thread.join(timeout=DEADLINE)
        if not served.thread.is_alive():
            served.loop.run_until_complete(served.loop.shutdown_default_executor())
            served.loop.close()


def test_a_message_over_the_limit_is_answered_and_closed_1009_before_it_ends(
    served: tuple[Client, Served],
) -> None:
    client, connection = served
    thread = connection.thread
    # One text frame that says it is 256 MiB long; only a little over the limit is ever sent.
    header = bytes([0x81, 0x80 | 127]) + struct.pack("!Q", 256 * 1024 * 1024) + b"\x00\x00\x00\x00"
    client.sock.sendall(header)
    sent = 0
    while sent <= protocol.MAX_MESSAGE_BYTES + 1:
        sent += client.sock.send(b"x" * 65536)
    # Read raw up to the server's end of writing (it shuts it after its close frame): this client's
    # wsproto is in the middle of sending a message.
    received = b""
    while chunk := client.sock.recv(1 << 16):
        received += chunk
    server = Connection(ConnectionType.CLIENT)
    server.receive_data(received)
    events = list(server.events())
    error = json.loads(next(e.data for e in events if isinstance(e, TextMessage)))
    assert (error["type"], error["code"]) == ("error", 413)
    assert str(protocol.MAX_MESSAGE_BYTES) in error["message"]
    close = next(e for e in events if isinstance(e, CloseConnection))
    assert close.code == protocol.CLOSE_TOO_BIG
    client.sock.close()  # the rest is never sent; the server stops waiting for it
    thread.join(timeout=DEADLINE)
    assert not thread.is_alive()


def test_a_deeply_nested_message_is_a_400_and_the_connection_stays(
    served: tuple[Client, Served],
) -> None:
    client, _ = served
    depth = 100_000
    client.send('{"type":"ping","x":' + "[" * depth + "]" * depth + "}")
    answer = client.next()
    assert (answer["type"], answer["code"]) == ("error", 400)
    assert "nested too deeply" in answer["message"]
    client.send(json.dumps({"type": "ping"}))
    assert client.next() == {"type": "pong"}


def test_a_close_without_a_close_frame_is_one_line_and_stream_closed_says_why(
    served: tuple[Client, Served], caplog: pytest.LogCaptureFixture
) -> None:
    client, connection = served
    thread = connection.thread
    caplog.set_level(logging.INFO, logger=local.end_log.name)
    client.send(json.dumps({"type": "subscribe", "queue_name": "jobs", "credit": 1}))
    assert client.next()["type"] == "subscribed"
    client.sock.close()  # a crash: no close frame
    thread.join(timeout=DEADLINE)
    assert not thread.is_alive()
    records = [r for r in caplog.records if r.name == local.end_log.name]
    assert [r.getMessage() for r in records] == [
        "stream closed: the client went away without a close frame (1006)"
    ]
    assert all(r.exc_info is None for r in records)


def test_a_clean_close_is_answered_and_logged(
    served: tuple[Client, Served], caplog: pytest.LogCaptureFixture
) -> None:
    client, connection = served
    thread = connection.thread
    caplog.set_level(logging.INFO, logger=local.end_log.name)
    client.sock.sendall(client.ws.send(CloseConnection(code=1000, reason="done")))
    assert list(client.messages()) == []
    assert client.closed is not None and client.closed.code == 1000
    thread.join(timeout=DEADLINE)
    assert [r.getMessage() for r in caplog.records if r.name == local.end_log.name] == [
        "stream closed: the client closed it (1000)"
    ]


def test_the_end_line_goes_to_the_request_log_of_querator_serve() -> None:
    from querator.localserver import REQUEST_LOGGER  # noqa: PLC0415 - only here

    assert local.end_log.parent is logging.getLogger(REQUEST_LOGGER)


def test_the_server_stopping_closes_the_stream_1001_going_away(served: tuple[Client, Served]) -> None:
    client, connection = served
    client.send(json.dumps({"type": "subscribe", "queue_name": "jobs", "credit": 1}))
    assert client.next()["type"] == "subscribed"
    connection.stop()
    assert list(client.messages()) == []
    assert client.closed is not None
    assert (client.closed.code, client.closed.reason) == (1001, "server stopping")
    # The client answers the close, as a WebSocket client does; the server's end then finishes.
    client.sock.sendall(client.ws.send(client.closed.response()))
    connection.thread.join(timeout=DEADLINE)
    assert not connection.thread.is_alive()
