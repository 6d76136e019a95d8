"""Contract: produce, lease, complete, retry, renew, fencing and the item lifecycle."""

from __future__ import annotations

import hashlib
from collections import Counter
from datetime import timedelta

import pytest

from querator.domain.errors import (
    DuplicateClientError,
    InvalidRequestError,
    NothingToLeaseError,
    RequestInProgressError,
)
from querator.domain.model import NewItem, RetryRequest
from querator.ports import IdempotencyRecord
from querator.testing import FakeClock
from tests.contract.helpers import LEASE, beside, items, make_queue, payloads


class _NoLease:
    partition = 0
    items: tuple = ()


def lease(service, queue="jobs", batch=10, client="c1", timeout=timedelta(0)):
    """Lease, with "nothing to lease" as an empty lease so tests can compare items."""
    try:
        return service.lease(queue, batch_size=batch, client_id=client, timeout=timeout)
    except NothingToLeaseError:
        return _NoLease()


def test_lease_returns_items_oldest_first_with_attempts_and_deadline(service, clock):
    make_queue(service)
    service.produce("jobs", items("1", "2"))
    clock.advance(timedelta(seconds=1))
    service.produce("jobs", items("3"))

    leased = lease(service)

    assert payloads(leased.items) == [b"1", b"2", b"3"]
    assert [i.attempts for i in leased.items] == [1, 1, 1]
    assert {i.lease_deadline for i in leased.items} == {clock.now() + LEASE}


def test_produce_keeps_item_fields_and_lease_respects_batch_size(service):
    make_queue(service)
    service.produce("jobs", [NewItem(payload=b"\x00\xff", reference="r", encoding="e", kind="k")] * 3)

    first = lease(service, batch=2)
    second = lease(service, batch=2)

    assert len(first.items) == 2 and len(second.items) == 1
    item = first.items[0]
    assert (item.payload, item.reference, item.encoding, item.kind) == (b"\x00\xff", "r", "e", "k")


@pytest.mark.parametrize("count", [0, 1001])
def test_produce_refuses_empty_and_oversized_batches(service, count):
    make_queue(service)
    with pytest.raises(InvalidRequestError):
        service.produce("jobs", items(*["x"] * count))


def test_a_produce_lands_whole_in_one_partition_and_partitions_fill_evenly(service):
    make_queue(service, partitions=4)

    receipts = [service.produce("jobs", items("a", "b", "c")) for _ in range(8)]

    per_partition = Counter(r.partition for r in receipts)
    assert per_partition == {0: 2, 1: 2, 2: 2, 3: 2}
    for receipt in receipts:
        listed = service.list_items("jobs", receipt.partition)
        assert set(receipt.ids) <= {i.id for i in listed}


def test_one_consumer_drains_every_partition(service):
    make_queue(service, partitions=3)
    for n in range(6):
        service.produce("jobs", items(f"{n}"))

    seen = []
    for _ in range(6):
        leased = lease(service, batch=10)
        assert len({i.id for i in leased.items}) == len(leased.items)
        seen += payloads(leased.items)
        service.complete("jobs", leased.partition, [i.id for i in leased.items])
        if len(seen) == 6:
            break

    assert sorted(seen) == [str(n).encode() for n in range(6)]


def test_scheduled_items_are_invisible_until_enqueue_at_then_in_produce_order(service, clock):
    make_queue(service)
    at = clock.now() + timedelta(minutes=5)
    service.produce("jobs", items("s1", "s2", enqueue_at=at))
    service.produce("jobs", items("s3", enqueue_at=at))
    service.produce("jobs", items("now"))

    leased = lease(service).items
    assert payloads(leased) == [b"now"]
    service.complete("jobs", 0, [leased[0].id])
    assert payloads(service.list_scheduled("jobs", 0)) == [b"s1", b"s2", b"s3"]

    clock.advance(timedelta(minutes=5))
    assert payloads(lease(service).items) == [b"s1", b"s2", b"s3"]


def test_lease_waits_until_its_timeout_then_reports_nothing(service, clock):
    make_queue(service)
    start = clock.now()
    with pytest.raises(NothingToLeaseError):
        service.lease("jobs", batch_size=1, client_id="c1", timeout=timedelta(seconds=3))
    assert clock.now() - start >= timedelta(seconds=3)


