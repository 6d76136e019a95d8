"""Contract: priorities (0-9, lower leases first, FIFO within one) on every store."""

from __future__ import annotations

from datetime import timedelta

import pytest

from querator.domain.errors import InvalidRequestError, NothingToLeaseError
from querator.domain.model import ClearScope, NewItem, RetryRequest, StorageItem
from querator.domain.positions import parse_position_id
from querator.domain.priority import band, band_start, held_end, lane_of
from querator.ports import Page
from querator.service.tuning import BAND_IDLE
from querator.storage.dynamodb.store import DynamoDBItemStore
from tests.contract.helpers import LEASE, items, make_queue, payloads


def lease_all(service, queue="jobs", batch=10):
    """Leases until nothing is left; the payloads in the order they were handed out."""
    found = []
    for _ in range(100):
        try:
            found += service.lease(queue, batch_size=batch, client_id="c", timeout=timedelta(0)).items
        except NothingToLeaseError:
            return found
    raise AssertionError("still leasing after 100 leases")


def produce(service, priority, *names, **fields):
    return service.produce("jobs", items(*names, priority=priority, **fields)).ids


def test_lease_hands_out_lower_priorities_first_and_fifo_within_one(service, clock):
    make_queue(service)
    produce(service, 9, "nine-a")
    produce(service, 5, "five-a", "five-b")
    clock.advance(timedelta(milliseconds=1))
    produce(service, 0, "zero-a")
    produce(service, 3, "three-a")
    produce(service, 9, "nine-b")
    produce(service, 0, "zero-b")

    leased = lease_all(service, batch=3)

    assert payloads(leased) == [
        b"zero-a", b"zero-b", b"three-a", b"five-a", b"five-b", b"nine-a", b"nine-b",
    ]  # fmt: skip
    assert [i.priority for i in leased] == [0, 0, 3, 5, 5, 9, 9]


def test_one_lease_spans_priorities_in_order_and_counts_every_item(service):
    make_queue(service)
    produce(service, 7, "low")
    produce(service, 2, "high")
    produce(service, 5, "normal")

    lease = service.lease("jobs", batch_size=10, client_id="c", timeout=timedelta(0))

    assert payloads(lease.items) == [b"high", b"normal", b"low"]
    (stats,) = service.stats("jobs")
    assert (stats.total, stats.total_leased) == (3, 3)


@pytest.mark.engine(2)  # engine v2's id shape; the v3 form follows
def test_default_priority_is_five_and_ids_say_the_priority(service):
    make_queue(service)
    plain = service.produce("jobs", items("a")).ids[0]
    urgent = produce(service, 1, "b")[0]
    bulk = produce(service, 8, "c")[0]

    listed = {item.id: item.priority for item in service.list_items("jobs", 0)}

    assert listed == {plain: 5, urgent: 1, bulk: 8}
    assert len(plain) == 30 and urgent.startswith(".1") and bulk.startswith("p8")
    assert [i.id for i in service.list_items("jobs", 0)] == [urgent, plain, bulk]


@pytest.mark.engine(3)
def test_default_priority_is_five_and_ids_say_the_priority_on_v3(service):
    """Engine v3's ids are log positions (``querator.domain.positions``): their lane is the band of
    their priority, as ``lane_of`` reads it (``""`` for priority 5), and they sort by priority."""
    make_queue(service)
    plain = service.produce("jobs", items("a")).ids[0]
    urgent = produce(service, 1, "b")[0]
    bulk = produce(service, 8, "c")[0]

    listed = {item.id: item.priority for item in service.list_items("jobs", 0)}

    assert listed == {plain: 5, urgent: 1, bulk: 8}
    assert all(parse_position_id(i) is not None for i in (plain, urgent, bulk))
    assert [lane_of(i) for i in (plain, urgent, bulk)] == [band(5), band(1), band(8)]
    assert [i.id for i in service.list_items("jobs", 0)] == [urgent, plain, bulk]


