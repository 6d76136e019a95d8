"""Contract: failure reasons on every store, on the engine the suite runs on (``QUERATOR_TEST_ENGINE``).

An item keeps why it last failed (``last_reason``) and how many failures it had (``failures``)
through retries and into the dead-letter queue, with its source queue; ``queue.retry`` records the
consumer's reason, and the service its own: a lease that ran out (found by the next lease or by the
reaper), ``max_attempts`` and ``expire_timeout`` (``querator.domain.reasons``).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from querator.domain.errors import InvalidRequestError, NothingToLeaseError
from querator.domain.model import MAX_REASON_BYTES, RetryRequest, StorageItem
from querator.service.logs import is_log_id
from tests.contract.helpers import LEASE, items, make_queue, payloads
from tests.contract.test_engine_v3_service import services, store_name  # noqa: F401 - fixtures

REAP = timedelta(seconds=30)


def lease_one(service, queue: str = "jobs"):
    (item,) = service.lease(queue, batch_size=1, client_id="c").items
    return item


def failures(found) -> list[tuple[bytes, str, int]]:
    return [(i.payload, i.last_reason, i.failures) for i in found]


def test_an_item_that_never_failed_has_no_reason(service):
    make_queue(service)
    service.produce("jobs", items("fine"))

    leased = lease_one(service)

    assert (leased.last_reason, leased.failures) == ("", 0)
    assert failures(service.list_items("jobs", 0)) == [(b"fine", "", 0)]


def test_the_consumers_reason_is_kept_through_retries_the_last_one_wins_and_the_count_grows(service, clock):
    make_queue(service)
    service.produce("jobs", items("a"))

    first = lease_one(service)
    assert service.retry("jobs", 0, [RetryRequest(id=first.id, reason="TimeoutError: db")]).failed == []
    # Waiting: the listing shows it; leased again: the lease does.
    assert failures(service.list_items("jobs", 0)) == [(b"a", "TimeoutError: db", 1)]
    second = lease_one(service)
    assert (second.last_reason, second.failures, second.attempts) == ("TimeoutError: db", 1, 2)
    service.retry(
        "jobs", 0, [RetryRequest(id=second.id, retry_in=timedelta(minutes=1), reason="ValueError: x")]
    )
    assert failures(service.list_scheduled("jobs", 0)) == [(b"a", "ValueError: x", 2)]
    clock.advance(timedelta(minutes=1))
    third = lease_one(service)
    assert (third.last_reason, third.failures) == ("ValueError: x", 2)
    # A retry without a reason (an item put back unprocessed) records nothing.
    service.retry("jobs", 0, [RetryRequest(id=third.id)])
    fourth = lease_one(service)
    assert (fourth.last_reason, fourth.failures, fourth.attempts) == ("ValueError: x", 2, 4)


def test_a_retry_with_another_priority_keeps_the_reason_too(service):
    make_queue(service)
    service.produce("jobs", items("a"))

    service.retry("jobs", 0, [RetryRequest(id=lease_one(service).id, priority=1, reason="later")])

    again = lease_one(service)
    assert (again.priority, again.last_reason, again.failures) == (1, "later", 1)


def test_a_dead_letter_keeps_its_reason_its_count_and_its_source_queue(service):
    make_queue(service, "dlq")
    make_queue(service, dead_queue="dlq")
    service.produce("jobs", items("poison"))
    service.retry("jobs", 0, [RetryRequest(id=lease_one(service).id, reason="KeyError: 'x'")])
    held = lease_one(service)

    service.retry("jobs", 0, [RetryRequest(id=held.id, dead=True, reason="cannot handle it")])

    (dead,) = service.list_items("dlq", 0)
    assert (dead.last_reason, dead.failures, dead.source_queue, dead.source_id) == (
        "cannot handle it",
        2,
        "jobs",
        held.id,
    )
    leased = lease_one(service, "dlq")  # an operator inspecting it sees it too
    assert (leased.last_reason, leased.failures) == ("cannot handle it", 2)


def test_a_dead_letter_without_a_reason_keeps_the_one_it_had(service):
    make_queue(service, "dlq")
    make_queue(service, dead_queue="dlq")
    service.produce("jobs", items("a", "b"))
    failed, fine = service.lease("jobs", batch_size=2, client_id="c").items
    service.retry("jobs", 0, [RetryRequest(id=failed.id, reason="boom")])
    again = lease_one(service)

    service.retry("jobs", 0, [RetryRequest(id=again.id, dead=True), RetryRequest(id=fine.id, dead=True)])

    assert sorted(failures(service.list_items("dlq", 0))) == [(b"a", "boom", 1), (b"b", "", 0)]


def test_a_lease_that_ran_out_is_recorded_when_the_next_lease_finds_it(service, clock):
    make_queue(service)
    service.produce("jobs", items("slow"))
    service.retry("jobs", 0, [RetryRequest(id=lease_one(service).id, reason="first")])
    lease_one(service)
    clock.advance(LEASE)

    again = lease_one(service)

    assert (again.last_reason, again.failures, again.attempts) == ("lease ran out", 2, 3)


def test_a_lease_that_ran_out_is_recorded_when_the_reaper_puts_it_back(service, clock):
    make_queue(service, max_attempts=5)
    service.produce("jobs", items("slow"))
    lease_one(service)
    clock.advance(LEASE)

    report = service.reap(clock.now(), REAP)

    assert report.requeued == 1
    assert failures(service.list_items("jobs", 0)) == [(b"slow", "lease ran out", 1)]


def test_a_lease_that_ran_out_is_recorded_when_reprioritize_moves_it(service, clock):
    """A lease that ran out and that nothing put back yet: ``queue.reprioritize`` moves the item, and
    records the failure as the next lease or the reaper would have (the outcome may not depend on
    which comes first)."""
    make_queue(service, max_attempts=5)
    service.produce("jobs", items("slow"))
    service.retry("jobs", 0, [RetryRequest(id=lease_one(service).id, reason="first")])
    held = lease_one(service)
    clock.advance(LEASE + timedelta(milliseconds=30))

    moved = service.reprioritize("jobs", 0, [held.id], 0)

    assert moved.failed == [] and moved.ids[held.id] != held.id
    assert failures(service.list_items("jobs", 0)) == [(b"slow", "lease ran out", 2)]
    again = lease_one(service)
    assert (again.priority, again.last_reason, again.failures, again.attempts) == (0, "lease ran out", 2, 3)


@pytest.mark.parametrize(
    ("limits", "reason"),
    [
        ({"max_attempts": 1}, "max attempts: lease ran out"),
        ({"expire_timeout": LEASE}, "expired: lease ran out"),
    ],
)
def test_a_lease_that_ran_out_on_its_last_chance_is_dead_lettered_by_reprioritize_as_by_expiry(
    service, clock, limits, reason
):
    make_queue(service, "dlq")
    make_queue(service, dead_queue="dlq", **limits)
    service.produce("jobs", items("slow"))
    held = lease_one(service)
    clock.advance(LEASE + timedelta(milliseconds=30))

    moved = service.reprioritize("jobs", 0, [held.id], 0)

    assert [f.id for f in moved.failed] == [held.id] and moved.ids == {}
    assert service.list_items("jobs", 0) == []
    assert failures(service.list_items("dlq", 0)) == [(b"slow", reason, 1)]


def test_max_attempts_dead_letters_with_the_consumers_last_reason(service):
    make_queue(service, "dlq")
    make_queue(service, dead_queue="dlq", max_attempts=2)
    service.produce("jobs", items("a"))
    service.retry("jobs", 0, [RetryRequest(id=lease_one(service).id, reason="first")])

    service.retry("jobs", 0, [RetryRequest(id=lease_one(service).id, reason="ValueError: second")])

    assert failures(service.list_items("dlq", 0)) == [(b"a", "max attempts: ValueError: second", 2)]
    assert service.list_items("dlq", 0)[0].source_queue == "jobs"


@pytest.mark.parametrize("found_by", ["lease", "reaper"])
def test_max_attempts_after_a_lease_ran_out_says_so(service, clock, found_by):
    make_queue(service, "dlq")
    make_queue(service, dead_queue="dlq", max_attempts=1)
    service.produce("jobs", items("slow"))
    lease_one(service)
    clock.advance(LEASE)

    if found_by == "lease":
        with pytest.raises(NothingToLeaseError):
            service.lease("jobs", batch_size=1, client_id="c")
    else:
        assert service.reap(clock.now(), REAP).dead_lettered == 1

    assert failures(service.list_items("dlq", 0)) == [(b"slow", "max attempts: lease ran out", 1)]


@pytest.mark.parametrize("found_by", ["lease", "reaper"])
def test_an_expired_item_is_dead_lettered_as_expired_with_its_last_reason(service, clock, found_by):
    make_queue(service, "dlq")
    make_queue(service, dead_queue="dlq", expire_timeout=timedelta(minutes=10))
    service.produce("jobs", items("failed", "waited"))
    failed, waited = service.lease("jobs", batch_size=2, client_id="c").items
    service.retry("jobs", 0, [RetryRequest(id=failed.id, reason="db down"), RetryRequest(id=waited.id)])
    clock.advance(timedelta(minutes=10))

    if found_by == "lease":
        with pytest.raises(NothingToLeaseError):
            service.lease("jobs", batch_size=10, client_id="c")
    else:
        assert service.reap(clock.now(), REAP).dead_lettered == 2

    assert sorted(failures(service.list_items("dlq", 0))) == [
        (b"failed", "expired: db down", 2),
        (b"waited", "expired", 1),
    ]


def test_an_item_whose_lease_ran_out_past_its_expiry_is_expired_after_its_lease(service, clock):
    make_queue(service, "dlq")
    make_queue(
        service, dead_queue="dlq", lease_timeout=timedelta(minutes=1), expire_timeout=timedelta(minutes=1)
    )
    service.produce("jobs", items("late"))
    lease_one(service)
    clock.advance(timedelta(minutes=2))

    assert service.reap(clock.now(), REAP).dead_lettered == 1

    assert failures(service.list_items("dlq", 0)) == [(b"late", "expired: lease ran out", 1)]


def test_a_too_long_reason_is_refused_and_nothing_is_lost(service):
    make_queue(service)
    service.produce("jobs", items("a", "b"))
    first, second = service.lease("jobs", batch_size=2, client_id="c").items

    with pytest.raises(InvalidRequestError, match="reason is longer than 1024 bytes") as refused:
        service.retry(
            "jobs",
            0,
            [
                RetryRequest(id=first.id, reason="fine"),
                RetryRequest(id=second.id, reason="x" * (MAX_REASON_BYTES + 1)),
            ],
        )

    assert refused.value.context["field"] == "reason"
    # Both are still leased under their ids, and their next retry applies.
    assert all(
        i.is_leased(first.lease_deadline - timedelta(seconds=1)) for i in service.list_items("jobs", 0)
    )
    assert service.retry("jobs", 0, [RetryRequest(id=first.id, reason="x" * MAX_REASON_BYTES)]).failed == []
    assert service.complete("jobs", 0, [second.id]).failed == []
    assert failures(service.list_items("jobs", 0)) == [(b"a", "x" * MAX_REASON_BYTES, 1)]


def test_a_lease_given_back_records_no_failure(service):
    make_queue(service)
    service.produce("jobs", items("a"))
    service.retry("jobs", 0, [RetryRequest(id=lease_one(service).id, reason="boom")])
    held = lease_one(service)

    assert service.give_back("jobs", 0, [held.id]) == 1

    again = lease_one(service)
    assert (again.last_reason, again.failures, again.attempts) == ("boom", 1, 2)


def test_redrive_keeps_the_reasons_and_import_takes_them(service):
    make_queue(service, "dlq")
    make_queue(service, dead_queue="dlq")
    service.produce("jobs", items("a"))
    service.retry("jobs", 0, [RetryRequest(id=lease_one(service).id, dead=True, reason="poison")])

    assert service.redrive("dlq").moved == 1

    assert failures(service.list_items("jobs", 0)) == [(b"a", "poison", 1)]
    (back,) = service.list_items("jobs", 0)
    assert (back.attempts, back.source_queue) == (0, "")
    # A listing imported again (another queue, a backup) keeps what it said.
    make_queue(service, "copy")
    service.import_items(
        "copy",
        0,
        [StorageItem(payload=b"c", source_queue="jobs", last_reason="poison", failures=4, source_id=back.id)],
    )
    (copied,) = service.list_items("copy", 0)
    assert (copied.source_queue, copied.last_reason, copied.failures) == ("jobs", "poison", 4)


def test_reasons_are_kept_per_item_in_a_batch(service):
    make_queue(service, "dlq")
    make_queue(service, dead_queue="dlq", max_attempts=1)
    service.produce("jobs", items(*(f"item-{n}" for n in range(5))))
    leased = service.lease("jobs", batch_size=5, client_id="c").items

    service.retry("jobs", 0, [RetryRequest(id=i.id, reason=f"error {n}") for n, i in enumerate(leased)])

    assert sorted(failures(service.list_items("dlq", 0))) == [
        (f"item-{n}".encode(), f"max attempts: error {n}", 1) for n in range(5)
    ]
    assert payloads(sorted(service.list_items("dlq", 0), key=lambda i: i.payload))[0] == b"item-0"


def test_a_v2_item_leased_before_the_upgrade_is_retried_within_v2s_rows_with_its_reason(services, clock):  # noqa: F811
    v2, v3 = services
    make_queue(v2, "dlq")
    make_queue(v2, dead_queue="dlq", max_attempts=2)
    v2.produce("jobs", items("old", "older"))
    held, other = v2.lease("jobs", batch_size=2, client_id="c").items

    assert v3.retry("jobs", 0, [RetryRequest(id=held.id, reason="first try")]).failed == []
    assert v3.retry("jobs", 0, [RetryRequest(id=other.id, dead=True, reason="bad")]).failed == []

    (waiting,) = v3.list_items("jobs", 0)
    assert (waiting.last_reason, waiting.failures) == ("first try", 1)
    assert not is_log_id(waiting.id)  # it stays in v2's rows
    again = lease_one(v3)
    assert (again.id, again.last_reason) == (waiting.id, "first try")
    v3.retry("jobs", 0, [RetryRequest(id=again.id, reason="second try")])
    assert sorted(failures(v3.list_items("dlq", 0))) == [
        (b"old", "max attempts: second try", 2),
        (b"older", "bad", 1),
    ]
