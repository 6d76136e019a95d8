"""A lease that loses claim races stops spending charged writes on a page that went stale.

The race is staged deterministically: right after the lease reads its page, "another consumer"
claims most of the candidates on it (real conditional writes), exactly what happens when many
consumers lease from one partition at once.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from querator.domain.model import NewItem, QueueInfo
from querator.service import QueueService
from querator.storage.memory import InMemoryItemStore, InMemoryQueueCatalog
from querator.testing import FakeClock

ITEMS = 40
STOLEN = 35

pytestmark = pytest.mark.disable_socket


class StaleRaceStore:
    """The in-memory store, where another consumer claims most of the first page a lease reads right
    after it read it, and claims that lose are counted."""

    def __init__(self, store: InMemoryItemStore) -> None:
        self._store = store
        self.stolen: list[str] = []
        self.failed: list[str] = []

    def scan(self, *args: Any, **kwargs: Any) -> Any:
        page = self._store.scan(*args, **kwargs)
        if not self.stolen:
            self.stolen.extend(state.id for state in page.items[:STOLEN])
            deadline = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
            won = self._store.claim("busy", 0, self.stolen, lease_deadline=deadline, now=NOW)
            assert len(won.applied) == STOLEN
        return page

    def claim(self, queue: str, partition: int, ids: Any, **kwargs: Any) -> Any:
        result = self._store.claim(queue, partition, ids, **kwargs)
        self.failed.extend(result.rejected)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_lost_races_on_a_stale_page_cost_at_most_three_failed_writes():
    store = StaleRaceStore(InMemoryItemStore())
    service = QueueService(
        catalog=InMemoryQueueCatalog(), store=store, clock=FakeClock(NOW), rng=random.Random(7)
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
    service.produce("busy", [NewItem(payload=f"{n:02d}".encode()) for n in range(ITEMS)])
    stolen, failed = store.stolen, store.failed
    lease = service.lease("busy", batch_size=5, client_id="c")

    assert 1 <= len(lease.items) <= 5
    assert not {item.id for item in lease.items} & set(stolen)
    assert [item.id for item in lease.items] == sorted(item.id for item in lease.items)
    # Without the cap this consumer walked the stale page claim by claim (about 7 losses per win).
    assert len(failed) <= 3, failed
