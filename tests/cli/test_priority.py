"""``--priority`` of ``querator produce`` and ``querator retry`` against ``querator serve``: lower
leases first, the priority shown by lease / peek / dead-letters and given to consume's command, and
bad values refused with a usage error before anything is sent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from querator.cli import main
from querator.cli.output import ExitCode

if TYPE_CHECKING:
    from collections.abc import Callable

    from querator.client import Client
    from tests.cli.conftest import Result

    Run = Callable[..., Result]


def _lease(run: Run, queue_name: str, n: int) -> dict[str, Any]:
    result = run("lease", queue_name, "-n", str(n), "--wait", "1s", "-o", "json")
    assert result.code == 0, result.err
    body: dict[str, Any] = result.json()
    return body


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == ExitCode.USAGE
    return capsys.readouterr().err


def test_produce_priority_then_lease_lowest_first(run: Run, client: Client, queue_name: str) -> None:
    run("queues", "create", queue_name)
    assert run("produce", queue_name, "late", "--priority", "9").code == 0
    assert run("produce", queue_name, "default").code == 0
    produced = run("produce", queue_name, "--priority", "0", "urgent", "-o", "json")
    assert produced.code == 0, produced.err

    table = run("lease", queue_name, "-n", "1", "--wait", "1s")
    rest = _lease(run, queue_name, 5)

    lines = table.out.splitlines()
    assert lines[1].split()[:3] == ["ID", "ATTEMPTS", "PRIORITY"]
    assert lines[3].split()[1:3] == ["1", "0"] and lines[3].endswith("urgent")
    assert lines[3].split()[0].startswith(".0")
    assert [(i["utf8"], i["priority"]) for i in rest["items"]] == [("default", 5), ("late", 9)]
    assert rest["items"][1]["id"].startswith("p9")
    assert [i.priority for i in client.list_items(queue_name)] == [0, 5, 9]


def test_produce_priority_from_jsonl_and_csv_lines(
    run: Run, client: Client, queue_name: str, tmp_path: Path
) -> None:
    run("queues", "create", queue_name)
    jsonl = tmp_path / "items.jsonl"
    jsonl.write_text('{"payload": "j-one", "priority": 1}\n{"payload": "j-default"}\n')
    csv = tmp_path / "items.csv"
    csv.write_text("payload,priority\nc-two,2\nc-default,\n")

    assert run("produce", queue_name, "-f", str(jsonl), "--priority", "7").code == 0
    assert run("produce", queue_name, "-f", str(csv)).code == 0

    items = client.list_items(queue_name)
    assert [(i.payload, i.priority) for i in items] == [
        (b"j-one", 1),
        (b"c-two", 2),
        (b"c-default", 5),
        (b"j-default", 7),
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("10", "argument --priority: must be between 0 and 9 (lower leases first), not 10"),
        ("-1", "argument --priority: must be between 0 and 9 (lower leases first), not -1"),
        ("x", "argument --priority: must be an integer between 0 and 9, not 'x'"),
        ("2.5", "argument --priority: must be an integer between 0 and 9, not '2.5'"),
    ],
)
def test_produce_with_a_bad_priority_is_a_usage_error_and_stores_nothing(
    run: Run, client: Client, queue_name: str, capsys: pytest.CaptureFixture[str], value: str, message: str
) -> None:
    run("queues", "create", queue_name)
    err = _usage_error(["produce", queue_name, "x", "--priority", value], capsys)
    assert err.startswith("usage: querator produce ")
    assert f"querator produce: error: {message}" in err
    assert client.stats(queue_name).total == 0


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            '{"payload": "ok"}\n{"payload": "bad", "priority": 10}\n',
            "line 2: priority must be between 0 and 9",
        ),
        (
            '{"payload": "bad", "priority": "3"}\n',
            "line 1: priority must be an integer between 0 and 9, not '3'",
        ),
    ],
    ids=["out-of-range", "a-string"],
)
def test_a_bad_priority_in_a_jsonl_line_exits_3_naming_the_line(
    run: Run, client: Client, queue_name: str, lines: str, message: str
) -> None:
    run("queues", "create", queue_name)
    result = run("produce", queue_name, "--format", "jsonl", "--batch-size", "1000", stdin=lines)
    assert result.code == ExitCode.BAD_REQUEST
    assert message in result.err
    assert client.stats(queue_name).total == 0


def test_retry_with_a_priority_changes_it(run: Run, client: Client, queue_name: str) -> None:
    run("queues", "create", queue_name)
    run("produce", queue_name, "a", "b")
    first = _lease(run, queue_name, 1)
    item = first["items"][0]
    assert (item["utf8"], item["priority"]) == ("a", 5)

    result = run("retry", queue_name, item["id"], "-p", str(first["partition"]), "--priority", "0")
    assert (result.code, result.out.strip()) == (0, f"retried 1 item(s) of {queue_name}")

    again = _lease(run, queue_name, 2)["items"]
    assert [(i["utf8"], i["priority"]) for i in again] == [("a", 0), ("b", 5)]
    # Later and with a priority: scheduled, and listed with it.
    assert run("retry", queue_name, again[0]["id"], "--in", "1h", "--priority", "8").code == 0
    scheduled = run("peek", queue_name, "--scheduled", "-o", "json").json()["items"]
    assert [(i["utf8"], i["priority"]) for i in scheduled] == [("a", 8)]


def test_retry_priority_refusals_do_nothing(
    run: Run, client: Client, queue_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run("queues", "create", f"{queue_name}-dead")
    run("queues", "create", queue_name, "--dead-queue", f"{queue_name}-dead")
    run("produce", queue_name, "a")
    item_id = _lease(run, queue_name, 1)["items"][0]["id"]

    err = _usage_error(["retry", queue_name, item_id, "--priority", "10"], capsys)
    assert "querator retry: error: argument --priority: must be between 0 and 9" in err
    with_dead = run("retry", queue_name, item_id, "--dead", "--priority", "1")
    assert with_dead.code == ExitCode.USAGE
    assert with_dead.err.startswith("querator retry: --priority sets the priority an item comes back with")

    stats = client.stats(queue_name)
    assert (stats.total, stats.total_leased) == (1, 1)
    assert client.stats(f"{queue_name}-dead").total == 0


def test_peek_and_dead_letters_show_the_priority(run: Run, queue_name: str) -> None:
    dead_queue = f"{queue_name}-dead"
    run("queues", "create", dead_queue)
    run("queues", "create", queue_name, "--dead-queue", dead_queue)
    run("produce", queue_name, "low", "--priority", "7")
    run("produce", queue_name, "high", "--priority", "1")

    peek = run("peek", queue_name).out.splitlines()
    assert peek[1].split()[3:5] == ["ATTEMPTS", "PRIORITY"]
    assert peek[3].split()[3:5] == ["0", "1"] and peek[3].endswith("high")
    assert peek[4].split()[3:5] == ["0", "7"] and peek[4].endswith("low")

    leased = _lease(run, queue_name, 1)
    run("retry", queue_name, leased["items"][0]["id"], "--dead", "-p", str(leased["partition"]))
    letters = run("dead-letters", queue_name).out.splitlines()
    assert letters[1].split()[:9] == [
        "PARTITION", "ID", "SOURCE", "QUEUE", "SOURCE", "ID", "ATTEMPTS", "FAILURES", "PRIORITY"
    ]  # fmt: skip
    # partition, id, source queue, source id, attempts 1, no failure (retried without a reason), priority 1
    assert letters[3].split()[2] == queue_name
    assert letters[3].split()[4:7] == ["1", "0", "1"] and letters[3].endswith("high")


CONSUMER = """
import os, sys
with open(sys.argv[1], "a") as log:
    log.write(f"{sys.stdin.read()} {os.environ['QUERATOR_ITEM_PRIORITY']}\\n")
