"""Fault injection at the store boundary: every service operation, a fault on each DynamoDB call it makes.

For each operation the test first runs it clean to learn the calls it makes, then, for every call
position and every fault kind (``tests.reliability.faults``), runs it on fresh state with that call
failing, and checks:

1. the caller gets success or an error it can retry, the right one for the fault: a throttle is
   ``RetryLaterError`` (454, "try again"), a store error or no reply ``StoreUnavailableError``
   (500), a Lambda timeout ends the invocation (API Gateway answers 5xx); never a
   "you asked for something wrong" error;
2. never a false success: when the call returned, its whole effect is in the store;
3. after the caller retries the same request (faults off) the store holds every item exactly once,
   except where docs/adr/0004-idempotent-produce.md allows a duplicate: a produce *without* an
   Idempotency-Key retried after a failure may store some items twice (never lose one); a lease
   that failed may have leased items its caller never saw, which come back when the lease runs out;
4. a lease that succeeded leased nothing its reply does not hold.

``Fault.RETRIED`` is the lost reply that botocore retried itself: the caller sees the retry's
answer, so the operation must succeed as if nothing had happened. A conditional write's retry
finds its own effect and must know it for its own: a claim by its token, a keyed produce's record by
its ids, a queue create by the queue it wrote. One case is left as it is: a complete (a delete
guarded by the lease) retried after it applied finds the item gone and reports that id as not
completed, because DynamoDB cannot tell "I deleted it" from "its lease ran out and it was
requeued"; the item was completed, the consumer is told it may not have been (no item lost or
doubled, so the matrix's checks hold).

Call positions after the first write are the "failure between two writes of a multi-step
operation" cases: produce of 60 items (three BatchWriteItem requests), idempotent produce
(begin / put / finish), retry and dead letter (read then a two-item transaction per item), the
reaper's moves, clear and queue delete (query then deletes).
"""

from __future__ import annotations

import itertools
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import BotoCoreError
from moto import mock_aws

from querator.domain.errors import (
    QueratorError,
    QueueAlreadyExistsError,
    QueueNotFoundError,
    RequestInProgressError,
    RetryLaterError,
    StoreUnavailableError,
)
from querator.domain.model import ClearScope, NewItem, QueueInfo, QueueUpdate, RetryRequest, StorageItem
from querator.domain.priority import BANDS
from querator.ports.log import LogKey
from querator.service import QueueService
from querator.storage.dynamodb import schema
from querator.storage.dynamodb.log import DynamoDBClaimLog
from querator.storage.dynamodb.store import DynamoDBItemStore
from querator.testing import FakeClock, build_service, dynamodb_client
from tests.reliability.faults import Fault, FaultInjector, LambdaTimeout

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


LEASE = timedelta(seconds=30)
EXPIRE = timedelta(hours=1)
_names = itertools.count()


@dataclass
class World:
    service: QueueService
    clock: FakeClock
    injector: FaultInjector
    raw: Any
    items_table: str
    queue: str = ""
    dead: str = ""
    #: Facts the scenario's setup learnt (leased ids, the partition, ...).
    facts: dict[str, Any] = field(default_factory=dict)

    def make_queue(self, name: str, **fields: Any) -> None:
        placeholder = datetime(2000, 1, 1, tzinfo=UTC)
        fields.setdefault("lease_timeout", LEASE)
        fields.setdefault("expire_timeout", EXPIRE)
        self.service.create_queue(
            QueueInfo(name=name, created_at=placeholder, updated_at=placeholder, **fields)
        )

    def census(self, name: str) -> Counter[str]:
        """Payloads of every item stored under a queue, leased or not, read straight from the table
        (engine v2's rows) and, with engine v3, through the claim log's own listing of its logs (its
        packed rows stay until TTL after their items are settled, so the table alone cannot say)."""
        found: Counter[str] = Counter()
        log = self.service.log
        if log is not None:
            for partition in range(4):
                for band in BANDS:
                    listed = log.list_items(
                        LogKey(name, partition, band), after="", limit=10_000, now=self.clock.now()
                    )
                    found.update(item.payload.decode() for item in listed)
        for partition in range(4):
            pk = schema.partition_key(name, partition)
            kwargs: dict[str, Any] = {
                "TableName": self.items_table,
                "KeyConditionExpression": "pk = :pk",
                "ExpressionAttributeValues": {":pk": {"S": pk}},
            }
            while True:
                reply = self.raw.query(**kwargs)
                found.update(
                    bytes(i[schema.PAYLOAD]["B"]).decode() for i in reply["Items"] if schema.PAYLOAD in i
                )
                if "LastEvaluatedKey" not in reply:
                    break
                kwargs["ExclusiveStartKey"] = reply["LastEvaluatedKey"]
        return found


