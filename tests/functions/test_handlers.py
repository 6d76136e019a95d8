"""Every endpoint through its Lambda handler: success shapes and each documented error."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest

from querator import bootstrap
from querator.api import routes
from querator.domain.errors import StoreThrottledError
from querator.localserver import LocalContext
from tests.functions.conftest import Api, scheduled_event

QUEUE = {"queue_name": "jobs", "lease_timeout": "30s", "expire_timeout": "24h"}


def make_queue(api: Api, **fields: object) -> None:
    api.ok("/v1/queues.create", {**QUEUE, **fields})


def produce(api: Api, *texts: str, queue: str = "jobs", **headers: str) -> None:
    api.ok(
        "/v1/queue.produce",
        {"queue_name": queue, "items": [{"utf8": t} for t in texts]},
        headers=headers or None,
    )


def lease(api: Api, batch: int = 10, queue: str = "jobs", client: str = "c1") -> dict:
    body: dict = api.ok("/v1/queue.lease", {"queue_name": queue, "batch_size": batch, "client_id": client})
    return body


def payloads(items: list[dict]) -> list[bytes]:
    return [base64.b64decode(i.get("bytes", i.get("payload", ""))) for i in items]


def total(api: Api, queue: str = "jobs") -> int:
    stats = api.ok("/v1/queue.stats", {"queue_name": queue})
    return sum(p["total"] for p in stats["logicalQueues"][0]["partitions"])


def assert_error(reply, status: int, stable: str) -> None:
    assert reply.status == status, reply.body
    assert reply.body["code"] == status
    assert reply.body["code_text"]
    assert reply.body["message"].split(";", 1)[0] == stable, reply.body["message"]


# -- queues ---------------------------------------------------------------------------------------


def test_queue_lifecycle_create_info_update_list_delete(api):
    make_queue(api, requested_partitions=2, reference="r")
    info = api.ok("/v1/queues.info", {"queue_name": "jobs"})
    assert info["lease_timeout"] == "30s" and info["expire_timeout"] == "24h0m0s"
    assert info["requested_partitions"] == 2 and info["reference"] == "r"
    assert info["created_at"].endswith("Z")

    api.ok("/v1/queues.update", {"queue_name": "jobs", "max_attempts": 3})
    updated = api.ok("/v1/queues.info", {"queue_name": "jobs"})
    assert (updated["max_attempts"], updated["reference"], updated["lease_timeout"]) == (3, "r", "30s")

    make_queue(api, queue_name="other")
    listed = api.ok("/v1/queues.list", {"pivot": "jobs", "limit": 1})
    assert [q["queue_name"] for q in listed["items"]] == ["jobs"]

    api.ok("/v1/queues.delete", {"queue_name": "jobs"})
    assert_error(api.call("/v1/queues.info", {"queue_name": "jobs"}), 400, "Queue does not exist")


def test_creating_a_queue_twice_or_with_bad_fields_is_a_400(api):
    make_queue(api)
    assert api.call("/v1/queues.create", QUEUE).status == 400
    bad_duration = api.call("/v1/queues.create", {**QUEUE, "queue_name": "q2", "lease_timeout": "soon"})
    assert bad_duration.status == 400 and "lease_timeout" in bad_duration.body["message"]
    missing_dead = api.call("/v1/queues.create", {**QUEUE, "queue_name": "q3", "dead_queue": "nope"})
    assert missing_dead.status == 400 and "dead_queue" in missing_dead.body["message"]


def test_camel_case_keys_are_accepted(api):
    api.ok("/v1/queues.create", {"queueName": "jobs", "leaseTimeout": "1m", "expireTimeout": "1h"})
    assert api.ok("/v1/queues.info", {"queueName": "jobs"})["lease_timeout"] == "1m0s"


# -- produce and lease ----------------------------------------------------------------------------


def test_produce_then_lease_returns_items_oldest_first_with_payloads(api):
    make_queue(api)
    api.ok(
        "/v1/queue.produce",
        {
            "queue_name": "jobs",
            "items": [
                {"utf8": "first", "reference": "ref-1", "kind": "k", "encoding": "text/plain"},
                {"bytes": base64.b64encode(b"\x00\xff").decode()},
            ],
        },
    )
    leased = lease(api)
    assert leased["queue_name"] == "jobs" and leased["partition"] == 0
    first, second = leased["items"]
    assert payloads([first, second]) == [b"first", b"\x00\xff"]
    assert (first["reference"], first["kind"], first["encoding"], first["attempts"]) == (
        "ref-1",
        "k",
        "text/plain",
        1,
    )
    deadline = datetime.fromisoformat(first["lease_deadline"].replace("Z", "+00:00"))
    assert timedelta(seconds=25) < deadline - datetime.now(UTC) <= timedelta(seconds=30)


def test_lease_with_nothing_to_lease_is_a_454(api):
    make_queue(api)
    reply = api.call("/v1/queue.lease", {"queue_name": "jobs", "batch_size": 1, "client_id": "c"})
    assert_error(reply, 454, "Nothing to lease before the request timeout")


def test_produce_validation_errors(api):
    make_queue(api)
    unknown = api.call("/v1/queue.produce", {"queue_name": "nope", "items": [{"utf8": "x"}]})
    assert_error(unknown, 400, "Queue does not exist")
    too_many = api.call("/v1/queue.produce", {"queue_name": "jobs", "items": [{"utf8": "x"}] * 1001})
    assert too_many.status == 400 and "items" in too_many.body["message"]
    bad_base64 = api.call("/v1/queue.produce", {"queue_name": "jobs", "items": [{"bytes": "@@@"}]})
    assert bad_base64.status == 400 and "items[0].bytes" in bad_base64.body["message"]
    assert (
        api.ok("/v1/queue.stats", {"queue_name": "jobs"})["logicalQueues"][0]["partitions"][0]["total"] == 0
    )


def test_wire_errors_455_for_bodies_that_are_not_understood(api):
    make_queue(api)
    assert_error(api.call("/v1/queue.stats", "{not json"), 455, "Unsupported content")
    assert_error(api.call("/v1/queue.stats", {"queue_name": "jobs", "extra": 1}), 455, "Unsupported content")
    text = api.call("/v1/queue.stats", {"queue_name": "jobs"}, headers={"Content-Type": "text/plain"})
    assert_error(text, 455, "Unsupported content")


def test_bodies_over_the_endpoint_limit_are_a_413(api):
    make_queue(api)
    big = {"queue_name": "jobs", "queue": True, "pad": "x" * (routes.SMALL_BODY_LIMIT + 1)}
    assert_error(api.call("/v1/queue.clear", big), 413, "Request is over the size limit")
    huge = {"queue_name": "jobs", "items": [{"utf8": "x" * 1_000_000}] * 6}
    assert api.call("/v1/queue.produce", huge).status == 413


def test_wrong_method_is_400_and_unknown_path_is_501(api):
    assert_error(api.call("/v1/queue.stats", method="GET", function="admin"), 400, "Invalid request")
    # Deployed, API Gateway sends other methods and unknown paths to the meta function (infra/api.py).
    assert_error(api.call("/v1/queue.produce", method="GET", function="meta"), 400, "Invalid request")
    assert_error(api.call("/v1/queue.nope", {}, function="meta"), 501, "Not implemented")


def test_produce_with_an_idempotency_key_stores_a_retried_request_once(api):
    make_queue(api)
    body = {"queue_name": "jobs", "items": [{"utf8": "a"}, {"utf8": "b"}]}
    first = api.call("/v1/queue.produce", body, headers={"Idempotency-Key": "request-1"})
    again = api.call("/v1/queue.produce", body, headers={"idempotency-key": "request-1"})
    assert (first.status, again.status) == (200, 200)
    assert (first.headers["Idempotency-Replayed"], again.headers["Idempotency-Replayed"]) == ("false", "true")
    assert total(api) == 2
    assert "Idempotency-Replayed" not in api.call("/v1/queue.produce", body).headers  # no key: 2 more
    assert total(api) == 4
    blank = api.call(
        "/v1/queue.produce",
        {"queue_name": "jobs", "items": [{"utf8": "c"}]},
        headers={"Idempotency-Key": " "},
    )
    assert blank.status == 400


@pytest.mark.allow_5xx
def test_a_throttled_store_is_a_454_and_an_unexpected_error_a_generic_500(api):
    make_queue(api)
    service = bootstrap.get_service()
    with mock.patch.object(service, "stats", side_effect=StoreThrottledError("slow down")):
        assert_error(
            api.call("/v1/queue.stats", {"queue_name": "jobs"}), 454, "The store is throttling requests"
        )
    with mock.patch.object(service, "stats", side_effect=RuntimeError("table arn:aws:secret details")):
        reply = api.call("/v1/queue.stats", {"queue_name": "jobs"})
    assert_error(reply, 500, "Internal error")
    assert "secret" not in reply.body["message"]
    assert "c6af9ac6-7b61-11e6-9a41-93e8deadbeef" in reply.body["message"]


def test_a_queue_being_deleted_is_a_453(api):
    make_queue(api)
    bootstrap.get_service().catalog.mark_deleting("jobs")
    reply = api.call("/v1/queue.produce", {"queue_name": "jobs", "items": [{"utf8": "x"}]})
    assert_error(reply, 453, "Queue is being deleted")


# -- complete, retry, renew ------------------------------------------------------------------------


def test_complete_applies_valid_ids_and_names_the_stale_ones(api):
    make_queue(api)
    produce(api, "a", "b")
    ids = [i["id"] for i in lease(api)["items"]]
    stale = "0" * 30
    reply = api.call("/v1/queue.complete", {"queue_name": "jobs", "partition": 0, "ids": [ids[0], stale]})
    assert_error(reply, 400, "Item id is unknown, stale or not leased")
    assert stale in reply.body["message"] and ids[0] not in reply.body["message"]
    api.ok("/v1/queue.complete", {"queue_name": "jobs", "partition": 0, "ids": [ids[1]]})
    assert (
        api.ok("/v1/queue.stats", {"queue_name": "jobs"})["logicalQueues"][0]["partitions"][0]["total"] == 0
    )


def test_retry_now_later_and_dead(api):
    make_queue(api, queue_name="dead")
    make_queue(api, dead_queue="dead")
    produce(api, "now", "later", "dead")
    now_id, later_id, dead_id = (i["id"] for i in lease(api)["items"])
    retry_at = (datetime.now(UTC) + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    api.ok(
        "/v1/queue.retry",
        {
            "queue_name": "jobs",
            "partition": 0,
            "items": [{"id": now_id}, {"id": later_id, "retry_at": retry_at}, {"id": dead_id, "dead": True}],
        },
    )
    again = lease(api, client="c2")["items"]
    assert payloads(again) == [b"now"] and again[0]["attempts"] == 2 and again[0]["id"] != now_id
    scheduled = api.ok("/v1/storage/scheduled.list", {"queue_name": "jobs", "partition": 0})["items"]
    assert payloads(scheduled) == [b"later"]
    dead = api.ok("/v1/storage/items.list", {"queue_name": "dead", "partition": 0})["items"]
    assert payloads(dead) == [b"dead"] and dead[0]["source_id"] == dead_id


def test_retry_reasons_show_in_the_lease_and_the_dead_letter_listing_with_the_source_queue(api):
    make_queue(api, queue_name="dead")
    make_queue(api, dead_queue="dead", max_attempts=2)
    produce(api, "flaky", "fine")
    flaky, fine = lease(api)["items"]
    # An item that never failed carries neither key: the reply is as it was before reasons.
    assert "last_reason" not in fine and "failures" not in fine
    retry = {
        "queue_name": "jobs",
        "partition": 0,
        "items": [{"id": flaky["id"], "reason": "TimeoutError: db"}],
    }
    api.ok("/v1/queue.retry", retry)

    (again,) = lease(api, client="c2")["items"]
    assert (again["last_reason"], again["failures"], again["attempts"]) == ("TimeoutError: db", 1, 2)
    api.ok(
        "/v1/queue.retry",
        {"queue_name": "jobs", "partition": 0, "items": [{"id": again["id"], "reason": "ValueError: café"}]},
    )

    (dead,) = api.ok("/v1/storage/items.list", {"queue_name": "dead", "partition": 0})["items"]
    assert (dead["last_reason"], dead["failures"], dead["source_queue"], dead["source_id"]) == (
        "max attempts: ValueError: café",
        2,
        "jobs",
        again["id"],
    )
    (listed,) = api.ok("/v1/storage/items.list", {"queue_name": "jobs", "partition": 0})["items"]
    assert {"last_reason", "failures", "source_queue"}.isdisjoint(listed)


@pytest.mark.parametrize(
    ("reason", "detail"),
    [
        ("x" * 1025, "items[1].reason: reason is longer than 1024 bytes of UTF-8 (1025)"),
        ("é" * 513, "items[1].reason: reason is longer than 1024 bytes of UTF-8 (1026)"),
        ("two\nlines", "items[1].reason: reason may not hold control characters"),
        (7, "items[1].reason: Input should be a valid string"),
    ],
)
def test_a_bad_reason_is_a_400_naming_it_and_nothing_is_applied(api, reason, detail):
    make_queue(api)
    produce(api, "a", "b")
    first, second = lease(api)["items"]
    body = {
        "queue_name": "jobs",
        "partition": 0,
        "items": [{"id": first["id"], "reason": "fine"}, {"id": second["id"], "reason": reason}],
    }

    reply = api.call("/v1/queue.retry", body)

    assert_error(reply, 400, "Invalid request")
    assert detail in reply.body["message"]
    listed = api.ok("/v1/storage/items.list", {"queue_name": "jobs", "partition": 0})["items"]
    assert [i["is_leased"] for i in listed] == [True, True] and "last_reason" not in listed[0]
    api.ok("/v1/queue.complete", {"queue_name": "jobs", "partition": 0, "ids": [first["id"], second["id"]]})


def test_a_retry_at_past_the_schedulable_range_is_a_400_naming_the_item(api):
    make_queue(api)
    produce(api, "a", "b")
    first, second = lease(api)["items"]
    body = {
        "queue_name": "jobs",
        "partition": 0,
        "items": [{"id": first["id"]}, {"id": second["id"], "retry_at": "3000-01-01T00:00:00Z"}],
    }

    reply = api.call("/v1/queue.retry", body)

    assert_error(reply, 400, "Invalid request")
    assert "items[1].retry_at: retry_at must be before 3000" in reply.body["message"]
    listed = api.ok("/v1/storage/items.list", {"queue_name": "jobs", "partition": 0})["items"]
    assert [i["is_leased"] for i in listed] == [True, True]


@pytest.mark.parametrize(
    ("fields", "detail"),
    [
        ({"enqueue_at": "3000-01-01T00:00:00Z"}, "items[1].enqueue_at: enqueue_at must be before 3000"),
        ({"enqueue_at": "2999-12-31T23:00:00-02:00"}, "items[1].enqueue_at: enqueue_at must be before 3000"),
    ],
)
def test_a_produce_past_the_schedulable_range_is_a_400_naming_the_field(api, fields, detail):
    make_queue(api)
    body = {"queue_name": "jobs", "items": [{"utf8": "a"}, {"utf8": "b", **fields}]}

    reply = api.call("/v1/queue.produce", body)

    assert_error(reply, 400, "Invalid request")
    assert detail in reply.body["message"]
    assert api.ok("/v1/storage/items.list", {"queue_name": "jobs", "partition": 0})["items"] == []


@pytest.mark.parametrize("field", ["reference", "encoding", "kind"])
def test_a_produce_with_a_text_field_over_its_limit_is_a_400_naming_the_field(api, field):
    make_queue(api)
    body = {"queue_name": "jobs", "items": [{"utf8": "a"}, {"utf8": "b", field: "x" * 2001}]}

    reply = api.call("/v1/queue.produce", body)

    assert_error(reply, 400, "Invalid request")
    assert f"items[1].{field}: item {field} is longer than 2000 bytes" in reply.body["message"]


def test_import_keeps_source_queue_reason_and_failures_of_a_listed_dead_letter(api):
    make_queue(api)
    item = {
        "payload": base64.b64encode(b"p").decode(),
        "source_queue": "orders",
        "last_reason": "max attempts: boom",
        "failures": 3,
    }
    api.ok("/v1/storage/items.import", {"queue_name": "jobs", "partition": 0, "items": [item]})

    (listed,) = api.ok("/v1/storage/items.list", {"queue_name": "jobs", "partition": 0})["items"]

    assert (listed["source_queue"], listed["last_reason"], listed["failures"]) == (
        "orders",
        "max attempts: boom",
        3,
    )
    # A listing goes back in as it is.
    again = api.ok("/v1/storage/items.import", {"queue_name": "jobs", "partition": 0, "items": [listed]})
    assert len(again["items"]) == 1
    bad = {**item, "last_reason": "x" * 1025}
    reply = api.call("/v1/storage/items.import", {"queue_name": "jobs", "partition": 0, "items": [bad]})
    assert_error(reply, 400, "Invalid request")
    assert "items[0].last_reason" in reply.body["message"]


def test_renew_returns_new_deadlines_and_refuses_stale_ids(api):
    make_queue(api)
    produce(api, "a")
    item = lease(api)["items"][0]
    renewed = api.ok(
        "/v1/queue.renew", {"queue_name": "jobs", "partition": 0, "ids": [item["id"]], "lease_timeout": "5m"}
    )
    assert [r["id"] for r in renewed["items"]] == [item["id"]]
    deadline = datetime.fromisoformat(renewed["items"][0]["lease_deadline"].replace("Z", "+00:00"))
    assert deadline - datetime.now(UTC) > timedelta(minutes=4)
    stale = api.call("/v1/queue.renew", {"queue_name": "jobs", "partition": 0, "ids": ["f" * 30]})
    assert stale.status == 400 and "f" * 30 in stale.body["message"]


# -- inspection and maintenance ---------------------------------------------------------------------


def test_stats_clear_and_storage_paging(api):
    make_queue(api)
    produce(api, *[f"item-{n}" for n in range(5)])
    first_page = api.ok("/v1/storage/items.list", {"queue_name": "jobs", "partition": 0, "limit": 2})["items"]
    rest = api.ok(
        "/v1/storage/items.list", {"queue_name": "jobs", "partition": 0, "pivot": first_page[1]["id"]}
    )["items"]
    assert payloads(first_page) + payloads(rest)[1:] == [f"item-{n}".encode() for n in range(5)]
    assert rest[0]["id"] == first_page[1]["id"]  # the pivot is inclusive
    lease(api, batch=1)
    partition = api.ok("/v1/queue.stats", {"queue_name": "jobs"})["logicalQueues"][0]["partitions"][0]
    assert (partition["total"], partition["total_leased"], partition["scheduled"]) == (5, 1, 0)

    api.ok("/v1/queue.clear", {"queue_name": "jobs", "queue": True})
    left = api.ok("/v1/storage/items.list", {"queue_name": "jobs", "partition": 0})["items"]
    assert len(left) == 1 and left[0]["is_leased"] is True
    assert_error(api.call("/v1/queue.clear", {"queue_name": "jobs"}), 400, "Invalid request")


def test_import_skips_known_source_ids_and_delete_is_idempotent(api):
    make_queue(api)
    item = {"source_id": "s1", "payload": base64.b64encode(b"p").decode(), "attempts": 2}
    imported = api.ok("/v1/storage/items.import", {"queue_name": "jobs", "partition": 0, "items": [item]})
    again = api.ok("/v1/storage/items.import", {"queue_name": "jobs", "partition": 0, "items": [item]})
    assert len(imported["items"]) == 1 and again["items"] == []
    new_id = imported["items"][0]["id"]
    for _ in range(2):
        api.ok("/v1/storage/items.delete", {"queue_name": "jobs", "partition": 0, "ids": [new_id]})
    assert api.ok("/v1/storage/items.list", {"queue_name": "jobs", "partition": 0})["items"] == []


def test_health_openapi_and_docs(api):
    assert api.ok("/health", method="GET") == {"status": "pass"}
    document = api.ok("/openapi.json", method="GET")
    assert document["openapi"].startswith("3.1") and set(document["paths"]) == {r.path for r in routes.ROUTES}
    docs = api.call("/docs", method="GET")
    assert docs.status == 200 and docs.headers["Content-Type"] == "text/html"
    assert "SwaggerUIBundle" in docs.body and "queue.produce" in docs.body


def test_every_route_has_an_endpoint_on_the_function_that_serves_it(api):
    for route in routes.ROUTES:
        reply = api.call(route.path, {} if route.method == "POST" else None, method=route.method)
        # An empty body may be invalid for the route (400/455), but it was routed: never 501.
        assert reply.status != 501, route.path


# -- reaper ---------------------------------------------------------------------------------------


def test_the_reaper_handler_dead_letters_expired_items_and_reports_counts(api, capsys):
    make_queue(api, queue_name="dead")
    make_queue(api, dead_queue="dead", lease_timeout="1ms", expire_timeout="1ms")
    produce(api, "a", "b")
    reaper = __import__("functions.reaper.handler", fromlist=["lambda_handler"]).lambda_handler
    summary = reaper(scheduled_event(), LocalContext(function_name="reaper", timeout_seconds=60))
    assert (summary["dead_lettered"], summary["finished"]) == (2, True)
    dead = api.ok("/v1/storage/items.list", {"queue_name": "dead", "partition": 0})["items"]
    assert sorted(payloads(dead)) == [b"a", b"b"]
    # The dead-letter queue sorts first, so this run read it before moving items in: the next run counts.
    reaper(scheduled_event(), LocalContext(function_name="reaper", timeout_seconds=60))
    emitted = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    values = [doc for doc in emitted if "ReaperItemsScanned" in doc]  # the produce calls emitted too
    assert values[0]["ItemsDeadLettered"] == [2.0] and "DeadLetterDepth" not in values[0]
    assert values[1]["DeadLetterDepth"] == [2.0] and values[1]["OldestItemAgeSeconds"][0] >= 0


@pytest.mark.parametrize("remaining_ms", [0, 4000])
def test_the_reaper_stops_within_the_time_the_invocation_has_left(api, remaining_ms):
    make_queue(api, requested_partitions=2)
    produce(api, "a")
    context = LocalContext(function_name="reaper", timeout_seconds=remaining_ms / 1000)
    reaper = __import__("functions.reaper.handler", fromlist=["lambda_handler"]).lambda_handler
    summary = reaper(scheduled_event(), context)
    # With no time left (under the 5 s margin) the run stops after its first partition and says so.
    assert (summary["partitions"], summary["finished"]) == (1, False)
