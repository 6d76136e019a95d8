"""The stream endpoint of ``querator serve``: ``ws://127.0.0.1:2319/v1/stream``.

The server's event loop upgrades the connection and then speaks WebSocket on it with ``wsproto``
(sans-I/O: it only frames bytes), so the stream shares the API's port and an open stream costs a
socket and a coroutine, not a thread. Pushing is event-driven: a stream with credit is a waiter of
its queue (``querator.localserver.waiting``), woken by a produce at once (milliseconds, not a
polling interval); items that become ready by time (scheduled items, expired leases) or are written
by another process on the same SQLite file are found by the queue's probe, every
``PROBE_INTERVAL`` seconds. Each lease and settle is the HTTP API's own call, run on the server's
worker threads.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import logging
from typing import TYPE_CHECKING, Any, Final

from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage

from querator.localserver.waiting import PROBE_INTERVAL, Waiter, Waiters
from querator.stream import protocol
from querator.stream.session import StreamSession, utc_now

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    #: ``api(path, body) -> (status, reply body)``: one call of the HTTP API, in process (blocking).
    Api = Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]]
    #: Runs a blocking call off the event loop (on the server's worker threads).
    Run = Callable[[Callable[[], Any]], Awaitable[Any]]

PATH: Final = "/v1/stream"
#: Seconds within which a subscription with credit finds items that became ready by time.
IDLE_POLL: Final = PROBE_INTERVAL
#: Seconds a connection closed for a message too big keeps reading (and dropping) the rest of it.
LINGER: Final = 2.0
_RECV_BYTES: Final = 1 << 16
_WEBSOCKET_GUID: Final = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

log = logging.getLogger("querator.stream")
#: "stream closed: <why>", one line per connection, next to the request lines of ``querator serve``:
#: a child of ``querator.localserver.REQUEST_LOGGER`` (whose handler and level ``--quiet`` sets), named
#: here because the server imports this module.
end_log = logging.getLogger("querator.localserver.requests.stream")


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
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        api: Api,
        run: Run,
        waiters: Waiters,
        stopping: asyncio.Event,
    ) -> None:
        self._reader, self._writer = reader, writer
        self._ws = Connection(ConnectionType.SERVER)
        self._session = StreamSession(api, now=utc_now)
        self._run = run
        self._waiters = waiters
        self._stopping = stopping
        #: Registered with the queue's waiters while subscribed with credit.
        self._waiter: Waiter | None = None

    async def run(self) -> str:
        """Serve the connection until it ends; each end is logged once, with why ("stream closed: …"),
        which is also returned."""
        why = "the server stopped"
        try:
            why = await self._serve()
        except OSError as error:
            # The client went away (reset, broken pipe): its leases run out and the items come back.
            why = f"the connection failed ({error.__class__.__name__})"
        except Exception:
            log.exception("stream failed")
            why = "a server error (1011)"
            await self._close(1011, "server error")
        finally:
            self._register(want=False)
            end_log.info("stream closed: %s", why)
        return why

    async def _serve(self) -> str:
        """Push and answer until the connection ends; why it ended."""
        reading: asyncio.Task[bytes] | None = None
        stopped = asyncio.ensure_future(self._stopping.wait())
        #: The text message being received, in parts, and its size so far in bytes.
        text: list[str] = []
        size = 0
        try:
            while True:
                session = self._session
                session.release_expired()
                waiter = self._register(want=session.subscribed and session.credit > 0)
                if waiter is not None and waiter.event.is_set() and not self._stopping.is_set():
                    await self._pump(waiter)
                    continue
                if reading is None:
                    reading = asyncio.ensure_future(self._reader.read(_RECV_BYTES))
                waits: set[asyncio.Future[Any]] = {reading, stopped}
                woken = asyncio.ensure_future(waiter.event.wait()) if waiter is not None else None
                if woken is not None:
                    waits.add(woken)
                try:
                    await asyncio.wait(waits, timeout=self._wait(), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if woken is not None:
                        woken.cancel()
                if self._stopping.is_set():
                    break
                if not reading.done():
                    continue
                data = reading.result()
                reading = None
                if not data:
                    # No close frame first: the client crashed or its network went (wsproto's 1006).
                    return "the client went away without a close frame (1006)"
                self._ws.receive_data(data)
                for event in self._ws.events():
                    if isinstance(event, (TextMessage, BytesMessage)):
                        # Counted as it arrives and dropped past the limit: never held whole.
                        part = event.data
                        size += len(part.encode()) if isinstance(part, str) else len(part)
                        if size > protocol.MAX_MESSAGE_BYTES:
                            await self._send([protocol.too_big()])
                            await self._close(protocol.CLOSE_TOO_BIG, "message too big")
                            await self._linger()
                            return f"a message over {protocol.MAX_MESSAGE_BYTES} bytes (1009)"
                        if isinstance(event, TextMessage):
                            text.append(event.data)
                        if not event.message_finished:
                            continue
                        if isinstance(event, TextMessage):
                            message = "".join(text)
                            await self._send(await self._run(functools.partial(session.receive, message)))
                            if self._waiter is not None:
                                self._waiters.wake(self._waiter)  # a settle or credit may allow more
                        else:
                            await self._send(
                                [protocol.error(400, "Bad Request", "Invalid message; send JSON text frames")]
                            )
                        text.clear()
                        size = 0
                    elif isinstance(event, Ping):
                        await self._write(self._ws.send(event.response()))
                    elif isinstance(event, CloseConnection):
                        if self._ws.state is ConnectionState.REMOTE_CLOSING:
                            await self._write(self._ws.send(event.response()))
                            return f"the client closed it ({event.code})"
                        # wsproto could not parse a frame: it says why, with the close code to send.
                        await self._close(event.code, event.reason or "")
                        return f"the client broke the WebSocket protocol ({event.code}: {event.reason})"
        finally:
            for task in (reading, stopped):
                if task is not None:
                    task.cancel()
        # The server is stopping: tell the client (1001 Going Away), so it reconnects elsewhere.
        await self._close(1001, "server stopping")
        await self._linger()
        return "the server stopped (1001)"

    async def _pump(self, waiter: Waiter) -> None:
        """One lease attempt for the credit there is; a full one passes a wake on (more may be ready)."""
        session = self._session
        asked = session.credit
        self._waiters.attempting(waiter)
        full = False
        try:
            frames = await self._run(session.pump)
            full = asked > 0 and asked - session.credit >= asked
        finally:
            self._waiters.attempted(waiter, full=full)
        await self._send(frames)

    def _register(self, *, want: bool) -> Waiter | None:
        """Keep this connection among its queue's waiters while it wants items, and only then."""
        queue_name = self._session.queue_name
        if self._waiter is not None and (not want or self._waiter.queue_name != queue_name):
            self._waiters.remove(self._waiter)
            self._waiter = None
        if want and self._waiter is None and queue_name is not None:
            self._waiter = Waiter(queue_name)
            self._waiters.add(self._waiter)
            self._waiters.wake(self._waiter)  # new credit or a new subscription: look at once
        return self._waiter

    def _wait(self) -> float | None:
        """Seconds to wait before looking again with nothing to wake it: until the earliest held
        lease's end (its credit comes back then), if any."""
        deadline = self._session.next_deadline()
        if deadline is None:
            return None
        return max(0.0, (deadline - utc_now()).total_seconds())

    async def _close(self, code: int, reason: str) -> None:
        """Send a close frame, if the connection is still open for one."""
        if self._ws.state is ConnectionState.OPEN:
            with contextlib.suppress(OSError):
                await self._write(self._ws.send(CloseConnection(code=code, reason=reason)))

    async def _linger(self) -> None:
        """After sending a close frame: read and drop what the client still sends until its close
        frame, its end or ``LINGER`` seconds, so that closing the socket with unread bytes in it does
        not reset the connection before the client has read the close frame (RFC 6455 7.1.1)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LINGER
        with contextlib.suppress(OSError, TimeoutError):
            if self._writer.can_write_eof():
                self._writer.write_eof()  # nothing more from this end: the client reads to the end
            while (left := deadline - loop.time()) > 0:
                data = await asyncio.wait_for(self._reader.read(_RECV_BYTES), left)
                if not data:
                    return
                self._ws.receive_data(data)
                if any(isinstance(event, CloseConnection) for event in self._ws.events()):
                    return

    async def _send(self, frames: list[str]) -> None:
        for frame in frames:
            await self._write(self._ws.send(TextMessage(data=frame)))

    async def _write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()
