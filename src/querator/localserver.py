"""Local development: the whole service on 127.0.0.1, running the real Lambda handlers.

Each HTTP request becomes an API Gateway REST (v1) proxy event and goes to the ``lambda_handler`` of
the function that serves its route in AWS (``routes.Route.function``), so the local server runs the
same code path as the deployed stack. A background thread invokes the reaper handler with a
scheduled event every ``reaper_interval`` seconds. The store is a store URL
(``querator.config.parse_store``) handed to the handlers' composition root through
``QUERATOR_STORE``: ``sqlite:PATH`` or ``memory``; for ``dynamodb``, ``AWS_ENDPOINT_URL_DYNAMODB``
when set, otherwise an embedded single-threaded moto server (``querator.localstore``) started here.
"""

from __future__ import annotations

import base64
import contextlib
import importlib
import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, ClassVar, Final
from urllib.parse import parse_qsl

from querator import bootstrap
from querator.api import routes
from querator.api.errors import WireError, body_too_large, error_response, unknown_path
from querator.config import EnvVar, StoreKind, load_settings, parse_store
from querator.console import assets as console_assets
from querator.domain.errors import InvalidRequestError, QueratorError
from querator.localstore import LOOPBACK
from querator.storage.dynamodb import schema
from querator.stream import local as stream

if TYPE_CHECKING:
    from collections.abc import Callable

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

DEFAULT_PORT = 2319
#: What a request may send before the server stops reading: the largest body limit of any route.
#: API Gateway refuses larger bodies itself; here the local server does, with the contract's 413.
_READ_LIMIT = max(route.body_limit for route in routes.ROUTES)
#: How much of an oversized body the server reads (and drops) before it answers 413.
_DRAIN_LIMIT = 4 * _READ_LIMIT
#: The Lambda timeout the local server pretends each invocation has (API Gateway's is 29 s).
_INVOCATION_SECONDS = 29.0
#: Calls after which a queue may hold ready items it did not hold before: they wake its streams.
_WAKES_STREAMS: Final = frozenset({"/v1/queue.produce", "/v1/queue.retry", "/v1/storage/items.import"})
_REAPER_SECONDS = 60.0
#: How long the handlers wait for the embedded store's reply: as long as an invocation may run.
_EMBEDDED_STORE_READ_TIMEOUT = _INVOCATION_SECONDS
#: How long a request body may go without a byte arriving before the server answers 408 (API
#: Gateway's own limit is not documented; a client that stops sending must not hold a thread).
BODY_READ_TIMEOUT = 10.0
#: How long ``stop`` lets requests under way finish (waiting leases answer at once) before it
#: closes the store anyway.
STOP_GRACE = 5.0
#: The status of a request whose body did not arrive in time.
_REQUEST_TIMEOUT = 408

log = logging.getLogger(__name__)
#: One short line per request (``querator serve`` gives it a plain format and ``--quiet`` silences it).
#: Not the Powertools logger: its lines carry the Lambda context of whichever request set it last.
REQUEST_LOGGER: Final = "querator.localserver.requests"
request_log = logging.getLogger(REQUEST_LOGGER)


@dataclass
class LocalContext:
    """The parts of the Lambda context that the handlers and Powertools read."""

    function_name: str
    timeout_seconds: float
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    memory_limit_in_mb: int = 1024
    function_version: str = "$LATEST"
    log_group_name: str = "local"
    log_stream_name: str = "local"
    started: float = field(default_factory=time.monotonic)

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:local:000000000000:function:querator-{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.timeout_seconds - (time.monotonic() - self.started)) * 1000))


def load_handler(function: str) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """The ``lambda_handler`` of ``functions/<function>/handler.py``."""
    module = importlib.import_module(f"functions.{function}.handler")
    handler: Callable[[dict[str, Any], Any], dict[str, Any]] = module.lambda_handler
    return handler


