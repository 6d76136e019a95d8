"""Failure reasons in the CLI against ``querator serve``: ``retry --reason`` (refused when too long or
on two lines, before anything is sent), the FAILURES and LAST REASON columns of ``lease`` and ``peek``
(only when an item failed) and ``dead-letters`` (always, with the SOURCE QUEUE), the JSON output, and
``consume`` sending each failed command's exit status and the end of its stderr."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from querator.cli import main
from querator.cli.consume import STDERR_TAIL_BYTES, StderrTail, failure_text
from querator.cli.output import ExitCode
from querator.client import MAX_REASON_BYTES

if TYPE_CHECKING:
    from collections.abc import Callable

    from querator.client import Client
    from tests.cli.conftest import Result

    Run = Callable[..., Result]

pytestmark = pytest.mark.server


def _lease(run: Run, queue: str, batch: int = 1) -> dict:  # type: ignore[type-arg]
    result = run("lease", queue, "-n", str(batch), "--wait", "1s", "-o", "json")
    assert result.code == 0, result.err
    body: dict = result.json()  # type: ignore[type-arg]
    return body


def _columns(line: str) -> list[str]:
    return line.split()


def test_retry_reason_shows_in_lease_peek_and_dead_letters(run: Run, queue_name: str) -> None:
    dead_queue = f"{queue_name}-dead"
    run("queues", "create", dead_queue)
    run("queues", "create", queue_name, "--dead-queue", dead_queue, "--max-attempts", "2")
    run("produce", queue_name, "flaky", "fine")

    # Nothing failed yet: the tables are as narrow as they were.
    assert "LAST REASON" not in run("peek", queue_name).out
    first = _lease(run, queue_name)["items"][0]
    result = run("retry", queue_name, first["id"], "--reason", "TimeoutError: db did not answer")
    assert (result.code, result.out.strip()) == (0, f"retried 1 item(s) of {queue_name}")

    peek = run("peek", queue_name).out.splitlines()
    assert _columns(peek[1])[-4:] == ["PAYLOAD", "FAILURES", "LAST", "REASON"]
    flaky = next(line for line in peek[3:] if "flaky" in line)
    fine = next(line for line in peek[3:] if "fine" in line)
    assert flaky.split("flaky", 1)[1].split() == ["1", "TimeoutError:", "db", "did", "not", "answer"]
    assert fine.split()[-2:] == ["fine", "0"]  # a count of 0, no reason
    table = run("lease", queue_name, "-n", "2", "--wait", "1s")
    lines = table.out.splitlines()
    assert _columns(lines[1])[-4:] == ["PAYLOAD", "FAILURES", "LAST", "REASON"]
    leased = next(line for line in lines[3:] if "flaky" in line)
    assert leased.split("flaky", 1)[1].split() == ["1", "TimeoutError:", "db", "did", "not", "answer"]
    partition = lines[0].rsplit(" ", 1)[1]
    run("retry", queue_name, leased.split()[0], "-p", partition, "--reason", "ValueError: bad input")

    letters = run("dead-letters", queue_name)
    assert letters.code == 0, letters.err
    header, _, row = letters.out.splitlines()[1:4]
    assert _columns(header) == [
        "PARTITION", "ID", "SOURCE", "QUEUE", "SOURCE", "ID", "ATTEMPTS", "FAILURES", "PRIORITY",
        "CREATED", "REFERENCE", "PAYLOAD", "LAST", "REASON",
    ]  # fmt: skip
    assert _columns(row)[2] == queue_name and _columns(row)[5] == "2"
    assert row.split("flaky", 1)[1].split() == ["max", "attempts:", "ValueError:", "bad", "input"]
    body = run("dead-letters", queue_name, "-o", "json").json()
    [item] = body["items"]
    assert (item["source_queue"], item["last_reason"], item["failures"]) == (
        queue_name,
        "max attempts: ValueError: bad input",
        2,
    )


def test_a_long_reason_is_cut_in_the_table_and_whole_in_json(run: Run, queue_name: str) -> None:
    run("queues", "create", queue_name)
    run("produce", queue_name, "x")
    item = _lease(run, queue_name)["items"][0]
    reason = "RuntimeError: " + "w" * 200
    run("retry", queue_name, item["id"], "--reason", reason)

    row = run("peek", queue_name).out.splitlines()[3]

    assert row.endswith("RuntimeError: " + "w" * 45 + "…")
    assert run("peek", queue_name, "-o", "json").json()["items"][0]["last_reason"] == reason
    leased = _lease(run, queue_name)["items"][0]
    assert (leased["last_reason"], leased["failures"]) == (reason, 1)


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("x" * (MAX_REASON_BYTES + 1), "reason is longer than 1024 bytes of UTF-8 (1025)"),
        ("two\nlines", "reason may not hold control characters or line breaks"),
    ],
)
def test_a_bad_reason_is_a_usage_error_and_nothing_is_retried(
    run: Run, client: Client, queue_name: str, capsys: pytest.CaptureFixture[str], reason: str, message: str
) -> None:
    run("queues", "create", queue_name)
    run("produce", queue_name, "x")
    item = _lease(run, queue_name)["items"][0]
    capsys.readouterr()

    with pytest.raises(SystemExit) as exited:
        main(["retry", queue_name, item["id"], "--reason", reason])

    assert exited.value.code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "--reason" in err and message in err
    assert client.stats(queue_name).total_leased == 1


#: Fails its first attempt with a traceback on stderr, its second by a signal, then dead-letters.
FAILING = """
import os, signal, sys
attempts = int(os.environ["QUERATOR_ITEM_ATTEMPTS"])
if attempts == 1:
    print("Traceback (most recent call last):", file=sys.stderr)
    print("  File \\"job.py\\", line 3, in <module>", file=sys.stderr)
    print("KeyError: 'sku'", file=sys.stderr)
    sys.exit(3)
