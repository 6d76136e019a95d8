"""The CLI's calls on one queue go to its scoped paths (what a per-queue IAM grant allows), and
``queues list`` under such a grant ends with a message that says what would work."""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

from querator.cli.output import ExitCode
from querator.client.transport import Reply, Transport

if TYPE_CHECKING:
    from collections.abc import Callable

    import pytest

    from tests.cli.conftest import Result


def _recording(
    monkeypatch: pytest.MonkeyPatch, refuse: Callable[[str], bool] = lambda path: False
) -> list[str]:
    """Record each path the CLI's client sends; answer 403 (as API Gateway's authorizer does) to those
    ``refuse`` names, without sending them."""
    paths: list[str] = []
    lock = threading.Lock()
    send = Transport.send

    def recording(transport: Transport, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        with lock:
            paths.append(path)
        if refuse(path):
            body = json.dumps({"message": "User is not authorized to access this resource"}).encode()
            return Reply(403, body, {"content-type": "application/json"})
        return send(transport, method, path, *args, **kwargs)

    monkeypatch.setattr(Transport, "send", recording)
    return paths


def test_produce_lease_and_complete_call_only_the_queues_scoped_paths(
    run: Callable[..., Result], queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run("queues", "create", queue_name).code == 0
    paths = _recording(monkeypatch)
    assert run("produce", queue_name, "one", "two").code == 0
    leased = run("lease", queue_name, "-n", "2", "-o", "json")
    assert leased.code == 0, leased.err
    lease = leased.json()
    ids = [item["id"] for item in lease["items"]]
    assert run("complete", queue_name, "-p", str(lease["partition"]), *ids).code == 0
    assert paths and [p for p in paths if not p.startswith(f"/v1/queues/{queue_name}/")] == []
    assert {p.rsplit("/", 1)[1] for p in paths} >= {"queue.produce", "queue.lease", "queue.complete"}


def test_queues_list_under_a_per_queue_grant_says_what_would_work(
    run: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _recording(monkeypatch, refuse=lambda path: path == "/v1/queues.list")
    result = run("queues", "list")
    assert result.code == ExitCode.NOT_ALLOWED
    assert "listing queues needs the whole-API grant" in result.err
    assert "querator queues info NAME" in result.err
    assert paths == ["/v1/queues.list"]
