"""Every client method against ``querator serve`` (the real handlers over the embedded store),
including the error paths: unknown queue, stale id, bad duration, name taken."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest

from querator.client import (
    BadRequestError,
    Client,
    ItemNotLeasedError,
    NewItem,
    QueueExistsError,
    QueueNotFoundError,
    RetryItem,
)


def _create(client: Client, name: str, **options: object) -> str:
    client.create_queue(
        name, lease_timeout=options.pop("lease_timeout", "30s"), expire_timeout="1h", **options
    )  # type: ignore[arg-type]
    return name


def test_health(client: Client) -> None:
    assert client.health() == "pass"


def test_create_info_update_list_delete(client: Client, queue_name: str) -> None:
    client.create_queue(
        queue_name,
        lease_timeout=timedelta(seconds=90),
        expire_timeout="24h",
        max_attempts=5,
        reference="orders",
        requested_partitions=2,
    )

    info = client.queue_info(queue_name)
    assert info.queue_name == queue_name
    assert info.lease_timeout == timedelta(seconds=90)
    assert info.expire_timeout == timedelta(hours=24)
    assert (info.max_attempts, info.reference, info.requested_partitions) == (5, "orders", 2)
    assert info.created_at is not None and info.created_at.tzinfo is not None
    assert info.to_wire()["lease_timeout"] == "1m30s"

    client.update_queue(queue_name, lease_timeout=45.0, reference="billing")
    updated = client.queue_info(queue_name)
    assert updated.lease_timeout == timedelta(seconds=45)
    assert updated.reference == "billing"
    assert updated.max_attempts == 5

    assert queue_name in [q.queue_name for q in client.list_queues(pivot=queue_name, limit=1)]

    client.delete_queue(queue_name)
    with pytest.raises(QueueNotFoundError):
        client.queue_info(queue_name)


def test_iter_queues_pages_through_every_queue(client: Client, queue_name: str) -> None:
    names = [_create(client, f"{queue_name}-{n}") for n in range(5)]

    listed = [q.queue_name for q in client.iter_queues(pivot=queue_name, page_size=2)]

    assert [n for n in listed if n.startswith(queue_name)] == names


def test_unknown_queue_is_a_typed_error_with_the_envelope(client: Client, queue_name: str) -> None:
    with pytest.raises(QueueNotFoundError) as raised:
        client.produce(queue_name, [b"x"])
    assert raised.value.code == 400
    assert raised.value.code_text == "Bad Request"
    assert raised.value.stable_class == "Queue does not exist"
    assert queue_name in raised.value.message


def test_bad_duration_names_the_field(client: Client, queue_name: str) -> None:
    with pytest.raises(BadRequestError) as raised:
        client.create_queue(queue_name, lease_timeout="5x", expire_timeout="1h")
    assert raised.value.stable_class == "Invalid request"
    assert "lease_timeout" in raised.value.details
    assert "invalid duration" in raised.value.details


def test_a_taken_name_is_queue_exists(client: Client, queue_name: str) -> None:
    _create(client, queue_name)
    with pytest.raises(QueueExistsError):
        _create(client, queue_name)


def test_produce_lease_complete_round_trip_keeps_payloads_and_order(client: Client, queue_name: str) -> None:
    _create(client, queue_name)
    client.produce(
        queue_name,
        [b"\x00\xffbinary", "text é", NewItem(payload=b"p", reference="ref-1", encoding="raw", kind="k")],
    )

    lease = client.lease(queue_name, 10, request_timeout="1s")

    assert [i.payload for i in lease.items] == [b"\x00\xffbinary", "text é".encode(), b"p"]
    assert lease.items[2].reference == "ref-1"
    assert (lease.items[2].encoding, lease.items[2].kind) == ("raw", "k")
    assert all(i.attempts == 1 and i.lease_deadline is not None for i in lease.items)
    client.complete(queue_name, lease.items, request_timeout="5s")
    assert client.stats(queue_name).total == 0


def test_lease_with_nothing_to_lease_is_empty_after_the_request_timeout(
    client: Client, queue_name: str
) -> None:
    _create(client, queue_name)
    started = time.monotonic()
    lease = client.lease(queue_name, 5, request_timeout="300ms")
    assert lease.items == ()
    assert time.monotonic() - started >= 0.3


def test_stale_id_fails_alone_and_the_other_ids_are_applied(client: Client, queue_name: str) -> None:
    _create(client, queue_name, lease_timeout="1s")
    client.produce(queue_name, [b"a", b"b"])
    first = client.lease(queue_name, 1)
    # Put the item back: its id is now stale (fencing), the item has a new one.
    client.retry(queue_name, first.items)
    lease = client.lease(queue_name, 2)
    assert sorted(i.payload for i in lease.items) == [b"a", b"b"]

    with pytest.raises(ItemNotLeasedError) as raised:
        client.complete(queue_name, [first.items[0].id, *lease.ids], partition=lease.partition)

    assert raised.value.failed_ids == (first.items[0].id,)
    assert client.stats(queue_name).total == 0


def test_renew_extends_the_lease_and_refuses_stale_ids(client: Client, queue_name: str) -> None:
    _create(client, queue_name, lease_timeout="2s")
    client.produce(queue_name, [b"a"])
    lease = client.lease(queue_name, 1)
    before = lease.items[0].lease_deadline
    assert before is not None

    renewal = client.renew(queue_name, lease.items, lease_timeout="1m")

    assert [r.id for r in renewal.items] == lease.ids
    after = renewal.items[0].lease_deadline
    assert after is not None and after - before > timedelta(seconds=50)
    client.complete(queue_name, lease.items)
    with pytest.raises(ItemNotLeasedError) as raised:
        client.renew(queue_name, lease.items)
    assert raised.value.failed_ids == tuple(lease.ids)


def test_retry_later_schedules_and_dead_retry_dead_letters(client: Client, queue_name: str) -> None:
    dead_queue = _create(client, f"{queue_name}-dead")
    _create(client, queue_name, dead_queue=dead_queue)
    client.produce(queue_name, [b"later", b"dead"])
    lease = client.lease(queue_name, 2)
    later, dead = lease.items

    client.retry(
        queue_name,
        [
            RetryItem(id=later.id, retry_at=datetime.now(UTC) + timedelta(hours=1)),
            RetryItem(id=dead.id, dead=True),
        ],
        partition=lease.partition,
    )

    scheduled = client.list_scheduled(queue_name)
    assert [i.payload for i in scheduled] == [b"later"]
    assert scheduled[0].enqueue_at is not None
    assert client.stats(queue_name).scheduled == 1
    dead_letters = client.list_items(dead_queue)
    assert [(i.payload, i.source_id) for i in dead_letters] == [(b"dead", dead.id)]


@pytest.mark.parametrize(
    "when",
    [
        {"retry_at": timedelta(seconds=30)},
        {"retry_at": "30s"},
        {"retry_in": 30},
        {"retry_in": "30s"},
        {"retry_in": timedelta(seconds=30)},
    ],
    ids=[
        "retry_at-timedelta",
        "retry_at-duration-text",
        "retry_in-seconds",
        "retry_in-text",
        "retry_in-timedelta",
    ],
)
def test_retry_takes_a_delay_counted_from_the_server_clock(
    client: Client, queue_name: str, when: dict[str, object]
) -> None:
    _create(client, queue_name)
    client.produce(queue_name, [b"later"])
    lease = client.lease(queue_name, 1)
    before = datetime.now(UTC)

    client.retry(queue_name, lease.items, **when)  # type: ignore[arg-type]

    after = datetime.now(UTC)
    scheduled = client.list_scheduled(queue_name)
    assert [i.payload for i in scheduled] == [b"later"]
    at = scheduled[0].enqueue_at
    assert at is not None
    assert before + timedelta(seconds=30) <= at <= after + timedelta(seconds=30)


def test_produce_takes_a_delay_per_item_or_for_bare_payloads(client: Client, queue_name: str) -> None:
    _create(client, queue_name)
    before = datetime.now(UTC)
    client.produce(queue_name, [NewItem(payload=b"a", enqueue_at=timedelta(minutes=5))])
    client.produce(queue_name, [NewItem(payload=b"b", enqueue_in="10m")])
    client.produce(queue_name, [b"c"], enqueue_in=timedelta(minutes=15))
    after = datetime.now(UTC)

    scheduled = client.list_scheduled(queue_name)
    assert [i.payload for i in scheduled] == [b"a", b"b", b"c"]
    for item, minutes in zip(scheduled, (5, 10, 15), strict=True):
        assert item.enqueue_at is not None
        assert before + timedelta(minutes=minutes) <= item.enqueue_at <= after + timedelta(minutes=minutes)


def test_a_negative_delay_or_both_times_raise_before_sending(client: Client, queue_name: str) -> None:
    with pytest.raises(ValueError, match="not both"):
        RetryItem(id="x", retry_at=datetime.now(UTC), retry_in="1s")
    with pytest.raises(ValueError, match="not both"):
        RetryItem(id="x", retry_at="1s", retry_in="1s")
    with pytest.raises(ValueError, match="must not be negative"):
        NewItem(payload=b"x", enqueue_in=timedelta(seconds=-1))
    with pytest.raises(ValueError, match="must not be negative"):
        client.retry(queue_name, ["x"], retry_at=timedelta(seconds=-5))


def test_the_server_refuses_a_negative_delay_naming_the_field(served_url: str, queue_name: str) -> None:
    # Past the client's own check: what another client sending "-5s" gets.
    request = urllib.request.Request(  # noqa: S310 - the test server, http://127.0.0.1
        f"{served_url}/v1/queue.retry",
        data=json.dumps({"queue_name": queue_name, "items": [{"id": "x", "retry_in": "-5s"}]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)  # noqa: S310 - the test server, http://127.0.0.1
    assert refused.value.code == 400
    assert "items[0].retry_in: must not be negative" in refused.value.read().decode()


def test_scheduled_produce_and_clear(client: Client, queue_name: str) -> None:
    _create(client, queue_name)
    client.produce(
        queue_name, [NewItem(payload=b"s", enqueue_at=datetime.now(UTC) + timedelta(hours=1)), b"now"]
    )
    stats = client.stats(queue_name)
    assert (stats.total, stats.scheduled) == (1, 1)

    client.clear(queue_name, scheduled=True)
    assert client.stats(queue_name).scheduled == 0
    client.clear(queue_name, queue=True)
    assert client.stats(queue_name).total == 0


def test_clear_needs_a_scope(client: Client, queue_name: str) -> None:
    _create(client, queue_name)
    with pytest.raises(BadRequestError, match="queue"):
        client.clear(queue_name)


def test_idempotent_produce_stores_once(client: Client, queue_name: str) -> None:
    _create(client, queue_name)
    said = [client.produce(queue_name, [b"once"], idempotency_key=f"{queue_name}-k") for _ in range(3)]
    assert [i.payload for i in client.list_items(queue_name)] == [b"once"]
    # The server says which call stored the items; without a key it says nothing.
    assert [p.replayed for p in said] == [False, True, True]
    assert client.produce(queue_name, [b"other"]).replayed is None


def test_list_import_and_delete_items(client: Client, queue_name: str) -> None:
    source = _create(client, f"{queue_name}-src")
    target = _create(client, queue_name)
    client.produce(source, [b"1", b"2", b"3"])
    listed = client.list_items(source)
    assert [i.payload for i in listed] == [b"1", b"2", b"3"]
    assert [i.payload for i in client.iter_items(source, page_size=2)] == [b"1", b"2", b"3"]
    assert [i.payload for i in client.list_items(source, pivot=listed[1].id, limit=1)] == [b"2"]

    imported = client.import_items(
        target, [*(i.__class__(**{**_fields(i), "source_id": i.id}) for i in listed)]
    )
    assert len(imported.ids) == 3
    again = client.import_items(target, [{"payload": "", "source_id": listed[0].id}])
    assert again.ids == ()

    client.delete_items(target, imported.ids[:2])
    client.delete_items(target, imported.ids[:2])
    assert [i.payload for i in client.list_items(target)] == [b"3"]


def _fields(item: object) -> dict[str, object]:
    return {name: getattr(item, name) for name in item.__dataclass_fields__}  # type: ignore[attr-defined]


def test_lease_on_a_deleted_queue_is_queue_not_found(client: Client, queue_name: str) -> None:
    _create(client, queue_name)
    client.delete_queue(queue_name)
    with pytest.raises(QueueNotFoundError):
        client.lease(queue_name, 1, request_timeout="100ms")
