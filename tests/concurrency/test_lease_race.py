"""Concurrency: 8 consumers lease and complete 2,000 items of one queue at once (of one priority,
and of all ten).

Runs against the single-threaded moto server, whose conditional writes are atomic like DynamoDB's
(moto in-process is not: docs/adr/0050-engine-v2.md). Each consumer records what it was handed and
when, so the test can check that no item was ever held by two unexpired leases and that every item
was completed exactly once.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from querator.clock import SystemClock
from querator.domain.errors import NothingToLeaseError
from querator.domain.model import NewItem, QueueInfo
from querator.testing import build_service, dynamodb_client

pytestmark = [pytest.mark.server, pytest.mark.slow]

CONSUMERS = 8
ITEMS = 2000
BATCH = 10


@dataclass(frozen=True)
class Held:
    payload: bytes
    item_id: str
    leased_at: datetime
    deadline: datetime
    released_at: datetime


@pytest.mark.parametrize("priorities", [False, True], ids=["fifo", "ten-priorities"])
def test_eight_consumers_complete_every_item_exactly_once(moto_server, priorities):
    service = build_service(dynamodb_client(moto_server, max_pool=CONSUMERS + 2), clock=SystemClock())
    placeholder = datetime(2000, 1, 1, tzinfo=UTC)
    service.create_queue(
        QueueInfo(
            name=f"race-{priorities}",
            lease_timeout=timedelta(minutes=5),
            expire_timeout=timedelta(hours=1),
            created_at=placeholder,
            updated_at=placeholder,
        )
    )
    produced = [f"item-{n:05d}".encode() for n in range(ITEMS)]
    queue = f"race-{priorities}"
    # With priorities, every produce request spans all ten bands: leases cross bands under contention.
    items = [NewItem(payload=p, priority=n % 10 if priorities else 5) for n, p in enumerate(produced)]
    for start in range(0, ITEMS, 500):
        service.produce(queue, items[start : start + 500])

    held: list[Held] = []
    completed: list[str] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def consume(n: int) -> None:
        try:
            while True:
                try:
                    lease = service.lease(queue, batch_size=BATCH, client_id=f"consumer-{n}")
                except NothingToLeaseError:
                    return
                leased_at = datetime.now(UTC)
                outcome = service.complete(queue, lease.partition, [i.id for i in lease.items])
                released_at = datetime.now(UTC)
                with lock:
                    completed.extend(outcome.applied)
                    held.extend(
                        Held(i.payload, i.id, leased_at, i.lease_deadline or leased_at, released_at)
                        for i in lease.items
                    )
                    assert not outcome.failed, outcome.failed
        except BaseException as exc:  # re-raised in the test's thread below
            failures.append(exc)

    threads = [threading.Thread(target=consume, args=(n,)) for n in range(CONSUMERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a consumer did not finish"
    assert not failures, failures[0]

    # Every item was handed out once, to one consumer, and completed once.
    assert Counter(h.payload for h in held) == Counter(produced)
    assert sorted(completed) == sorted(h.item_id for h in held)
    assert len(set(completed)) == ITEMS
    # No item was ever held by two unexpired leases: per payload, the held intervals never overlap.
    by_payload: dict[bytes, list[Held]] = {}
    for h in held:
        by_payload.setdefault(h.payload, []).append(h)
    for leases in by_payload.values():
        leases.sort(key=lambda h: h.leased_at)
        for first, second in itertools.pairwise(leases):
            assert second.leased_at >= min(first.deadline, first.released_at)
    assert sum(s.total for s in service.stats(queue)) == 0
