"""Concurrency: 8 consumers lease and complete the items of a fair queue with
``max_leased_per_group`` at once; no group ever holds more valid leases than the cap.

Runs on the embedded stores and on the single-threaded moto server (whose transactions are atomic
like DynamoDB's; moto in-process is not thread-safe: docs/adr/0050-engine-v2.md). Each consumer
counts, under a lock, the leases it holds per group: it adds an item when its lease is handed out
and takes it off just before it completes it, so the server can hand out the freed slot only after
the count went down; the count going over the cap at any moment is a cap broken by the store.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from querator.clock import SystemClock
from querator.domain.errors import NothingToLeaseError
from querator.domain.model import NewItem, QueueInfo
from querator.testing import build_service, dynamodb_client, memory_service, sqlite_service

pytestmark = [pytest.mark.slow]

CONSUMERS = 8
GROUPS = 6
PER_GROUP = 40
CAP = 3
BATCH = 4


@pytest.fixture(params=[2, 3], ids=["engine-v2", "engine-v3"])
def engine(request: pytest.FixtureRequest) -> int:
    """Engine v3 keeps a fair queue's groups in lane logs, the cap checked in each claim's write."""
    return int(request.param)


@pytest.fixture(params=["memory", "sqlite", "moto_server"])
def service(request: pytest.FixtureRequest, tmp_path, engine):
    clock = SystemClock()
    if request.param == "memory":
        return memory_service(clock=clock, engine=engine)
    if request.param == "sqlite":
        return sqlite_service(tmp_path / "querator.db", clock=clock, engine=engine)
    endpoint = request.getfixturevalue("moto_server")
    return build_service(dynamodb_client(endpoint, max_pool=CONSUMERS + 2), clock=clock, engine=engine)


def test_no_group_holds_more_than_its_cap_under_eight_consumers(service):
    placeholder = datetime(2000, 1, 1, tzinfo=UTC)
    service.create_queue(
        QueueInfo(
            name="fair-cap",
            lease_timeout=timedelta(minutes=5),
            expire_timeout=timedelta(hours=1),
            delivery="fair",
            max_leased_per_group=CAP,
            created_at=placeholder,
            updated_at=placeholder,
        )
    )
    for group in range(GROUPS):
        items = [NewItem(payload=f"{group}-{n}".encode(), group=f"tenant-{group}") for n in range(PER_GROUP)]
        service.produce("fair-cap", items)

    lock = threading.Lock()
    held: Counter[str] = Counter()
    most: Counter[str] = Counter()
    completed: Counter[str] = Counter()
    errors: list[BaseException] = []

    def consume(name: str) -> None:
        idle = 0
        try:
            for _ in range(GROUPS * PER_GROUP):  # bounded: at least one item per round until done
                try:
                    lease = service.lease("fair-cap", batch_size=BATCH, client_id=name, timeout=timedelta(0))
                except NothingToLeaseError:
                    idle += 1
                    if idle > 50 or sum(completed.values()) >= GROUPS * PER_GROUP:
                        return
                    continue
                idle = 0
                with lock:
                    for item in lease.items:
                        held[item.group] += 1
                        most[item.group] = max(most[item.group], held[item.group])
                for item in lease.items:
                    with lock:
                        held[item.group] -= 1
                        completed[item.group] += 1
                    outcome = service.complete("fair-cap", lease.partition, [item.id])
                    assert outcome.applied == [item.id]
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(f"c{n}",)) for n in range(CONSUMERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)

    assert errors == []
    assert not any(thread.is_alive() for thread in threads)
    assert max(most.values()) <= CAP, most
    assert completed == Counter({f"tenant-{g}": PER_GROUP for g in range(GROUPS)})
