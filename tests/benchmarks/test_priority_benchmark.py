"""benchmarks.priority measures what it says: every item delivered once, a FIFO queue's costs
unchanged by priorities, and the extra cost of other priorities where the design puts it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from moto import mock_aws

from benchmarks.priority import lease_fair_at_depth, measure

if TYPE_CHECKING:
    from benchmarks.cost import CaseResult

pytestmark = pytest.mark.server


def _lease_requests(result: CaseResult) -> int:
    """The lease phase's requests to the items table: catalog reads come when the queue cache's
    second ran out between two leases, so they count wall time (a slow machine), not the design."""
    phase = result.phases["lease"]
    return phase.requests - phase.catalog_requests


@pytest.mark.slow  # six cases of 40 items, each through a moto server: about a minute an engine
@pytest.mark.parametrize("engine", [2, 3])
def test_priorities_cost_a_band_registration_per_produce_and_a_read_per_band(
    moto_server: str, engine: int
) -> None:
    results = {(case, r.batch): r for case, r in measure(moto_server, count=40, engine=engine)}

    fifo, one, ten = (results[case, 10] for case in ("fifo", "one band", "ten bands"))
    fair, capped = (results[case, 10] for case in ("fair, 100 groups", "fair, 100 groups, cap 5"))
    for result in (fifo, one, ten, fair, capped):
        assert (result.delivered, result.duplicates, result.missing) == (40, 0, 0)
    # Another priority's band is registered (one small head-row write) by the first produce request
    # only: the producing store reuses its registration for 5 minutes, so 1 unit per 40 items.
    assert one.per_item("write_units", "produce") == pytest.approx(
        fifo.per_item("write_units", "produce") + 1 / 40
    )
    fifo_ops = fifo.phases["produce"].requests_by_operation
    assert one.phases["produce"].requests_by_operation["UpdateItem"] == fifo_ops["UpdateItem"] + 1
    # A lease reads the bands in use: more reads with every band in use than with one; a fair
    # lease reads a lane (a head, with engine v3) per group it serves: more than FIFO's.
    assert _lease_requests(ten) > _lease_requests(one) >= _lease_requests(fifo)
    assert _lease_requests(fair) > _lease_requests(fifo)
    if engine == 2:
        # A batch write and a counter update per request.
        assert (fifo_ops["BatchWriteItem"], fifo_ops["UpdateItem"]) == (4, 4)
        # A fair queue registers each group's lane once (40 items in 40 groups of the 100) and the
        # head row's lanes flag once, on top of FIFO's counters.
        assert fair.phases["produce"].requests_by_operation["UpdateItem"] == 4 + 40 + 1
        # The cap's ledgers add reads (engine v3 checks the cap in the claim's own write).
        assert _lease_requests(capped) > _lease_requests(fair)
    else:
        # One packed row a request (10 items of 100 B), and no counters: the sequencer is the count.
        assert fifo_ops["PutItem"] == 4 and "BatchWriteItem" not in fifo_ops
        # The cap is checked in each lane's claim write: it reads nothing more.
        assert _lease_requests(capped) == _lease_requests(fair)


@pytest.mark.slow  # 1,100 items written into moto four times: engine at depth
def test_a_fair_lease_costs_the_same_behind_ten_times_the_valid_leases() -> None:
    with mock_aws():
        shallow = lease_fair_at_depth(50, 10)
        deep = lease_fair_at_depth(500, 10)
        shallow_start = lease_fair_at_depth(50, 10, cursors_moved=False)
        deep_start = lease_fair_at_depth(500, 10, cursors_moved=False)
    assert [found for found, _, _ in shallow + deep] == [10] * 6
    # Each lane's cursor stands past the valid leases its group holds: the lane reads start after them.
    assert deep == shallow
    # With every cursor at its lane's start, a lane's first read goes through the valid leases it holds
    # (the cost the cursors keep away), and moves the cursor past them.
    assert [found for found, _, _ in deep_start] == [10] * 3
    assert deep_start[0][1] > 2 * shallow_start[0][1] > 2 * deep[0][1]
