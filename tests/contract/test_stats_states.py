"""Contract: ``queue.stats`` counts each item in one state (ready, scheduled or leased) after every
call, on every store, whether or not the reaper has passed since a scheduled item came due."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import pytest

from querator.domain.model import NewItem, RetryRequest, StorageItem
from tests.contract.helpers import LEASE, beside, make_queue

if TYPE_CHECKING:
    from querator.service import QueueService
    from querator.testing import FakeClock


def counts(service: QueueService) -> tuple[int, int, int]:
    """(total, total_leased, scheduled) of the queue's one partition, checked to be possible."""
    (stats,) = service.stats("jobs")
    assert 0 <= stats.total_leased <= stats.total, stats
    assert stats.scheduled >= 0, stats
    return stats.total, stats.total_leased, stats.scheduled


def lease_one(service: QueueService) -> str:
    (item,) = service.lease("jobs", batch_size=1, client_id="c", timeout=timedelta(0)).items
    return item.id


@pytest.mark.parametrize("delivery", ["fifo", "fair"])
def test_a_scheduled_item_leased_once_due_counts_as_leased_only(
    service: QueueService, clock: FakeClock, delivery: str
) -> None:
    """Issue 31, point 9: it showed ``total: 0, total_leased: 1, scheduled: 1`` until the reaper."""
    make_queue(service, delivery=delivery)
    service.produce(
        "jobs", [NewItem(payload=b"later", group="g", enqueue_at=clock.now() + timedelta(seconds=5))]
    )
    assert counts(service) == (0, 0, 1)
    clock.advance(timedelta(seconds=10))

    item_id = lease_one(service)

    assert counts(service) == (1, 1, 0)
    # The schedule pass that follows must not take it off the scheduled count a second time.
    service.reap(clock.now(), timedelta(seconds=30))
    assert counts(service) == (1, 1, 0)
    service.complete("jobs", 0, [item_id])
    assert counts(service) == (0, 0, 0)


def test_a_due_scheduled_item_whose_lease_runs_out_is_ready_once(
    service: QueueService, clock: FakeClock
) -> None:
    make_queue(service)
    service.produce("jobs", [NewItem(payload=b"later", enqueue_at=clock.now() + timedelta(seconds=5))])
    clock.advance(timedelta(seconds=10))
    lease_one(service)
    assert counts(service) == (1, 1, 0)
    clock.advance(LEASE + timedelta(seconds=1))

    service.reap(clock.now(), timedelta(seconds=30))  # puts the expired lease back, passes the mark

    assert counts(service) == (1, 0, 0)
    lease_one(service)
    assert counts(service) == (1, 1, 0)


def test_a_leased_item_that_was_scheduled_leaves_no_count_when_deleted_or_retried(
    service: QueueService, clock: FakeClock
) -> None:
    make_queue(service)
    soon = clock.now() + timedelta(seconds=5)
    service.produce(
        "jobs", [NewItem(payload=b"one", enqueue_at=soon), NewItem(payload=b"two", enqueue_at=soon)]
    )
    clock.advance(timedelta(seconds=10))
    first, second = lease_one(service), lease_one(service)
    assert counts(service) == (2, 2, 0)

    service.delete_items("jobs", 0, [first])
    assert counts(service) == (1, 1, 0)
    service.retry("jobs", 0, [RetryRequest(id=second, retry_at=clock.now() + timedelta(seconds=5))])
    assert counts(service) == (0, 0, 1)  # scheduled again, under a new id

    clock.advance(timedelta(seconds=10))
    lease_one(service)
    assert counts(service) == (1, 1, 0)
    service.reap(clock.now(), timedelta(seconds=30))
    assert counts(service) == (1, 1, 0)


def test_an_imported_lease_on_a_scheduled_item_counts_as_leased_only(
    service: QueueService, clock: FakeClock
) -> None:
    make_queue(service)
    later = clock.now() + timedelta(minutes=5)
    service.import_items(
        "jobs", 0, [StorageItem(payload=b"held", enqueue_at=later, lease_deadline=clock.now() + LEASE)]
    )

    assert counts(service) == (1, 1, 0)


@pytest.mark.engine(2)  # engine v2's recount (v3's logs keep no counters to recount)
def test_the_recount_counts_each_item_in_one_state_too(service: QueueService, clock: FakeClock) -> None:
    make_queue(service)
    service.produce("jobs", [NewItem(payload=b"later", enqueue_at=clock.now() + timedelta(seconds=5))])
    clock.advance(timedelta(seconds=10))
    lease_one(service)

    # A recount replaces the counters with what it finds: the leased item is not scheduled.
    report = beside(service, clock, recount_period=timedelta(0)).reap(clock.now(), timedelta(seconds=30))

    assert report.recounted == 1
    assert counts(service) == (1, 1, 0)
