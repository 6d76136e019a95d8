"""Contract: an item's group is stored, returned, and kept wherever the item goes, on every store."""

from __future__ import annotations

from datetime import timedelta

import pytest

from querator.domain.errors import InvalidRequestError
from querator.domain.model import NewItem, RetryRequest, StorageItem
from tests.contract.helpers import LEASE, items, make_queue


def lease(service, queue="jobs", batch=10):
    return service.lease(queue, batch_size=batch, client_id="c", timeout=timedelta(0))


def test_a_lease_and_a_listing_return_each_items_group_and_an_item_without_one_has_none(service):
    make_queue(service)
    service.produce("jobs", [NewItem(payload=b"a", group="acme"), NewItem(payload=b"b")])

    listed = service.list_items("jobs", 0)
    leased = lease(service).items

    assert [(i.payload, i.group) for i in listed] == [(b"a", "acme"), (b"b", "")]
    assert [(i.payload, i.group) for i in leased] == [(b"a", "acme"), (b"b", "")]


def test_the_group_stays_through_expiry_retry_reprioritize_dead_letter_and_redrive(service, clock):
    make_queue(service, "dlq")
    make_queue(service, "jobs", dead_queue="dlq")
    group = "tenant/ünïcode 🚀"
    service.produce("jobs", [NewItem(payload=b"x", group=group)])

    first = lease(service)
    clock.advance(LEASE + timedelta(seconds=1))  # the lease runs out: back at the tail, new id
    second = lease(service)
    service.retry("jobs", second.partition, [RetryRequest(id=second.items[0].id)])
    (waiting,) = service.list_items("jobs", 0)
    service.reprioritize("jobs", 0, [waiting.id], 2)
    third = lease(service)
    service.retry("jobs", third.partition, [RetryRequest(id=third.items[0].id, dead=True)])
    (dead,) = service.list_items("dlq", 0)
    service.redrive("dlq")
    (back,) = service.list_items("jobs", 0)

    assert first.items[0].group == second.items[0].group == third.items[0].group == group
    assert third.items[0].priority == 2
    assert dead.group == group and dead.payload == b"x"
    assert back.group == group and back.priority == 2 and back.attempts == 0


def test_an_import_keeps_the_group(service):
    make_queue(service)
    service.import_items("jobs", 0, [StorageItem(payload=b"i", group="imported", source_id="s1")])

    (item,) = service.list_items("jobs", 0)

    assert (item.group, item.source_id) == ("imported", "s1")


@pytest.mark.parametrize(
    "group",
    ["x" * 129, "é" * 65, "line\nbreak", "tab\there", "nul\x00", "sep\u2028"],
    ids=["129 bytes", "130 bytes of utf-8", "newline", "tab", "nul", "line separator"],
)
@pytest.mark.parametrize("kind", [NewItem, StorageItem])
def test_a_group_too_long_or_with_control_characters_is_refused(kind, group):
    with pytest.raises(InvalidRequestError, match="group") as refused:
        kind(payload=b"bad", group=group)

    assert refused.value.context["field"] == "group"


def test_a_group_of_128_bytes_is_taken_whole(service):
    make_queue(service)
    group = "g" * 126 + "é"  # 128 bytes of UTF-8

    service.produce("jobs", items("p", group=group))

    assert lease(service).items[0].group == group
