"""Python client: a stream consumer, leased items pushed over a WebSocket (docs/api.md, "Streaming").

``Stream`` is one connection: it subscribes to a queue with a credit (how many items the server may
hold leased for it at once), yields each pushed ``Lease``, and completes / retries / renews over the
same connection, which returns the credit. ``stream_consume`` runs a handler per item on it.

One thread per connection: replies to calls are matched by ``request_id``; leases pushed while a
call waits for its reply are kept and yielded next, so none is dropped.

A server that goes away (``querator serve`` stopping sends close 1001; a crash or a cut network ends
the connection without a close frame, 1006) is told apart from one that is slow: calls then raise
``StreamClosedError`` with the close code and reason at once, ``leases()`` ends and ``closed_by``
keeps the error, while a call that got no reply in time raises ``ConnectionFailedError`` with
``timed_out`` set.
"""

from __future__ import annotations

import contextlib
import json
import queue
import random
import threading
import time
import uuid
from collections import Counter, deque
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit, urlunsplit

from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.sync.client import connect

from querator.client.errors import (
    ApiError,
    ConnectionFailedError,
    ItemNotLeasedError,
    StreamClosedError,
    error_for,
)
from querator.client.models import Lease, LeasedItem, RetryItem
from querator.client.worker import DeadLetter, WorkerReport

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from websockets.sync.client import ClientConnection

    from querator.client.transport import RequestSigner

#: A pushed lease may carry up to 5 MB of payloads (the API's reply limit), plus its JSON.
_MAX_MESSAGE: Final = 8 * 1024 * 1024
#: Largest frame sent: API Gateway takes frames of at most 32 KB (and messages of at most 128 KB).
FRAME_CHARS: Final = 30_000
#: A shared stream pings after this long without sending: under API Gateway's 10-minute idle limit.
KEEPALIVE_SECONDS: Final = 540.0
PATH: Final = "/v1/stream"
#: The close code of a connection that ended without a close frame (RFC 6455, 7.1.5).
NO_CLOSE_FRAME: Final = 1006


class StreamUnavailableError(ConnectionFailedError):
    """The endpoint answered the upgrade with a plain reply: it has no stream (an older server, a
    stack without the WebSocket API; a 4xx ``status``) or cannot take one now (a 5xx)."""

    def __init__(self, message: str, *, sent: bool, status: int | None = None) -> None:
        super().__init__(message, sent=sent)
        #: The HTTP status of the reply (``None``: not known).
        self.status = status


def stream_url(base_url: str) -> str:
    """``http://127.0.0.1:2319`` → ``ws://127.0.0.1:2319/v1/stream`` (``https`` → ``wss``)."""
    parts = urlsplit(base_url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + PATH, "", ""))


