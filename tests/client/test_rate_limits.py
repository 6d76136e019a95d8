"""Lease rate limits through ``querator serve`` and the client: the settings read back, a lease
gets what the limit allows with ``next_lease_at``, a lease held back gets an empty ``Lease`` that
says when to come back, a waiting lease is answered when the next lease is due, and the worker
waits for ``next_lease_at`` before leasing again."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from querator.client import Client, LeasedItem
from querator.client.models import Lease, QueueInfo
from querator.client.worker import consume


def test_a_limited_queue_leases_what_the_limit_allows_and_says_when_to_come_back(
    client: Client, queue_name: str
) -> None:
    client.create_queue(queue_name, lease_timeout="1m", expire_timeout="1h", rate_limit=2)
    assert client.queue_info(queue_name).rate_limit == 2.0
    client.produce(queue_name, [b"a", b"b", b"c", b"d"])

    first = client.lease(queue_name, 4)
    held_back = client.lease(queue_name, 4)

    # A full bucket holds one second's worth: 2; then nothing until the next token (0.5 s).
    assert len(first.items) == 2
    assert first.next_lease_at is not None
    assert held_back.items == ()
    assert held_back.next_lease_at is not None
    assert held_back.next_lease_at - datetime.now(UTC) <= timedelta(milliseconds=600)

    started = time.monotonic()
    waited = client.lease(queue_name, 4, request_timeout="5s")
    took = time.monotonic() - started

    # The waiting lease is answered when the next lease is due, not at the end of its wait.
    assert len(waited.items) == 1
    assert took < 2.0, took


class _Stop(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self.pauses: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.pauses.append(timeout or 0.0)
        return self.is_set()


class _Limited(Client):
    """Leases from a script; each carries ``next_lease_at`` two seconds ahead. Nothing is sent."""

    def __init__(self, script: list[int], stop: _Stop) -> None:
        super().__init__("http://127.0.0.1:9")
        self.script, self.stop = list(script), stop

    def lease(self, queue_name: str, batch_size: int = 1, **kwargs: Any) -> Lease:
        if not self.script:
            self.stop.set()
            return Lease(queue_name=queue_name)
        count = self.script.pop(0)
        now = datetime.now(UTC)
        items = tuple(
            LeasedItem(
                id=f"{len(self.script):030x}{n}",
                attempts=1,
                lease_deadline=now + timedelta(minutes=1),
                payload=b"x",
            )
            for n in range(count)
        )
        return Lease(queue_name=queue_name, items=items, next_lease_at=now + timedelta(seconds=2))

    def complete(self, queue_name: str, items: Any, **kwargs: Any) -> None:  # type: ignore[override]
        pass

    def queue_info(self, queue_name: str) -> Any:  # type: ignore[override]
        return QueueInfo(
            queue_name=queue_name, lease_timeout=timedelta(minutes=1), expire_timeout=timedelta(hours=1)
        )


def test_the_worker_waits_for_next_lease_at_before_leasing_again() -> None:
    stop = _Stop()
    consume(
        _Limited([1, 0], stop), "jobs", lambda item: None, stop=stop, handle_signals=False, renew_every=3600
    )

    # After the lease with an item and after the empty one: about two seconds each, not the
    # idle backoff's fraction of a second.
    long_waits = [p for p in stop.pauses if p > 1.5]
    assert len(long_waits) == 2, stop.pauses
    assert all(p <= 2.0 for p in long_waits)
