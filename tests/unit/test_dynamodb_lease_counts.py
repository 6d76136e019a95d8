"""The DynamoDB item store's ``note_leased`` on an item that came due since the last schedule pass:
it moves the item from the scheduled count to the leased one, reading the schedule mark only when
such an item is among those leased, and never raises after the claims (moto in process)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import pytest
from moto import mock_aws

from querator.domain.errors import StoreUnavailableError
from querator.domain.ids import visible_bound
from querator.domain.model import Item
from querator.storage.dynamodb import schema
from querator.storage.dynamodb.store import DynamoDBItemStore
from querator.testing import dynamodb_client

if TYPE_CHECKING:
    from collections.abc import Iterator

TABLE = "lease-counts-items"
NOW = datetime(2026, 11, 27, 12, 0, tzinfo=timezone.utc)
LATER = NOW + timedelta(seconds=5)


@pytest.fixture
def store_and_calls() -> Iterator[tuple[DynamoDBItemStore, list[str]]]:
    with mock_aws():
        client = dynamodb_client()
        client.create_table(**schema.items_table_definition(TABLE))
        calls: list[str] = []

        def record(model: Any, **_: Any) -> None:
            calls.append(model.name)

        client.meta.events.register("provide-client-params.dynamodb.*", record)
        yield DynamoDBItemStore(client, TABLE, concurrency=1), calls


def stored(item_id: str, *, enqueue_at: datetime | None) -> Item:
    return Item(
        id=item_id,
        payload=b"x",
        expire_deadline=NOW + timedelta(days=1),
        created_at=NOW,
        enqueue_at=enqueue_at,
    )


def claim_at(store: DynamoDBItemStore, item: Item, now: datetime) -> list[Item]:
    return store.claim("q", 0, [item.id], lease_deadline=now + timedelta(seconds=30), now=now).applied


def counts(store: DynamoDBItemStore) -> tuple[int, int, int]:
    head = store.heads("q", [0])[0]
    return head.items, head.leased, head.scheduled


def test_a_scheduled_item_leased_before_the_pass_moves_to_the_leased_count(store_and_calls) -> None:
    store, calls = store_and_calls
    scheduled = stored(visible_bound(LATER) + "0" * 16, enqueue_at=LATER)
    store.put_new("q", 0, [scheduled], now=NOW)
    assert counts(store) == (1, 0, 1)
    leased = claim_at(store, scheduled, LATER + timedelta(seconds=1))
    calls.clear()

    store.note_leased("q", 0, leased, cursor=None)

    assert calls == ["BatchGetItem", "UpdateItem"]  # the mark, then the counters
    assert counts(store) == (1, 1, 0)


def test_ordinary_items_lease_without_reading_the_mark(store_and_calls) -> None:
    store, calls = store_and_calls
    ready = stored(visible_bound(NOW) + "0" * 16, enqueue_at=None)
    store.put_new("q", 0, [ready], now=NOW)
    leased = claim_at(store, ready, NOW)
    calls.clear()

    store.note_leased("q", 0, leased, cursor=None)

    assert calls == ["UpdateItem"]
    assert counts(store) == (1, 1, 0)


def test_a_failed_read_of_the_mark_costs_the_count_never_the_lease(store_and_calls, monkeypatch) -> None:
    store, _ = store_and_calls
    scheduled = stored(visible_bound(LATER) + "0" * 16, enqueue_at=LATER)
    store.put_new("q", 0, [scheduled], now=NOW)
    leased = claim_at(store, scheduled, LATER + timedelta(seconds=1))

    def unavailable(*_: object, **__: object) -> None:
        raise StoreUnavailableError("the table did not answer")

    with monkeypatch.context() as patched:
        patched.setattr(store, "heads", unavailable)
        store.note_leased("q", 0, leased, cursor=None)

    # Counted leased; left in the scheduled count for the recount to mend.
    assert counts(store) == (1, 1, 1)
