"""``benchmarks.stream``: its percentile and produce schedule are what the report says they are, and a
tiny run against ``querator serve`` measures every item of both consumers from its produce call."""

from __future__ import annotations

import itertools

import pytest

from benchmarks import stream
from querator.testing import serve_process


def test_the_percentile_is_the_nearest_rank() -> None:
    values = [float(n) for n in range(100, 0, -1)]  # 1..100, unordered
    assert stream.percentile(values, 0.95) == 95.0
    assert stream.percentile(values, 0.5) == 50.0
    assert stream.percentile(values, 1.0) == 100.0
    assert stream.percentile([7.0, 3.0], 0.95) == 7.0
    assert stream.percentile([4.0], 0.01) == 4.0
    with pytest.raises(ValueError, match="no values"):
        stream.percentile([], 0.5)


def test_the_schedule_is_the_rate_and_a_phase_shifts_it_by_part_of_a_period() -> None:
    assert stream.schedule(5, 3) == pytest.approx([0.0, 0.2, 0.4])
    assert stream.schedule(1, 3, phase=0.5) == pytest.approx([0.5, 1.5, 2.5])
    # The two consumers' schedules interleave: no produce of one meets a produce of the other.
    merged = sorted(stream.schedule(5, 4) + stream.schedule(5, 4, phase=0.5))
    assert [b - a for a, b in itertools.pairwise(merged)] == pytest.approx([0.1] * 7)
    with pytest.raises(ValueError, match="positive"):
        stream.schedule(0, 3)


def test_the_table_gives_median_p95_and_max_in_milliseconds() -> None:
    summary = stream.Summary(rate=5, consumer="long-poll", latencies=(0.010, 0.020, 0.300), missing=0)
    table = stream.format_table([summary])
    assert "| 5/s | long-poll | 3 | 20.0 | 300.0 | 300.0 |" in table


@pytest.mark.server
def test_a_tiny_run_holds_every_item_of_both_consumers() -> None:
    with serve_process() as url:
        summaries = stream.measure(url, (20.0,), 4)
    assert [(s.rate, s.consumer, s.missing) for s in summaries] == [
        (20.0, "stream", 0),
        (20.0, "long-poll", 0),
    ]
    for summary in summaries:
        assert len(summary.latencies) == 4
        # From before the produce call to the consumer holding the item: positive, and bounded by
        # the server's slowest wait (the poll back-off) well under the 20 s long-poll.
        assert all(0 < latency < 5 for latency in summary.latencies)
