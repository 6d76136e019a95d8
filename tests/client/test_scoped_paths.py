"""The client sends every call on one queue to its scoped path (``/v1/queues/<queue>/<route>``), which
a per-queue IAM grant allows, and ``queues.list`` on its plain path; a worker run goes through it.

Recorded at the client's transport against a real ``querator serve``: the paths asked, and that the
server served them."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest

from querator.client import Client, DeadLetter
from querator.client.client import PATHS, path_for
from querator.client.transport import Transport

if TYPE_CHECKING:
    from querator.client import LeasedItem

pytestmark = pytest.mark.server


class Recorder:
    """Every (method, path) the client sends, whatever thread sends it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        lock = threading.Lock()
        send = Transport.send

        def recording(transport: Transport, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            with lock:
                self.paths.append(path)
            return send(transport, method, path, *args, **kwargs)

        monkeypatch.setattr(Transport, "send", recording)

    def outside(self, *queues: str) -> list[str]:
        """Paths that are not a scoped route of one of ``queues``."""
        return [p for p in self.paths if not any(p.startswith(f"/v1/queues/{q}/") for q in queues)]


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    return Recorder(monkeypatch)


def test_path_for_scopes_single_queue_calls_and_nothing_else() -> None:
    assert path_for("queue.lease", {"queue_name": "orders"}) == "/v1/queues/orders/queue.lease"
    assert path_for("storage/items.list", {"queue_name": "o"}) == "/v1/queues/o/storage/items.list"
    assert path_for("queues.list", {"pivot": "orders"}) == "/v1/queues.list"
    assert path_for("health", None) == "/health"
    # A name a path cannot carry keeps the plain path (a whole-API grant serves it).
    assert path_for("queue.lease", {"queue_name": "a*b"}) == "/v1/queue.lease"
    assert path_for("queue.lease", {"queue_name": "orders"}, scoped=False) == PATHS["queue.lease"]
    # Calls that reach another queue than the path's go plain (a whole-API grant), as the scoped
    # path would refuse them; within the namespace they stay scoped.
    create = {"queue_name": "orders", "dead_queue": "emails"}
    assert path_for("queues.create", create) == "/v1/queues.create"
    create["dead_queue"] = "orders-dead"
    assert path_for("queues.create", create) == "/v1/queues/orders/queues.create"
    assert path_for("queues.update", {"queue_name": "o", "dead_queue": ""}) == "/v1/queues/o/queues.update"
    assert path_for("queue.redrive", {"queue_name": "d", "to": "x"}) == "/v1/queue.redrive"
    assert path_for("queue.redrive", {"queue_name": "d"}) == "/v1/queues/d/queue.redrive"


def test_a_worker_run_only_calls_its_queues_scoped_paths(
    served_url: str, queue_name: str, recorder: Recorder
) -> None:
    dead = f"{queue_name}-dead"
    with Client(served_url) as client:
        client.create_queue(dead, lease_timeout="30s", expire_timeout="1h")
        client.create_queue(queue_name, lease_timeout="30s", expire_timeout="1h", dead_queue=dead)
        client.produce(queue_name, [b"ok", b"bad", b"later"])
        recorder.paths.clear()
        tries: dict[bytes, int] = {}

        def handler(item: LeasedItem) -> None:
            tries[item.payload] = tries.get(item.payload, 0) + 1
            if item.payload == b"bad":
                raise DeadLetter("unprocessable")
            if item.payload == b"later" and tries[item.payload] == 1:
                raise RuntimeError("retry me")

        report = client.consume(
            queue_name, handler, max_items=4, request_timeout=1.0, backoff=lambda attempt: "0s", concurrency=2
        )
    assert (report.completed, report.dead_lettered) == (2, 1), report
    # queues.info (the lease timeout), leases, completes, retries (dead letter included): all scoped.
    assert recorder.paths and recorder.outside(queue_name) == []
    asked = {path.rsplit("/", 1)[1] for path in recorder.paths}
    assert {"queue.lease", "queue.complete", "queue.retry"} <= asked


def test_queues_list_stays_on_its_plain_path(served_url: str, queue_name: str, recorder: Recorder) -> None:
    with Client(served_url) as client:
        client.create_queue(queue_name, lease_timeout="30s", expire_timeout="1h")
        assert [q.queue_name for q in client.list_queues(pivot=queue_name, limit=1)] == [queue_name]
        client.stats(queue_name)
    assert recorder.paths == [
        f"/v1/queues/{queue_name}/queues.create",
        "/v1/queues.list",
        f"/v1/queues/{queue_name}/queue.stats",
    ]


def test_a_queue_whose_name_a_path_cannot_carry_is_served_on_the_plain_paths(
    served_url: str, queue_name: str, recorder: Recorder
) -> None:
    odd = f"{queue_name}:odd"
    with Client(served_url) as client:
        client.create_queue(odd, lease_timeout="30s", expire_timeout="1h")
        client.produce(odd, [b"x"])
        assert client.stats(odd).total == 1
    assert recorder.paths == ["/v1/queues.create", "/v1/queue.produce", "/v1/queue.stats"]


def test_a_stream_worker_on_a_stacks_stream_url_asks_its_queues_ticket_first(
    served_url: str, queue_name: str, recorder: Recorder
) -> None:
    # A deployed stack's stream (stream_url given) may require a ticket of the queue; querator
    # serve's own stream needs none and ignores the one sent.
    stream_url = served_url.replace("http://", "ws://", 1) + "/v1/stream"
    with Client(served_url, stream_url=stream_url) as client:
        client.create_queue(queue_name, lease_timeout="30s", expire_timeout="1h")
        client.produce(queue_name, [b"pushed"])
        recorder.paths.clear()
        report = client.consume(queue_name, lambda item: None, max_items=1, mode="stream")
    assert report.completed == 1 and report.transport == "stream", report
    assert f"/v1/queues/{queue_name}/stream.ticket" in recorder.paths
    assert recorder.outside(queue_name) == []