@contextmanager
def worlds(engine: int) -> Iterator[Callable[[], World]]:
    """A fresh world per run in one in-process moto (single-threaded, so conditional writes hold):
    a fresh items table, and a catalog emptied of the previous world's queues and reaper bookmark,
    because the reaper reads every queue. The catalog table is shared: its PynamoDB model (and its
    botocore client) is built once per table name and kept for the process. Engine v3: the service
    has a claim log on the same table (FIFO queues' items go there)."""
    with mock_aws():
        client = dynamodb_client()
        injector = FaultInjector()
        injector.attach(client)
        template = build_service(client, clock=FakeClock(), prefix="faults")
        catalog = template.catalog
        # The catalog is a PynamoDB model with its own botocore client (see benchmarks/meter.py).
        injector.attach(catalog._model._get_connection().connection.client)  # type: ignore[attr-defined]
        tables = ["faults-items"]

        def make() -> World:
            injector.disarm()
            for info in list(catalog.iterate()):
                catalog.remove(info.name)
            catalog.save_bookmark(None)
            client.delete_table(TableName=tables[0])  # the previous world's: keeps moto's memory flat
            n = next(_names)
            tables[0] = f"faults-items-{n}"
            client.create_table(**schema.items_table_definition(tables[0]))
            clock = FakeClock()
            # One write at a time: moto in-process is not safe for concurrent requests.
            store = DynamoDBItemStore(client, tables[0], concurrency=1)
            log = DynamoDBClaimLog(client, tables[0], concurrency=1) if engine == 3 else None
            service = QueueService(catalog=catalog, store=store, clock=clock, log=log)
            return World(service, clock, injector, client, tables[0], queue=f"q{n:05d}", dead=f"dlq{n:05d}")

        yield make


@pytest.fixture(scope="module")
def world_factory() -> Iterator[Callable[[], World]]:
    """Worlds on engine v2 (the product's engine)."""
    with worlds(2) as make:
        yield make


@pytest.fixture(scope="module")
def world_factory_v3() -> Iterator[Callable[[], World]]:
    """Worlds whose service has engine v3's claim log (docs/adr/0100)."""
    with worlds(3) as make:
        yield make


def tags(world: World, count: int, prefix: str = "") -> list[str]:
    return [f"{prefix or world.queue}-{i:03d}" for i in range(count)]


def produce_tagged(world: World, count: int) -> list[str]:
    payloads = tags(world, count)
    world.service.produce(world.queue, [NewItem(payload=p.encode()) for p in payloads])
    return payloads


def lease_some(world: World, count: int) -> None:
    lease = world.service.lease(world.queue, batch_size=count, client_id="setup")
    world.facts["partition"] = lease.partition
    world.facts["leased"] = {item.id: item.payload.decode() for item in lease.items}


# -- scenarios ----------------------------------------------------------------------------------
# Each: setup (clean), the operation (under a fault), a retry of it (clean), and a check of the
# final store, given whether the first call reported success.


@dataclass(frozen=True)
class Scenario:
    name: str
    setup: Callable[[World], None]
    operation: Callable[[World], Any]
    check: Callable[[World, bool], None]
    retry: Callable[[World], Any] | None = None
    #: Domain errors the *retry* may end with because the first, failed call had in fact applied.
    already_done: tuple[type[QueratorError], ...] = ()