class Stream:
    """One stream connection subscribed to ``queue_name``; use as a context manager."""

    def __init__(
        self,
        base_url: str,
        queue_name: str,
        *,
        credit: int = 10,
        client_id: str | None = None,
        open_timeout: float = 10.0,
        call_timeout: float = 60.0,
        url: str | None = None,
        signer: RequestSigner | None = None,
        ticket: str | None = None,
    ) -> None:
        """``url``: the WebSocket URL when it is not ``base_url``'s ``/v1/stream`` (a deployed
        stack's ``StreamUrl``); ``signer``: signs the handshake (SigV4: the stack's ``$connect`` is
        IAM-authorized); ``call_timeout``: how long ``complete`` / ``retry`` / ``renew`` wait for
        their reply (the server's calls are short; a long-poll is never one); ``ticket``: a
        ``stream.ticket`` of ``queue_name``, which a stack that checks per-queue access asks for
        (``Client.stream_ticket``)."""
        self.queue_name = queue_name
        self.credit = credit
        self._client_id = client_id
        self._url = url or stream_url(base_url)
        self._signer = signer
        self._ticket = ticket
        self._open_timeout = open_timeout
        self._call_timeout = call_timeout
        #: Set once the server closed the stream or the connection ended: the close code and
        #: reason (1006 without a close frame). ``None`` while open, or when this side closed it.
        self.closed_by: StreamClosedError | None = None
        self._socket: ClientConnection | None = None
        self._exit = contextlib.ExitStack()
        self._leases: deque[Lease] = deque()
        self._parts = _Assembler()

    def __enter__(self) -> Stream:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> Stream:
        try:
            # Entered as a context manager (what websockets asks for); closed by close().
            self._socket = self._exit.enter_context(
                connect(
                    self._url,
                    open_timeout=self._open_timeout,
                    max_size=_MAX_MESSAGE,
                    additional_headers=self._handshake_headers(),
                )
            )
        except InvalidStatus as error:
            raise StreamUnavailableError(
                f"{self._url} has no stream (HTTP {error.response.status_code})",
                sent=False,
                status=error.response.status_code,
            ) from error
        except (OSError, TimeoutError) as error:
            raise ConnectionFailedError(f"cannot open {self._url}: {error}", sent=False) from error
        subscribe: dict[str, Any] = {
            "type": "subscribe",
            "queue_name": self.queue_name,
            "credit": self.credit,
        }
        if self._client_id:
            subscribe["client_id"] = self._client_id
        if self._ticket:
            subscribe["ticket"] = self._ticket
        try:
            self._send(subscribe)
            # An unknown queue is refused here, with its error (QueueNotFoundError), not after.
            self._until(lambda message: message["type"] == "subscribed", timeout=self._open_timeout)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        self._socket = None
        self._exit.close()

    def _handshake_headers(self) -> dict[str, str]:
        """The signature of the handshake's GET (signed as the ``https`` request it upgrades)."""
        if self._signer is None:
            return {}
        parts = urlsplit(self._url)
        https = urlunsplit(({"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme), *parts[1:]))
        signed = self._signer.sign("GET", https, {"Host": parts.netloc}, b"")
        return {name: value for name, value in signed.items() if name.lower() != "host"}

    def leases(self, *, timeout: float | None = None) -> Iterator[Lease]:
        """Pushed leases as they arrive; ends when ``timeout`` seconds pass without one (``None``:
        never) or the server closes the stream. It ends rather than raises on a close, as an
        iterator whose source ran dry: ``closed_by`` tells the two apart (``None`` after a
        timeout; the ``StreamClosedError`` with the close code and reason after a close)."""
        while True:
            if self._leases:
                yield self._leases.popleft()
                continue
            message = self._receive(timeout)
            if message is None:
                return
            self._dispatch(message)

    def complete(self, partition: int, ids: list[str]) -> None:
        """``complete`` over the stream; raises as ``Client.complete`` does. The credit of each id
        the server applied comes back; an id it refused stays counted until its lease deadline.
        Raises ``StreamClosedError`` once the server went away (``sent`` True: the close came
        before the reply, so it may have been applied) and ``ConnectionFailedError`` with
        ``timed_out`` when no reply came within ``call_timeout``."""
        self._call({"type": "complete", "partition": partition, "ids": ids})

    def retry(self, partition: int, items: list[RetryItem]) -> None:
        self._call({"type": "retry", "partition": partition, "items": [item.to_wire() for item in items]})

    def renew(self, partition: int, ids: list[str], *, lease_timeout: str | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"type": "renew", "partition": partition, "ids": ids}
        if lease_timeout is not None:
            message["lease_timeout"] = lease_timeout
        return self._call(message)

    def give_credit(self, count: int) -> None:
        """Return credit for items settled over the HTTP API instead of this stream."""
        self._send({"type": "credit", "credit": count})

    # -- plumbing -------------------------------------------------------------------------------------

    def _call(self, message: dict[str, Any]) -> dict[str, Any]:
        request_id = uuid.uuid4().hex
        self._send({**message, "request_id": request_id})
        reply = self._until(lambda m: m.get("request_id") == request_id, timeout=self._call_timeout)
        if reply["type"] == "error":
            raise error_for(int(reply["code"]), reply)
        answer: dict[str, Any] = reply.get("reply") or {}
        return answer

    def _until(self, wanted: Callable[[dict[str, Any]], bool], *, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            message = self._receive(max(0.0, deadline - time.monotonic()))
            if message is None and self.closed_by is not None:
                raise self._gone(sent=True)
            if message is None:
                raise ConnectionFailedError(
                    f"no reply from {self._url} within {timeout:.0f} s", sent=True, timed_out=True
                )
            if wanted(message):
                return message
            self._dispatch(message)

    def _dispatch(self, message: dict[str, Any]) -> None:
        if message["type"] in ("lease", "part"):
            self._leases.extend(self._parts.feed(message))
        elif message["type"] == "error" and not message.get("request_id"):
            # The subscription failed (unknown queue, …): nothing more will come.
            raise error_for(int(message["code"]), message)

    def _send(self, message: dict[str, Any]) -> None:
        if self._socket is None:
            raise ConnectionFailedError("the stream is not open", sent=False)
        text = json.dumps(message)  # ASCII: one character is one byte
        try:
            if len(text) <= FRAME_CHARS:
                self._socket.send(text)
            else:
                # API Gateway closes a connection (1009) on a frame over 32 KB: a long complete /
                # retry / renew goes in fragments of one message.
                self._socket.send(text[n : n + FRAME_CHARS] for n in range(0, len(text), FRAME_CHARS))
        except ConnectionClosed as error:
            self._went_away(error)
            raise self._gone(sent=False) from error

    def _receive(self, timeout: float | None) -> dict[str, Any] | None:
        if self._socket is None:
            raise ConnectionFailedError("the stream is not open", sent=False)
        try:
            text = self._socket.recv(timeout=timeout)
        except TimeoutError:
            return None
        except ConnectionClosed as error:
            self._went_away(error)
            return None
        message: dict[str, Any] = json.loads(text)
        return message

    def _went_away(self, error: ConnectionClosed) -> None:
        """Keep how the connection ended: the server's close frame, or 1006 when none came."""
        if self.closed_by is not None:
            return
        frame = error.rcvd
        if frame is None:
            code, reason = NO_CLOSE_FRAME, ""
            text = f"the stream {self._url} ended without a close frame ({code}): the server went away"
        else:
            code, reason = frame.code, frame.reason
            text = f"the server closed the stream {self._url} ({f'{code} {reason}'.strip()})"
        self.closed_by = StreamClosedError(text, sent=False, code=code, reason=reason)

    def _gone(self, *, sent: bool) -> StreamClosedError:
        """The error for a call the close got in the way of: before it was sent, or before its reply."""
        closed = self.closed_by
        assert closed is not None  # noqa: S101 - only called after _went_away
        text = str(closed) + (" before the reply" if sent else "")
        return StreamClosedError(text, sent=sent, code=closed.code, reason=closed.reason)


class SharedStream(Stream):
    """A ``Stream`` that several threads use at once (the consumer worker's ``mode="stream"``).

    One reader thread takes every message off the connection: pushed leases go to ``pushed`` (then
    ``None`` once the connection has ended), each reply to the thread whose call waits for it, so
    ``complete`` / ``retry`` / ``renew`` / ``give_credit`` may be called from any thread while
    another waits for leases. ``failure`` is the error that ended the subscription, if the server
    sent one (an unknown queue, …); ``closed_by`` the ``StreamClosedError`` when the server closed
    it or the connection ended: calls waiting for a reply then raise it at once (``sent`` True).
    """

    #: How often the reader looks up from the connection to see whether it was closed, in seconds.
    _READ_TICK: Final = 0.2

    def __init__(
        self, base_url: str, queue_name: str, *, keepalive: float | None = KEEPALIVE_SECONDS, **options: Any
    ) -> None:
        """``keepalive``: send a ``ping`` after this many seconds without sending anything (API
        Gateway closes a connection idle for 10 minutes); ``None``: never."""
        super().__init__(base_url, queue_name, **options)
        self._keepalive = keepalive
        self._last_sent = time.monotonic()
        #: ``pong`` answers received (each ``ping`` the keepalive sent gets one).
        self.pongs = 0
        self.pushed: queue.SimpleQueue[Lease | None] = queue.SimpleQueue()
        self.failure: ApiError | None = None
        self.ended = threading.Event()
        self._state = threading.Lock()
        self._sending = threading.Lock()
        self._replies: dict[str, _Reply] = {}
        self._reader: threading.Thread | None = None

    def open(self) -> SharedStream:
        super().open()
        # Leases that arrived before "subscribed" was read were kept by the plain stream.
        while self._leases:
            self.pushed.put(self._leases.popleft())
        self._reader = threading.Thread(target=self._read, name="querator-stream-reader", daemon=True)
        self._reader.start()
        return self

    def close(self) -> None:
        self.ended.set()
        if self._reader is not None:
            self._reader.join(timeout=2 * self._READ_TICK + 1.0)
        super().close()

    def leases(self, *, timeout: float | None = None) -> Iterator[Lease]:
        while True:
            try:
                lease = self.pushed.get(timeout=timeout)
            except queue.Empty:
                return
            if lease is None:
                self.pushed.put(None)  # ended for every later reader too
                return
            yield lease

    def give_credit(self, count: int) -> None:
        self._send({"type": "credit", "credit": count})

    def _send(self, message: dict[str, Any]) -> None:
        with self._sending:
            super()._send(message)
            self._last_sent = time.monotonic()

    def _call(self, message: dict[str, Any]) -> dict[str, Any]:
        request_id = uuid.uuid4().hex
        slot = _Reply()
        with self._state:
            if self.ended.is_set():
                if self.closed_by is not None:
                    raise self._gone(sent=False)
                raise ConnectionFailedError("the stream has ended", sent=False)
            self._replies[request_id] = slot
        try:
            self._send({**message, "request_id": request_id})
            if not slot.done.wait(self._call_timeout):
                raise ConnectionFailedError(
                    f"no reply from {self._url} within {self._call_timeout:g} s", sent=True, timed_out=True
                )
        finally:
            with self._state:
                self._replies.pop(request_id, None)
        reply = slot.message
        if reply is None:
            # Sent, and the connection ended before the answer: it may or may not have been applied.
            if self.closed_by is not None:
                raise self._gone(sent=True)
            raise ConnectionFailedError("the stream ended before its reply", sent=True)
        if reply["type"] == "error":
            raise error_for(int(reply["code"]), reply)
        answer: dict[str, Any] = reply.get("reply") or {}
        return answer

    def _read(self) -> None:
        socket = self._socket
        try:
            while socket is not None and not self.ended.is_set():
                try:
                    text = socket.recv(timeout=self._READ_TICK)
                except TimeoutError:
                    if self._keepalive is not None and time.monotonic() - self._last_sent >= self._keepalive:
                        self._send({"type": "ping"})
                    continue
                message: dict[str, Any] = json.loads(text)
                if message["type"] in ("lease", "part"):
                    for lease in self._parts.feed(message):
                        self.pushed.put(lease)
                elif message["type"] == "pong":
                    self.pongs += 1
                elif message.get("request_id"):
                    with self._state:
                        slot = self._replies.get(str(message["request_id"]))
                    if slot is not None:
                        slot.message = message
                        slot.done.set()
                elif message["type"] == "error":
                    failure = error_for(int(message["code"]), message)
                    if failure.code >= 500:
                        continue  # a lease attempt failed on the server; the subscription stays
                    self.failure = failure  # the subscription ended (unknown queue, …)
                    return
        except ConnectionClosed as error:
            self._went_away(error)  # the server went away: the waiting calls raise it, not a timeout
        except (WebSocketException, ConnectionFailedError, OSError, ValueError):
            return  # the connection ended (or sent something that is not the protocol): stop reading
        finally:
            with self._state:
                self.ended.set()
                waiting = list(self._replies.values())
            for slot in waiting:
                slot.done.set()  # with no message: "ended before its reply"
            self.pushed.put(None)


class _Assembler:
    """Pushed leases whose items come in parts: a deployed stack's messages are at most 128 KB, so an
    item too large for one arrives in its ``lease`` frame without payload (``parts: n``), followed by
    ``n`` ``part`` frames. A lease is handed on once all its items are whole."""

    def __init__(self) -> None:
        #: Leases waiting for parts: the frame, and per item id its parts so far.
        self._waiting: list[tuple[dict[str, Any], dict[str, list[str | None]]]] = []

    def feed(self, message: dict[str, Any]) -> list[Lease]:
        if message["type"] == "lease":
            parts: dict[str, list[str | None]] = {
                str(item["id"]): [None] * int(item["parts"])
                for item in message.get("items", [])
                if int(item.get("parts") or 0) > 0
            }
            if not parts:
                return [Lease.from_wire(message)]
            self._waiting.append((message, parts))
            return []
        for index, (frame, waiting) in enumerate(self._waiting):
            chunks = waiting.get(str(message.get("id")))
            if chunks is None:
                continue
            chunks[int(message["index"])] = str(message.get("bytes") or "")
            if any(chunk is None for pending in waiting.values() for chunk in pending):
                return []
            del self._waiting[index]
            items = [
                {key: value for key, value in item.items() if key != "parts"}
                | (
                    {"bytes": "".join(str(c) for c in waiting[str(item["id"])])}
                    if str(item["id"]) in waiting
                    else {}
                )
                for item in frame.get("items", [])
            ]
            return [Lease.from_wire({**frame, "items": items})]
        return []  # a part of nothing we wait for (its lease frame was lost with a reconnect)


class _Reply:
    """Where the reader leaves one call's reply."""

    __slots__ = ("done", "message")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.message: dict[str, Any] | None = None


def stream_consume(
    base_url: str,
    queue_name: str,
    handler: Callable[[LeasedItem], object],
    *,
    credit: int = 10,
    max_items: int | None = None,
    idle: float | None = None,
    retry_backoff: float = 1.0,
    dead_letter_on: tuple[type[BaseException], ...] = (DeadLetter,),
) -> WorkerReport:
    """Run ``handler`` once per pushed item, in the calling thread, until ``max_items`` were handled,
    ``idle`` seconds pass without an item, or the server closes the stream.

    An item is completed when the handler returns, retried at ``retry_backoff * 2 ** (attempts - 1)``
    (with full jitter) when it raises, and dead-lettered when it raises one of ``dead_letter_on``.

    A server that goes away (close 1001 when it stops, or a connection ended without a close frame)
    ends the run like ``max_items`` does: the report comes back with ``stopped_by="closed"`` and
    ``closed_by`` the close code and reason, because the stream this function owns is over and
    there is nothing left to take from it (``Client.stream`` is the consumer that subscribes
    again). The item whose settle the close cut off, and the items of its lease not yet handled
    (not run: they could not be settled), count as ``unsettled``: their leases run out and they
    come back. Other errors (an unknown queue, a call that timed out) raise.
    """
    counts: Counter[str] = Counter()
    started = time.monotonic()
    stopped_by = "closed"
    with Stream(base_url, queue_name, credit=credit) as stream:
        for lease in stream.leases(timeout=idle):
            for done, item in enumerate(lease.items):
                if stream.closed_by is not None:
                    left = len(lease.items) - done
                    counts["leased"] += left
                    counts["unsettled"] += left
                    break
                counts["leased"] += 1
                outcome, retry = _run(handler, item, retry_backoff, dead_letter_on)
                if outcome != "completed":
                    counts["failures"] += 1
                try:
                    if retry is None:
                        stream.complete(lease.partition, [item.id])
                    else:
                        stream.retry(lease.partition, [retry])
                    counts[outcome] += 1
                except ItemNotLeasedError:
                    counts["lost"] += 1
                except (ApiError, StreamClosedError):
                    counts["unsettled"] += 1
            if stream.closed_by is not None:
                break
            if max_items is not None and counts["leased"] >= max_items:
                stopped_by = "max_items"
                break
        else:
            stopped_by = "idle" if stream.closed_by is None and idle is not None else "closed"
        closed_by = stream.closed_by
    return WorkerReport(
        leased=counts["leased"],
        completed=counts["completed"],
        retried=counts["retried"],
        dead_lettered=counts["dead_lettered"],
        lost=counts["lost"],
        unsettled=counts["unsettled"],
        failures=counts["failures"],
        elapsed=time.monotonic() - started,
        stopped_by=stopped_by,
        transport="stream",
        subscribed=1,
        closed_by=describe_close(closed_by),
    )


def describe_close(closed: StreamClosedError | None) -> str:
    """``WorkerReport.closed_by``: ``"1001 server stopping"``, ``"1006"``, or ``""`` (never closed)."""
    if closed is None:
        return ""
    return f"{closed.code} {closed.reason}".strip()


def _run(
    handler: Callable[[LeasedItem], object],
    item: LeasedItem,
    retry_backoff: float,
    dead_letter_on: tuple[type[BaseException], ...],
) -> tuple[str, RetryItem | None]:
    """Run the handler; the outcome and, unless it succeeded, how to put the item back."""
    try:
        handler(item)
    except dead_letter_on:
        return "dead_lettered", RetryItem(id=item.id, dead=True)
    except Exception:  # the handler's failure is the item's, not the loop's
        delay = random.uniform(0, retry_backoff * 2 ** max(0, item.attempts - 1))  # noqa: S311 - jitter
        return "retried", RetryItem(
            id=item.id, retry_at=datetime.now(timezone.utc) + timedelta(seconds=delay)
        )
    return "completed", None
