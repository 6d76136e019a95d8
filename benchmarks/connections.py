"""Thousands of consumers on one ``querator serve``: streams and long-polls at once, and its ceiling.

    uv run python -m benchmarks.connections [--streams 5000] [--long-polls 5000] [--queues 50]
        [--idle 0] [--idle-seconds 5] [--deadline 120] [--connect-concurrency 200]
        [--max-connections N] [--ceiling 200] [--extra 50] [--url URL [--pid PID]]

From this one process (asyncio, one socket per consumer, 127.0.0.1 only):

1. **Load.** Starts one ``querator serve`` child (SQLite in a temporary directory; ``--url`` uses a
   running server instead) and opens ``--streams`` WebSocket streams (subscribe with credit 1, spread
   over half the queues), ``--long-polls`` long-polls (``queue.lease`` with ``request_timeout`` 20 s
   on keep-alive connections, again at once after a 454, over the other half) and ``--idle`` plain
   keep-alive connections that made one request and wait. Then it produces one item per consumer
   (batches of up to 1,000 over the HTTP API); every stream and long-poll must receive one, and
   completes it (over its stream once every stream holds its item, so that no stream's returned
   credit takes a second item from a stream still waiting; by ``queue.complete`` for a long-poll,
   which stops polling once it holds its item). Each item's payload is the time its produce call
   was sent, so the delivery time is from the produce call to the consumer holding the item.
2. **Ceiling.** A second server with ``--max-connections --ceiling``: ``--ceiling`` connections
   (half streams, half long-polls), then ``--extra`` more, half plain requests and half WebSocket
   upgrades: each must get the clean refusal, a 503 in the error envelope with ``Retry-After: 1``
   and ``Connection: close`` (never a reset or an EOF without a reply), and after ``--extra`` of
   the first ones close, as many new ones must be accepted again.

Printed: the connect phase's time, delivery times (p50 / p95 / max), items delivered and completed
per transport, errors by kind (every one is a failure of the run), and the server process's threads
(``/proc/PID/status`` Threads), resident memory (VmRSS) and CPU (utime + stime of ``/proc/PID/stat``
as % of one core over the phase) before connecting, while every consumer is open and idle, during
delivery, and after everything closed. Exits 1 when any consumer got no item or any error happened.

Bounded: every wait has a deadline, the run ends by itself, and it stops only the servers it started.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

from querator.testing import serve_child

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

#: The long-poll's wait, the API's largest (docs/api.md, "Limits").
POLL_WAIT: Final = "20s"
#: A long-poll reply is awaited this long: its wait plus a margin for a loaded server.
POLL_REPLY_TIMEOUT: Final = 30.0
#: One connection's TCP connect, WebSocket handshake and ``subscribed`` (or first reply).
CONNECT_TIMEOUT: Final = 20.0
#: Connections being opened at once: enough to make a burst, few enough not to time out waiting
#: on this client's own loop.
CONNECT_CONCURRENCY: Final = 200
#: The queues' lease: longer than any run, so no item comes back to the queue for another consumer.
LEASE_TIMEOUT: Final = "10m"
#: Most items in one ``queue.produce`` (docs/api.md, "Limits").
PRODUCE_BATCH: Final = 1000
#: Producer connections working through the batches at once.
PRODUCERS: Final = 4
#: How long new connections are tried again after closing some past the ceiling: a server may see
#: that a waiting long-poll's client closed only when its wait (20 s) ends.
SETTLE: Final = 25.0
#: Seconds between two readings of the server's ``/proc`` figures within a phase.
SAMPLE_EVERY: Final = 0.2
_READ_LIMIT: Final = 1 << 16


class ConsumerError(Exception):
    """What went wrong with one connection, as a kind to count (``errors by kind``)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def _kind(error: BaseException) -> str:
    """An exception as the kind of failure it is (the counted key)."""
    if isinstance(error, ConsumerError):
        return error.kind
    if isinstance(error, asyncio.TimeoutError | TimeoutError):
        return "timeout"
    if isinstance(error, asyncio.IncompleteReadError):
        return "EOF without a reply" if not error.partial else "EOF in the middle of a reply"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, ConnectionResetError | BrokenPipeError):
        return "connection reset"
    if isinstance(error, OSError):
        return f"OSError {error.errno}: {error.strerror}"
    return f"{type(error).__name__}: {error}"


# -- the server's figures ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcSample:
    at: float
    threads: int
    rss_kib: int
    cpu_seconds: float


def read_proc(pid: int) -> ProcSample:
    """Threads, VmRSS and utime + stime of process ``pid`` (Linux ``/proc``)."""
    status: dict[str, str] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as lines:  # noqa: PTH123 - /proc, not a path to build
        for line in lines:
            key, _, value = line.partition(":")
            status[key] = value.strip()
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:  # noqa: PTH123
        # The command name is in parentheses and may hold spaces: the fields start after it.
        fields = stat.read().rpartition(")")[2].split()
    ticks = os.sysconf("SC_CLK_TCK")
    # Fields 14 and 15 of proc(5) (utime, stime) are 12 and 13 after the state field (3).
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    return ProcSample(
        at=time.monotonic(),
        threads=int(status["Threads"]),
        rss_kib=int(status["VmRSS"].split()[0]),
        cpu_seconds=cpu,
    )