def exactly_once(found: Counter[str], expected: list[str]) -> None:
    assert sorted(found.elements()) == sorted(expected)


# produce without a key: at-least-once across a retried failure (ADR 0004), exactly once on success.
def setup_queue(w: World) -> None:
    w.make_queue(w.queue)


def op_produce(w: World) -> Any:
    return w.service.produce(w.queue, [NewItem(payload=p.encode()) for p in tags(w, 60)])


def check_produce(w: World, first_succeeded: bool) -> None:
    found = w.census(w.queue)
    assert set(found) == set(tags(w, 60)), "an item was lost"
    if first_succeeded:
        exactly_once(found, tags(w, 60))


def op_produce_keyed(w: World) -> Any:
    return w.service.produce(
        w.queue, [NewItem(payload=p.encode()) for p in tags(w, 60)], idempotency_key=f"key-{w.queue}"
    )


def check_produce_keyed(w: World, first_succeeded: bool) -> None:
    exactly_once(w.census(w.queue), tags(w, 60))


# lease: the caller either gets its items or an error; items leased behind a failed call come back.
def setup_ten(w: World) -> None:
    w.make_queue(w.queue)
    produce_tagged(w, 10)


def op_lease(w: World) -> Any:
    lease = w.service.lease(w.queue, batch_size=5, client_id="consumer")
    w.facts["lease"] = lease
    return lease


def check_lease(w: World, first_succeeded: bool) -> None:
    if first_succeeded:
        lease = w.facts["lease"]
        stored = {i.id: i for i in w.service.list_items(w.queue, lease.partition)}
        now = w.clock.now()
        # No false success: every item handed out is leased in the store until its deadline.
        assert lease.items
        assert all(stored[i.id].is_leased(now) for i in lease.items)
        # And no item leased behind the caller's back: a claim that did apply is in the reply.
        leased = {i.id for i in stored.values() if i.is_leased(now)}
        assert leased == {i.id for i in lease.items}, "an item is leased that the reply does not hold"
    elif w.injector.fault in ANSWERED:
        # A lease that failed on an answered error holds nothing: what it had claimed is back at
        # once, no attempt spent. (A lost reply or a stopped invocation leaves a claim nobody knows
        # of, which its lease record brings back when it runs out: checked below.)
        now = w.clock.now()
        stored = w.service.list_items(w.queue, 0)  # one partition
        assert [i.payload for i in stored if i.is_leased(now)] == [], "a failed lease left items leased"
        assert {i.attempts for i in stored} == {0}, "a failed lease spent an attempt"
    # Nothing lost, nothing doubled: once the leases run out everything can be leased and completed.
    w.clock.advance(LEASE + timedelta(seconds=1))
    drained = drain(w, w.queue)
    exactly_once(drained, tags(w, 10))


#: Faults the store answered (nothing applied at that call): the caller knows what it holds.
ANSWERED = frozenset({Fault.THROTTLED, Fault.THROTTLING, Fault.INTERNAL, Fault.CONNECTION})


def drain(w: World, name: str) -> Counter[str]:
    got: Counter[str] = Counter()
    for _ in range(50):
        try:
            lease = w.service.lease(name, batch_size=10, client_id="drain")
        except RetryLaterError:
            break
        outcome = w.service.complete(name, lease.partition, [i.id for i in lease.items])
        assert not outcome.failed
        got.update(i.payload.decode() for i in lease.items)
    return got


# complete / retry / renew: five of ten leased.
def setup_leased(w: World, **queue_fields: Any) -> None:
    if queue_fields.pop("with_dead", False):
        w.make_queue(w.dead)
        queue_fields["dead_queue"] = w.dead
    w.make_queue(w.queue, **queue_fields)
    produce_tagged(w, 10)
    lease_some(w, 5)


def op_complete(w: World) -> Any:
    return w.service.complete(w.queue, w.facts["partition"], list(w.facts["leased"]))


