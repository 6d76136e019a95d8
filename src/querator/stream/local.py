"""The stream endpoint of ``querator serve``: ``ws://127.0.0.1:2319/v1/stream``.

The HTTP server's handler thread upgrades the connection and then speaks WebSocket on its socket
with ``wsproto`` (sans-I/O: it only frames bytes, the socket stays ours), so the stream shares the
API's port. Pushing is event-driven: a produce into a queue wakes the connections subscribed to it
at once (milliseconds, not a polling interval); items that become ready by time (scheduled items,
expired leases) or are written by another process on the same SQLite file are found by a lease
attempt every ``IDLE_POLL`` seconds.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import select
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Final

from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage

from querator.stream import protocol
from querator.stream.session import StreamSession, utc_now

if TYPE_CHECKING:
    from collections.abc import Callable

PATH: Final = "/v1/stream"
#: Seconds between lease attempts of a subscription with credit when nothing wakes it.
IDLE_POLL: Final = 1.0
#: Seconds a connection closed for a message too big keeps reading (and dropping) the rest of it.
LINGER: Final = 2.0
_RECV_BYTES: Final = 1 << 16
_WEBSOCKET_GUID: Final = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

log = logging.getLogger("querator.stream")
#: "stream closed: <why>", one line per connection, next to the request lines of ``querator serve``:
#: a child of ``querator.localserver.REQUEST_LOGGER`` (whose handler and level ``--quiet`` sets), named
#: here because the server imports this module.
end_log = logging.getLogger("querator.localserver.requests.stream")


class Wakeups:
    """Which connections wait on which queue; ``notify`` wakes them (a byte on a socket pair)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_queue: dict[str, set[socket.socket]] = {}

    def register(self, queue_name: str, waker: socket.socket) -> None:
        with self._lock:
            self._by_queue.setdefault(queue_name, set()).add(waker)

    def unregister(self, queue_name: str, waker: socket.socket) -> None:
        with self._lock:
            wakers = self._by_queue.get(queue_name)
            if wakers is not None:
                wakers.discard(waker)
                if not wakers:
                    del self._by_queue[queue_name]

    def notify(self, queue_name: str) -> None:
        with self._lock:
            wakers = list(self._by_queue.get(queue_name, ()))
        for waker in wakers:
            # A full buffer means it is already woken; a closed one is going away: nothing to do.
            with contextlib.suppress(OSError):
                waker.send(b"\x00")


def handshake_error(headers: dict[str, str]) -> str | None:
    """Why the request cannot be upgraded to a WebSocket (RFC 6455 4.2.1), or ``None``."""
    lowered = {name.lower(): value for name, value in headers.items()}
    if "websocket" not in lowered.get("upgrade", "").lower():
        return f"{PATH} is a WebSocket endpoint; connect with a WebSocket client (Upgrade: websocket)"
    if "upgrade" not in lowered.get("connection", "").lower():
        return "Connection: Upgrade is required"
    if lowered.get("sec-websocket-version") != "13":
        return "Sec-WebSocket-Version 13 is required"
    key = lowered.get("sec-websocket-key", "")
    try:
        if len(base64.b64decode(key, validate=True)) != 16:
            return "Sec-WebSocket-Key must be 16 bytes, base64"
    except ValueError:
        return "Sec-WebSocket-Key must be 16 bytes, base64"
    return None


def accept_token(key: str) -> str:
    """``Sec-WebSocket-Accept`` for ``Sec-WebSocket-Key`` (RFC 6455 4.2.2)."""
    digest = hashlib.sha1(key.encode("ascii") + _WEBSOCKET_GUID).digest()  # noqa: S324 - the RFC's choice
    return base64.b64encode(digest).decode("ascii")