def proxy_event(
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes,
    source_ip: str,
    query: str = "",
) -> dict[str, Any]:
    """An API Gateway REST proxy event, as API Gateway builds it for a Lambda proxy integration."""
    pairs = parse_qsl(query, keep_blank_values=True)
    try:
        text, encoded = body.decode("utf-8"), False
    except UnicodeDecodeError:
        # API Gateway base64-encodes a body it cannot pass as text; the handler decodes it again.
        text, encoded = base64.b64encode(body).decode("ascii"), True
    request_id = str(uuid.uuid4())
    return {
        "resource": path,
        "path": path,
        "httpMethod": method,
        "headers": headers,
        "multiValueHeaders": {name: [value] for name, value in headers.items()},
        # API Gateway sends null, not {}, when there is no query string.
        "queryStringParameters": dict(pairs) or None,
        "multiValueQueryStringParameters": _multi(pairs) or None,
        "pathParameters": None,
        "stageVariables": None,
        "body": text if body else None,
        "isBase64Encoded": encoded,
        "requestContext": {
            "resourcePath": path,
            "httpMethod": method,
            "path": f"/local{path}",
            "stage": "local",
            "requestId": request_id,
            "extendedRequestId": request_id,
            "requestTimeEpoch": int(time.time() * 1000),
            "identity": {"sourceIp": source_ip, "userAgent": headers.get("User-Agent", "")},
            "accountId": "000000000000",
            "apiId": "local",
            "protocol": "HTTP/1.1",
        },
    }


