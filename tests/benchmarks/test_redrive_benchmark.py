"""benchmarks.redrive counts what it claims: every stored dead letter moved once, at a transaction's
units per item (a Delete and a Put, each charged twice), whatever sits ahead of them."""

from __future__ import annotations

import pytest

from benchmarks.redrive import measure


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")


def test_one_call_moves_every_dead_letter_at_two_transaction_writes_each() -> None:
    row = measure(40, "one call")
    assert (row.calls, row.moved) == (1, 40)
    # 2 x (1 + 1) write units per move; the head rows' counters add a few updates per call.
    assert 4.0 <= row.write_units / row.moved <= 4.5
    # Whole items in one Query, not a read of states and then one read unit per item (1.06/item).
    assert row.read_units / row.moved < 0.5


def test_dead_letters_of_a_deleted_queue_are_read_past_but_not_moved() -> None:
    row = measure(1040, "behind stranded")
    assert row.moved == 40
