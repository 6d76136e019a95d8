"""A lease that loses claim races stops spending charged writes on a page that went stale, and still
takes the oldest items left.

The race is staged deterministically: right after the lease reads its page, "another consumer"
claims most of the candidates on it (real conditional writes), exactly what happens when many
consumers lease from one partition at once.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from querator.domain.model import NewItem, QueueInfo
from querator.service import QueueService
from querator.storage.memory import InMemoryItemStore, InMemoryQueueCatalog
from querator.testing import FakeClock

ITEMS = 40
STOLEN = 35

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

pytestmark = pytest.mark.disable_socket


class StaleRaceStore:
    """The in-memory store, where another consumer claims items of the first page (or of the first
    ``pages`` pages) a lease reads right after it read them, and claims that lose are counted."""

    def __init__(
        self, store: InMemoryItemStore, steal: Sequence[int] = range(STOLEN), pages: int = 1
    ) -> None:
        self._store = store
        self._steal = steal
        self._pages = pages
        self.scans = 0
        #: Called after each steal (another producer, say).
        self.then: Callable[[], object] = lambda: None
        self.stolen: list[str] = []
        self.failed: list[str] = []

    def scan(self, *args: Any, **kwargs: Any) -> Any:
        page = self._store.scan(*args, **kwargs)
        self.scans += 1
        if self.scans <= self._pages:
            taken = [page.items[n].id for n in self._steal]
            deadline = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
            won = self._store.claim("busy", 0, taken, lease_deadline=deadline, now=NOW)
            assert len(won.applied) == len(taken)
            self.stolen += taken
            self.then()
        return page

    def claim(self, queue: str, partition: int, ids: Any, **kwargs: Any) -> Any:
        result = self._store.claim(queue, partition, ids, **kwargs)
        self.failed.extend(result.rejected)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


NOW = datetime(2026, 1, 1, tzinfo=UTC)


def busy_queue(store: StaleRaceStore, seed: int = 7, items: int = ITEMS) -> QueueService:
    service = QueueService(
        catalog=InMemoryQueueCatalog(), store=store, clock=FakeClock(NOW), rng=random.Random(seed)
    )
    service.create_queue(
        QueueInfo(
            name="busy",
            lease_timeout=timedelta(minutes=1),
            expire_timeout=timedelta(hours=1),
            created_at=NOW,
            updated_at=NOW,
        )
    )
    service.produce("busy", [NewItem(payload=f"{n:02d}".encode()) for n in range(items)])
    return service


def test_lost_races_on_a_stale_page_cost_at_most_three_failed_writes():
    store = StaleRaceStore(InMemoryItemStore())
    service = busy_queue(store)
    stolen, failed = store.stolen, store.failed
    lease = service.lease("busy", batch_size=5, client_id="c")

    assert 1 <= len(lease.items) <= 5
    assert not {item.id for item in lease.items} & set(stolen)
    assert [item.id for item in lease.items] == sorted(item.id for item in lease.items)
    # Without the cap this consumer walked the stale page claim by claim (about 7 losses per win).
    assert len(failed) <= 3, failed


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize(
    ("steal", "batch", "expected"),
    [
        ([0], 1, ["01"]),  # lost the oldest: the next-oldest, not any other candidate
        ([0, 1, 2], 1, ["03"]),
        ([0, 2], 3, ["01", "03", "04"]),  # the items between the stolen ones are not passed over
    ],
)
def test_a_lease_that_loses_a_race_takes_the_oldest_items_left(seed, steal, batch, expected):
    # GIVEN items 00..39, of which another consumer claims `steal` right after this lease read its page
    store = StaleRaceStore(InMemoryItemStore(), steal=steal)
    service = busy_queue(store, seed)
    # WHEN the lease claims (losing a race on the first stolen item)
    lease = service.lease("busy", batch_size=batch, client_id="c")
    # THEN it returns the oldest items nobody holds: oldest first holds under contention (docs/api.md)
    assert [item.payload.decode() for item in lease.items] == expected
    assert store.failed


def test_a_lease_that_lost_every_race_tries_again_rather_than_answer_nothing():
    # GIVEN 40 items, of which another consumer claims the 8 oldest right after each of the lease's
    # first four reads: its first try loses every claim, through all its re-reads
    store = StaleRaceStore(InMemoryItemStore(), steal=range(8), pages=4)
    service = busy_queue(store)
    # WHEN it leases without waiting
    lease = service.lease("busy", batch_size=1, client_id="c", timeout=timedelta(0))
    # THEN it tries again at once and gets the oldest item left, not "nothing to lease"
    assert [item.payload.decode() for item in lease.items] == ["32"]
    assert len(store.stolen) == 32


def test_a_lease_that_lost_every_claim_of_a_short_page_reads_it_again():
    # GIVEN two items, both claimed by another consumer right after the lease read them, while a
    # third is produced
    store = StaleRaceStore(InMemoryItemStore(), steal=[0, 1])
    service = busy_queue(store, items=2)
    store.then = lambda: service.produce("busy", [NewItem(payload=b"late")])
    # WHEN it leases without waiting
    lease = service.lease("busy", batch_size=1, client_id="c", timeout=timedelta(0))
    # THEN losing both claims sent it back to read the page, not away as from an empty one
    assert [item.payload for item in lease.items] == [b"late"]
    assert len(store.failed) == 2


class SlowHeadStore:
    """The in-memory store, where reading the partition's head row takes longer than the lease's
    whole claim budget (a loaded machine, a throttled table)."""

    def __init__(self, store: InMemoryItemStore, clock: FakeClock) -> None:
        self._store = store
        self._clock = clock

    def head(self, *args: Any, **kwargs: Any) -> Any:
        self._clock.advance(timedelta(seconds=6))
        return self._store.head(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.mark.parametrize("delivery", ["fifo", "fair"])
def test_a_lease_whose_head_read_outlasts_the_budget_still_reads_and_claims(delivery):
    # GIVEN waiting items, and a head read that takes 6 s of a 5 s claim budget
    clock = FakeClock(NOW)
    store = SlowHeadStore(InMemoryItemStore(), clock)
    service = QueueService(catalog=InMemoryQueueCatalog(), store=store, clock=clock, rng=random.Random(1))
    service.create_queue(
        QueueInfo(
            name="slow",
            lease_timeout=timedelta(minutes=1),
            expire_timeout=timedelta(hours=1),
            created_at=NOW,
            updated_at=NOW,
            delivery=delivery,
        )
    )
    service.produce("slow", [NewItem(payload=b"a", group="g"), NewItem(payload=b"b", group="g")])
    clock.advance(timedelta(seconds=2))
    # WHEN a consumer leases without waiting
    lease = service.lease("slow", batch_size=1, client_id="c", timeout=timedelta(0))
    # THEN it gets the oldest item, not "nothing to lease" with items waiting
    assert [item.payload for item in lease.items] == [b"a"]
