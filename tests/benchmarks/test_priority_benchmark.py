"""benchmarks.priority measures what it says: every item delivered once, a FIFO queue's costs
unchanged by priorities, and the extra cost of other priorities where the design puts it."""

from __future__ import annotations

import pytest

from benchmarks.priority import measure

pytestmark = pytest.mark.server


def test_priorities_cost_a_band_registration_per_produce_and_a_read_per_band(moto_server: str) -> None:
    results = {(case, r.batch): r for case, r in measure(moto_server, count=40)}

    fifo, one, ten = (results[case, 10] for case in ("fifo", "one band", "ten bands"))
    for result in (fifo, one, ten):
        assert (result.delivered, result.duplicates, result.missing) == (40, 0, 0)
    # One more small head-row write per produce request of another priority: 1 unit per 10 items.
    assert one.per_item("write_units", "produce") == pytest.approx(
        fifo.per_item("write_units", "produce") + 0.1
    )
    produce_ops = fifo.phases["produce"].requests_by_operation
    assert (produce_ops["BatchWriteItem"], produce_ops["UpdateItem"]) == (4, 4)  # one of each a request
    assert one.phases["produce"].requests_by_operation["UpdateItem"] == 8
    # A lease reads the bands in use: more range reads with every band in use than with one.
    assert ten.phases["lease"].requests > one.phases["lease"].requests >= fifo.phases["lease"].requests