def test_a_scheduled_item_joins_its_priority_when_due(service, clock):
    make_queue(service)
    produce(service, 5, "normal-now")
    produce(service, 1, "urgent-later", enqueue_at=clock.now() + timedelta(minutes=5))

    first = service.lease("jobs", batch_size=10, client_id="c", timeout=timedelta(0))
    assert payloads(first.items) == [b"normal-now"]
    assert [i.priority for i in service.list_scheduled("jobs", 0)] == [1]
    service.complete("jobs", 0, [first.items[0].id])

    produce(service, 5, "normal-before-due")
    clock.advance(timedelta(minutes=6))
    produce(service, 5, "normal-after-due")

    assert payloads(lease_all(service)) == [b"urgent-later", b"normal-before-due", b"normal-after-due"]


def test_expired_and_retried_items_keep_their_priority_unless_retry_gives_one(service, clock):
    make_queue(service)
    produce(service, 2, "expires", "retried", "reprioritized")
    produce(service, 4, "waiting")
    leased = service.lease("jobs", batch_size=3, client_id="c", timeout=timedelta(0)).items
    by_payload = {item.payload: item for item in leased}

    retry = service.retry(
        "jobs",
        0,
        [
            RetryRequest(id=by_payload[b"retried"].id),
            RetryRequest(id=by_payload[b"reprioritized"].id, priority=9),
        ],
    )
    assert retry.failed == []
    clock.advance(LEASE + timedelta(seconds=1))  # "expires" goes back with its priority

    again = lease_all(service)

    assert [(i.payload, i.priority) for i in again] == [
        (b"retried", 2), (b"expires", 2), (b"waiting", 4), (b"reprioritized", 9),
    ]  # fmt: skip


def test_retry_at_with_a_new_priority_schedules_it_in_that_priority(service, clock):
    make_queue(service)
    produce(service, 5, "job")
    (item,) = service.lease("jobs", batch_size=1, client_id="c", timeout=timedelta(0)).items
    service.retry(
        "jobs", 0, [RetryRequest(id=item.id, retry_at=clock.now() + timedelta(minutes=1), priority=0)]
    )
    produce(service, 5, "other")

    (scheduled,) = service.list_scheduled("jobs", 0)
    assert scheduled.priority == 0
    clock.advance(timedelta(minutes=2))
    assert payloads(lease_all(service)) == [b"job", b"other"]


def test_dead_letters_keep_their_priority(service, clock):
    make_queue(service, "dead")
    make_queue(service, dead_queue="dead", max_attempts=1)
    produce(service, 3, "poison")
    (item,) = service.lease("jobs", batch_size=1, client_id="c", timeout=timedelta(0)).items
    service.retry("jobs", 0, [RetryRequest(id=item.id)])  # attempts exhausted: dead-lettered

    (dead,) = service.list_items("dead", 0)

    assert (dead.payload, dead.priority) == (b"poison", 3)


def test_the_reaper_dead_letters_expired_items_of_every_priority(service, clock):
    make_queue(service, "dead")
    make_queue(service, dead_queue="dead", expire_timeout=timedelta(minutes=1), lease_timeout=LEASE)
    produce(service, 0, "urgent")
    produce(service, 5, "normal")
    produce(service, 9, "bulk")
    clock.advance(timedelta(minutes=2))

    report = service.reap(clock.now(), timedelta(seconds=30))

    assert report.dead_lettered == 3
    assert sorted((i.payload, i.priority) for i in service.list_items("dead", 0)) == [
        (b"bulk", 9), (b"normal", 5), (b"urgent", 0),
    ]  # fmt: skip


def test_scheduled_counts_and_clear_cover_every_priority(service, clock):
    make_queue(service)
    later = clock.now() + timedelta(minutes=5)
    produce(service, 1, "a", enqueue_at=later)
    produce(service, 8, "b", enqueue_at=later)
    produce(service, 1, "c")
    produce(service, 8, "d")
    (stats,) = service.stats("jobs")
    assert (stats.total, stats.scheduled) == (2, 2)  # total: the items not scheduled

    clock.advance(timedelta(minutes=6))
    service.reap(clock.now(), timedelta(seconds=30))
    (stats,) = service.stats("jobs")
    assert (stats.total, stats.scheduled) == (4, 0)

    assert service.clear("jobs", ClearScope.QUEUE) == 4
    assert lease_all(service) == []


