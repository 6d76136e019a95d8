"""``querator console``: the console on 127.0.0.1, its API calls forwarded to a deployed stack, signed.

Every route of a deployed stack needs SigV4 (IAM auth), which a browser cannot do; this proxy signs
each call with the user's AWS credentials, like ``kubectl proxy``. It holds the user's authority, so:

- it binds loopback only unless told otherwise (``allow_remote``);
- it forwards only what the console sends: ``POST /v1/...`` with a JSON body, from its own origin
  (the ``Host`` it is bound to, and ``Origin`` when the browser sends one). A page on another site
  cannot make the browser send that without a CORS preflight, which the proxy never grants, so no
  other site can spend the user's credentials through it;
- in read-only mode it forwards only the read routes and answers 403 to everything else.

The pages call the plain routes; the proxy sends each call on one queue to its scoped path
(``/v1/queues/<queue>/...``, as ``querator.client`` does), so a user whose role is granted some queues
only can use the console on them. ``queues.list`` spans queues and needs the whole-API grant: given
``queues`` (``querator console --queue NAME``), the proxy answers it itself from those queues'
``queues.info``; without, a 403 to it says so.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, ClassVar, Final
from urllib.parse import urlsplit

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest

from querator.api.paths import split_scoped
from querator.client.client import PATHS, path_for
from querator.console import assets

if TYPE_CHECKING:
    from collections.abc import Sequence

    import boto3
    from botocore.credentials import Credentials

LOOPBACK: Final = "127.0.0.1"
DEFAULT_PORT: Final = 2320
#: What API Gateway's IAM authorizer calls the service in a signature.
SIGNING_SERVICE: Final = "execute-api"
#: The routes that change nothing: the only ones a read-only console forwards.
READ_ONLY_PATHS: Final = frozenset(
    {
        "/v1/queues.list",
        "/v1/queues.info",
        "/v1/queue.stats",
        "/v1/storage/items.list",
        "/v1/storage/scheduled.list",
    }
)
#: GETs the console makes besides its own files.
FORWARDED_GETS: Final = frozenset({"/health", "/openapi.json"})
#: API Gateway answers within 29 s; a little more so its own timeout reply comes through.
_UPSTREAM_TIMEOUT: Final = 35.0
_MAX_BODY: Final = 5_000_000
_REGION_IN_HOST: Final = re.compile(r"\.execute-api\.([a-z0-9-]+)\.amazonaws\.com$")

log = logging.getLogger("querator.console")


class ProxyConfigError(ValueError):
    """The proxy cannot start as asked (bad URL, no region, no credentials, a non-loopback bind)."""


def region_from_url(url: str) -> str | None:
    """``https://abc.execute-api.eu-west-1.amazonaws.com/prod`` → ``eu-west-1``."""
    match = _REGION_IN_HOST.search(urlsplit(url).hostname or "")
    return match.group(1) if match else None


def describe_identity(session: boto3.Session) -> str:
    """Who the proxy signs as: the caller ARN from STS, else the (masked) access key and its source."""
    credentials = session.get_credentials()
    if credentials is None:
        raise ProxyConfigError("no AWS credentials found (environment, profile, SSO or instance role)")
    try:
        arn: str = session.client("sts").get_caller_identity()["Arn"]
    except Exception as error:
        key = credentials.access_key or ""
        return f"access key {key[:4]}…{key[-4:]} from {credentials.method} (STS did not answer: {error})"
    return arn


