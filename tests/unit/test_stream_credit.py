"""A stream connection never holds more items than its credit, whatever the API answers a settle.

``StreamSession`` acts through the HTTP API's routes (``api(path, body)``); here a fake API answers
as the real one does (the per-id failure's message is made by the API's own ``failed_ids_error``)
and a fake clock moves the leases' deadlines. "Held" is what the session leased and has not seen
settled; the rule under test: after any answer, held + credit never exceeds what the consumer gave,
and an item still leased to the consumer is never counted as given back.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from querator.api.durations import format_timestamp
from querator.api.errors import error_response, failed_ids_error
from querator.domain.errors import (
    InvalidRequestError,
    QueueNotFoundError,
    RetryLaterError,
    StoreUnavailableError,
)
from querator.domain.model import IdFailure
from querator.stream import protocol
from querator.stream.session import StreamSession, failed_ids, settlement
from querator.testing import FakeClock

QUEUE = "jobs"
START = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)


def refused(error: Exception) -> tuple[int, dict[str, Any]]:
    """What the API answers for ``error`` (status and envelope, as over HTTP)."""
    response = error_response(error)
    return response.status, response.body


def some_failed(failed: list[str], *, applied: int) -> tuple[int, dict[str, Any]]:
    return refused(failed_ids_error([IdFailure(id=i, reason="not leased") for i in failed], applied=applied))


class FakeApi:
    """``queue.lease`` hands out items from a pool; settles answer what the test scripted next."""

    def __init__(self, clock: FakeClock, *, waiting: int = 10, lease_timeout: str = "30s") -> None:
        self.clock = clock
        self.waiting = [f"{n:030x}" for n in range(1, waiting + 1)]
        self.lease_timeout = lease_timeout
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.answer: tuple[int, dict[str, Any]] = (200, {})

    def __call__(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.calls.append((path, body))
        if path == "/v1/queues.info":
            if body["queue_name"] != QUEUE:
                return refused(QueueNotFoundError(f"queue '{body['queue_name']}' does not exist"))
            return 200, {"queue_name": QUEUE, "lease_timeout": self.lease_timeout}
        if path == "/v1/queue.lease":
            taken, self.waiting = self.waiting[: body["batch_size"]], self.waiting[body["batch_size"] :]
            if not taken:
                return refused(RetryLaterError("nothing to lease"))
            deadline = format_timestamp(self.clock.now() + LEASE)
            return 200, {
                "queue_name": QUEUE,
                "partition": 0,
                "items": [{"id": i, "attempts": 1, "lease_deadline": deadline, "bytes": ""} for i in taken],
            }
        return self.answer

    def leases(self) -> int:
        return sum(1 for path, _ in self.calls if path == "/v1/queue.lease")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def api(clock: FakeClock) -> FakeApi:
    return FakeApi(clock)


def subscribed(api: FakeApi, clock: FakeClock, credit: int = 2) -> tuple[StreamSession, list[str]]:
    """A session subscribed with ``credit`` that was pushed ``credit`` items; those ids."""
    session = StreamSession(api, now=clock.now)
    [answer] = session.receive(json.dumps({"type": "subscribe", "queue_name": QUEUE, "credit": credit}))
    assert json.loads(answer)["type"] == "subscribed"
    [lease] = session.pump()
    ids = [item["id"] for item in json.loads(lease)["items"]]
    assert len(ids) == credit
    return session, ids


def send(session: StreamSession, verb: str, **fields: Any) -> dict[str, Any]:
    [answer] = session.receive(json.dumps({"type": verb, "request_id": "r", "partition": 0, **fields}))
    reply: dict[str, Any] = json.loads(answer)
    return reply


@pytest.mark.parametrize(
    ("verb", "fields", "error"),
    [
        # The partition does not exist: refused whole (a 400 that is not a per-id failure).
        ("complete", {"partition": 7}, InvalidRequestError("partition 7 does not exist")),
        ("retry", {}, InvalidRequestError("retry_at must be in the future")),
        ("renew", {"lease_timeout": "2h"}, InvalidRequestError("lease_timeout may not be longer")),
    ],
)
def test_a_refused_call_returns_no_credit(
    api: FakeApi, clock: FakeClock, verb: str, fields: dict[str, Any], error: Exception
) -> None:
    session, ids = subscribed(api, clock)
    api.answer = refused(error)
    body = {"items": [{"id": i} for i in ids]} if verb == "retry" else {"ids": ids}
    reply = send(session, verb, **{**body, **fields})

    assert reply["type"] == "error" and reply["code"] == 400
    assert (session.credit, sorted(session.held)) == (0, sorted(ids))
    # Nothing more is pushed: the consumer still holds both items.
    assert session.pump() == []
    assert api.leases() == 1
    # Their credit comes back when their leases run out (the items go back to the queue).
    clock.advance(LEASE)
    [lease] = session.pump()
    assert len(json.loads(lease)["items"]) == 2


@pytest.mark.parametrize("verb", ["complete", "retry"])
def test_a_per_id_failure_returns_the_credit_of_the_applied_ids_only(
    api: FakeApi, clock: FakeClock, verb: str
) -> None:
    session, (applied, failed) = subscribed(api, clock)
    api.answer = some_failed([failed], applied=1)
    body = {"items": [{"id": applied}, {"id": failed}]} if verb == "retry" else {"ids": [applied, failed]}
    reply = send(session, verb, **body)

    assert reply["type"] == "error" and reply["code"] == 400
    # The failed id may still be leased to this consumer (it named the wrong partition): held.
    assert (session.credit, list(session.held)) == (1, [failed])
    [lease] = session.pump()
    assert len(json.loads(lease)["items"]) == 1
    assert (session.credit, len(session.held)) == (0, 2)


def test_a_complete_naming_another_existing_partition_returns_nothing(api: FakeApi, clock: FakeClock) -> None:
    # In a queue of two partitions, partition 1 exists, but these items are leased in 0: every id
    # fails ("not leased" there), and each is still leased to the consumer.
    session, ids = subscribed(api, clock)
    api.answer = some_failed(ids, applied=0)
    send(session, "complete", partition=1, ids=ids)

    assert (session.credit, sorted(session.held)) == (0, sorted(ids))
    assert session.pump() == []


def test_a_server_error_on_a_settle_keeps_the_items_held_until_their_deadline(
    api: FakeApi, clock: FakeClock
) -> None:
    session, ids = subscribed(api, clock)
    api.answer = refused(StoreUnavailableError("the store is down"))
    assert send(session, "complete", ids=ids)["code"] == 500

    assert (session.credit, sorted(session.held)) == (0, sorted(ids))
    clock.advance(LEASE - timedelta(seconds=1))
    assert session.pump() == []
    clock.advance(timedelta(seconds=1))
    assert len(json.loads(session.pump()[0])["items"]) == 2


def test_a_settle_that_succeeds_returns_every_id(api: FakeApi, clock: FakeClock) -> None:
    session, ids = subscribed(api, clock)
    api.answer = (200, {})
    assert send(session, "complete", ids=ids)["type"] == "ok"
    assert (session.credit, session.held) == (2, {})


def test_renewed_deadlines_count_when_a_renew_names_one_bad_id(api: FakeApi, clock: FakeClock) -> None:
    session, ids = subscribed(api, clock)
    clock.advance(timedelta(seconds=20))
    api.answer = some_failed(["ffffffffffffffffffffffffffffff"], applied=2)
    reply = send(session, "renew", ids=[*ids, "ffffffffffffffffffffffffffffff"], lease_timeout="5m")

    assert reply["type"] == "error" and reply["code"] == 400
    # The store set now + 5m; the session's deadline is read after the call, so never earlier.
    assert all(session.held[i] >= START + timedelta(seconds=20) + timedelta(minutes=5) for i in ids)
    # At the old deadline nothing comes back, and nothing more is pushed.
    clock.advance(LEASE)
    assert session.pump() == []
    assert (session.credit, len(session.held)) == (0, 2)
    clock.advance(timedelta(minutes=5))
    assert len(json.loads(session.pump()[0])["items"]) == 2


def test_a_partly_refused_renew_without_a_timeout_uses_the_queues_lease_timeout(
    api: FakeApi, clock: FakeClock
) -> None:
    api.lease_timeout = "2m"
    session, ids = subscribed(api, clock)
    api.answer = some_failed([ids[1]], applied=1)
    send(session, "renew", ids=ids)

    # Re-read (the queue may have been updated since the subscribe): one queues.info.
    assert [path for path, _ in api.calls].count("/v1/queues.info") == 2
    assert session.held[ids[0]] == START + timedelta(minutes=2)
    # The failed id keeps its deadline (its lease ran out, or is not this partition's).
    assert session.held[ids[1]] == START + LEASE
    clock.advance(LEASE)
    [lease] = session.pump()
    assert len(json.loads(lease)["items"]) == 1
    assert ids[0] in session.held


def test_a_renew_answered_200_takes_the_deadlines_of_the_reply(api: FakeApi, clock: FakeClock) -> None:
    session, ids = subscribed(api, clock)
    later = START + timedelta(minutes=10)
    api.answer = (200, {"items": [{"id": i, "lease_deadline": format_timestamp(later)} for i in ids]})
    send(session, "renew", ids=ids, lease_timeout="10m")
    assert all(session.held[i] == later for i in ids)


def test_a_renew_that_failed_on_the_server_counts_the_later_deadline(api: FakeApi, clock: FakeClock) -> None:
    # A 500 may have renewed some or none: the later of the two deadlines is the safe one.
    session, ids = subscribed(api, clock)
    api.answer = refused(StoreUnavailableError("the store is down"))
    send(session, "renew", ids=ids, lease_timeout="1m")
    assert all(session.held[i] == START + timedelta(minutes=1) for i in ids)
    send(session, "renew", ids=ids, lease_timeout="1s")
    assert all(session.held[i] == START + timedelta(minutes=1) for i in ids)


def test_failed_ids_are_read_only_when_the_list_is_whole() -> None:
    assert failed_ids(*some_failed(["a", "b"], applied=3), ["a", "b", "c"]) == {"a", "b"}
    assert failed_ids(*refused(InvalidRequestError("bad")), ["a"]) is None
    # An id holding a quote could make the list name anything: not read.
    assert failed_ids(*some_failed(["x' (", "b"], applied=1), ["a", "b", "x' ("]) is None
    # A malformed id's reason names it again: still read right.
    malformed = refused(
        failed_ids_error([IdFailure(id="nope", reason="'nope' is not an item id")], applied=1)
    )
    assert failed_ids(*malformed, ["a", "nope"]) == {"nope"}


def test_an_unreadable_per_id_failure_releases_nothing_and_renews_everything(clock: FakeClock) -> None:
    held = {"a": START + LEASE, "b": START + LEASE}
    answer = some_failed(["x' (", "b"], applied=1)
    call = protocol.parse(json.dumps({"type": "complete", "ids": ["a", "b", "x' ("]}))
    assert isinstance(call, protocol.Call)
    nothing = settlement(call, *answer, held, lease_timeout=lambda: LEASE, now=clock.now)
    assert nothing.released == ()
    renew = protocol.parse(json.dumps({"type": "renew", "ids": ["a", "b", "x' ("], "lease_timeout": "1m"}))
    assert isinstance(renew, protocol.Call)
    renewed = settlement(renew, *answer, held, lease_timeout=lambda: LEASE, now=clock.now)
    # Renewed or not is unknown: each gets the later deadline, now + 1m.
    assert renewed.renewed == {"a": START + timedelta(minutes=1), "b": START + timedelta(minutes=1)}


def test_subscribing_to_an_unknown_queue_is_refused_before_subscribed(api: FakeApi, clock: FakeClock) -> None:
    session = StreamSession(api, now=clock.now)
    [answer] = session.receive(json.dumps({"type": "subscribe", "queue_name": "nowhere", "credit": 1}))
    assert json.loads(answer)["code"] == 400
    assert json.loads(answer)["message"].startswith("Queue does not exist")
    assert not session.subscribed
    assert api.calls == [("/v1/queues.info", {"queue_name": "nowhere"})]