@dataclass
class PhaseFigures:
    """The server's figures over one phase: at its end, the most seen within it, and its CPU."""

    name: str
    seconds: float = 0.0
    threads: int = 0
    threads_max: int = 0
    rss_kib: int = 0
    rss_max_kib: int = 0
    cpu_percent: float = 0.0


class ServerMeter:
    """Reads the server's ``/proc`` figures every ``SAMPLE_EVERY`` s; ``phase`` measures one phase."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.phases: list[PhaseFigures] = []
        self._current: PhaseFigures | None = None

    def sample(self) -> ProcSample | None:
        if self.pid is None:
            return None
        try:
            return read_proc(self.pid)
        except (OSError, KeyError, ValueError, IndexError):
            return None  # the server has gone: its figures stop

    @contextlib.asynccontextmanager
    async def phase(self, name: str) -> Any:
        figures = PhaseFigures(name)
        self.phases.append(figures)
        first = self.sample()
        started = time.monotonic()
        sampler = asyncio.ensure_future(self._watch(figures))
        try:
            yield figures
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            figures.seconds = time.monotonic() - started
            last = self.sample()
            if first is not None and last is not None:
                self._note(figures, last)
                figures.threads, figures.rss_kib = last.threads, last.rss_kib
                wall = last.at - first.at
                if wall > 0:
                    figures.cpu_percent = 100 * (last.cpu_seconds - first.cpu_seconds) / wall

    async def _watch(self, figures: PhaseFigures) -> None:
        while True:
            sample = self.sample()
            if sample is not None:
                self._note(figures, sample)
            await asyncio.sleep(SAMPLE_EVERY)

    @staticmethod
    def _note(figures: PhaseFigures, sample: ProcSample) -> None:
        figures.threads_max = max(figures.threads_max, sample.threads)
        figures.rss_max_kib = max(figures.rss_max_kib, sample.rss_kib)


# -- a raw HTTP/1.1 client --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Response:
    status: int
    #: Header names in lower case.
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ConsumerError("not an HTTP reply")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def read_response(reader: asyncio.StreamReader) -> Response:
    """One HTTP/1.1 reply framed by ``Content-Length`` (what ``querator serve`` sends), or a reply
    without one that ends with the connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    status, headers = _parse_head(head[:-4])
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("connection", "").lower() == "close":
        body = await reader.read()
    else:
        body = b""
    return Response(status, headers, body)


class HttpConnection:
    """One keep-alive HTTP/1.1 connection to the server."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, host: str, port: int) -> HttpConnection:
        reader, writer = await asyncio.open_connection(host, port, limit=_READ_LIMIT)
        return cls(reader, writer, f"{host}:{port}")

    async def request(
        self, method: str, path: str, body: Any = None, *, timeout: float = CONNECT_TIMEOUT
    ) -> Response:
        payload = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        )
        self.writer.write(head.encode("ascii") + payload)
        await self.writer.drain()
        return await asyncio.wait_for(read_response(self.reader), timeout)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            await asyncio.wait_for(self.writer.wait_closed(), 2.0)


async def call(connection: HttpConnection, path: str, body: Any, *, timeout: float = 60.0) -> Any:
    """A call that must answer 200: its JSON body, else ``ConsumerError`` naming the status."""
    reply = await connection.request("POST", path, body, timeout=timeout)
    if reply.status != 200:
        raise ConsumerError(f"{path} answered {reply.status}: {reply.body[:200]!r}")
    return reply.json()


# -- a WebSocket client with wsproto ----------------------------------------------------------------------


class WebSocket:
    """One WebSocket connection (wsproto frames the bytes; the asyncio stream is ours)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.protocol = WSConnection(ConnectionType.CLIENT)
        self._text: list[str] = []
        self._messages: list[dict[str, Any]] = []
        self.closed_with: int | None = None

    @classmethod
    async def upgrade(
        cls, host: str, port: int, path: str, *, stage: Callable[[str], None] = lambda _: None
    ) -> tuple[WebSocket | None, Response | None]:
        """Connect and ask for the upgrade: the socket on ``101``, else the refusal's reply."""
        reader, writer = await asyncio.open_connection(host, port, limit=_READ_LIMIT)
        stage("handshake")
        socket = cls(reader, writer)
        try:
            writer.write(socket.protocol.send(Request(host=f"{host}:{port}", target=path)))
            await writer.drain()
            refusal: RejectConnection | None = None
            body = b""
            while True:
                data = await reader.read(_READ_LIMIT)
                if not data:
                    if refusal is not None:
                        return None, socket._refused(refusal, body)
                    raise asyncio.IncompleteReadError(b"", None)
                socket.protocol.receive_data(data)
                for event in socket.protocol.events():
                    if isinstance(event, AcceptConnection):
                        return socket, None
                    if isinstance(event, RejectConnection):
                        refusal = event
                        if not event.has_body:
                            return None, socket._refused(refusal, body)
                    elif isinstance(event, RejectData):
                        body += event.data
                        if event.body_finished and refusal is not None:
                            return None, socket._refused(refusal, body)
        except BaseException:
            writer.close()
            raise

    def _refused(self, refusal: RejectConnection, body: bytes) -> Response:
        self.writer.close()
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in refusal.headers}
        return Response(refusal.status_code, headers, body)

    async def send(self, message: dict[str, Any]) -> None:
        self.writer.write(self.protocol.send(TextMessage(data=json.dumps(message, separators=(",", ":")))))
        await self.writer.drain()

    async def receive(self) -> dict[str, Any]:
        """The next message; ``ConsumerError`` when the connection ends instead."""
        while not self._messages:
            data = await self.reader.read(_READ_LIMIT)
            if not data:
                raise ConsumerError("stream ended without a close frame")
            self.protocol.receive_data(data)
            for event in self.protocol.events():
                if isinstance(event, TextMessage):
                    self._text.append(event.data)
                    if event.message_finished:
                        self._messages.append(json.loads("".join(self._text)))
                        self._text.clear()
                elif isinstance(event, Ping):
                    self.writer.write(self.protocol.send(event.response()))
                elif isinstance(event, CloseConnection):
                    self.closed_with = event.code
                    raise ConsumerError(f"stream closed by the server ({event.code})")
        return self._messages.pop(0)

    async def close(self) -> None:
        try:
            with contextlib.suppress(Exception):  # the server may have closed it already
                if self.protocol.state is ConnectionState.OPEN:
                    self.writer.write(self.protocol.send(CloseConnection(code=1000)))
        finally:
            # Also when cancelled: the socket never outlives its consumer.
            self.writer.close()
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            await asyncio.wait_for(self.writer.wait_closed(), 2.0)


