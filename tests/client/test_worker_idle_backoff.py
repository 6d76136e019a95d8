"""The worker pauses after lease calls that find nothing: growing, capped, jittered, reset by an item.

A fake client answers the lease calls from a script and the stop event records each pause instead of
sleeping, so the test is exact and instant.
"""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from querator.client import Client, LeasedItem
from querator.client.models import Lease, QueueInfo
from querator.client.worker import consume

pytestmark = pytest.mark.disable_socket


class RecordingStop(threading.Event):
    """A stop event whose waits are recorded and return at once (a fake sleep)."""

    def __init__(self) -> None:
        super().__init__()
        self.pauses: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        # In a run without errors the lease loop's only wait on the stop event is the idle pause.
        self.pauses.append(timeout or 0.0)
        return self.is_set()


class ScriptedClient(Client):
    """Lease replies from a script: ``0`` is an empty lease, ``n`` a lease of n items; then stop.
    Nothing is sent: every call the worker makes is answered here."""

    def __init__(self, script: list[int], stop: RecordingStop) -> None:
        super().__init__("http://127.0.0.1:9")
        self.script = list(script)
        self.stop = stop
        self.completed: list[str] = []
        self.pauses_at_lease: list[int] = []

    def lease(self, queue_name: str, batch_size: int = 1, **kwargs: Any) -> Lease:
        self.pauses_at_lease.append(len(self.stop.pauses))
        if not self.script:
            self.stop.set()
            return Lease(queue_name=queue_name)
        count = self.script.pop(0)
        deadline = datetime.now(UTC) + timedelta(minutes=1)
        items = tuple(
            LeasedItem(id=f"{len(self.script):030x}{n}", attempts=1, lease_deadline=deadline, payload=b"x")
            for n in range(count)
        )
        return Lease(queue_name=queue_name, items=items)

    def complete(self, queue_name: str, items: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self.completed += [item.id if isinstance(item, LeasedItem) else item for item in items]

    def retry(self, queue_name: str, items: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self.returned = list(items)

    def queue_info(self, queue_name: str) -> Any:  # type: ignore[override]
        return QueueInfo(
            queue_name=queue_name, lease_timeout=timedelta(minutes=1), expire_timeout=timedelta(hours=1)
        )


def run(script: list[int], **options: Any) -> tuple[ScriptedClient, RecordingStop]:
    stop = RecordingStop()
    client = ScriptedClient(script, stop)
    consume(client, "jobs", lambda item: None, stop=stop, handle_signals=False, renew_every=3600, **options)
    return client, stop


def test_pauses_grow_with_each_empty_call_up_to_the_cap_then_reset_on_an_item():
    random.seed(1)
    _, stop = run([0, 0, 0, 0, 0, 0, 1, 0, 0], idle_backoff=1.0, idle_backoff_max=6.0)
    pauses = stop.pauses
    # Eight empty calls: six before the item, two after (the pause after the last ends the script).
    assert len(pauses) >= 8
    ceilings = [1.0, 2.0, 4.0, 6.0, 6.0, 6.0, 1.0, 2.0]
    for pause, ceiling in zip(pauses, ceilings, strict=False):
        assert 0 <= pause <= ceiling
    # Full jitter: not all at the ceiling, and the ones after the cap are spread below it.
    assert len(set(pauses)) == len(pauses)
    assert max(pauses[3:6]) <= 6.0
    # The item reset the growth: the pause after it is back under the first ceiling.
    assert pauses[6] <= 1.0


def test_pauses_are_jittered_over_the_whole_range():
    random.seed(7)
    _, stop = run([0] * 200, idle_backoff=1.0, idle_backoff_max=1.0)
    pauses = stop.pauses[:200]
    assert len(pauses) == 200
    assert min(pauses) < 0.3 and max(pauses) > 0.7  # spread over [0, 1], not a fixed sleep


def test_zero_idle_backoff_polls_without_pausing():
    _, stop = run([0, 0, 0, 1, 0], idle_backoff=0.0, idle_backoff_max=0.0)
    assert stop.pauses == []


def test_a_pause_never_outlasts_the_idle_timeout():
    random.seed(3)
    _, stop = run([0] * 20, idle_backoff=100.0, idle_backoff_max=100.0, idle_timeout=3600.0)
    assert stop.pauses and max(stop.pauses) <= 3600.0


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="idle_backoff"):
        run([], idle_backoff=2.0, idle_backoff_max=1.0)