def test_clear_scheduled_removes_scheduled_items_of_every_priority(service, clock):
    make_queue(service)
    later = clock.now() + timedelta(minutes=5)
    produce(service, 0, "a", enqueue_at=later)
    produce(service, 9, "b", enqueue_at=later)
    produce(service, 9, "waiting")

    assert service.clear("jobs", ClearScope.SCHEDULED) == 2
    assert payloads(service.list_items("jobs", 0)) == [b"waiting"]


def test_listing_pages_across_priorities_in_lease_order(service):
    make_queue(service)
    produce(service, 9, "9a", "9b")
    produce(service, 0, "0a", "0b")
    produce(service, 5, "5a")

    first = service.list_items("jobs", 0, limit=3)
    rest = service.list_items("jobs", 0, pivot=first[-1].id, limit=10)[1:]

    assert payloads(first + rest) == [b"0a", b"0b", b"5a", b"9a", b"9b"]


def test_storage_import_keeps_the_given_priority(service):
    make_queue(service)
    service.import_items("jobs", 0, [StorageItem(payload=b"x", priority=2), StorageItem(payload=b"y")])

    assert [(i.payload, i.priority) for i in service.list_items("jobs", 0)] == [(b"x", 2), (b"y", 5)]


@pytest.mark.parametrize("bad", [-1, 10, 2.5, "5", True, None])
def test_a_priority_out_of_range_or_not_an_integer_is_refused_and_nothing_is_stored(service, bad):
    make_queue(service)
    with pytest.raises(InvalidRequestError) as raised:
        service.produce("jobs", [NewItem(payload=b"ok"), NewItem(payload=b"bad", priority=bad)])
    assert raised.value.context.get("field") == "priority"
    assert service.list_items("jobs", 0) == []


@pytest.mark.engine(2)  # engine v2's reads (v3's: tests/unit/test_dynamodb_log.py, benchmarks.cost_v3)
def test_a_lease_reads_the_bands_in_use_from_their_cursors_not_the_leases_ahead(metered, clock):
    service, meter = metered.service, metered.meter
    make_queue(service)
    # 300 valid leases of priority 1 ahead of 10 ready items of priority 7 (none of priority 5).
    for _ in range(3):
        service.produce("jobs", items(*(f"held {i}" for i in range(100)), priority=1))
    clock.advance(timedelta(seconds=2))
    held = lease_all(service, batch=100)
    service.produce("jobs", items(*(f"bulk {i}" for i in range(10)), priority=7))
    clock.advance(timedelta(seconds=2))

    meter.reset()
    got = service.lease("jobs", batch_size=10, client_id="late", timeout=timedelta(0)).items

    assert len(held) == 300 and len(got) == 10
    cost = meter.snapshot()
    # The head row, then one range read per band in use (1, 5 and 7): none through the 300 leases.
    assert cost.requests_by_operation["Query"] == 4, cost
    assert cost.read_units <= 5, cost


@pytest.mark.engine(2)  # engine v2's requests (v3's: tests/unit/test_dynamodb_log.py)
def test_a_fifo_queue_leases_as_before_priorities_existed(metered, clock):
    service, meter = metered.service, metered.meter
    make_queue(service)
    service.produce("jobs", items(*"abcdefghij"))
    clock.advance(timedelta(seconds=2))

    meter.reset()
    got = service.lease("jobs", batch_size=10, client_id="c", timeout=timedelta(0)).items

    assert len(got) == 10
    # The head row and the candidates, the lease record, ten claims and one head update: no more.
    assert meter.snapshot().requests_by_operation == {"Query": 2, "PutItem": 1, "UpdateItem": 11}


