"""``benchmarks.longpoll_aws``: its simulated clock runs produces at their time within a lease's
sleep, its arrivals are the rate asked for, and a shorter ``POLL_MAX`` reads more and finds items
sooner, with only the lease's requests counted."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import pytest
from moto import mock_aws

from benchmarks import longpoll_aws
from benchmarks.longpoll_aws import SimClock, arrivals, measure, poll_shape
from querator.service import lease as lease_module
from querator.service.tuning import POLL_FIRST, POLL_MAX

if TYPE_CHECKING:
    from collections.abc import Iterator

START = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_a_sleep_runs_what_falls_due_within_it_at_its_time_and_ends_where_it_should() -> None:
    clock = SimClock(START)
    seen: list[float] = []
    for at in (0.3, 0.1, 2.0):
        clock.at(START + timedelta(seconds=at), lambda: seen.append((clock.now() - START).total_seconds()))
    clock.sleep(0.5)
    assert seen == [0.1, 0.3]
    assert clock.now() == START + timedelta(seconds=0.5)
    assert clock.pending() == 1
    clock.round_trip()
    assert clock.now() == START + timedelta(seconds=0.5 + longpoll_aws.ROUND_TRIP)


def test_arrivals_come_at_the_rate_asked_for_and_the_same_for_a_seed() -> None:
    times = arrivals(5.0, 2000, seed=3)
    assert times == arrivals(5.0, 2000, seed=3)
    assert all(b > a for a, b in itertools.pairwise(times))
    assert times[-1] / len(times) == pytest.approx(0.2, rel=0.1)
    with pytest.raises(ValueError, match="positive"):
        arrivals(0, 3, seed=1)


def test_the_poll_shape_is_the_leases_for_the_block_only() -> None:
    with poll_shape(0.5, 2.0):
        assert (lease_module.POLL_FIRST, lease_module.POLL_MAX) == (0.5, 2.0)  # type: ignore[attr-defined]
    assert (lease_module.POLL_FIRST, lease_module.POLL_MAX) == (POLL_FIRST, POLL_MAX)  # type: ignore[attr-defined]


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL_DYNAMODB", raising=False)
    with mock_aws():
        yield


@pytest.mark.slow  # about 9 s: some 400 polls on moto
def test_a_shorter_poll_max_reads_more_and_finds_items_sooner(aws: None) -> None:
    runs = {(r.poll_max, r.regime): r for r in measure((0.1, 1.0), items=8, idle=20.0)}
    fast, slow = runs[(0.1, "1 item/s")], runs[(1.0, "1 item/s")]
    assert fast.items == slow.items == 8
    assert max(fast.latencies) < 0.1 + 0.1  # a poll at most 100 ms after the item, plus round trips
    assert fast.latency(0.5) < slow.latency(0.5)
    idle_fast, idle_slow = runs[(0.1, "idle queue")], runs[(1.0, "idle queue")]
    assert idle_fast.waiting == pytest.approx(20.0, abs=0.1)
    # Each poll reads the partition twice (a read unit each) and the catalog once a second: 10 polls
    # a second (each 10 ms longer for its two round trips) against about 1.
    assert idle_fast.per_second(idle_fast.read_units) > 4 * idle_slow.per_second(idle_slow.read_units)
    # Produce and complete are not the lease's: an idle wait counts only reads, never a write.
    assert idle_fast.requests == idle_fast.read_units
