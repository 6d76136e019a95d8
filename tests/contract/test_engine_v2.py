"""Contract: every operation costs what its own work costs, not what the queue holds (engine v2).

Costs are asserted on what the store was asked to do (requests, and the read and write units DynamoDB
would charge, from ``benchmarks.meter``), never on time. Each test would fail on the engine before
v2 (docs/adr/0050-engine-v2.md says by how much).
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest

from querator.api import schemas
from querator.domain.errors import NothingToLeaseError, QueueDeletingError, RetryLaterError
from querator.domain.ids import IdFactory
from querator.domain.model import ClearScope, NewItem, RetryRequest
from querator.service import CURSOR_LAG, MAX_REPLY_BYTES, SWEEP_DELAY
from querator.service.logs import REAPER_PAGE
from querator.storage.embedded.store import SortedRowsStore
from tests.contract.helpers import LEASE, beside, items, make_queue, payloads

if TYPE_CHECKING:
    from querator.testing import FakeClock
    from tests.contract.conftest import Metered

#: Engine v2's costs and internals: every test runs on v2 whatever QUERATOR_TEST_ENGINE says, but
#: those marked ``engine(3)``, v3's form of a promise both keep. Engine v3's own costs are asserted
#: in tests/unit/test_dynamodb_log.py, tests/contract/test_engine_v3_service.py and
#: tests/benchmarks/test_cost_v3.py.
pytestmark = pytest.mark.engine(2)

#: Past the cursor's lag, so a lease may move the cursor over what was produced before it.
SETTLE = CURSOR_LAG * 2


def lease_all(service, queue: str, *, batch: int = 1000) -> list:
    leased = []
    while True:
        try:
            leased += service.lease(queue, batch_size=batch, client_id="holder").items
        except NothingToLeaseError:
            return leased


def test_a_lease_finds_items_behind_many_large_valid_leases_and_reads_only_a_few_units(
    metered: Metered, clock: FakeClock
):
    service, meter = metered.service, metered.meter
    make_queue(service)
    big = b"x" * 100_000
    # 180 valid leases of 100 KB at the head of the partition: 18 MB, past the old 20-page cap.
    for _ in range(18):
        service.produce("jobs", [NewItem(payload=big) for _ in range(10)])
    clock.advance(SETTLE)
    held = []
    for _ in range(18):
        held += service.lease("jobs", batch_size=10, client_id="holder").items
    service.produce("jobs", [NewItem(payload=b"small %d" % i) for i in range(80)])
    clock.advance(SETTLE)

    meter.reset()
    got = service.lease("jobs", batch_size=10, client_id="late").items

    assert len(held) == 180
    assert payloads(got) == [b"small %d" % i for i in range(10)]
    cost = meter.snapshot()
    # The engine before v2 read all 18 MB (about 4,400 read units) and answered "nothing to lease".
    assert cost.read_units <= 10, cost
    # Two reads (head row, candidates), the lease record, ten claims and the counters.
    assert cost.requests_by_operation == {"Query": 2, "PutItem": 1, "UpdateItem": 11}


def test_lease_read_units_do_not_grow_with_the_number_of_valid_leases(metered: Metered, clock: FakeClock):
    service, meter = metered.service, metered.meter
    make_queue(service)
    costs = []
    for _ in range(3):
        service.produce("jobs", [NewItem(payload=b"p" * 100) for _ in range(300)])
        clock.advance(SETTLE)
        lease_all(service, "jobs")  # 300 more valid leases each round
        service.produce("jobs", items(*"abcdefghij"))
        clock.advance(SETTLE)
        meter.reset()
        assert len(service.lease("jobs", batch_size=10, client_id="c").items) == 10
        costs.append(meter.snapshot().read_units)
    # 300, 600, then 900 valid leases ahead (before v2: 2, 3, then 5 units, and growing): the same
    # two units each time, one for the head row and one for the candidates.
    assert costs == [2.0, 2.0, 2.0], costs


def test_a_consumer_polling_an_empty_queue_writes_nothing(metered: Metered, clock: FakeClock):
    service, meter = metered.service, metered.meter
    make_queue(service, partitions=4)
    meter.reset()
    for _ in range(10):
        clock.advance(SETTLE)
        with pytest.raises(NothingToLeaseError):
            service.lease("jobs", batch_size=10, client_id="idle")
    cost = meter.snapshot()
    # Reads only: the head row and an empty range per partition. (Moving the cursor over the empty
    # range used to cost a write per partition per poll.)
    assert cost.write_units == 0 and set(cost.requests_by_operation) == {"Query"}, cost


def test_a_lease_reply_stays_under_the_cap_and_leaves_what_it_cannot_carry_unclaimed(
    service, clock: FakeClock
):
    make_queue(service)
    service.produce("jobs", [NewItem(payload=bytes([i]) * 300_000) for i in range(20)])  # 6 MB in all
    clock.advance(SETTLE)

    first = service.lease("jobs", batch_size=20, client_id="c")
    wire = json.dumps(schemas.LeaseResponse.from_domain(first).to_wire())

    assert 0 < len(first.items) < 20
    assert len(wire.encode()) <= MAX_REPLY_BYTES
    rest = lease_all(service, "jobs", batch=20)
    # Nothing was claimed that the first reply did not carry: the rest are leased once, attempt 1.
    assert len(first.items) + len(rest) == 20
    assert {i.attempts for i in rest} == {1}
    assert sorted(i.payload[0] for i in first.items + rest) == list(range(20))


def test_a_listing_page_stays_under_the_reply_cap(service):
    make_queue(service)
    service.produce("jobs", [NewItem(payload=bytes([i]) * 300_000) for i in range(20)])
    page = service.list_items("jobs", 0, limit=20)
    assert 0 < len(page) < 20
    assert sum(len(i.payload) for i in page) <= MAX_REPLY_BYTES
    rest = service.list_items("jobs", 0, pivot=page[-1].id, limit=20)
    assert rest[0].id == page[-1].id and len(page) + len(rest) - 1 == 20


def test_an_expired_lease_is_leasable_again_without_the_reaper_and_read_by_its_record(
    metered: Metered, clock: FakeClock
):
    service, meter = metered.service, metered.meter
    make_queue(service, max_attempts=3)
    service.produce("jobs", [NewItem(payload=b"p%d" % i) for i in range(500)])
    clock.advance(SETTLE)
    lost = service.lease("jobs", batch_size=1, client_id="c").items[0]
    clock.advance(timedelta(seconds=1))
    lease_all(service, "jobs")  # 499 more valid leases, with deadlines a second later
    clock.advance(LEASE - timedelta(milliseconds=500))  # only the first lease has run out

    meter.reset()
    again = service.lease("jobs", batch_size=10, client_id="c").items

    assert [(i.payload, i.attempts) for i in again] == [(lost.payload, 2)]
    assert again[0].id != lost.id  # fencing: a new id for the new lease
    # The head row, one record (the first lease's pool of 8 ids, read eventually consistent), one
    # item read back and the candidates: not the 499 valid leases behind it.
    assert meter.snapshot().read_units <= 8


def test_the_reaper_reads_partitions_and_due_items_not_what_is_stored(metered: Metered, clock: FakeClock):
    service, meter = metered.service, metered.meter
    make_queue(service, partitions=2, expire_timeout=timedelta(hours=1))
    for _ in range(4):
        service.produce("jobs", [NewItem(payload=b"p" * 100) for _ in range(100)])
    clock.advance(SETTLE)
    holders = [service.lease("jobs", batch_size=1000, client_id="holder") for _ in range(2)]
    for _ in range(2):
        service.produce("jobs", [NewItem(payload=b"w" * 100) for _ in range(100)])  # 200 waiting
    # 400 leases that outlast everything below: they must not be read again. A renew lasts at most
    # expire_timeout, so they are renewed 20 s after the waiting items were produced: the leases end
    # 20 s after those items expire.
    clock.advance(timedelta(seconds=20))
    for held in holders:
        service.renew("jobs", held.partition, [i.id for i in held.items], lease_timeout=timedelta(hours=1))
    clock.advance(timedelta(minutes=10))
    service.reap(clock.now(), timedelta(seconds=30))  # the first run sweeps behind the cursors once

    meter.reset()
    idle = service.reap(clock.now(), timedelta(seconds=30))
    idle_cost = meter.snapshot()
    # 600 stored items, nothing due: a few requests per partition, a few units in all.
    assert idle.finished and (idle.dead_lettered, idle.deleted, idle.recovered) == (0, 0, 0)
    assert idle_cost.requests <= 3 * 2 + 3, idle_cost.requests_by_operation
    assert idle_cost.read_units <= 6, idle_cost

    service.produce("jobs", [NewItem(payload=b"late") for _ in range(20)])
    # The 200 waiting items (and nothing else) are past expiry; the 400 leases have 10 s left.
    clock.advance(timedelta(minutes=49, seconds=50))
    meter.reset()
    due = service.reap(clock.now(), timedelta(seconds=30))
    due_cost = meter.snapshot()
    assert (due.deleted, due.recovered) == (200, 0)
    # O(due): a few units for 200 small expired items, none for the 400 valid leases.
    assert due_cost.read_units <= 20, due_cost


def test_stats_cost_one_read_per_hundred_partitions_and_count_exactly(metered: Metered, clock: FakeClock):
    service, meter = metered.service, metered.meter
    make_queue(service, "dead")
    make_queue(service, partitions=3, dead_queue="dead", max_attempts=1)
    for _ in range(6):
        service.produce("jobs", [NewItem(payload=b"p") for _ in range(100)])
    later = clock.now() + timedelta(hours=2)
    service.produce("jobs", [NewItem(payload=b"s", enqueue_at=later) for _ in range(7)])
    clock.advance(SETTLE)
    leased = service.lease("jobs", batch_size=50, client_id="c")
    service.complete("jobs", leased.partition, [i.id for i in leased.items[:20]])
    service.retry("jobs", leased.partition, [RetryRequest(id=i.id) for i in leased.items[20:25]])

    meter.reset()
    stats = service.stats("jobs")
    cost = meter.snapshot()

    assert cost.requests == 1 and cost.read_units <= 3, cost
    # 600 produced, 20 completed, 5 retried with max_attempts 1: dead-lettered; 25 still leased.
    assert sum(s.total for s in stats) == 600 - 20 - 5
    assert sum(s.total_leased for s in stats) == 25
    assert sum(s.scheduled for s in stats) == 7
    assert sum(s.total for s in service.stats("dead")) == 5
    by_partition = {s.partition: s for s in stats}
    assert by_partition[leased.partition].average_leased_age >= SETTLE


def test_scheduled_items_count_as_scheduled_until_the_reaper_passes_them(service, clock: FakeClock):
    make_queue(service)
    service.produce("jobs", items("a", "b", enqueue_at=clock.now() + timedelta(minutes=5)))
    assert [(s.total, s.scheduled) for s in service.stats("jobs")] == [(0, 2)]
    clock.advance(timedelta(minutes=6))
    service.reap(clock.now(), timedelta(seconds=30))
    assert [(s.total, s.scheduled) for s in service.stats("jobs")] == [(2, 0)]
    assert payloads(service.lease("jobs", batch_size=5, client_id="c").items) == [b"a", b"b"]


def test_a_straggler_written_below_the_cursor_is_found_by_the_sweep(service, clock: FakeClock):
    make_queue(service)
    store = service.store  # a write that lands late is staged at the store, as it would arrive
    ids = IdFactory()
    service.produce("jobs", items("first", "second"))
    clock.advance(SETTLE)
    minted_early = ids.new_id(clock.now() - SETTLE)  # minted before the lease below, landing after it
    done = service.lease("jobs", batch_size=5, client_id="c").items
    service.complete("jobs", 0, [i.id for i in done])
    service.produce("jobs", items("third"))
    clock.advance(SETTLE)
    third = service.lease("jobs", batch_size=5, client_id="c").items
    assert payloads(third) == [b"third"]
    service.complete("jobs", 0, [i.id for i in third])
    late = items("late")[0]
    from querator.domain.model import Item  # noqa: PLC0415 - only this test builds a raw item

    store.put_new(
        "jobs",
        0,
        [
            Item(
                id=minted_early,
                payload=late.payload,
                expire_deadline=clock.now() + timedelta(hours=1),
                created_at=clock.now(),
            )
        ],
        now=clock.now(),
    )
    if isinstance(store, SortedRowsStore):
        # The embedded stores pull the cursor back in the write's own transaction: leased at once
        # (tests/contract/test_late_writes.py); only DynamoDB needs the sweep.
        assert payloads(service.lease("jobs", batch_size=5, client_id="c").items) == [b"late"]
        return
    with pytest.raises(NothingToLeaseError):  # behind the cursor, out of every lease's sight
        service.lease("jobs", batch_size=5, client_id="c")

    clock.advance(SWEEP_DELAY + SETTLE)
    report = service.reap(clock.now(), timedelta(seconds=30))

    assert report.stragglers == 1
    assert payloads(service.lease("jobs", batch_size=5, client_id="c").items) == [b"late"]


def test_delete_of_a_large_queue_runs_in_pages_and_the_reaper_resumes_it(metered: Metered, clock: FakeClock):
    service, meter = metered.service, metered.meter
    make_queue(service, "big", partitions=2)
    for _ in range(6):
        service.produce("big", [NewItem(payload=b"p" * 200) for _ in range(500)])
    make_queue(service, "other", expire_timeout=timedelta(minutes=1))
    service.produce("other", items("expired"))
    # The request's share runs out after its first page.
    with pytest.raises(QueueDeletingError):
        beside(service, clock, purge_budget=timedelta(0)).delete_queue("big")
    assert "big" in [q.name for q in service.catalog.iterate()]  # left to the reaper
    clock.advance(timedelta(minutes=2))

    pages: list[int] = []
    metered.client.meta.events.register(
        "after-call.dynamodb.Query", lambda parsed, **_: pages.append(len(parsed.get("Items", [])))
    )
    runs = [service.reap(clock.now(), timedelta(0)) for _ in range(20)]

    finished_at = next(n for n, run in enumerate(runs) if run.queues_deleted)
    assert finished_at > 0  # it took several runs, each a page
    assert "big" not in [q.name for q in service.catalog.iterate()]
    # The reaper did its other work meanwhile: the expired item of "other" went on the first run.
    assert runs[0].deleted == 1
    # Bounded memory: never more than a page of 1,000 keys in hand, whatever the queue holds.
    assert max(pages) <= 1000 and meter.snapshot().requests_by_operation.get("Query", 0) >= finished_at


class RequestClock:
    """A fake clock that every store request moves on by ``latency``, as a real round trip would."""

    def __init__(self, clock: FakeClock, latency: timedelta) -> None:
        self.clock, self.latency = clock, latency

    def __call__(self, **_: object) -> None:
        self.clock.advance(self.latency)


@pytest.mark.slow
# Through a moto server only: the product's store writes concurrently there, as on DynamoDB; moto
# in-process takes one request at a time (4 min of CI for what the server case shows in 2).
@pytest.mark.parametrize("metered", ["moto_server"], indirect=True)
def test_a_thousand_item_lease_retry_and_complete_fit_the_functions_timeouts(
    metered: Metered, clock: FakeClock
):
    _thousand_item_lease_retry_and_complete(metered, clock)


def _thousand_item_lease_retry_and_complete(metered: Metered, clock: FakeClock) -> None:
    service, client = metered.service, metered.client
    make_queue(service, lease_timeout=timedelta(minutes=5))
    for _ in range(2):
        service.produce("jobs", [NewItem(payload=b"p") for _ in range(1000)])
    clock.advance(SETTLE)
    # 10 ms a request, counted in full even when requests overlap: a pessimistic model of AWS.
    client.meta.events.register("before-call.dynamodb", RequestClock(clock, timedelta(milliseconds=10)))

    started = clock.now()
    leased = service.lease("jobs", batch_size=1000, client_id="c")
    lease_took = clock.now() - started
    started = clock.now()
    outcome = service.retry("jobs", leased.partition, [RetryRequest(id=i.id) for i in leased.items])
    retry_took = clock.now() - started
    again = service.lease("jobs", batch_size=1000, client_id="c")
    started = clock.now()
    completed = service.complete("jobs", again.partition, [i.id for i in again.items])
    complete_took = clock.now() - started

    # The lease stops claiming at its budget (5 s) and answers: API Gateway gives 29 s in all.
    assert 0 < len(leased.items) <= 1000 and lease_took <= timedelta(seconds=6)
    assert not outcome.failed and len(outcome.applied) == len(leased.items)
    assert not completed.failed
    # Within 15 s (the items function has 29 s); before v2 a retry of 1,000 took 2,000 requests in a row.
    assert retry_took < timedelta(seconds=15) and complete_took < timedelta(seconds=15)


@pytest.mark.engine(3)
def test_v3_a_thousand_item_lease_retry_and_complete_fit_the_functions_timeouts(
    metered: Metered, clock: FakeClock
):
    """The same on engine v3's logs: a lease of 1,000 is a few claims, a retry of them a
    transaction per 100 moved items, a complete one write per record."""
    _thousand_item_lease_retry_and_complete(metered, clock)


@pytest.mark.engine(2)  # engine v2's internals (v3's logs keep no counters to recount)
def test_the_reaper_recount_heals_counters_that_drifted(service, clock: FakeClock):
    make_queue(service, lease_timeout=timedelta(hours=30), expire_timeout=timedelta(hours=48))
    service.produce("jobs", [NewItem(payload=b"p") for _ in range(30)])
    clock.advance(SETTLE)
    held = service.lease("jobs", batch_size=4, client_id="c").items
    # Drift: a counter write that landed without its items' write (as a process dying between the
    # two would leave it the other way round).
    service.store.note_leased("jobs", 0, held, cursor=None)
    assert [(s.total, s.total_leased) for s in service.stats("jobs")] == [(30, 8)]

    clock.advance(timedelta(hours=1))
    assert service.reap(clock.now(), timedelta(seconds=30)).recounted == 0  # not due yet
    clock.advance(timedelta(hours=24))
    report = service.reap(clock.now(), timedelta(seconds=30))

    assert report.recounted == 1
    assert [(s.total, s.total_leased) for s in service.stats("jobs")] == [(30, 4)]


@pytest.mark.engine(2)  # engine v2's internals (v3's logs keep no counters to recount)
def test_a_recount_that_a_write_overtook_starts_over_instead_of_losing_the_write(service, clock: FakeClock):
    make_queue(service, expire_timeout=timedelta(hours=48))
    for _ in range(3):  # two pages to count
        service.produce("jobs", [NewItem(payload=b"p") for _ in range(500)])
    service.store.note_leased("jobs", 0, [], cursor=None)
    clock.advance(timedelta(hours=25))
    # The budget runs out after the first page.
    first = beside(service, TickingReaperClock(clock)).reap(clock.now(), timedelta(seconds=1))
    service.produce("jobs", items("during the recount"))
    second = service.reap(clock.now(), timedelta(seconds=30))  # finishes, sees the version moved
    third = service.reap(clock.now(), timedelta(seconds=30))  # a new recount, undisturbed

    assert (first.recounted, second.recounted, third.recounted) == (0, 0, 1)
    assert [s.total for s in service.stats("jobs")] == [1501]


class TickingReaperClock:
    """Each reading of the time moves it on a second: the reaper's budget runs out at once."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock

    def now(self):
        return self._clock.advance(timedelta(seconds=1))

    def sleep(self, seconds: float) -> None:
        self._clock.sleep(seconds)


