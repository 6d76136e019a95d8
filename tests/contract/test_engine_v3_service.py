"""The service over engine v3's claim log (``QueueService(log=...)``, service/logs.py), on every store.

What a consumer and an operator see through the service while its FIFO queues live in logs: produce,
lease by priority then oldest first, complete, retry (tail, later, dead), expiry back to the tail with
the attempt counted, ``max_attempts`` and ``expire_timeout`` into the dead-letter queue, renew, give
back, idempotent produce (and its resume after a crash), listings, counts, clear, redrive, the
reaper's upkeep, queue delete; and the upgrade: what engine v2 stored is served first, nothing lost
or delivered twice. ``QUERATOR_TEST_ENGINE=3`` runs the whole contract suite this way, to see what is
left (docs/adr/0100-engine-v3-candidates.md, "Where the build stands").
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from moto import mock_aws

from querator.domain.errors import NothingToLeaseError, StoreUnavailableError
from querator.domain.groups import group_lane
from querator.domain.model import ClearScope, RetryRequest
from querator.domain.positions import POSITION_MARK, SCHEDULED_MARK
from querator.domain.priority import lane_of
from querator.ports.log import LogKey
from querator.service import QueueService
from querator.service.logs import REAPER_PAGE, is_log_id
from querator.service.tuning import BAND_IDLE
from querator.storage.dynamodb import schema
from querator.storage.dynamodb.catalog import DynamoDBQueueCatalog
from querator.storage.dynamodb.log import DynamoDBClaimLog
from querator.storage.dynamodb.store import DynamoDBItemStore
from querator.testing import dynamodb_client, memory_service, sqlite_service
from tests.contract.helpers import items, make_queue, payloads

if TYPE_CHECKING:
    from collections.abc import Iterator

    from querator.testing import FakeClock


def _dynamodb_service(client: object, clock: FakeClock, *, engine: int, tables: str) -> QueueService:
    schema.create_tables(client, items_table=f"{tables}-items", catalog_table=f"{tables}-queues")
    return QueueService(
        catalog=DynamoDBQueueCatalog(f"{tables}-queues", host=client.meta.endpoint_url, region="us-east-1"),  # type: ignore[attr-defined]
        store=DynamoDBItemStore(client, f"{tables}-items", concurrency=1),  # type: ignore[arg-type]
        clock=clock,
        log=DynamoDBClaimLog(client, f"{tables}-items", concurrency=1) if engine == 3 else None,
    )


@pytest.fixture(params=["memory", "sqlite", "moto"])
def store_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def services(
    store_name: str, clock: FakeClock, tmp_path: object
) -> Iterator[tuple[QueueService, QueueService]]:
    """(an engine v2 service, an engine v3 service) over the same storage: the upgrade's two sides."""
    if store_name == "memory":
        v2 = memory_service(clock=clock, engine=2)
        v3 = QueueService(
            catalog=v2.catalog,
            store=v2.store,
            clock=clock,
            log=memory_service(clock=clock, engine=3).log,
        )
        yield v2, v3
    elif store_name == "sqlite":
        path = tmp_path / "querator.db"  # type: ignore[operator]
        yield sqlite_service(path, clock=clock, engine=2), sqlite_service(path, clock=clock, engine=3)
    else:
        with mock_aws():
            client = dynamodb_client()
            yield (
                _dynamodb_service(client, clock, engine=2, tables="t"),
                _dynamodb_service(client, clock, engine=3, tables="t"),
            )


@pytest.fixture
def service(services: tuple[QueueService, QueueService]) -> QueueService:
    return services[1]


def _lease(service: QueueService, batch: int = 10, queue: str = "jobs") -> list:  # type: ignore[type-arg]
    try:
        return service.lease(queue, batch_size=batch, client_id="c").items
    except NothingToLeaseError:
        return []


