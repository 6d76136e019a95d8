"""Contract: listings and clears of large items reach every item on every store.

A DynamoDB Query answers at most 1 MB, so a page of items near the payload limit comes back short
of what was asked for; the storage listings and ``queue.clear`` must read on rather than take the
short page for the end (docs/api.md, ``storage/items.list`` and ``queue.clear``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from querator.domain.model import ROW_PAYLOAD_BYTES, ClearScope, Item, NewItem
from querator.domain.positions import SCHEDULED_MARK
from querator.ports.log import LogKey
from querator.service.tuning import LISTING_PAYLOAD_BYTES, MAX_REPLY_BYTES
from tests.contract.helpers import make_queue

if TYPE_CHECKING:
    from querator.ports.log import ClaimLog

#: Items this large: two fill a DynamoDB Query's 1 MB, nine a listing page's payload budget.
SIZE = ROW_PAYLOAD_BYTES


def large(count: int, **fields: object) -> list[NewItem]:
    """``count`` payloads of ``SIZE`` bytes, each told apart by its first bytes."""
    return [NewItem(payload=f"{n:04d}".encode().ljust(SIZE, b"x"), **fields) for n in range(count)]


def produce_large(service, clock, count: int, *, scheduled: bool, **fields: object) -> list[bytes]:
    if scheduled:
        fields["enqueue_at"] = clock.now() + timedelta(hours=1)
    batch = large(count, **fields)
    for start in range(0, count, 4):  # a produce call holds a few of them
        service.produce("jobs", batch[start : start + 4])
    return [item.payload for item in batch]


def lease_large(service, count: int) -> None:
    """Lease ``count`` items (a lease reply holds a few large ones)."""
    leased = 0
    while leased < count:
        got = service.lease("jobs", batch_size=count - leased, client_id="c").items
        assert got
        leased += len(got)


def page_through(listing) -> list[list[bytes]]:
    """Every page of a listing as docs/api.md says to page it: the last id as the next ``pivot``,
    the first item of every later page dropped; a page with nothing past the pivot is the end."""
    pages: list[list[bytes]] = []
    pivot = ""
    while True:
        page = listing("jobs", 0, pivot=pivot)
        fresh = page[1:] if pivot else page
        assert sum(len(item.payload) for item in page) <= LISTING_PAYLOAD_BYTES
        # What the API sends: the payloads in base64, within Lambda's 6 MB reply.
        assert sum(4 * -(-len(item.payload) // 3) for item in page) <= MAX_REPLY_BYTES
        if not fresh:
            return pages
        if pivot:
            assert page[0].id == pivot
        pages.append([item.payload for item in fresh])
        pivot = page[-1].id
        assert len(pages) <= 16, "the listing does not end"


def test_scheduled_listing_of_large_items_pages_through_every_item(service, clock):
    make_queue(service)
    produced = produce_large(service, clock, 16, scheduled=True)
    assert service.stats("jobs")[0].scheduled == 16

    pages = page_through(service.list_scheduled)

    assert [p for page in pages for p in page] == produced
    assert [len(page) for page in pages] == [9, 7]  # 9 x 380,000 B fill the 3,750,000 B budget


def test_listing_of_large_waiting_items_pages_through_every_item(service, clock):
    make_queue(service)
    produced = produce_large(service, clock, 16, scheduled=False)

    pages = page_through(service.list_items)

    assert [p for page in pages for p in page] == produced
    assert [len(page) for page in pages] == [9, 7]


def test_a_page_of_large_items_across_priorities_stays_within_its_payload_budget(service, clock):
    """A page of several bands: the next band's first item does not take it past its budget."""
    make_queue(service)
    first = produce_large(service, clock, 9, scheduled=True, priority=4)
    rest = produce_large(service, clock, 3, scheduled=True, priority=6)

    pages = page_through(service.list_scheduled)

    assert [p for page in pages for p in page] == first + rest
    assert [len(page) for page in pages] == [9, 3]


def test_listing_of_large_leased_items_pages_through_every_item(service, clock):
    make_queue(service)
    produced = produce_large(service, clock, 16, scheduled=False)
    lease_large(service, 10)

    pages = page_through(service.list_items)

    assert [p for page in pages for p in page] == produced


