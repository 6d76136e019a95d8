"""Contract: lease rate limits (``rate_limit``, ``rate_limit_per_group``) on every store.

Time is the fake clock's: a bucket refills by the lease's ``now``, so a "second" here is the clock
moved by one second, and a waiting lease's sleep moves it too.
"""

from __future__ import annotations

import math
from collections import Counter
from datetime import timedelta

import pytest

from querator.domain.errors import (
    InvalidRequestError,
    LeaseRateLimitedError,
    NothingToLeaseError,
    StoreUnavailableError,
)
from querator.domain.model import NewItem, QueueUpdate
from querator.ports.log import ClaimReadError
from querator.service import QueueService
from querator.storage.dynamodb.store import DynamoDBItemStore
from tests.contract.helpers import beside, make_queue


def produce(service, count, queue="jobs", group="", priority=5):
    items = [NewItem(payload=f"{group}-{n}".encode(), group=group, priority=priority) for n in range(count)]
    for start in range(0, count, 1000):
        service.produce(queue, items[start : start + 1000])


def lease(service, batch, queue="jobs", client="c"):
    try:
        return service.lease(queue, batch_size=batch, client_id=client, timeout=timedelta(0)).items
    except NothingToLeaseError:
        return []


def test_the_queue_limit_caps_leases_over_a_second(service, clock):
    make_queue(service, rate_limit=20)
    produce(service, 60)

    first = service.lease("jobs", batch_size=10, client_id="c", timeout=timedelta(0))
    second = service.lease("jobs", batch_size=15, client_id="c", timeout=timedelta(0))
    with pytest.raises(LeaseRateLimitedError) as refused:
        service.lease("jobs", batch_size=10, client_id="c", timeout=timedelta(0))

    # A full bucket holds one second's worth: 20, and a lease takes what is left (10 of 15).
    assert (len(first.items), len(second.items)) == (10, 10)
    assert first.next_lease_at is None
    # The bucket is empty: the next lease is one token interval (50 ms) away, and says so.
    assert second.next_lease_at == clock.now() + timedelta(milliseconds=50)
    assert refused.value.context["next_lease_at"] == second.next_lease_at

    # Over the next second, leasing every 40 ms, exactly 20 more come: one per 50 ms (the leases
    # in between get nothing).
    got = []
    for _ in range(25):
        clock.advance(timedelta(milliseconds=40))
        got.append(len(lease(service, 10)))
    assert sum(got) == 20, got
    assert max(got) == 1, got


def test_a_raised_limit_applies_once_the_old_rates_next_token_is_due(service, clock):
    make_queue(service, rate_limit=0.1)  # a token every 10 s
    produce(service, 3)
    assert len(lease(service, 1)) == 1
    service.update_queue(QueueUpdate(name="jobs", rate_limit=1000))

    # The bucket keeps the wait the old rate set (a bucket filled by a lease whose clock read came
    # before a competitor's looks the same, and must not be read as fresh: docs/api.md).
    clock.advance(timedelta(seconds=8))
    assert lease(service, 2) == []
    clock.advance(timedelta(seconds=1, milliseconds=5))  # 10 s after the take, then 1 ms a token
    assert len(lease(service, 2)) == 2


def test_the_limit_holds_across_partitions_and_processes(service, clock):
    make_queue(service, rate_limit=10, partitions=4)
    for _ in range(8):
        produce(service, 10)
    other = beside(service, clock)

    got = [len(lease(s, 3, client=f"c{n}")) for n in range(6) for s in (service, other)]

    # Twelve leases of 3 from two processes (each trying partitions in turn): 10 in all.
    assert sum(got) == 10, got


class Stealing:
    """The store, but before the service's next claim a competitor claims the first id asked for:
    the service loses that race after taking a token for it."""

    def __init__(self, store):
        self._store = store
        self.armed = True

    def __getattr__(self, name):
        return getattr(self._store, name)

    def claim(self, queue, partition, ids, *, lease_deadline, now):
        if self.armed:
            self.armed = False
            self._store.claim(queue, partition, ids[:1], lease_deadline=lease_deadline, now=now)
        return self._store.claim(queue, partition, ids, lease_deadline=lease_deadline, now=now)