@pytest.mark.engine(2)  # engine v2's requests (v3 registers a band as v2 does)
def test_a_produce_of_another_priority_costs_one_more_request_than_fifo(metered):
    service, meter = metered.service, metered.meter
    make_queue(service)

    meter.reset()
    service.produce("jobs", items("a", "b"))
    fifo = meter.snapshot().requests_by_operation
    meter.reset()
    service.produce("jobs", items("c", "d", priority=2))
    banded = meter.snapshot().requests_by_operation

    # A produce of priority 5 items: one batch write and the counters, as before.
    assert fifo == {"BatchWriteItem": 1, "UpdateItem": 1}, fifo
    # Another priority: the head row learns the band first (one more UpdateItem, before the items
    # are written, so no item is ever in a band a lease does not read), then the same.
    assert banded == {"BatchWriteItem": 1, "UpdateItem": 2}, banded


def test_a_flood_of_urgent_items_holds_back_lower_priorities_strictly(service, clock):
    make_queue(service)
    produce(service, 9, "bulk")
    for round_ in range(5):
        produce(service, 0, *(f"urgent {round_}.{i}" for i in range(10)))
        got = service.lease("jobs", batch_size=10, client_id="c", timeout=timedelta(0)).items
        # Strict priority (docs/ordering.md): while priority 0 has items, priority 9 waits.
        assert {i.priority for i in got} == {0}
        service.complete("jobs", 0, [i.id for i in got])
    assert payloads(lease_all(service)) == [b"bulk"]


# -- queue.reprioritize ------------------------------------------------------------------------------


def test_reprioritize_moves_a_waiting_item_to_the_tail_of_its_new_priority(service, clock):
    make_queue(service)
    _, second = produce(service, 5, "first", "second")
    produce(service, 2, "urgent-already")

    outcome = service.reprioritize("jobs", 0, [second], 2)

    assert outcome.failed == []
    new_id = outcome.ids[second]
    assert new_id != second and new_id.startswith(".2")
    assert [(i.payload, i.priority) for i in lease_all(service)] == [
        (b"urgent-already", 2), (b"second", 2), (b"first", 5),
    ]  # fmt: skip


def test_reprioritize_keeps_a_scheduled_item_scheduled_for_its_time(service, clock):
    make_queue(service)
    due = clock.now() + timedelta(minutes=5)
    (item_id,) = produce(service, 5, "later", enqueue_at=due)

    outcome = service.reprioritize("jobs", 0, [item_id], 0)

    (scheduled,) = service.list_scheduled("jobs", 0)
    assert (scheduled.id, scheduled.priority, scheduled.enqueue_at) == (outcome.ids[item_id], 0, due)
    assert lease_all(service) == []
    clock.advance(timedelta(minutes=6))
    produce(service, 5, "normal")
    assert payloads(lease_all(service)) == [b"later", b"normal"]


def test_a_leased_item_keeps_its_id_and_lease_and_goes_back_with_the_new_priority(service, clock):
    make_queue(service)
    produce(service, 5, "held", "retried")
    held, retried = service.lease("jobs", batch_size=2, client_id="c", timeout=timedelta(0)).items

    outcome = service.reprioritize("jobs", 0, [held.id, retried.id], 8)

    assert outcome.ids == {held.id: held.id, retried.id: retried.id}
    assert service.renew("jobs", 0, [held.id]).failed == []  # the lease is still the caller's
    produce(service, 5, "normal")
    assert service.retry("jobs", 0, [RetryRequest(id=retried.id)]).failed == []
    clock.advance(LEASE * 3)  # "held" runs out and goes back

    assert [(i.payload, i.priority) for i in lease_all(service)] == [
        (b"normal", 5), (b"retried", 8), (b"held", 8),
    ]  # fmt: skip


def test_reprioritize_to_the_same_priority_changes_nothing(service):
    make_queue(service)
    (item_id,) = produce(service, 3, "x")

    assert service.reprioritize("jobs", 0, [item_id], 3).ids == {item_id: item_id}
    assert [i.id for i in service.list_items("jobs", 0)] == [item_id]


