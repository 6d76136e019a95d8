"""The client against a scripted fake server: which calls are retried on which failures, how errors
are typed, timeouts, connection reuse and SigV4 signing."""

from __future__ import annotations

import socket
import time

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from querator.api.routes import ROUTES
from querator.client import (
    ApiError,
    AuthError,
    BadRequestError,
    Client,
    ConnectionFailedError,
    ItemNotLeasedError,
    LeasedItem,
    PayloadTooLargeError,
    QueueExistsError,
    QueueNotFoundError,
    RequestFailedError,
    RetryError,
    ServerError,
    TooManyRequestsError,
    UnknownMethodError,
    UnsupportedContentError,
)
from querator.client.client import PATHS, REQUEST_TIMEOUT_MARGIN
from tests.client.fakeserver import Action, FakeServer, envelope

STATS_REPLY = {
    "queue_name": "q",
    "logicalQueues": [{"partitions": [{"partition": 0, "total": 3, "average_age": "1m0s"}]}],
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_client_paths_are_the_route_tables_paths() -> None:
    # The GETs that serve documents (OpenAPI, Swagger UI) are for browsers, not for this client.
    documents = ("openapi", "docs")
    served = {route.name: route.path for route in ROUTES if route.name not in documents and not route.scoped}
    assert dict(PATHS) == served


# -- retries ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [
        envelope(454, "Try again later"),
        envelope(500, "Internal error"),
        Action(status=503, raw=b"busy"),
        Action(drop=True),
    ],
    ids=["454", "500", "503-not-json", "dropped"],
)
def test_an_idempotent_call_is_retried_until_it_succeeds(
    fake: FakeServer, fake_client: Client, failure: Action
) -> None:
    fake.then(failure, failure, Action(body=STATS_REPLY))

    stats = fake_client.stats("q")

    assert stats.total == 3
    assert stats.partitions[0].average_age.total_seconds() == 60
    assert len(fake.seen) == 3


def test_retries_are_bounded_by_max_retries(fake: FakeServer, fake_client: Client) -> None:
    fake.then(*[envelope(500, "Internal error")] * 10)

    with pytest.raises(ServerError) as raised:
        fake_client.stats("q")

    assert raised.value.code == 500
    assert len(fake.seen) == fake_client.max_retries + 1


def test_no_retries_when_max_retries_is_zero(fake: FakeServer) -> None:
    fake.then(envelope(454, "Try again later"))
    with Client(fake.url, max_retries=0) as client, pytest.raises(RetryError):
        client.stats("q")
    assert len(fake.seen) == 1


def test_lease_answers_an_empty_lease_for_454_without_retrying(fake: FakeServer, fake_client: Client) -> None:
    fake.then(envelope(454, "Nothing to lease before the request timeout"))

    lease = fake_client.lease("q", 10, request_timeout="1s")

    assert lease.items == ()
    assert len(lease) == 0
    assert len(fake.seen) == 1
    sent = fake.seen[0].json()
    assert sent["batch_size"] == 10
    assert sent["request_timeout"] == "1s"
    assert sent["client_id"].startswith(fake_client.client_id)


@pytest.mark.parametrize(
    "failure", [Action(drop=True), envelope(500, "Internal error")], ids=["dropped", "500"]
)
def test_lease_is_never_resent_once_it_may_have_reached_the_server(
    fake: FakeServer, fake_client: Client, failure: Action
) -> None:
    fake.then(failure, Action(body={"queue_name": "q", "partition": 0, "items": []}))

    with pytest.raises((ConnectionFailedError, ServerError)) as raised:
        fake_client.lease("q", 1)

    assert len(fake.seen) == 1
    if isinstance(raised.value, ConnectionFailedError):
        assert raised.value.sent is True


def test_lease_is_resent_when_the_gateway_throttled_it(fake: FakeServer, fake_client: Client) -> None:
    fake.then(
        Action(status=429, body={"message": "Too Many Requests"}),
        Action(
            body={
                "queue_name": "q",
                "partition": 2,
                "items": [{"id": "a" * 30, "attempts": 1, "bytes": "aGk"}],
            }
        ),
    )

    lease = fake_client.lease("q", 1)

    assert [item.payload for item in lease.items] == [b"hi"]
    assert lease.items[0].partition == 2
    assert len(fake.seen) == 2


def test_produce_without_idempotency_key_is_not_resent_after_a_server_error(
    fake: FakeServer, fake_client: Client
) -> None:
    fake.then(envelope(500, "Internal error"), Action())

    with pytest.raises(ServerError):
        fake_client.produce("q", [b"x"])

    assert len(fake.seen) == 1
    assert "Idempotency-Key" not in fake.seen[0].headers


