"""The stream-on-AWS benchmark counts what it claims: one invocation per batch on a backlog, a push
message per batch, and the stream's DynamoDB work a bounded amount above HTTP's for the same items."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from moto import mock_aws

if TYPE_CHECKING:
    from collections.abc import Iterator

from benchmarks.stream_aws import ENVIRONMENT, Bench, arrival, backlog, long_poll


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Iterator[Bench]:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    # Bench sets the stack's environment (metrics disabled among it). Setting it through monkeypatch
    # first records what each variable was, so later tests get their own environment back; delenv
    # of an absent variable would record nothing, and the metrics switch leaked into later tests.
    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        yield Bench()
    from querator import bootstrap  # noqa: PLC0415

    bootstrap.reset()


@pytest.mark.parametrize("batch", [1, 10])
def test_a_backlog_is_pushed_one_invocation_and_one_lease_message_per_batch(bench: Bench, batch: int) -> None:
    figures = backlog(bench, batch, 4)
    assert figures.items == 4 * batch
    assert figures.invocations == 4  # one complete message per batch, which pushes the next
    # A lease frame per batch pushed and an "ok" per complete (the last push is empty: no frame).
    assert figures.messages == 4 + 3


def test_arrival_costs_a_dispatcher_and_a_stream_invocation_per_batch(bench: Bench) -> None:
    figures = arrival(bench, 10, 3)
    assert (figures.items, figures.invocations) == (30, 6)


def test_at_batch_100_the_stream_costs_about_what_http_does(bench: Bench) -> None:
    stream, http = backlog(bench, 100, 2), long_poll(bench, 100, 2)
    assert http.invocations == 4
    # The connection's row is a handful of writes per batch: under 0.1 write units an item at 100.
    assert stream.per_item(stream.write_units) < http.per_item(http.write_units) + 0.1