class ProducingClock(FakeClock):
    """Runs ``on_sleep`` the first time the service waits, as a producer would meanwhile."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock.now())
        self.on_sleep = None

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        action, self.on_sleep = self.on_sleep, None
        if action:
            action()


def test_a_waiting_lease_returns_what_is_produced_meanwhile_and_refuses_a_duplicate_client(service, clock):
    waiting = ProducingClock(clock)
    service = beside(service, waiting)
    make_queue(service)
    errors = []

    def meanwhile():
        try:
            lease(service, client="c1")
        except DuplicateClientError as exc:
            errors.append(exc)
        service.produce("jobs", items("late"))

    waiting.on_sleep = meanwhile
    leased = lease(service, client="c1", timeout=timedelta(seconds=10))

    assert payloads(leased.items) == [b"late"]
    assert len(errors) == 1
    with pytest.raises(NothingToLeaseError):  # the client id is free again once the wait ended
        service.lease("jobs", batch_size=1, client_id="c1")


def test_complete_deletes_leased_items_and_reports_each_failed_id(service):
    make_queue(service)
    service.produce("jobs", items("a", "b"))
    leased = lease(service)
    a, b = (i.id for i in leased.items)

    outcome = service.complete("jobs", 0, [a, "not-an-id", "0" * 30])

    assert outcome.applied == [a]
    assert {f.id for f in outcome.failed} == {"not-an-id", "0" * 30}
    assert [i.id for i in service.list_items("jobs", 0)] == [b]
    again = service.complete("jobs", 0, [a])
    assert [f.id for f in again.failed] == [a]


def test_complete_refuses_a_partition_the_queue_does_not_have(service):
    make_queue(service)
    with pytest.raises(InvalidRequestError, match="partition"):
        service.complete("jobs", 1, ["0" * 30])


def test_an_item_that_was_never_leased_cannot_be_completed(service):
    make_queue(service)
    receipt = service.produce("jobs", items("a"))
    outcome = service.complete("jobs", 0, receipt.ids)
    assert [f.id for f in outcome.failed] == receipt.ids


def test_expired_lease_goes_to_the_tail_under_a_new_id_and_the_old_id_is_fenced(service, clock):
    make_queue(service)
    service.produce("jobs", items("first", "second"))
    stale = lease(service, batch=1).items[0]
    clock.advance(LEASE + timedelta(seconds=1))

    again = lease(service, batch=2)

    assert payloads(again.items) == [b"second", b"first"]  # "first" went to the tail
    relet = again.items[1]
    assert relet.id != stale.id and relet.attempts == 2
    assert [f.id for f in service.complete("jobs", 0, [stale.id]).failed] == [stale.id]
    assert [f.id for f in service.retry("jobs", 0, [RetryRequest(id=stale.id)]).failed] == [stale.id]
    assert [f.id for f in service.renew("jobs", 0, [stale.id]).failed] == [stale.id]
    assert service.complete("jobs", 0, [relet.id]).applied == [relet.id]


def test_a_lease_that_ran_out_cannot_complete_even_before_anyone_else_leases(service, clock):
    make_queue(service)
    service.produce("jobs", items("a"))
    held = lease(service).items[0]
    clock.advance(LEASE)
    assert [f.id for f in service.complete("jobs", 0, [held.id]).failed] == [held.id]


def test_renew_extends_valid_leases_only(service, clock):
    make_queue(service)
    service.produce("jobs", items("a"))
    held = lease(service).items[0]
    clock.advance(timedelta(seconds=20))

    renewed = service.renew("jobs", 0, [held.id], lease_timeout=timedelta(seconds=60))

    assert [(r.id, r.lease_deadline) for r in renewed.items] == [
        (held.id, clock.now() + timedelta(seconds=60))
    ]
    clock.advance(timedelta(seconds=45))  # past the first deadline, inside the renewed one
    assert list(lease(service, client="c2").items) == []
    assert service.complete("jobs", 0, [held.id]).applied == [held.id]


def test_retry_now_puts_the_item_at_the_tail(service):
    make_queue(service)
    service.produce("jobs", items("a", "b"))
    a = lease(service, batch=1).items[0]

    outcome = service.retry("jobs", 0, [RetryRequest(id=a.id)])

    assert outcome.applied == [a.id]
    assert payloads(lease(service).items) == [b"b", b"a"]


def test_retry_at_schedules_the_item(service, clock):
    make_queue(service)
    service.produce("jobs", items("a"))
    a = lease(service).items[0]

    service.retry("jobs", 0, [RetryRequest(id=a.id, retry_at=clock.now() + timedelta(minutes=1))])

    assert payloads(lease(service).items) == []
    assert payloads(service.list_scheduled("jobs", 0)) == [b"a"]
    clock.advance(timedelta(minutes=1))
    retried = lease(service).items
    assert payloads(retried) == [b"a"] and retried[0].attempts == 2


def test_retry_dead_moves_the_item_to_the_dead_letter_queue_with_its_source_id(service):
    make_queue(service, "dlq")
    make_queue(service, dead_queue="dlq")
    service.produce("jobs", items("poison"))
    held = lease(service).items[0]

    assert service.retry("jobs", 0, [RetryRequest(id=held.id, dead=True)]).applied == [held.id]

    dead = service.list_items("dlq", 0)
    assert payloads(dead) == [b"poison"] and dead[0].source_id == held.id
    assert service.list_items("jobs", 0) == []


def test_retry_dead_without_a_dead_letter_queue_deletes_the_item(service):
    make_queue(service)
    service.produce("jobs", items("poison"))
    held = lease(service).items[0]
    assert service.retry("jobs", 0, [RetryRequest(id=held.id, dead=True)]).applied == [held.id]
    assert service.list_items("jobs", 0) == []


def test_max_attempts_sends_an_expired_lease_to_the_dead_letter_queue_at_lease_time(service, clock):
    make_queue(service, "dlq")
    make_queue(service, dead_queue="dlq", max_attempts=2)
    service.produce("jobs", items("flaky"))
    for attempt in (1, 2):
        assert [i.attempts for i in lease(service).items] == [attempt]
        clock.advance(LEASE)

    assert list(lease(service).items) == []
    assert payloads(service.list_items("dlq", 0)) == [b"flaky"]


def test_retry_of_an_item_that_used_all_attempts_dead_letters_it(service):
    make_queue(service, "dlq")
    make_queue(service, dead_queue="dlq", max_attempts=1)
    service.produce("jobs", items("once"))
    held = lease(service).items[0]
    service.retry("jobs", 0, [RetryRequest(id=held.id)])
    assert payloads(service.list_items("dlq", 0)) == [b"once"]


def test_expired_items_are_dead_lettered_at_lease_time_but_valid_leases_are_kept(service, clock):
    make_queue(service, "dlq")
    make_queue(
        service, dead_queue="dlq", lease_timeout=timedelta(minutes=30), expire_timeout=timedelta(hours=1)
    )
    service.produce("jobs", items("held", "idle"))
    held = lease(service, batch=1).items[0]
    clock.advance(timedelta(minutes=29))
    service.renew("jobs", 0, [held.id], lease_timeout=timedelta(minutes=40))
    clock.advance(timedelta(minutes=32))  # past expire_timeout; "held" still has a valid lease

    assert list(lease(service).items) == []

    assert payloads(service.list_items("dlq", 0)) == [b"idle"]
    assert service.complete("jobs", 0, [held.id]).applied == [held.id]


def test_idempotent_produce_stores_a_retried_request_once(service):
    make_queue(service, partitions=3)

    first = service.produce("jobs", items("a", "b"), idempotency_key="req-1")
    second = service.produce("jobs", items("a", "b"), idempotency_key="req-1")
    other = service.produce("jobs", items("c"), idempotency_key="req-2")

    assert (second.partition, second.ids) == (first.partition, first.ids)
    assert (first.replayed, second.replayed, other.replayed) == (False, True, False)
    assert other.ids != first.ids
    assert sum(s.total for s in service.stats("jobs")) == 3


def test_idempotent_produce_reports_a_request_still_in_progress(service, clock):
    make_queue(service)
    # The first request dies after recording its key, before writing items or finishing.
    if service.log is not None:
        dying = beside(
            service, clock, store=DiesAfterRecordingKey(service.store), log=DiesBeforeWriting(service.log)
        )
    else:
        dying = beside(service, clock, store=DiesAfterRecordingKey(service.store))
    dying.produce("jobs", items("a"), idempotency_key="k")

    with pytest.raises(RequestInProgressError):
        service.produce("jobs", items("a"), idempotency_key="k")
    clock.advance(timedelta(minutes=16))  # the first writer is now known dead: resume its write
    resumed = service.produce("jobs", items("a"), idempotency_key="k")
    assert payloads(service.list_items("jobs", resumed.partition)) == [b"a"]
    again = service.produce("jobs", items("a"), idempotency_key="k")
    assert (again.ids, again.replayed, resumed.replayed) == (resumed.ids, True, False)


def test_a_produce_that_meets_a_key_just_begun_by_another_request_is_in_progress(service, clock):
    queue = make_queue(service)
    # Another request has just begun the key's record and taken nothing yet (under engine v3 its
    # record names no ids then, like this request's own would): this one must not take it for its
    # own and store the items a second time.
    other = IdempotencyRecord(
        key=hashlib.sha256(b"k").hexdigest()[:32],
        partition=0,
        ids=[],
        done=False,
        started_at=clock.now(),
        queue_created_at=queue.created_at,
        owner="another-request",
    )
    won, _ = service.store.begin_idempotent(
        "jobs",
        other,
        stale_before=clock.now() - timedelta(minutes=15),
        expires_at=clock.now() + timedelta(days=1),
    )
    assert won

    with pytest.raises(RequestInProgressError):
        service.produce("jobs", items("a"), idempotency_key="k")
    assert sum(s.total for s in service.stats("jobs")) == 0


class DiesAfterRecordingKey:
    """The store as a request that dies after recording its idempotency key leaves it: that
    request's item and finish writes never land; everything else is the real store. On engine v3
    the key's record names the positions it took (``done=False``) before they are written: that
    note lands, the finish does not."""

    def __init__(self, store):
        self._store = store

    def put_new(self, *args, **kwargs):
        return None

    def finish_idempotent(self, *args, **kwargs):
        if kwargs.get("done") is False:
            return self._store.finish_idempotent(*args, **kwargs)
        return None

    def __getattr__(self, name):
        return getattr(self._store, name)


class DiesBeforeWriting:
    """Engine v3's claim log as the same request leaves it: it took its positions and never
    wrote them (``write_taken`` does nothing)."""

    def __init__(self, log):
        self._log = log

    def write_taken(self, key, ids, items, **kwargs):
        return list(items)

    def __getattr__(self, name):
        return getattr(self._log, name)
