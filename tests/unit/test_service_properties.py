"""Unit: the service under random operation sequences (hypothesis stateful testing), on the in-memory
store and on a SQLite file, on both engines (v3's claim logs, the product's; v2's row per item).

A model of what the queue must hold is kept beside the service; after every step the service's
storage must agree with it: nothing lost, nothing doubled, no item under two live leases, attempts
never going down, priority-then-oldest-first leasing, every item at the priority the model expects,
and counters (``queue.stats``) that agree with the items and never show an impossible state.
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
from querator.storage.counters import still_scheduled
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
    for engine in (2, 3):
        _shared[f"memory-{engine}"] = memory_service(clock=FakeClock(START), engine=engine)
        path = tmp_path_factory.mktemp("props") / f"q{engine}.db"
        _shared[f"sqlite-{engine}"] = sqlite_service(path, clock=FakeClock(START), engine=engine)
    yield
    _shared.clear()


class QueueMachine(RuleBasedStateMachine):
    store = "memory"
    engine = 3

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(START)
        shared = _shared[f"{self.store}-{self.engine}"]
        self.service = QueueService(
            catalog=shared.catalog, store=shared.store, clock=self.clock, log=shared.log
        )
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
        self.priority: dict[bytes, int] = {}  # payload -> its priority
        self.next_priority: dict[bytes, int] = {}  # payload -> given while leased, taken when back

    def teardown(self) -> None:
        # The reaper visits every queue of the shared catalog: leave it as the example found it.
        self.service.delete_queue(self.q)
        self.service.delete_queue(self.dlq)

    def _live_holds(self) -> dict[bytes, tuple[str, datetime]]:
        now = self.clock.now()
        return {p: h for p, h in self.held.items() if h[1] > now}

    def _allowed(self, payload: bytes) -> set[int]:
        """Its priority, or the one reprioritize gave it while leased (once it went back)."""
        allowed = {self.priority[payload]}
        if payload in self.next_priority:
            allowed.add(self.next_priority[payload])
        return allowed

    def _observed(self, payload: bytes, priority: int) -> None:
        if self.next_priority.get(payload) == priority:
            self.priority[payload] = self.next_priority.pop(payload)

    @rule(count=st.integers(1, 4), priority=st.integers(0, 9))
    def produce(self, count, priority):
        batch = []
        for _ in range(count):
            self.counter += 1
            batch.append(f"item-{self.counter}".encode())
        self.service.produce(self.q, [NewItem(payload=p, priority=priority) for p in batch])
        self.alive.update(batch)
        self.priority.update(dict.fromkeys(batch, priority))

    @rule(count=st.integers(1, 3), delay=st.sampled_from([5, 20, 45]))
    def produce_scheduled(self, count, delay):
        batch = []
        for _ in range(count):
            self.counter += 1
            batch.append(f"item-{self.counter}".encode())
        later = self.clock.now() + timedelta(seconds=delay)
        self.service.produce(self.q, [NewItem(payload=p, enqueue_at=later) for p in batch])
        self.alive.update(batch)
        self.priority.update(dict.fromkeys(batch, 5))

    @rule()
    def reap(self):
        # Recovers expired leases and passes the schedule mark (scheduled items that came due).
        self.service.reap(self.clock.now(), timedelta(seconds=30))

    @rule(batch=st.integers(1, 5))
    def lease(self, batch):
        try:
            leased = self.service.lease(self.q, batch_size=batch, client_id="c").items
        except NothingToLeaseError:
            leased = []
        live = self._live_holds()
        priorities = [item.priority for item in leased]
        assert priorities == sorted(priorities), "a lease reply out of priority order"
        if leased:
            # Strict priority: nothing left ready is more urgent than what was handed out.
            ready = [
                i.priority for i in self.service.list_items(self.q, 0) if not i.is_leased(self.clock.now())
            ]
            assert all(p >= max(priorities) for p in ready), "a more urgent item was left behind"
        for item in leased:
            assert item.priority in self._allowed(item.payload)
            self._observed(item.payload, item.priority)
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
    @rule(
        data=st.data(),
        dead=st.booleans(),
        priority=st.none() | st.integers(0, 9),
        later=st.sampled_from([None, 5, 20]),
    )
    def retry(self, data, dead, priority, later):
        payload = data.draw(st.sampled_from(sorted(self.held)))
        item_id, deadline = self.held.pop(payload)
        retry_at = None if later is None else self.clock.now() + timedelta(seconds=later)
        outcome = self.service.retry(
            self.q, 0, [RetryRequest(id=item_id, dead=dead, priority=priority, retry_at=retry_at)]
        )
        applied = deadline > self.clock.now()
        assert (outcome.applied == [item_id]) == applied
        if applied and not dead:
            back = self.next_priority.pop(payload, self.priority[payload])
            self.priority[payload] = back if priority is None else priority

    @precondition(lambda self: self.alive)
    @rule(data=st.data(), priority=st.integers(0, 9))
    def reprioritize(self, data, priority):
        stored = self.service.list_items(self.q, 0)
        if not stored:
            return
        item = data.draw(st.sampled_from(stored))
        now = self.clock.now()
        # Its lease ran out on its last attempt and nobody settled it yet: it is dead, not moved.
        dead = item.lease_deadline is not None and not item.is_leased(now) and item.attempts >= 3
        outcome = self.service.reprioritize(self.q, 0, [item.id], priority)
        if dead:
            assert [f.id for f in outcome.failed] == [item.id] and outcome.ids == {}
            self.held.pop(item.payload, None)
            self.next_priority.pop(item.payload, None)
            return
        assert outcome.failed == []
        if item.is_leased(self.clock.now()):
            assert outcome.ids == {item.id: item.id}, "a leased item keeps its id"
            self.next_priority[item.payload] = priority
        else:
            self.priority[item.payload] = priority
            self.next_priority.pop(item.payload, None)
            if item.payload in self.held:
                # Its lease had run out: the id the consumer holds is stale now (a new place).
                self.held[item.payload] = (outcome.ids[item.id], self.held[item.payload][1])

    @rule(seconds=st.sampled_from([1, 10, 31]))
    def wait(self, seconds):
        self.clock.advance(timedelta(seconds=seconds))

    @invariant()
    def nothing_lost_or_doubled(self):
        in_queue = [
            i.payload for i in self.service.list_items(self.q, 0) + self.service.list_scheduled(self.q, 0)
        ]
        dead = [i.payload for i in self.service.list_items(self.dlq, 0)]
        assert len(in_queue) == len(set(in_queue)), "an item is stored twice"
        assert not set(in_queue) & set(dead)
        assert set(in_queue) | set(dead) == self.alive, "an item was lost or resurrected"
        assert not set(dead) & self.done

    @invariant()
    def every_item_has_the_priority_it_should(self):
        for item in self.service.list_items(self.q, 0):
            assert item.priority in self._allowed(item.payload), (item.payload, item.priority)

    @invariant()
    def the_counters_agree_with_the_items_and_show_a_possible_state(self):
        for name in (self.q, self.dlq):
            listed = self.service.list_items(name, 0)
            scheduled = self.service.list_scheduled(name, 0)
            (stats,) = self.service.stats(name)
            assert 0 <= stats.total_leased <= stats.total
            # Every item counted once: engine v2 counts a scheduled item as scheduled until the
            # reaper's schedule pass (its own invariant below), so only the sum is exact here.
            assert stats.total + stats.scheduled == len(listed) + len(scheduled)
            assert stats.total_leased == sum(i.lease_deadline is not None for i in listed)

    @invariant()
    @precondition(lambda self: self.engine == 2)
    def engine_v2s_head_counters_agree_with_its_rows(self):
        store = self.service.store
        for name in (self.q, self.dlq):
            (head,) = store.heads(name, [0])
            stored = list(store.iter_items(name, 0))
            # Each item in one state: leased, scheduled (until the schedule pass or its claim), or ready.
            assert head.leased >= 0 and head.scheduled >= 0
            assert head.leased + head.scheduled <= head.items, (head.items, head.leased, head.scheduled)
            leased = sum(i.lease_deadline is not None for i in stored)
            scheduled = sum(still_scheduled(i, head.schedule_mark) for i in stored)
            assert (head.items, head.leased, head.scheduled) == (len(stored), leased, scheduled)
            (stats,) = self.service.stats(name)
            assert 0 <= stats.total_leased <= stats.total
            assert stats.total + stats.scheduled == len(stored)

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


class EngineV2QueueMachine(QueueMachine):
    engine = 2


EngineV2QueueMachine.TestCase.settings = QueueMachine.TestCase.settings
TestQueueLifecycleOnEngineV2 = EngineV2QueueMachine.TestCase


class SQLiteEngineV2QueueMachine(QueueMachine):
    store = "sqlite"
    engine = 2


SQLiteEngineV2QueueMachine.TestCase.settings = QueueMachine.TestCase.settings
TestQueueLifecycleOnSQLiteEngineV2 = SQLiteEngineV2QueueMachine.TestCase
