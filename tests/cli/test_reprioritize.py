"""``querator reprioritize`` against ``querator serve``: a waiting item moves to its new priority under
a new id (printed), a scheduled one keeps its time, a leased one keeps its id and lease; an unknown id
exits 3 naming it while the others apply; a bad or missing ``--priority`` is a usage error that
changes nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from querator.cli import main
from querator.cli.output import ExitCode

if TYPE_CHECKING:
    from collections.abc import Callable

    from querator.client import Client
    from tests.cli.conftest import Result

    Run = Callable[..., Result]

UNKNOWN = "0" * 30


def _lease(run: Run, queue_name: str, n: int) -> dict[str, Any]:
    result = run("lease", queue_name, "-n", str(n), "--wait", "1s", "-o", "json")
    assert result.code == 0, result.err
    body: dict[str, Any] = result.json()
    return body


def _peek(run: Run, queue_name: str, *options: str) -> list[dict[str, Any]]:
    result = run("peek", queue_name, "-o", "json", *options)
    assert result.code == 0, result.err
    items: list[dict[str, Any]] = result.json()["items"]
    return items


def test_a_waiting_item_gets_a_new_id_and_leases_first(run: Run, queue_name: str) -> None:
    run("queues", "create", queue_name)
    run("produce", queue_name, "a", "b", "c")
    old = {i["utf8"]: i["id"] for i in _peek(run, queue_name)}

    result = run("reprioritize", queue_name, old["c"], "--priority", "0")

    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].split() == ["ID", "NEW", "ID"]
    assert len(lines) == 3
    shown_old, new_id = lines[2].split()
    assert shown_old == old["c"]
    assert new_id != old["c"] and new_id.startswith(".0")
    leased = _lease(run, queue_name, 3)["items"]
    assert [(i["utf8"], i["priority"]) for i in leased] == [("c", 0), ("a", 5), ("b", 5)]
    assert leased[0]["id"] == new_id


def test_json_output_ids_from_stdin_and_a_scheduled_item_keeps_its_time(
    run: Run, client: Client, queue_name: str
) -> None:
    run("queues", "create", queue_name)
    run("produce", queue_name, "now")
    run("produce", queue_name, "later", "--delay", "1h")
    waiting = _peek(run, queue_name)[0]
    scheduled = _peek(run, queue_name, "--scheduled")[0]

    result = run(
        "reprioritize", queue_name, "-p", "0", "--priority", "8", "-o", "json",
        stdin=f"{waiting['id']}\n{scheduled['id']}\n",
    )  # fmt: skip

    assert result.code == 0, result.err
    body = result.json()
    assert (body["queue_name"], body["partition"]) == (queue_name, 0)
    assert [i["id"] for i in body["items"]] == [waiting["id"], scheduled["id"]]
    assert all(i["new_id"].startswith("p8") for i in body["items"])
    [moved] = _peek(run, queue_name, "--scheduled")
    assert (moved["id"], moved["priority"]) == (body["items"][1]["new_id"], 8)
    assert moved["enqueue_at"] == scheduled["enqueue_at"]
    assert [(i.payload, i.priority) for i in client.list_items(queue_name)] == [(b"now", 8)]


def test_a_leased_item_keeps_its_id_and_lease_and_comes_back_with_the_priority(
    run: Run, client: Client, queue_name: str
) -> None:
    run("queues", "create", queue_name)
    run("produce", queue_name, "first", "second")
    lease = _lease(run, queue_name, 1)
    item = lease["items"][0]

    result = run(
        "reprioritize", queue_name, item["id"], "-p", str(lease["partition"]), "--priority", "1", "-o", "json"
    )

    assert result.code == 0, result.err
    assert result.json()["items"] == [{"id": item["id"], "new_id": item["id"]}]
    stats = client.stats(queue_name)
    assert (stats.total, stats.total_leased) == (2, 1)
    assert run("renew", queue_name, item["id"]).code == 0  # still its lease
    assert run("retry", queue_name, item["id"]).code == 0
    again = _lease(run, queue_name, 2)["items"]
    assert [(i["utf8"], i["priority"]) for i in again] == [("first", 1), ("second", 5)]


def test_an_unknown_id_exits_3_naming_it_and_the_others_apply(run: Run, queue_name: str) -> None:
    run("queues", "create", queue_name)
    run("produce", queue_name, "a", "b")
    _, second = _peek(run, queue_name)

    result = run("reprioritize", queue_name, UNKNOWN, second["id"], "--priority", "2")

    assert result.code == ExitCode.BAD_REQUEST
    assert result.out == ""
    assert result.err.startswith("querator reprioritize: 400 Bad Request: Item id is unknown")
    assert f"'{UNKNOWN}'" in result.err
    assert f"'{second['id']}'" not in result.err
    assert result.err.rstrip().endswith(
        f"; 1 other id(s) now have priority 2 (querator peek {queue_name} lists the new ids)"
    )
    assert [(i["utf8"], i["priority"]) for i in _peek(run, queue_name)] == [("b", 2), ("a", 5)]
    # The old id is gone once moved: asking again names it.
    again = run("reprioritize", queue_name, second["id"], "--priority", "3")
    assert again.code == ExitCode.BAD_REQUEST
    assert f"'{second['id']}'" in again.err
    assert "other id(s)" not in again.err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--priority", "10"], "argument --priority: must be between 0 and 9 (lower leases first), not 10"),
        (["--priority", "high"], "argument --priority: must be an integer between 0 and 9, not 'high'"),
        ([], "the following arguments are required: --priority"),
    ],
    ids=["out-of-range", "not-a-number", "missing"],
)
def test_a_bad_or_missing_priority_is_a_usage_error_and_changes_nothing(
    run: Run,
    queue_name: str,
    capsys: pytest.CaptureFixture[str],
    options: list[str],
    message: str,
) -> None:
    run("queues", "create", queue_name)
    run("produce", queue_name, "a")
    before = _peek(run, queue_name)

    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["reprioritize", queue_name, before[0]["id"], *options])

    assert exited.value.code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith("usage: querator reprioritize ")
    assert f"querator reprioritize: error: {message}" in err
    assert _peek(run, queue_name) == before


def test_ids_of_another_partition_without_p_get_the_hint(run: Run, queue_name: str) -> None:
    run("queues", "create", queue_name, "--partitions", "2")
    run("produce", queue_name, "a")
    run("produce", queue_name, "b")
    [item] = _peek(run, queue_name, "-p", "1")

    result = run("reprioritize", queue_name, item["id"], "--priority", "0")

    assert result.code == ExitCode.BAD_REQUEST
    assert "give the lease's partition with -p" in result.err
    ok = run("reprioritize", queue_name, item["id"], "-p", "1", "--priority", "0", "-o", "json")
    assert ok.code == 0, ok.err
