"""Contract: stats, clear, storage list / scheduled list paging, import and delete."""

from __future__ import annotations

from datetime import timedelta

import pytest

from querator.domain.errors import InvalidRequestError
from querator.domain.model import ClearScope, StorageItem
from tests.contract.helpers import items, make_queue, payloads


def lease_ids(service, batch):
    return [i.id for i in service.lease("jobs", batch_size=batch, client_id="c").items]


def test_stats_count_queued_leased_and_scheduled_items_with_their_ages(service, clock):
    make_queue(service, partitions=2)
    service.produce("jobs", items("a", "b", "c"))  # partition chosen by the service
    clock.advance(timedelta(seconds=10))
    service.produce("jobs", items("later", enqueue_at=clock.now() + timedelta(hours=1)))
    first = service.list_items("jobs", 0) or service.list_items("jobs", 1)
    partition = 0 if service.list_items("jobs", 0) == first else 1
    service.lease("jobs", batch_size=1, client_id="c")  # leases from some partition: find which
    clock.advance(timedelta(seconds=10))

    stats = {s.partition: s for s in service.stats("jobs")}

    assert sum(s.total for s in stats.values()) == 3
    assert sum(s.total_leased for s in stats.values()) == 1
    assert sum(s.scheduled for s in stats.values()) == 1
    assert stats[partition].average_age == timedelta(seconds=20)
    assert stats[partition].average_leased_age == timedelta(seconds=20)


def test_list_pages_through_a_partition_in_fifo_order_with_an_inclusive_pivot(service, clock):
    make_queue(service)
    for n in range(5):
        service.produce("jobs", items(f"{n}"))
        clock.advance(timedelta(milliseconds=1))
    service.produce("jobs", items("s", enqueue_at=clock.now() + timedelta(minutes=1)))

    first = service.list_items("jobs", 0, limit=2)
    second = service.list_items("jobs", 0, pivot=first[-1].id, limit=10)

    assert payloads(first) == [b"0", b"1"]
    assert payloads(second) == [b"1", b"2", b"3", b"4"]  # the scheduled item is not in the queue list
    assert payloads(service.list_scheduled("jobs", 0)) == [b"s"]
    listed = second[0]
    assert (listed.attempts, listed.lease_deadline, listed.source_id) == (0, None, "")


def test_list_shows_lease_state(service, clock):
    make_queue(service)
    service.produce("jobs", items("a", "b"))
    service.lease("jobs", batch_size=1, client_id="c")
    listed = service.list_items("jobs", 0)
    assert [i.is_leased(clock.now()) for i in listed] == [True, False]
    assert listed[0].attempts == 1


def test_clear_queue_keeps_leased_and_scheduled_items(service, clock):
    make_queue(service)
    service.produce("jobs", items("leased", "idle1", "idle2"))
    service.produce("jobs", items("sched", enqueue_at=clock.now() + timedelta(minutes=5)))
    lease_ids(service, 1)

    removed = service.clear("jobs", ClearScope.QUEUE)

    assert removed == 2
    assert payloads(service.list_items("jobs", 0)) == [b"leased"]
    assert payloads(service.list_scheduled("jobs", 0)) == [b"sched"]


def test_clear_destructive_and_scheduled_remove_everything(service, clock):
    make_queue(service)
    service.produce("jobs", items("leased", "idle"))
    service.produce("jobs", items("sched", enqueue_at=clock.now() + timedelta(minutes=5)))
    lease_ids(service, 1)

    removed = service.clear("jobs", ClearScope.QUEUE | ClearScope.SCHEDULED | ClearScope.DESTRUCTIVE)

    assert removed == 3
    assert service.list_items("jobs", 0) == [] and service.list_scheduled("jobs", 0) == []


def test_a_destructive_clear_of_scheduled_items_alone_keeps_waiting_and_leased_ones(service, clock):
    """``destructive`` widens ``queue`` to leased items (docs/api.md, ``queue.clear``); with
    ``scheduled`` alone it removes the scheduled items only, as the CLI's ``--only-scheduled``."""
    make_queue(service)
    service.produce("jobs", items("leased", "idle"))
    service.produce("jobs", items("sched", enqueue_at=clock.now() + timedelta(minutes=5)))
    (held,) = lease_ids(service, 1)

    removed = service.clear("jobs", ClearScope.SCHEDULED | ClearScope.DESTRUCTIVE)

    assert removed == 1
    assert payloads(service.list_items("jobs", 0)) == [b"leased", b"idle"]
    assert service.list_scheduled("jobs", 0) == []
    stats = service.stats("jobs")[0]
    assert (stats.total, stats.total_leased, stats.scheduled) == (2, 1, 0)
    assert service.complete("jobs", 0, [held]).failed == []


def test_clear_needs_queue_or_scheduled(service):
    make_queue(service)
    with pytest.raises(InvalidRequestError):
        service.clear("jobs", ClearScope.DESTRUCTIVE)


def test_import_writes_items_verbatim_under_new_ids_and_skips_known_source_ids(service, clock):
    make_queue(service)
    created = clock.now() - timedelta(minutes=3)
    batch = [
        StorageItem(payload=b"x", reference="r", kind="k", attempts=2, created_at=created, source_id="src-1"),
        StorageItem(payload=b"y", source_id="src-2"),
        StorageItem(payload=b"dup", source_id="src-1"),
    ]

    ids = service.import_items("jobs", 0, batch)
    again = service.import_items("jobs", 0, batch[:2])

    assert len(ids) == 2 and again == []
    listed = service.list_items("jobs", 0)
    assert payloads(listed) == [b"x", b"y"]
    assert (listed[0].attempts, listed[0].created_at, listed[0].source_id) == (2, created, "src-1")
    assert listed[0].reference == "r" and listed[0].kind == "k"


def test_storage_delete_removes_items_in_any_state_and_twice_is_fine(service):
    make_queue(service)
    receipt = service.produce("jobs", items("leased", "idle"))
    lease_ids(service, 1)

    service.delete_items("jobs", 0, receipt.ids)
    service.delete_items("jobs", 0, receipt.ids)

    assert service.list_items("jobs", 0) == []


def test_storage_delete_refuses_malformed_ids(service):
    make_queue(service)
    with pytest.raises(InvalidRequestError, match="not an item id"):
        service.delete_items("jobs", 0, ["nope"])
