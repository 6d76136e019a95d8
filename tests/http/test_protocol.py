"""The contract's wire rules, over real HTTP: statuses, the error envelope, limits, GETs."""

from __future__ import annotations

import json

import pytest

from querator.api import routes

pytestmark = pytest.mark.server


def envelope_of(reply, status: int) -> str:
    assert reply.status == status, reply.body
    assert set(reply.body) == {"code", "code_text", "message"} and reply.body["code"] == status
    message: str = reply.body["message"]
    return message


def test_unknown_paths_are_501_and_wrong_methods_400(api):
    assert "no such method" in envelope_of(api.post("/v1/queue.frobnicate"), 501)
    assert "takes POST" in envelope_of(api.request("GET", "/v1/queue.produce"), 400)
    envelope_of(api.request("POST", "/health"), 400)


def test_bodies_that_are_not_understood_are_455(api, queue_name):
    api.ok("/v1/queues.create", {"queue_name": queue_name, "lease_timeout": "1m", "expire_timeout": "1h"})
    envelope_of(api.post("/v1/queue.stats", raw=b"{nope"), 455)
    envelope_of(api.post("/v1/queue.stats", {"queue_name": queue_name, "mystery": True}), 455)
    form = api.post(
        "/v1/queue.stats", raw=b"queue_name=x", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    envelope_of(form, 455)
    envelope_of(api.post("/v1/queue.stats", raw=b"\xff\xfe\x00"), 455)


def test_bad_values_are_400_and_name_the_field(api, queue_name):
    reply = api.post(
        "/v1/queues.create", {"queue_name": queue_name, "lease_timeout": "-5s", "expire_timeout": "1h"}
    )
    assert "lease_timeout" in envelope_of(reply, 400)
    reply = api.post("/v1/queue.lease", {"queue_name": queue_name, "batch_size": 0, "client_id": "c"})
    assert "batch_size" in envelope_of(reply, 400)
    # The local server reads a lease's wait before the handler: a bad one is still the handler's 400.
    for wait in ("10", "bogus", "", "1.5.5s"):
        lease = {"queue_name": queue_name, "batch_size": 1, "client_id": "c", "request_timeout": wait}
        assert "request_timeout" in envelope_of(api.post("/v1/queue.lease", lease), 400)


def test_bodies_over_the_limit_are_413(api, queue_name):
    big = json.dumps({"queue_name": queue_name, "pad": "x" * routes.SMALL_BODY_LIMIT}).encode()
    envelope_of(api.post("/v1/queue.stats", raw=big), 413)
    huge = b"{" + b" " * (routes.LARGE_BODY_LIMIT + 10) + b"}"
    envelope_of(api.post("/v1/queue.produce", raw=huge), 413)


def test_camel_case_keys_and_go_durations(api, queue_name):
    api.ok("/v1/queues.create", {"queueName": queue_name, "leaseTimeout": "1m30s", "expireTimeout": "24h"})
    info = api.ok("/v1/queues.info", {"queueName": queue_name})
    assert (info["lease_timeout"], info["expire_timeout"]) == ("1m30s", "24h0m0s")


def test_health_openapi_and_docs(api):
    assert api.request("GET", "/health").body == {"status": "pass"}
    document = api.request("GET", "/openapi.json").body
    assert set(document["paths"]) == {route.path for route in routes.ROUTES}
    docs = api.request("GET", "/docs")
    assert docs.status == 200 and b"SwaggerUIBundle" in docs.body
    # The page names "/docs?format=json" as the document's address; that address serves it.
    assert b'"?format=json"' in docs.body
    assert api.request("GET", "/docs?format=json").body == document


def test_the_swagger_page_keeps_the_message_format_visible(api):
    # Swagger UI renders descriptions as Markdown: a bare "<stable class>" is an HTML tag and was
    # dropped (the page showed `message = "";`). In a code span it is text.
    document = api.request("GET", "/openapi.json").body
    assert '`"<stable class>; <details>"`' in document["info"]["description"]
    examples = [
        response["content"]["application/json"]["example"]["message"]
        for response in document["components"]["responses"].values()
    ]
    assert examples and not any("<" in message for message in examples)


def test_an_item_without_a_payload_is_400_and_nothing_is_stored(api, queue_name):
    api.ok("/v1/queues.create", {"queue_name": queue_name, "lease_timeout": "1m", "expire_timeout": "1h"})
    reply = api.post("/v1/queue.produce", {"queue_name": queue_name, "items": [{"utf8": "a"}, {}]})
    assert envelope_of(reply, 400) == (
        "Invalid request; items[1]: no payload: give 'bytes' (base64) or 'utf8' (an empty one is \"\")"
    )
    # An empty payload is one key away.
    api.ok("/v1/queue.produce", {"queue_name": queue_name, "items": [{"utf8": ""}, {"bytes": ""}]})
    stats = api.ok("/v1/queue.stats", {"queue_name": queue_name})
    assert sum(p["total"] for p in stats["logicalQueues"][0]["partitions"]) == 2