def test_clearing_large_scheduled_items_removes_every_one_in_one_call(service, clock):
    make_queue(service)
    produce_large(service, clock, 6, scheduled=True)
    service.produce("jobs", [NewItem(payload=b"waiting")])

    removed = service.clear("jobs", ClearScope.SCHEDULED)

    assert removed == 6
    assert service.list_scheduled("jobs", 0) == []
    assert [item.payload for item in service.list_items("jobs", 0)] == [b"waiting"]
    assert service.stats("jobs")[0].scheduled == 0


def test_a_destructive_clear_removes_every_large_leased_and_scheduled_item(service, clock):
    make_queue(service)
    produce_large(service, clock, 6, scheduled=False)
    produce_large(service, clock, 6, scheduled=True)
    lease_large(service, 4)

    removed = service.clear("jobs", ClearScope.QUEUE | ClearScope.SCHEDULED | ClearScope.DESTRUCTIVE)

    assert removed == 12
    assert service.list_items("jobs", 0) == [] and service.list_scheduled("jobs", 0) == []
    stats = service.stats("jobs")[0]
    assert (stats.total, stats.total_leased, stats.scheduled) == (0, 0, 0)


# --- the claim log's listing (``ClaimLog.list_items``) -------------------------------------------

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
KEY = LogKey("jobs", 0, "")


def _append_large(log: ClaimLog, count: int, *, scheduled: bool) -> list[bytes]:
    stored: list[bytes] = []
    for n in range(count):
        payload = f"{'s' if scheduled else 'w'}{n:03d}".encode().ljust(SIZE, b"x")
        due = NOW + timedelta(hours=1, seconds=n) if scheduled else None  # due in this order
        item = Item(
            id="", payload=payload, created_at=NOW, expire_deadline=NOW + timedelta(days=1), enqueue_at=due
        )
        log.append(KEY, [item], now=NOW)
        stored.append(payload)
    return stored


def test_the_log_lists_large_items_past_a_page_the_store_cut_short(claim_log: ClaimLog) -> None:
    waiting = _append_large(claim_log, 5, scheduled=False)
    scheduled = _append_large(claim_log, 5, scheduled=True)

    listed = claim_log.list_items(KEY, after="", limit=1000, now=NOW)
    assert [item.payload for item in listed] == waiting + scheduled
    positions = claim_log.list_items(KEY, after="", limit=1000, now=NOW, schedule=False)
    assert [item.payload for item in positions] == waiting
    schedule = claim_log.list_items(KEY, after=SCHEDULED_MARK, limit=1000, now=NOW)
    assert [item.payload for item in schedule] == scheduled
    rest = claim_log.list_items(KEY, after=schedule[1].id, limit=1000, now=NOW)
    assert [item.payload for item in rest] == scheduled[2:]


def test_a_log_listing_with_max_bytes_stops_after_the_item_that_passes_it(claim_log: ClaimLog) -> None:
    """Fewer than ``limit`` items holding at most ``max_bytes`` would mean the end: a listing that
    stops for its bytes holds more than ``max_bytes``, by the one item that passed it."""
    waiting = _append_large(claim_log, 5, scheduled=False)
    scheduled = _append_large(claim_log, 5, scheduled=True)

    first = claim_log.list_items(KEY, after="", limit=1000, now=NOW, max_bytes=3 * SIZE)
    assert [item.payload for item in first] == waiting[:4]
    across = claim_log.list_items(KEY, after=first[-1].id, limit=1000, now=NOW, max_bytes=2 * SIZE)
    assert [item.payload for item in across] == [waiting[4], *scheduled[:2]]
    schedule = claim_log.list_items(KEY, after=SCHEDULED_MARK, limit=1000, now=NOW, max_bytes=3 * SIZE - 1)
    assert [item.payload for item in schedule] == scheduled[:3]
    end = claim_log.list_items(KEY, after=schedule[-1].id, limit=1000, now=NOW, max_bytes=2 * SIZE)
    assert [item.payload for item in end] == scheduled[3:]  # the end: 2 items of at most max_bytes