async def subscribe(
    host: str, port: int, queue_name: str, client_id: str, *, stage: Callable[[str], None] = lambda _: None
) -> WebSocket:
    """A stream subscribed to ``queue_name`` with credit 1 (``subscribed`` received)."""
    socket, refusal = await WebSocket.upgrade(host, port, "/v1/stream", stage=stage)
    if socket is None:
        assert refusal is not None  # noqa: S101 - upgrade returns one of the two
        raise ConsumerError(f"upgrade refused with {refusal.status}")
    stage("subscribe")
    try:
        await socket.send(
            {"type": "subscribe", "queue_name": queue_name, "credit": 1, "client_id": client_id}
        )
        reply = await socket.receive()
        if reply["type"] != "subscribed":
            raise ConsumerError(f"subscribe answered {reply['type']} {reply.get('code', '')}".strip())
    except BaseException:
        await socket.close()
        raise
    return socket


# -- the load ---------------------------------------------------------------------------------------------


@dataclass
class Consumer:
    """One stream or long-poll and what it received."""

    transport: str
    queue_name: str
    client_id: str
    connected: bool = False
    #: Its failure was counted (so "no item received" is not counted again for it).
    failed: bool = False
    #: It has completed what it held when told to (an item pushed after that stays held).
    settled: bool = False
    #: What it was doing: a failure is counted with it ("timeout in TCP connect").
    stage: str = "waiting to connect"
    #: Items held and not yet completed: (partition, id).
    held: list[tuple[int, str]] = field(default_factory=list)
    received: int = 0
    completed: int = 0
    #: Seconds from each item's produce call to this consumer holding it.
    latencies: list[float] = field(default_factory=list)
    got_item: asyncio.Event = field(default_factory=asyncio.Event)

    def at(self, stage: str) -> None:
        self.stage = stage


@dataclass
class LoadResult:
    streams: int
    long_polls: int
    idle: int
    queues: int
    connect_concurrency: int
    connect_seconds: float
    produce_seconds: float
    delivery_seconds: float
    phases: list[PhaseFigures]
    #: Whether the server's figures were read (its PID known).
    measured: bool
    delivered: dict[str, int]
    completed: dict[str, int]
    #: Consumers of each transport that received at least one item.
    served: dict[str, int]
    latencies: dict[str, list[float]]
    errors: Counter[str]

    @property
    def ok(self) -> bool:
        return (
            not self.errors
            and self.served.get("stream", 0) == self.streams
            and self.served.get("long-poll", 0) == self.long_polls
        )


class Gates:
    """The run's phases as events every consumer waits on."""

    def __init__(self) -> None:
        self.complete_streams = asyncio.Event()
        self.close = asyncio.Event()


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.hostname != "127.0.0.1" or parts.port is None:
        raise SystemExit(f"{url}: only a server on 127.0.0.1 with a port is measured")
    return parts.hostname, parts.port


def _receipt(consumer: Consumer, lease: dict[str, Any], received_at: float) -> None:
    for item in lease.get("items", []):
        consumer.held.append((int(lease.get("partition", 0)), item["id"]))
        consumer.received += 1
        sent = float(base64.b64decode(item["bytes"]))
        consumer.latencies.append(received_at - sent)
    consumer.got_item.set()