@dataclass(frozen=True, slots=True, kw_only=True)
class Upstream:
    """Where calls go and how they are signed."""

    url: str
    region: str
    credentials: Credentials

    def send(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        """Sign and send one request; returns status, content type and body (errors included)."""
        request = AWSRequest(
            method=method,
            url=self.url.rstrip("/") + path,
            data=body if method == "POST" else None,
            headers={"Content-Type": "application/json"} if method == "POST" else {},
        )
        # Frozen per request: refreshable credentials (SSO, roles) may rotate between calls.
        SigV4Auth(self.credentials.get_frozen_credentials(), SIGNING_SERVICE, self.region).add_auth(request)
        prepared = request.prepare()
        outgoing = urllib.request.Request(  # noqa: S310 - the URL's scheme is checked at start-up
            prepared.url,
            data=body if method == "POST" else None,
            headers=dict(prepared.headers.items()),
            method=method,
        )
        try:
            with _OPENER.open(outgoing, timeout=_UPSTREAM_TIMEOUT) as reply:
                return reply.status, reply.headers.get("Content-Type", "application/json"), reply.read()
        except urllib.error.HTTPError as error:
            return error.code, error.headers.get("Content-Type", "application/json"), error.read()


# No proxies from the environment: the signed request goes where the user said, nowhere else.
_OPENER: Final = urllib.request.build_opener(urllib.request.ProxyHandler({}))


_LIST_PATH: Final = PATHS["queues.list"]


def _plain(path: str) -> str:
    """The plain path of a call the page may have sent on a scoped path."""
    split = split_scoped(path)
    return f"/v1/{split[1]}" if split else path


def _upstream_path(path: str, body: bytes) -> str:
    """Where a call goes: a plain single-queue call to its scoped path (the body's queue), so a
    per-queue grant allows it; anything else as the page sent it."""
    name = path.removeprefix("/v1/")
    if PATHS.get(name) != path:
        return path
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        return path  # the stack answers what is wrong with it
    return path_for(name, parsed) if isinstance(parsed, dict) else path


def _envelope(status: int, text: str, message: str) -> bytes:
    return json.dumps({"code": status, "code_text": text, "message": message}).encode()


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "querator-console"
    upstream: ClassVar[Upstream]
    read_only: ClassVar[bool]
    queues: ClassVar[tuple[str, ...]]
    allowed_hosts: ClassVar[frozenset[str]]

    def do_GET(self) -> None:
        path = self.path.partition("?")[0]
        if not self._same_origin():
            return
        asset = (
            assets.config(read_only=self.read_only, target=self.upstream.url)
            if path == assets.PREFIX + "/config.json"
            else assets.find(path)
        )
        if asset is not None:
            self._reply(200, asset.headers(), asset.body)
        elif path in ("", "/"):
            self._reply(302, {"Location": assets.PREFIX + "/"}, b"")
        elif path in FORWARDED_GETS:
            self._forward("GET", path, b"")
        else:
            self._reply(
                404, {"Content-Type": "application/json"}, _envelope(404, "Not Found", "Not found; " + path)
            )

    def do_POST(self) -> None:
        path = self.path.partition("?")[0]
        length = int(self.headers.get("Content-Length") or 0)
        if length > _MAX_BODY:
            self.close_connection = True
            self._reply(
                413,
                {"Content-Type": "application/json"},
                _envelope(413, "Request Entity Too Large", "Request is over the size limit"),
            )
            return
        body = self.rfile.read(length) if length else b""
        if not self._same_origin():
            return
        if not path.startswith("/v1/"):
            self._reply(
                404, {"Content-Type": "application/json"}, _envelope(404, "Not Found", "Not found; " + path)
            )
        elif (self.headers.get("Content-Type") or "").split(";")[0].strip().lower() != "application/json":
            # A cross-site form or `no-cors` fetch cannot send this type without a preflight.
            self._reply(
                415,
                {"Content-Type": "application/json"},
                _envelope(
                    415,
                    "Unsupported Media Type",
                    "Content-Type must be application/json; the proxy forwards only the console's own calls",
                ),
            )
        elif self.read_only and _plain(path) not in READ_ONLY_PATHS:
            self._reply(
                403,
                {"Content-Type": "application/json"},
                _envelope(
                    403, "Forbidden", f"Read-only console; {path} changes the queue and is not forwarded"
                ),
            )
        elif path == _LIST_PATH and self.queues:
            self._list_configured(body)
        else:
            self._forward("POST", _upstream_path(path, body), body)

    def _list_configured(self, body: bytes) -> None:
        """``queues.list`` from the configured queues (their ``queues.info``), for a user whose role
        may not list: the same reply shape, name order, ``pivot`` and ``limit`` applied."""
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            request = {}
        pivot = str(request.get("pivot") or "") if isinstance(request, dict) else ""
        limit = request.get("limit") if isinstance(request, dict) else None
        items: list[Any] = []
        for name in sorted(q for q in self.queues if q >= pivot):
            if isinstance(limit, int) and len(items) >= limit:
                break
            info = {"queue_name": name}
            try:
                status, content_type, reply = self.upstream.send(
                    "POST", path_for("queues.info", info), json.dumps(info).encode()
                )
            except OSError as error:
                status, content_type = 502, "application/json"
                reply = _envelope(502, "Bad Gateway", f"The stack did not answer; {error}")
            if status != 200:
                self._reply(status, {"Content-Type": content_type}, reply)
                log.info("POST %s %s (queues.info of %s)", _LIST_PATH, status, name)
                return
            items.append(json.loads(reply))
        self._reply(200, {"Content-Type": "application/json"}, json.dumps({"items": items}).encode())
        log.info("POST %s 200 (from %d configured queue(s))", _LIST_PATH, len(self.queues))

    def _same_origin(self) -> bool:
        # The Host check stops DNS rebinding (a hostile name resolving to 127.0.0.1); the Origin check
        # stops another site's page from using the user's credentials through the browser.
        host = self.headers.get("Host", "")
        origin = self.headers.get("Origin")
        if host not in self.allowed_hosts or (
            origin is not None and urlsplit(origin).netloc not in self.allowed_hosts
        ):
            self._reply(
                403,
                {"Content-Type": "application/json"},
                _envelope(
                    403, "Forbidden", "Cross-origin request refused; open the console from its own address"
                ),
            )
            return False
        return True

    def _forward(self, method: str, path: str, body: bytes) -> None:
        try:
            status, content_type, reply = self.upstream.send(method, path, body)
        except OSError as error:
            log.warning("%s %s: the stack did not answer: %s", method, path, error)
            status, content_type = 502, "application/json"
            reply = _envelope(502, "Bad Gateway", f"The stack did not answer; {error}")
        if status == 403 and path == _LIST_PATH:
            # What a role granted only some queues gets here: say what would work.
            content_type = "application/json"
            reply = _envelope(
                403,
                "Forbidden",
                "Listing queues needs the whole-API grant (POST /v1/queues.list); with a role granted "
                "some queues, start the console with --queue NAME for each of them",
            )
        self._reply(status, {"Content-Type": content_type}, reply)
        log.info("%s %s %s", method, path, status)

    def _reply(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        try:
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        """Forwarded calls are logged once by ``_forward``."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class ConsoleProxy:
    """The console on ``host:port`` with API calls forwarded to ``url``, signed for ``region``."""

    def __init__(
        self,
        *,
        url: str,
        region: str,
        credentials: Credentials,
        read_only: bool = False,
        host: str = LOOPBACK,
        port: int = DEFAULT_PORT,
        allow_remote: bool = False,
        queues: Sequence[str] = (),
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise ProxyConfigError(f"--url must be the stack's https:// API address, not {url!r}")
        if host not in (LOOPBACK, "localhost", "::1") and not allow_remote:
            raise ProxyConfigError(
                f"refusing to bind {host}: the console signs with your AWS credentials, so anyone who can"
                " reach it acts as you; bind 127.0.0.1, or pass --allow-remote if you mean it"
            )
        self.upstream = Upstream(url=url, region=region, credentials=credentials)
        self.read_only = read_only
        #: The queues ``queues.list`` answers with, for a role that may not list (empty: forward it).
        self.queues = tuple(queues)
        self._host = host
        self._port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the console proxy is not started")
        return f"http://{self._host}:{self._server.server_address[1]}"

    def start(self) -> ConsoleProxy:
        server = _Server((self._host, self._port), _ProxyHandler)
        port = server.server_address[1]
        handler = type(
            "BoundProxyHandler",
            (_ProxyHandler,),
            {
                "upstream": self.upstream,
                "read_only": self.read_only,
                "queues": self.queues,
                "allowed_hosts": frozenset(
                    {f"{self._host}:{port}", f"localhost:{port}", f"127.0.0.1:{port}"}
                ),
            },
        )
        server.RequestHandlerClass = handler
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="console-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> ConsoleProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