def test_reprioritize_reports_unknown_ids_and_applies_the_others(service):
    make_queue(service)
    (known,) = produce(service, 5, "x")
    (done,) = produce(service, 5, "y")
    service.delete_items("jobs", 0, [done])

    outcome = service.reprioritize("jobs", 0, [known, done, "not-an-id"], 1)

    assert set(outcome.ids) == {known}
    assert sorted(f.id for f in outcome.failed) == sorted([done, "not-an-id"])
    assert [i.priority for i in service.list_items("jobs", 0)] == [1]


@pytest.mark.parametrize("bad", [-1, 10, 1.5, True])
def test_reprioritize_refuses_a_bad_priority_and_changes_nothing(service, bad):
    make_queue(service)
    (item_id,) = produce(service, 5, "x")
    with pytest.raises(InvalidRequestError):
        service.reprioritize("jobs", 0, [item_id], bad)
    assert [i.id for i in service.list_items("jobs", 0)] == [item_id]


# -- bands that emptied ------------------------------------------------------------------------------


def test_the_reaper_drops_a_band_that_is_empty_and_idle_and_a_new_item_brings_it_back(service, clock):
    make_queue(service)
    produce(service, 2, "once")
    (item,) = service.lease("jobs", batch_size=1, client_id="c", timeout=timedelta(0)).items
    service.complete("jobs", 0, [item.id])

    service.reap(clock.now(), timedelta(seconds=30))
    assert service.store.head("jobs", 0, now=clock.now())[0].bands == {".2"}  # registered < BAND_IDLE ago
    clock.advance(BAND_IDLE + timedelta(seconds=1))
    report = service.reap(clock.now(), timedelta(seconds=30))

    assert report.bands_dropped == 1
    assert service.store.head("jobs", 0, now=clock.now())[0].leasable_bands() == [""]
    produce(service, 2, "again")
    produce(service, 5, "normal")
    assert payloads(lease_all(service)) == [b"again", b"normal"]


def test_a_band_that_still_holds_items_is_kept_however_old(service, clock):
    make_queue(service, expire_timeout=timedelta(days=1))
    produce(service, 9, "waiting", "leased")
    service.lease("jobs", batch_size=1, client_id="c", timeout=timedelta(0))
    clock.advance(BAND_IDLE * 2)

    report = service.reap(clock.now(), timedelta(seconds=30))

    assert report.bands_dropped == 0
    assert service.store.head("jobs", 0, now=clock.now())[0].bands == {"p9"}


@pytest.mark.engine(2)  # engine v2's seam (its scan); v3's drop reads a log head
def test_an_item_that_lands_between_the_check_and_the_drop_keeps_its_band(service, clock, monkeypatch):
    make_queue(service, expire_timeout=timedelta(days=1))
    (item_id,) = produce(service, 1, "late writer")
    clock.advance(BAND_IDLE * 2)
    real = service.store.scan
    checks = []

    def first_check_misses_it(*args, **kwargs):
        # The reaper's first look at the band sees it empty (the writer had registered it long ago
        # and its item had not landed yet); every other read sees the store as it is.
        if (kwargs["start"], kwargs["end"], kwargs["limit"]) == (band_start(".1"), held_end(".1"), 1):
            checks.append(kwargs["start"])
            if len(checks) == 1:
                return Page(read_to=kwargs["end"])
        return real(*args, **kwargs)

    monkeypatch.setattr(service.store, "scan", first_check_misses_it)
    report = service.reap(clock.now(), timedelta(seconds=30))
    monkeypatch.setattr(service.store, "scan", real)

    # DynamoDB: looked, dropped, looked again and named it again; the embedded stores refuse the drop
    # itself, in the transaction that sees the item.
    assert len(checks) == (2 if isinstance(service.store, DynamoDBItemStore) else 1)
    assert report.bands_dropped == 0
    assert ".1" in service.store.head("jobs", 0, now=clock.now())[0].bands
    assert [i.id for i in lease_all(service)] == [item_id]


