"""Contract: ``queue.stats`` counts the items produced and completed ever, on every store, for the
produce and complete rates the console draws; a recount leaves them alone."""

from __future__ import annotations

from datetime import timedelta

import pytest

from querator.domain.model import NewItem, RetryRequest, StorageItem
from tests.contract.helpers import LEASE, make_queue


def totals(service, queue):
    stats = service.stats(queue)
    return sum(s.produced for s in stats), sum(s.completed for s in stats)


def test_produce_and_import_count_as_produced_and_only_complete_counts_as_completed(service, clock):
    make_queue(service, "dlq")
    make_queue(service, "jobs", dead_queue="dlq", max_attempts=3)
    service.produce("jobs", [NewItem(payload=str(n).encode()) for n in range(5)])
    service.import_items("jobs", 0, [StorageItem(payload=b"imported")])

    leased = service.lease("jobs", batch_size=6, client_id="c", timeout=timedelta(0))
    a, b, c, d, e, _f = (item.id for item in leased.items)
    service.complete("jobs", leased.partition, [a, b])
    service.complete("jobs", leased.partition, [a])  # completed already: not counted twice
    service.retry("jobs", leased.partition, [RetryRequest(id=c), RetryRequest(id=d, dead=True)])
    service.delete_items("jobs", leased.partition, [e])
    clock.advance(LEASE + timedelta(seconds=1))  # f's lease runs out: back to the queue, not completed
    again = service.lease("jobs", batch_size=10, client_id="c", timeout=timedelta(0))

    assert len(again.items) == 2  # c (retried) and f (expired)
    assert totals(service, "jobs") == (6, 2)
    assert totals(service, "dlq") == (0, 0)  # a dead letter is moved, not produced


@pytest.mark.engine(2)  # engine v2's recount (v3's logs keep no counters to recount)
def test_the_daily_recount_leaves_the_cumulative_counts_alone(service, clock):
    make_queue(service, lease_timeout=timedelta(hours=30), expire_timeout=timedelta(hours=48))
    service.produce("jobs", [NewItem(payload=b"p") for _ in range(4)])
    leased = service.lease("jobs", batch_size=2, client_id="c", timeout=timedelta(0))
    service.complete("jobs", leased.partition, [i.id for i in leased.items])

    clock.advance(timedelta(hours=25))
    report = service.reap(clock.now(), timedelta(seconds=30))

    assert report.recounted == 1
    assert totals(service, "jobs") == (4, 2)
    assert [s.total for s in service.stats("jobs")] == [2]
