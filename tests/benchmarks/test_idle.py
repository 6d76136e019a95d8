"""The idle-consumer benchmark: its poll counts are the service's schedule, its arithmetic adds up."""

from __future__ import annotations

import pytest

from benchmarks.idle import (
    MONTH,
    PRICE_API_REQUEST,
    PRICE_GB_SECOND,
    PRICE_READ_UNIT,
    IdlePoll,
    _idle_month,
    backoff_duty,
    call_seconds,
    idle_poll,
)


@pytest.mark.server
def test_an_idle_wait_reads_each_partition_once_a_poll_and_the_catalog_once_a_second(
    moto_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    one = idle_poll(moto_server, 1, 5.0)
    four = idle_poll(moto_server, 4, 5.0)
    # The catalog is read once per second of waiting (the queue cache), whatever the partitions.
    assert one.catalog_read_units == four.catalog_read_units == 5.0
    # Every poll reads each partition the same way, so four partitions read four times as much.
    assert four.read_units - four.catalog_read_units == 4 * (one.read_units - one.catalog_read_units)
    assert one.requests > 10  # a 5 s wait polls more than once (POLL_FIRST doubling to POLL_MAX)


def test_backoff_keeps_a_poll_open_for_its_share_of_each_cycle() -> None:
    # 5 s lease calls, then pauses averaging 7.5 s once the 15 s ceiling is reached.
    assert backoff_duty(5.0, 15.0) == pytest.approx(0.4)
    assert backoff_duty(5.0, 0.0) == 1.0


def test_a_month_of_idle_polls_bills_the_whole_month_at_the_memory_size() -> None:
    poll = IdlePoll(wait=20.0, partitions=1, requests=110, read_units=110.0, catalog_read_units=20.0)
    lambda_dollars, api_dollars, dynamo_dollars, polls = _idle_month(poll, 1024, 1.0)
    assert polls == MONTH / 20
    assert lambda_dollars == pytest.approx(MONTH * PRICE_GB_SECOND + polls * 0.20 / 1e6)
    assert api_dollars == pytest.approx(polls * PRICE_API_REQUEST)
    assert dynamo_dollars == pytest.approx(polls * 110 * PRICE_READ_UNIT)
    half_memory, *_ = _idle_month(poll, 512, 1.0)
    assert half_memory < lambda_dollars


def test_a_call_takes_its_cpu_scaled_to_the_memory_plus_its_round_trips() -> None:
    # 17.69 ms of CPU on a full vCPU takes ten times as long at a tenth of 1,769 MB.
    assert call_seconds(17.69, 0, 1769) == pytest.approx(0.01769)
    assert call_seconds(17.69, 2, 176.9) == pytest.approx(0.1769 + 2 * 0.005)
