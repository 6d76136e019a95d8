"""The HTTP write path's errors become the domain's, so both paths retry on the same ones (no Spark)."""

from __future__ import annotations

import pytest

from querator.api.errors import compose_message, stable_class
from querator.client.errors import ConnectionFailedError, error_for
from querator.domain.errors import (
    InvalidRequestError,
    PayloadTooLargeError,
    QueratorError,
    QueueNotFoundError,
    RequestInProgressError,
    StoreThrottledError,
    StoreUnavailableError,
)
from querator.domain.model import NewItem
from querator.spark.producer import client_item, domain_error
from querator.spark.retry import is_retryable

pytestmark = pytest.mark.spark


def envelope(code: int, message: str) -> dict:
    return {"code": code, "code_text": "x", "message": message}


def server_envelope(code: int, error: type[BaseException], details: str) -> dict:
    """What the API layer sends for a domain error (its own stable-class rule, not a copy of it)."""
    return envelope(code, compose_message(stable_class(error), details))


@pytest.mark.parametrize(
    ("error", "expected", "retryable"),
    [
        (
            error_for(454, envelope(454, "The store is throttling requests.; retry")),
            StoreThrottledError,
            True,
        ),
        (error_for(429, {"message": "Too Many Requests"}), StoreThrottledError, True),
        (error_for(500, envelope(500, "Internal error")), StoreUnavailableError, True),
        (error_for(503, None, fallback_text="Service Unavailable"), StoreUnavailableError, True),
        (ConnectionFailedError("read timed out", sent=True), StoreUnavailableError, True),
        (
            error_for(453, server_envelope(453, RequestInProgressError, "retry later")),
            RequestInProgressError,
            True,
        ),
        (error_for(453, envelope(453, "Queue is being deleted.; orders")), QueratorError, False),
        (error_for(400, server_envelope(400, QueueNotFoundError, "orders")), QueueNotFoundError, False),
        (error_for(400, envelope(400, "Invalid request; bad item")), InvalidRequestError, False),
        (error_for(413, envelope(413, "Request is over the size limit")), PayloadTooLargeError, False),
        (error_for(403, {"message": "Forbidden"}), QueratorError, False),
        (error_for(501, envelope(501, "no such method")), QueratorError, False),
    ],
)
def test_client_errors_map_to_domain_errors_with_the_same_retry_decision(error, expected, retryable):
    mapped = domain_error(error)
    assert type(mapped) is expected
    assert is_retryable(mapped) is retryable


def test_the_http_path_sends_a_priority_other_than_five_and_leaves_five_to_the_default():
    urgent = client_item(NewItem(payload=b"x", kind="k", priority=1)).to_wire()
    normal = client_item(NewItem(payload=b"x", kind="k")).to_wire()
    assert urgent == {"bytes": "eA==", "kind": "k", "priority": 1}
    # Priority 5 is sent as before priorities existed: a server that predates them accepts it.
    assert normal == {"bytes": "eA==", "kind": "k"}


def test_the_http_path_sends_the_items_group_and_leaves_out_an_empty_one():
    grouped = client_item(NewItem(payload=b"x", kind="k", group="acme")).to_wire()
    plain = client_item(NewItem(payload=b"x", kind="k")).to_wire()
    assert grouped == {"bytes": "eA==", "kind": "k", "group": "acme"}
    # No group: the body a server from before groups accepts.
    assert plain == {"bytes": "eA==", "kind": "k"}