def _multi(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for name, value in pairs:
        values.setdefault(name, []).append(value)
    return values


def scheduled_event() -> dict[str, Any]:
    """An EventBridge scheduled event, as the reaper receives it in AWS."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "000000000000",
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": os.environ.get(EnvVar.REGION, "us-east-1"),
        "resources": ["arn:aws:events:local:000000000000:rule/querator-reaper"],
        "detail": {},
    }


class _RequestHandler(BaseHTTPRequestHandler):
    """Turns one HTTP request into a handler invocation and writes its proxy response back."""

    protocol_version = "HTTP/1.1"
    # Without this, a keep-alive client waits for delayed ACKs: ~40 ms per request (measured).
    disable_nagle_algorithm = True
    server_version = "querator-local"
    handlers: ClassVar[dict[str, Callable[[dict[str, Any], Any], dict[str, Any]]]] = {}
    #: Stream connections subscribed to a queue, woken when a call puts ready items into it.
    wakeups: ClassVar[stream.Wakeups] = stream.Wakeups()
    #: The server's ``stopping`` (set by ``LocalServer.stop``): open streams close (1001) instead of
    #: holding their threads.
    stopping: ClassVar[threading.Event] = threading.Event()

    def __getattr__(self, name: str) -> Any:
        # http.server looks up do_<METHOD> and answers a missing one with its own 501 HTML page; route
        # every method (GET and POST included) here instead, so another method on an API path gets the
        # contract's 400 envelope.
        # HEAD stays with http.server: its reply must not carry a body.
        if name.startswith("do_") and name != "do_HEAD":
            return self._serve
        raise AttributeError(name)

    server: _HTTPServer

    def parse_request(self) -> bool:
        # The request line has arrived: from here until its reply this connection is under way, and
        # ``stop`` waits for it rather than close it.
        self.server.mark_busy(self.connection, busy=True)
        ok = super().parse_request()
        if self.server.stopping.is_set():
            # The reply says "Connection: close", so the client does not send another request here.
            self.close_connection = True
        return ok

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        finally:
            self.server.mark_busy(self.connection, busy=False)

    def _serve(self) -> None:
        started = time.perf_counter()
        self._status: int = 0
        path = self.path.partition("?")[0]
        try:
            logged = self._serve_request()
        except Exception:
            # A fault of the local server itself (the handlers answer every error of theirs): logged
            # like a handler's 5xx, under the id the reply quotes, instead of a dropped connection.
            request_id = str(uuid.uuid4())
            log.exception(
                "%s %s failed in the local server; request id %s",
                self.command,
                path,
                request_id,
                extra={"status": HTTPStatus.INTERNAL_SERVER_ERROR, "request_id": request_id},
            )
            self.close_connection = True
            if self._status:  # the reply had begun: the connection cannot carry another
                return
            reply = error_response(RuntimeError(), request_id=request_id)
            self._reply(reply.status, {"Content-Type": "application/json"}, json.dumps(reply.body).encode())
            logged = False
        if not logged:
            request_log.info(
                "%s %s %s %.1fms", self.command, path, self._status, (time.perf_counter() - started) * 1000
            )

    def _serve_request(self) -> bool:
        """Read the body, call the route's handler, write its reply; True when a line was logged."""
        path, _, query = self.path.partition("?")
        body = self._read_body()
        if body is None:
            return False  # refused (bad framing, too large, too slow); the reply is written
        if console_assets.is_console_path(path):
            self._serve_console(path)
            return True
        if path == stream.PATH:
            self._serve_stream()
            return True
        route = routes.by_path(path)
        if route is None:
            # API Gateway has no resource for it either; the contract says 501.
            self._reply(*_envelope(unknown_path(self.command, path)))
            return False
        headers = dict(self.headers.items())
        event = proxy_event(self.command, path, headers, body, self.client_address[0], query)
        context = LocalContext(function_name=route.function, timeout_seconds=_INVOCATION_SECONDS)
        result = self.handlers[route.function](event, context)
        payload = result.get("body") or ""
        raw = base64.b64decode(payload) if result.get("isBase64Encoded") else payload.encode("utf-8")
        status = int(result["statusCode"])
        lease = route is routes.LEASE and status == HTTPStatus.OK
        if lease and self._client_gone():
            # Nobody to read it: the items go back now rather than stay leased to nobody until their
            # lease times out.
            self._status = status
            self.close_connection = True
            self._give_back(raw, "the client closed the connection before the reply")
            return False
        written = False
        try:
            written = self._reply(status, response_headers(result), raw)
        finally:
            # Also when writing failed some other way than the client going (the error goes on to
            # the 500 path): nothing the reply held stays leased to nobody.
            if lease and not written:
                self._give_back(raw, "the reply could not be written")
        if self._status == HTTPStatus.OK and route.path in _WAKES_STREAMS:
            self.wakeups.notify(_queue_name(body))
        return False

    def _read_body(self) -> bytes | None:
        """The request's body, or None after answering a body the server will not read.

        Only ``Content-Length`` framing, as a digit string: a negative, non-numeric or repeated length,
        or a ``Transfer-Encoding`` (which the local server does not decode, and which together with
        a length is how requests get smuggled), is a 400 and the connection closes, since where the
        next request would start is unknown. A body that stops arriving for ``body_timeout`` seconds
        is a 408.
        """
        lengths = {value.strip() for value in self.headers.get_all("Content-Length") or []}
        text = next(iter(lengths), "0")
        problem = None
        if self.headers.get("Transfer-Encoding") is not None:
            problem = "Transfer-Encoding is not supported; send the body with a Content-Length"
        elif len(lengths) > 1:
            problem = "the request has more than one Content-Length"
        elif not (text.isascii() and text.isdigit()):
            problem = f"Content-Length must be a number of bytes, not {text[:40]!r}"
        if problem is not None:
            self.close_connection = True
            self._reply(*_envelope(InvalidRequestError(problem)))
            return None
        length = int(text)
        if length > _READ_LIMIT:
            # Read and discard a moderately oversized body so the client sees the 413 rather than a
            # broken pipe; past the drain limit just answer and drop the connection.
            self.close_connection = True
            self._read(min(length, _DRAIN_LIMIT), keep=False)
            self._reply(*_envelope(body_too_large(length, _READ_LIMIT)))
            return None
        body = self._read(length, keep=True)
        if body is None or len(body) < length:
            self.close_connection = True
            if body is None:
                error: BaseException = WireError(
                    _REQUEST_TIMEOUT,
                    "Request timeout",
                    f"the body stopped arriving for {self.server.body_timeout:g} s",
                )
            else:
                error = InvalidRequestError(f"the body ended after {len(body)} of {length} bytes")
            self._reply(*_envelope(error))
            return None
        return body

    def _client_gone(self) -> bool:
        """True when the client has closed its end: a reply now would be written to nobody."""
        # A peek that does not wait, not select(): select() fails on file numbers from 1024, which a
        # server with many open connections hands out. End of stream reads b""; bytes would be a
        # next request; nothing yet is BlockingIOError.
        try:
            peeked: bytes = self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            return True
        return peeked == b""

    def _give_back(self, raw: bytes, why: str) -> None:
        """Put the items of a lease reply nobody received back at once, their attempt not spent."""
        reply = json.loads(raw)
        ids = [str(item["id"]) for item in reply.get("items", [])]
        try:
            given = bootstrap.get_service().give_back(reply["queue_name"], int(reply["partition"]), ids)
        except QueratorError:
            log.exception(
                "%s: %d leased item(s) of '%s' could not be given back; they return when their lease"
                " times out",
                why,
                len(ids),
                reply["queue_name"],
            )
            return
        request_log.warning(
            "%s %s 200 not delivered (%s): %d of %d leased item(s) given back",
            self.command,
            self.path,
            why,
            given,
            len(ids),
        )

    def _serve_stream(self) -> None:
        # A WebSocket upgrade: from here on the connection speaks the stream protocol (stream.local).
        problem = stream.handshake_error(dict(self.headers.items())) if self.command == "GET" else "use GET"
        if problem is not None:
            self._reply(*_envelope(InvalidRequestError(problem)))
            return
        self._status = HTTPStatus.SWITCHING_PROTOCOLS
        self.send_response(HTTPStatus.SWITCHING_PROTOCOLS)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", stream.accept_token(self.headers["Sec-WebSocket-Key"]))
        self.end_headers()
        self.wfile.flush()
        request_log.info("GET %s 101 (stream opened)", stream.PATH)
        self.close_connection = True
        # run() logs the end once, with why ("stream closed: ...").
        stream.StreamConnection(
            self.connection, api=self._call_api, wakeups=self.wakeups, stopping=self.stopping
        ).run()

    def _call_api(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """One API call on behalf of a stream connection, through the same handler as over HTTP."""
        route = routes.by_path(path)
        if route is None:  # the session only calls routes that exist
            raise LookupError(path)
        raw = json.dumps(body).encode()
        event = proxy_event("POST", path, {"Content-Type": "application/json"}, raw, self.client_address[0])
        context = LocalContext(function_name=route.function, timeout_seconds=_INVOCATION_SECONDS)
        result = self.handlers[route.function](event, context)
        payload = result.get("body") or ""
        text = base64.b64decode(payload).decode() if result.get("isBase64Encoded") else payload
        status = int(result["statusCode"])
        if status == HTTPStatus.OK and path in _WAKES_STREAMS:
            self.wakeups.notify(str(body.get("queue_name", "")))
        return status, json.loads(text) if text else {}

    def _serve_console(self, path: str) -> None:
        # The console is static files; it reaches the queues through the same /v1 routes as any client.
        asset = (
            console_assets.config(read_only=False, target=f"querator serve {self.headers.get('Host', '')}")
            if path == console_assets.PREFIX + "/config.json"
            else console_assets.find(path)
        )
        if self.command != "GET" or asset is None:
            status = 404 if asset is None else 405
            self._reply(
                status,
                {"Content-Type": "text/plain; charset=utf-8"},
                b"not found" if status == 404 else b"GET only",
            )
        else:
            self._reply(200, asset.headers(), asset.body)
        request_log.info("%s %s %s", self.command, path, self._status)

    def _read(self, length: int, *, keep: bool) -> bytes | None:
        """Read ``length`` bytes of body (kept, or dropped a chunk at a time); fewer when the client
        closed early, None when nothing arrived for ``body_timeout`` seconds."""
        if not length:
            return b""
        chunks: list[bytes] = []
        # A timeout per read of the socket: a body may take long, as long as it keeps coming.
        self.connection.settimeout(self.server.body_timeout)
        try:
            while length > 0:
                chunk = self.rfile.read(length if keep else min(length, 1 << 16))
                if not chunk:
                    break
                length -= len(chunk)
                if keep:
                    chunks.append(chunk)
        except TimeoutError:
            return None
        finally:
            self.connection.settimeout(None)
        return b"".join(chunks)

    def _reply(self, status: int, headers: dict[str, str], body: bytes) -> bool:
        """Write the reply; False when the client closed the connection before it."""
        self._status = status
        if self.server.stopping.is_set():
            self.close_connection = True
        self.send_response(status)
        for name, value in headers.items():
            if name.lower() not in {"content-length", "connection"}:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            # Tell a keep-alive client not to reuse this connection for its next request.
            self.send_header("Connection", "close")
        try:
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (its read timeout) before the reply: one line, not a traceback.
            self.close_connection = True
            request_log.warning(
                "%s %s %s: the client closed the connection before the reply", self.command, self.path, status
            )
            return False
        return True

    def log_message(self, format: str, *args: Any) -> None:
        """Requests are logged once, with their timing, by ``_serve``."""


class _HTTPServer(ThreadingHTTPServer):
    """The threading server, knowing its open connections, so that stopping waits for those under
    way and closes the idle ones instead of dropping both."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], *, body_timeout: float) -> None:
        super().__init__(address, _RequestHandler)
        self.body_timeout = body_timeout
        #: Set when the server stops: replies say "Connection: close", streams close.
        self.stopping = threading.Event()
        self._changed = threading.Condition()
        #: Each open connection and whether a request on it is under way (read, not yet answered).
        self._connections: dict[socket.socket, bool] = {}

    def process_request(self, request: Any, client_address: Any) -> None:
        # Known from the moment it is accepted, before its thread runs: ``stop`` must not miss it.
        with self._changed:
            self._connections[request] = False
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._changed:
            self._connections.pop(request, None)
            self._changed.notify_all()
        super().shutdown_request(request)

    def mark_busy(self, connection: socket.socket, *, busy: bool) -> None:
        with self._changed:
            if connection in self._connections:
                self._connections[connection] = busy
            self._changed.notify_all()

    def accept_waiting(self) -> None:
        """Serve the connections the kernel accepted but ``serve_forever`` had not taken yet: their
        clients may have sent a request already, which must get an answer, not a reset."""
        self.socket.setblocking(False)
        while True:
            try:
                request, address = self.socket.accept()
            except OSError:  # BlockingIOError: none left
                return
            request.setblocking(True)
            self.process_request(request, address)

    def finish_requests(self, grace: float) -> int:
        """Close the idle connections and wait up to ``grace`` seconds for those under way to reply
        (each reply closes its connection); the number still under way when it gave up."""
        deadline = time.monotonic() + grace
        with self._changed:
            while True:
                for connection, busy in self._connections.items():
                    if not busy and not _pending(connection):
                        # Idle between requests (or not yet sent one): its thread is reading a
                        # request line, which now ends (EOF), and the thread with it. One with bytes
                        # waiting is a request about to be read: it is answered like the others.
                        _shut(connection)
                remaining = deadline - time.monotonic()
                if not self._connections or remaining <= 0:
                    return len(self._connections)
                self._changed.wait(min(remaining, 0.05))

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that drops a keep-alive connection (or gives up waiting) is normal: no traceback.
        if isinstance(sys.exc_info()[1], BrokenPipeError | ConnectionResetError):
            return
        super().handle_error(request, client_address)


def _pending(connection: socket.socket) -> bool:
    """True when bytes from the client wait to be read (not when it closed its end)."""
    try:
        return bool(connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:  # BlockingIOError: nothing yet; others: the connection is gone
        return False


def _shut(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by its thread
        connection.shutdown(socket.SHUT_RDWR)


def _queue_name(body: bytes) -> str:
    """The ``queue_name`` of a request body that the handler accepted (so it is JSON)."""
    try:
        value = json.loads(body).get("queue_name", "")
    except (ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


def response_headers(result: dict[str, Any]) -> dict[str, str]:
    """The headers of a proxy response: ``headers`` and ``multiValueHeaders`` (last value wins)."""
    headers = {name: values[-1] for name, values in (result.get("multiValueHeaders") or {}).items() if values}
    headers.update(result.get("headers") or {})
    return headers


def _envelope(error: BaseException) -> tuple[int, dict[str, str], bytes]:
    reply = error_response(error)
    return reply.status, {"Content-Type": "application/json"}, json.dumps(reply.body).encode()


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
    ) -> None:
        self._host, self._port, self._reaper_interval = host, port, reaper_interval
        self._body_timeout = body_timeout
        #: The store URL the handlers use.
        self.store_url = store
        self._store: Any = None
        self._httpd: _HTTPServer | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def embedded_dynamodb(self) -> bool:
        """True when this server started the in-memory DynamoDB-compatible store itself."""
        return self._store is not None

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the server is not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

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
        self._httpd = _HTTPServer((self._host, self._port), body_timeout=self._body_timeout)
        try:
            self._configure_store()
            _RequestHandler.stopping = self._httpd.stopping
            _RequestHandler.handlers = {
                function: load_handler(function) for function in {route.function for route in routes.ROUTES}
            }
            reaper = load_handler("reaper")
        except BaseException:
            self._httpd.server_close()
            self._httpd = None
            raise
        self._threads = [
            threading.Thread(target=self._httpd.serve_forever, name="http", daemon=True),
            threading.Thread(target=self._reap_forever, args=(reaper,), name="reaper", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
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

    def _reap_forever(self, reaper: Callable[[dict[str, Any], Any], dict[str, Any]]) -> None:
        while not self._stop.wait(self._reaper_interval):
            context = LocalContext(function_name="reaper", timeout_seconds=_REAPER_SECONDS)
            try:
                reaper(scheduled_event(), context)
            except Exception:
                # The reaper runs again next interval; one failed run must not end the thread.
                log.exception("reaper run failed")

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Stop without dropping a request: stop accepting, answer the waiting leases now (with what
        they find, or nothing to lease), let requests under way reply for up to ``grace`` seconds
        (a lease reply nobody can receive gives its items back), then close the store."""
        if self._stop.is_set():
            return  # stopped already
        self._stop.set()
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.stopping.set()
            # A lease that starts or waits from now on answers at once.
            bootstrap.get_service().stop_waiting()
            httpd.shutdown()  # no more accepting: serve_forever returns
            httpd.accept_waiting()
            httpd.server_close()
            left = httpd.finish_requests(grace)
            if left:
                log.warning("stopped with %d request(s) still under way after %g s", left, grace)
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