class StealingFromTheLog:
    """Engine v3's claim log, but just before the service's next claim a competitor claims the
    first waiting position: the service's claim (which never loses a race) takes one fewer than it
    took tokens for, the waiting count it read being one too many."""

    def __init__(self, log):
        self._log = log
        self.armed = True

    def __getattr__(self, name):
        return getattr(self._log, name)

    def claim(self, key, *, count, deadline, now, **kwargs):
        if self.armed:
            self.armed = False
            self._log.claim(key, count=1, deadline=deadline, now=now)
        return self._log.claim(key, count=count, deadline=deadline, now=now, **kwargs)


def test_tokens_taken_for_claims_lost_to_a_competitor_go_back(service, clock):
    make_queue(service, rate_limit=10)
    produce(service, 5)
    if service.log is not None:
        stealing = beside(service, clock, log=StealingFromTheLog(service.log))
    else:
        stealing = beside(service, clock, store=Stealing(service.store))

    few = lease(stealing, 5)
    produce(service, 20)
    more = lease(service, 20)

    # 5 tokens taken for the 5 candidates, one claim lost: 4 leased, and the 5th token came back.
    assert len(few) == 4
    assert len(more) == 6


class FailingCounts:
    """The store, but counting a lease's items fails once (after its claims applied)."""

    def __init__(self, store):
        self._store = store
        self.failed = False

    def __getattr__(self, name):
        return getattr(self._store, name)

    def note_leased(self, queue, partition, items, **kwargs):
        if items and not self.failed:
            self.failed = True
            raise StoreUnavailableError("injected: the count failed")
        return self._store.note_leased(queue, partition, items, **kwargs)


class FailingLogReads:
    """Engine v3's claim log, but the next claim fails after it took its run (reading its rows,
    say): ``ClaimReadError``, as a store whose claim is not one transaction raises it."""

    def __init__(self, log):
        self._log = log
        self.failed = False

    def __getattr__(self, name):
        return getattr(self._log, name)

    def claim(self, key, **kwargs):
        claim = self._log.claim(key, **kwargs)
        if claim.token and not self.failed:
            self.failed = True
            ids = [item.id for item in claim.items] + claim.holes
            raise ClaimReadError(claim.token, ids, StoreUnavailableError("injected: the read failed"))
        return claim


def test_a_lease_that_fails_midway_gives_its_tokens_back(service, clock):
    make_queue(service, rate_limit=10)
    produce(service, 20)
    if service.log is not None:
        failing = beside(service, clock, log=FailingLogReads(service.log))
    else:
        failing = beside(service, clock, store=FailingCounts(service.store))

    with pytest.raises(StoreUnavailableError):
        failing.lease("jobs", batch_size=8, client_id="c", timeout=timedelta(0))

    # The 8 claimed items went back, and so did their 8 tokens: the bucket still holds 10.
    again = lease(service, 20)
    assert len(again) == 10
    assert all(item.attempts == 1 for item in again)


def test_one_lease_over_several_priorities_takes_no_more_than_the_limit(service, clock):
    make_queue(service, rate_limit=4)
    produce(service, 3, priority=1)
    produce(service, 3, priority=5)

    got = lease(service, 10)

    # Each band's claim spends the tokens taken before it: the second band has one left, not four.
    assert [item.priority for item in got] == [1, 1, 1, 5]


def test_tokens_are_not_spent_by_an_empty_lease(service, clock):
    make_queue(service, rate_limit=5)

    for _ in range(20):
        assert lease(service, 10) == []
    produce(service, 10)

    # Twenty polls of an empty queue took nothing: the bucket still holds its 5.
    assert len(lease(service, 10)) == 5


def test_a_waiting_lease_waits_for_the_next_token_rather_than_polling(service, clock):
    make_queue(service, rate_limit=4)
    produce(service, 10)
    assert len(lease(service, 10)) == 4
    start = clock.now()

    got = service.lease("jobs", batch_size=10, client_id="c", timeout=timedelta(seconds=5)).items

    # The wait ends when the next token is due (250 ms at 4 a second), with that one item.
    assert len(got) == 1
    assert clock.now() - start == timedelta(milliseconds=250)