"""


@pytest.mark.server
def test_consume_runs_the_lowest_priority_first_and_tells_the_command(
    run: Run, queue_name: str, tmp_path: Path
) -> None:
    run("queues", "create", queue_name)
    run("produce", queue_name, "later", "--priority", "6")
    run("produce", queue_name, "first", "--priority", "2")
    run("produce", queue_name, "middle")
    script, log = tmp_path / "consumer.py", tmp_path / "calls.txt"
    script.write_text(CONSUMER)

    result = run(
        "consume", queue_name, "--max-items", "3", "-n", "1", "--",
        sys.executable, str(script), str(log),
    )  # fmt: skip

    assert result.code == 0, result.err
    assert log.read_text().splitlines() == ["first 2", "middle 5", "later 6"]


def test_the_console_script_refuses_a_bad_priority(served_url: str, client: Client, queue_name: str) -> None:
    script = Path(sys.executable).with_name("querator")
    env = {**os.environ, "QUERATOR_URL": served_url}
    client.create_queue(queue_name, lease_timeout="1m", expire_timeout="1h")

    refused = subprocess.run(  # noqa: S603 - our own console script
        [str(script), "produce", queue_name, "x", "--priority", "nine"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    produced = subprocess.run(  # noqa: S603 - our own console script
        [str(script), "produce", queue_name, "x", "--priority", "9", "-o", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )

    assert refused.returncode == ExitCode.USAGE
    assert "argument --priority: must be an integer between 0 and 9, not 'nine'" in refused.stderr
    assert produced.returncode == 0, produced.stderr
    assert json.loads(produced.stdout)["produced"] == 1
    assert [(i.payload, i.priority) for i in client.list_items(queue_name)] == [(b"x", 9)]
