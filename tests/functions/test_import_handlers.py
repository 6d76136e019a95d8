"""``storage/items.import`` through its Lambda handler over moto (DynamoDB): the item limits a produce
has, and an imported item's place in lease order."""

from __future__ import annotations

import base64

import pytest

from tests.functions.conftest import payload_objects
from tests.functions.test_handlers import assert_error, lease, make_queue, payloads, produce

B64 = base64.b64encode


def listed(api, queue: str = "jobs") -> list[dict]:
    items: list[dict] = api.ok("/v1/storage/items.list", {"queue_name": queue, "partition": 0})["items"]
    return items


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("payload", B64(b"x" * 1_048_577).decode(), "item payload is larger than 1048576 bytes"),
        ("payload", B64(b"x" * 2_000_000).decode(), "item payload is larger than 1048576 bytes"),
        ("reference", "r" * 2001, "item reference is longer than 2000 bytes"),
        ("reference", "r" * 200_000, "item reference is longer than 2000 bytes"),
        ("encoding", "e" * 2001, "item encoding is longer than 2000 bytes"),
        ("kind", "k" * 2001, "item kind is longer than 2000 bytes"),
    ],
    ids=["payload-1MiB+1", "payload-2MB", "reference-2001", "reference-200KB", "encoding-2001", "kind-2001"],
)
def test_an_import_over_an_item_limit_is_a_400_naming_the_item_and_applies_nothing(
    api, field, value, message
):
    """docs/api.md "Limits", as ``queue.produce`` enforces them; before, DynamoDB answered a 500 for
    an item over 400 KB and the embedded stores kept it."""
    make_queue(api)
    fine = {"payload": B64(b"fine").decode()}
    body = {"queue_name": "jobs", "partition": 0, "items": [fine, fine, fine, {**fine, field: value}]}

    reply = api.call("/v1/storage/items.import", body)

    assert_error(reply, 400, "Invalid request")
    # The payload names the item (as docs/api.md quotes it); a text field names itself.
    where = "items[3]" if field == "payload" else f"items[3].{field}"
    assert f"{where}: {message}" in reply.body["message"]
    assert listed(api) == []


def test_an_import_at_the_item_limits_is_taken(api):
    make_queue(api)
    largest = {
        "payload": B64(b"p" * 1_048_576).decode(),
        "reference": "r" * 2000,
        "encoding": "e" * 2000,
        "kind": "k" * 2000,
    }

    api.ok("/v1/storage/items.import", {"queue_name": "jobs", "partition": 0, "items": [largest]})

    (item,) = listed(api)
    assert payloads([item]) == [b"p" * 1_048_576] and item["reference"] == "r" * 2000
    assert len(payload_objects()) == 1  # on DynamoDB, in the payload bucket


def test_an_imported_listing_item_is_leased_after_items_produced_before_it(api):
    """The probe's sequence: produce, import an item as a listing gives it, produce again; the
    listing and a lease give them in that order (docs/ordering.md: within a priority, oldest first by
    when each became ready; items.list lists in lease order)."""
    make_queue(api)
    make_queue(api, queue_name="staging")
    produce(api, "imported-second", queue="staging")
    (source,) = listed(api, "staging")

    produce(api, "produced-first")
    api.ok("/v1/storage/items.import", {"queue_name": "jobs", "partition": 0, "items": [source]})
    produce(api, "produced-third")

    order = [b"produced-first", b"imported-second", b"produced-third"]
    items = listed(api)
    assert payloads(items) == order
    assert items[1]["created_at"] == source["created_at"]  # kept as given
    assert payloads(lease(api, batch=3)["items"]) == order
