"""A lease that fails midway holds nothing it did not return, on every store.

The fault is injected at the store port (``FailingClaims``), so the same matrix runs over memory,
SQLite, moto and the moto server: a store error on the k-th claim of a lease of n (k = 1, n/2, n),
after which every claimed item is leasable again at once with its attempts unchanged; and a lease
whose reply cannot be built, which gives its items back the same way. ``max_attempts: 1`` is the
sharpest case: an item whose one attempt were spent by a failed lease would be dead-lettered
without ever being delivered.

On engine v3 (``QUERATOR_TEST_ENGINE=3``, or a service built with a claim log) the same promises
are injected where v3 claims: the log's ``claim`` (``FailingLogClaims``), its ``settle`` (the
put-back of expired leases). And on memory and SQLite a v3 lease meets a store error at each call it
makes to its log in turn (``FaultyLog``: claim, collect, get, settle, promote, expired, head, as
tests/reliability/test_faults.py does for DynamoDB's requests): nothing is leased to nobody after.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from querator.api import routes, schemas
from querator.api.gateway import build_app
from querator.config import load_settings
from querator.domain.errors import StoreUnavailableError
from querator.domain.model import Item
from querator.localserver import LocalContext, proxy_event
from querator.ports import BatchResult, ClaimInterruptedError
from querator.ports.log import ClaimReadError, LogKey
from querator.service import QueueService
from querator.testing import FakeClock, build_service, dynamodb_client, memory_service, sqlite_service
from tests.contract.helpers import beside, items, make_queue
from tests.reliability.faults import Fault, FaultInjector

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from datetime import datetime
    from pathlib import Path

    from querator.ports import ItemStore
    from querator.ports.log import Claim, ClaimLog

BATCH = 10


class FailingClaims:
    """The store, but the claim that would take the ``fail_at``-th item (1-based, counted over the
    service's claims) fails there: the ids before it in that call are claimed, then the store
    error is raised the way the DynamoDB store raises it (``ClaimInterruptedError`` naming what
    applied, or the error itself when nothing did)."""

    def __init__(self, store: ItemStore, fail_at: int) -> None:
        self._store = store
        self.fail_at = fail_at
        self.tried = 0
        self.fired = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def claim(
        self, queue: str, partition: int, ids: Sequence[str], *, lease_deadline: datetime, now: datetime
    ) -> BatchResult[Item]:
        if self.fired or self.tried + len(ids) < self.fail_at:
            self.tried += len(ids)
            return self._store.claim(queue, partition, ids, lease_deadline=lease_deadline, now=now)
        before = self.fail_at - self.tried - 1
        self.fired = True
        applied = self._store.claim(
            queue, partition, ids[:before], lease_deadline=lease_deadline, now=now
        ).applied
        failure = StoreUnavailableError("injected: the store failed this claim")
        if applied:
            raise ClaimInterruptedError(applied) from failure
        raise failure


class FailingLogClaims:
    """Engine v3's claim log, but the claim that would take the ``fail_at``-th position (1-based,
    counted over the service's claims) fails there, the way a store whose claim is not one
    transaction fails (DynamoDB's: a head write, then a read of the run's rows): with positions
    before it in that call, it took those (a shorter run, which a claim may always take) and raises
    ``ClaimReadError`` naming them; with none, the store error itself, nothing taken."""

    def __init__(self, log: ClaimLog, fail_at: int) -> None:
        self._log = log
        self.fail_at = fail_at
        self.tried = 0
        self.fired = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)

    def claim(self, key: LogKey, *, count: int, deadline: datetime, now: datetime, **kwargs: Any) -> Claim:
        if self.fired or self.tried + count < self.fail_at:
            claim = self._log.claim(key, count=count, deadline=deadline, now=now, **kwargs)
            self.tried += len(claim.items) + len(claim.holes)
            return claim
        before = self.fail_at - self.tried - 1
        self.fired = True
        failure = StoreUnavailableError("injected: the store failed this claim")
        if not before:
            raise failure
        run = self._log.claim(key, count=before, deadline=deadline, now=now, **kwargs)
        raise ClaimReadError(run.token, [item.id for item in run.items] + run.holes, failure)


def _failing(
    service: QueueService, clock: FakeClock, fail_at: int
) -> tuple[QueueService, FailingClaims | FailingLogClaims]:
    """The service, its claims failing at the ``fail_at``-th item: engine v2's item store's, or
    (a service with a claim log) the log's, where engine v3's items are claimed."""
    if service.log is not None:
        log = FailingLogClaims(service.log, fail_at)
        failing = QueueService(catalog=service.catalog, store=service.store, clock=clock, log=log)  # type: ignore[arg-type]
        return failing, log
    return _failing_store(service, clock, fail_at)


def _failing_store(
    service: QueueService, clock: FakeClock, fail_at: int
) -> tuple[QueueService, FailingClaims]:
    """The service, engine v2's item store's claims failing at the ``fail_at``-th item (on either
    engine: a fair queue's items are v2's on both)."""
    store = FailingClaims(service.store, fail_at)
    return QueueService(catalog=service.catalog, store=store, clock=clock, log=service.log), store  # type: ignore[arg-type]


def _assert_all_back(service: QueueService, produced: int) -> None:
    """Nothing leased, no attempt spent, the counters agree, and one lease gets every item at once."""
    listed = service.list_items("jobs", 0)
    assert len(listed) == produced
    assert [item for item in listed if item.lease_deadline is not None] == []
    assert {item.attempts for item in listed} == {0}
    (stats,) = service.stats("jobs")
    assert (stats.total, stats.total_leased) == (produced, 0)
    lease = service.lease("jobs", batch_size=produced, client_id="after")
    assert sorted(item.payload for item in lease.items) == sorted(f"p{n}".encode() for n in range(produced))
    assert {item.attempts for item in lease.items} == {1}


@pytest.mark.parametrize("fail_at", [1, BATCH // 2, BATCH], ids=lambda k: f"claim-{k}-of-{BATCH}")
@pytest.mark.parametrize("max_attempts", [0, 1], ids=["unlimited", "max-attempts-1"])
def test_a_store_error_on_a_claim_gives_back_what_the_lease_claimed(
    service: QueueService, clock: FakeClock, fail_at: int, max_attempts: int
) -> None:
    make_queue(service, max_attempts=max_attempts)
    service.produce("jobs", items(*(f"p{n}" for n in range(BATCH))))
    failing, store = _failing(service, clock, fail_at)

    with pytest.raises(StoreUnavailableError):
        failing.lease("jobs", batch_size=BATCH, client_id="doomed")

    assert store.fired
    # No reaper pass and no time passes: the items are back because the lease gave them back.
    _assert_all_back(service, BATCH)


def test_a_store_error_in_a_fair_capped_lease_frees_the_group_slots(
    service: QueueService, clock: FakeClock
) -> None:
    make_queue(service, delivery="fair", max_leased_per_group=2)
    for group in ("a", "b"):
        service.produce("jobs", items(*(f"{group}{n}" for n in range(3)), group=group))
    if service.log is not None:
        # Engine v3: each group's lane is a log, claimed a lane's share at a time under the cap;
        # fail the claim that takes the third item.
        failing, _ = _failing(service, clock, fail_at=3)
    else:
        # The capped path claims one item at a time through the group's ledger; fail its third claim.
        failing, store = _failing_store(service, clock, fail_at=BATCH * 10)
        real_claim_in_group = service.store.claim_in_group
        calls = 0

        def claim_in_group(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 3:
                raise StoreUnavailableError("injected: the store failed this claim")
            return real_claim_in_group(*args, **kwargs)

        store.claim_in_group = claim_in_group  # type: ignore[method-assign]

    with pytest.raises(StoreUnavailableError):
        failing.lease("jobs", batch_size=4, client_id="doomed")

    listed = service.list_items("jobs", 0)
    assert [item for item in listed if item.lease_deadline is not None] == []
    assert {item.attempts for item in listed} == {0}
    # Both groups' slots are free again: the cap lets two of each be leased at once.
    lease = service.lease("jobs", batch_size=6, client_id="after")
    groups = sorted(item.group for item in lease.items)
    assert groups == ["a", "a", "b", "b"]


def _lease_event(batch_size: int) -> dict[str, Any]:
    body = json.dumps({"queue_name": "jobs", "batch_size": batch_size, "client_id": "w"}).encode()
    return proxy_event("POST", "/v1/queue.lease", {"Content-Type": "application/json"}, body, "127.0.0.1")


@pytest.mark.allow_5xx
@pytest.mark.parametrize("max_attempts", [0, 1], ids=["unlimited", "max-attempts-1"])
def test_a_lease_whose_reply_cannot_be_built_gives_its_items_back(
    service: QueueService, monkeypatch: pytest.MonkeyPatch, max_attempts: int
) -> None:
    make_queue(service, max_attempts=max_attempts)
    service.produce("jobs", items(*(f"p{n}" for n in range(BATCH))))
    app = build_app(routes.Function.LEASE, service=lambda: service, settings=load_settings)

    def unwritable(self: schemas.LeaseResponse) -> dict[str, Any]:
        raise MemoryError("injected: the reply cannot be built")

    with monkeypatch.context() as patched:
        patched.setattr(schemas.LeaseResponse, "to_wire", unwritable)
        reply = app.resolve(_lease_event(4), LocalContext(function_name="lease", timeout_seconds=30))

    assert reply["statusCode"] == 500
    _assert_all_back(service, BATCH)


def test_give_back_leaves_a_lease_that_is_no_longer_valid(service: QueueService, clock: FakeClock) -> None:
    """Giving back is fenced like retry: ids that ran out (or were completed) are left alone."""
    make_queue(service, lease_timeout=timedelta(seconds=5))
    service.produce("jobs", items("a", "b"))
    lease = service.lease("jobs", batch_size=2, client_id="w")
    first, second = lease.items
    service.complete("jobs", lease.partition, [first.id])

    assert service.give_back("jobs", lease.partition, [first.id, second.id]) == 1
    listed = service.list_items("jobs", 0)
    assert [(item.payload, item.attempts, item.lease_deadline) for item in listed] == [(b"b", 0, None)]

    again = service.lease("jobs", batch_size=1, client_id="w")
    clock.advance(timedelta(seconds=6))
    assert service.give_back("jobs", again.partition, [again.items[0].id]) == 0


@pytest.mark.parametrize("concurrency", [1, 8], ids=["one-at-a-time", "concurrent"])
def test_a_dynamodb_claim_that_fails_midway_names_what_it_claimed(
    moto_server: str, clock: FakeClock, concurrency: int
) -> None:
    """The DynamoDB store claims a wave concurrently, so one write can fail while others applied:
    it raises ``ClaimInterruptedError`` with exactly those, the failure as its cause."""
    client = dynamodb_client(moto_server)
    injector = FaultInjector()
    injector.attach(client)
    # Engine v2's item store claims item by item (a v3 claim is one write: ClaimReadError's tests).
    service = build_service(client, clock=clock, concurrency=concurrency, engine=2)
    make_queue(service)
    service.produce("jobs", items(*(f"p{n}" for n in range(6))))
    ids = [item.id for item in service.list_items("jobs", 0)]
    deadline = clock.now() + timedelta(seconds=30)

    injector.arm(2, Fault.INTERNAL)  # the third UpdateItem the claim sends
    with pytest.raises(ClaimInterruptedError) as raised:
        service.store.claim("jobs", 0, ids, lease_deadline=deadline, now=clock.now())
    injector.disarm()

    assert injector.fired
    assert isinstance(raised.value.__cause__, StoreUnavailableError)
    leased = {item.id for item in service.list_items("jobs", 0) if item.lease_deadline is not None}
    assert leased == {item.id for item in raised.value.claimed}
    # One at a time, the claims after the failure are not made; concurrently, all but it apply.
    assert len(leased) == (2 if concurrency == 1 else 5)


class FailingMoves:
    """The store, but every ``move`` (the put-back of expired leases, a retry) fails while armed;
    over engine v3's claim log, every ``settle`` (where its items move)."""

    def __init__(self, store: ItemStore | ClaimLog) -> None:
        self._store = store
        self.armed = False
        self.failed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def _fail(self) -> None:
        if self.armed:
            self.failed += 1
            raise StoreUnavailableError("injected: the store timed out on the move")

    def move(self, *args: Any, **kwargs: Any) -> Any:
        self._fail()
        return self._store.move(*args, **kwargs)  # type: ignore[union-attr]

    def settle(self, *args: Any, **kwargs: Any) -> Any:
        self._fail()
        return self._store.settle(*args, **kwargs)  # type: ignore[union-attr]


def test_a_lease_whose_put_back_of_expired_leases_fails_still_leases(
    service: QueueService, clock: FakeClock
) -> None:
    """Putting back expired leases is upkeep: when the store fails it (the 500 a deployed stack gave
    when moto's transaction outran the functions' read timeout), the lease leases what it can and
    the expired item comes back on a later call."""
    make_queue(service, lease_timeout=timedelta(seconds=5))
    service.produce("jobs", items("expires"))
    service.lease("jobs", batch_size=1, client_id="gone")
    clock.advance(timedelta(seconds=6))
    service.produce("jobs", items("fresh"))
    if service.log is not None:
        store = FailingMoves(service.log)
        flaky = QueueService(catalog=service.catalog, store=service.store, clock=clock, log=store)  # type: ignore[arg-type]
    else:
        store = FailingMoves(service.store)
        flaky = QueueService(catalog=service.catalog, store=store, clock=clock)  # type: ignore[arg-type]

    store.armed = True
    lease = flaky.lease("jobs", batch_size=5, client_id="w")
    store.armed = False

    assert store.failed >= 1
    assert [item.payload for item in lease.items] == [b"fresh"]
    again = flaky.lease("jobs", batch_size=5, client_id="w")
    assert [(item.payload, item.attempts) for item in again.items] == [(b"expires", 2)]


# -- engine v3: a store error at each claim-log call a lease makes (memory and SQLite). The DynamoDB
# log has its matrix in tests/reliability/test_faults.py, one fault per DynamoDB request.


#: The claim log's calls a lease makes: its upkeep, its claim and hole reads, the give-back of a
#: failure (``LogHead`` reads included: a lease that cannot read the head fails before it claims).
LOG_CALLS = frozenset({"head", "expired", "settle", "promote", "claim", "collect", "get"})
#: Upkeep of others' work (expired leases back, scheduled items due): a store error there must not
#: fail the lease, as in engine v2 (``test_a_lease_whose_put_back_of_expired_leases_fails_still_leases``).
UPKEEP_CALLS = frozenset({"expired", "settle", "promote"})


class FaultyLog:
    """Engine v3's claim log, recording the calls of ``LOG_CALLS`` made to it. Armed at positions,
    the call at each fails: before it applies (a store error), or, a claim armed with
    ``read_error``, after it took its run (``ClaimReadError``, as a store whose claim is not one
    transaction raises: memory's and SQLite's never do)."""

    def __init__(self, log: ClaimLog) -> None:
        self._log = log
        self.calls: list[str] = []
        self.at: set[int] = set()
        #: Or by name: the next call of ``plan[0]`` fails, then of the next name, and so on.
        self.plan: list[str] = []
        self.read_error = False
        self.fired: list[str] = []
        #: Run once, as the first call of its name ends (whether or not it failed).
        self.after: dict[str, Callable[[], object]] = {}

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._log, name)
        if name not in LOG_CALLS:
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            position = len(self.calls)
            self.calls.append(name)
            try:
                if self.plan and self.plan[0] == name:
                    self.plan.pop(0)
                elif position not in self.at:
                    return method(*args, **kwargs)
                self.fired.append(name)
                failure = StoreUnavailableError(f"injected: the store failed {name} (call {position})")
                if name == "claim" and self.read_error:
                    run = method(*args, **kwargs)
                    raise ClaimReadError(run.token, [item.id for item in run.items] + run.holes, failure)
                raise failure
            finally:
                if name in self.after:
                    self.after.pop(name)()

        return call

    def flush(self) -> None:
        """Run what is still to run after a call the lease never made (it failed before)."""
        for hook in self.after.values():
            hook()
        self.after.clear()


