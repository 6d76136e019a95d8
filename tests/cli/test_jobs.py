"""What a new user of the CLI met (issue 34): groups in the tables, relative delays sent as such,
negative durations reaching the command, a produce refusal naming its input line, durations a person
reads, ``--version``, and the server's "did you mean"."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest

from querator.cli import main
from querator.cli.output import ExitCode, human_duration

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from querator.client import Client
    from tests.cli.conftest import Result

    Run = Callable[..., Result]


def _columns(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def test_lease_and_peek_show_each_items_group(run: Run, queue_name: str) -> None:
    run("queues", "create", queue_name)
    run("produce", queue_name, "a", "--group", "acme")
    run("produce", queue_name, "b")

    peek = run("peek", queue_name).out.splitlines()
    leased = run("lease", queue_name, "-n", "2", "--wait", "1s").out.splitlines()

    assert _columns(peek[1])[5] == "GROUP"
    assert _columns(peek[3])[5] == "acme" and "acme" not in peek[4]
    assert _columns(leased[1])[3] == "GROUP"
    assert _columns(leased[3])[3] == "acme"
    assert "acme" not in leased[4]


def test_produce_in_and_retry_in_are_counted_from_the_server_clock(
    run: Run, client: Client, queue_name: str, tmp_path: Path
) -> None:
    run("queues", "create", queue_name)
    before = datetime.now(UTC)
    assert run("produce", queue_name, "later", "--in", "5m").code == 0
    lines = tmp_path / "items.jsonl"
    lines.write_text('{"payload": "own", "enqueue_in": "10m"}\n')
    assert run("produce", queue_name, "--file", str(lines), "--in", "1h").code == 0
    run("produce", queue_name, "now")
    held = client.lease(queue_name, 1)
    assert run("retry", queue_name, held.ids[0], "--in", "15m").code == 0
    after = datetime.now(UTC)

    scheduled = {i.payload: i.enqueue_at for i in client.list_scheduled(queue_name)}
    for payload, minutes in ((b"later", 5), (b"own", 10), (b"now", 15)):
        at = scheduled[payload]
        assert at is not None
        assert before + timedelta(minutes=minutes) <= at <= after + timedelta(minutes=minutes)


@pytest.mark.parametrize(
    "argv",
    [
        ["retry", "{q}", "some-id", "--in", "-5s"],
        ["produce", "{q}", "x", "--in", "-5s"],
    ],
    ids=["retry", "produce"],
)
def test_a_negative_delay_reaches_the_command_and_is_refused(
    run: Run, queue_name: str, argv: list[str]
) -> None:
    run("queues", "create", queue_name)
    result = run(*[a.format(q=queue_name) for a in argv])
    assert result.code == ExitCode.BAD_REQUEST, result.err
    assert "--in: must not be negative, not '-5s'" in result.err


def test_a_negative_lease_timeout_is_the_servers_to_refuse_not_argparses(run: Run, queue_name: str) -> None:
    result = run("queues", "create", queue_name, "--lease-timeout", "-5s")
    assert "expected one argument" not in result.err
    assert result.code == ExitCode.BAD_REQUEST
    assert "lease_timeout" in result.err


def test_a_refused_item_names_its_input_line(run: Run, queue_name: str) -> None:
    run("queues", "create", queue_name)
    stdin = "ok\nok\n" + "x" * 1_048_577 + "\nok\n"
    result = run("produce", queue_name, "--batch-size", "2", stdin=stdin)
    assert result.code == ExitCode.BAD_REQUEST
    assert result.err.startswith("querator produce: line 3: 400 Bad Request: ")
    assert "items[0]: item payload is larger than 1048576 bytes" in result.err
    assert "(2 item(s) before it were produced)" in result.err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert re.fullmatch(r"querator \d+\.\d+\.\d+\S*\n", capsys.readouterr().out)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (timedelta(minutes=1), "1m"),
        (timedelta(seconds=18.666667), "18.7s"),
        (timedelta(seconds=90), "1m30s"),
        (timedelta(hours=24), "24h"),
        (timedelta(hours=1, seconds=5), "1h5s"),
        (timedelta(milliseconds=250), "250ms"),
        (timedelta(microseconds=999_960), "1s"),
        (timedelta(seconds=59.96), "1m"),
        (timedelta(0), "0s"),
        (timedelta(seconds=-30), "-30s"),
    ],
)
def test_tables_show_durations_as_people_read_them(value: timedelta, shown: str) -> None:
    assert human_duration(value) == shown


def test_queue_tables_show_human_durations_and_json_the_wire_form(run: Run, queue_name: str) -> None:
    run("queues", "create", queue_name, "--lease-timeout", "1m", "--expire-timeout", "24h")
    table = run("queues", "info", queue_name).out
    assert "1m0s" not in table and "24h0m0s" not in table
    assert re.search(r"\b1m\b", table) and re.search(r"\b24h\b", table)
    assert run("queues", "info", queue_name, "-o", "json").json()["lease_timeout"] == "1m0s"


def _post(url: str, body: object) -> tuple[int, str]:
    request = urllib.request.Request(  # noqa: S310 - the test server, http://127.0.0.1
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:  # noqa: S310 - as above
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def test_a_misspelt_key_or_path_gets_a_did_you_mean(served_url: str) -> None:
    status, body = _post(f"{served_url}/v1/queues.list", {"limt": 5})
    assert status == 455
    assert json.loads(body)["message"].endswith("limt: unknown key; did you mean 'limit'")

    status, body = _post(f"{served_url}/v1/queue.list", {})
    assert status == 501
    assert json.loads(body)["message"].endswith(
        "no such method: POST /v1/queue.list; did you mean /v1/queues.list"
    )
