"""Contract: payloads up to 1 MiB on every store, and no payload object outlives its item.

Engine v3 keeps an item of up to ``MAX_PAYLOAD_BYTES`` (1 MiB, SQS's limit). SQLite and memory keep
it in their rows; DynamoDB keeps a payload over ``OBJECT_PAYLOAD_BYTES`` (64 KiB) in the payload
bucket and the row keeps the object's key (``querator.storage.dynamodb.objects``, ADR 0102).
Each scenario checks the bucket after it: an item that ended (completed, deleted, cleared, dropped,
its queue deleted) leaves no object, and one that lives on (retried, dead-lettered, redriven) has
exactly one. On memory and SQLite there is no bucket, so ``objects`` is empty throughout and the
scenarios check the payloads alone.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from querator.domain.errors import InvalidRequestError, QueratorError
from querator.domain.model import MAX_PAYLOAD_BYTES, ROW_PAYLOAD_BYTES, ClearScope, NewItem, RetryRequest
from querator.storage.dynamodb.objects import OBJECT_PAYLOAD_BYTES, PayloadObjects, keep_until
from querator.testing import bucket_keys, build_service, dynamodb_client
from tests.contract.helpers import EXPIRE, LEASE, make_queue, payloads

if TYPE_CHECKING:
    from collections.abc import Iterator

    from querator.service import QueueService

pytestmark = pytest.mark.engine(3)

#: 1 MiB, each told apart by its first bytes.
BIG = MAX_PAYLOAD_BYTES


def big(tag: str, size: int = BIG) -> bytes:
    return tag.encode().ljust(size, b".")


def bucket(service: QueueService) -> PayloadObjects | None:
    return getattr(service.log, "payloads", None)


def objects(service: QueueService) -> list[str]:
    """The payload objects the store holds (none on a store without a bucket)."""
    found = bucket(service)
    return [] if found is None else bucket_keys(found)


def holds_objects(service: QueueService) -> bool:
    return bucket(service) is not None


def every_item(service: QueueService, queue: str) -> list[bytes]:
    info = service.get_queue(queue)
    stored = []
    for p in range(info.partitions):
        stored += service.list_items(queue, p) + service.list_scheduled(queue, p)
    return payloads(stored)


def test_a_1_mib_item_is_produced_listed_leased_dead_lettered_redriven_and_completed(service, clock):
    make_queue(service, "dlq")
    make_queue(service, "jobs", dead_queue="dlq")
    payload = big("one")

    service.produce("jobs", [NewItem(payload=payload, kind="big"), NewItem(payload=b"small")])

    assert every_item(service, "jobs") == [payload, b"small"]
    assert len(objects(service)) == (1 if holds_objects(service) else 0)
    leased = service.lease("jobs", batch_size=2, client_id="c")
    assert payloads(leased.items) == [payload, b"small"]
    assert service.list_items("jobs", 0)[0].payload == payload  # leased, listed with its payload
    dead = RetryRequest(id=leased.items[0].id, dead=True, reason="too big to handle")
    assert service.retry("jobs", leased.partition, [dead]).applied == [leased.items[0].id]
    assert service.complete("jobs", leased.partition, [leased.items[1].id]).applied

    assert every_item(service, "dlq") == [payload]
    assert every_item(service, "jobs") == []
    assert len(objects(service)) == (1 if holds_objects(service) else 0)

    assert service.redrive("dlq").moved == 1
    assert every_item(service, "jobs") == [payload] and every_item(service, "dlq") == []
    again = service.lease("jobs", batch_size=5, client_id="c")
    assert payloads(again.items) == [payload]
    assert len(objects(service)) == (1 if holds_objects(service) else 0)

    assert service.complete("jobs", again.partition, [again.items[0].id]).applied
    assert every_item(service, "jobs") == []
    assert objects(service) == []


def test_a_dead_letter_and_a_redrive_keep_an_object_for_the_later_expiry(service, clock):
    make_queue(service, "dlq", expire_timeout=timedelta(days=7))
    make_queue(service, "jobs", dead_queue="dlq")
    service.produce("jobs", [NewItem(payload=big("dead"))])
    first = objects(service)
    leased = service.lease("jobs", batch_size=1, client_id="c")
    service.retry("jobs", leased.partition, [RetryRequest(id=leased.items[0].id, dead=True)])

    kept = objects(service)
    dlq_deadline = service.list_items("dlq", 0)[0].expire_deadline
    if holds_objects(service):
        assert len(kept) == 1 and kept != first  # copied to a key kept for the dead letter's life
        assert keep_until(kept[0]) > dlq_deadline.timestamp()
    clock.advance(EXPIRE + timedelta(hours=1))  # past the first queue's expiry: the dead letter lives
    service.reap(clock.now(), timedelta(seconds=30))
    assert every_item(service, "dlq") == [big("dead")]
    assert objects(service) == kept


def test_retries_and_a_lapsed_lease_keep_one_object_throughout(service, clock):
    make_queue(service, "jobs")
    payload = big("retried")
    service.produce("jobs", [NewItem(payload=payload)])
    kept = objects(service)

    for _ in range(3):
        leased = service.lease("jobs", batch_size=1, client_id="c")
        assert payloads(leased.items) == [payload]
        service.retry("jobs", leased.partition, [RetryRequest(id=leased.items[0].id, reason="again")])
        assert objects(service) == kept
    service.lease("jobs", batch_size=1, client_id="c")
    clock.advance(LEASE + timedelta(seconds=1))
    service.reap(clock.now(), timedelta(seconds=30))

    back = service.lease("jobs", batch_size=1, client_id="other")
    assert payloads(back.items) == [payload] and back.items[0].attempts == 5
    assert objects(service) == kept
    service.complete("jobs", back.partition, [back.items[0].id])
    assert objects(service) == []


def test_a_retry_scheduled_for_later_keeps_its_payload(service, clock):
    make_queue(service, "jobs")
    service.produce("jobs", [NewItem(payload=big("later"))])
    leased = service.lease("jobs", batch_size=1, client_id="c")
    service.retry(
        "jobs", leased.partition, [RetryRequest(id=leased.items[0].id, retry_in=timedelta(minutes=5))]
    )

    assert payloads(service.list_scheduled("jobs", 0)) == [big("later")]
    clock.advance(timedelta(minutes=6))
    again = service.lease("jobs", batch_size=1, client_id="c")
    assert payloads(again.items) == [big("later")]
    service.complete("jobs", again.partition, [again.items[0].id])
    assert objects(service) == []


@pytest.mark.parametrize("scheduled", [False, True], ids=["waiting", "scheduled"])
def test_deleting_items_deletes_their_objects(service, clock, scheduled):
    make_queue(service, "jobs")
    at = clock.now() + timedelta(hours=1) if scheduled else None
    service.produce("jobs", [NewItem(payload=big(f"d{n}"), enqueue_at=at) for n in range(3)])
    listed = (service.list_scheduled if scheduled else service.list_items)("jobs", 0)
    assert len(objects(service)) == (3 if holds_objects(service) else 0)

    service.delete_items("jobs", 0, [listed[0].id, listed[2].id])

    assert every_item(service, "jobs") == [big("d1")]
    assert len(objects(service)) == (1 if holds_objects(service) else 0)


@pytest.mark.parametrize(
    "scope",
    [ClearScope.QUEUE, ClearScope.SCHEDULED, ClearScope.QUEUE | ClearScope.DESTRUCTIVE],
    ids=["queue", "scheduled", "destructive"],
)
def test_clear_deletes_the_objects_of_what_it_clears(service, clock, scope):
    make_queue(service, "jobs")
    later = clock.now() + timedelta(hours=1)
    service.produce("jobs", [NewItem(payload=big("leased"))])
    service.lease("jobs", batch_size=1, client_id="c")
    service.produce("jobs", [NewItem(payload=big("waiting")), NewItem(payload=b"small")])
    service.produce("jobs", [NewItem(payload=big("scheduled"), enqueue_at=later)])

    service.clear("jobs", scope)

    left = every_item(service, "jobs")
    expected = {
        "queue": [big("leased"), big("scheduled")],
        "scheduled": [big("leased"), big("waiting"), b"small"],
        "destructive": [big("scheduled")],
    }[{ClearScope.QUEUE: "queue", ClearScope.SCHEDULED: "scheduled"}.get(scope, "destructive")]
    assert sorted(left) == sorted(expected)
    assert len(objects(service)) == (
        len([p for p in left if len(p) > OBJECT_PAYLOAD_BYTES]) if holds_objects(service) else 0
    )


def test_a_dead_letter_with_no_dead_letter_queue_is_dropped_with_its_object(service, clock):
    make_queue(service, "jobs", max_attempts=1)
    service.produce("jobs", [NewItem(payload=big("a")), NewItem(payload=big("b"))])
    leased = service.lease("jobs", batch_size=2, client_id="c")

    service.retry("jobs", leased.partition, [RetryRequest(id=leased.items[0].id, dead=True)])
    assert len(objects(service)) == (1 if holds_objects(service) else 0)
    clock.advance(LEASE + timedelta(seconds=1))  # the other one's lease lapses at its last attempt
    service.reap(clock.now(), timedelta(seconds=30))

    assert every_item(service, "jobs") == []
    assert objects(service) == []


def test_items_that_expire_leave_no_object(service, clock):
    make_queue(service, "jobs")
    service.produce("jobs", [NewItem(payload=big("old"))])
    clock.advance(EXPIRE + timedelta(minutes=1))

    service.reap(clock.now(), timedelta(seconds=30))

    assert every_item(service, "jobs") == []
    assert objects(service) == []


def test_a_deleted_queue_leaves_no_object_once_reaped(service, clock):
    make_queue(service, "jobs", partitions=2)
    for _ in range(2):
        service.produce("jobs", [NewItem(payload=big("q1")), NewItem(payload=big("q2"))])
    service.lease("jobs", batch_size=1, client_id="c")
    make_queue(service, "other")
    service.produce("other", [NewItem(payload=big("kept"))])

    service.delete_queue("jobs")
    for _ in range(5):
        service.reap(clock.now(), timedelta(seconds=30))

    assert len(objects(service)) == (1 if holds_objects(service) else 0)
    assert every_item(service, "other") == [big("kept")]


@pytest.fixture
def with_bucket(clock) -> Iterator[QueueService]:
    """Engine v3 on in-process moto with a payload bucket: what only a store with objects can show
    (memory and SQLite write a payload in one write with its row, so they leave nothing to sweep and
    no upload to fail)."""
    with mock_aws():
        yield build_service(dynamodb_client(), clock=clock, engine=3)


def test_the_sweep_deletes_an_orphan_past_its_time_and_keeps_a_live_items(with_bucket, clock):
    service = with_bucket
    store = bucket(service)
    assert store is not None
    make_queue(service, "jobs")
    service.produce("jobs", [NewItem(payload=big("live"))])
    live = objects(service)
    orphan = store.put(b"a producer died before its rows", clock.now())  # kept until now
    clock.advance(timedelta(seconds=2))

    report = service.reap(clock.now(), timedelta(seconds=30))

    assert report.payloads_swept == 1
    assert objects(service) == live and orphan not in objects(service)
    assert payloads(service.lease("jobs", batch_size=1, client_id="c").items) == [big("live")]


def test_an_idempotent_produce_retried_stores_one_object_per_item(service):
    make_queue(service, "jobs")
    batch = [NewItem(payload=big("once"))]

    first = service.produce("jobs", batch, idempotency_key="k-1")
    second = service.produce("jobs", batch, idempotency_key="k-1")

    assert first.ids == second.ids
    assert every_item(service, "jobs") == [big("once")]
    assert len(objects(service)) == (1 if holds_objects(service) else 0)


def test_a_payload_over_1_mib_is_refused_and_nothing_is_stored(service):
    make_queue(service, "jobs")

    with pytest.raises(InvalidRequestError, match=rf"item payload is larger than {BIG} bytes"):
        service.produce("jobs", [NewItem(payload=b"fine"), NewItem(payload=big("over", BIG + 1))])

    assert every_item(service, "jobs") == []
    assert objects(service) == []


@pytest.mark.engine(2)
def test_engine_v2_keeps_its_row_limit(service):
    make_queue(service, "jobs")
    service.produce("jobs", [NewItem(payload=big("fits", ROW_PAYLOAD_BYTES))])

    over = [NewItem(payload=b"fine"), NewItem(payload=big("over", ROW_PAYLOAD_BYTES + 1))]
    with pytest.raises(InvalidRequestError, match=rf"items\[1\]: .* larger than {ROW_PAYLOAD_BYTES} bytes"):
        service.produce("jobs", over)

    assert every_item(service, "jobs") == [big("fits", ROW_PAYLOAD_BYTES)]


def test_a_payload_over_64_kib_goes_to_the_bucket_and_one_of_64_kib_stays_in_its_row(with_bucket):
    service = with_bucket
    make_queue(service, "jobs")
    service.produce("jobs", [NewItem(payload=big("row", OBJECT_PAYLOAD_BYTES))])
    assert objects(service) == []

    service.produce("jobs", [NewItem(payload=big("object", OBJECT_PAYLOAD_BYTES + 1))])

    assert len(objects(service)) == 1
    assert every_item(service, "jobs") == [
        big("row", OBJECT_PAYLOAD_BYTES),
        big("object", OBJECT_PAYLOAD_BYTES + 1),
    ]
    leased = service.lease("jobs", batch_size=2, client_id="c")
    service.complete("jobs", leased.partition, [item.id for item in leased.items])
    assert objects(service) == []


def test_a_clear_reads_a_bounded_number_of_rows_and_leaves_the_rest_to_the_sweep(
    with_bucket, clock, monkeypatch
):
    from querator.storage.dynamodb.log import upkeep  # noqa: PLC0415 - the bound, made small

    monkeypatch.setattr(upkeep, "_CLEAR_PAGES", 1)
    monkeypatch.setattr(upkeep, "_CLEAR_PAGE", 1)
    service = with_bucket
    make_queue(service, "jobs")
    for n in range(3):  # a row each
        service.produce("jobs", [NewItem(payload=big(f"c{n}"))])

    service.clear("jobs", ClearScope.QUEUE)

    assert every_item(service, "jobs") == []
    # One page: the row holding the cursor and one more. Their objects went; the third waits.
    assert len(objects(service)) == 1
    clock.advance(EXPIRE + timedelta(days=1, minutes=1))
    assert service.reap(clock.now(), timedelta(seconds=30)).payloads_swept == 1
    assert objects(service) == []


def test_a_bucket_that_fails_the_upload_fails_the_produce_and_stores_no_item(with_bucket, monkeypatch):
    service = with_bucket
    make_queue(service, "jobs")
    store = bucket(service)
    assert store is not None

    real = store._client.put_object
    calls: list[str] = []

    def second_refused(**request: Any) -> Any:
        calls.append(request["Key"])
        if len(calls) == 2:
            raise ClientError({"Error": {"Code": "InternalError", "Message": "injected"}}, "PutObject")
        return real(**request)

    monkeypatch.setattr(store._client, "put_object", second_refused)
    with pytest.raises(QueratorError, match="payload bucket: put failed"):
        service.produce("jobs", [NewItem(payload=big("first")), NewItem(payload=big("lost"))])

    assert len(calls) == 2  # the first was stored, then deleted when the second failed

    assert every_item(service, "jobs") == []
    assert objects(service) == []
    assert service.stats("jobs")[0].total == 0
