"""``benchmarks.local_stores`` on a tiny workload: the server starts, delivers every item and the
module reports its figures and memory."""

from __future__ import annotations

import pytest

from benchmarks import local_stores

pytestmark = pytest.mark.server


def test_a_tiny_run_measures_every_batch_and_the_servers_memory() -> None:
    store = "sqlite"
    rows, loaded, idle = local_stores.measure_store(store, (50,), count=20, idle=0)

    assert [(r.store, r.depth) for r in rows] == [(store, 50)]
    for row in rows:
        assert set(row.produce) == set(row.deliver) == set(local_stores.BATCHES)
        assert all(rate > 0 for rate in [*row.produce.values(), *row.deliver.values()])
    assert 10 < loaded < 2000
    assert 10 < idle < 2000
    text = local_stores.report([(rows, loaded, idle)], 0)
    assert f"{store:9} {50:>7,}" in text
