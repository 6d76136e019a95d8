"""The worker against a scripted fake server: it survives lease failures, counts settle failures as
unsettled and lost leases as lost, and raises what a retry cannot fix after a clean stop."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import pytest

from querator.client import QueueNotFoundError, RetryLater
from tests.client.fakeserver import Action, FakeServer, envelope

if TYPE_CHECKING:
    from querator.client import Client, LeasedItem

INFO = Action(body={"queue_name": "q", "lease_timeout": "30s", "expire_timeout": "1h", "max_attempts": 2})
EMPTY = envelope(454, "Nothing to lease before the request timeout")


def _lease(*ids: str, attempts: int = 1) -> Action:
    items = [{"id": i, "attempts": attempts, "bytes": "eA=="} for i in ids]
    return Action(body={"queue_name": "q", "partition": 1, "items": items})


def test_lease_failures_are_backed_off_and_survived(fake: FakeServer, fake_client: Client) -> None:
    fake.on("/v1/queues.info", INFO)
    fake.on("/v1/queue.lease", envelope(500, "Internal error"), Action(drop=True), _lease("a" * 30, "b" * 30))
    handled: list[bytes] = []

    report = fake_client.consume("q", lambda item: handled.append(item.payload), max_items=2, batch_size=5)

    assert handled == [b"x", b"x"]
    assert (report.completed, report.errors, report.stopped_by) == (2, 2, "max_items")
    completes = [seen.json() for seen in fake.seen if seen.plain == "/v1/queue.complete"]
    assert sorted(i for body in completes for i in body["ids"]) == ["a" * 30, "b" * 30]
    assert all(body["partition"] == 1 for body in completes)


def test_settle_failures_are_unsettled_and_stale_ids_lost(fake: FakeServer, fake_client: Client) -> None:
    fake.on("/v1/queues.info", INFO)
    fake.on("/v1/queue.lease", _lease("a" * 30), _lease("b" * 30), then=EMPTY)
    stale = f"Item id is unknown, stale or not leased; 1 id(s) not applied: '{'b' * 30}' (gone)"
    fake.on("/v1/queue.complete", envelope(500, "Internal error"), envelope(400, stale))

    report = fake_client.consume("q", lambda item: None, max_items=2, batch_size=1, concurrency=1)

    assert (report.unsettled, report.lost, report.completed, report.leased) == (1, 1, 0, 2)


def test_a_failure_on_the_last_attempt_counts_as_dead_lettered(fake: FakeServer, fake_client: Client) -> None:
    fake.on("/v1/queues.info", INFO)
    fake.on("/v1/queue.lease", _lease("a" * 30, attempts=2), then=EMPTY)

    def fail(item: LeasedItem) -> None:
        raise RuntimeError("boom")

    report = fake_client.consume("q", fail, max_items=1)

    assert (report.dead_lettered, report.failures) == (1, 1)
    retries = [seen.json() for seen in fake.seen if seen.plain == "/v1/queue.retry"]
    assert len(retries) == 1
    assert retries[0]["items"][0]["id"] == "a" * 30
    assert "retry_in" in retries[0]["items"][0]  # a delay the server counts from its own clock


def test_a_queue_deleted_under_the_worker_stops_it_and_raises(fake: FakeServer, fake_client: Client) -> None:
    fake.on("/v1/queues.info", INFO)
    fake.on("/v1/queue.lease", envelope(400, "Queue does not exist; queue 'q' does not exist"))

    with pytest.raises(QueueNotFoundError):
        fake_client.consume("q", lambda item: None)


def test_a_handler_that_exits_its_thread_still_settles_its_item(
    fake: FakeServer, fake_client: Client
) -> None:
    fake.on("/v1/queues.info", INFO)
    fake.on("/v1/queue.lease", _lease("a" * 30), then=EMPTY)

    def exits(item: LeasedItem) -> None:
        raise SystemExit(3)

    report = fake_client.consume("q", exits, max_items=1)

    assert (report.retried, report.failures, report.stopped_by) == (1, 1, "max_items")


def test_a_handler_sets_its_own_delay_with_retry_later(fake: FakeServer, fake_client: Client) -> None:
    fake.on("/v1/queues.info", INFO)
    fake.on("/v1/queue.lease", _lease("a" * 30), then=EMPTY)

    def later(item: LeasedItem) -> None:
        raise RetryLater(timedelta(minutes=2))

    report = fake_client.consume("q", later, max_items=1)

    assert (report.retried, report.failures) == (1, 1)
    retries = [seen.json() for seen in fake.seen if seen.plain == "/v1/queue.retry"]
    # The reason the server records: RetryLater's own words (here, the default ones).
    assert retries[0]["items"] == [{"id": "a" * 30, "retry_in": "2m0s", "reason": "retry in 2m0s"}]


def test_the_backoff_may_answer_seconds_or_a_duration_string(fake: FakeServer, fake_client: Client) -> None:
    fake.on("/v1/queues.info", INFO)
    fake.on("/v1/queue.lease", _lease("a" * 30), _lease("b" * 30), then=EMPTY)
    answers = iter(["45s", 7.5])

    def fail(item: LeasedItem) -> None:
        raise RuntimeError("boom")

    fake_client.consume("q", fail, max_items=2, batch_size=1, concurrency=1, backoff=lambda _: next(answers))

    retries = [seen.json() for seen in fake.seen if seen.plain == "/v1/queue.retry"]
    assert [body["items"][0]["retry_in"] for body in retries] == ["45s", "7.5s"]


def test_retry_later_refuses_a_negative_delay() -> None:
    with pytest.raises(ValueError, match="0 or more"):
        RetryLater("-1s")