def _v3_world(service: QueueService, clock: FakeClock) -> tuple[QueueService, FaultyLog]:
    """A lease that makes every kind of log call: an expired lease to put back, a scheduled item
    come due, two holes (writers that took their positions: one died, one writes its item just
    after the lease claimed its position) and items waiting after them. Returns a service beside
    ``service`` over the faulty log."""
    log = service.log
    assert log is not None
    make_queue(service, lease_timeout=timedelta(seconds=5))
    service.produce("jobs", items("expires"))
    service.lease("jobs", batch_size=1, client_id="gone")
    service.produce("jobs", items("scheduled", enqueue_in=timedelta(seconds=1)))
    log.take_positions(LogKey("jobs", 0), 1, now=clock.now())  # the dead writer's hole
    late = log.take_positions(LogKey("jobs", 0), 1, now=clock.now())
    service.produce("jobs", items("fresh-1", "fresh-2"))
    clock.advance(timedelta(seconds=6))
    faulty = FaultyLog(log)

    def late_write() -> None:
        now = clock.now()
        item = Item(id="", payload=b"late", created_at=now, expire_deadline=now + timedelta(hours=1))
        log.write_taken(LogKey("jobs", 0), late, [item], now=now)

    faulty.after["claim"] = late_write
    return beside(service, clock, log=faulty), faulty