class StreamConnection:
    """Runs one upgraded connection until the client closes it or the server stops."""

    def __init__(
        self,
        sock: socket.socket,
        *,
        api: Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]],
        wakeups: Wakeups,
        stopping: threading.Event,
    ) -> None:
        self._sock = sock
        self._ws = Connection(ConnectionType.SERVER)
        self._session = StreamSession(api, now=utc_now)
        self._wakeups = wakeups
        self._stopping = stopping
        #: The queue whose wakeups this connection is registered for.
        self._registered: str | None = None
        self._waker, self._wake = socket.socketpair()
        for end in (self._waker, self._wake):
            end.setblocking(False)

    def run(self) -> str:
        """Serve the connection until it ends; each end is logged once, with why ("stream closed: …"),
        which is also returned."""
        why = "the server stopped"
        try:
            why = self._serve()
        except OSError as error:
            # The client went away (reset, broken pipe): its leases run out and the items come back.
            why = f"the connection failed ({error.__class__.__name__})"
        except Exception:
            log.exception("stream failed")
            why = "a server error (1011)"
            self._close(1011, "server error")
        finally:
            if self._registered is not None:
                self._wakeups.unregister(self._registered, self._waker)
            self._waker.close()
            self._wake.close()
            end_log.info("stream closed: %s", why)
        return why

    def _serve(self) -> str:
        """Push and answer until the connection ends; why it ended."""
        pump_now = False
        last_pump = float("-inf")
        #: The text message being received, in parts, and its size so far in bytes.
        text: list[str] = []
        size = 0
        while not self._stopping.is_set():
            session = self._session
            session.release_expired()
            if session.queue_name != self._registered:
                if self._registered is not None:
                    self._wakeups.unregister(self._registered, self._waker)
                self._registered = session.queue_name
                if self._registered is not None:
                    self._wakeups.register(self._registered, self._waker)
                    pump_now = True
            if (
                session.subscribed
                and session.credit > 0
                and (pump_now or time.monotonic() - last_pump >= IDLE_POLL)
            ):
                last_pump, pump_now = time.monotonic(), False
                self._send(session.pump())
            readable, _, _ = select.select([self._sock, self._wake], [], [], self._wait(last_pump))
            if self._wake in readable:
                self._drain_wakeups()
                pump_now = True
            if self._sock not in readable:
                continue
            data = self._sock.recv(_RECV_BYTES)
            if not data:
                # No close frame first: the client crashed or its network went (wsproto's 1006).
                return "the client went away without a close frame (1006)"
            self._ws.receive_data(data)
            for event in self._ws.events():
                if isinstance(event, (TextMessage, BytesMessage)):
                    # Counted as it arrives and dropped past the limit: never held whole.
                    size += len(event.data.encode()) if isinstance(event, TextMessage) else len(event.data)
                    if size > protocol.MAX_MESSAGE_BYTES:
                        self._send([protocol.too_big()])
                        self._close(protocol.CLOSE_TOO_BIG, "message too big")
                        self._linger()
                        return f"a message over {protocol.MAX_MESSAGE_BYTES} bytes (1009)"
                    if isinstance(event, TextMessage):
                        text.append(event.data)
                    if not event.message_finished:
                        continue
                    if isinstance(event, TextMessage):
                        self._send(session.receive("".join(text)))
                        pump_now = True  # a settle or credit may allow more
                    else:
                        self._send(
                            [protocol.error(400, "Bad Request", "Invalid message; send JSON text frames")]
                        )
                    text.clear()
                    size = 0
                elif isinstance(event, Ping):
                    self._sock.sendall(self._ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    if self._ws.state is ConnectionState.REMOTE_CLOSING:
                        self._sock.sendall(self._ws.send(event.response()))
                        return f"the client closed it ({event.code})"
                    # wsproto could not parse a frame: it says why, with the close code to send.
                    self._close(event.code, event.reason or "")
                    return f"the client broke the WebSocket protocol ({event.code}: {event.reason})"
        # The server is stopping: tell the client (1001 Going Away), so it reconnects elsewhere.
        self._close(1001, "server stopping")
        return "the server stopped (1001)"

    def _close(self, code: int, reason: str) -> None:
        """Send a close frame, if the connection is still open for one."""
        if self._ws.state is ConnectionState.OPEN:
            with contextlib.suppress(OSError):
                self._sock.sendall(self._ws.send(CloseConnection(code=code, reason=reason)))

    def _linger(self) -> None:
        """After closing on a message too big: read and drop what the client still sends until its
        close frame, its end or ``LINGER`` seconds, so that closing the socket with unread bytes in it
        does not reset the connection before the client has read the close frame (RFC 6455 7.1.1)."""
        deadline = time.monotonic() + LINGER
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)
            while (left := deadline - time.monotonic()) > 0:
                readable, _, _ = select.select([self._sock], [], [], left)
                if not readable:
                    return
                data = self._sock.recv(_RECV_BYTES)
                if not data:
                    return
                self._ws.receive_data(data)
                if any(isinstance(event, CloseConnection) for event in self._ws.events()):
                    return

    def _wait(self, last_pump: float) -> float:
        """Seconds ``select`` may wait: until the next idle lease attempt or the earliest held lease's
        end (its credit comes back), at most ``IDLE_POLL``."""
        if not self._session.subscribed or self._session.credit <= 0:
            wait = IDLE_POLL
            deadline = self._session.next_deadline()
            if deadline is not None:
                wait = min(wait, max(0.0, (deadline - utc_now()).total_seconds()))
            return wait
        return max(0.0, min(IDLE_POLL, last_pump + IDLE_POLL - time.monotonic()))

    def _drain_wakeups(self) -> None:
        try:
            while self._wake.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _send(self, frames: list[str]) -> None:
        for frame in frames:
            self._sock.sendall(self._ws.send(TextMessage(data=frame)))