def test_produce_with_idempotency_key_is_resent_with_the_same_key(
    fake: FakeServer, fake_client: Client
) -> None:
    fake.then(Action(drop=True), envelope(502, "Bad gateway"), Action())

    fake_client.produce("q", [b"x", "y"], idempotency_key="batch-7")

    assert len(fake.seen) == 3
    assert {seen.headers["Idempotency-Key"] for seen in fake.seen} == {"batch-7"}
    assert fake.seen[0].body == fake.seen[2].body
    assert fake.seen[0].json()["items"] == [{"bytes": "eA=="}, {"utf8": "y"}]


@pytest.mark.parametrize("call", ["complete", "retry", "create_queue", "import_items"])
def test_unsafe_calls_are_resent_on_454_but_not_after_a_dropped_connection(
    fake: FakeServer, fake_client: Client, call: str
) -> None:
    invoke = {
        "complete": lambda: fake_client.complete("q", ["a" * 30]),
        "retry": lambda: fake_client.retry("q", ["a" * 30]),
        "create_queue": lambda: fake_client.create_queue("q", lease_timeout=5, expire_timeout="1h"),
        "import_items": lambda: fake_client.import_items("q", [{"payload": ""}]),
    }[call]
    fake.then(envelope(454, "Try again later"), Action(body={"code": 200, "items": []}))
    invoke()
    assert len(fake.seen) == 2

    fake.reset()
    fake.then(Action(drop=True), Action())
    with pytest.raises(ConnectionFailedError):
        invoke()
    assert len(fake.seen) == 1


def test_a_produce_still_in_progress_is_retried_with_its_key(fake: FakeServer, fake_client: Client) -> None:
    fake.then(envelope(453, "A request with this idempotency key is still in progress; key k"), Action())

    fake_client.produce("q", [b"x"], idempotency_key="k")

    assert len(fake.seen) == 2


def test_delete_queue_retried_after_a_lost_reply_accepts_that_the_queue_is_gone(
    fake: FakeServer, fake_client: Client
) -> None:
    fake.then(Action(drop=True), envelope(400, "Queue does not exist; queue 'q' does not exist"))

    fake_client.delete_queue("q")

    assert len(fake.seen) == 2


def test_delete_queue_of_an_unknown_queue_raises_on_the_first_attempt(
    fake: FakeServer, fake_client: Client
) -> None:
    fake.then(envelope(400, "Queue does not exist; queue 'q' does not exist"))
    with pytest.raises(QueueNotFoundError):
        fake_client.delete_queue("q")


def test_an_unreachable_server_raises_connection_failed_not_sent() -> None:
    client = Client(f"http://127.0.0.1:{_free_port()}", max_retries=2, backoff_base=0.001)
    with client, pytest.raises(ConnectionFailedError) as raised:
        client.queue_info("q")
    assert raised.value.sent is False
    assert "cannot connect" in str(raised.value)


def test_backoff_grows_is_capped_and_jittered() -> None:
    client = Client("http://127.0.0.1:1", backoff_base=0.1, backoff_cap=1.0)
    waits = [client.backoff(n) for n in range(8)]
    assert 0.05 <= waits[0] <= 0.1
    assert all(0.5 <= w <= 1.0 for w in waits[4:])
    assert len({client.backoff(3) for _ in range(20)}) > 1


# -- timeouts and connections -------------------------------------------------------------------------


def test_the_client_waits_longer_than_the_request_timeout_it_sends(
    fake: FakeServer, fake_client: Client
) -> None:
    # The server answers later than request_timeout (as a busy Lambda might); within the margin the
    # client still takes the answer instead of giving up and leaving the items leased to nobody.
    fake.then(Action(delay=0.6, body={"queue_name": "q", "partition": 0, "items": []}))

    started = time.monotonic()
    lease = fake_client.lease("q", 1, request_timeout="100ms")

    assert lease.items == ()
    assert 0.6 <= time.monotonic() - started < 0.1 + REQUEST_TIMEOUT_MARGIN


def test_a_read_timeout_is_a_connection_failure_that_may_have_been_sent(fake: FakeServer) -> None:
    fake.then(Action(delay=1.0, body=STATS_REPLY))
    with (
        Client(fake.url, timeout=0.2, max_retries=0) as client,
        pytest.raises(ConnectionFailedError) as raised,
    ):
        client.stats("q")
    assert raised.value.sent is True
    assert raised.value.timed_out is True
    assert str(raised.value) == f"no reply from {fake.url} within 0.2 s"


def test_a_read_timeout_is_not_resent_even_for_an_idempotent_call(fake: FakeServer) -> None:
    # A slow stats on a large queue would time out again: four silent 30 s waits helped nobody.
    fake.then(Action(delay=1.0, body=STATS_REPLY), Action(body=STATS_REPLY))
    with Client(fake.url, timeout=0.2, max_retries=3, backoff_base=0.001) as client:
        with pytest.raises(ConnectionFailedError):
            client.stats("q")
        assert len(fake.seen) == 1


def test_connections_are_reused_across_calls(fake: FakeServer, fake_client: Client) -> None:
    for _ in range(5):
        fake_client.health()
    assert len({seen.client_port for seen in fake.seen}) == 1
    assert fake.seen[0].method == "GET"
    assert fake.seen[0].path == "/health"


