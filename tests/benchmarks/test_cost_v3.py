"""The v3 cost benchmark's parts on a moto server: a workload through ``DynamoDBClaimLog`` delivers
every item once and is metered, the depth case holds its leases, and the report prints the targets
(the metered run itself is ``python -m benchmarks.cost_v3``)."""

from __future__ import annotations

import pytest

from benchmarks.candidates_v3 import Report, Workload
from benchmarks.cost_v3 import depth_v3, format_report, run_v3


@pytest.mark.slow
def test_a_workload_through_the_claim_log_is_delivered_once_and_metered(moto_server: str) -> None:
    figures = run_v3(moto_server, Workload(100, 10, consumers=4), 60)
    assert figures.exactly_once
    assert figures.leased == 60
    # Packed rows and one head write per call: well under one write unit per item at batch 10.
    assert 0 < figures.write_units_per_item < 1.0
    assert figures.read_units_per_item > 0
    assert figures.failed_per_leased < 0.1


@pytest.mark.slow
def test_the_depth_case_leases_ten_behind_held_leases_and_reads_little(moto_server: str) -> None:
    run = depth_v3(moto_server, 400)
    assert run.held == 400
    assert run.delivered == 10
    assert run.read_units <= 20
    report = Report(figures=[], episodes=[], count=0, contention_count=0, depth=[run])
    assert "400" in format_report(report)
