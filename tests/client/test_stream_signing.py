"""The stream's handshake on a deployed stack: sent to the stack's StreamUrl, signed with SigV4 for
``execute-api`` (the WebSocket API authorizes ``$connect`` with IAM). A WebSocket server on
127.0.0.1 stands in for API Gateway and records the handshake it got."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from botocore.credentials import Credentials
from websockets.sync.server import serve

from querator.client import Client
from querator.client.stream import Stream
from querator.client.transport import SigV4Signer
from querator.client.worker import _Worker

if TYPE_CHECKING:
    from collections.abc import Iterator

    from websockets.sync.server import ServerConnection


class Gateway:
    """Accepts one subscription per connection and keeps each handshake's headers."""

    def __init__(self) -> None:
        self.handshakes: list[dict[str, str]] = []
        self.paths: list[str] = []
        self._server = serve(self._handle, "127.0.0.1", 0)
        self.port = self._server.socket.getsockname()[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _handle(self, connection: ServerConnection) -> None:
        assert connection.request is not None
        self.handshakes.append(dict(connection.request.headers.raw_items()))
        self.paths.append(connection.request.path)
        message: dict[str, Any] = json.loads(connection.recv(timeout=5))
        connection.send(json.dumps({"type": "subscribed", "queue_name": message["queue_name"], "credit": 1}))
        connection.recv(timeout=5)  # until the client closes

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=5)


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    server = Gateway()
    yield server
    server.stop()


def test_the_handshake_goes_to_the_stream_url_signed_for_execute_api(gateway: Gateway) -> None:
    signer = SigV4Signer("eu-west-1", Credentials("AKIDEXAMPLE", "secret", "session-token"))
    url = f"ws://127.0.0.1:{gateway.port}/prod"

    with Stream("https://api.example/prod", "jobs", credit=1, url=url, signer=signer):
        pass

    (headers,) = gateway.handshakes
    assert gateway.paths == ["/prod"]
    authorization = headers["Authorization"]
    assert authorization.startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/eu-west-1/execute-api/aws4_request" in authorization
    assert "host" in authorization.split("SignedHeaders=")[1].split(",")[0].split(";")
    assert headers["X-Amz-Security-Token"] == "session-token"
    assert "X-Amz-Date" in headers
    assert headers["Host"] == f"127.0.0.1:{gateway.port}"


def test_an_unsigned_client_sends_no_signature(gateway: Gateway) -> None:
    with Stream("http://unused", "jobs", credit=1, url=f"ws://127.0.0.1:{gateway.port}/prod"):
        pass
    (headers,) = gateway.handshakes
    assert "Authorization" not in headers


def test_the_worker_connects_to_the_clients_stream_url_with_its_signer(gateway: Gateway) -> None:
    signer = SigV4Signer("us-east-1", Credentials("AKIDEXAMPLE", "secret"))
    client = Client(
        "https://api.example/prod", signer=signer, stream_url=f"ws://127.0.0.1:{gateway.port}/prod"
    )
    worker = _Worker(
        client,
        "jobs",
        lambda item: None,
        batch_size=1,
        concurrency=2,
        request_timeout=1.0,
        backoff=lambda attempts: timedelta(seconds=1),
        dead_letter_on=(),
        renew_every=None,
        shutdown_timeout=1.0,
        stop=threading.Event(),
        max_items=None,
        idle_timeout=None,
        mode="stream",
    )
    stream = worker._open_stream()
    assert stream is not None
    stream.close()
    (headers,) = gateway.handshakes
    assert "/us-east-1/execute-api/aws4_request" in headers["Authorization"]
