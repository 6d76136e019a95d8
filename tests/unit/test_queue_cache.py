"""The hot path's copy of a queue's catalog record: fewer reads, bounded staleness, safe deletes.

Two ``QueueService`` instances over the same tables stand for two processes (two Lambda
containers): each has its own copy, so what one changes the other sees only when its copy expires.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from querator.domain.errors import QueueDeletingError, QueueNotFoundError
from querator.domain.model import NewItem, QueueUpdate
from querator.service import DEFAULT_QUEUE_CACHE_TTL, QueueService
from querator.testing import FakeClock, memory_service
from tests.contract.helpers import make_queue

pytestmark = pytest.mark.disable_socket


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def here(clock):
    return memory_service(clock=clock)


@pytest.fixture
def elsewhere(here, clock) -> QueueService:
    return QueueService(catalog=here.catalog, store=here.store, clock=clock)


class CountingCatalog:
    def __init__(self, catalog) -> None:
        self.catalog, self.gets = catalog, 0

    def __getattr__(self, name):
        return getattr(self.catalog, name)

    def get(self, name):
        self.gets += 1
        return self.catalog.get(name)


def test_hot_path_calls_read_the_catalog_once_per_ttl(here, clock):
    make_queue(here)
    counting = CountingCatalog(here.catalog)
    here = QueueService(catalog=counting, store=here.store, clock=clock)
    for _ in range(5):
        here.produce("jobs", [NewItem(payload=b"x")])
    leased = here.lease("jobs", batch_size=5, client_id="c")
    here.complete("jobs", leased.partition, [i.id for i in leased.items])
    assert counting.gets == 1
    clock.advance(DEFAULT_QUEUE_CACHE_TTL)
    here.produce("jobs", [NewItem(payload=b"y")])
    assert counting.gets == 2


def test_an_update_elsewhere_is_seen_once_the_copy_expires(here, elsewhere, clock):
    make_queue(here)
    here.produce("jobs", [NewItem(payload=b"x")])  # here now holds a copy
    elsewhere.update_queue(QueueUpdate(name="jobs", lease_timeout=timedelta(minutes=7)))
    clock.advance(DEFAULT_QUEUE_CACHE_TTL)
    leased = here.lease("jobs", batch_size=1, client_id="c")
    assert leased.items[0].lease_deadline == clock.now() + timedelta(minutes=7)


def test_a_queue_created_elsewhere_is_visible_at_once(here, elsewhere):
    with pytest.raises(QueueNotFoundError):
        here.produce("jobs", [NewItem(payload=b"x")])
    make_queue(elsewhere)
    assert here.produce("jobs", [NewItem(payload=b"x")]).ids


def test_delete_waits_out_every_copy_before_purging(here, elsewhere, clock):
    make_queue(here)
    elsewhere.produce("jobs", [NewItem(payload=b"x")])  # elsewhere holds a fresh copy
    started = clock.now()
    here.delete_queue("jobs")
    # The purge ran only after a copy taken just before the delete had expired.
    assert clock.now() - started >= DEFAULT_QUEUE_CACHE_TTL
    with pytest.raises((QueueDeletingError, QueueNotFoundError)):
        elsewhere.produce("jobs", [NewItem(payload=b"y")])


def test_a_zero_ttl_reads_the_catalog_on_every_call(here, clock):
    make_queue(here)
    uncached = QueueService(
        catalog=CountingCatalog(here.catalog), store=here.store, clock=clock, queue_cache_ttl=timedelta(0)
    )
    for _ in range(3):
        uncached.produce("jobs", [NewItem(payload=b"x")])
    assert uncached.catalog.gets == 3