if attempts == 2:
    os.kill(os.getpid(), signal.SIGKILL)
print("giving up on", sys.stdin.read(), file=sys.stderr)
sys.exit(42)
"""


def test_consume_sends_the_exit_status_and_the_end_of_stderr_as_the_reason(
    run: Run, client: Client, queue_name: str, tmp_path: Path
) -> None:
    dead_queue = f"{queue_name}-dead"
    run("queues", "create", dead_queue)
    run("queues", "create", queue_name, "--dead-queue", dead_queue, "--max-attempts", "5")
    run("produce", queue_name, "order-7")
    script = tmp_path / "job.py"
    script.write_text(FAILING)

    result = run(
        "consume", queue_name, "--idle", "1s", "--wait", "200ms", "--backoff", "10ms",
        "--dead-letter-exit", "42", "--", sys.executable, str(script),
    )  # fmt: skip

    assert result.code == 0, result.err
    assert "3 leased, 0 completed, 2 retried, 1 dead-lettered" in result.err
    program = Path(sys.executable).name
    [dead] = client.list_items(dead_queue)
    assert (dead.last_reason, dead.failures) == (f"{program} exited 42: giving up on order-7", 3)


def test_consume_records_each_failed_attempts_reason(
    run: Run, client: Client, queue_name: str, tmp_path: Path
) -> None:
    run("queues", "create", queue_name, "--max-attempts", "5")
    run("produce", queue_name, "order-7")
    script = tmp_path / "job.py"
    script.write_text(FAILING)
    program = Path(sys.executable).name

    once = ("consume", queue_name, "--max-items", "1", "--wait", "5s", "--backoff", "0s", "--")
    run(*once, sys.executable, str(script))
    [first] = client.list_items(queue_name)
    run(*once, sys.executable, str(script))
    [second] = client.list_items(queue_name)

    assert (first.last_reason, first.failures) == (
        f'{program} exited 3: Traceback (most recent call last): File "job.py", line 3, in <module>'
        " KeyError: 'sku'",
        1,
    )
    assert (second.last_reason, second.failures) == (f"{program} was killed by SIGKILL", 2)


def test_the_stderr_tail_passes_everything_through_and_keeps_the_end() -> None:
    source_read, source_write = os.pipe()
    out_read, out_write = os.pipe()
    tail = StderrTail(source_read, out=out_write)
    written = b"".join(f"line {n}\n".encode() for n in range(2000))
    os.write(source_write, written[:30000])
    os.write(source_write, written[30000:])
    os.close(source_write)

    kept = tail.tail(5)

    os.close(out_write)
    copied = b""
    while chunk := os.read(out_read, 65536):
        copied += chunk
    os.close(out_read)
    assert copied == written
    assert written.endswith(kept) and STDERR_TAIL_BYTES <= len(kept) < STDERR_TAIL_BYTES + 65536


def test_failure_text_keeps_the_status_and_the_end_of_a_long_stderr() -> None:
    assert failure_text("job", 3, b"") == "job exited 3"
    assert failure_text("job", -9, b"") == "job was killed by SIGKILL"
    assert failure_text("job", 1, b"line one\nline two\n") == "job exited 1: line one line two"
    long = failure_text("job", 1, b"start " + b"x" * 5000 + b" the very end\n")
    assert long.startswith("job exited 1: \u2026") and long.endswith(" the very end")
    assert len(long.encode()) <= MAX_REASON_BYTES
    assert failure_text("job", 1, b"\xff\xfe bad bytes") == "job exited 1: \ufffd\ufffd bad bytes"