def _drain(service: QueueService, queue: str = "jobs") -> list[bytes]:
    seen: list[bytes] = []
    for _ in range(50):
        leased = _lease(service, queue=queue)
        if not leased:
            return seen
        seen += payloads(leased)
        service.complete(queue, 0, [i.id for i in leased])
    raise AssertionError("did not drain")


def test_items_go_into_the_log_and_come_out_oldest_first(service: QueueService) -> None:
    make_queue(service)
    receipt = service.produce("jobs", items("a", "b", "c"))
    service.produce("jobs", items("d"))

    assert all(lane_of(i) + POSITION_MARK == i[: len(lane_of(i)) + 1] for i in receipt.ids)
    first = _lease(service, batch=2)
    assert payloads(first) == [b"a", b"b"] and [i.id for i in first] == receipt.ids[:2]
    assert service.complete("jobs", 0, [i.id for i in first]).applied == [i.id for i in first]
    assert _drain(service) == [b"c", b"d"]
    stats = service.stats("jobs")[0]
    assert (stats.total, stats.total_leased, stats.produced, stats.completed) == (0, 0, 4, 4)


def test_priorities_lease_first_and_counts_cover_every_band(service: QueueService) -> None:
    make_queue(service)
    service.produce("jobs", items("five"))
    service.produce("jobs", items("one", priority=1))
    service.produce("jobs", items("nine", priority=9))

    leased = _lease(service, batch=1)
    assert payloads(leased) == [b"one"] and leased[0].priority == 1
    stats = service.stats("jobs")[0]
    assert (stats.total, stats.total_leased) == (3, 1)
    assert _drain(service) == [b"five", b"nine"]


def test_a_stale_holder_cannot_complete_and_a_complete_counts_once(
    service: QueueService, clock: FakeClock
) -> None:
    make_queue(service)
    service.produce("jobs", items("a"))
    first = _lease(service)[0]
    clock.advance(timedelta(seconds=31))

    second = _lease(service)[0]

    assert second.id != first.id and second.attempts == 2
    failed = service.complete("jobs", 0, [first.id, second.id])
    assert failed.applied == [second.id] and [f.id for f in failed.failed] == [first.id]
    assert service.complete("jobs", 0, [second.id]).applied == []


def test_retry_goes_to_the_tail_later_or_to_the_dead_letter_queue(
    service: QueueService, clock: FakeClock
) -> None:
    make_queue(service, "dlq")
    make_queue(service, dead_queue="dlq")
    service.produce("jobs", items("tail", "later", "dead", "next"))
    tail, later, dead = _lease(service, batch=3)

    outcome = service.retry(
        "jobs",
        0,
        [
            RetryRequest(id=tail.id),
            RetryRequest(id=later.id, retry_at=clock.now() + timedelta(minutes=1)),
            RetryRequest(id=dead.id, dead=True),
        ],
    )

    assert sorted(outcome.applied) == sorted([tail.id, later.id, dead.id])
    scheduled = service.list_scheduled("jobs", 0)
    assert payloads(scheduled) == [b"later"] and SCHEDULED_MARK in scheduled[0].id
    back = _lease(service)
    assert payloads(back) == [b"next", b"tail"]
    service.complete("jobs", 0, [i.id for i in back])
    letters = service.list_items("dlq", 0)
    assert payloads(letters) == [b"dead"] and letters[0].source_id == dead.id
    assert letters[0].source_queue == "jobs"
    clock.advance(timedelta(minutes=1))
    again = _lease(service)
    assert payloads(again) == [b"later"] and again[0].attempts == 2


def test_max_attempts_and_expire_timeout_dead_letter_at_lease_time(
    service: QueueService, clock: FakeClock
) -> None:
    make_queue(service, "dlq")
    make_queue(service, dead_queue="dlq", max_attempts=1, expire_timeout=timedelta(minutes=10))
    service.produce("jobs", items("once"))
    _lease(service)
    clock.advance(timedelta(seconds=31))
    service.produce("jobs", items("old"))
    clock.advance(timedelta(minutes=10))

    assert _lease(service) == []

    assert sorted(payloads(service.list_items("dlq", 0))) == [b"old", b"once"]


