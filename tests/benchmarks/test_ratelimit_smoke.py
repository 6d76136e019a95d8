"""``benchmarks.ratelimit --quick`` against a ``querator serve`` it starts: 8 consumers, a limit of
20 a second per queue and 5 per group; the run stays within the stated bounds, reaches the queue's
limit while every group has items, leases nothing twice, and the report's bound arithmetic is the
token bucket's."""

from __future__ import annotations

import pytest

from benchmarks import ratelimit


def test_the_bound_is_rate_times_window_plus_one_seconds_burst() -> None:
    assert ratelimit.bound(20, 1) == 40
    assert ratelimit.bound(20, 10) == 220
    assert ratelimit.bound(5, 60) == 305
    # A rate under one a second still lets one through at once.
    assert ratelimit.bound(0.5, 10) == 6


def test_most_in_window_counts_a_half_open_window() -> None:
    assert ratelimit.most_in_window([0.0, 0.5, 0.99, 1.0, 1.5], 1.0) == 3
    assert ratelimit.most_in_window([], 1.0) == 0


@pytest.mark.slow  # about 20 s: a server, 10 groups, 12 s of leasing
def test_the_quick_run_keeps_the_limits(capsys: pytest.CaptureFixture[str]) -> None:
    assert ratelimit.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "result: OK" in out
    assert "leased twice: 0; errors: 0" in out
