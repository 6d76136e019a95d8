"""``--rate-limit`` and ``--rate-limit-per-group`` of ``querator queues create`` / ``update``
against ``querator serve``: the queue reads back with them (``queues info``, ``queues list``, table
and JSON), a queue without them shows none, and a value the server refuses exits 3 naming it."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from querator.cli.output import ExitCode

if TYPE_CHECKING:
    from collections.abc import Callable

    from querator.client import Client
    from tests.cli.conftest import Result

    Run = Callable[..., Result]


def _column(table: str, header: str, row: int = 0) -> str:
    """The cell under ``header`` in data row ``row`` of a table (header, rule, rows)."""
    lines = table.splitlines()
    start = lines[0].index(header + " ")
    return lines[2 + row][start:].split()[0]


def test_create_with_rate_limits_and_see_them_in_info_and_list(
    run: Run, client: Client, queue_name: str
) -> None:
    created = run(
        "queues", "create", queue_name, "--delivery", "fair",
        "--rate-limit", "20", "--rate-limit-per-group", "0.5", "-o", "json",
    )  # fmt: skip
    assert created.code == 0, created.err
    assert (created.json()["rate_limit"], created.json()["rate_limit_per_group"]) == (20, 0.5)
    info = client.queue_info(queue_name)
    assert (info.rate_limit, info.rate_limit_per_group) == (20.0, 0.5)

    shown = run("queues", "info", queue_name)
    rows = {line.split()[0]: line.split()[1:] for line in shown.out.splitlines() if line.strip()}
    assert (rows["rate_limit"], rows["rate_limit_per_group"]) == (["20.0"], ["0.5"])

    listing = run("queues", "list", "--pivot", queue_name, "--limit", "1")
    assert (_column(listing.out, "RATE/S"), _column(listing.out, "RATE/S/GROUP")) == ("20", "0.5")

    updated = run("queues", "update", queue_name, "--rate-limit", "0", "-o", "json")
    assert updated.code == 0, updated.err
    assert (updated.json()["rate_limit"], updated.json()["rate_limit_per_group"]) == (0, 0.5)
    listing = run("queues", "list", "--pivot", queue_name, "--limit", "1")
    assert _column(listing.out, "RATE/S") == "-"


def test_a_rate_limit_the_server_refuses_exits_3_naming_it(run: Run, queue_name: str) -> None:
    result = run("queues", "create", queue_name, "--rate-limit", "-1")
    assert result.code == ExitCode.BAD_REQUEST
    assert "Invalid request; rate_limit: " in result.err
    per_group = run("queues", "create", queue_name, "--rate-limit-per-group", "5")
    assert per_group.code == ExitCode.BAD_REQUEST
    assert "rate_limit_per_group needs delivery 'fair'" in per_group.err


def test_lease_says_when_the_rate_limit_has_a_lease_again(run: Run, client: Client, queue_name: str) -> None:
    client.create_queue(queue_name, lease_timeout="1m", expire_timeout="1h", rate_limit=1)
    client.produce(queue_name, [b"a", b"b"])

    first = run("lease", queue_name, "-n", "2")
    second = run("lease", queue_name, "-n", "2", "--wait", "0s", "-o", "json")

    assert first.code == 0, first.err
    assert "the rate limit has a lease again at " in first.err
    # An RFC 3339 timestamp, as the table's lease deadlines print, not Python's str().
    assert re.search(r"lease again at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", first.err), first.err
    assert second.code == ExitCode.TRY_AGAIN
    assert "nothing to lease" in second.err and "the rate limit has a lease again at " in second.err
    assert second.json()["items"] == [] and "next_lease_at" in second.json()