def test_renew_keeps_a_lease_past_its_first_deadline(service: QueueService, clock: FakeClock) -> None:
    make_queue(service)
    service.produce("jobs", items("a", "b"))
    a, _ = _lease(service, batch=2)
    clock.advance(timedelta(seconds=20))

    renewed = service.renew("jobs", 0, [a.id], lease_timeout=timedelta(minutes=5))
    clock.advance(timedelta(seconds=20))

    assert [r.id for r in renewed.items] == [a.id]
    assert payloads(_lease(service)) == [b"b"]  # b's lease ran out; a's holds
    assert service.complete("jobs", 0, [a.id]).applied == [a.id]


def test_give_back_returns_items_without_spending_the_attempt(service: QueueService) -> None:
    make_queue(service)
    service.produce("jobs", items("a"))
    a = _lease(service)[0]

    assert service.give_back("jobs", 0, [a.id]) == 1

    again = _lease(service)
    assert payloads(again) == [b"a"] and again[0].attempts == 1
    assert service.give_back("jobs", 0, [a.id]) == 0


def test_idempotent_produce_writes_once(service: QueueService) -> None:
    make_queue(service)
    first = service.produce("jobs", items("a", "b"), idempotency_key="k")
    second = service.produce("jobs", items("a", "b"), idempotency_key="k")

    assert second.replayed and second.ids == first.ids
    assert _drain(service) == [b"a", b"b"]


def test_listings_page_with_an_inclusive_pivot(service: QueueService, clock: FakeClock) -> None:
    make_queue(service)
    for n in range(5):
        service.produce("jobs", items(str(n)))
    service.produce("jobs", items("s", enqueue_at=clock.now() + timedelta(minutes=1)))

    first = service.list_items("jobs", 0, limit=2)
    second = service.list_items("jobs", 0, pivot=first[-1].id, limit=10)

    assert payloads(first) == [b"0", b"1"]
    assert payloads(second) == [b"1", b"2", b"3", b"4"]
    assert payloads(service.list_scheduled("jobs", 0)) == [b"s"]


def test_scheduled_items_due_together_keep_their_produce_order(
    service: QueueService, clock: FakeClock
) -> None:
    make_queue(service)
    at = clock.now() + timedelta(minutes=5)
    service.produce("jobs", items("s1", "s2", enqueue_at=at))
    service.produce("jobs", items("s3", enqueue_at=at))

    assert payloads(service.list_scheduled("jobs", 0)) == [b"s1", b"s2", b"s3"]
    clock.advance(timedelta(minutes=5))
    assert payloads(_lease(service)) == [b"s1", b"s2", b"s3"]


def test_clear_drops_waiting_then_scheduled_and_leased(service: QueueService, clock: FakeClock) -> None:
    make_queue(service)
    service.produce("jobs", items("held", "w1", "w2"))
    service.produce("jobs", items("s", enqueue_at=clock.now() + timedelta(hours=1)))
    _lease(service, batch=1)

    assert service.clear("jobs", ClearScope.QUEUE) == 2
    stats = service.stats("jobs")[0]
    assert (stats.total, stats.total_leased, stats.scheduled) == (1, 1, 1)
    assert service.clear("jobs", ClearScope.QUEUE | ClearScope.SCHEDULED | ClearScope.DESTRUCTIVE) == 2
    stats = service.stats("jobs")[0]
    assert (stats.total, stats.total_leased, stats.scheduled) == (0, 0, 0)


def test_redrive_moves_dead_letters_back_once(service: QueueService) -> None:
    make_queue(service, "dlq")
    make_queue(service, dead_queue="dlq")
    service.produce("jobs", items("a", "b"))
    leased = _lease(service, batch=2)
    service.retry("jobs", 0, [RetryRequest(id=i.id, dead=True) for i in leased])

    outcome = service.redrive("dlq")

    assert (outcome.moved, outcome.remaining) == (2, 0)
    back = _lease(service)
    assert payloads(back) == [b"a", b"b"] and [i.attempts for i in back] == [1, 1]
    assert service.redrive("dlq").moved == 0