def check_complete(w: World, first_succeeded: bool) -> None:
    leased = set(w.facts["leased"].values())
    exactly_once(w.census(w.queue), [t for t in tags(w, 10) if t not in leased])


def retry_requests(w: World, **fields: Any) -> list[RetryRequest]:
    return [RetryRequest(id=i, **fields) for i in w.facts["leased"]]


def op_retry_now(w: World) -> Any:
    return w.service.retry(w.queue, w.facts["partition"], retry_requests(w))


def op_retry_later(w: World) -> Any:
    at = w.clock.now() + timedelta(minutes=5)
    return w.service.retry(w.queue, w.facts["partition"], retry_requests(w, retry_at=at))


def check_all_back(w: World, first_succeeded: bool) -> None:
    exactly_once(w.census(w.queue), tags(w, 10))
    if first_succeeded:
        stored = w.service.list_items(w.queue, w.facts["partition"], limit=100)
        # No false success: nothing retried is still leased.
        assert not [i for i in stored if i.is_leased(w.clock.now())]


def op_retry_dead(w: World) -> Any:
    return w.service.retry(w.queue, w.facts["partition"], retry_requests(w, dead=True))


def check_dead(w: World, first_succeeded: bool) -> None:
    leased = set(w.facts["leased"].values())
    exactly_once(w.census(w.queue), [t for t in tags(w, 10) if t not in leased])
    exactly_once(w.census(w.dead), sorted(leased))


def op_renew(w: World) -> Any:
    return w.service.renew(
        w.queue, w.facts["partition"], list(w.facts["leased"]), lease_timeout=timedelta(minutes=10)
    )


def check_renew(w: World, first_succeeded: bool) -> None:
    exactly_once(w.census(w.queue), tags(w, 10))
    if first_succeeded:
        w.clock.advance(LEASE + timedelta(seconds=1))
        stored = {i.id: i for i in w.service.list_items(w.queue, w.facts["partition"], limit=100)}
        # No false success: the renewed leases outlive the original deadline.
        assert all(stored[i].is_leased(w.clock.now()) for i in w.facts["leased"])


# reaper: max_attempts 1, five leases ran out: they go to the dead-letter queue, once.
def setup_reap(w: World) -> None:
    setup_leased(w, with_dead=True, max_attempts=1)
    w.clock.advance(LEASE + timedelta(seconds=1))


def op_reap(w: World) -> Any:
    report = w.service.reap(w.clock.now(), timedelta(minutes=5))
    assert report.finished
    return report


def setup_clear(w: World) -> None:
    setup_leased(w)


def op_clear(w: World) -> Any:
    return w.service.clear(w.queue, ClearScope.QUEUE)


def check_clear(w: World, first_succeeded: bool) -> None:
    exactly_once(w.census(w.queue), sorted(w.facts["leased"].values()))


def op_import(w: World) -> Any:
    return w.service.import_items(
        w.queue, 0, [StorageItem(payload=t.encode(), source_id=f"src-{t}") for t in tags(w, 30)]
    )


def check_import(w: World, first_succeeded: bool) -> None:
    exactly_once(w.census(w.queue), tags(w, 30))


def op_create(w: World) -> Any:
    w.make_queue(w.queue)


def check_create(w: World, first_succeeded: bool) -> None:
    assert w.service.get_queue(w.queue).lease_timeout == LEASE


def op_update(w: World) -> Any:
    return w.service.update_queue(QueueUpdate(name=w.queue, max_attempts=7))


def check_update(w: World, first_succeeded: bool) -> None:
    assert w.service.get_queue(w.queue).max_attempts == 7


def setup_delete(w: World) -> None:
    w.make_queue(w.queue)
    for _ in range(2):
        produce_tagged(w, 20)


def op_delete(w: World) -> Any:
    w.service.delete_queue(w.queue)


def check_delete(w: World, first_succeeded: bool) -> None:
    with pytest.raises(QueueNotFoundError):
        w.service.get_queue(w.queue)
    assert not w.census(w.queue)


