"""``benchmarks.engine_v3``: what its depth figures claim of engine v3, at sizes a test affords.

The figures themselves are ``python -m benchmarks.engine_v3`` (docs/benchmarks.md, section 19).
Each case runs in a moto mock of its own, with the benchmark's lighter moto (whole-table copies and
scans left out; the requests and their units are the same).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, TypeVar

import pytest
from moto import mock_aws

from benchmarks.cost import use_fake_credentials
from benchmarks.engine_v3 import (
    Report,
    behind_leases,
    format_report,
    idle_pass,
    lighter_moto,
    over_stored,
    per_partition,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

T = TypeVar("T")

pytestmark = pytest.mark.slow  # about 40 s here: 24,000 items produced, 420 claims

#: Few enough leases that all of their records stay in the log's head (it keeps up to 32), and
#: enough that most are spilled to rows of their own.
SHALLOW, DEEP = 20, 1_000


@pytest.fixture(autouse=True)
def _moto() -> Iterator[None]:
    use_fake_credentials()
    with lighter_moto():
        yield


def fresh(case: Callable[[], T]) -> T:
    with mock_aws():
        return case()


def test_a_lease_and_its_complete_behind_a_hundred_spilled_leases_cost_what_they_do_behind_two() -> None:
    shallow = fresh(lambda: behind_leases(3, SHALLOW, via="claim"))
    deep = fresh(lambda: behind_leases(3, DEEP, via="claim"))
    for run in (shallow, deep):
        assert (run.found, run.completed) == (10, 10)
    assert deep.stats_leased == DEEP
    # The head holds at most 32 records (about 1.5 KB): a lease reads it and its run's rows,
    # nothing of the records spilled behind it.
    assert deep.lease.read_units <= shallow.lease.read_units + 1
    assert deep.lease.write_units <= shallow.lease.write_units + 1
    assert deep.lease.requests == shallow.lease.requests
    assert deep.complete.read_units <= shallow.complete.read_units + 1
    assert deep.complete.write_units <= shallow.complete.write_units + 1
    assert deep.complete.requests == shallow.complete.requests
    assert deep.stats == shallow.stats


def test_the_reaper_behind_held_leases_reads_no_more_than_behind_a_few() -> None:
    # It reads the window from the cursor with ``get``, which looks up no lease records.
    shallow = fresh(lambda: behind_leases(3, SHALLOW, via="claim"))
    deep = fresh(lambda: behind_leases(3, DEEP, via="claim"))
    assert deep.reap.read_units <= shallow.reap.read_units + 1


def test_the_reaper_stats_and_a_lease_cost_the_same_over_ten_times_the_stored_items() -> None:
    small = fresh(lambda: over_stored(3, 2_000, 0.0))
    large = fresh(lambda: over_stored(3, 20_000, 0.0))
    assert (small.found, large.found) == (10, 10)
    assert small.reaped == large.reaped == 0
    assert (small.stats_total, large.stats_total) == (2_000, 20_000)
    assert small.reap == large.reap
    assert small.reap.write_units == 0
    assert small.stats == large.stats
    assert large.lease.read_units <= small.lease.read_units + 1
    assert large.lease.requests == small.lease.requests


def test_one_reaper_run_dead_letters_every_expired_item_and_a_lease_then_finds_ten() -> None:
    # Claimed from the cursor a window at a time and settled as records: no tombstones left.
    run = fresh(lambda: over_stored(3, 20_000, 0.01))
    assert run.reaped == run.due == 200
    assert run.found == 10


def test_an_idle_reaper_pass_costs_the_same_in_every_partition_and_writes_nothing() -> None:
    report = Report(behind=[], stored=[], idle=[fresh(partial(idle_pass, 3, p)) for p in (1, 3)])
    one, three = report.idle
    slope = per_partition(report, 3)
    assert slope is not None
    assert three.reap.read_units == pytest.approx(3 * one.reap.read_units)
    assert three.reap.write_units == one.reap.write_units == 0
    assert slope.requests == one.reap.requests
    assert "per partition" in format_report(report)
