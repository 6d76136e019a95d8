"""``storage/items.import`` on every store and both engines: the item limits a produce has, and an
imported item's place in lease order (docs/api.md, docs/ordering.md)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from querator.domain.errors import InvalidRequestError, NothingToLeaseError
from querator.domain.model import (
    LATEST_SCHEDULE,
    MAX_IMPORTED_COUNT,
    MAX_PAYLOAD_BYTES,
    MAX_QUEUE_NAME_BYTES,
    MAX_REASON_BYTES,
    MAX_REFERENCE_BYTES,
    NewItem,
    RetryRequest,
    StorageItem,
)
from tests.contract.helpers import LEASE, make_queue, payloads

STEP = timedelta(milliseconds=50)


def lease_all(service, queue: str = "jobs") -> list:
    """Every item a run of leases hands out until nothing is left, in the order handed out."""
    leased = []
    while True:
        try:
            leased += service.lease(queue, batch_size=10, client_id="c").items
        except NothingToLeaseError:
            return leased


def stored(service, queue: str = "jobs") -> list:
    return service.list_items(queue, 0) + service.list_scheduled(queue, 0)


# -- the limits of a produced item ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"payload": b"x" * (MAX_PAYLOAD_BYTES + 1)}, "item payload is larger than 1048576 bytes"),
        ({"payload": b"x" * 2_000_000}, "item payload is larger than 1048576 bytes"),
        ({"reference": "r" * (MAX_REFERENCE_BYTES + 1)}, "item reference is longer than 2000 bytes"),
        ({"reference": "r" * 200_000}, "item reference is longer than 2000 bytes"),
        ({"encoding": "é" * 1001}, "item encoding is longer than 2000 bytes"),
        ({"kind": "k" * (MAX_REFERENCE_BYTES + 1)}, "item kind is longer than 2000 bytes"),
        ({"source_id": "s" * (MAX_REFERENCE_BYTES + 1)}, "item source_id is longer than 2000 bytes"),
        ({"source_queue": "q" * (MAX_QUEUE_NAME_BYTES + 1)}, "item source_queue is longer than 512 bytes"),
        # What a stored row holds (the v3 row codec's u32 counts, a row's TTL from the deadline).
        ({"attempts": 2**31}, "attempts must be between 0 and 2147483647"),
        ({"failures": 2**31}, "failures must be between 0 and 2147483647"),
        ({"expire_deadline": LATEST_SCHEDULE}, "expire_deadline must be before 3000"),
    ],
    ids=[
        "payload",
        "payload-1MB",
        "reference",
        "reference-200KB",
        "encoding",
        "kind",
        "source_id",
        "source_queue",
        "attempts",
        "failures",
        "expire_deadline",
    ],
)
def test_an_import_over_an_item_limit_is_refused_as_a_produce_is_and_nothing_is_stored(
    service, fields, message
):
    make_queue(service)
    with pytest.raises(InvalidRequestError, match=message):
        service.import_items("jobs", 0, [StorageItem(payload=b"fine"), StorageItem(**fields)])

    if set(fields) <= {"payload", "reference", "encoding", "kind"}:
        # The same item produced is refused with the same words.
        with pytest.raises(InvalidRequestError, match=message):
            service.produce("jobs", [NewItem(**fields)])
    assert stored(service) == []


def test_an_import_at_every_item_limit_is_stored_whole(service, clock):
    """The largest item an import takes fits each store (a DynamoDB item is at most 400 KB)."""
    make_queue(service)
    largest = StorageItem(
        payload=b"p" * service.payload_limit,
        reference="r" * MAX_REFERENCE_BYTES,
        encoding="e" * MAX_REFERENCE_BYTES,
        kind="k" * MAX_REFERENCE_BYTES,
        group="g" * 128,
        source_id="s" * MAX_REFERENCE_BYTES,
        source_queue="q" * MAX_QUEUE_NAME_BYTES,
        last_reason="x" * MAX_REASON_BYTES,
        failures=MAX_IMPORTED_COUNT,
        attempts=MAX_IMPORTED_COUNT,
        expire_deadline=LATEST_SCHEDULE - timedelta(microseconds=1),
    )

    (new_id,) = service.import_items("jobs", 0, [largest])

    (item,) = service.list_items("jobs", 0)
    assert item.id == new_id and item.payload == largest.payload
    assert (item.reference, item.encoding, item.kind, item.group) == (
        largest.reference,
        largest.encoding,
        largest.kind,
        largest.group,
    )
    assert (item.source_id, item.source_queue, item.last_reason, item.failures) == (
        largest.source_id,
        largest.source_queue,
        largest.last_reason,
        MAX_IMPORTED_COUNT,
    )
    (leased,) = service.lease("jobs", batch_size=1, client_id="c").items
    assert leased.payload == largest.payload and leased.attempts == MAX_IMPORTED_COUNT + 1
    # Back to the queue with one more failure: the counts go on past the import's limit.
    assert service.retry("jobs", 0, [RetryRequest(id=leased.id, reason="again")]).failed == []
    (back,) = service.list_items("jobs", 0)
    assert (back.attempts, back.failures, back.payload) == (
        MAX_IMPORTED_COUNT + 1,
        MAX_IMPORTED_COUNT + 1,
        largest.payload,
    )


# -- where an imported item goes -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delivery", "fields"),
    [("fifo", {}), ("fifo", {"priority": 2}), ("fair", {"group": "g"}), ("fair", {})],
    ids=["fifo", "priority-2", "fair-group", "fair-no-group"],
)
def test_an_imported_item_is_leased_after_items_produced_before_it(service, clock, delivery, fields):
    """Within a priority oldest first, by when each item became ready: an import lands at the tail,
    behind what was produced before it, ahead of what is produced after it; ``created_at`` is kept
    as given (a listing's item, a day old) and does not move it."""
    make_queue(service, delivery=delivery)
    service.produce("jobs", [NewItem(payload=b"produced-first", **fields)])
    clock.advance(STEP)
    day_old = clock.now() - timedelta(days=1)
    service.import_items(
        "jobs",
        0,
        [
            StorageItem(payload=b"imported-second", created_at=day_old, source_id="src-2", **fields),
            StorageItem(payload=b"imported-second-b", source_id="src-2b", **fields),
        ],
    )
    clock.advance(STEP)
    service.produce("jobs", [NewItem(payload=b"produced-third", **fields)])

    order = [b"produced-first", b"imported-second", b"imported-second-b", b"produced-third"]
    listed = service.list_items("jobs", 0)
    assert payloads(listed) == order
    assert listed[1].created_at == day_old and listed[1].source_id == "src-2"
    leased = service.lease("jobs", batch_size=4, client_id="c").items
    assert payloads(leased) == order


def test_an_import_of_a_higher_priority_still_comes_first(service, clock):
    make_queue(service)
    service.produce("jobs", [NewItem(payload=b"five")])
    clock.advance(STEP)
    service.import_items("jobs", 0, [StorageItem(payload=b"zero", priority=0)])

    assert payloads(service.lease("jobs", batch_size=2, client_id="c").items) == [b"zero", b"five"]


def test_an_imported_item_keeps_created_at_and_expire_timeout_counts_from_the_import(service, clock):
    """docs/api.md: ``created_at`` as given, and ``expire_timeout`` counted from when the item first
    became visible (here: the import), so an item created two hours before an import into a queue
    with an hour's ``expire_timeout`` is leased, not dead-lettered; a given ``expire_deadline`` is
    kept, and one that passed dead-letters the item (deleted: no dead-letter queue)."""
    make_queue(service, expire_timeout=timedelta(hours=1))
    created = clock.now() - timedelta(hours=2)
    imported_at = clock.now()
    service.import_items(
        "jobs",
        0,
        [
            StorageItem(payload=b"old", created_at=created),
            StorageItem(
                payload=b"outlived", created_at=created, expire_deadline=clock.now() - timedelta(seconds=1)
            ),
        ],
    )

    old, outlived = service.list_items("jobs", 0)
    assert (old.created_at, old.expire_deadline) == (created, imported_at + timedelta(hours=1))
    assert outlived.expire_deadline == imported_at - timedelta(seconds=1)
    leased = lease_all(service)
    assert payloads(leased) == [b"old"] and leased[0].created_at == created
    assert payloads(stored(service)) == [b"old"]


def test_a_scheduled_import_joins_the_tail_when_due(service, clock):
    make_queue(service)
    service.produce("jobs", [NewItem(payload=b"a")])
    service.import_items("jobs", 0, [StorageItem(payload=b"later", enqueue_in=timedelta(seconds=10))])
    clock.advance(timedelta(seconds=1))
    service.produce("jobs", [NewItem(payload=b"c")])

    (scheduled,) = service.list_scheduled("jobs", 0)
    assert scheduled.payload == b"later" and scheduled.enqueue_at == clock.now() + timedelta(seconds=9)
    assert payloads(service.lease("jobs", batch_size=3, client_id="c").items) == [b"a", b"c"]
    clock.advance(timedelta(seconds=9))
    assert payloads(service.lease("jobs", batch_size=3, client_id="c").items) == [b"later"]


def test_a_repeated_import_skips_source_ids_in_every_state_and_lane(service, clock):
    """The ``source_id`` skip sees every item of the partition: waiting, leased and scheduled ones,
    of every priority and group lane, however the first import stored them."""
    make_queue(service, delivery="fair")
    batch = [
        StorageItem(payload=b"plain", source_id="s-plain"),
        StorageItem(payload=b"group", group="g", source_id="s-group"),
        StorageItem(payload=b"urgent", priority=1, source_id="s-urgent"),
        StorageItem(payload=b"later", enqueue_in=timedelta(hours=1), source_id="s-later"),
        StorageItem(payload=b"held", lease_deadline=clock.now() + LEASE, source_id="s-held"),
    ]
    assert len(service.import_items("jobs", 0, batch)) == 5
    (leased,) = service.lease("jobs", batch_size=1, client_id="c").items
    assert leased.payload == b"urgent"

    assert service.import_items("jobs", 0, batch) == []
    fresh = service.import_items("jobs", 0, [*batch, StorageItem(payload=b"new", source_id="s-new")])

    assert len(fresh) == 1
    assert sorted(payloads(stored(service))) == [b"group", b"held", b"later", b"new", b"plain", b"urgent"]


def test_an_imported_dead_letter_keeps_where_it_came_from_and_goes_back_at_the_tail(service, clock):
    make_queue(service, "dlq")
    make_queue(service, "jobs", dead_queue="dlq")
    service.import_items(
        "dlq",
        0,
        [StorageItem(payload=b"dead", attempts=3, source_queue="jobs", last_reason="boom", failures=3)],
    )
    (dead,) = service.list_items("dlq", 0)
    assert (dead.source_queue, dead.last_reason, dead.failures, dead.attempts) == ("jobs", "boom", 3, 3)
    service.produce("jobs", [NewItem(payload=b"waiting")])
    clock.advance(STEP)

    assert service.redrive("dlq").moved == 1

    back = service.lease("jobs", batch_size=2, client_id="c").items
    assert payloads(back) == [b"waiting", b"dead"]
    assert (back[1].last_reason, back[1].failures) == ("boom", 3)


def test_an_imported_lease_still_valid_holds_the_item_until_its_deadline(service, clock):
    make_queue(service)
    service.import_items(
        "jobs", 0, [StorageItem(payload=b"held", attempts=1, lease_deadline=clock.now() + LEASE)]
    )

    (listed,) = service.list_items("jobs", 0)
    assert listed.is_leased(clock.now())
    stats = service.stats("jobs")[0]
    assert (stats.total, stats.total_leased) == (1, 1)
    assert lease_all(service) == []

    clock.advance(LEASE + timedelta(seconds=1))
    (back,) = lease_all(service)
    assert (back.payload, back.attempts, back.last_reason, back.failures) == (b"held", 2, "lease ran out", 1)


def test_an_imported_lease_that_ran_out_goes_back_with_its_failure_recorded(service, clock):
    make_queue(service)
    service.import_items(
        "jobs",
        0,
        [StorageItem(payload=b"lapsed", attempts=1, lease_deadline=clock.now() - timedelta(seconds=5))],
    )

    leased = lease_all(service)
    # Engine v2 puts it back at the tail when a lease finds it, leasable from the next moment on.
    clock.advance(timedelta(seconds=1))
    (back,) = leased + lease_all(service)

    assert (back.payload, back.attempts, back.last_reason, back.failures) == (
        b"lapsed",
        2,
        "lease ran out",
        1,
    )


def test_an_imported_lease_that_ran_out_on_its_last_attempt_is_dead_lettered(service, clock):
    make_queue(service, "dlq")
    make_queue(service, "jobs", dead_queue="dlq", max_attempts=2)
    service.import_items(
        "jobs",
        0,
        [
            StorageItem(payload=b"spent", attempts=2, lease_deadline=clock.now() - timedelta(seconds=5)),
            StorageItem(payload=b"fresh"),
        ],
    )

    assert payloads(lease_all(service)) == [b"fresh"]
    (dead,) = service.list_items("dlq", 0)
    assert (dead.payload, dead.attempts, dead.source_queue) == (b"spent", 2, "jobs")
    assert dead.last_reason == "max attempts: lease ran out"


def test_a_repeated_import_skips_source_ids_past_the_first_page_of_a_log(service):
    make_queue(service)
    batch = [StorageItem(payload=b"x", source_id=f"s-{n}") for n in range(250)]
    assert len(service.import_items("jobs", 0, batch)) == 250

    assert service.import_items("jobs", 0, batch) == []
    assert len(service.list_items("jobs", 0)) == 250


def test_an_import_lands_in_the_partition_it_names(service):
    make_queue(service, partitions=2)
    service.import_items("jobs", 1, [StorageItem(payload=b"one"), StorageItem(payload=b"two")])

    assert payloads(service.list_items("jobs", 1)) == [b"one", b"two"]
    assert service.list_items("jobs", 0) == []
    leased = service.lease("jobs", batch_size=2, client_id="c")
    assert (leased.partition, payloads(leased.items)) == (1, [b"one", b"two"])


def test_a_repeated_import_of_large_items_skips_them_across_pages(service):
    """The source-id read pages by the bytes the log's largest item may take: ten of these a page."""
    make_queue(service)
    batch = [StorageItem(payload=bytes([n]) * service.payload_limit, source_id=f"big-{n}") for n in range(12)]
    assert len(service.import_items("jobs", 0, batch)) == 12

    assert service.import_items("jobs", 0, batch) == []
    assert service.import_items("jobs", 0, batch[11:]) == []
