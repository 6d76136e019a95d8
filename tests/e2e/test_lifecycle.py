"""Lifecycle smoke over HTTP against a deployed stack: queues, produce, lease, complete, retry into the
dead-letter queue, stats, and the IAM gate in front of all of it."""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.e2e.sigv4 import SignedApi

pytestmark = pytest.mark.e2e


def _ok(reply: Any) -> dict[str, Any]:
    assert reply.status == 200, reply
    body: dict[str, Any] = reply.body
    return body


def _totals(stats: dict[str, Any]) -> tuple[int, int]:
    partitions = [p for logical in stats.get("logicalQueues", []) for p in logical.get("partitions", [])]
    return sum(p.get("total", 0) for p in partitions), sum(p.get("total_leased", 0) for p in partitions)


@pytest.fixture
def queues(api: SignedApi) -> Iterator[tuple[str, str]]:
    name = f"e2e-{uuid.uuid4().hex[:12]}"
    dead = f"{name}-dead"
    _ok(api.post("/v1/queues.create", {"queue_name": dead, "lease_timeout": "30s", "expire_timeout": "1h"}))
    queue = {"queue_name": name, "lease_timeout": "30s", "expire_timeout": "1h", "max_attempts": 3}
    _ok(api.post("/v1/queues.create", {**queue, "dead_queue": dead}))
    try:
        yield name, dead
    finally:
        for queue in (name, dead):
            api.post("/v1/queues.delete", {"queue_name": queue})


@pytest.mark.skipif(
    os.environ.get("QUERATOR_E2E_IAM", "1") == "0",
    reason="the target does not enforce IAM (LocalStack Community); QUERATOR_E2E_IAM=0",
)
def test_unsigned_requests_are_refused_before_any_function_runs(api: SignedApi) -> None:
    assert api.unsigned().call("GET", "/health").status == 403
    assert api.unsigned().post("/v1/queues.list", {}).status == 403


def test_health_answers_a_signed_request(api: SignedApi) -> None:
    assert api.call("GET", "/health").status == 200


def test_produce_lease_complete_and_retry_into_the_dead_letter_queue(
    api: SignedApi, queues: tuple[str, str]
) -> None:
    name, dead = queues
    # GIVEN two produced items
    _ok(api.post("/v1/queue.produce", {"queue_name": name, "items": [{"utf8": "first"}, {"utf8": "second"}]}))
    # WHEN one consumer leases both
    leased = _ok(
        api.post(
            "/v1/queue.lease",
            {"queue_name": name, "batch_size": 2, "client_id": "e2e", "request_timeout": "5s"},
        )
    )
    items = leased["items"]
    assert [item.get("attempts") for item in items] == [1, 1]
    partition = leased.get("partition", 0)
    first, second = (item["id"] for item in items)
    assert _totals(_ok(api.post("/v1/queue.stats", {"queue_name": name}))) == (2, 2)
    # AND completes the first and sends the second to the dead-letter queue
    _ok(api.post("/v1/queue.complete", {"queue_name": name, "partition": partition, "ids": [first]}))
    _ok(
        api.post(
            "/v1/queue.retry",
            {"queue_name": name, "partition": partition, "items": [{"id": second, "dead": True}]},
        )
    )
    # THEN the queue is empty and the dead-letter queue holds the one item
    assert _totals(_ok(api.post("/v1/queue.stats", {"queue_name": name}))) == (0, 0)
    assert _totals(_ok(api.post("/v1/queue.stats", {"queue_name": dead}))) == (1, 0)
    # AND a stale id is refused
    stale = api.post("/v1/queue.complete", {"queue_name": name, "partition": partition, "ids": [first]})
    assert stale.status == 400


def test_an_oversized_body_is_refused_with_413(api: SignedApi) -> None:
    reply = api.post("/v1/queues.list", {"pivot": "x" * 300_000})
    assert reply.status == 413