@pytest.mark.engine(2)  # v2's pages of 1,000 rows; the v3 form follows
def test_a_clear_with_more_work_than_its_budget_asks_to_be_called_again_and_then_finishes(
    service, clock: FakeClock
):
    make_queue(service)
    for _ in range(3):
        service.produce("jobs", [NewItem(payload=b"p") for _ in range(500)])  # two pages of 1,000
    clock.advance(SETTLE)
    hurried = beside(service, clock, clear_budget=timedelta(0))  # out of time after its first page

    with pytest.raises(RetryLaterError, match="removed 1000 item"):
        hurried.clear("jobs", ClearScope.QUEUE)
    assert [s.total for s in service.stats("jobs")] == [500]
    assert service.clear("jobs", ClearScope.QUEUE) == 500
    assert [s.total for s in service.stats("jobs")] == [0]


@pytest.mark.engine(3)
def test_a_clear_with_more_work_than_its_budget_asks_to_be_called_again_and_then_finishes_on_v3(
    service, clock: FakeClock
):
    """Engine v3 drops a log's waiting items with one head write, however many: what it clears in
    pages is the schedule (and, destructive, the leased), a page of ``REAPER_PAGE`` at a time."""
    make_queue(service)
    later = clock.now() + timedelta(hours=1)
    service.produce("jobs", [NewItem(payload=b"p", enqueue_at=later) for _ in range(250)])
    hurried = beside(service, clock, clear_budget=timedelta(0))  # out of time after its first page

    with pytest.raises(RetryLaterError, match=f"removed {REAPER_PAGE} item"):
        hurried.clear("jobs", ClearScope.SCHEDULED)
    assert [s.scheduled for s in service.stats("jobs")] == [250 - REAPER_PAGE]
    assert service.clear("jobs", ClearScope.SCHEDULED) == 250 - REAPER_PAGE
    assert [s.scheduled for s in service.stats("jobs")] == [0]
