"""Metrics with ``POWERTOOLS_METRICS_DISABLED`` (as ``querator serve`` and the embedded library run):
nothing reaches stdout, however many invocations pass."""

from __future__ import annotations

from typing import TYPE_CHECKING

from querator import observability

if TYPE_CHECKING:
    import pytest


def test_disabled_metrics_are_dropped_not_printed_past_a_hundred_values(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    observability.metrics.clear_metrics()
    # Powertools keeps disabled metrics on flush and prints them itself once one holds 100 values:
    # under `querator serve` that print blocked every handler once its stdout pipe was full.
    for _ in range(250):
        observability.count("ItemsLeased", 1)
        observability.flush()
    assert capsys.readouterr().out == ""
    assert not observability.metrics.metric_set