PAYLOADS = Counter([b"expires", b"scheduled", b"late", b"fresh-1", b"fresh-2"])


def _stored(service: QueueService, clock: FakeClock) -> list[Item]:
    assert service.log is not None
    return service.log.list_items(LogKey("jobs", 0), after="", limit=100, now=clock.now())


def _attempts_before(item: Item) -> int:
    return 1 if item.payload == b"expires" else 0  # "expires" spent one attempt on the gone consumer


def _assert_nothing_held_by_nobody(service: QueueService, clock: FakeClock, reply: list[Item]) -> None:
    """Every item stored once; validly leased are exactly the reply's, each with one attempt more,
    the others with none spent; and the next lease gets every other item at once."""
    stored = _stored(service, clock)
    assert Counter(item.payload for item in stored) == PAYLOADS
    now = clock.now()
    assert sorted(item.id for item in stored if item.is_leased(now)) == sorted(item.id for item in reply)
    for item in reply:
        assert item.attempts == _attempts_before(item) + 1, item
    for item in stored:
        if not item.is_leased(now) and item.lease_deadline is None:
            assert item.attempts == _attempts_before(item), item
    rest = service.lease("jobs", batch_size=10, client_id="next").items if len(reply) < len(PAYLOADS) else []
    assert Counter(item.payload for item in reply + rest) == PAYLOADS
    for item in rest:
        assert item.attempts == _attempts_before(item) + 1, item


