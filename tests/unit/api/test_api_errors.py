"""Domain error → HTTP status, and the contract's error envelope (querator.api.errors)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from querator.api import errors
from querator.api.errors import error_response, status_for
from querator.domain import errors as domain_errors
from querator.domain.errors import (
    ConflictError,
    DeadLetterQueueMissingError,
    DuplicateClientError,
    InvalidRequestError,
    ItemNotLeasedError,
    LeaseRateLimitedError,
    NothingToLeaseError,
    PayloadTooLargeError,
    QueratorError,
    QueueAlreadyExistsError,
    QueueDeletingError,
    QueueNotFoundError,
    RequestInProgressError,
    RetryLaterError,
    StoreThrottledError,
    StoreUnavailableError,
)
from querator.domain.model import IdFailure

EXPECTED_STATUS: dict[type[QueratorError], int] = {
    InvalidRequestError: 400,
    QueueNotFoundError: 400,
    QueueAlreadyExistsError: 400,
    ItemNotLeasedError: 400,
    DuplicateClientError: 400,
    PayloadTooLargeError: 413,
    ConflictError: 453,
    QueueDeletingError: 453,
    DeadLetterQueueMissingError: 453,
    RequestInProgressError: 453,
    RetryLaterError: 454,
    NothingToLeaseError: 454,
    LeaseRateLimitedError: 454,
    StoreThrottledError: 454,
    StoreUnavailableError: 500,
    QueratorError: 500,
}


@pytest.mark.parametrize(
    ("error_type", "status"), EXPECTED_STATUS.items(), ids=lambda v: getattr(v, "__name__", v)
)
def test_status_of_each_error_class(error_type: type[QueratorError], status: int) -> None:
    assert status_for(error_type) == status
    assert status_for(error_type("details")) == status
    assert error_response(error_type("details")).status == status


def test_every_domain_error_class_has_a_row_in_this_test() -> None:
    defined = {
        value
        for value in vars(domain_errors).values()
        if isinstance(value, type) and issubclass(value, QueratorError)
    }
    assert defined == set(EXPECTED_STATUS)


def test_status_is_inherited_through_the_mro() -> None:
    class QueuePausedError(ConflictError):
        """Queue is paused."""

    class SomethingOddError(QueratorError):
        """Something odd."""

    assert status_for(QueuePausedError()) == 453
    assert status_for(SomethingOddError()) == 500
    assert status_for(KeyError("x")) == 500


def test_envelope_shape_and_message() -> None:
    response = error_response(QueueNotFoundError("no queue named 'orders'"))
    assert response.status == 400
    assert response.body == {
        "code": 400,
        "code_text": "Bad Request",
        "message": "Queue does not exist; no queue named 'orders'",
    }
    stable, _, details = response.body["message"].partition(";")
    assert stable == "Queue does not exist"
    assert details.strip() == "no queue named 'orders'"


def test_message_without_details_is_the_stable_class_alone() -> None:
    assert error_response(QueueNotFoundError()).body["message"] == "Queue does not exist"
    assert error_response(NothingToLeaseError()).body == {
        "code": 454,
        "code_text": "Retry Request",
        "message": "Nothing to lease before the request timeout",
    }


@pytest.mark.parametrize(
    ("error", "code_text"),
    [
        (PayloadTooLargeError("body is 6000000 bytes"), "Request Entity Too Large"),
        (QueueDeletingError("queue 'q' is being deleted"), "Request Failed"),
        (StoreThrottledError("slow down"), "Retry Request"),
    ],
)
def test_code_text_of_nonstandard_codes(error: QueratorError, code_text: str) -> None:
    assert error_response(error).body["code_text"] == code_text


def test_internal_errors_never_leak_details() -> None:
    secret = "table arn:aws:dynamodb:us-east-1:123456789012:table/q failed"
    for error in (StoreUnavailableError(secret), QueratorError(secret), RuntimeError(secret)):
        response = error_response(error)
        assert response.status == 500
        assert response.body == {
            "code": 500,
            "code_text": "Internal Server Error",
            "message": "Internal error",
        }
    with_id = error_response(RuntimeError(secret), request_id="req-123")
    assert with_id.body["message"] == "Internal error; request id req-123"


def test_wire_errors() -> None:
    cases = [
        (errors.unsupported_content("colour: unknown key"), 455, "Unsupported Content"),
        (errors.unknown_path("POST", "/v1/queue.nope"), 501, "Not Implemented"),
        (errors.wrong_method("GET", "/v1/queue.produce", "POST"), 400, "Bad Request"),
    ]
    for error, status, code_text in cases:
        response = error_response(error)
        assert response.status == status == status_for(error)
        assert response.body["code"] == status
        assert response.body["code_text"] == code_text
        assert ";" in response.body["message"]
    assert error_response(cases[0][0]).body["message"] == "Unsupported content; colour: unknown key"
    assert "/v1/queue.nope" in error_response(cases[1][0]).body["message"]


def test_body_too_large_is_413() -> None:
    error = errors.body_too_large(300_000, 262_144)
    assert status_for(error) == 413
    assert "262144" in error_response(error).body["message"]


def test_failed_ids_error_names_each_id() -> None:
    error = errors.failed_ids_error(
        [
            IdFailure(id="abc", reason="item is unknown, stale or not leased"),
            IdFailure(id="def", reason="bad id"),
        ],
        applied=0,
    )
    response = error_response(error)
    assert response.status == 400
    assert response.body["message"].startswith("Item id is unknown, stale or not leased; ")
    assert "'abc'" in response.body["message"]
    assert "'def' (bad id)" in response.body["message"]
    assert error.context["ids"] == ["abc", "def"]


def test_failed_ids_error_lists_the_failed_ids_as_failed_then_counts_the_applied_ones() -> None:
    # It once read "1 id(s) not applied, the others were: 'bad' (...)": the failed id read as applied.
    error = errors.failed_ids_error(
        [IdFailure(id="bad", reason="item is unknown, stale or not leased")], applied=2
    )
    assert error_response(error).body["message"] == (
        "Item id is unknown, stale or not leased; 1 of 3 id(s) failed and were not applied: "
        "'bad' (item is unknown, stale or not leased); the other 2 were applied"
    )


def test_failed_ids_error_says_when_none_was_applied() -> None:
    error = errors.failed_ids_error([IdFailure(id="a", reason="x"), IdFailure(id="b", reason="y")], applied=0)
    assert str(error) == "2 of 2 id(s) failed and were not applied: 'a' (x), 'b' (y); none was applied"


def test_the_client_reads_the_failed_ids_back_from_the_message() -> None:
    # The Python client ships without the server: it parses the ids out of the message text.
    from querator.client.errors import ItemNotLeasedError, error_for  # noqa: PLC0415

    failures = [
        IdFailure(id="a" * 30, reason="item is unknown, stale or not leased"),
        IdFailure(
            id="b" * 30, reason="item is unknown or gone (completed, moved to a new id, or never produced)"
        ),
    ]
    response = error_response(errors.failed_ids_error(failures, applied=5))
    parsed = error_for(response.status, response.body)
    assert isinstance(parsed, ItemNotLeasedError)
    assert parsed.failed_ids == ("a" * 30, "b" * 30)


def test_error_body_model_matches_envelope() -> None:
    body = errors.envelope(453, "Queue is being deleted")
    assert errors.ErrorBody.from_json(json.dumps(body).encode()).to_wire() == body


def test_an_unknown_path_near_a_route_names_it() -> None:
    assert str(errors.unknown_path("POST", "/v1/queue.list")) == (
        "Not implemented; no such method: POST /v1/queue.list; did you mean /v1/queues.list"
    )
    assert str(errors.unknown_path("POST", "/v1/storage/item.list")).endswith(
        "did you mean /v1/storage/items.list"
    )
    assert (
        str(errors.unknown_path("GET", "/nothing/here"))
        == "Not implemented; no such method: GET /nothing/here"
    )


def test_a_rate_limited_lease_says_when_to_come_back_in_the_envelope() -> None:
    at = datetime(2026, 11, 27, 12, 0, 0, 50_000, tzinfo=UTC)
    body = error_response(LeaseRateLimitedError("no lease left", next_lease_at=at)).body
    assert body == {
        "code": 454,
        "code_text": "Retry Request",
        "message": "Lease rate limit reached; no lease left",
        "next_lease_at": "2026-11-27T12:00:00.050000Z",
    }
    # Every other error keeps the three fields.
    assert set(error_response(NothingToLeaseError()).body) == {"code", "code_text", "message"}
