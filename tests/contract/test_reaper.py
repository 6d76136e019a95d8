"""Contract: the reaper dead-letters what nobody else would, within its time budget, and resumes."""

from __future__ import annotations

from datetime import timedelta

import pytest

from querator.domain.errors import NothingToLeaseError
from querator.domain.model import QueueUpdate, RetryRequest
from querator.testing import FakeClock
from tests.contract.helpers import LEASE, beside, items, make_queue, payloads


def test_reaper_dead_letters_expired_and_exhausted_items_and_keeps_valid_leases(service, clock):
    make_queue(service, "dlq")
    make_queue(
        service,
        dead_queue="dlq",
        max_attempts=1,
        lease_timeout=timedelta(minutes=1),
        expire_timeout=timedelta(minutes=10),
    )
    make_queue(service, "plain", expire_timeout=timedelta(minutes=10))
    service.produce("jobs", items("exhausted", "held", "expired"))
    service.produce("plain", items("deleted"))
    exhausted, held = service.lease("jobs", batch_size=2, client_id="c").items
    # Renewed as a consumer does, each time for at most expire_timeout, past the item's expiry.
    service.renew("jobs", 0, [held.id], lease_timeout=timedelta(minutes=10))
    clock.advance(timedelta(minutes=2))  # the lease of "exhausted" ran out with its one attempt used

    first = service.reap(clock.now(), timedelta(seconds=30))
    service.renew("jobs", 0, [held.id], lease_timeout=timedelta(minutes=10))
    clock.advance(timedelta(minutes=9))  # everything is past expire_timeout; "held" is still leased
    second = service.reap(clock.now(), timedelta(seconds=30))

    assert first.finished and second.finished
    assert (first.dead_lettered, first.deleted, first.counts_by_reason) == (1, 0, {"max_attempts": 1})
    assert (second.dead_lettered, second.deleted, second.counts_by_reason) == (1, 1, {"expired": 2})
    dead = service.list_items("dlq", 0)
    assert payloads(dead) == [b"exhausted", b"expired"]
    assert dead[0].source_id == exhausted.id
    assert service.list_items("plain", 0) == []
    assert [i.id for i in service.list_items("jobs", 0)] == [held.id]  # a valid lease is never taken


def test_reaper_puts_expired_leases_with_attempts_left_back_at_the_tail(service, clock):
    make_queue(service, max_attempts=5)
    service.produce("jobs", items("a"))
    held = service.lease("jobs", batch_size=1, client_id="c").items[0]
    clock.advance(LEASE)

    report = service.reap(clock.now(), timedelta(seconds=30))

    assert report.dead_lettered == report.deleted == 0
    assert (report.recovered, report.requeued) == (1, 1)
    (back,) = service.list_items("jobs", 0)
    assert back.id != held.id and back.payload == b"a" and back.attempts == 1
    assert back.lease_deadline is None


class TickingClock(FakeClock):
    """Every reading of the clock costs a second: a reaper with a small budget stops early."""

    def now(self):
        return self.advance(timedelta(seconds=1))


def test_reaper_stops_when_its_budget_is_spent_and_resumes_where_it_stopped(service, clock):
    make_queue(service, "a", expire_timeout=timedelta(minutes=1), partitions=2)
    make_queue(service, "b", expire_timeout=timedelta(minutes=1))
    for queue in ("a", "a", "b"):
        service.produce(queue, items("x"))
    clock.advance(timedelta(minutes=2))
    service = beside(service, TickingClock(clock.now()))

    runs = []
    while not runs or not runs[-1].finished:
        runs.append(service.reap(clock.now(), timedelta(seconds=1)))
        assert len(runs) < 10, "the reaper must make progress between runs"

    assert len(runs) > 1
    assert sum(r.deleted for r in runs) == 3
    assert all(sum(s.total for s in service.stats(q)) == 0 for q in ("a", "b"))


def test_reaper_finishes_an_interrupted_queue_delete(service, clock):
    make_queue(service, "gone", partitions=2)
    service.produce("gone", items("x"))
    service.catalog.mark_deleting("gone")  # as if the delete request died after marking

    report = service.reap(clock.now(), timedelta(seconds=30))

    assert report.queues_deleted == 1
    assert [q.name for q in service.list_queues()] == []


def test_partitions_added_by_update_are_leased_and_produced_to(service):
    make_queue(service)
    service.update_queue(QueueUpdate(name="jobs", partitions=3))
    receipts = [service.produce("jobs", items("x")) for _ in range(3)]
    assert {r.partition for r in receipts} == {0, 1, 2}


def test_the_oldest_item_age_is_of_source_queues_and_dead_letters_count_as_depth(service, clock):
    make_queue(service, "dlq", expire_timeout=timedelta(days=7))
    make_queue(
        service, dead_queue="dlq", lease_timeout=timedelta(minutes=1), expire_timeout=timedelta(hours=2)
    )
    service.produce("jobs", items("old"))
    service.retry(
        "jobs",
        0,
        [RetryRequest(id=service.lease("jobs", batch_size=1, client_id="c").items[0].id, dead=True)],
    )
    clock.advance(timedelta(hours=1))  # the dead letter is an hour old
    service.produce("jobs", items("fresh"))
    clock.advance(timedelta(minutes=5))

    report = service.reap(clock.now(), timedelta(seconds=30))

    assert report.oldest_item_age == timedelta(minutes=5)  # "fresh"; not the hour-old dead letter
    assert report.oldest_item_queue == "jobs"
    assert report.dead_letter_depth == 1


@pytest.mark.parametrize("by", ["reaper", "lease"])
def test_an_item_dead_lettered_for_its_age_keeps_its_attempts(service, clock, by):
    # GIVEN "retried" and "ran out", leased once each (one retried, one whose lease ran out), and
    #       "never", never leased, then all of them past expire_timeout
    make_queue(service, "dlq")
    make_queue(
        service, dead_queue="dlq", lease_timeout=timedelta(minutes=1), expire_timeout=timedelta(minutes=10)
    )
    service.produce("jobs", items("retried", "ran out"))
    retried, _ = service.lease("jobs", batch_size=2, client_id="c").items
    service.retry("jobs", 0, [RetryRequest(id=retried.id)])
    service.produce("jobs", items("never"))
    clock.advance(timedelta(minutes=11))

    # WHEN the reaper, or a lease, meets them
    if by == "reaper":
        service.reap(clock.now(), timedelta(seconds=30))
    else:
        with pytest.raises(NothingToLeaseError):
            service.lease("jobs", batch_size=10, client_id="c")

    # THEN each arrives with the leases it had: taking it off the queue is no lease of it
    letters = {item.payload: item.attempts for item in service.list_items("dlq", 0)}
    assert letters == {b"never": 0, b"retried": 1, b"ran out": 1}