SCENARIOS = [
    Scenario("produce", setup_queue, op_produce, check_produce),
    Scenario("produce with idempotency key", setup_queue, op_produce_keyed, check_produce_keyed),
    Scenario("lease", setup_ten, op_lease, check_lease, retry=lambda w: None),
    Scenario("complete", setup_leased, op_complete, check_complete),
    Scenario("retry now", setup_leased, op_retry_now, check_all_back),
    Scenario("retry later", setup_leased, op_retry_later, check_all_back),
    Scenario("retry dead", lambda w: setup_leased(w, with_dead=True), op_retry_dead, check_dead),
    Scenario("renew", setup_leased, op_renew, check_renew),
    Scenario("reap", setup_reap, op_reap, check_dead),
    Scenario("clear", setup_clear, op_clear, check_clear),
    Scenario("import", setup_queue, op_import, check_import),
    Scenario(
        "queue create", lambda w: None, op_create, check_create, already_done=(QueueAlreadyExistsError,)
    ),
    Scenario("queue update", setup_queue, op_update, check_update),
    Scenario("queue delete", setup_delete, op_delete, check_delete, already_done=(QueueNotFoundError,)),
]

#: What the caller may get instead of success, by fault: a throttle is "try again" (454 at the HTTP
#: edge), a store error or no reply "the store failed" (500): both adapters translate botocore's
#: connection and timeout errors, so no raw botocore error reaches the service's callers.
RETRYABLE: dict[Fault, tuple[type[BaseException], ...]] = {
    Fault.THROTTLED: (RetryLaterError,),
    Fault.THROTTLING: (RetryLaterError,),
    Fault.INTERNAL: (StoreUnavailableError,),
    Fault.CONNECTION: (StoreUnavailableError,),
    Fault.LOST_REPLY: (StoreUnavailableError,),
    # Nothing: botocore's retry hides the lost reply, so the call must answer as if it had had none.
    Fault.RETRIED: (),
    Fault.LAMBDA_TIMEOUT: (LambdaTimeout,),
}


def run_with_retries(scenario: Scenario, world: World) -> None:
    """The caller retries until the request succeeds (bounded); a pending idempotency record
    belongs to a writer that died, which the service resumes once the record is stale."""
    retry = scenario.retry or scenario.operation
    for _ in range(4):
        try:
            retry(world)
        except RequestInProgressError:
            world.clock.advance(timedelta(minutes=16))
            continue
        except scenario.already_done:
            return
        return
    pytest.fail(f"{scenario.name}: the retried request never succeeded")


def calls_of(scenario: Scenario, make: Callable[[], World]) -> list[str]:
    world = make()
    scenario.setup(world)
    world.injector.arm(None, None)
    scenario.operation(world)
    calls = list(world.injector.calls)
    world.injector.disarm()
    scenario.check(world, True)
    return calls


@pytest.mark.slow  # about 125 s an engine on the 2-core CI machine: 14 operations x 7 faults x every call
@pytest.mark.parametrize("fault", list(Fault), ids=lambda f: f.name.lower())
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name.replace(" ", "-"))
@pytest.mark.parametrize("engine", [2, 3], ids=["engine-v2", "engine-v3"])
def test_no_false_success_and_no_lost_item_under_a_fault_on_any_call(
    scenario: Scenario, fault: Fault, engine: int, request: pytest.FixtureRequest
) -> None:
    world_factory = request.getfixturevalue("world_factory" if engine == 2 else "world_factory_v3")
    calls = calls_of(scenario, world_factory)
    assert calls, "the operation made no DynamoDB call"
    for position, call in enumerate(calls):
        world = world_factory()
        scenario.setup(world)
        world.injector.arm(position, fault)
        succeeded = False
        try:
            scenario.operation(world)
            succeeded = True
        except RETRYABLE[fault]:
            pass
        except (QueratorError, BotoCoreError, LambdaTimeout) as exc:
            pytest.fail(f"{scenario.name}: {fault.name} on call {position} ({call}) gave {exc!r}")
        finally:
            world.injector.disarm()
        assert world.injector.fired or succeeded, f"call {position} never happened"
        # A call that succeeded although its fault fired must be a true success: the check proves it.
        context = f"{scenario.name}: {fault.name} on call {position} ({call}) of {calls}"
        if not succeeded:
            run_with_retries(scenario, world)
        try:
            scenario.check(world, succeeded)
        except AssertionError as exc:
            raise AssertionError(f"{context}: {exc}") from exc


