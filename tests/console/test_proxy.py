"""The console's signing proxy against a SigV4-verifying test double of API Gateway's IAM authorizer."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from moto import mock_aws

from querator import cli
from querator.api import routes
from querator.console.proxy import (
    READ_ONLY_PATHS,
    ConsoleProxy,
    ProxyConfigError,
    describe_identity,
    region_from_url,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

REGION = "eu-west-1"
KEY = Credentials("AKIDCONSOLETEST", "console-secret", "console-token")


def signature_is_valid(method: str, host: str, path: str, headers: dict[str, str], body: bytes) -> bool:
    """What API Gateway's IAM auth checks: the signature recomputed from the request and the secret."""
    authorization = headers.get("Authorization", "")
    if not authorization.startswith("AWS4-HMAC-SHA256 "):
        return False
    fields = dict(part.strip().split("=", 1) for part in authorization[len("AWS4-HMAC-SHA256 ") :].split(","))
    access_key, _date, region, service, _ = fields["Credential"].split("/")
    if access_key != KEY.access_key or region != REGION or service != "execute-api":
        return False
    signed = fields["SignedHeaders"].split(";")
    lowered = {name.lower(): value for name, value in headers.items()}
    request = AWSRequest(
        method=method,
        url=f"http://{host}{path}",
        data=body or None,
        headers={name: lowered[name] for name in signed if name in lowered},
    )
    request.context["timestamp"] = lowered["x-amz-date"]
    auth = SigV4Auth(KEY, "execute-api", REGION)
    expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
    return expected == fields["Signature"] and lowered.get("x-amz-security-token") == KEY.token


class VerifyingStack:
    """An HTTP server that answers like a deployed stack: 403 without a valid signature, else a reply
    naming the path; it records every call it accepted."""

    def __init__(self, grant: Callable[[str], bool] | None = None) -> None:
        #: What the caller's IAM policy allows (by path); ``None``: everything (a whole-API grant).
        self.grant = grant
        self.accepted: list[tuple[str, str, bytes]] = []
        self.refused = 0
        stack = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = dict(self.headers.items())
                if stack.grant is not None and not stack.grant(self.path):
                    stack.refused += 1
                    status, reply = 403, {"message": "User is not authorized to access this resource"}
                elif signature_is_valid(self.command, headers["Host"], self.path, headers, body):
                    stack.accepted.append((self.command, self.path, body))
                    status, reply = 200, {"path": self.path, "items": []}
                else:
                    stack.refused += 1
                    status, reply = 403, {"message": "The request signature we calculated does not match"}
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stack() -> Iterator[VerifyingStack]:
    double = VerifyingStack()
    yield double
    double.close()


