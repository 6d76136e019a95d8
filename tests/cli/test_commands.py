"""Every ``querator`` client command against ``querator serve``: output in both formats, the exit
codes scripts rely on, and the messages of the error paths (unknown queue, stale id, bad duration)."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING
from unittest import mock

import pytest

from querator.cli import main
from querator.cli.commands import _name_failures, _stored_items
from querator.cli.output import ExitCode, Progress, Waiting, table
from querator.client import Client, ItemNotLeasedError, QueueInfo, RequestFailedError

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.cli.conftest import Result

    Run = Callable[..., Result]

COMMANDS = [
    ["queues"],
    ["queues", "create"],
    ["queues", "list"],
    ["queues", "info"],
    ["queues", "update"],
    ["queues", "delete"],
    ["produce"],
    ["lease"],
    ["complete"],
    ["retry"],
    ["renew"],
    ["reprioritize"],
    ["stats"],
    ["watch"],
    ["dead-letters"],
    ["consume"],
    ["peek"],
    ["clear"],
    ["redrive"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*command, "--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0
    assert out.startswith(f"usage: querator {' '.join(command)}")
    if command != ["queues"]:
        assert "--url" in out
        assert "--output" in out
        assert "Exit codes" in out


def test_usage_errors_exit_2(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["lease"])
    assert exited.value.code == ExitCode.USAGE
    assert "QUEUE" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["stats", "q", "--output", "yaml"])
    assert exited.value.code == ExitCode.USAGE


# -- queues -------------------------------------------------------------------------------------------


def test_queues_create_info_list_update_delete(run: Run, queue_name: str) -> None:
    created = run(
        "queues", "create", queue_name, "--lease-timeout", "90s", "--max-attempts", "3", "-o", "json"
    )
    assert created.code == 0, created.err
    assert created.json()["lease_timeout"] == "1m30s"
    assert created.json()["expire_timeout"] == "24h0m0s"

    info = run("queues", "info", queue_name)
    assert info.code == 0
    assert "lease_timeout" in info.out and "1m30s" in info.out
    assert "max_attempts" in info.out

    listing = run("queues", "list", "--pivot", queue_name, "--limit", "1")
    assert listing.code == 0
    assert listing.out.splitlines()[0].split()[:3] == ["QUEUE", "LEASE", "EXPIRE"]
    assert queue_name in listing.out.splitlines()[2]
    listed = run("queues", "list", "--pivot", queue_name, "--limit", "1", "-o", "json").json()
    assert [q["queue_name"] for q in listed["items"]] == [queue_name]

    updated = run(
        "queues", "update", queue_name, "--reference", "billing", "--max-attempts", "5", "-o", "json"
    )
    assert updated.code == 0
    assert (updated.json()["reference"], updated.json()["max_attempts"]) == ("billing", 5)

    deleted = run("queues", "delete", queue_name)
    assert (deleted.code, deleted.out.strip()) == (0, f"deleted queue {queue_name}")
    gone = run("queues", "info", queue_name)
    assert gone.code == ExitCode.BAD_REQUEST
    assert "Queue does not exist" in gone.err


def test_unknown_queue_exits_3_with_the_servers_message(run: Run, queue_name: str) -> None:
    for argv in (["queues", "info", queue_name], ["stats", queue_name], ["produce", queue_name, "x"]):
        result = run(*argv)
        assert result.code == ExitCode.BAD_REQUEST, argv
        assert result.err.startswith(f"querator {argv[0] if argv[0] != 'queues' else 'queues info'}: ")
        assert f"400 Bad Request: Queue does not exist; queue '{queue_name}' does not exist" in result.err
        assert result.out == ""


def test_bad_duration_exits_3_naming_the_field(run: Run, queue_name: str) -> None:
    result = run("queues", "create", queue_name, "--lease-timeout", "5x")
    assert result.code == ExitCode.BAD_REQUEST
    assert "Invalid request; lease_timeout: invalid duration '5x'" in result.err


def test_a_taken_name_exits_3(run: Run, queue_name: str) -> None:
    assert run("queues", "create", queue_name).code == 0
    result = run("queues", "create", queue_name)
    assert result.code == ExitCode.BAD_REQUEST
    assert "Queue already exists" in result.err


def test_update_without_changes_is_a_usage_error(run: Run, queue_name: str) -> None:
    result = run("queues", "update", queue_name)
    assert result.code == ExitCode.USAGE
    assert "nothing to change" in result.err


def test_cannot_connect_exits_7_and_says_to_start_a_server(run: Run) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = run("stats", "q", "--url", f"http://127.0.0.1:{port}")
    assert result.code == ExitCode.CANNOT_CONNECT
    assert result.err.strip() == (
        f"querator stats: cannot connect to http://127.0.0.1:{port}: [Errno 111] Connection refused; is "
        "the server running? Start it with `querator serve` (`./run serve` in a clone of the "
        "repository), or point --url / $QUERATOR_URL at another one"
    )


def test_no_reply_within_the_timeout_says_how_to_wait_longer(run: Run) -> None:
    # GIVEN a server that accepts connections and never answers (a slow stats of a large queue)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        # WHEN a stats gives up after --timeout
        result = run("stats", "q", "--url", url, "--timeout", "0.3")
    # THEN it says so once (no silent resends) and how to wait longer
    assert result.code == ExitCode.CANNOT_CONNECT
    assert result.err.strip() == (
        f"querator stats: no reply from {url} within 0.3 s; the server may still be working on it "
        "(stats, clear and delete read the whole queue): wait longer with --timeout SECONDS, e.g. "
        "--timeout 300"
    )


# -- produce ------------------------------------------------------------------------------------------


def _payloads(client: Client, queue_name: str) -> list[bytes]:
    return [item.payload for item in client.iter_items(queue_name)]


def test_produce_from_arguments(run: Run, client: Client, queue_name: str) -> None:
    run("queues", "create", queue_name)
    result = run("produce", queue_name, "one", "two", "--reference", "r1", "-o", "json")
    assert result.code == 0
    assert result.json() == {"queue_name": queue_name, "produced": 2, "batches": 1}
    items = client.list_items(queue_name)
    assert [(i.payload, i.reference) for i in items] == [(b"one", "r1"), (b"two", "r1")]


def test_produce_from_stdin_lines_in_batches(run: Run, client: Client, queue_name: str) -> None:
    run("queues", "create", queue_name)
    result = run("produce", queue_name, "--batch-size", "2", stdin="a\nb\nc\n\nd\n")
    assert result.code == 0
    assert result.out.strip() == f"produced 5 item(s) to {queue_name} in 3 request(s)"
    # stderr is a pipe here: no progress.
    assert result.err == ""
    assert _payloads(client, queue_name) == [b"a", b"b", b"c", b"", b"d"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_produce_from_stdin_counts_on_a_terminal(
    served_url: str, queue_name: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.create_queue(queue_name, lease_timeout="1m", expire_timeout="1h")
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(f"{n}\n" for n in range(30))))
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["produce", queue_name, "--batch-size", "10", "--url", served_url]) == 0
    # The size of stdin is unknown: a count and a rate, no bar.
    assert f"\rproduce {queue_name}: 30 items " in terminal.getvalue()
    assert "[" not in terminal.getvalue()
    assert terminal.getvalue().endswith("\n")


def test_payloads_and_ids_may_come_after_the_options(run: Run, client: Client, queue_name: str) -> None:
    run("queues", "create", queue_name)
    result = run("produce", queue_name, "--reference", "r", "first", "second")
    assert result.code == 0, result.err
    assert [(i.payload, i.reference) for i in client.list_items(queue_name)] == [
        (b"first", "r"),
        (b"second", "r"),
    ]
    leased = _lease(run, queue_name, 2)["items"]
    assert isinstance(leased, list)
    done = run("complete", queue_name, "-p", "0", leased[0]["id"], "--output", "table", leased[1]["id"])
    assert done.code == 0, done.err
    assert client.stats(queue_name).total == 0


def test_an_unknown_option_shows_the_commands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["produce", "q", "--colour", "red", "x"], ["stats", "q", "extra"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        err = capsys.readouterr().err
        assert exited.value.code == ExitCode.USAGE
        assert err.startswith(f"usage: querator {argv[0]} "), err
        assert "unrecognized arguments" in err


def test_produce_from_a_jsonl_file(run: Run, client: Client, queue_name: str, tmp_path: Path) -> None:
    run("queues", "create", queue_name)
    source = tmp_path / "items.jsonl"
    source.write_text(
        '{"payload": "text", "reference": "r", "kind": "k"}\n'
        '{"bytes": "AP8="}\n'
        '"just a string"\n'
        "\n"
        '{"order": 7}\n'
    )
    result = run("produce", queue_name, "--file", str(source))
    assert result.code == 0, result.err
    items = client.list_items(queue_name)
    assert [i.payload for i in items] == [b"text", b"\x00\xff", b"just a string", b'{"order": 7}']
    assert (items[0].reference, items[0].kind) == ("r", "k")


def test_produce_from_a_csv_file(run: Run, client: Client, queue_name: str, tmp_path: Path) -> None:
    run("queues", "create", queue_name)
    with_payload = tmp_path / "with.csv"
    with_payload.write_text('payload,reference\nhello,r1\n"a,b",r2\n')
    assert run("produce", queue_name, "-f", str(with_payload)).code == 0
    rows = tmp_path / "rows.csv"
    rows.write_text("id,name\n1,ann\n")
    assert run("produce", queue_name, "-f", str(rows)).code == 0
    items = client.list_items(queue_name)
    assert [(i.payload, i.reference) for i in items] == [
        (b"hello", "r1"),
        (b"a,b", "r2"),
        (b'{"id": "1", "name": "ann"}', ""),
    ]


def test_produce_with_a_delay_schedules(run: Run, client: Client, queue_name: str) -> None:
    run("queues", "create", queue_name)
    assert run("produce", queue_name, "later", "--delay", "1h").code == 0
    stats = client.stats(queue_name)
    assert (stats.total, stats.scheduled) == (0, 1)


@pytest.mark.parametrize(
    ("argv", "stdin", "code", "message"),
    [
        (["--delay", "soon"], None, ExitCode.BAD_REQUEST, "--in: invalid duration 'soon'"),
        (["--file", "/nonexistent/items.txt"], None, ExitCode.ERROR, "cannot read /nonexistent/items.txt"),
        (["--format", "jsonl"], '{"payload": "ok"}\n{broken\n', ExitCode.BAD_REQUEST, "line 2: not JSON"),
        (["x", "--batch-size", "0"], None, ExitCode.USAGE, "--batch-size must be between 1 and 1000"),
        (["x", "--enqueue-at", "tomorrow"], None, ExitCode.BAD_REQUEST, "items[0].enqueue_at"),
    ],
    ids=["bad-delay", "missing-file", "bad-jsonl", "bad-batch-size", "bad-timestamp"],
)
def test_produce_errors(
    run: Run, queue_name: str, argv: list[str], stdin: str | None, code: int, message: str
) -> None:
    run("queues", "create", queue_name)
    result = run("produce", queue_name, *argv, stdin=stdin)
    assert result.code == code, result.err
    assert message in result.err


def test_progress_bar_draws_on_a_terminal_only() -> None:
    stream = io.StringIO()
    assert not Progress(100, label="p", stream=stream).enabled
    bar = Progress(100, label="produce q", stream=stream, force=True)
    bar.advance(50, 10)
    bar.advance(100, 20)
    bar.close()
    text = stream.getvalue()
    assert "produce q [###############---------------]  50.0% 10 items" in text
    assert " 100.0% 20 items" in text
    assert text.endswith("\n")


# -- lease, complete, retry, renew --------------------------------------------------------------------


def _lease(run: Run, queue_name: str, n: int = 1) -> dict[str, object]:
    result = run("lease", queue_name, "-n", str(n), "--wait", "1s", "-o", "json")
    assert result.code == 0, result.err
    body: dict[str, object] = result.json()
    return body


def test_lease_and_complete(run: Run, client: Client, queue_name: str) -> None:
    run("queues", "create", queue_name)
    run("produce", queue_name, "a", "b")
    lease = _lease(run, queue_name, 2)
    items = lease["items"]
    assert isinstance(items, list)
    assert [i["utf8"] for i in items] == ["a", "b"]
    assert all(i["attempts"] == 1 and i["lease_deadline"] for i in items)

    result = run("complete", queue_name, items[0]["id"], "--partition", str(lease["partition"]))
    assert (result.code, result.out.strip()) == (0, f"completed 1 item(s) of {queue_name}")
    # ids from stdin, as in `querator lease ... -o json | jq -r '.items[].id' | querator complete Q`
    assert run("complete", queue_name, stdin=items[1]["id"] + "\n").code == 0
    assert client.stats(queue_name).total == 0


def test_lease_table_output(run: Run, queue_name: str) -> None:
    run("queues", "create", queue_name)
    run("produce", queue_name, "hello")
    result = run("lease", queue_name, "--wait", "1s")
    assert result.code == 0
    lines = result.out.splitlines()
    assert lines[0] == f"queue {queue_name}, partition 0"
    assert lines[1].split() == ["ID", "ATTEMPTS", "PRIORITY", "GROUP", "LEASE", "DEADLINE", "PAYLOAD"]
    assert lines[3].split()[1:3] == ["1", "5"]
    assert lines[3].endswith("hello")


def test_nothing_to_lease_exits_4(run: Run, queue_name: str) -> None:
    run("queues", "create", queue_name)
    result = run("lease", queue_name, "--wait", "200ms", "-o", "json")
    assert result.code == ExitCode.TRY_AGAIN
    assert result.json()["items"] == []
    assert "nothing to lease" in result.err


def test_stale_id_exits_3_naming_it_and_the_others_apply(run: Run, client: Client, queue_name: str) -> None:
    run("queues", "create", queue_name)
    run("produce", queue_name, "a", "b")
    items = _lease(run, queue_name, 2)["items"]
    assert isinstance(items, list)
    stale = "0" * 30

    result = run("complete", queue_name, stale, items[0]["id"], items[1]["id"])

    assert result.code == ExitCode.BAD_REQUEST
    assert "Item id is unknown, stale or not leased" in result.err
    assert f"'{stale}'" in result.err
    assert client.stats(queue_name).total == 0

    for verb in ("retry", "renew"):
        again = run(verb, queue_name, items[0]["id"])
        assert again.code == ExitCode.BAD_REQUEST, verb
        assert items[0]["id"] in again.err


def test_a_partial_failure_lists_the_failed_ids_as_failed_and_counts_the_applied_ones(
    run: Run, client: Client, queue_name: str
) -> None:
    run("queues", "create", queue_name)
    run("produce", queue_name, "a", "b")
    good = [i["id"] for i in _lease(run, queue_name, 2)["items"]]
    bad = "0" * 30

    result = run("complete", queue_name, *good, bad)

    assert result.code == ExitCode.BAD_REQUEST
    assert result.err.rstrip() == (
        f"querator complete: 400 Bad Request: Item id is unknown, stale or not leased; 1 of 3 id(s) failed "
        f"and were not applied: '{bad}' (item is unknown, stale or not leased); the other 2 were applied"
    )
    assert client.stats(queue_name).total == 0


def test_renew_past_the_queues_expire_timeout_exits_3_and_keeps_the_lease(run: Run, queue_name: str) -> None:
    run("queues", "create", queue_name, "--lease-timeout", "30s", "--expire-timeout", "1h")
    run("produce", queue_name, "a")
    (item,) = _lease(run, queue_name, 1)["items"]

    result = run("renew", queue_name, item["id"], "--lease-timeout", "2562047h")

    assert result.code == ExitCode.BAD_REQUEST
    assert "lease_timeout may not be longer than the queue's expire_timeout" in result.err
    assert run("renew", queue_name, item["id"], "--lease-timeout", "1h").code == ExitCode.OK


def test_a_partial_failure_worded_by_an_older_server_reads_the_same() -> None:
    # Older servers said "N id(s) not applied, the others were: <failed ids>": the failed ids read
    # as the applied ones.
    old = "Item id is unknown, stale or not leased; 1 id(s) not applied, the others were: 'c' (gone)"
    error = ItemNotLeasedError(400, "Bad Request", old, failed_ids=("c",))

    _name_failures(error, ["a", "b", "c", "a"])

    assert error.message == (
        "Item id is unknown, stale or not leased; 1 of 3 id(s) failed and were not applied: 'c' (gone); "
        "the other 2 were applied"
    )
    every = ItemNotLeasedError(400, "Bad Request", old, failed_ids=("c",))
    _name_failures(every, ["c"])
    assert every.message.endswith("1 of 1 id(s) failed and were not applied: 'c' (gone); none was applied")


def test_complete_without_ids_is_a_usage_error(run: Run, queue_name: str) -> None:
    result = run("complete", queue_name, stdin="")
    assert (result.code, result.err.strip()) == (ExitCode.USAGE, "querator complete: no item ids given")


def test_retry_later_dead_and_renew(run: Run, client: Client, queue_name: str) -> None:
    dead_queue = f"{queue_name}-dead"
    run("queues", "create", dead_queue)
    run("queues", "create", queue_name, "--dead-queue", dead_queue, "--lease-timeout", "30s")
    run("produce", queue_name, "later", "dead", "renewed")
    later, dead, renewed = _lease(run, queue_name, 3)["items"]  # type: ignore[misc]

    assert run("retry", queue_name, later["id"], "--in", "1h").code == 0
    result = run("retry", queue_name, dead["id"], "--dead", "-o", "json")
    assert result.json()["dead-lettered"] == [dead["id"]]
    assert result.json()["dead_queue"] == dead_queue
    renewal = run("renew", queue_name, renewed["id"], "--lease-timeout", "10m", "-o", "json")
    assert renewal.code == 0
    assert renewal.json()["items"][0]["lease_deadline"] > renewed["lease_deadline"]
    table_renewal = run("renew", queue_name, renewed["id"])
    assert table_renewal.out.splitlines()[0].split() == ["ID", "LEASE", "DEADLINE"]

    stats = client.stats(queue_name)
    assert (stats.total, stats.total_leased, stats.scheduled) == (1, 1, 1)
    bad = run("retry", queue_name, renewed["id"], "--in", "1 hour")
    assert bad.code == ExitCode.BAD_REQUEST
    assert "--in: invalid duration" in bad.err

    letters = run("dead-letters", queue_name, "-o", "json")
    assert letters.code == 0
    body = letters.json()
    assert body["queue_name"] == dead_queue
    assert [(i["utf8"], i["source_id"]) for i in body["items"]] == [("dead", dead["id"])]
    listed = run("dead-letters", queue_name)
    assert listed.out.splitlines()[0] == f"dead-letter queue {dead_queue}: 1 item(s)"
    assert "dead" in listed.out.splitlines()[3]
    direct = run("dead-letters", dead_queue, "--direct", "-o", "json")
    assert len(direct.json()["items"]) == 1


def test_dead_letters_of_a_queue_without_one_exits_3(run: Run, queue_name: str) -> None:
    run("queues", "create", queue_name)
    result = run("dead-letters", queue_name)
    assert result.code == ExitCode.BAD_REQUEST
    assert "has no dead-letter queue" in result.err


def _dead_lettered(run: Run, queue_name: str, *payloads: str) -> str:
    dead_queue = f"{queue_name}-dead"
    run("queues", "create", dead_queue)
    run("queues", "create", queue_name, "--dead-queue", dead_queue)
    run("produce", queue_name, *payloads)
    leased = _lease(run, queue_name, len(payloads))
    for item in leased["items"]:  # type: ignore[attr-defined]
        retried = run("retry", queue_name, item["id"], "--dead", "--partition", str(leased["partition"]))
        assert retried.code == 0, retried.err
    return dead_queue


def test_redrive_moves_every_dead_letter_back_with_attempts_reset(
    run: Run, client: Client, queue_name: str
) -> None:
    dead_queue = _dead_lettered(run, queue_name, "one", "two", "three")

    result = run("redrive", dead_queue, "-o", "json")

    assert result.code == 0, result.err
    assert result.json() == {"queue_name": dead_queue, "moved": 3, "remaining": 0, "stranded": 0}
    back = run("peek", queue_name, "-o", "json").json()["items"]
    assert sorted(i["utf8"] for i in back) == ["one", "three", "two"]
    assert {i["attempts"] for i in back} == {0}
    assert client.stats(dead_queue).total == 0


def test_redrive_with_a_limit_a_rate_and_to_reports_what_remains(
    run: Run, client: Client, queue_name: str
) -> None:
    dead_queue = _dead_lettered(run, queue_name, "a", "b", "c")
    other = f"{queue_name}-other"
    run("queues", "create", other)

    result = run("redrive", dead_queue, "--to", other, "--limit", "2", "--rate", "1000")

    assert result.code == 0, result.err
    assert result.out.splitlines() == [f"moved 2 item(s) out of {dead_queue}", "1 item(s) remain"]
    assert client.stats(other).total == 2 and client.stats(queue_name).total == 0


def test_redrive_refusals_exit_3_and_move_nothing(run: Run, client: Client, queue_name: str) -> None:
    dead_queue = _dead_lettered(run, queue_name, "a")

    into_itself = run("redrive", dead_queue, "--to", dead_queue)
    not_a_dead_letter_queue = run("redrive", queue_name)
    unknown = run("redrive", dead_queue, "--to", f"{queue_name}-nope")

    assert [r.code for r in (into_itself, not_a_dead_letter_queue, unknown)] == [ExitCode.BAD_REQUEST] * 3
    assert "not the dead_queue of any queue" in not_a_dead_letter_queue.err
    assert "does not exist" in unknown.err
    assert client.stats(dead_queue).total == 1
    assert run("redrive", dead_queue, "--limit", "0").code == ExitCode.USAGE


def test_redrive_draws_a_progress_bar_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    from querator.cli import commands  # noqa: PLC0415
    from querator.client import Redriven  # noqa: PLC0415

    class _Stats:
        partitions = (type("P", (), {"total": 5, "scheduled": 0})(),)

    class _Client:
        def __enter__(self) -> _Client:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def stats(self, name: str) -> _Stats:
            return _Stats()

        def redrive_all(self, name: str, **kw: object) -> list[Redriven]:
            return [Redriven(moved=3, remaining=2, stranded=0), Redriven(moved=2, remaining=0, stranded=0)]

    drawn = io.StringIO()
    real = Progress
    monkeypatch.setattr(commands, "make_client", lambda args: _Client())
    monkeypatch.setattr(
        commands, "Progress", lambda total, label: real(total, label=label, stream=drawn, force=True)
    )

    assert main(["redrive", "dlq"]) == 0
    assert "redrive dlq [" in drawn.getvalue() and "100.0% 5 items" in drawn.getvalue()


# -- stats and watch ----------------------------------------------------------------------------------


def test_stats_table_and_json(run: Run, queue_name: str) -> None:
    run("queues", "create", queue_name, "--partitions", "2")
    run("produce", queue_name, "a", "b")
    run("produce", queue_name, "c")
    _lease(run, queue_name, 1)

    result = run("stats", queue_name)
    lines = result.out.splitlines()
    assert lines[0].split() == [
        "PARTITION",
        "ITEMS",
        "LEASED",
        "SCHEDULED",
        "AVG",
        "AGE",
        "AVG",
        "LEASED",
        "AGE",
    ]
    assert len(lines) == 2 + 2 + 1
    assert lines[-1].split()[:4] == ["all", "3", "1", "0"]

    body = run("stats", queue_name, "-o", "json").json()
    assert (body["total"], body["total_leased"], body["scheduled"]) == (3, 1, 0)
    assert [p["partition"] for p in body["partitions"]] == [0, 1]
    assert all(p["average_age"].endswith("s") for p in body["partitions"])


def test_watch_refreshes_count_times(run: Run, queue_name: str) -> None:
    run("queues", "create", queue_name)
    result = run("watch", queue_name, "--interval", "100ms", "--count", "2")
    assert result.code == 0
    assert result.out.count(f"{queue_name} at ") == 2
    assert result.out.count("PARTITION") == 2
    as_json = run("watch", queue_name, "--interval", "100ms", "--count", "2", "-o", "json")
    assert [json.loads(line)["total"] for line in as_json.out.splitlines()] == [0, 0]
    bad = run("watch", queue_name, "--interval", "often")
    assert bad.code == ExitCode.BAD_REQUEST


def test_table_aligns_columns_and_right_aligns_numbers() -> None:
    assert table(["NAME", "N"], [["a", 1], ["bbb", 22]]).splitlines() == [
        "NAME   N",
        "----  --",
        "a      1",
        "bbb   22",
    ]


# -- the console script -------------------------------------------------------------------------------


def test_the_console_script_exit_codes(served_url: str, queue_name: str) -> None:
    script = Path(sys.executable).with_name("querator")
    env = {**os.environ, "QUERATOR_URL": served_url}

    def querator(*argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: S603 - our own console script
            [str(script), *argv],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )

    assert querator("queues", "create", queue_name).returncode == 0
    assert querator("produce", queue_name, stdin="x\ny\n").returncode == 0
    leased = querator("lease", queue_name, "-n", "5", "-o", "json")
    assert leased.returncode == 0
    ids = "\n".join(item["id"] for item in json.loads(leased.stdout)["items"])
    assert querator("complete", queue_name, "-", stdin=ids).returncode == 0
    empty = querator("lease", queue_name, "--wait", "100ms")
    assert (empty.returncode, empty.stdout) == (ExitCode.TRY_AGAIN, "")
    unknown = querator("stats", f"{queue_name}-nope")
    assert unknown.returncode == ExitCode.BAD_REQUEST
    assert "Queue does not exist" in unknown.stderr


# -- messages that say what happened ------------------------------------------------------------------


def test_retry_dead_on_a_queue_without_a_dead_letter_queue_does_nothing_and_exits_3(
    run: Run, client: Client, queue_name: str
) -> None:
    run("queues", "create", queue_name)
    run("produce", queue_name, "keep me")
    leased = _lease(run, queue_name)["items"]
    assert isinstance(leased, list)

    result = run("retry", queue_name, leased[0]["id"], "--dead")

    assert result.code == ExitCode.BAD_REQUEST
    assert result.out == ""
    assert result.err.startswith(
        f"querator retry: queue '{queue_name}' has no dead-letter queue, so --dead would delete the "
        "item(s); nothing was done."
    )
    stats = client.stats(queue_name)
    assert (stats.total, stats.total_leased) == (1, 1)


def test_retry_dead_names_the_dead_letter_queue(run: Run, queue_name: str) -> None:
    run("queues", "create", f"{queue_name}-dlq")
    run("queues", "create", queue_name, "--dead-queue", f"{queue_name}-dlq")
    run("produce", queue_name, "x")
    leased = _lease(run, queue_name)["items"]
    assert isinstance(leased, list)
    result = run("retry", queue_name, leased[0]["id"], "--dead")
    assert (result.code, result.out.strip()) == (
        0,
        f"dead-lettered 1 item(s) of {queue_name} to {queue_name}-dlq",
    )


def test_ids_of_another_partition_without_p_get_a_hint(run: Run, client: Client, queue_name: str) -> None:
    # GIVEN a lease from partition 1 of a two-partition queue
    run("queues", "create", queue_name, "--partitions", "2")
    run("produce", queue_name, "a")
    run("produce", queue_name, "b")
    leases = [_lease(run, queue_name), _lease(run, queue_name)]
    lease = next(lease for lease in leases if lease["partition"] == 1)
    items = lease["items"]
    assert isinstance(items, list)
    # WHEN its ids go to complete without -p
    result = run("complete", queue_name, items[0]["id"])
    # THEN the message says which partition they were sent for and what to do
    assert result.code == ExitCode.BAD_REQUEST
    assert result.err.rstrip().endswith(
        f"; {queue_name} has 2 partitions and these ids were sent for partition 0: give the lease's "
        "partition with -p (querator lease prints it)"
    )
    assert run("complete", queue_name, items[0]["id"], "-p", "1").code == 0


def test_waiting_is_drawn_on_a_terminal_only_and_erased() -> None:
    quiet = io.StringIO()
    with Waiting("deleting q", stream=quiet):
        pass
    assert quiet.getvalue() == ""
    terminal = io.StringIO()
    with Waiting("deleting q", stream=terminal, force=True):
        # Nothing in the first second; then the elapsed time.
        deadline = time.monotonic() + 5
        while "deleting q… 1 s" not in terminal.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
    text = terminal.getvalue()
    assert text.startswith("\rdeleting q… 1 s (Ctrl-C to stop waiting)")
    assert text.endswith("\r")


# -- peek, clear, depth, dead-letters --limit ---------------------------------------------------------


def test_peek_shows_items_without_leasing_them(run: Run, client: Client, queue_name: str) -> None:
    run("queues", "create", queue_name)
    run("produce", queue_name, "one", "two", "three")
    _lease(run, queue_name)

    result = run("peek", queue_name, "-n", "2")

    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0] == f"{queue_name}: first 2 item(s)"
    assert lines[1].split()[:5] == ["PARTITION", "ID", "LEASED", "ATTEMPTS", "PRIORITY"]
    assert lines[3].split()[2:5] == ["yes", "1", "5"] and lines[3].endswith("one")
    assert lines[4].split()[2:5] == ["no", "0", "5"] and lines[4].endswith("two")
    body = run("peek", queue_name, "-o", "json").json()
    assert [(i["utf8"], i["is_leased"], i["partition"]) for i in body["items"]] == [
        ("one", True, 0),
        ("two", False, 0),
        ("three", False, 0),
    ]
    stats = client.stats(queue_name)
    assert (stats.total, stats.total_leased) == (3, 1)
    scheduled = run("peek", queue_name, "--scheduled", "-o", "json").json()
    assert scheduled["items"] == []


def test_clear_removes_waiting_items_then_everything(run: Run, client: Client, queue_name: str) -> None:
    run("queues", "create", queue_name)
    run("produce", queue_name, "leased", "waiting-1", "waiting-2")
    run("produce", queue_name, "later", "--delay", "1h")
    _lease(run, queue_name)

    result = run("clear", queue_name)

    assert (result.code, result.out.strip()) == (0, f"cleared the waiting items of {queue_name}")
    stats = client.stats(queue_name)
    assert (stats.total, stats.total_leased, stats.scheduled) == (1, 1, 1)
    everything = run("clear", queue_name, "--all")
    assert everything.out.strip() == f"cleared the waiting, scheduled, leased items of {queue_name}"
    stats = client.stats(queue_name)
    assert (stats.total, stats.total_leased, stats.scheduled) == (0, 0, 0)
    assert run("clear", f"{queue_name}-nope").code == ExitCode.BAD_REQUEST


def test_queues_list_depth(run: Run, queue_name: str) -> None:
    run("queues", "create", queue_name)
    run("produce", queue_name, "a", "b")
    _lease(run, queue_name)
    result = run("queues", "list", "--pivot", queue_name, "--limit", "1", "--depth")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].split()[:4] == ["QUEUE", "ITEMS", "LEASED", "SCHEDULED"]
    assert lines[2].split()[:4] == [queue_name, "2", "1", "0"]
    listed = run("queues", "list", "--pivot", queue_name, "--limit", "1", "--depth", "-o", "json").json()
    assert [(q["total"], q["total_leased"], q["scheduled"]) for q in listed["items"]] == [(2, 1, 0)]


class _CountingClient:
    """Records which partitions were read and with what page size."""

    def __init__(self) -> None:
        self.reads: list[tuple[int, int]] = []

    def iter_items(self, queue_name: str, *, partition: int, scheduled: bool, page_size: int):
        self.reads.append((partition, page_size))
        yield from (f"{partition}-{n}" for n in range(5))


def test_a_listing_limit_stops_reading_every_partition() -> None:
    info = QueueInfo.from_wire({"queue_name": "q", "requested_partitions": 4})
    fake = _CountingClient()
    items = _stored_items(fake, info, limit=2)  # type: ignore[arg-type]
    assert items == [(0, "0-0"), (0, "0-1")]
    # Partitions 1-3 are never asked for, and no page is bigger than the limit.
    assert fake.reads == [(0, 2)]


def test_queues_delete_of_a_queue_left_to_the_reaper_says_so_and_succeeds(
    run: Run, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server answers 453 when the call ran out of time and the reaper removes the rest.
    refusal = RequestFailedError(
        453, "Request Failed", f"Queue is being deleted; queue '{queue_name}' is being deleted: ..."
    )
    monkeypatch.setattr(Client, "delete_queue", mock.Mock(side_effect=refusal))

    text = run("queues", "delete", queue_name)
    as_json = run("queues", "delete", queue_name, "-o", "json")

    assert (text.code, text.out.strip()) == (
        0,
        f"deleting queue {queue_name}: the reaper removes the rest of its items",
    )
    assert (as_json.code, as_json.json()) == (0, {"deleting": queue_name})
    other = RequestFailedError(453, "Request Failed", "Dead-letter queue does not exist; ...")
    monkeypatch.setattr(Client, "delete_queue", mock.Mock(side_effect=other))
    assert run("queues", "delete", queue_name).code != 0
