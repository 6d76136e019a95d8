"""A lease that loses claim races stops spending charged writes on a page that went stale.

The race is staged deterministically: right after the lease reads its page, "another consumer"
claims most of the candidates on it (real conditional writes), exactly what happens when many
consumers lease from one partition at once.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from querator.domain.model import NewItem, QueueInfo
from querator.testing import FakeClock, memory_service

ITEMS = 40
STOLEN = 35

pytestmark = pytest.mark.disable_socket


@pytest.fixture
def service():
    service = memory_service(clock=FakeClock())
    service._rng = random.Random(7)
    placeholder = datetime(2000, 1, 1, tzinfo=UTC)
    service.create_queue(
        QueueInfo(
            name="busy",
            lease_timeout=timedelta(minutes=1),
            expire_timeout=timedelta(hours=1),
            created_at=placeholder,
            updated_at=placeholder,
        )
    )
    service.produce("busy", [NewItem(payload=f"{n:02d}".encode()) for n in range(ITEMS)])
    return service


def test_lost_races_on_a_stale_page_cost_at_most_three_failed_writes(service):
    store = service._store
    real_scan, real_claim = store.scan, store.claim
    stolen: list[str] = []
    failed: list[str] = []

    def scan_then_lose_the_race(*args, **kwargs):
        page = real_scan(*args, **kwargs)
        if not stolen:  # another consumer takes most of this page right after it was read
            stolen.extend(state.id for state in page.items[:STOLEN])
            deadline = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
            assert (
                len(real_claim("busy", 0, stolen, lease_deadline=deadline, now=service._clock.now()))
                == STOLEN
            )
        return page

    def counting_claim(queue, partition, ids, **kwargs):
        won = real_claim(queue, partition, ids, **kwargs)
        failed.extend(set(ids) - {item.id for item in won})
        return won

    store.scan, store.claim = scan_then_lose_the_race, counting_claim
    lease = service.lease("busy", batch_size=5, client_id="c")

    assert 1 <= len(lease.items) <= 5
    assert not {item.id for item in lease.items} & set(stolen)
    assert [item.id for item in lease.items] == sorted(item.id for item in lease.items)
    # Without the cap this consumer walked the stale page claim by claim (about 7 losses per win).
    assert len(failed) <= 3, failed
