"""``--group`` of ``querator produce`` (and a line's own group) against ``querator serve``: the
group reaches the server and comes back on lease; a bad one is refused before anything is sent."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from querator.cli import main
from querator.cli.output import ExitCode

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from querator.client import Client
    from tests.cli.conftest import Result

    Run = Callable[..., Result]


def test_produce_group_from_the_option_and_from_each_line(
    run: Run, client: Client, queue_name: str, tmp_path: Path
) -> None:
    run("queues", "create", queue_name)
    assert run("produce", queue_name, "a", "--group", "acme").code == 0
    lines = tmp_path / "items.jsonl"
    lines.write_text('{"payload": "b", "group": "globex"}\n{"payload": "c"}\n')
    produced = run("produce", queue_name, "--file", str(lines), "--group", "initech")
    assert produced.code == 0, produced.err

    leased = run("lease", queue_name, "-n", "10", "--wait", "1s", "-o", "json")

    assert leased.code == 0, leased.err
    assert [(i["utf8"], i["group"]) for i in leased.json()["items"]] == [
        ("a", "acme"),
        ("b", "globex"),
        ("c", "initech"),
    ]
    assert [i.group for i in client.list_items(queue_name)] == ["acme", "globex", "initech"]


def test_a_bad_group_is_a_usage_error_and_sends_nothing(
    capsys: pytest.CaptureFixture[str], client: Client, queue_name: str, served_url: str
) -> None:
    client.create_queue(queue_name, lease_timeout="30s", expire_timeout="1h")
    with pytest.raises(SystemExit) as exited:
        main(["produce", "--url", served_url, queue_name, "x", "--group", "g" * 129])

    assert exited.value.code == ExitCode.USAGE
    assert "group" in capsys.readouterr().err
    assert client.list_items(queue_name) == []


def test_a_bad_group_on_a_line_stops_before_that_batch(
    run: Run, client: Client, queue_name: str, tmp_path: Path
) -> None:
    run("queues", "create", queue_name)
    lines = tmp_path / "items.jsonl"
    lines.write_text('{"payload": "b", "group": "line\\nbreak"}\n')

    result = run("produce", queue_name, "--file", str(lines))

    assert result.code == ExitCode.BAD_REQUEST
    assert "group" in result.err
    assert client.list_items(queue_name) == []
