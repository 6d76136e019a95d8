"""``querator serve``'s server: one asyncio event loop for every connection, the real handlers on a
pool of worker threads, the reaper on a thread of its own.

Why an event loop (docs/adr/0093-local-server-event-loop.md): consumers hold connections open for
long (keep-alive, long-polls, streams), and a thread per connection capped the server at a few
hundred of them. Here an open connection costs a socket and a coroutine; only a request being
handled holds a worker thread, for as long as its handler runs. A waiting long-poll does not: the
server asks the handler for items without waiting (``request_timeout`` 0) and parks the request in
the loop until a produce, a retry or the queue's probe wakes it (``waiting``), then asks again.
"""

from __future__ import annotations

import array
import asyncio
import base64
import contextlib
import fcntl
import functools
import json
import logging
import os
import queue
import resource
import socket
import termios
import threading
import time
import uuid
from concurrent.futures import Executor, Future
from datetime import datetime, timedelta, timezone
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import unquote

from querator import bootstrap
from querator.api import paths, routes
from querator.api.durations import parse_duration, parse_timestamp
from querator.api.errors import WireError, body_too_large, error_response, unknown_path
from querator.config import EnvVar, StoreKind, load_settings, parse_store
from querator.console import assets as console_assets
from querator.domain.errors import (
    DuplicateClientError,
    InvalidRequestError,
    LeaseRateLimitedError,
    NothingToLeaseError,
    QueratorError,
)
from querator.localserver import events, http1
from querator.localserver.waiting import Waiter, Waiters
from querator.localstore import LOOPBACK
from querator.storage.dynamodb import schema
from querator.stream import local as stream

if TYPE_CHECKING:
    from collections.abc import Callable

    from querator.config import Settings

T = TypeVar("T")

DEFAULT_PORT: Final = 2319
#: Open connections the server keeps at most (keep-alive, long-polls, streams); past it a new one
#: is answered 503. Measured on a 2-core machine (ADR 0093): 10,000 streams and long-polls in under
#: 200 MB; each costs a file descriptor, and the server raises its limit towards the hard one.
DEFAULT_MAX_CONNECTIONS: Final = 16_000
#: File descriptors kept for what is not a connection (the store's files, the embedded moto server,
#: the listening socket, logs).
_FD_RESERVE: Final = 256
#: Connections being refused at once (each is read, answered 503 and closed); past it a flood beyond
#: the ceiling is closed without a reply.
_REFUSING_MAX: Final = 256
#: Seconds between the log lines that count refused connections.
_REFUSAL_LOG_SECONDS: Final = 1.0
#: How long a refused connection may take to send its request line before it is closed.
_REFUSE_READ_SECONDS: Final = 2.0
#: The listen backlog: connections the kernel holds for the loop to accept (a burst of clients
#: connecting at once waits here rather than being retried by their kernels a second later).
BACKLOG: Final = 4096
#: Threads running handlers at once. The stores serialize their writes anyway; more threads only
#: queue on their locks, fewer let one slow call hold up the rest.
WORKERS: Final = 32
#: What a request may send before the server stops reading: the largest body limit of any route.
#: API Gateway refuses larger bodies itself; here the local server does, with the contract's 413.
_READ_LIMIT: Final = max(route.body_limit for route in routes.ROUTES)
#: How much of an oversized body the server reads (and drops) before it answers 413.
_DRAIN_LIMIT: Final = 4 * _READ_LIMIT
#: The Lambda timeout the local server pretends each invocation has (API Gateway's is 29 s).
INVOCATION_SECONDS: Final = 29.0
#: Calls after which a queue may hold ready items it did not hold before: they wake its waiters.
_WAKES: Final = frozenset({"/v1/queue.produce", "/v1/queue.retry", "/v1/storage/items.import"})
_REAPER_SECONDS: Final = 60.0
#: How long the handlers wait for the embedded store's reply: as long as an invocation may run.
_EMBEDDED_STORE_READ_TIMEOUT: Final = INVOCATION_SECONDS
#: The embedded store's payload bucket, unless ``QUERATOR_PAYLOAD_BUCKET`` names one.
_EMBEDDED_PAYLOAD_BUCKET: Final = "querator-local-payloads"
#: How long a request's head or body may go without a byte arriving before the server answers 408
#: (API Gateway's own limit is not documented; a client that stops sending must not hold a request).
BODY_READ_TIMEOUT: Final = 10.0
#: How long ``stop`` lets requests under way finish (waiting leases answer at once) before it
#: closes the store anyway.
STOP_GRACE: Final = 5.0
#: A lease that found nothing answers 454 with this stable class; anything else ends a wait.
_NOTHING_TO_LEASE: Final = NothingToLeaseError.stable_class
#: A lease a rate limit held back answers 454 with this one and ``next_lease_at``: a wait goes on.
_RATE_LIMITED: Final = LeaseRateLimitedError.stable_class
_RETRY_REQUEST: Final = 454
_JSON: Final = {"Content-Type": "application/json"}

