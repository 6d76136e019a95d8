"""The cost benchmark's core on a tiny workload: it delivers everything once and meters real figures."""

from __future__ import annotations

import pytest

from benchmarks.cost import PHASES, TARGET_WRITE_UNITS, CostReport, format_report, measure

pytestmark = pytest.mark.server

COUNT = 20
BATCH = 10
PAYLOAD = 100


@pytest.fixture(scope="module")
def report(moto_server: str) -> CostReport:
    # Module-scoped, so it runs before the function-scoped fake credentials of conftest: set them here.
    with pytest.MonkeyPatch.context() as patch:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            patch.setenv(name, "testing")
        patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        patch.delenv("AWS_PROFILE", raising=False)
        # Engine v2's figures (its floor, its batch writes); v3's: tests/benchmarks/test_cost_v3.py.
        return measure(moto_server, payloads=(PAYLOAD,), batches=(BATCH,), count=COUNT, engine=2)


def test_every_produced_item_is_delivered_exactly_once(report: CostReport) -> None:
    case = report.case(PAYLOAD, BATCH)
    assert case.produced == COUNT
    assert case.delivered == COUNT
    assert case.duplicates == 0
    assert case.missing == 0


def test_every_phase_makes_requests(report: CostReport) -> None:
    case = report.case(PAYLOAD, BATCH)
    for phase in PHASES:
        assert case.phases[phase].requests > 0, phase
    # The first call reads its queue from the catalog (later ones may use the process's copy,
    # docs/adr/0008-queue-cache.md): the meter must see the catalog's client too.
    assert case.phases["produce"].catalog_requests > 0
    assert case.phases["produce"].requests_by_operation.get("BatchWriteItem", 0) >= COUNT // BATCH


def test_write_units_are_at_least_the_floor(report: CostReport) -> None:
    case = report.case(PAYLOAD, BATCH)
    assert case.floor_write_units == 3  # a 100-byte payload plus keys is under 1 KB
    assert case.per_item("write_units") >= case.floor_write_units
    for phase in PHASES:
        assert case.per_item("write_units", phase) >= 1, phase


def test_small_items_meet_the_write_unit_target(report: CostReport) -> None:
    case = report.case(PAYLOAD, BATCH)
    assert case.stored_item_bytes < 1024
    assert case.per_item("write_units") <= TARGET_WRITE_UNITS
    assert case.failed_conditional_writes == 0
    assert report.target_met() is True


def test_report_formats(report: CostReport) -> None:
    text = format_report(report, COUNT)
    assert "100B x10" in text
    assert "MET" in text
