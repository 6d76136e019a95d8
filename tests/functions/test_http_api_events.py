"""The functions behind the HTTP API flavour: payload-1.0 events, as API Gateway v2 sends them.

The HTTP API (``apiFlavour: http``, infra/constructs/http_api.py) invokes the same handlers as the
REST API, with its own event: ``version: "1.0"``, lower-case header names, ``$default`` as the stage
and, for a miss, as the resource. moto's CloudFormation does not model API Gateway v2, so the
deployed-stack test cannot send these through a deployed HTTP API; this is where the flavour runs.
"""

from __future__ import annotations

import base64

from tests.functions.conftest import http_api_event
from tests.functions.test_handlers import assert_error, make_queue, payloads, total


def test_the_event_is_an_http_api_payload_1_0_on_the_default_stage() -> None:
    event = http_api_event("/v1/queue.lease", {"queue_name": "jobs"})
    assert event["version"] == "1.0"
    assert event["requestContext"]["stage"] == "$default"
    # No stage segment: on a named stage an HTTP API sends "/<stage>/v1/queue.lease".
    assert event["path"] == "/v1/queue.lease"
    assert all(name == name.lower() for name in event["headers"])


def test_produce_lease_and_complete_through_http_api_events(http_api) -> None:
    make_queue(http_api)
    http_api.ok(
        "/v1/queue.produce",
        {
            "queue_name": "jobs",
            "items": [{"utf8": "first"}, {"bytes": base64.b64encode(b"\x00\xff").decode()}],
        },
    )
    assert total(http_api) == 2
    leased = http_api.ok(
        "/v1/queue.lease",
        {"queue_name": "jobs", "batch_size": 10, "client_id": "worker", "request_timeout": "0s"},
    )
    ids = [item["id"] for item in leased["items"]]
    assert payloads(leased["items"]) == [b"first", b"\x00\xff"]
    http_api.ok("/v1/queue.complete", {"queue_name": "jobs", "partition": leased["partition"], "ids": ids})
    assert total(http_api) == 0
    # Completed: the same ids again are stale, which the handler reads from the HTTP API's body too.
    again = http_api.call("/v1/queue.complete", {"queue_name": "jobs", "partition": 0, "ids": ids})
    assert_error(again, 400, "Item id is unknown, stale or not leased")


def test_a_base64_body_and_a_lower_case_idempotency_key_are_read(http_api) -> None:
    make_queue(http_api)
    body = b'{"queue_name": "jobs", "items": [{"utf8": "a"}]}'
    first = http_api.call("/v1/queue.produce", body, headers={"Idempotency-Key": "request-1"})
    again = http_api.call("/v1/queue.produce", body, headers={"Idempotency-Key": "request-1"})
    assert (first.status, again.status) == (200, 200)
    assert again.headers["Idempotency-Replayed"] == "true"
    assert total(http_api) == 1


def test_the_default_routes_misses_are_answered_in_the_envelope(http_api) -> None:
    # The $default route sends both to the meta function, as REST's catch-alls do.
    assert_error(http_api.call("/v1/queue.produce", method="GET", function="meta"), 400, "Invalid request")
    assert_error(http_api.call("/v1/queue.nope", {}, function="meta"), 501, "Not implemented")


def test_health_answers_through_an_http_api_event(http_api) -> None:
    assert http_api.call("/health", method="GET").status == 200
