"""Unit: the service under random operation sequences (hypothesis stateful testing), on the in-memory
store and on a SQLite file.

A model of what the queue must hold is kept beside the service; after every step the service's
storage must agree with it: nothing lost, nothing doubled, no item under two live leases, attempts
never going down, oldest-first leasing.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from querator.domain.errors import NothingToLeaseError
from querator.domain.model import NewItem, QueueInfo, RetryRequest
from querator.service import QueueService
from querator.testing import FakeClock, memory_service, sqlite_service

LEASE = timedelta(seconds=30)
START = datetime(2026, 1, 1, tzinfo=UTC)


_shared: dict[str, QueueService] = {}
_machine_numbers = itertools.count()


#: No network: the in-memory store is the reference implementation of the ports.
pytestmark = pytest.mark.disable_socket


@pytest.fixture(autouse=True, scope="module")
def shared_store(tmp_path_factory):
    """One store of each kind for all examples (each example uses its own queues)."""
    _shared["memory"] = memory_service(clock=FakeClock(START))
    _shared["sqlite"] = sqlite_service(tmp_path_factory.mktemp("props") / "q.db", clock=FakeClock(START))
    yield
    _shared.clear()


class QueueMachine(RuleBasedStateMachine):
    store = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(START)
        shared = _shared[self.store]
        self.service = QueueService(catalog=shared.catalog, store=shared.store, clock=self.clock)
        n = next(_machine_numbers)
        self.q, self.dlq = f"q{n}", f"dlq{n}"
        self.service.create_queue(
            QueueInfo(
                name=self.dlq,
                lease_timeout=LEASE,
                expire_timeout=timedelta(days=1),
                created_at=START,
                updated_at=START,
            )
        )
        self.service.create_queue(
            QueueInfo(
                name=self.q,
                lease_timeout=LEASE,
                expire_timeout=timedelta(days=1),
                max_attempts=3,
                dead_queue=self.dlq,
                created_at=START,
                updated_at=START,
            )
        )
        self.counter = 0
        self.alive: set[bytes] = set()  # produced and neither completed nor dead-lettered
        self.done: set[bytes] = set()
        self.held: dict[bytes, tuple[str, datetime]] = {}  # payload -> (id, lease deadline)
        self.attempts: dict[bytes, int] = {}

    def _live_holds(self) -> dict[bytes, tuple[str, datetime]]:
        now = self.clock.now()
        return {p: h for p, h in self.held.items() if h[1] > now}

    @rule(count=st.integers(1, 4))
    def produce(self, count):
        batch = []
        for _ in range(count):
            self.counter += 1
            batch.append(f"item-{self.counter}".encode())
        self.service.produce(self.q, [NewItem(payload=p) for p in batch])
        self.alive.update(batch)

    @rule(batch=st.integers(1, 5))
    def lease(self, batch):
        try:
            leased = self.service.lease(self.q, batch_size=batch, client_id="c").items
        except NothingToLeaseError:
            leased = []
        live = self._live_holds()
        for item in leased:
            assert item.payload not in live, "an item was handed out under two live leases"
            assert item.payload in self.alive
            assert item.attempts > self.attempts.get(item.payload, 0)
            self.attempts[item.payload] = item.attempts
            self.held[item.payload] = (item.id, item.lease_deadline)
        assert len(leased) <= batch

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def complete(self, data):
        payload = data.draw(st.sampled_from(sorted(self.held)))
        item_id, deadline = self.held.pop(payload)
        outcome = self.service.complete(self.q, 0, [item_id])
        valid = deadline > self.clock.now()
        assert (outcome.applied == [item_id]) == valid
        if valid:
            self.alive.discard(payload)
            self.done.add(payload)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), dead=st.booleans())
    def retry(self, data, dead):
        payload = data.draw(st.sampled_from(sorted(self.held)))
        item_id, deadline = self.held.pop(payload)
        outcome = self.service.retry(self.q, 0, [RetryRequest(id=item_id, dead=dead)])
        assert (outcome.applied == [item_id]) == (deadline > self.clock.now())

    @rule(seconds=st.sampled_from([1, 10, 31]))
    def wait(self, seconds):
        self.clock.advance(timedelta(seconds=seconds))

    @invariant()
    def nothing_lost_or_doubled(self):
        in_queue = [i.payload for i in self.service.list_items(self.q, 0)]
        dead = [i.payload for i in self.service.list_items(self.dlq, 0)]
        assert len(in_queue) == len(set(in_queue)), "an item is stored twice"
        assert not set(in_queue) & set(dead)
        assert set(in_queue) | set(dead) == self.alive, "an item was lost or resurrected"
        assert not set(dead) & self.done

    @invariant()
    def attempts_stay_within_max(self):
        assert all(i.attempts <= 3 for i in self.service.list_items(self.q, 0))


QueueMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=25, deadline=None, suppress_health_check=list(HealthCheck)
)
TestQueueLifecycle = QueueMachine.TestCase


class SQLiteQueueMachine(QueueMachine):
    store = "sqlite"


SQLiteQueueMachine.TestCase.settings = QueueMachine.TestCase.settings
TestQueueLifecycleOnSQLite = SQLiteQueueMachine.TestCase
