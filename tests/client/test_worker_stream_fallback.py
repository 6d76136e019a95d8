"""``consume(mode="stream")`` long-polls where the endpoint has no stream: a server that answers the
WebSocket upgrade with a plain reply, and the embedded library (no socket at all)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from querator.client import Client, LeasedItem
from querator.client.models import Lease, QueueInfo
from querator.client.worker import RESUBSCRIBE_BACKOFF, RESUBSCRIBE_BACKOFF_MAX, consume, resubscribe_pause
from querator.embedded import Embedded

if TYPE_CHECKING:
    from tests.client.fakeserver import FakeServer


class ScriptedLeases(Client):
    """Leases ``count`` items once over no network, then nothing; records completes."""

    def __init__(self, base_url: str, count: int) -> None:
        super().__init__(base_url)
        self.count = count
        self.completed: list[str] = []
        self.lock = threading.Lock()

    def lease(self, queue_name: str, batch_size: int = 1, **kwargs: Any) -> Lease:
        with self.lock:
            take, self.count = min(batch_size, self.count), self.count - min(batch_size, self.count)
        deadline = datetime.now(UTC) + timedelta(minutes=1)
        items = tuple(
            LeasedItem(id=f"{self.count + n:030x}", attempts=1, lease_deadline=deadline, payload=b"x")
            for n in range(take)
        )
        return Lease(queue_name=queue_name, items=items)

    def complete(self, queue_name: str, items: Any, **kwargs: Any) -> None:  # type: ignore[override]
        with self.lock:
            self.completed += [item.id if isinstance(item, LeasedItem) else item for item in items]

    def queue_info(self, queue_name: str) -> Any:  # type: ignore[override]
        return QueueInfo(
            queue_name=queue_name, lease_timeout=timedelta(minutes=1), expire_timeout=timedelta(hours=1)
        )


def test_a_server_without_a_stream_is_long_polled(fake: FakeServer) -> None:
    # GIVEN: a server whose /v1/stream is a plain JSON reply, not a WebSocket
    client = ScriptedLeases(fake.url, count=7)

    # WHEN: the worker is asked to stream
    report = consume(client, "jobs", lambda item: None, mode="stream", max_items=7, handle_signals=False)

    # THEN: it tried the stream once, then leased by polling, and handled every item
    assert [seen.path for seen in fake.seen] == ["/v1/stream"]
    assert report.transport == "poll"
    assert report.completed == 7
    assert sorted(client.completed) == sorted(set(client.completed))
    assert len(client.completed) == 7


@pytest.mark.disable_socket
def test_the_embedded_library_is_long_polled_without_opening_a_socket() -> None:
    with Embedded("memory", reaper_interval=60) as queue:
        queue.create_queue("jobs", lease_timeout="30s", expire_timeout="1h")
        queue.produce("jobs", [b"a", b"b", b"c"])
        seen: list[bytes] = []

        report = queue.stream("jobs", lambda item: seen.append(item.payload), credit=2, max_items=3)

        assert report.transport == "poll"
        assert sorted(seen) == [b"a", b"b", b"c"]
        assert queue.stats("jobs").total == 0


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="mode must be one of poll, stream"):
        consume(ScriptedLeases("http://127.0.0.1:9", 0), "jobs", lambda item: None, mode="push")


def test_tries_to_subscribe_again_back_off_from_a_tenth_of_a_second_to_five_with_jitter() -> None:
    # Equal jitter: each pause between half its ceiling and the ceiling, which doubles per failure
    # from RESUBSCRIBE_BACKOFF and stops at RESUBSCRIBE_BACKOFF_MAX.
    assert (RESUBSCRIBE_BACKOFF, RESUBSCRIBE_BACKOFF_MAX) == (0.1, 5.0)
    for failures, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (6, 3.2), (7, 5.0), (50, 5.0)]:
        pauses = [resubscribe_pause(failures) for _ in range(200)]
        assert all(ceiling / 2 <= pause <= ceiling for pause in pauses), (failures, min(pauses), max(pauses))
        assert max(pauses) - min(pauses) > ceiling / 10  # spread out, not in step
