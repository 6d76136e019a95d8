"""``benchmarks.embedded_peers``: it stops with the install command when a peer is missing, reports
Querator's rate over the best peer's.

The peers are installed for the benchmark only (``uv run --with``), never by the test run, so no
test here needs them: a test that skipped without them would hide that gap in CI."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

import pytest

from benchmarks import embedded_peers

if TYPE_CHECKING:
    from types import ModuleType


def test_a_missing_peer_stops_the_run_with_the_command_that_installs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.import_module

    def without_litequeue(name: str, package: str | None = None) -> ModuleType:
        if name == "litequeue":
            raise ModuleNotFoundError(name)
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", without_litequeue)

    with pytest.raises(SystemExit) as stopped:
        embedded_peers.measure(count=10, rounds=1)

    assert "litequeue" in str(stopped.value)
    assert "--with persist-queue --with litequeue" in str(stopped.value)


def test_the_ratio_is_over_the_best_peer_and_a_missing_workload_shows_as_a_dash() -> None:
    result = embedded_peers.Result()
    for queue, workload, seconds in [
        ("querator", "produce b1", 1.0),
        ("persist-queue", "produce b1", 2.0),
        ("litequeue", "produce b1", 0.5),
        ("querator", "produce b100", 1.0),
        ("litequeue", "produce b100", 4.0),
    ]:
        result.add(queue, workload, 1000, seconds)

    text = embedded_peers.report(result, ["querator", "persist-queue", "litequeue"], 1000, 1)

    lines = {line.split("|")[0].strip(): line for line in text.splitlines() if "|" in line}
    # 1,000/s against the best peer's 2,000/s (litequeue), not the other's 500/s.
    assert lines["produce b1"].rstrip().endswith("0.50x")
    # persist-queue has no batch put: a dash, and the ratio is over litequeue alone.
    assert lines["produce b100"].split("|")[1].split() == ["1,000", "-", "250"]
    assert lines["produce b100"].rstrip().endswith("4.00x")
    assert lines["lease+complete b1"].split("|")[2].strip() == "-"
