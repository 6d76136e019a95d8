"""``--delivery`` and ``--max-leased-per-group`` of ``querator queues create`` / ``update`` against
``querator serve``: the queue reads back with them (``queues info``, ``queues list``, table and JSON),
a queue created without them shows ``fifo`` / 0, a value the server refuses exits 3 naming the
field, and a delivery other than fifo or fair is a usage error before anything is sent."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from querator.cli import main
from querator.cli.output import ExitCode

if TYPE_CHECKING:
    from collections.abc import Callable

    from querator.client import Client
    from tests.cli.conftest import Result

    Run = Callable[..., Result]


def _column(table: str, header: str, row: int = 0) -> str:
    """The cell under ``header`` in data row ``row`` of a table (header, rule, rows)."""
    lines = table.splitlines()
    start = lines[0].index(header)
    return lines[2 + row][start:].split()[0]


def test_create_a_fair_queue_and_see_it_in_info_and_list(run: Run, client: Client, queue_name: str) -> None:
    created = run(
        "queues", "create", queue_name, "--delivery", "fair", "--max-leased-per-group", "3", "-o", "json"
    )
    assert created.code == 0, created.err
    assert (created.json()["delivery"], created.json()["max_leased_per_group"]) == ("fair", 3)
    info = client.queue_info(queue_name)
    assert (info.delivery, info.max_leased_per_group) == ("fair", 3)

    shown = run("queues", "info", queue_name)
    assert shown.code == 0, shown.err
    rows = {line.split()[0]: line.split()[1:] for line in shown.out.splitlines() if line.strip()}
    assert (rows["delivery"], rows["max_leased_per_group"]) == (["fair"], ["3"])

    listing = run("queues", "list", "--pivot", queue_name, "--limit", "1")
    assert listing.code == 0, listing.err
    assert (_column(listing.out, "DELIVERY"), _column(listing.out, "MAX LEASED/GROUP")) == ("fair", "3")
    depth = run("queues", "list", "--pivot", queue_name, "--limit", "1", "--depth")
    assert (_column(depth.out, "DELIVERY"), _column(depth.out, "MAX LEASED/GROUP")) == ("fair", "3")
    listed = run("queues", "list", "--pivot", queue_name, "--limit", "1", "-o", "json").json()
    assert [(q["delivery"], q["max_leased_per_group"]) for q in listed["items"]] == [("fair", 3)]


def test_a_queue_created_without_them_shows_fifo_and_0(run: Run, queue_name: str) -> None:
    created = run("queues", "create", queue_name, "-o", "json")
    assert created.code == 0, created.err
    assert (created.json()["delivery"], created.json()["max_leased_per_group"]) == ("fifo", 0)
    listing = run("queues", "list", "--pivot", queue_name, "--limit", "1")
    assert (_column(listing.out, "DELIVERY"), _column(listing.out, "MAX LEASED/GROUP")) == ("fifo", "0")


@pytest.mark.parametrize("command", ["create", "update"])
@pytest.mark.parametrize("value", ["-1", "1000001"])
def test_a_max_leased_per_group_the_server_refuses_exits_3_naming_it(
    run: Run, queue_name: str, command: str, value: str
) -> None:
    if command == "update":
        assert run("queues", "create", queue_name).code == 0
    result = run("queues", command, queue_name, "--max-leased-per-group", value)
    assert result.code == ExitCode.BAD_REQUEST
    assert "Invalid request; max_leased_per_group: " in result.err
    assert result.out == ""


@pytest.mark.parametrize("command", ["create", "update"])
@pytest.mark.parametrize(
    ("option", "value"), [("--delivery", "lifo"), ("--delivery", "FAIR"), ("--max-leased-per-group", "x")]
)
def test_a_bad_option_is_a_usage_error_before_anything_is_sent(
    command: str, option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        # No server is reached: the URL would refuse the connection (exit 7) if it were.
        main(["queues", command, "q", "--url", "http://127.0.0.1:9", option, value])
    assert exited.value.code == ExitCode.USAGE
    assert option in capsys.readouterr().err


def test_update_changes_max_leased_per_group_only_when_given(run: Run, queue_name: str) -> None:
    assert run("queues", "create", queue_name, "--delivery", "fair", "--max-leased-per-group", "2").code == 0
    updated = run("queues", "update", queue_name, "--reference", "r", "-o", "json")
    assert updated.code == 0, updated.err
    assert (updated.json()["delivery"], updated.json()["max_leased_per_group"]) == ("fair", 2)