log = logging.getLogger("querator.localserver")
#: One short line per request (``querator serve`` gives it a plain format and ``--quiet`` silences it).
#: Not the Powertools logger: its lines carry the Lambda context of whichever request set it last.
REQUEST_LOGGER: Final = "querator.localserver.requests"
request_log = logging.getLogger(REQUEST_LOGGER)


class _Workers(Executor):
    """The threads that run handlers: daemon threads, so that a handler stuck past ``stop``'s grace
    does not hold the process at exit (``ThreadPoolExecutor`` joins its threads then, whatever
    ``shutdown`` was told), as the thread-per-request server's daemon threads did not either."""

    def __init__(self, count: int) -> None:
        self._calls: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._count = count
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        self._calls.put((future, functools.partial(fn, *args, **kwargs)))
        with self._lock:
            # A thread more while all are busy, up to ``count``: an idle server holds none.
            if self._idle == 0 and len(self._threads) < self._count:
                thread = threading.Thread(
                    target=self._work, name=f"handler-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            else:
                self._idle -= 1
        return future

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn = call
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as error:
                    future.set_exception(error)
            with self._lock:
                self._idle += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for _ in self._threads:
            self._calls.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


class _Reply:
    """What a handler answered: status, headers, body bytes."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    @classmethod
    def of(cls, error: BaseException, request_id: str | None = None) -> _Reply:
        reply = error_response(error, request_id=request_id)
        return cls(reply.status, dict(_JSON), json.dumps(reply.body, separators=(",", ":")).encode())

    @property
    def nothing_to_lease(self) -> bool:
        return self.status == _RETRY_REQUEST and (
            _NOTHING_TO_LEASE.encode() in self.body or _RATE_LIMITED.encode() in self.body
        )

    def next_lease_at(self) -> datetime | None:
        """When a rate limit that held this lease back has a lease again (``None``: no limit did)."""
        if self.status != _RETRY_REQUEST or _RATE_LIMITED.encode() not in self.body:
            return None
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            return parse_timestamp(json.loads(self.body)["next_lease_at"])
        return None


class _Protocol(asyncio.StreamReaderProtocol):
    """asyncio's stream protocol, also telling when the client hung up: a parked long-poll learns it
    at once, not when its wait ends (its connection would count against the ceiling until then)."""

    def __init__(self, reader: asyncio.StreamReader, hung_up: asyncio.Event) -> None:
        super().__init__(reader)
        self._hung_up = hung_up

    def eof_received(self) -> bool:
        self._hung_up.set()
        return bool(super().eof_received())

    def connection_lost(self, exc: Exception | None) -> None:
        self._hung_up.set()
        super().connection_lost(exc)


async def _streams(sock: socket.socket) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, asyncio.Event]:
    """``asyncio.open_connection(sock=...)``, with an event set when the client hangs up."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=http1.HEAD_LIMIT, loop=loop)
    hung_up = asyncio.Event()
    protocol = _Protocol(reader, hung_up)
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock=sock)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop), hung_up


class _Connection:
    """One accepted connection: its streams, and whether a request on it is under way."""

    __slots__ = ("busy", "hung_up", "reader", "streaming", "task", "writer")

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hung_up: asyncio.Event
    ) -> None:
        self.reader, self.writer = reader, writer
        #: Set when the client closed its end (or the connection broke).
        self.hung_up = hung_up
        #: A request has begun arriving and is not answered yet: ``stop`` waits for it.
        self.busy = False
        #: Upgraded to a stream: not a request under way, but not idle either.
        self.streaming = False
        self.task: asyncio.Task[None] | None = None

    @property
    def peer(self) -> str:
        name = self.writer.get_extra_info("peername")
        return str(name[0]) if name else LOOPBACK

    @property
    def gone(self) -> bool:
        """The client closed its end: a reply now would be written to nobody. (Bytes it sent before
        closing are a next request: not gone until they are read.)"""
        return (self.hung_up.is_set() and self.reader.at_eof()) or self.writer.is_closing()