# -- errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "message", "error_type"),
    [
        (400, "Invalid request; lease_timeout: invalid duration '5x'", BadRequestError),
        (400, "Queue does not exist; queue 'q' does not exist", QueueNotFoundError),
        (400, "Queue already exists; queue 'q'", QueueExistsError),
        (403, "Forbidden", AuthError),
        (413, "Request is over the size limit; body is 9 bytes", PayloadTooLargeError),
        (453, "Queue is being deleted", RequestFailedError),
        (454, "Try again later", RetryError),
        (455, "Unsupported content; items[0].colour: unknown key", UnsupportedContentError),
        (500, "Internal error; request id 12", ServerError),
        (501, "Not implemented; no such method: POST /v1/queue.nope", UnknownMethodError),
    ],
)
def test_error_replies_become_typed_errors_with_the_envelope(
    fake: FakeServer, status: int, message: str, error_type: type[ApiError]
) -> None:
    fake.then(envelope(status, message, "Text"))
    with Client(fake.url, max_retries=0) as client, pytest.raises(error_type) as raised:
        client.queue_info("q")
    error = raised.value
    assert type(error) is error_type
    assert (error.code, error.code_text, error.message) == (status, "Text", message)
    assert error.stable_class == message.partition(";")[0]


def test_a_reply_without_the_envelope_is_still_typed_by_status(fake: FakeServer) -> None:
    fake.then(
        Action(status=429, body={"message": "Too Many Requests"}),
        Action(status=502, raw=b"<html>bad gateway"),
    )
    with Client(fake.url, max_retries=0) as client:
        with pytest.raises(TooManyRequestsError) as throttled:
            client.stats("q")
        with pytest.raises(ServerError) as failed:
            client.stats("q")
    assert throttled.value.message == "Too Many Requests"
    assert failed.value.code == 502
    assert "bad gateway" in failed.value.message


def test_a_partly_applied_complete_names_the_ids_that_failed(fake: FakeServer, fake_client: Client) -> None:
    stale, gone = "1" * 30, "2" * 30
    fake.then(
        envelope(
            400,
            "Item id is unknown, stale or not leased; 2 id(s) not applied, the others were: "
            f"'{stale}' (item is unknown, stale or not leased), 'x' ('x' is not an item id), '{gone}' (gone)",
        )
    )
    items = [
        LeasedItem(id="3" * 30, attempts=1, lease_deadline=None, payload=b"", partition=4),
        stale,
        gone,
        "x",
    ]

    with pytest.raises(ItemNotLeasedError) as raised:
        fake_client.complete("q", items)

    assert raised.value.failed_ids == (stale, "x", gone)
    assert fake.seen[0].json() == {"queue_name": "q", "partition": 4, "ids": ["3" * 30, stale, gone, "x"]}
    assert len(fake.seen) == 1


def test_items_of_two_partitions_in_one_call_are_refused_before_sending(
    fake: FakeServer, fake_client: Client
) -> None:
    items = [
        LeasedItem(id=str(p) * 30, attempts=1, lease_deadline=None, payload=b"", partition=p) for p in (0, 1)
    ]
    with pytest.raises(ValueError, match="partitions"):
        fake_client.renew("q", items)
    assert fake.seen == []


# -- signing ------------------------------------------------------------------------------------------


def test_sigv4_signs_for_execute_api_with_the_environment_credentials(fake: FakeServer) -> None:
    with Client(fake.url, sigv4_region="eu-west-1") as client:
        client.stats("q")
        client.health()
    for seen in fake.seen:
        authorization = seen.headers["Authorization"]
        assert authorization.startswith("AWS4-HMAC-SHA256 Credential=testing/")
        assert "/eu-west-1/execute-api/aws4_request" in authorization
        assert "SignedHeaders=" in authorization
        assert seen.headers["X-Amz-Date"]
        assert seen.headers["X-Amz-Security-Token"] == "testing"


def test_the_signature_covers_the_body_and_verifies(fake: FakeServer) -> None:
    credentials = Credentials("AKID", "secret")
    with Client(fake.url, sigv4_region="us-east-1", credentials=credentials) as client:
        client.stats("q")
    seen = fake.seen[0]

    # Re-sign what the server received with the same key and timestamp: the signatures must agree.
    signed = seen.headers["Authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")
    headers = {k: v for k, v in seen.headers.items() if k.lower() in signed and k != "X-Amz-Date"}
    request = AWSRequest(method=seen.method, url=fake.url + seen.path, data=seen.body, headers=headers)
    request.context["timestamp"] = seen.headers["X-Amz-Date"]
    SigV4Auth(credentials, "execute-api", "us-east-1").add_auth(request)
    assert request.headers["Authorization"] == seen.headers["Authorization"]


def test_no_signature_without_a_region(fake: FakeServer, fake_client: Client) -> None:
    fake_client.health()
    assert "Authorization" not in fake.seen[0].headers