async def run_stream(
    host: str, port: int, consumer: Consumer, gates: Gates, errors: Counter[str], opening: asyncio.Semaphore
) -> None:
    """Subscribe, hold the pushed item, complete it over the stream when told, close when told."""
    socket: WebSocket | None = None
    try:
        async with opening:
            consumer.at("TCP connect")
            socket = await asyncio.wait_for(
                subscribe(host, port, consumer.queue_name, consumer.client_id, stage=consumer.at),
                CONNECT_TIMEOUT,
            )
        consumer.connected = True
        consumer.at("waiting for an item")
        replies: dict[str, asyncio.Future[dict[str, Any]]] = {}

        async def read() -> None:
            assert socket is not None  # noqa: S101
            while True:
                message = await socket.receive()
                if message["type"] == "lease":
                    _receipt(consumer, message, time.perf_counter())
                    if len(consumer.held) > 1:
                        errors["stream held more items than its credit (1)"] += 1
                elif message["type"] in ("ok", "error") and message.get("request_id") in replies:
                    replies.pop(message["request_id"]).set_result(message)
                elif message["type"] == "error":
                    errors[f"stream error {message.get('code')}: {str(message.get('message'))[:60]}"] += 1

        reader = asyncio.ensure_future(read())
        try:
            await _until_either(gates.complete_streams.wait(), reader)
            consumer.at("complete")
            if consumer.held:
                request_id = uuid.uuid4().hex
                replies[request_id] = asyncio.get_running_loop().create_future()
                partition = consumer.held[0][0]
                ids = [item_id for part, item_id in consumer.held if part == partition]
                await socket.send(
                    {"type": "complete", "request_id": request_id, "partition": partition, "ids": ids}
                )
                reply = await asyncio.wait_for(_either(replies[request_id], reader), CONNECT_TIMEOUT)
                if reply["type"] != "ok":
                    raise ConsumerError(f"stream complete answered {reply.get('code')}")
                consumer.completed += len(ids)
                consumer.held = [held for held in consumer.held if held[0] != partition]
            consumer.settled = True
            consumer.at("open after its complete")
            await _until_either(gates.close.wait(), reader)
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
    except asyncio.CancelledError:
        raise
    except BaseException as error:
        errors[f"stream: {_kind(error)} in {consumer.stage}"] += 1
        consumer.failed = True
    finally:
        if socket is not None:
            await socket.close()


async def _either(awaitable: Awaitable[Any], reader: asyncio.Future[None]) -> Any:
    """``awaitable``'s result, unless the stream's reader fails first (its failure is raised)."""
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task, reader}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        return task.result()
    task.cancel()
    reader.result()  # raises the reader's failure
    raise ConsumerError("stream reader stopped")


async def _until_either(awaitable: Awaitable[Any], reader: asyncio.Future[None]) -> None:
    await _either(awaitable, reader)


async def run_long_poll(
    host: str,
    port: int,
    consumer: Consumer,
    gates: Gates,
    errors: Counter[str],
    opening: asyncio.Semaphore,
    deadline: float,
) -> None:
    """One answered lease (nothing yet: 454) proves the connection is served; then long-polls until
    an item comes, completes it by ``queue.complete``, and waits on the open connection until told."""
    connection: HttpConnection | None = None
    lease = {"queue_name": consumer.queue_name, "batch_size": 1, "client_id": consumer.client_id}
    try:
        async with opening:
            consumer.at("TCP connect")
            connection = await asyncio.wait_for(HttpConnection.open(host, port), CONNECT_TIMEOUT)
            consumer.at("first lease")
            first = await connection.request("POST", "/v1/queue.lease", lease, timeout=CONNECT_TIMEOUT)
        if first.status not in (200, 454):
            raise ConsumerError(f"first lease answered {first.status}")
        consumer.connected = True
        consumer.at("long-poll")
        reply = first
        while reply.status != 200:
            if reply.status != 454:
                raise ConsumerError(f"lease answered {reply.status}")
            if time.monotonic() > deadline:
                raise ConsumerError("no item before the deadline")
            polled = await _unless(
                gates.close,
                connection.request(
                    "POST",
                    "/v1/queue.lease",
                    {**lease, "request_timeout": POLL_WAIT},
                    timeout=POLL_REPLY_TIMEOUT,
                ),
            )
            if polled is None:
                return  # the run is over; "no item received" is counted for it
            reply = polled
        _receipt(consumer, reply.json(), time.perf_counter())
        consumer.at("complete")
        for partition in sorted({part for part, _ in consumer.held}):
            ids = [item_id for part, item_id in consumer.held if part == partition]
            await call(
                connection,
                "/v1/queue.complete",
                {"queue_name": consumer.queue_name, "partition": partition, "ids": ids},
            )
            consumer.completed += len(ids)
        consumer.held.clear()
        consumer.settled = True
        consumer.at("open after its complete")
        await gates.close.wait()
    except asyncio.CancelledError:
        raise
    except BaseException as error:
        errors[f"long-poll: {_kind(error)} in {consumer.stage}"] += 1
        consumer.failed = True
    finally:
        if connection is not None:
            await connection.close()