def test_a_lease_that_waits_past_its_timeout_says_when_to_come_back(service, clock):
    make_queue(service, rate_limit=0.5)
    produce(service, 5)
    assert len(lease(service, 5)) == 1
    start = clock.now()

    with pytest.raises(LeaseRateLimitedError) as refused:
        service.lease("jobs", batch_size=1, client_id="c", timeout=timedelta(seconds=1))

    # One lease every two seconds: the wait of one second ends first, and says when.
    assert refused.value.context["next_lease_at"] == start + timedelta(seconds=2)


def test_the_per_group_limit_caps_each_group(service, clock):
    make_queue(service, delivery="fair", rate_limit_per_group=2)
    for group in "ABC":
        produce(service, 10, group=group)

    first = lease(service, 10)
    with pytest.raises(LeaseRateLimitedError):
        service.lease("jobs", batch_size=10, client_id="c", timeout=timedelta(0))
    clock.advance(timedelta(milliseconds=500))
    half = lease(service, 10)
    clock.advance(timedelta(seconds=1))
    later = lease(service, 10)

    assert Counter(i.group for i in first) == {"A": 2, "B": 2, "C": 2}
    # Refilled by time: one token each in half a second, two in a second (the burst).
    assert Counter(i.group for i in half) == {"A": 1, "B": 1, "C": 1}
    assert Counter(i.group for i in later) == {"A": 2, "B": 2, "C": 2}


def test_a_group_at_its_limit_does_not_starve_the_others(service, clock):
    make_queue(service, delivery="fair", rate_limit_per_group=1)
    produce(service, 50, group="flood")
    produce(service, 5, group="quiet")
    produce(service, 5)  # items without a group: not limited per group

    handed = Counter()
    for _ in range(5):
        handed.update(i.group for i in lease(service, 10))
        clock.advance(timedelta(seconds=1))

    # One of the flood a second; the quiet group one a second too, and the rest right away.
    assert handed == {"flood": 5, "quiet": 5, "": 5}


def test_a_held_back_group_does_not_hold_back_a_lower_priority(service, clock):
    make_queue(service, delivery="fair", rate_limit_per_group=1)
    produce(service, 10, group="urgent", priority=0)
    produce(service, 3, group="later", priority=9)

    got = lease(service, 10)

    # Priority 0's only group gave its one lease; the rest of the batch goes to priority 9.
    assert Counter(i.group for i in got) == {"urgent": 1, "later": 1}


def test_both_limits_together(service, clock):
    make_queue(service, delivery="fair", rate_limit=3, rate_limit_per_group=2)
    for group in "AB":
        produce(service, 10, group=group)

    got = lease(service, 10)

    assert len(got) == 3
    assert max(Counter(i.group for i in got).values()) == 2


def test_no_limit_by_default_and_settings_show_and_change(service):
    info = make_queue(service, delivery="fair")
    assert (info.rate_limit, info.rate_limit_per_group) == (0, 0)

    service.update_queue(QueueUpdate(name="jobs", rate_limit=20, rate_limit_per_group=0.5))
    stored = service.get_queue("jobs")
    assert (stored.rate_limit, stored.rate_limit_per_group) == (20.0, 0.5)

    service.update_queue(QueueUpdate(name="jobs", rate_limit=0))
    assert service.get_queue("jobs").rate_limit == 0
    assert service.get_queue("jobs").rate_limit_per_group == 0.5


