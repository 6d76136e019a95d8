"""``querator consume QUEUE -- COMMAND`` against ``querator serve``: the payload on stdin, the exit
status deciding complete / retry / dead letter, renewals while the command runs, and a clean stop on
SIGTERM that puts the item back and ends the command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from querator.cli import main
from querator.cli.output import ExitCode

if TYPE_CHECKING:
    from collections.abc import Callable

    from querator.client import Client
    from tests.cli.conftest import Result

    Run = Callable[..., Result]

pytestmark = pytest.mark.server

#: The command under test: records what it got, then exits as its payload says.
COMMAND = """
import json, os, sys, time
payload = sys.stdin.read()
with open(sys.argv[1], "a") as log:
    log.write(json.dumps({"payload": payload, "id": os.environ["QUERATOR_ITEM_ID"],
                          "attempts": int(os.environ["QUERATOR_ITEM_ATTEMPTS"]),
                          "reference": os.environ["QUERATOR_ITEM_REFERENCE"],
                          "group": os.environ["QUERATOR_ITEM_GROUP"]}) + "\\n")
if payload.startswith("sleep "):
    time.sleep(float(payload.split()[1]))
sys.exit({"ok": 0, "dead": 42, "fail": 1}.get(payload, 0))
"""


def _calls(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_consume_settles_each_item_by_the_commands_exit_status(
    run: Run, client: Client, queue_name: str, tmp_path: Path
) -> None:
    # GIVEN a queue that dead-letters on the second attempt, and three items
    dead_queue = f"{queue_name}-dead"
    run("queues", "create", dead_queue)
    run("queues", "create", queue_name, "--max-attempts", "2", "--dead-queue", dead_queue)
    run("produce", queue_name, "ok", "dead", "fail", "--reference", "r1", "--group", "acme")
    script, log = tmp_path / "command.py", tmp_path / "calls.jsonl"
    script.write_text(COMMAND)

    # WHEN a consumer runs the command until the queue stays empty
    result = run(
        "consume", queue_name, "--idle", "1s", "--wait", "200ms", "--backoff", "100ms",
        "--dead-letter-exit", "42", "--", sys.executable, str(script), str(log),
    )  # fmt: skip

    # THEN: exit 0 completes, 42 dead-letters at once, 1 retries until max_attempts dead-letters it
    assert result.code == 0, result.err
    calls = _calls(log)
    assert sorted((c["payload"], c["attempts"]) for c in calls) == [
        ("dead", 1),
        ("fail", 1),
        ("fail", 2),
        ("ok", 1),
    ]
    assert {c["reference"] for c in calls} == {"r1"}
    assert {c["group"] for c in calls} == {"acme"}
    assert client.stats(queue_name).total == 0
    letters = sorted(item.payload for item in client.iter_items(dead_queue))
    assert letters == [b"dead", b"fail"]
    assert result.err.strip().startswith("querator consume: stopped (idle) after ")
    assert "4 leased, 1 completed, 1 retried, 2 dead-lettered, 0 put back, 0 lost" in result.err


def test_consume_with_stream_has_items_pushed_and_renews_over_the_stream(
    run: Run, client: Client, queue_name: str, tmp_path: Path
) -> None:
    # GIVEN a 1 s lease, a command that outlasts it, and two quick ones
    run("queues", "create", queue_name, "--lease-timeout", "1s")
    run("produce", queue_name, "sleep 2.5", "ok", "ok")
    script, log = tmp_path / "command.py", tmp_path / "calls.jsonl"
    script.write_text(COMMAND)

    result = run(
        "consume", queue_name, "--stream", "--concurrency", "2", "--max-items", "3", "-o", "json",
        "--", sys.executable, str(script), str(log),
    )  # fmt: skip

    # THEN every item ran once, pushed over the stream, the slow one kept its lease by renewals
    assert result.code == 0, result.err
    report = json.loads(result.out.splitlines()[-1])
    assert report["transport"] == "stream"
    assert (report["completed"], report["lost"], report["unsettled"]) == (3, 0, 0)
    assert report["renewed"] >= 1
    assert sorted(c["payload"] for c in _calls(log)) == ["ok", "ok", "sleep 2.5"]
    assert client.stats(queue_name).total == 0


def test_consume_renews_the_lease_while_the_command_runs(
    run: Run, client: Client, queue_name: str, tmp_path: Path
) -> None:
    # GIVEN a 1 s lease and a command that takes 2.5 s
    run("queues", "create", queue_name, "--lease-timeout", "1s")
    run("produce", queue_name, "sleep 2.5")
    script, log = tmp_path / "command.py", tmp_path / "calls.jsonl"
    script.write_text(COMMAND)

    result = run(
        "consume", queue_name, "--max-items", "1", "--wait", "200ms", "-o", "json",
        "--", sys.executable, str(script), str(log),
    )  # fmt: skip

    # THEN the item was completed by its one and only run, its lease renewed meanwhile
    assert result.code == 0, result.err
    report = json.loads(result.out.splitlines()[-1])
    assert (report["completed"], report["lost"]) == (1, 0)
    assert report["renewed"] >= 2
    assert [c["attempts"] for c in _calls(log)] == [1]
    assert client.stats(queue_name).total == 0


def test_consume_of_an_unknown_queue_or_command(run: Run, queue_name: str) -> None:
    missing = run("consume", f"{queue_name}-nope", "--", sys.executable, "-c", "pass")
    assert missing.code == ExitCode.BAD_REQUEST
    assert "Queue does not exist" in missing.err
    run("queues", "create", queue_name)
    no_command = run("consume", queue_name, "--", "no-such-command-querator")
    assert (no_command.code, no_command.err.strip()) == (
        ExitCode.ERROR,
        "querator consume: command not found: no-such-command-querator",
    )


def test_sigterm_stops_cleanly_puts_the_item_back_and_ends_the_command(
    served_url: str, client: Client, queue_name: str, tmp_path: Path
) -> None:
    # GIVEN a consumer whose command is in the middle of a long item
    client.create_queue(queue_name, lease_timeout="1m", expire_timeout="1h")
    client.produce(queue_name, ["long"])
    pid_file = tmp_path / "command.pid"
    command = (
        f"import os, sys, time; sys.stdin.read(); open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
        "time.sleep(60)"
    )
    consumer = subprocess.Popen(  # noqa: S603 - our own console script
        [
            str(Path(sys.executable).with_name("querator")), "consume", queue_name,
            "--url", served_url, "--wait", "200ms", "--shutdown-timeout", "500ms",
            "--", sys.executable, "-c", command,
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()):
            assert consumer.poll() is None, consumer.communicate()
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.05)
        command_pid = int(pid_file.read_text())

        # WHEN the consumer gets SIGTERM
        started = time.monotonic()
        consumer.send_signal(signal.SIGTERM)
        _, err = consumer.communicate(timeout=30)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.communicate()

    # THEN it exits 0 soon after the shutdown timeout, the item is back in the queue (not leased,
    # one attempt used) and the command is gone
    assert consumer.returncode == 0, err
    assert time.monotonic() - started < 15
    assert "querator consume: stopped (SIGTERM)" in err
    assert "1 put back" in err
    stats = client.stats(queue_name)
    assert (stats.total, stats.total_leased) == (1, 0)
    deadline = time.monotonic() + 10
    while _alive(command_pid):
        assert time.monotonic() < deadline, "the command outlived its consumer"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose: it no longer runs.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_a_command_option_without_the_double_dash_gets_a_hint(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["consume", "q", "sh", "-c", "cat"])
    err = capsys.readouterr().err
    assert exited.value.code == ExitCode.USAGE
    assert err.startswith("usage: querator consume ")
    assert "put COMMAND after '--': querator consume QUEUE [options] -- COMMAND [ARG...]" in err
