"""Scoped paths (``/v1/queues/{queue}/<route>``) through ``querator serve``: its routing, the decoding
of the queue segment (once, as API Gateway does), a waiting lease woken by a scoped produce, and the
400 for a body naming another queue."""

from __future__ import annotations

import threading

import pytest

from tests.http.conftest import Http, decoded

pytestmark = pytest.mark.server


def _scoped(queue: str, name: str) -> str:
    return f"/v1/queues/{queue}/{name}"


def _total(api: Http, queue: str) -> int:
    stats = api.ok(_scoped(queue, "queue.stats"))
    return sum(p["total"] for p in stats["logicalQueues"][0]["partitions"])


def test_a_queue_lives_through_its_scoped_paths(api: Http, queue_name: str) -> None:
    api.ok(_scoped(queue_name, "queues.create"), {"lease_timeout": "30s", "expire_timeout": "1h"})
    api.ok(_scoped(queue_name, "queue.produce"), {"items": [{"utf8": "one"}]})
    leased = api.ok(_scoped(queue_name, "queue.lease"), {"batch_size": 5, "client_id": "c1"})
    assert leased["queue_name"] == queue_name and decoded(leased["items"]) == [b"one"]
    body = {"partition": leased["partition"], "ids": [leased["items"][0]["id"]]}
    api.ok(_scoped(queue_name, "queue.complete"), body)
    assert _total(api, queue_name) == 0
    # A letter percent-encoded is the same queue: the server decodes the segment once.
    encoded = f"%{ord(queue_name[0]):02X}{queue_name[1:]}"
    assert api.ok(_scoped(encoded, "queues.info"))["queue_name"] == queue_name
    api.ok(_scoped(queue_name, "queues.delete"))


def test_a_waiting_scoped_lease_is_woken_by_a_scoped_produce(api: Http, queue_name: str) -> None:
    api.ok(_scoped(queue_name, "queues.create"), {"lease_timeout": "30s", "expire_timeout": "1h"})
    replies: list[object] = []
    waiting = threading.Thread(
        target=lambda: replies.append(
            api.post(
                _scoped(queue_name, "queue.lease"),
                {"batch_size": 1, "client_id": "c1", "request_timeout": "20s"},
            )
        )
    )
    waiting.start()
    api.ok(_scoped(queue_name, "queue.produce"), {"items": [{"utf8": "late"}]})
    waiting.join(timeout=25)
    assert not waiting.is_alive()
    [reply] = replies
    assert reply.status == 200 and decoded(reply.body["items"]) == [b"late"]  # type: ignore[attr-defined]


def test_a_body_naming_another_queue_is_a_400_and_changes_nothing(api: Http, queue_name: str) -> None:
    other = f"{queue_name}-other"
    for name in (queue_name, other):
        api.ok(_scoped(name, "queues.create"), {"lease_timeout": "30s", "expire_timeout": "1h"})
    reply = api.post(_scoped(queue_name, "queue.produce"), {"queue_name": other, "items": [{"utf8": "x"}]})
    assert reply.status == 400 and "the body names queue" in reply.body["message"]
    waited = api.post(
        _scoped(queue_name, "queue.lease"),
        {"queue_name": other, "batch_size": 1, "client_id": "c1", "request_timeout": "5s"},
    )
    assert waited.status == 400
    assert _total(api, queue_name) == 0 and _total(api, other) == 0


@pytest.mark.parametrize("segment", ["a%2Ab", "a%2Fb", "%2E%2E", "caf%C3%A9", "a%2541"])
def test_a_segment_that_decodes_to_no_addressable_name_is_a_400(api: Http, segment: str) -> None:
    reply = api.post(_scoped(segment, "queues.create"), {"lease_timeout": "30s", "expire_timeout": "1h"})
    assert reply.status == 400 and "scoped route" in reply.body["message"], reply.body


def test_unknown_scoped_routes_are_501_and_a_wrong_method_400(api: Http, queue_name: str) -> None:
    assert api.post(_scoped(queue_name, "queues.list")).status == 501
    assert api.post(_scoped(queue_name, "queue.nope")).status == 501
    assert api.request("GET", _scoped(queue_name, "queue.stats")).status == 400
