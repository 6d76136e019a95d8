"""Contract: fair delivery (``delivery: "fair"``, ``group``, ``max_leased_per_group``) on every store."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from querator.domain.errors import InvalidRequestError, NothingToLeaseError
from querator.domain.model import ClearScope, NewItem, QueueUpdate, RetryRequest
from tests.contract.helpers import LEASE, make_queue


def fair_queue(service, name="jobs", **fields):
    return make_queue(service, name, delivery="fair", **fields)


def produce(service, group, count, queue="jobs", **fields):
    items = [NewItem(payload=f"{group}-{n}".encode(), group=group, **fields) for n in range(count)]
    for start in range(0, count, 1000):
        service.produce(queue, items[start : start + 1000])


def lease(service, batch, queue="jobs"):
    try:
        return service.lease(queue, batch_size=batch, client_id="c", timeout=timedelta(0)).items
    except NothingToLeaseError:
        return []


def test_a_backlog_does_not_delay_another_groups_first_item_past_two_leases(service):
    fair_queue(service)
    produce(service, "A", 10_000)
    produce(service, "B", 1)

    first, second = lease(service, 10), lease(service, 10)

    assert "B" in [i.group for i in first + second]
    assert {i.group for i in first + second} == {"A", "B"}


def test_one_item_at_a_time_goes_round_the_groups_and_the_turn_carries_over(service):
    fair_queue(service)
    for group in ("A", "B", "C"):
        produce(service, group, 3)

    handed = [i.group for _ in range(9) for i in lease(service, 1)]

    assert len(handed) == 9
    for turn in range(3):
        assert sorted(handed[3 * turn : 3 * turn + 3]) == ["A", "B", "C"], handed
    # Within a group, oldest first.
    assert [p for p in handed if p == "A"] == ["A"] * 3


def test_within_a_group_items_come_oldest_first(service, clock):
    fair_queue(service)
    produce(service, "A", 1)
    clock.advance(timedelta(milliseconds=1))
    produce(service, "A", 1)  # "A-0" again: told apart by produce order
    service.produce("jobs", [NewItem(payload=b"A-late", group="A")])

    assert [i.payload for i in lease(service, 10)] == [b"A-0", b"A-0", b"A-late"]


def test_a_newly_ready_group_is_served_within_one_turn_of_the_rotation(service):
    fair_queue(service)
    for group in ("A", "B", "C", "D"):
        produce(service, group, 5)
    lease(service, 1)
    produce(service, "E", 1)

    handed = [i.group for _ in range(5) for i in lease(service, 1)]

    assert "E" in handed


def test_priority_first_then_fairness(service):
    fair_queue(service)
    produce(service, "bulk", 20, priority=7)
    produce(service, "urgent", 3, priority=1)
    produce(service, "other", 3, priority=1)

    got = lease(service, 6)

    assert sorted(i.group for i in got) == ["other"] * 3 + ["urgent"] * 3
    assert all(i.priority == 1 for i in got)


def test_items_without_a_group_form_one_group_of_their_own(service):
    fair_queue(service)
    produce(service, "A", 5)
    service.produce("jobs", [NewItem(payload=b"loose-1"), NewItem(payload=b"loose-2")])

    got = lease(service, 4)

    assert Counter(i.group for i in got) == Counter({"A": 2, "": 2})


def test_an_expired_lease_goes_back_into_its_group_and_is_leased_again(service, clock):
    fair_queue(service)
    produce(service, "A", 1)
    produce(service, "B", 1)
    held = lease(service, 2)
    clock.advance(LEASE + timedelta(seconds=1))

    again = lease(service, 2)

    assert sorted((i.group, i.attempts) for i in again) == [("A", 2), ("B", 2)]
    assert {i.id for i in again}.isdisjoint({i.id for i in held})


def test_retry_keeps_the_group_and_the_fair_turn(service):
    fair_queue(service)
    produce(service, "A", 2)
    produce(service, "B", 1)
    (first,) = lease(service, 1)
    service.retry("jobs", 0, [RetryRequest(id=first.id)])

    rest = lease(service, 10)

    assert Counter(i.group for i in rest) == Counter({"A": 2, "B": 1})


def test_the_cap_holds_a_group_to_its_valid_leases_until_one_ends(service, clock):
    fair_queue(service, max_leased_per_group=2)
    produce(service, "A", 10)
    produce(service, "B", 10)
    service.produce("jobs", [NewItem(payload=b"loose")])

    first = lease(service, 10)
    second = lease(service, 10)

    assert Counter(i.group for i in first) == Counter({"A": 2, "B": 2, "": 1})
    assert second == []
    a_item = next(i for i in first if i.group == "A")
    service.complete("jobs", 0, [a_item.id])
    assert [i.group for i in lease(service, 10)] == ["A"]
    # A lease that runs out frees its slot too.
    clock.advance(LEASE + timedelta(seconds=1))
    assert Counter(i.group for i in lease(service, 10)) == Counter({"A": 2, "B": 2, "": 1})


def test_a_renewed_lease_keeps_its_slot_past_its_first_deadline(service, clock):
    fair_queue(service, max_leased_per_group=1)
    produce(service, "A", 3)
    (held,) = lease(service, 10)
    clock.advance(LEASE - timedelta(seconds=1))
    service.renew("jobs", 0, [held.id], lease_timeout=timedelta(minutes=10))
    clock.advance(timedelta(seconds=2))  # past the first deadline, within the renewed one

    assert lease(service, 10) == []


def test_the_reaper_clear_and_listings_see_every_group(service, clock):
    fair_queue(service, expire_timeout=timedelta(minutes=5))
    produce(service, "A", 2)
    produce(service, "B", 2)
    later = clock.now() + timedelta(hours=1)
    service.produce("jobs", [NewItem(payload=b"sched", group="C", enqueue_at=later)])

    listed = service.list_items("jobs", 0)
    scheduled = service.list_scheduled("jobs", 0)
    assert sorted(i.payload for i in listed) == [b"A-0", b"A-1", b"B-0", b"B-1"]
    assert [i.payload for i in scheduled] == [b"sched"]

    clock.advance(timedelta(minutes=6))
    report = service.reap(clock.now(), timedelta(seconds=30))
    assert report.deleted + report.dead_lettered == 4  # expired in every group's lane
    assert service.list_items("jobs", 0) == []

    assert service.clear("jobs", ClearScope.SCHEDULED) == 1
    assert service.list_scheduled("jobs", 0) == []


def test_dead_letters_keep_the_group_and_redrive_back_into_the_fair_queue(service):
    make_queue(service, "dlq")
    fair_queue(service, dead_queue="dlq")
    produce(service, "A", 1)
    produce(service, "B", 1)
    held = lease(service, 2)
    service.retry("jobs", 0, [RetryRequest(id=i.id, dead=True) for i in held])
    assert sorted(i.group for i in service.list_items("dlq", 0)) == ["A", "B"]

    service.redrive("dlq")

    assert sorted(i.group for i in lease(service, 10)) == ["A", "B"]


def test_delivery_changes_only_on_an_empty_queue(service):
    make_queue(service)
    service.update_queue(QueueUpdate(name="jobs", delivery="fair"))
    assert service.get_queue("jobs").delivery == "fair"
    produce(service, "A", 1)

    with pytest.raises(InvalidRequestError, match="empty"):
        service.update_queue(QueueUpdate(name="jobs", delivery="fifo"))

    assert service.get_queue("jobs").delivery == "fair"
    service.update_queue(QueueUpdate(name="jobs", max_leased_per_group=3))  # the cap may change
    assert service.get_queue("jobs").max_leased_per_group == 3


def test_a_fifo_queue_ignores_groups_for_order(service):
    make_queue(service)
    produce(service, "A", 5)
    produce(service, "B", 1)

    assert [i.group for i in lease(service, 5)] == ["A"] * 5