def test_the_injector_fails_exactly_the_chosen_call(world_factory: Callable[[], World]) -> None:
    world = world_factory()
    world.make_queue(world.queue)
    world.injector.arm(1, Fault.THROTTLED)
    with pytest.raises(RetryLaterError):
        world.service.produce(world.queue, [NewItem(payload=b"x")])
    assert world.injector.calls == ["GetItem", "BatchWriteItem"]
    world.injector.disarm()
    assert not world.census(world.queue)


def test_a_lost_reply_is_applied_in_the_store(world_factory: Callable[[], World]) -> None:
    world = world_factory()
    world.make_queue(world.queue)
    world.injector.arm(1, Fault.LOST_REPLY)
    with pytest.raises(StoreUnavailableError):
        world.service.produce(world.queue, [NewItem(payload=b"ambiguous")])
    world.injector.disarm()
    assert world.census(world.queue) == Counter({"ambiguous": 1})


# -- a write botocore retried after it had applied (Fault.RETRIED), one per conditional write that
# would otherwise read its own effect as someone else's. Fast; the matrix above covers every call.


def test_a_claim_retried_after_it_applied_is_the_callers_lease(world_factory: Callable[[], World]) -> None:
    world = world_factory()
    world.make_queue(world.queue)
    produce_tagged(world, 1)
    world.injector.arm(None, Fault.RETRIED, operation="UpdateItem")
    lease = world.service.lease(world.queue, batch_size=1, client_id="consumer")
    assert world.injector.fired
    world.injector.disarm()
    # Without the claim's token the retry fails its condition on its own write: the only item is
    # then leased by nobody for the lease timeout and the lease answers "nothing to lease".
    assert [i.payload for i in lease.items] == [f"{world.queue}-000".encode()]
    (stored,) = world.service.list_items(world.queue, lease.partition)
    assert stored.is_leased(world.clock.now())
    assert stored.attempts == 1


def test_a_claim_that_lost_to_a_competitor_is_still_lost(world_factory: Callable[[], World]) -> None:
    world = world_factory()
    world.make_queue(world.queue)
    produce_tagged(world, 1)
    (item,) = world.service.list_items(world.queue, 0)
    store = world.service.store
    now = world.clock.now()
    first = store.claim(world.queue, 0, [item.id], lease_deadline=now + LEASE, now=now)
    second = store.claim(world.queue, 0, [item.id], lease_deadline=now + LEASE, now=now)
    assert [i.id for i in first.applied] == [item.id]
    assert (second.applied, second.rejected) == ([], [item.id])


def test_a_keyed_produce_whose_record_write_was_retried_writes_once(
    world_factory: Callable[[], World],
) -> None:
    world = world_factory()
    world.make_queue(world.queue)
    world.injector.arm(None, Fault.RETRIED, operation="PutItem")
    receipt = op_produce_keyed(world)
    assert world.injector.fired
    world.injector.disarm()
    exactly_once(world.census(world.queue), tags(world, 60))
    # The record was finished: the request's retry is answered from it.
    assert op_produce_keyed(world).ids == receipt.ids


def test_a_queue_create_retried_after_it_applied_succeeds_and_a_second_create_does_not(
    world_factory: Callable[[], World],
) -> None:
    world = world_factory()
    world.injector.arm(None, Fault.RETRIED, operation="PutItem")
    world.make_queue(world.queue)
    assert world.injector.fired
    world.injector.disarm()
    assert world.service.get_queue(world.queue).lease_timeout == LEASE
    # Another create of the name is refused, even with the same settings at the same instant.
    with pytest.raises(QueueAlreadyExistsError):
        world.make_queue(world.queue)