def call(url: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(  # noqa: S310 - 127.0.0.1 only
        url + path,
        data=data,
        method="POST" if data is not None else "GET",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:  # noqa: S310
            raw = reply.read()
            return reply.status, json.loads(
                raw
            ) if reply.headers.get_content_type() == "application/json" else raw
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_calls_are_signed_and_a_request_without_a_valid_signature_is_refused(stack: VerifyingStack) -> None:
    # The double really checks: unsigned, and signed with the wrong secret, are both refused.
    assert call(stack.url, "/prod/v1/queues.list", {})[0] == 403
    wrong = AWSRequest(method="POST", url=stack.url + "/prod/v1/queues.list", data=b"{}", headers={})
    SigV4Auth(Credentials(KEY.access_key, "not-the-secret", KEY.token), "execute-api", REGION).add_auth(wrong)
    assert call(stack.url, "/prod/v1/queues.list", {}, headers=dict(wrong.headers.items()))[0] == 403
    assert stack.accepted == []

    with ConsoleProxy(url=stack.url + "/prod", region=REGION, credentials=KEY, port=0) as proxy:
        status, reply = call(proxy.url, "/v1/queues.list", {"limit": 5})
        assert (status, reply["path"]) == (200, "/prod/v1/queues.list")
        assert call(proxy.url, "/openapi.json")[0] == 200
    assert stack.accepted == [
        ("POST", "/prod/v1/queues.list", b'{"limit": 5}'),
        ("GET", "/prod/openapi.json", b""),
    ]
    assert stack.refused == 2


def test_read_only_forwards_reads_and_refuses_every_write(stack: VerifyingStack) -> None:
    with ConsoleProxy(url=stack.url, region=REGION, credentials=KEY, port=0, read_only=True) as proxy:
        assert call(proxy.url, "/v1/queue.stats", {"queue_name": "a"})[0] == 200
        status, reply = call(proxy.url, "/v1/queue.produce", {"queue_name": "a", "items": [{"utf8": "x"}]})
        assert status == 403
        assert reply["message"].startswith("Read-only console;")
        assert call(proxy.url, "/v1/queue.clear", {"queue_name": "a", "queue": True})[0] == 403
        config = call(proxy.url, "/console/config.json")[1]
    assert config == {"read_only": True, "target": stack.url, "refresh_ms": 5000}
    assert [path for _, path, _ in stack.accepted] == ["/v1/queues/a/queue.stats"]


def test_a_role_granted_one_queue_uses_the_console_on_it_through_scoped_paths() -> None:
    # The stack's authorizer allows only what a policy for the queue "orders" names.
    stack = VerifyingStack(grant=lambda path: path.startswith("/v1/queues/orders/"))
    try:
        with ConsoleProxy(url=stack.url, region=REGION, credentials=KEY, port=0) as proxy:
            assert call(proxy.url, "/v1/queues.info", {"queue_name": "orders"})[0] == 200
            assert call(proxy.url, "/v1/queue.stats", {"queue_name": "orders"})[0] == 200
            body = {"queue_name": "orders", "items": [{"utf8": "x"}]}
            assert call(proxy.url, "/v1/queue.produce", body)[0] == 200
            assert call(proxy.url, "/v1/queue.stats", {"queue_name": "emails"})[0] == 403
            status, reply = call(proxy.url, "/v1/queues.list", {})
            assert status == 403 and "--queue NAME" in reply["message"], reply
        with ConsoleProxy(url=stack.url, region=REGION, credentials=KEY, port=0, queues=["orders"]) as proxy:
            # The configured queues stand in for queues.list, each read with its own queues.info.
            status, reply = call(proxy.url, "/v1/queues.list", {"limit": 10})
            assert status == 200 and [q["path"] for q in reply["items"]] == ["/v1/queues/orders/queues.info"]
            assert call(proxy.url, "/v1/queues.list", {"pivot": "p"}) == (200, {"items": []})
    finally:
        stack.close()
    assert [path for _, path, _ in stack.accepted] == [
        "/v1/queues/orders/queues.info",
        "/v1/queues/orders/queue.stats",
        "/v1/queues/orders/queue.produce",
        "/v1/queues/orders/queues.info",
    ]


def test_read_only_paths_are_exactly_the_routes_that_change_nothing() -> None:
    paths = {route.path for route in routes.ROUTES if route.method == "POST"}
    assert paths >= READ_ONLY_PATHS
    assert {
        "/v1/queue.produce",
        "/v1/queue.lease",
        "/v1/queue.clear",
        "/v1/queues.delete",
    } <= paths - READ_ONLY_PATHS
    # Every read path reads: its name ends in list / info / stats.
    assert all(path.rsplit(".", 1)[1] in {"list", "info", "stats"} for path in READ_ONLY_PATHS)


def test_other_sites_cannot_use_the_users_credentials(stack: VerifyingStack) -> None:
    with ConsoleProxy(url=stack.url, region=REGION, credentials=KEY, port=0) as proxy:
        # A form post or a no-cors fetch from another page: wrong content type, or a foreign Origin.
        assert (
            call(proxy.url, "/v1/queues.delete", {"queue_name": "a"}, headers={"Content-Type": "text/plain"})[
                0
            ]
            == 415
        )
        assert (
            call(
                proxy.url,
                "/v1/queues.delete",
                {"queue_name": "a"},
                headers={"Origin": "https://evil.example"},
            )[0]
            == 403
        )
        # DNS rebinding: a hostile name that resolves to 127.0.0.1 arrives with its own Host.
        assert call(proxy.url, "/v1/queues.list", {}, headers={"Host": "evil.example:2320"})[0] == 403
        assert call(proxy.url, "/v1/queues.list", {}, headers={"Origin": proxy.url})[0] == 200
    assert [path for _, path, _ in stack.accepted] == ["/v1/queues.list"]


def test_the_console_files_are_served_with_a_strict_content_security_policy(stack: VerifyingStack) -> None:
    with (
        ConsoleProxy(url=stack.url, region=REGION, credentials=KEY, port=0) as proxy,
        urllib.request.urlopen(proxy.url + "/console/", timeout=10) as reply,  # noqa: S310
    ):
        page = reply.read().decode()
        policy = reply.headers["Content-Security-Policy"]
    assert '<script src="/console/console.js"' in page
    assert "script-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy
    assert stack.accepted == []


def test_binding_beyond_loopback_needs_to_be_asked_for() -> None:
    with pytest.raises(ProxyConfigError, match=r"refusing to bind 0\.0\.0\.0"):
        ConsoleProxy(
            url="https://abc.execute-api.eu-west-1.amazonaws.com/prod",
            region=REGION,
            credentials=KEY,
            host="0.0.0.0",  # noqa: S104 - the refusal is what is tested
        )
    with pytest.raises(ProxyConfigError, match="--url"):
        ConsoleProxy(url="ftp://stack", region=REGION, credentials=KEY)


def test_the_region_comes_from_the_url_and_the_identity_from_sts() -> None:
    assert region_from_url("https://abc123.execute-api.eu-west-1.amazonaws.com/prod") == "eu-west-1"
    assert region_from_url("http://127.0.0.1:2319") is None
    with mock_aws():
        identity = describe_identity(boto3.Session(region_name=REGION))
    assert identity.startswith("arn:aws:sts::")


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (
            ["--url", "ftp://stack/prod", "--sigv4-region", REGION],
            "--url must be the stack's https:// API address",
        ),
        (
            ["--url", "https://stack/prod", "--sigv4-region", REGION, "--host", "0.0.0.0"],  # noqa: S104
            "refusing to bind 0.0.0.0",
        ),
        (["--url", "http://127.0.0.1:1/prod"], "no region to sign for"),
    ],
)
def test_the_command_refuses_what_it_cannot_do_safely_with_exit_2(
    arguments: list[str], said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    assert cli.main(["console", *arguments]) == 2
    assert said in capsys.readouterr().err
