"""Concurrent produce / lease / complete / retry / expiry on one partition, checked against the model.

Two producers and four consumers run against one queue partition on a single-threaded moto server
(conditional writes are atomic there, as on DynamoDB), on a SQLite file and in memory, with 2-second
leases and the real clock.
Consumers complete most items, retry some now, send some to the dead-letter queue, and abandon some
so their leases run out (an item abandoned three times is dead-lettered: ``max_attempts`` 3).
Every call is recorded; ``tests.reliability.history.check`` verifies the FIFO-with-leases model.
Bounded: 100 items, and a 120-second deadline after which the test fails rather than hangs.
"""

from __future__ import annotations

import random
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest

from querator.clock import SystemClock
from querator.domain.errors import NothingToLeaseError
from querator.domain.model import NewItem, QueueInfo, RetryRequest
from querator.testing import build_service, dynamodb_client, memory_service, sqlite_service, stored_items
from tests.reliability.history import Event, History, check, now

if TYPE_CHECKING:
    from querator.service import QueueService

pytestmark = pytest.mark.server

ITEMS_PER_PRODUCER = 50
PRODUCERS = 2
CONSUMERS = 4
BATCH = 5
LEASE = timedelta(seconds=2)
DEADLINE_SECONDS = 120.0


def make_queues(service: QueueService, name: str, dead: str) -> None:
    placeholder = datetime(2000, 1, 1, tzinfo=UTC)
    for queue, extra in ((dead, {}), (name, {"dead_queue": dead, "max_attempts": 3})):
        service.create_queue(
            QueueInfo(
                name=queue,
                lease_timeout=LEASE,
                expire_timeout=timedelta(hours=1),
                created_at=placeholder,
                updated_at=placeholder,
                **extra,  # type: ignore[arg-type]
            )
        )


def producer(service: QueueService, queue: str, history: History, index: int) -> None:
    for start in range(0, ITEMS_PER_PRODUCER, BATCH):
        identities = [f"p{index}-{i:03d}" for i in range(start, start + BATCH)]
        invoked = now()
        receipt = service.produce(queue, [NewItem(payload=i.encode()) for i in identities])
        history.record(
            Event(
                "produce",
                f"producer-{index}",
                invoked,
                now(),
                items=tuple(zip(receipt.ids, identities, strict=True)),
            )
        )


def consumer(
    service: QueueService, queue: str, history: History, index: int, stop: threading.Event, seed: int
) -> None:
    rng = random.Random(seed + index)
    name = f"consumer-{index}"
    while not stop.is_set():
        invoked = now()
        try:
            lease = service.lease(queue, batch_size=BATCH, client_id=name)
        except NothingToLeaseError:
            stop.wait(0.05)
            continue
        history.record(
            Event(
                "lease",
                name,
                invoked,
                now(),
                items=tuple((i.id, i.payload.decode()) for i in lease.items),
                deadlines=tuple(i.lease_deadline for i in lease.items if i.lease_deadline is not None),
                attempts=tuple(i.attempts for i in lease.items),
            )
        )
        by_choice: dict[str, list[str]] = {"complete": [], "retry": [], "retry_dead": [], "abandon": []}
        for item in lease.items:
            choice = rng.choices(list(by_choice), weights=(70, 10, 5, 15))[0]
            by_choice[choice].append(item.id)
        # Sometimes act late, so some completes and retries race their own lease's deadline.
        if rng.random() < 0.1:
            stop.wait(rng.uniform(1.0, 2.5))
        identities = {i.id: i.payload.decode() for i in lease.items}
        for kind, ids in by_choice.items():
            if not ids or kind == "abandon":
                continue
            invoked = now()
            if kind == "complete":
                outcome = service.complete(queue, lease.partition, ids)
            else:
                requests = [RetryRequest(id=i, dead=kind == "retry_dead") for i in ids]
                outcome = service.retry(queue, lease.partition, requests)
            history.record(
                Event(kind, name, invoked, now(), items=tuple((i, identities[i]) for i in outcome.applied))
            )


def identities_in(service: QueueService, queue: str) -> list[str]:
    return [item.payload.decode() for item in stored_items(service, queue)]


@pytest.mark.parametrize("store", ["moto_server", "sqlite", "memory"])
def test_concurrent_history_satisfies_the_fifo_with_leases_model(
    store: str, request: pytest.FixtureRequest, tmp_path
) -> None:
    # GIVEN one partition with short leases, a dead-letter queue and max_attempts 3
    if store == "moto_server":
        moto_server = request.getfixturevalue("moto_server")
        service = build_service(dynamodb_client(moto_server, max_pool=16), clock=SystemClock())
    elif store == "sqlite":
        service = sqlite_service(tmp_path / "history.db", clock=SystemClock())
    else:
        service = memory_service(clock=SystemClock())
    queue, dead = "history", "history-dead"
    make_queues(service, queue, dead)
    history = History()
    stop = threading.Event()
    seed = random.randrange(1_000_000)

    # WHEN producers and consumers run at once until every item has ended
    producers = [
        threading.Thread(target=producer, args=(service, queue, history, i)) for i in range(PRODUCERS)
    ]
    consumers = [
        threading.Thread(target=consumer, args=(service, queue, history, i, stop, seed))
        for i in range(CONSUMERS)
    ]
    for thread in producers + consumers:
        thread.start()
    deadline = time.monotonic() + DEADLINE_SECONDS
    for thread in producers:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    try:
        while time.monotonic() < deadline:
            # Empty: nothing visible and nothing leased (an abandoned lease still counts).
            stats = service.stats(queue)[0]
            if stats.total == 0 and stats.total_leased == 0 and stats.scheduled == 0:
                break
            stop.wait(0.2)
        else:
            kinds = [e.kind for e in history.events]
            pytest.fail(
                f"the queue did not drain within {DEADLINE_SECONDS} s (seed {seed}): {stats},"
                f" {len(kinds)} calls, {kinds.count('lease')} leases"
            )
    finally:
        stop.set()
        for thread in consumers:
            thread.join(timeout=30)

    # THEN the history satisfies the model
    verdict = check(
        history,
        dead_letter_identities=identities_in(service, dead),
        left_in_queue=identities_in(service, queue),
    )
    assert not verdict.violations, f"seed {seed}: {verdict.violations[:10]}"
    assert verdict.completed + verdict.dead_lettered == PRODUCERS * ITEMS_PER_PRODUCER
    # The run exercised what it is meant to: redeliveries and dead letters, not only the happy path.
    assert verdict.requeued > 0
    assert verdict.dead_lettered > 0