class _Loop:
    """The event loop's side of the server: accepting, framing, calling handlers, parking leases."""

    def __init__(
        self,
        listener: socket.socket,
        *,
        body_timeout: float,
        max_connections: int,
        handlers: dict[str, events.Handler],
    ) -> None:
        self._listener = listener
        self.body_timeout = body_timeout
        self.max_connections = max_connections
        self._handlers = handlers
        self.loop = asyncio.new_event_loop()
        self._pool = _Workers(WORKERS)
        self.waiters = Waiters(self.loop)
        self.stopping = asyncio.Event()
        self.connections: set[_Connection] = set()
        self._refusing = 0
        #: Refusals not logged yet, and when the last line about them was.
        self._refused = 0
        self._refusal_logged = float("-inf")
        #: Waiting leases by (queue, client id): one waiting lease per client id and queue.
        self._parked: dict[tuple[str, str], _Connection] = {}
        self._accepting: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()

    # -- running --------------------------------------------------------------------------------------

    def run_forever(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self._accepting = self.loop.create_task(self._accept())
        self.loop.call_soon(started.set)
        self.loop.run_forever()
        # Stopped: whatever is left (a connection past its grace) is cancelled, not left pending.
        for task in asyncio.all_tasks(self.loop):
            task.cancel()
        with contextlib.suppress(Exception):
            self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()

    async def _accept(self) -> None:
        while True:
            sock, _ = await self.loop.sock_accept(self._listener)
            self._admit(sock)
            # A burst waits in the backlog: take what is there before going back to the loop.
            for _ in range(64):
                try:
                    sock, _ = self._listener.accept()
                except OSError:  # BlockingIOError: none left
                    break
                self._admit(sock)

    def _admit(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        # Without this, a keep-alive client waits for delayed ACKs: ~40 ms per request (measured).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if len(self.connections) >= self.max_connections:
            if self._refusing >= _REFUSING_MAX:
                sock.close()  # a flood far past the ceiling: no reply (the ADR says why)
                return
            self._refusing += 1
            self.loop.create_task(self._refuse(sock))
            return
        self.loop.create_task(self._open(sock))

    async def _open(self, sock: socket.socket) -> None:
        reader, writer, hung_up = await _streams(sock)
        connection = _Connection(reader, writer, hung_up)
        connection.task = asyncio.current_task()
        self.connections.add(connection)
        try:
            await self._serve(connection)
        except (ConnectionError, OSError):
            pass  # the client dropped the connection: normal for keep-alive clients
        finally:
            self.connections.discard(connection)
            writer.close()
            async with self._changed:
                self._changed.notify_all()

    async def _refuse(self, sock: socket.socket) -> None:
        """Past the ceiling: read the request line and answer 503 (a WebSocket upgrade too), so the
        client learns why, then close."""
        try:
            reader, writer = await asyncio.open_connection(sock=sock, limit=http1.HEAD_LIMIT)
            try:
                with contextlib.suppress(http1.FramingError, OSError):
                    await asyncio.wait_for(
                        http1.read_head(reader, timeout=_REFUSE_READ_SECONDS), _REFUSE_READ_SECONDS
                    )
                error = WireError(
                    HTTPStatus.SERVICE_UNAVAILABLE,
                    "Service unavailable",
                    f"the server holds its limit of {self.max_connections} open connections;"
                    " try again in a moment",
                )
                reply = _Reply.of(error)
                headers = {**reply.headers, "Retry-After": "1"}
                with contextlib.suppress(OSError, TimeoutError):
                    writer.write(http1.reply_bytes(reply.status, headers, reply.body, close=True))
                    await asyncio.wait_for(writer.drain(), _REFUSE_READ_SECONDS)
                writer.close()
            except TimeoutError:
                writer.close()
        except OSError:
            sock.close()
        finally:
            self._refusing -= 1
        self._refused += 1
        if self.loop.time() - self._refusal_logged >= _REFUSAL_LOG_SECONDS:
            # One line a second at most: a flood past the ceiling would otherwise be a line each.
            request_log.warning(
                "refused %d connection(s) with 503: %d open, the limit", self._refused, self.max_connections
            )
            self._refused, self._refusal_logged = 0, self.loop.time()

    # -- requests -------------------------------------------------------------------------------------

    async def _serve(self, connection: _Connection) -> None:
        while not self.stopping.is_set():
            try:
                head = await http1.read_head(
                    connection.reader,
                    timeout=self.body_timeout,
                    started=functools.partial(_begun, connection),
                )
            except http1.FramingError as error:
                connection.busy = True
                await self._write(connection, None, _framing_reply(error), close=True)
                return
            if head is None:
                return
            connection.busy = True
            try:
                keep = await self._request(connection, head)
            finally:
                connection.busy = False
                async with self._changed:
                    self._changed.notify_all()
            if not keep:
                return

    async def _request(self, connection: _Connection, head: http1.RequestHead) -> bool:
        """Serve one request; whether the connection may carry another."""
        started = time.perf_counter()
        close = not head.keep_alive
        status = 0
        try:
            status, close, logged = await self._handle(connection, head, close)
        except Exception:
            # A fault of the local server itself (the handlers answer every error of theirs): logged
            # like a handler's 5xx, under the id the reply quotes, instead of a dropped connection.
            request_id = str(uuid.uuid4())
            log.exception(
                "%s %s failed in the local server; request id %s",
                head.method,
                head.path,
                request_id,
                extra={"status": HTTPStatus.INTERNAL_SERVER_ERROR, "request_id": request_id},
            )
            reply = _Reply.of(RuntimeError(), request_id=request_id)
            status, close, logged = reply.status, True, False
            with contextlib.suppress(OSError):
                await self._write(connection, head, reply, close=True)
        if not logged:
            request_log.info(
                "%s %s %s %.1fms", head.method, head.path, status, (time.perf_counter() - started) * 1000
            )
        return not close and not self.stopping.is_set()

    async def _handle(
        self, connection: _Connection, head: http1.RequestHead, close: bool
    ) -> tuple[int, bool, bool]:
        """(status, close, logged): the request served, whether the connection must close after it,
        and whether a line was logged for it already."""
        path = head.path
        known = routes.match(path)
        body, refusal = await self._read_body(
            connection, head, known[0].body_limit if known is not None else routes.SMALL_BODY_LIMIT
        )
        if refusal is not None:
            if (
                refusal.status == HTTPStatus.REQUEST_ENTITY_TOO_LARGE
                and known is None
                and not (console_assets.is_console_path(path) or path == stream.PATH)
            ):
                # An unknown path is a 501 whatever its body (docs/api.md); the body was not read.
                refusal = _Reply.of(unknown_path(head.method, path))
            await self._write(connection, head, refusal, close=True)
            return refusal.status, True, False
        if console_assets.is_console_path(path):
            reply = self._console(head)
            await self._write(connection, head, reply, close=close)
            return reply.status, close, False
        if path == stream.PATH:
            return await self._stream(connection, head), True, True
        matched = known  # matched once, before the body: its limit is the route's
        if matched is None:
            # API Gateway has no resource for it either; the contract says 501.
            reply = _Reply.of(unknown_path(head.method, path))
            await self._write(connection, head, reply, close=close)
            return reply.status, close, False
        route, segment = matched
        # A scoped route's queue, decoded once as API Gateway does before it fills pathParameters;
        # the handler refuses a name that is not addressable.
        path_queue = None if segment is None else unquote(segment)
        if route.base is routes.LEASE and head.method == "POST":
            waited = await self._lease(connection, head, body, route, path_queue)
            if waited is None:
                return 0, True, False  # the client went away while its lease waited
            reply = waited
        else:
            reply = await self._invoke(route, head, body, connection.peer, path_queue)
        lease = route.base is routes.LEASE and reply.status == HTTPStatus.OK
        if lease and connection.gone:
            # Nobody to read it: the items go back now rather than stay leased to nobody until their
            # lease times out.
            await self._give_back(head, reply, "the client closed the connection before the reply")
            return reply.status, True, True
        written = await self._write(connection, head, reply, close=close)
        if lease and not written:
            # Also when writing failed some other way than the client going: nothing the reply held
            # stays leased to nobody.
            await self._give_back(head, reply, "the reply could not be written")
            return reply.status, True, True
        if reply.status == HTTPStatus.OK and route.base.path in _WAKES:
            self.waiters.notify(*_woken(body, path_queue))
        return reply.status, close or not written, False

    async def _read_body(
        self, connection: _Connection, head: http1.RequestHead, limit: int
    ) -> tuple[bytes, _Reply | None]:
        """The body, or the reply refusing a body the server will not read (the connection closes
        after it: where the next request would start is unknown).

        Only ``Content-Length`` framing, as a digit string: a negative, non-numeric or repeated length,
        or a ``Transfer-Encoding`` (which the local server does not decode, and which together with a
        length is how requests get smuggled), is a 400. A body that stops arriving for
        ``body_timeout`` seconds is a 408.
        """
        lengths = {value.strip() for value in head.get_all("Content-Length")}
        text = next(iter(lengths), "0")
        problem = None
        if head.get("Transfer-Encoding") is not None:
            problem = "Transfer-Encoding is not supported; send the body with a Content-Length"
        elif len(lengths) > 1:
            problem = "the request has more than one Content-Length"
        elif not (text.isascii() and text.isdigit()):
            problem = f"Content-Length must be a number of bytes, not {text[:40]!r}"
        if problem is not None:
            return b"", _Reply.of(InvalidRequestError(problem))
        length = int(text)
        reader = connection.reader
        if length > limit:
            # Read and discard a moderately oversized body so the client sees the 413 (naming the
            # endpoint's own limit) rather than a reset; past the drain limit just answer and drop
            # the connection.
            await http1.read_body(reader, min(length, _DRAIN_LIMIT), timeout=self.body_timeout, keep=False)
            return b"", _Reply.of(body_too_large(length, limit))
        body = await http1.read_body(reader, length, timeout=self.body_timeout, keep=True)
        if body is None:
            timeout = WireError(
                HTTPStatus.REQUEST_TIMEOUT,
                "Request timeout",
                f"the body stopped arriving for {self.body_timeout:g} s",
            )
            return b"", _Reply.of(timeout)
        if len(body) < length:
            return b"", _Reply.of(InvalidRequestError(f"the body ended after {len(body)} of {length} bytes"))
        return body, None

    async def _invoke(
        self, route: routes.Route, head: http1.RequestHead, body: bytes, peer: str, path_queue: str | None
    ) -> _Reply:
        """The route's handler on a worker thread, with the proxy event API Gateway would send
        (a scoped route's with its template and its decoded queue in ``pathParameters``)."""
        scope: dict[str, Any] = {}
        if route.scoped and path_queue is not None:
            scope = {"resource": route.path, "path_parameters": {paths.QUEUE_PARAMETER: path_queue}}
        event = events.proxy_event(head.method, head.path, head.as_dict(), body, peer, head.query, **scope)
        return await self.run(functools.partial(self._call_handler, route.function, event))

    def _call_handler(self, function: str, event: dict[str, Any]) -> _Reply:
        context = events.LocalContext(function_name=function, timeout_seconds=INVOCATION_SECONDS)
        result = self._handlers[function](event, context)
        payload = result.get("body") or ""
        raw = base64.b64decode(payload) if result.get("isBase64Encoded") else payload.encode("utf-8")
        return _Reply(int(result["statusCode"]), events.response_headers(result), raw)

    async def run(self, call: Callable[[], T]) -> T:
        """Run a blocking call (a handler, the store) on a worker thread."""
        return await self.loop.run_in_executor(self._pool, call)

    # -- long-polls -----------------------------------------------------------------------------------

    async def _lease(
        self,
        connection: _Connection,
        head: http1.RequestHead,
        body: bytes,
        route: routes.Route,
        path_queue: str | None,
    ) -> _Reply | None:
        """``queue.lease``, its wait parked in the loop: the handler is asked without waiting, and
        asked again each time the queue's waiters are woken, until items come or the wait ends.
        None: the client went away while waiting."""
        request = _lease_request(body, path_queue)
        if request is None:
            # Not one the server can read: the handler says what is wrong with it.
            return await self._invoke(route, head, body, connection.peer, path_queue)
        queue_name, client_id, wait, key, parsed = request
        holder = self._parked.get((queue_name, client_id))
        if holder is not None and not holder.gone:
            # As the service answers a second lease of a client id whose lease waits inside it.
            return _Reply.of(
                DuplicateClientError(f"client_id '{client_id}' already has a waiting lease on '{queue_name}'")
            )
        if wait <= 0 or self.stopping.is_set():
            return await self._invoke(route, head, body, connection.peer, path_queue)
        wait = min(wait, load_settings().lease_wait_cap.total_seconds(), INVOCATION_SECONDS - 1)
        asking = json.dumps({**parsed, key: "0s"}).encode()
        size = parsed.get("batch_size", parsed.get("batchSize", 1))
        batch_size = size if isinstance(size, int) else 1
        deadline = self.loop.time() + wait
        waiter = Waiter(queue_name)
        self._parked[(queue_name, client_id)] = connection
        # Registered before the first attempt: a produce that lands during it wakes this waiter.
        self.waiters.add(waiter)
        try:
            while True:
                self.waiters.attempting(waiter)
                full = False
                try:
                    reply = await self._invoke(route, head, asking, connection.peer, path_queue)
                    full = reply.status == HTTPStatus.OK and _leased(reply) >= batch_size
                finally:
                    self.waiters.attempted(waiter, full=full)
                left = deadline - self.loop.time()
                if not reply.nothing_to_lease or left <= 0 or self.stopping.is_set():
                    return reply
                back_at = reply.next_lease_at()
                if back_at is not None:
                    # Held back by a rate limit: nothing can be leased before its next lease, and
                    # at that time no write wakes this waiter, so the wait ends there too.
                    until = (back_at - datetime.now(timezone.utc)).total_seconds()
                    left = min(left, max(until, 0.001))
                woken = asyncio.ensure_future(waiter.event.wait())
                hung_up = asyncio.ensure_future(connection.hung_up.wait())
                await asyncio.wait({woken, hung_up}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                hung_up.cancel()
                if connection.gone:
                    # Nobody to answer: the wake it took goes to the next waiter.
                    self.waiters.remove(waiter)
                    if waiter.event.is_set():
                        self.waiters.notify(queue_name, 1)
                    return None
        finally:
            self.waiters.remove(waiter)
            if self._parked.get((queue_name, client_id)) is connection:
                del self._parked[(queue_name, client_id)]

    async def _give_back(self, head: http1.RequestHead, reply: _Reply, why: str) -> None:
        """Put the items of a lease reply nobody received back at once, their attempt not spent."""
        leased = json.loads(reply.body)
        ids = [str(item["id"]) for item in leased.get("items", [])]
        service = bootstrap.get_service()
        try:
            given = await self.run(
                functools.partial(service.give_back, leased["queue_name"], int(leased["partition"]), ids)
            )
        except QueratorError:
            log.exception(
                "%s: %d leased item(s) of '%s' could not be given back; they return when their lease"
                " times out",
                why,
                len(ids),
                leased["queue_name"],
            )
            return
        request_log.warning(
            "%s %s 200 not delivered (%s): %d of %d leased item(s) given back",
            head.method,
            head.path,
            why,
            given,
            len(ids),
        )
        self.waiters.notify(str(leased["queue_name"]), given)

    # -- streams and the console ----------------------------------------------------------------------

    async def _stream(self, connection: _Connection, head: http1.RequestHead) -> int:
        """A WebSocket upgrade: from here on the connection speaks the stream protocol."""
        problem = stream.handshake_error(head.as_dict()) if head.method == "GET" else "use GET"
        if problem is not None:
            reply = _Reply.of(InvalidRequestError(problem))
            await self._write(connection, head, reply, close=True)
            request_log.info("%s %s %s", head.method, head.path, reply.status)
            return reply.status
        accept = stream.accept_token(head.get("Sec-WebSocket-Key") or "")
        connection.writer.write(
            (
                "HTTP/1.1 101 Switching Protocols\r\nServer: querator-local\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
            ).encode("ascii")
        )
        await connection.writer.drain()
        request_log.info("GET %s 101 (stream opened)", stream.PATH)
        # An open stream is not a request under way: it closes itself (1001) when the server stops.
        connection.busy, connection.streaming = False, True
        # run() logs the end once, with why ("stream closed: ...").
        await stream.StreamConnection(
            connection.reader,
            connection.writer,
            api=functools.partial(self._stream_call, connection.peer),
            run=self.run,
            waiters=self.waiters,
            stopping=self.stopping,
        ).run()
        return HTTPStatus.SWITCHING_PROTOCOLS

    def _stream_call(self, peer: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """One API call on behalf of a stream connection, through the same handler as over HTTP (on
        a worker thread)."""
        route = routes.by_path(path)
        if route is None:  # the session only calls routes that exist
            raise LookupError(path)
        raw = json.dumps(body).encode()
        event = events.proxy_event("POST", path, dict(_JSON), raw, peer)
        reply = self._call_handler(route.function, event)
        if reply.status == HTTPStatus.OK and path in _WAKES:
            self.waiters.notify_threadsafe(*_woken(raw, None))
        text = reply.body.decode()
        return reply.status, json.loads(text) if text else {}

    def _console(self, head: http1.RequestHead) -> _Reply:
        # The console is static files; it reaches the queues through the same /v1 routes as any client.
        asset = (
            console_assets.config(read_only=False, target=f"querator serve {head.get('Host') or ''}")
            if head.path == console_assets.PREFIX + "/config.json"
            else console_assets.find(head.path)
        )
        if head.method not in {"GET", "HEAD"} or asset is None:
            status = 404 if asset is None else 405
            text = b"not found" if status == 404 else b"GET only"
            return _Reply(status, {"Content-Type": "text/plain; charset=utf-8"}, text)
        return _Reply(200, asset.headers(), asset.body)

    async def _write(
        self, connection: _Connection, head: http1.RequestHead | None, reply: _Reply, *, close: bool
    ) -> bool:
        """Write the reply; False when the client closed the connection before it."""
        close = close or self.stopping.is_set()
        data = http1.reply_bytes(
            reply.status,
            reply.headers,
            reply.body,
            close=close,
            with_body=head is None or head.method != "HEAD",
        )
        try:
            connection.writer.write(data)
            await connection.writer.drain()
        except (ConnectionError, OSError):
            # The client gave up (its read timeout) before the reply: one line, not a traceback.
            what = f"{head.method} {head.target}" if head is not None else "a request"
            request_log.warning(
                "%s %s: the client closed the connection before the reply", what, reply.status
            )
            return False
        return True

    # -- stopping -------------------------------------------------------------------------------------

    async def shutdown(self, grace: float) -> int:
        """Stop accepting, answer every waiting lease now (one last attempt), close streams (1001) and
        idle connections, and give requests under way ``grace`` seconds; the number still under way
        when it gave up."""
        self.stopping.set()
        if self._accepting is not None:
            self._accepting.cancel()
        # Connections the kernel accepted but the loop had not taken yet: their clients may have sent a
        # request already, which gets an answer (with "Connection: close"), not a reset.
        with contextlib.suppress(OSError):
            while True:
                sock, _ = self._listener.accept()
                self._admit(sock)
        self._listener.close()
        self.waiters.wake_all()
        await asyncio.sleep(0)  # let connections that have bytes waiting start reading them
        deadline = self.loop.time() + grace
        async with self._changed:
            while True:
                for connection in list(self.connections):
                    if connection.task is not None and _idle(connection):
                        connection.task.cancel()
                left = deadline - self.loop.time()
                busy = [c for c in self.connections if c.busy]
                if not self.connections or left <= 0:
                    return len(busy)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), min(left, 0.05))

    def close(self) -> None:
        # A handler stuck past the grace keeps its (daemon) thread; the process is on its way out.
        self._pool.shutdown(wait=False)


def _create_bucket(settings: Settings) -> None:
    """The embedded store's payload bucket (a stack's is the CDK app's)."""
    objects = bootstrap.payload_objects(settings)
    if objects is not None:
        objects.create_bucket()


def _idle(connection: _Connection) -> bool:
    """Between requests with nothing of the next one received: closing it loses nothing. A stream
    is not idle: it closes itself (1001) when the server stops."""
    return not connection.busy and not connection.streaming and not _has_bytes(connection)


def _begun(connection: _Connection) -> None:
    """A request's first byte has arrived: from here ``stop`` waits for its reply."""
    connection.busy = True


def _has_bytes(connection: _Connection) -> bool:
    """Bytes of a next request have arrived: in the reader's buffer, or still in the kernel's, where
    the loop has not read them yet (a request sent just before SIGTERM gets its answer)."""
    # StreamReader has no public "bytes waiting" test.
    if getattr(connection.reader, "_buffer", b""):
        return True
    sock = connection.writer.get_extra_info("socket")
    if sock is None:
        return False
    waiting = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, waiting)
    except OSError:
        return False
    return waiting[0] > 0


def _framing_reply(error: http1.FramingError) -> _Reply:
    if error.status == HTTPStatus.BAD_REQUEST:
        return _Reply.of(InvalidRequestError(str(error)))
    stable = "Request timeout" if error.status == HTTPStatus.REQUEST_TIMEOUT else "Request headers too large"
    return _Reply.of(WireError(error.status, stable, str(error)))


def _lease_request(body: bytes, path_queue: str | None) -> tuple[str, str, float, str, dict[str, Any]] | None:
    """(queue, client id, seconds it asks to wait, the key that said so, the body as parsed) of a
    lease; None for one the handler must judge (it answers what is wrong with it). ``path_queue``:
    a scoped route's queue, which a body without ``queue_name`` means."""
    try:
        request = json.loads(body)
    except ValueError:
        return None
    if not isinstance(request, dict):
        return None
    keys = [key for key in ("request_timeout", "requestTimeout") if key in request]
    queue_name = request.get("queue_name", request.get("queueName", path_queue))
    client_id = request.get("client_id", request.get("clientId"))
    if path_queue is not None and queue_name != path_queue:
        return None  # the handler refuses a body naming another queue than the path
    if len(keys) > 1 or not isinstance(queue_name, str) or not isinstance(client_id, str) or not client_id:
        return None
    if not keys:
        return queue_name, client_id, 0.0, "request_timeout", request
    timeout = request[keys[0]]
    if timeout is None:
        return queue_name, client_id, 0.0, keys[0], request
    if not isinstance(timeout, str):
        return None
    try:
        wait = parse_duration(timeout)
    except (ValueError, InvalidRequestError):
        return None  # the handler answers the 400 naming request_timeout
    if wait < timedelta(0):
        return None
    return queue_name, client_id, wait.total_seconds(), keys[0], request


def _leased(reply: _Reply) -> int:
    return len(json.loads(reply.body).get("items", []))


def _woken(body: bytes, path_queue: str | None) -> tuple[str, int]:
    """(queue, items) of a call that made items ready: how many waiters of which queue to wake
    (``path_queue``: a scoped route's, which a body without ``queue_name`` means)."""
    try:
        request = json.loads(body)
    except ValueError:
        return "", 0
    if not isinstance(request, dict):
        return "", 0
    queue_name = request.get("queue_name", request.get("queueName", path_queue or ""))
    listed = request.get("items", request.get("ids", []))
    return (queue_name if isinstance(queue_name, str) else ""), (
        len(listed) if isinstance(listed, list) else 1
    )


def raise_file_limit(wanted: int) -> int:
    """Raise this process's open-file limit towards its hard limit (each connection is a file); the
    soft limit it has now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return soft


class LocalServer:
    """The HTTP server, the reaper thread and (unless a store is configured) the embedded store."""

    def __init__(
        self,
        *,
        host: str = LOOPBACK,
        port: int = DEFAULT_PORT,
        reaper_interval: float = 1.0,
        store: str = StoreKind.DYNAMODB,
        body_timeout: float = BODY_READ_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        self._host, self._port, self._reaper_interval = host, port, reaper_interval
        self._body_timeout = body_timeout
        self._max_connections = max_connections
        #: The store URL the handlers use.
        self.store_url = store
        self._store: Any = None
        self._address: tuple[str, int] | None = None
        self._loop: _Loop | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def embedded_dynamodb(self) -> bool:
        """True when this server started the in-memory DynamoDB-compatible store itself."""
        return self._store is not None

    @property
    def url(self) -> str:
        if self._address is None:
            raise RuntimeError("the server is not started")
        host, port = self._address
        return f"http://{host}:{port}"

    @property
    def max_connections(self) -> int:
        """The ceiling in force: as asked, or lower when the open-file limit cannot hold it."""
        return self._loop.max_connections if self._loop is not None else self._max_connections

    @property
    def waiting(self) -> int:
        """Long-polls and streams with credit parked, waiting for items (not making an attempt)."""
        return self._loop.waiters.parked() if self._loop is not None else 0

    @property
    def open_connections(self) -> int:
        return len(self._loop.connections) if self._loop is not None else 0

    def start(self) -> LocalServer:
        """Bind the port, then start the store, the handlers and the reaper.

        Raises
        ------
        OSError
            The port cannot be bound (``errno.EADDRINUSE``: another server has it); nothing was
            started.
        ConfigurationError
            The store URL is not one, or its file cannot be a Querator database (left untouched).
        """
        # Bound first: a busy port fails before the embedded store starts.
        listener = socket.create_server((self._host, self._port), backlog=BACKLOG)
        listener.setblocking(False)
        try:
            self._configure_store()
            functions = {route.function for route in routes.ROUTES}
            handlers = {function: events.load_handler(function) for function in functions}
            reaper = events.load_handler("reaper")
        except BaseException:
            listener.close()
            raise
        files = raise_file_limit(self._max_connections + _FD_RESERVE)
        ceiling = min(self._max_connections, max(1, files - _FD_RESERVE))
        if ceiling < self._max_connections:
            log.warning(
                "the open-file limit (%d) holds %d connections, not %d: raise it (ulimit -n) for more",
                files,
                ceiling,
                self._max_connections,
            )
        self._address = listener.getsockname()[:2]
        self._loop = _Loop(
            listener, body_timeout=self._body_timeout, max_connections=ceiling, handlers=handlers
        )
        started = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop.run_forever, args=(started,), name="http", daemon=True),
            threading.Thread(target=self._reap_forever, args=(reaper,), name="reaper", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        started.wait(10)
        return self

    def _configure_store(self) -> None:
        os.environ.setdefault(EnvVar.REGION, "us-east-1")
        os.environ.setdefault(EnvVar.ITEMS_TABLE, "querator-local-items")
        os.environ.setdefault(EnvVar.CATALOG_TABLE, "querator-local-queues")
        # EMF metrics would go to stdout on every request; the local server has no CloudWatch.
        os.environ.setdefault(EnvVar.POWERTOOLS_METRICS_DISABLED, "true")
        # The handlers' JSON log lines carry a Lambda context that, with many requests in flight in one
        # process, may be another request's; locally the request line says what happened, so only
        # warnings and errors come through unless POWERTOOLS_LOG_LEVEL says otherwise.
        os.environ.setdefault(EnvVar.POWERTOOLS_LOG_LEVEL, "WARNING")
        kind, _ = parse_store(self.store_url)
        os.environ[EnvVar.STORE] = self.store_url
        if kind != StoreKind.DYNAMODB:
            # Opened now, so a bad file is refused before the server says it is listening.
            bootstrap.reset()
            bootstrap.get_service()
            return
        if not os.environ.get("AWS_ENDPOINT_URL_DYNAMODB"):
            from querator.localstore import EmbeddedDynamoDB  # noqa: PLC0415 - needs the "local" extra

            self._store = EmbeddedDynamoDB().start()
            os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = self._store.endpoint_url
            # The same embedded moto serves the payload bucket (payloads over 64 KiB, up to 1 MiB),
            # as a stack has one beside its tables.
            os.environ["AWS_ENDPOINT_URL_S3"] = self._store.endpoint_url
            os.environ.setdefault(EnvVar.PAYLOAD_BUCKET, _EMBEDDED_PAYLOAD_BUCKET)
            # moto accepts any credentials; set fake ones so a developer's real ones are never sent.
            os.environ["AWS_ACCESS_KEY_ID"] = "local"
            os.environ["AWS_SECRET_ACCESS_KEY"] = "local"  # noqa: S105 - not a secret: moto's dummy
            os.environ.pop("AWS_SESSION_TOKEN", None)
            # The embedded store answers one request at a time: under load a reply can come after
            # botocore's 5 s, which would send an applied conditional write again (a complete then
            # reports an item it deleted as not completed). Nothing is lost by waiting for it.
            os.environ.setdefault(EnvVar.STORE_READ_TIMEOUT, str(_EMBEDDED_STORE_READ_TIMEOUT))
        bootstrap.reset()
        settings = load_settings()
        schema.create_tables(
            bootstrap.get_client(), items_table=settings.items_table, catalog_table=settings.catalog_table
        )
        if self._store is not None and settings.payload_bucket:
            _create_bucket(settings)

    def _reap_forever(self, reaper: events.Handler) -> None:
        while not self._stop.wait(self._reaper_interval):
            context = events.LocalContext(function_name="reaper", timeout_seconds=_REAPER_SECONDS)
            try:
                reaper(events.scheduled_event(), context)
            except Exception:
                # The reaper runs again next interval; one failed run must not end the thread.
                log.exception("reaper run failed")

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Stop without dropping a request: stop accepting, answer the waiting leases now (with what
        they find, or nothing to lease), close streams with 1001, let requests under way reply for
        up to ``grace`` seconds (a lease reply nobody can receive gives its items back), then close
        the store."""
        if self._stop.is_set():
            return  # stopped already
        self._stop.set()
        served, self._loop = self._loop, None
        if served is not None:
            # A lease that waits inside the service (none here; the embedded library's) ends too.
            bootstrap.get_service().stop_waiting()
            future = asyncio.run_coroutine_threadsafe(served.shutdown(grace), served.loop)
            try:
                left = future.result(grace + 5)
            except Exception:  # the loop is gone or stuck: stop anyway
                log.exception("stopping the server's connections failed")
                left = 0
            if left:
                log.warning("stopped with %d request(s) still under way after %g s", left, grace)
            served.loop.call_soon_threadsafe(served.loop.stop)
            served.close()
        for thread in self._threads:
            thread.join(timeout=10)
        if self._store is not None:
            self._store.stop()
        # Closes the store's file (a SQLite file is whole again, without its write-ahead log).
        bootstrap.reset()

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