def test_the_reaper_puts_back_expired_leases_and_dead_letters_expired_items(
    service: QueueService, clock: FakeClock
) -> None:
    make_queue(service, "dlq")
    make_queue(service, dead_queue="dlq", expire_timeout=timedelta(minutes=10))
    service.produce("jobs", items("leased", "waiting"))
    _lease(service, batch=1)
    clock.advance(timedelta(minutes=1))

    first = service.reap(clock.now(), timedelta(seconds=30))
    clock.advance(timedelta(minutes=10))
    second = service.reap(clock.now(), timedelta(seconds=30))

    assert first.recovered == 1 and first.requeued == 1
    assert second.dead_lettered == 2 and second.counts_by_reason == {"expired": 2}
    assert sorted(payloads(service.list_items("dlq", 0))) == [b"leased", b"waiting"]


def test_one_reaper_run_dead_letters_a_backlog_of_expired_items_leaving_no_tombstones(
    service: QueueService, clock: FakeClock
) -> None:
    """More than a window (REAPER_PAGE) of expired items go in one run, taken from the cursor as a
    lease takes them (the cursor passes them), so the log keeps no tombstone per item and the next
    lease finds the items that did not expire."""
    make_queue(service, "dlq")
    make_queue(service, dead_queue="dlq", expire_timeout=timedelta(minutes=10))
    old = REAPER_PAGE * 2 + 5
    service.produce("jobs", items(*(f"old-{n}" for n in range(old))))
    clock.advance(timedelta(minutes=9))
    service.produce("jobs", items("young-0", "young-1"))
    clock.advance(timedelta(minutes=2))

    report = service.reap(clock.now(), timedelta(seconds=30))

    assert report.dead_lettered == old and report.counts_by_reason == {"expired": old}
    assert service.log is not None
    assert service.log.head(LogKey("jobs", 0)).skipped == 0  # the cursor passed them
    assert payloads(_lease(service, batch=10)) == [b"young-0", b"young-1"]
    assert service.stats("dlq")[0].total == old


def test_delete_items_and_delete_queue_remove_log_items(service: QueueService) -> None:
    make_queue(service)
    receipt = service.produce("jobs", items("a", "b"))

    service.delete_items("jobs", 0, receipt.ids[:1])

    assert payloads(service.list_items("jobs", 0)) == [b"b"]
    service.delete_queue("jobs")
    make_queue(service)
    assert service.list_items("jobs", 0) == []
    assert _lease(service) == []


def test_what_engine_v2_stored_is_served_first_and_nothing_twice(
    services: tuple[QueueService, QueueService], clock: FakeClock
) -> None:
    v2, v3 = services
    make_queue(v2, "dlq")
    make_queue(v2, dead_queue="dlq", max_attempts=2)
    v2.produce("jobs", items("v2-ready", "v2-leased", "v2-waiting"))
    v2.produce("jobs", items("v2-later", enqueue_at=clock.now() + timedelta(minutes=1)))
    held = v2.lease("jobs", batch_size=2, client_id="old").items
    v2.retry("jobs", 0, [RetryRequest(id=held[0].id, dead=True)])
    # held[1] ("v2-leased") stays leased by the old consumer; the v3 service takes over.
    v3.produce("jobs", items("v3-new"))

    first = _lease(v3)
    assert payloads(first) == [b"v2-waiting", b"v3-new"]
    assert v3.complete("jobs", 0, [held[1].id]).applied == [held[1].id]  # the old lease is honoured
    v3.complete("jobs", 0, [i.id for i in first])
    clock.advance(timedelta(minutes=1))
    assert payloads(_lease(v3)) == [b"v2-later"]
    assert payloads(v3.list_items("dlq", 0)) == [b"v2-ready"]
    assert v3.redrive("dlq").moved == 1
    assert _drain(v3) == [b"v2-ready"]


