"""benchmarks.priority measures what it says: every item delivered once, a FIFO queue's costs
unchanged by priorities, and the extra cost of other priorities where the design puts it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from benchmarks.priority import measure

if TYPE_CHECKING:
    from benchmarks.cost import CaseResult

pytestmark = pytest.mark.server


def test_priorities_cost_a_band_registration_per_produce_and_a_read_per_band(moto_server: str) -> None:
    results = {(case, r.batch): r for case, r in measure(moto_server, count=40)}

    fifo, one, ten = (results[case, 10] for case in ("fifo", "one band", "ten bands"))
    fair, capped = (results[case, 10] for case in ("fair, 100 groups", "fair, 100 groups, cap 5"))
    for result in (fifo, one, ten, fair, capped):
        assert (result.delivered, result.duplicates, result.missing) == (40, 0, 0)
    # Another priority's band is registered (one small head-row write) by the first produce request
    # only: the producing store reuses its registration for 5 minutes, so 1 unit per 40 items.
    assert one.per_item("write_units", "produce") == pytest.approx(
        fifo.per_item("write_units", "produce") + 1 / 40
    )
    produce_ops = fifo.phases["produce"].requests_by_operation
    assert (produce_ops["BatchWriteItem"], produce_ops["UpdateItem"]) == (4, 4)  # one of each a request
    assert one.phases["produce"].requests_by_operation["UpdateItem"] == 5
    # A fair queue registers each group's lane once (40 items in 40 groups of the 100) and the head
    # row's lanes flag once, on top of FIFO's counters.
    assert fair.phases["produce"].requests_by_operation["UpdateItem"] == 4 + 40 + 1

    def lease_requests(result: CaseResult) -> int:
        """The lease phase's requests to the items table: catalog reads come when the queue cache's
        second ran out between two leases, so they count wall time (a slow machine), not the design."""
        phase = result.phases["lease"]
        return phase.requests - phase.catalog_requests

    # A fair lease reads a lane per group it serves: more reads than FIFO's; the cap adds more.
    assert lease_requests(capped) > lease_requests(fair) > lease_requests(fifo)
    # A lease reads the bands in use: more range reads with every band in use than with one.
    assert lease_requests(ten) > lease_requests(one) >= lease_requests(fifo)