def test_the_least_rate_a_refusal_shows_is_allowed_and_minus_zero_is_no_limit(service):
    with pytest.raises(InvalidRequestError) as refused:
        make_queue(service, rate_limit=0.00001157)  # under one a day
    shown = float(str(refused.value).split("1/86400, ")[1].split(")")[0])
    assert make_queue(service, rate_limit=shown).rate_limit == shown

    service.update_queue(QueueUpdate(name="jobs", rate_limit=-0.0))
    assert math.copysign(1, service.get_queue("jobs").rate_limit) == 1.0


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"rate_limit": -1}, "rate_limit"),
        ({"rate_limit": 100_001}, "rate_limit"),
        ({"rate_limit": 1e-9}, "rate_limit"),
        ({"rate_limit": float("nan")}, "rate_limit"),
        ({"rate_limit": True}, "rate_limit"),
        ({"rate_limit": "20"}, "rate_limit"),
        ({"rate_limit_per_group": -2, "delivery": "fair"}, "rate_limit_per_group"),
        # Per group only where leases go by group.
        ({"rate_limit_per_group": 5}, "rate_limit_per_group"),
    ],
)
def test_settings_are_validated(service, fields, field):
    with pytest.raises(InvalidRequestError) as refused:
        make_queue(service, **fields)
    assert refused.value.context["field"] == field


def test_an_update_to_a_bad_limit_is_refused_and_changes_nothing(service):
    make_queue(service, rate_limit=5)

    with pytest.raises(InvalidRequestError):
        service.update_queue(QueueUpdate(name="jobs", rate_limit=-5))
    with pytest.raises(InvalidRequestError):
        service.update_queue(QueueUpdate(name="jobs", rate_limit_per_group=5))

    assert service.get_queue("jobs").rate_limit == 5


def test_a_limit_costs_one_conditional_update_per_lease_on_dynamodb(metered, clock):
    service, meter = metered.service, metered.meter
    make_queue(service, name="free")
    make_queue(service, name="limited", rate_limit=100)
    for queue in ("free", "limited"):
        produce(service, 20, queue=queue)
    clock.advance(timedelta(seconds=2))

    costs = {}
    for queue in ("free", "limited"):
        meter.reset()
        assert len(lease(service, 10, queue=queue)) == 10
        costs[queue] = meter.snapshot()

    free, limited = costs["free"].requests_by_operation, costs["limited"].requests_by_operation
    # The bucket's one UpdateItem, nothing else; a queue without a limit pays nothing (engine v2's
    # lease writes each item and its record, v3's one claim: the difference is the same).
    assert limited == {**free, "UpdateItem": free.get("UpdateItem", 0) + 1}, (free, limited)
    assert costs["limited"].write_units - costs["free"].write_units == 1


def test_a_throttled_lease_writes_nothing_on_dynamodb(metered, clock):
    service, meter = metered.service, metered.meter
    make_queue(service, rate_limit=1)
    produce(service, 5)
    assert len(lease(service, 5)) == 1

    meter.reset()
    assert lease(service, 5) == []

    # This process saw the bucket empty: it reads the partition and claims nothing, writes nothing.
    cost = meter.snapshot()
    writes = {op: n for op, n in cost.requests_by_operation.items() if op not in ("Query", "GetItem")}
    assert (writes, cost.write_units) == ({}, 0), cost


@pytest.mark.slow  # 40 lease calls through moto: about 20 s on a shared machine
def test_two_processes_share_a_bucket_by_compare_and_set_on_dynamodb(metered, clock):
    service, meter = metered.service, metered.meter
    make_queue(service, rate_limit=10)
    produce(service, 100)
    # Another process: its own store (and its own view of the buckets) over the same table.
    table = service.store._table
    other = QueueService(catalog=service.catalog, store=DynamoDBItemStore(metered.client, table), clock=clock)

    got = []
    meter.reset()
    for step in range(20):
        for process in (service, other):
            got.append(len(lease(process, 3, client=f"c{step}")))
        clock.advance(timedelta(milliseconds=100))

    # Two seconds of leasing at 10 a second from two processes: the burst of 10, then one token a
    # tenth of a second, whichever process takes it: 10 + 19 (the last is due as the run ends).
    assert sum(got) == 29, got
    # A process whose view of the bucket was stale lost the race once per lease call (a failed
    # conditional write, whose reply taught it the bucket; it did not write again): never more.
    assert meter.snapshot().failed_conditional_writes <= len(got)