@pytest.mark.parametrize("delivery", ["fifo", "fair"])
def test_during_an_upgrade_priority_comes_before_the_engine(
    services: tuple[QueueService, QueueService], delivery: str
) -> None:
    """What engine v2 stored is older, but not more urgent: a lease serves priority by priority
    across both engines, and within one priority v2's items first."""
    v2, v3 = services
    make_queue(v2, delivery=delivery)
    v2.produce("jobs", items("v2-p5", "v2-p5-second"))
    v2.produce("jobs", items("v2-p7", priority=7))
    v3.produce("jobs", items("v3-p0", priority=0))
    v3.produce("jobs", items("v3-p5"))

    assert payloads(_lease(v3, batch=2)) == [b"v3-p0", b"v2-p5"]
    assert payloads(_lease(v3, batch=10)) == [b"v2-p5-second", b"v3-p5", b"v2-p7"]


def test_a_lease_that_fails_after_a_claim_holds_nothing(
    service: QueueService, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_queue(service)
    service.produce("jobs", items("urgent", priority=1))
    service.produce("jobs", items("normal"))
    assert service.log is not None
    claim = service.log.claim
    calls: list[str] = []

    def failing_claim(key: LogKey, **kwargs: object) -> object:
        calls.append(key.lane)
        if len(calls) == 2:
            raise StoreUnavailableError("the store went away")
        return claim(key, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(service.log, "claim", failing_claim)
    with pytest.raises(StoreUnavailableError):
        service.lease("jobs", batch_size=10, client_id="c")
    monkeypatch.undo()

    again = _lease(service)
    assert payloads(again) == [b"urgent", b"normal"]
    assert [i.attempts for i in again] == [1, 1]  # the failed lease spent no attempt
    stats = service.stats("jobs")[0]
    assert (stats.total, stats.total_leased) == (2, 2)


def test_a_lease_whose_rows_cannot_be_read_gives_its_claim_back(
    service: QueueService, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_queue(service)
    service.produce("jobs", items("a", "b"))
    assert service.log is not None
    monkeypatch.setattr(service.log, "collect", _raise_unavailable)
    monkeypatch.setattr("querator.service.logs.Logs._sort_claimed", _raise_unavailable)

    with pytest.raises(StoreUnavailableError):
        service.lease("jobs", batch_size=10, client_id="c")
    monkeypatch.undo()

    again = _lease(service)
    assert payloads(again) == [b"a", b"b"] and [i.attempts for i in again] == [1, 1]


def _raise_unavailable(*args: object, **kwargs: object) -> None:
    raise StoreUnavailableError("the store went away")


def test_a_clear_of_leased_and_scheduled_items_reads_them_not_the_backlog(
    service: QueueService, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_queue(service)
    service.produce("jobs", items(*[str(n) for n in range(300)]))
    service.produce("jobs", items("later", enqueue_at=clock.now() + timedelta(hours=1)))
    _lease(service, batch=2)
    assert service.log is not None
    list_items = service.log.list_items
    read: list[int] = []

    def counted(*args: object, **kwargs: object) -> list:  # type: ignore[type-arg]
        page = list_items(*args, **kwargs)  # type: ignore[arg-type]
        read.append(len(page))
        return page

    monkeypatch.setattr(service.log, "list_items", counted)
    # Leased items go with the waiting ones (``destructive`` widens ``queue``), which one head write
    # skips: only the leased and the scheduled items are read.
    removed = service.clear("jobs", ClearScope.QUEUE | ClearScope.SCHEDULED | ClearScope.DESTRUCTIVE)

    assert removed == 301
    assert sum(read) <= 4  # the two leased and the one scheduled (a page each, as the head counts)
    stats = service.stats("jobs")[0]
    assert (stats.total, stats.total_leased, stats.scheduled) == (0, 0, 0)


def test_a_fair_queues_items_go_into_their_groups_logs(services: tuple[QueueService, QueueService]) -> None:
    """Fair queues live in logs too: a log per group's lane, leased round the groups, with every
    count, listing and upkeep seeing them; what engine v2 stored of the queue is served first."""
    v2, service = services
    make_queue(service, delivery="fair")
    v2.produce("jobs", items("old", group="A"))
    receipt = service.produce("jobs", [*items("a0", "a1", group="A"), *items("b0", group="B"), *items("-")])

    assert all(is_log_id(i) for i in receipt.ids)
    assert {lane_of(i) for i in receipt.ids} == {group_lane("A"), group_lane("B"), ""}
    listed = service.list_items("jobs", 0)
    assert sorted(payloads(listed)) == [b"-", b"a0", b"a1", b"b0", b"old"]
    assert [i.id for i in listed] == sorted(i.id for i in listed)  # key order, so a pivot pages on
    assert service.stats("jobs")[0].total == 5
    leased = _lease(service, batch=10)
    # v2's item first (it is older), then one turn over the logs' lanes, then A's second item.
    assert payloads(leased)[0] == b"old" and sorted(payloads(leased)[1:4]) == [b"-", b"a0", b"b0"]
    assert payloads(leased)[4] == b"a1"
    assert all(is_log_id(i.id) for i in leased[1:])
    assert {i.group for i in leased} == {"A", "B", ""}
    assert service.stats("jobs")[0].total_leased == 5


# In-process moto is not safe for threads; DynamoDB's condition is the claim log's, which
# test_claim_log.py holds to the cap on every store.
@pytest.mark.parametrize("store_name", ["memory", "sqlite"])
def test_sixteen_consumers_never_hold_more_than_the_cap_of_a_group(service: QueueService) -> None:
    """``max_leased_per_group`` is checked in the claim's own write: consumers racing for a group's
    lane cannot pass it between their reads and their claims."""
    make_queue(service, delivery="fair", max_leased_per_group=2)
    groups = ["A", "B", "C"]
    per_group = 16
    for group in groups:
        service.produce("jobs", items(*(f"{group}{n}" for n in range(per_group)), group=group))
    held: dict[str, set[str]] = {group: set() for group in groups}
    most = dict.fromkeys(groups, 0)
    delivered: list[bytes] = []
    lock = threading.Lock()
    start = threading.Barrier(16)
    errors: list[BaseException] = []

    def release(batch: list) -> None:  # type: ignore[type-arg]
        # Out of the tally before the complete: the tally never counts a lease the store ended.
        with lock:
            for item in batch:
                held[item.group].discard(item.id)
        service.complete("jobs", 0, [item.id for item in batch])

    def consume() -> None:
        # Each consumer holds its last two batches while it leases again, so leases overlap.
        holding: list[list] = []  # type: ignore[type-arg]
        start.wait()
        for _ in range(400):  # bounded: far more turns than items
            with lock:
                if len(delivered) >= len(groups) * per_group:
                    break
            try:
                leased = service.lease("jobs", batch_size=3, client_id=threading.current_thread().name).items
            except NothingToLeaseError:
                leased = []
            except BaseException as exc:  # reported by the test thread
                errors.append(exc)
                return
            with lock:
                for item in leased:
                    held[item.group].add(item.id)
                    most[item.group] = max(most[item.group], len(held[item.group]))
                delivered.extend(item.payload for item in leased)
            if leased:
                holding.append(leased)
            if holding and (len(holding) > 2 or not leased):
                release(holding.pop(0))
        for batch in holding:
            release(batch)

    threads = [threading.Thread(target=consume, name=f"c{n}") for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert not errors and not any(thread.is_alive() for thread in threads)
    assert sorted(delivered) == sorted(f"{g}{n}".encode() for g in groups for n in range(per_group))
    assert max(most.values()) <= 2, most


def test_the_cap_counts_a_groups_leases_in_every_band(service: QueueService) -> None:
    make_queue(service, delivery="fair", max_leased_per_group=2)
    service.produce("jobs", items("hi", group="A", priority=3))
    service.produce("jobs", items("lo0", "lo1", group="A"))

    leased = _lease(service, batch=10)

    assert payloads(leased) == [b"hi", b"lo0"]
    assert _lease(service, batch=10) == []


def test_a_competitors_claim_between_a_lanes_read_and_its_claim_cannot_pass_the_cap(
    service: QueueService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease reads a lane's head (room for two of A), then another consumer takes two, then the
    lease claims: the claim's own write sees the cap reached and takes none."""
    make_queue(service, delivery="fair", max_leased_per_group=2)
    service.produce("jobs", items("a0", "a1", "a2", "a3", group="A"))
    assert service.log is not None
    claim = service.log.claim
    raced: list[int] = []

    def outraced(key: LogKey, **kwargs: Any) -> Any:
        if not raced:  # a competitor's claim lands first, the cap in its own write too
            competitor = claim(key, count=2, deadline=kwargs["deadline"], now=kwargs["now"], max_leased=2)
            raced.append(len(competitor.items))
        return claim(key, **kwargs)

    monkeypatch.setattr(service.log, "claim", outraced)

    assert _lease(service, batch=10) == []
    assert raced == [2]
    assert service.log.head(LogKey("jobs", 0, group_lane("A"))).leased == 2


def test_a_group_lanes_log_is_dropped_from_the_registry_when_empty_and_idle(
    service: QueueService, clock: FakeClock
) -> None:
    """The lane registry of engine v2 serves the logs: a produce names a group's lane before it
    writes it, and the reaper drops a lane whose log is empty and idle, and keeps one that holds."""
    make_queue(service, delivery="fair", expire_timeout=BAND_IDLE * 3)
    service.produce("jobs", [*items("a", group="A"), *items("b", group="B")])
    lanes = {lane.lane for lane in service.store.lanes("jobs", 0, "", after="", limit=10)}
    assert lanes == {group_lane("A"), group_lane("B")}
    (held,) = _lease(service, batch=1)
    service.complete("jobs", 0, [held.id])
    clock.advance(BAND_IDLE + timedelta(seconds=1))

    report = service.reap(clock.now(), timedelta(seconds=30))

    assert report.bands_dropped == 1
    left = {lane.lane for lane in service.store.lanes("jobs", 0, "", after="", limit=10)}
    assert left == lanes - {lane_of(held.id)}
    service.produce("jobs", items("again", group=held.group))
    other = b"b" if held.payload == b"a" else b"a"
    assert sorted(payloads(_lease(service))) == sorted([b"again", other])


def test_a_fair_lease_that_fails_at_a_lanes_claim_frees_the_groups_it_took(
    service: QueueService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fair lease claims lane by lane; when a later lane's claim fails, what the earlier ones took
    goes back at once, its attempt not spent, and its group's slots are free again."""
    make_queue(service, delivery="fair", max_leased_per_group=2)
    for group in ("a", "b"):
        service.produce("jobs", items(*(f"{group}{n}" for n in range(3)), group=group))
    assert service.log is not None
    claim = service.log.claim
    calls: list[str] = []

    def failing_claim(key: LogKey, **kwargs: Any) -> Any:
        calls.append(key.lane)
        if len(calls) == 2:
            raise StoreUnavailableError("the store went away")
        return claim(key, **kwargs)

    monkeypatch.setattr(service.log, "claim", failing_claim)
    with pytest.raises(StoreUnavailableError):
        service.lease("jobs", batch_size=4, client_id="doomed")
    monkeypatch.undo()

    listed = service.list_items("jobs", 0)
    assert [i for i in listed if i.lease_deadline is not None] == []
    assert {i.attempts for i in listed} == {0}
    again = _lease(service, batch=6)
    # Two of each group (the cap, every slot free again); what went back is at its lane's tail.
    assert sorted(i.group for i in again) == ["a", "a", "b", "b"]
    assert {i.attempts for i in again} == {1}
