"""A lease that fails midway holds nothing it did not return, on every store.

The fault is injected at the store port (``FailingClaims``), so the same matrix runs over memory,
SQLite, moto and the moto server: a store error on the k-th claim of a lease of n (k = 1, n/2, n),
after which every claimed item is leasable again at once with its attempts unchanged; and a lease
whose reply cannot be built, which gives its items back the same way. ``max_attempts: 1`` is the
sharpest case: an item whose one attempt were spent by a failed lease would be dead-lettered
without ever being delivered.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from querator.api import routes, schemas
from querator.api.gateway import build_app
from querator.config import load_settings
from querator.domain.errors import StoreUnavailableError
from querator.localserver import LocalContext, proxy_event
from querator.ports import BatchResult, ClaimInterruptedError
from querator.service import QueueService
from querator.testing import build_service, dynamodb_client
from tests.contract.helpers import items, make_queue
from tests.reliability.faults import Fault, FaultInjector

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from querator.domain.model import Item
    from querator.ports import ItemStore
    from querator.testing import FakeClock

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


def _failing(service: QueueService, clock: FakeClock, fail_at: int) -> tuple[QueueService, FailingClaims]:
    store = FailingClaims(service.store, fail_at)
    return QueueService(catalog=service.catalog, store=store, clock=clock), store  # type: ignore[arg-type]


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
    # The capped path claims one item at a time through the group's ledger; fail its third claim.
    failing, store = _failing(service, clock, fail_at=BATCH * 10)
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
    service = build_service(client, clock=clock, concurrency=concurrency)
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
    """The store, but every ``move`` (the put-back of expired leases, a retry) fails while armed."""

    def __init__(self, store: ItemStore) -> None:
        self._store = store
        self.armed = False
        self.failed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def move(self, *args: Any, **kwargs: Any) -> Any:
        if self.armed:
            self.failed += 1
            raise StoreUnavailableError("injected: the store timed out on the move")
        return self._store.move(*args, **kwargs)


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
    store = FailingMoves(service.store)
    flaky = QueueService(catalog=service.catalog, store=store, clock=clock)  # type: ignore[arg-type]

    store.armed = True
    lease = flaky.lease("jobs", batch_size=5, client_id="w")
    store.armed = False

    assert store.failed >= 1
    assert [item.payload for item in lease.items] == [b"fresh"]
    again = flaky.lease("jobs", batch_size=5, client_id="w")
    assert [(item.payload, item.attempts) for item in again.items] == [(b"expires", 2)]