def _calls_of_a_lease(kind: str, tmp_path: Path) -> list[str]:
    """The log calls a clean lease of the world makes."""
    clock = FakeClock()
    flaky, faulty = _v3_world(_v3_service(kind, tmp_path, clock, 0), clock)
    reply = flaky.lease("jobs", batch_size=10, client_id="w").items
    assert Counter(item.payload for item in reply) == PAYLOADS
    return faulty.calls


def _v3_service(kind: str, tmp_path: Path, clock: FakeClock, n: int) -> QueueService:
    if kind == "memory":
        return memory_service(clock=clock, engine=3)
    return sqlite_service(tmp_path / f"querator-{n}.db", clock=clock, engine=3)


@pytest.mark.parametrize("read_error", [False, True], ids=["store-error", "claim-read-error"])
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_store_error_on_any_log_call_of_a_lease_leaves_nothing_leased_to_nobody(
    kind: str, read_error: bool, tmp_path: Path
) -> None:
    calls = _calls_of_a_lease(kind, tmp_path)
    assert {"head", "expired", "settle", "promote", "claim", "collect"} <= set(calls), calls
    first_claim = calls.index("claim")
    positions = [p for p, name in enumerate(calls) if name == "claim"] if read_error else range(len(calls))
    for position in positions:
        clock = FakeClock()
        service = _v3_service(kind, tmp_path, clock, position + 1)
        flaky, faulty = _v3_world(service, clock)
        faulty.at, faulty.read_error = {position}, read_error
        context = f"{'ClaimReadError' if read_error else 'store error'} on call {position} of {calls}"
        reply: list[Item] = []
        try:
            reply = flaky.lease("jobs", batch_size=10, client_id="w").items
        except StoreUnavailableError:
            # Upkeep of others' leases and schedules is not the lease's own work.
            assert not (position < first_claim and calls[position] in UPKEEP_CALLS), context
        assert faulty.fired == [calls[position]], context
        faulty.flush()
        try:
            _assert_nothing_held_by_nobody(service, clock, reply)
        except AssertionError as exc:
            raise AssertionError(f"{context}: {exc}") from exc


@pytest.mark.parametrize("give_back_call", ["get", "settle"])
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_claim_whose_give_back_fails_too_returns_its_run_when_the_lease_runs_out(
    kind: str, give_back_call: str, tmp_path: Path
) -> None:
    """Two faults: the claim took its run and failed (``ClaimReadError``), then the give-back
    failed as well. Nothing is lost: the lease record holds the run until its deadline, and the
    items come back then, as those of any lease that ran out."""
    clock = FakeClock()
    service = _v3_service(kind, tmp_path, clock, 1)
    flaky, faulty = _v3_world(service, clock)
    faulty.plan, faulty.read_error = ["claim", give_back_call], True

    with pytest.raises(StoreUnavailableError):
        flaky.lease("jobs", batch_size=10, client_id="w")

    assert faulty.fired == ["claim", give_back_call]
    faulty.flush()
    assert Counter(item.payload for item in _stored(service, clock)) == PAYLOADS
    clock.advance(timedelta(seconds=6))
    back = service.lease("jobs", batch_size=10, client_id="next").items
    assert Counter(item.payload for item in back) == PAYLOADS
