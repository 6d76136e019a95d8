"""The retry / expiry / dead-letter cost paths on a tiny workload: each ends every item once, at the
write units the data model implies; and the cold-start parser reads CPython's -X importtime format."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

import pytest

from benchmarks import coldstart, paths

if TYPE_CHECKING:
    from benchmarks.paths import PathResult

pytestmark = pytest.mark.server

COUNT = 6
BATCH = 3

CALLS = COUNT // BATCH
#: Engine v2's write units per item under 1 KB (docs/adr/0050-engine-v2.md): produce 1, lease 1,
#: complete 1; a requeue or a dead-letter move
#: is a two-item transaction, 2 x (delete 1 + put 1) = 4; an expired lease is leased again (1 more).
#: Then per call (docs/adr/0050-engine-v2.md): 1 for the head row's counters of each call that
#: changes items (2 for a move into another queue), and a lease files a lease record (1), which is
#: deleted (1) when it comes due.
EXPECTED_WCU = {
    # produce 1 + lease 2 + retry 1 + lease 2 + complete 1
    "retry": 8.0 + 7 * CALLS / COUNT,
    # produce 1 + lease 2 + (record dropped 1 + requeue's counters 1) + lease 2 + complete 1; but the
    # first lease's record lists a pool of candidates that holds the second lease's items too, so when
    # its record comes back first the requeues of both calls share one counter write (see below)
    "expiry": 8.0 + 8 * CALLS / COUNT,
    # produce 1 + lease 2 + retry dead 2
    "dead (retry)": 6.0 + 5 * CALLS / COUNT,
}


@pytest.fixture(scope="module")
def results(moto_server: str) -> dict[str, PathResult]:
    with pytest.MonkeyPatch.context() as patch:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            patch.setenv(name, "testing")
        patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        measured = paths.measure(moto_server, payloads=(100,), batch=BATCH, count=COUNT, engine=2)
    return {r.path: r for r in measured}


@pytest.fixture(scope="module")
def results_v3(moto_server: str) -> dict[str, PathResult]:
    """The same paths on engine v3's claim logs, the product's engine."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            patch.setenv(name, "testing")
        patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        measured = paths.measure(moto_server, payloads=(100,), batch=BATCH, count=COUNT, engine=3)
    return {r.path: r for r in measured}


def test_every_path_ends_every_item_exactly_once_on_engine_v3(results_v3: dict[str, PathResult]) -> None:
    assert set(results_v3) == set(paths.PATHS)
    for result in results_v3.values():
        assert result.exactly_once, result.name
        assert result.ended == COUNT


@pytest.mark.parametrize("path", sorted(paths.PATHS))
def test_every_path_costs_engine_v3_fewer_write_units_than_v2(
    results: dict[str, PathResult], results_v3: dict[str, PathResult], path: str
) -> None:
    # A move on v3 re-appends a record's items in one transaction and writes the record, not an
    # item's row twice; the happy path's rows are packed and go by TTL (docs/adr/0100).
    assert results_v3[path].per_item("write_units") < results[path].per_item("write_units")


def test_every_path_ends_every_item_exactly_once(results: dict[str, PathResult]) -> None:
    assert set(results) == set(paths.PATHS)
    for result in results.values():
        assert result.exactly_once, result.name
        assert result.ended == COUNT


#: Which of the expiry path's records the reaper reads first is up to their random key suffixes.
SHARED_REQUEUE_WRITE = {"expiry": 1 / COUNT}


@pytest.mark.parametrize("path", sorted(EXPECTED_WCU))
def test_write_units_per_item_follow_from_the_data_model(results: dict[str, PathResult], path: str) -> None:
    measured = results[path].per_item("write_units")
    allowed = {EXPECTED_WCU[path], EXPECTED_WCU[path] - SHARED_REQUEUE_WRITE.get(path, 0.0)}
    assert any(abs(measured - value) < 1e-9 for value in allowed), (measured, allowed)


def test_the_reaper_path_costs_the_move_plus_its_bookmark(results: dict[str, PathResult]) -> None:
    reaped = results["dead (reaper)"]
    # 4 per item, then per lease record the reaper settles: the record (1) and the counters of the
    # source and the dead-letter queue (2). The same run also drops the records of the other paths'
    # last leases, which came due with the clock, and may move their sweep marks (1 each, under
    # 3 per item of this path).
    assert reaped.per_item("write_units", "reap") > 4.0 + 3 * CALLS / COUNT
    assert reaped.per_item("write_units", "reap") < 4.0 + 3 * CALLS / COUNT + 3.0


def test_importtime_parser_reads_the_cumulative_column() -> None:
    stderr = "\n".join(
        [
            "import time: self [us] | cumulative | imported package",
            "import time:       120 |        120 |   _io",
            "import time:      3056 |     144058 | boto3",
            "import time:       200 |     450000 | functions.produce.handler",
        ]
    )
    assert coldstart.parse_importtime(stderr, "boto3") == 144058
    assert coldstart.parse_importtime(stderr, "functions.produce.handler") == 450000
    with pytest.raises(ValueError, match="not found"):
        coldstart.parse_importtime(stderr, "functions.lease.handler")


def test_every_function_folder_has_a_handler_to_time() -> None:
    modules = coldstart.handler_modules()
    assert "functions.produce.handler" in modules
    assert "functions.reaper.handler" in modules
    assert all(m.startswith("functions.") and m.endswith(".handler") for m in modules)


def test_the_import_steps_are_importable_in_order_and_end_at_a_handler() -> None:
    # --steps times each module after the ones before it: every one must exist, and the last must be
    # a handler that the import-time table also measures.
    modules = [module for module, _ in coldstart.STEPS]
    assert modules[-1] in coldstart.handler_modules()
    assert len(set(modules)) == len(modules)
    assert all(importlib.util.find_spec(module) is not None for module in modules)


def test_the_steps_table_adds_up_to_the_handlers_share_of_import_boto3() -> None:
    steps = [(module, 10.0) for module, _ in coldstart.STEPS]
    table = coldstart.format_steps_table(100.0, steps, repeat=3)
    last = table.splitlines()[-1].split()
    assert last[-3:] == ["10.0", "0.10", f"{len(steps) / 10:.2f}"]
