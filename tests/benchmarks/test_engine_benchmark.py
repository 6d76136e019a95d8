"""``benchmarks.engine``: what its depth figures claim holds at a size a test can afford."""

from __future__ import annotations

import pytest
from moto import mock_aws

from benchmarks.cost import use_fake_credentials
from benchmarks.engine import reaper_run

pytestmark = pytest.mark.slow  # 22,000 items produced into moto: 17-33 s here


def test_the_reaper_stats_and_a_lease_cost_the_same_over_ten_times_the_stored_items() -> None:
    use_fake_credentials()
    with mock_aws():
        small, large = reaper_run(2_000, 0.0), reaper_run(20_000, 0.0)
    assert (small.lease_found, large.lease_found) == (10, 10)
    assert small.dead_lettered == large.dead_lettered == 0
    cost = [(r.reap_read_units, r.reap_requests, r.stats_read_units, r.lease_read_units, r.lease_requests)
            for r in (small, large)]  # fmt: skip
    assert cost[0] == cost[1]
    # Nothing due: the reaper writes nothing, however much is stored.
    assert small.reap_write_units == large.reap_write_units == 0