async def _unless(gate: asyncio.Event, awaitable: Awaitable[Any]) -> Any:
    """``awaitable``'s result, or None (and it cancelled) when ``gate`` opens first."""
    task = asyncio.ensure_future(awaitable)
    gated = asyncio.ensure_future(gate.wait())
    try:
        await asyncio.wait({task, gated}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gated.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    return None if task.cancelled() else task.result()


async def run_idle(
    host: str, port: int, consumer: Consumer, gates: Gates, errors: Counter[str], opening: asyncio.Semaphore
) -> None:
    """A keep-alive connection that made one request (``GET /health``) and then only waits."""
    connection: HttpConnection | None = None
    try:
        async with opening:
            consumer.at("TCP connect")
            connection = await asyncio.wait_for(HttpConnection.open(host, port), CONNECT_TIMEOUT)
            consumer.at("GET /health")
            reply = await connection.request("GET", "/health", timeout=CONNECT_TIMEOUT)
        if reply.status != 200:
            raise ConsumerError(f"GET /health answered {reply.status}")
        consumer.connected = True
        consumer.at("open")
        await gates.close.wait()
    except asyncio.CancelledError:
        raise
    except BaseException as error:
        errors[f"idle: {_kind(error)} in {consumer.stage}"] += 1
        consumer.failed = True
    finally:
        if connection is not None:
            await connection.close()


async def produce(host: str, port: int, consumers: list[Consumer]) -> None:
    """One item per consumer into its queue, in batches of ``PRODUCE_BATCH`` over ``PRODUCERS``
    connections; each payload is the time its produce call was sent (``time.perf_counter``)."""
    wanted = Counter(consumer.queue_name for consumer in consumers)
    batches: list[tuple[str, int]] = []
    for queue_name, count in wanted.items():
        for start in range(0, count, PRODUCE_BATCH):
            batches.append((queue_name, min(PRODUCE_BATCH, count - start)))
    todo = iter(batches)

    async def producer() -> None:
        connection = await asyncio.wait_for(HttpConnection.open(host, port), CONNECT_TIMEOUT)
        try:
            for queue_name, count in todo:
                sent = repr(time.perf_counter())
                items = [{"utf8": sent}] * count
                await call(connection, "/v1/queue.produce", {"queue_name": queue_name, "items": items})
        finally:
            await connection.close()

    await asyncio.gather(*(producer() for _ in range(PRODUCERS)))


async def _create_queues(host: str, port: int, names: list[str]) -> None:
    connection = await asyncio.wait_for(HttpConnection.open(host, port), CONNECT_TIMEOUT)
    try:
        for name in names:
            await call(
                connection,
                "/v1/queues.create",
                {"queue_name": name, "lease_timeout": LEASE_TIMEOUT, "expire_timeout": "1h"},
            )
    finally:
        await connection.close()


def spread(count: int, queue_names: list[str]) -> Iterator[str]:
    """``count`` consumers' queues, round-robin over ``queue_names``."""
    for n in range(count):
        yield queue_names[n % len(queue_names)]


async def load(
    url: str,
    *,
    pid: int | None,
    streams: int,
    long_polls: int,
    queues: int = 50,
    idle: int = 0,
    idle_seconds: float = 5.0,
    deadline: float = 120.0,
    connect_concurrency: int = CONNECT_CONCURRENCY,
) -> LoadResult:
    """The load run against the server at ``url`` (``pid``: its process, for its figures)."""
    host, port = _address(url)
    meter = ServerMeter(pid)
    errors: Counter[str] = Counter()
    gates = Gates()
    run = uuid.uuid4().hex[:6]
    stream_queues = max(1, queues // 2) if long_polls else max(1, queues)
    poll_queues = max(1, queues - stream_queues) if streams else max(1, queues)
    stream_names = [f"load-{run}-s{n}" for n in range(stream_queues if streams else 0)]
    poll_names = [f"load-{run}-p{n}" for n in range(poll_queues if long_polls else 0)]
    await _create_queues(host, port, stream_names + poll_names)
    consumers = [
        Consumer("stream", name, f"s{n}") for n, name in enumerate(spread(streams, stream_names))
    ] + [Consumer("long-poll", name, f"p{n}") for n, name in enumerate(spread(long_polls, poll_names))]
    idlers = [Consumer("idle", "", f"i{n}") for n in range(idle)]

    async with meter.phase("before connecting"):
        await asyncio.sleep(min(2.0, idle_seconds))

    opening = asyncio.Semaphore(connect_concurrency)
    connect_timeout = CONNECT_TIMEOUT * (1 + (len(consumers) + idle) / connect_concurrency)
    # Long-polls stop polling at the run's deadline, counted from now.
    poll_deadline = time.monotonic() + connect_timeout + deadline
    tasks = [
        asyncio.ensure_future(
            run_stream(host, port, consumer, gates, errors, opening)
            if consumer.transport == "stream"
            else run_long_poll(host, port, consumer, gates, errors, opening, poll_deadline)
        )
        for consumer in consumers
    ] + [asyncio.ensure_future(run_idle(host, port, idler, gates, errors, opening)) for idler in idlers]
    # Each consumer with its task: one that failed is not waited for.
    pairs = list(zip(consumers, tasks, strict=False))
    try:
        async with meter.phase("connecting"):
            started = time.monotonic()
            await _wait_until(
                lambda: all(
                    c.connected or t.done() for c, t in zip([*consumers, *idlers], tasks, strict=True)
                ),
                connect_timeout,
            )
            connect_seconds = time.monotonic() - started

        async with meter.phase("all open, idle"):
            await asyncio.sleep(idle_seconds)

        async with meter.phase("delivery"):
            started = time.monotonic()
            try:
                await produce(host, port, [c for c in consumers if c.connected])
            except Exception as error:
                errors[f"produce: {_kind(error)}"] += 1
            produce_seconds = time.monotonic() - started
            await _wait_until(lambda: all(c.got_item.is_set() or t.done() for c, t in pairs), deadline)
            delivery_seconds = time.monotonic() - started
            gates.complete_streams.set()
            await _wait_until(
                lambda: all(c.settled or t.done() or not c.got_item.is_set() for c, t in pairs), deadline
            )

        async with meter.phase("after everything closed"):
            gates.close.set()
            await _wait_until(lambda: all(t.done() for t in tasks), CONNECT_TIMEOUT)
            await asyncio.sleep(min(3.0, idle_seconds))
    finally:
        gates.close.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    for consumer in consumers:
        if not consumer.received and not consumer.failed:
            errors[f"{consumer.transport}: no item received"] += 1
    transports = ("stream", "long-poll")
    return LoadResult(
        streams=streams,
        long_polls=long_polls,
        idle=idle,
        queues=len(stream_names) + len(poll_names),
        connect_concurrency=connect_concurrency,
        connect_seconds=connect_seconds,
        produce_seconds=produce_seconds,
        delivery_seconds=delivery_seconds,
        phases=meter.phases,
        measured=pid is not None,
        delivered={t: sum(c.received for c in consumers if c.transport == t) for t in transports},
        completed={t: sum(c.completed for c in consumers if c.transport == t) for t in transports},
        served={t: sum(bool(c.received) for c in consumers if c.transport == t) for t in transports},
        latencies={t: [x for c in consumers if c.transport == t for x in c.latencies] for t in transports},
        errors=errors,
    )


async def _wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll ``condition`` every 50 ms for up to ``timeout`` seconds; whether it came true."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


# -- the ceiling ------------------------------------------------------------------------------------------


@dataclass
class CeilingResult:
    ceiling: int
    #: The first ``ceiling`` connections: how many were served (stream subscribed / lease answered).
    opened: int
    #: What each extra connection past the ceiling got, by kind ("clean 503" is the one wanted).
    past_ceiling: Counter[str]
    released: int
    #: After ``released`` of the first connections closed: how the new ones fared, by kind.
    after_release: Counter[str]
    #: 503s the new ones got (and tried again after) before the server saw the closes.
    refused_again: int
    #: Seconds from closing the first ones to the last new one accepted.
    room_seconds: float
    #: Extra connections asked: the number each of ``past_ceiling`` and ``after_release`` should sum to.
    extra: int
    errors: Counter[str]

    @property
    def ok(self) -> bool:
        return (
            not self.errors
            and self.opened == self.ceiling
            and self.past_ceiling == Counter({"clean 503": self.extra})
            and self.after_release == Counter({"accepted": self.extra})
        )


def _clean_503(reply: Response) -> str:
    """ "clean 503" when ``reply`` is the contract's refusal, else what is missing from it."""
    if reply.status != 503:
        return "accepted" if reply.status in (101, 200) else f"answered {reply.status}"
    missing = []
    try:
        envelope = json.loads(reply.body)
    except ValueError:
        envelope = None
    if not (
        isinstance(envelope, dict)
        and envelope.get("code") == 503
        and envelope.get("code_text") == "Service Unavailable"
        and str(envelope.get("message", "")).startswith("Service unavailable")
    ):
        missing.append("envelope")
    if reply.headers.get("retry-after") != "1":
        missing.append("Retry-After: 1")
    if reply.headers.get("connection", "").lower() != "close":
        missing.append("Connection: close")
    return "clean 503" if not missing else f"503 without {', '.join(missing)}"


async def knock(
    host: str,
    port: int,
    *,
    websocket: bool,
    queue_name: str,
    keep: list[WebSocket | HttpConnection] | None = None,
) -> str:
    """One new connection with one request (a plain ``queues.info`` or a WebSocket upgrade):
    "accepted", "clean 503", or what else happened (a drop: reset, EOF, timeout). An accepted
    connection is closed, or left open in ``keep``."""
    try:
        if websocket:
            socket, refusal = await asyncio.wait_for(
                WebSocket.upgrade(host, port, "/v1/stream"), CONNECT_TIMEOUT
            )
            if socket is not None:
                if keep is None:
                    await socket.close()
                else:
                    keep.append(socket)
                return "accepted"
            assert refusal is not None  # noqa: S101
            return _clean_503(refusal)
        connection = await asyncio.wait_for(HttpConnection.open(host, port), CONNECT_TIMEOUT)
        kept = False
        try:
            reply = await connection.request("POST", "/v1/queues.info", {"queue_name": queue_name})
            verdict = _clean_503(reply)
            if verdict == "clean 503":
                # "Connection: close" must mean it: the server closes its end after the reply.
                rest = await asyncio.wait_for(connection.reader.read(), 5.0)
                if rest:
                    verdict = "503 followed by more bytes"
            elif verdict == "accepted" and keep is not None:
                keep.append(connection)
                kept = True
            return verdict
        finally:
            if not kept:
                await connection.close()
    except Exception as error:
        return f"dropped: {_kind(error)}"


async def ceiling(url: str, *, limit: int, extra: int, settle: float = SETTLE) -> CeilingResult:
    """``limit`` connections (half streams, half long-polls) on a server started with
    ``--max-connections limit``, then ``extra`` more (half plain requests, half WebSocket upgrades),
    then ``extra`` of the first closed and ``extra`` new ones (each tried again after a 503 for up
    to ``settle`` seconds: the server sees a close when its loop gets to it)."""
    host, port = _address(url)
    errors: Counter[str] = Counter()
    gates = Gates()
    run = uuid.uuid4().hex[:6]
    queue_name = f"ceiling-{run}"
    await _create_queues(host, port, [queue_name])
    # The connection that created the queue is closed; the server is given a moment to see it, so
    # that the first ``limit`` connections are all its own.
    await asyncio.sleep(1.0)
    opening = asyncio.Semaphore(CONNECT_CONCURRENCY)
    consumers = [Consumer("stream" if n % 2 == 0 else "long-poll", queue_name, f"c{n}") for n in range(limit)]
    far = time.monotonic() + 3600
    tasks = [
        asyncio.ensure_future(
            run_stream(host, port, consumer, gates, errors, opening)
            if consumer.transport == "stream"
            else run_long_poll(host, port, consumer, gates, errors, opening, far)
        )
        for consumer in consumers
    ]
    try:
        await _wait_until(
            lambda: all(c.connected or t.done() for c, t in zip(consumers, tasks, strict=True)),
            CONNECT_TIMEOUT * (1 + limit / CONNECT_CONCURRENCY),
        )
        opened = sum(c.connected for c in consumers)
        past = Counter(
            await asyncio.gather(
                *(knock(host, port, websocket=n % 2 == 1, queue_name=queue_name) for n in range(extra))
            )
        )
        # Close ``extra`` of the first ones: streams and long-polls alike.
        closing = [t for c, t in zip(consumers, tasks, strict=True) if c.connected and not t.done()][:extra]
        for task in closing:
            task.cancel()
        await asyncio.gather(*closing, return_exceptions=True)
        released = len(closing)
        closed_at = time.monotonic()
        last_accepted = closed_at

        refused_again = 0
        kept: list[WebSocket | HttpConnection] = []

        async def retry(websocket: bool) -> str:
            nonlocal refused_again, last_accepted
            until = time.monotonic() + settle
            while True:
                # Accepted ones stay open: the room must be there for all of them at once.
                verdict = await knock(host, port, websocket=websocket, queue_name=queue_name, keep=kept)
                if verdict == "accepted":
                    last_accepted = max(last_accepted, time.monotonic())
                if verdict != "clean 503" or time.monotonic() > until:
                    return verdict
                refused_again += 1
                await asyncio.sleep(0.1)

        try:
            after = Counter(await asyncio.gather(*(retry(n % 2 == 1) for n in range(extra))))
        finally:
            await asyncio.gather(*(connection.close() for connection in kept), return_exceptions=True)
    finally:
        gates.close.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return CeilingResult(
        ceiling=limit,
        opened=opened,
        past_ceiling=past,
        released=released,
        after_release=after,
        refused_again=refused_again,
        room_seconds=last_accepted - closed_at,
        extra=extra,
        errors=errors,
    )


# -- the command ------------------------------------------------------------------------------------------


def raise_file_limit(needed: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; exit when that is below ``needed``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, needed)
    if target < needed:
        raise SystemExit(
            f"this run needs {needed} open files but the hard limit is {hard} (ulimit -Hn): raise it first"
        )
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def report_load(result: LoadResult) -> str:
    lines = [
        f"load: {result.streams} streams + {result.long_polls} long-polls + {result.idle} idle connections"
        f" over {result.queues} queues",
        f"  connect phase: {result.connect_seconds:.1f} s ({result.connect_concurrency} at once);"
        f" produce calls: {result.produce_seconds:.1f} s;"
        f" until every consumer held its item: {result.delivery_seconds:.1f} s",
        "",
        f"  {'transport':<10} {'consumers':>9} {'served':>7} {'items':>7} {'completed':>9}"
        f" {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}",
    ]
    for transport, count in (("stream", result.streams), ("long-poll", result.long_polls)):
        latencies = result.latencies[transport]
        figures = (
            f"{statistics.median(latencies) * 1000:8.0f} {percentile(latencies, 0.95) * 1000:8.0f}"
            f" {max(latencies) * 1000:8.0f}"
            if latencies
            else f"{'-':>8} {'-':>8} {'-':>8}"
        )
        lines.append(
            f"  {transport:<10} {count:>9} {result.served[transport]:>7} {result.delivered[transport]:>7}"
            f" {result.completed[transport]:>9} {figures}"
        )
    lines += [
        "",
        f"  {'server, phase':<26} {'seconds':>7} {'threads':>7} {'max':>6}"
        f" {'RSS MiB':>8} {'max':>6} {'CPU %':>6}",
    ]
    for phase in result.phases:
        if not result.measured:
            lines.append(f"  {phase.name:<26} {phase.seconds:7.1f}   (no server PID: --url without --pid)")
            continue
        lines.append(
            f"  {phase.name:<26} {phase.seconds:7.1f} {phase.threads:7} {phase.threads_max:6}"
            f" {phase.rss_kib / 1024:8.0f} {phase.rss_max_kib / 1024:6.0f} {phase.cpu_percent:6.0f}"
        )
    lines += ["", *report_errors(result.errors)]
    return "\n".join(lines)


def report_ceiling(result: CeilingResult) -> str:
    def counts(counter: Counter[str]) -> str:
        return ", ".join(f"{kind}: {n}" for kind, n in counter.most_common()) or "none"

    lines = [
        f"ceiling: --max-connections {result.ceiling}",
        f"  first {result.ceiling} (half streams, half long-polls): {result.opened} served",
        f"  {result.extra} more (half plain requests, half WebSocket upgrades):"
        f" {counts(result.past_ceiling)}",
        f"  after closing {result.released} of the first, {result.extra} new ones:"
        f" {counts(result.after_release)} ({result.refused_again} 503s tried again first;"
        f" the last accepted {result.room_seconds:.1f} s after the closes)",
        *report_errors(result.errors),
    ]
    return "\n".join(lines)


def report_errors(errors: Counter[str]) -> list[str]:
    if not errors:
        return ["  errors: 0"]
    return [f"  errors: {sum(errors.values())}"] + [f"    {n:>6}  {kind}" for kind, n in errors.most_common()]


def _stderr_tail(path: str, lines: int = 5) -> str:
    with open(path, encoding="utf-8", errors="replace") as log:  # noqa: PTH123
        text = log.read().splitlines()
    if not text:
        return "  server stderr: empty"
    return "\n".join(
        [f"  server stderr: {len(text)} lines, the last:", *(f"    {line[:160]}" for line in text[-lines:])]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=5000)
    parser.add_argument("--long-polls", type=int, default=5000)
    parser.add_argument("--queues", type=int, default=50)
    parser.add_argument("--idle", type=int, default=0, help="plain keep-alive connections that only wait")
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--deadline", type=float, default=120.0, help="seconds for delivery, at most")
    parser.add_argument(
        "--connect-concurrency",
        type=int,
        default=CONNECT_CONCURRENCY,
        help="connections being opened at once",
    )
    parser.add_argument(
        "--max-connections", type=int, default=None, help="passed to the load's server (default: its own)"
    )
    parser.add_argument(
        "--ceiling", type=int, default=200, help="the ceiling phase's --max-connections; 0: skip"
    )
    parser.add_argument("--extra", type=int, default=50, help="connections past the ceiling")
    parser.add_argument("--url", default=None, help="a running server on 127.0.0.1 instead of a child")
    parser.add_argument("--pid", type=int, default=None, help="with --url: the server's PID, for its figures")
    args = parser.parse_args(argv)
    raise_file_limit(args.streams + args.long_polls + args.idle + max(args.ceiling + args.extra, 0) + 100)

    ok = True
    with tempfile.NamedTemporaryFile(prefix="connections-serve-", suffix=".log") as log:
        serve_args = [] if args.max_connections is None else ["--max-connections", str(args.max_connections)]
        with contextlib.ExitStack() as stack:
            if args.url:
                url, pid = args.url, args.pid
            else:
                child = stack.enter_context(serve_child(*serve_args, stderr=log))
                url, pid = child.url, child.pid
            result = asyncio.run(
                load(
                    url,
                    pid=pid,
                    streams=args.streams,
                    long_polls=args.long_polls,
                    queues=args.queues,
                    idle=args.idle,
                    idle_seconds=args.idle_seconds,
                    deadline=args.deadline,
                    connect_concurrency=args.connect_concurrency,
                )
            )
        print(report_load(result))
        ok = result.ok
        if not args.url:
            print(_stderr_tail(log.name))
    if args.ceiling > 0 and args.url:
        print("\nceiling: not measured with --url (it starts a server of its own with --max-connections)")
    elif args.ceiling > 0:
        print()
        with tempfile.NamedTemporaryFile(prefix="connections-ceiling-", suffix=".log") as log:
            try:
                with serve_child("--max-connections", str(args.ceiling), stderr=log) as child:
                    limited = asyncio.run(ceiling(child.url, limit=args.ceiling, extra=args.extra))
                print(report_ceiling(limited))
                ok = ok and limited.ok
            except RuntimeError as error:
                print(f"ceiling: the server did not start with --max-connections {args.ceiling}: {error}")
                ok = False
            print(_stderr_tail(log.name))
    print("\nresult:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