@pytest.mark.parametrize("priority", [0, 9])
def test_a_lone_leased_item_of_another_priority_comes_back_when_its_lease_runs_out(service, clock, priority):
    # One id in the lease record: it must read back whole (a record of one banded id once read as
    # two broken ones, and the item never came back).
    make_queue(service)
    (item_id,) = produce(service, priority, "alone")
    (first,) = service.lease("jobs", batch_size=1, client_id="c", timeout=timedelta(0)).items
    clock.advance(LEASE + timedelta(seconds=1))

    (again,) = service.lease("jobs", batch_size=1, client_id="c", timeout=timedelta(0)).items

    assert (first.id, again.payload, again.attempts, again.priority) == (item_id, b"alone", 2, priority)
    assert again.id != item_id


def test_an_item_reprioritized_while_leased_is_leased_first_when_its_lease_runs_out(service, clock):
    # Found by the state machine: the lease read the head row, then put the expired item back into
    # a band that row did not name yet, and leased the lower priority first.
    make_queue(service)
    produce(service, 1, "a", "b")
    (held,) = service.lease("jobs", batch_size=1, client_id="c", timeout=timedelta(0)).items
    service.reprioritize("jobs", 0, [held.id], 0)
    clock.advance(LEASE + timedelta(seconds=1))

    (next_item,) = service.lease("jobs", batch_size=1, client_id="c", timeout=timedelta(0)).items

    assert (next_item.payload, next_item.priority) == (b"a", 0)


def test_an_item_whose_lease_ran_out_keeps_the_priority_it_was_last_given(service, clock):
    # Found by the state machine: reprioritized while leased (it goes back at 0), its lease ran out
    # and nothing has put it back yet, then reprioritized to the priority it is stored at. That was
    # taken for "no change", and the earlier 0 still sent it back at 0.
    make_queue(service)
    produce(service, 1, "a")
    (held,) = service.lease("jobs", batch_size=1, client_id="c", timeout=timedelta(0)).items
    service.reprioritize("jobs", 0, [held.id], 0)
    clock.advance(LEASE + timedelta(seconds=1))

    moved = service.reprioritize("jobs", 0, [held.id], 1)

    assert moved.failed == [] and held.id in moved.ids
    (again,) = service.lease("jobs", batch_size=1, client_id="c", timeout=timedelta(0)).items
    assert (again.payload, again.priority, again.attempts) == (b"a", 1, 2)


def test_reprioritize_of_an_item_whose_last_lease_ran_out_dead_letters_it(service, clock):
    """Moving it would give it a lease past max_attempts: it goes where the next lease would send it."""
    make_queue(service, "dead")
    make_queue(service, dead_queue="dead", max_attempts=1)
    service.produce("jobs", items("last-try"))
    (item,) = service.lease("jobs", batch_size=1, client_id="w").items
    clock.advance(LEASE + timedelta(seconds=1))

    outcome = service.reprioritize("jobs", 0, [item.id], 1)

    assert [f.id for f in outcome.failed] == [item.id] and outcome.ids == {}
    assert service.list_items("jobs", 0) == []
    assert [(i.payload, i.attempts) for i in service.list_items("dead", 0)] == [(b"last-try", 1)]


def test_reprioritize_of_an_expired_lease_to_its_coming_priority_moves_it(service, clock):
    """A priority given while leased, asked again after the lease ran out: the item goes back with it
    now (it used to stay in its old band, leased by nobody, until a lease put it back)."""
    make_queue(service)
    service.produce(
        "jobs",
        items("a"),
    )
    (item,) = service.lease("jobs", batch_size=1, client_id="w").items
    service.reprioritize("jobs", 0, [item.id], 2)
    clock.advance(LEASE + timedelta(seconds=1))

    outcome = service.reprioritize("jobs", 0, [item.id], 2)

    assert outcome.failed == [] and outcome.ids[item.id] != item.id
    assert [(i.payload, i.priority, i.lease_deadline) for i in service.list_items("jobs", 0)] == [
        (b"a", 2, None)
    ]
