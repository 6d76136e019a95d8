"""Who waits for items of which queue in ``querator serve``, and waking them.

A waiting long-poll and a stream with credit are both a ``Waiter``: a coroutine parked in the event
loop (no thread), which makes one lease attempt (the real handler, ``request_timeout`` 0) each time
it is woken. What wakes them (docs/adr/0093-local-server-event-loop.md):

- **a write that makes items ready** (produce, retry, import, a give-back): ``notify(queue, n)`` wakes
  ``n`` waiters of that queue, oldest first, one per item, rather than all of them: a thousand
  waiters on a queue that gets one item make one or two lease attempts, not a thousand;
- **a full batch**: a waiter that leased all it asked for passes a wake on (``notify(queue, 1)``)
  when no other waiter of the queue is woken already, since more may be ready (items found by a
  probe, or more items than wakes); one that leased fewer drained the queue and wakes nobody;
- **time**: items become ready without a write (scheduled items come due, leases run out), so while a
  queue has waiters the registry wakes one of them every ``probe_interval`` seconds unless some
  waiter of that queue made an attempt since. Idle waiting costs a lease attempt per queue per
  interval, whatever the number of waiters.

Owned by the event loop's thread: every method runs there (``notify_threadsafe`` from elsewhere).
"""

from __future__ import annotations

import asyncio
from typing import Final

#: Seconds between the time-based wakes of a queue's waiters (scheduled items, expired leases).
PROBE_INTERVAL: Final = 0.5


class Waiter:
    """One parked consumer of one queue: woken by setting its event."""

    __slots__ = ("busy", "event", "queue_name")

    def __init__(self, queue_name: str) -> None:
        self.queue_name = queue_name
        self.event = asyncio.Event()
        #: Making a lease attempt now: woken only if no idle waiter of its queue is left.
        self.busy = False


class _Queue:
    __slots__ = ("attempted", "pending", "probe", "probed", "waiters")

    def __init__(self) -> None:
        #: Oldest first (a dict keeps insertion order; ``attempting`` moves a waiter to the back).
        self.waiters: dict[Waiter, None] = {}
        self.probe: asyncio.TimerHandle | None = None
        #: Whether a waiter made an attempt since the last probe (other than the probe's own).
        self.attempted = False
        #: The last probe woke a waiter whose attempt has not begun: that attempt is the probe's.
        self.probed = False
        #: Waiters woken that have not begun their attempt yet.
        self.pending = 0


class Waiters:
    def __init__(self, loop: asyncio.AbstractEventLoop, *, probe_interval: float = PROBE_INTERVAL) -> None:
        self._loop = loop
        self._probe_interval = probe_interval
        self._queues: dict[str, _Queue] = {}

    def __len__(self) -> int:
        return sum(len(queue.waiters) for queue in self._queues.values())

    def parked(self) -> int:
        """Waiters not making a lease attempt right now."""
        return sum(not waiter.busy for queue in self._queues.values() for waiter in queue.waiters)

    def add(self, waiter: Waiter) -> None:
        queue = self._queues.get(waiter.queue_name)
        if queue is None:
            queue = self._queues[waiter.queue_name] = _Queue()
            queue.probe = self._loop.call_later(self._probe_interval, self._probe, waiter.queue_name)
        queue.waiters[waiter] = None

    def remove(self, waiter: Waiter) -> None:
        queue = self._queues.get(waiter.queue_name)
        if queue is None or waiter not in queue.waiters:
            return
        del queue.waiters[waiter]
        if waiter.event.is_set() and not waiter.busy:
            queue.pending -= 1
        if not queue.waiters:
            if queue.probe is not None:
                queue.probe.cancel()
            del self._queues[waiter.queue_name]

    def attempting(self, waiter: Waiter) -> None:
        """``waiter`` starts a lease attempt: it goes to the back of the line, busy."""
        queue = self._queues.get(waiter.queue_name)
        if queue is None or waiter not in queue.waiters:
            return
        del queue.waiters[waiter]
        queue.waiters[waiter] = None
        if queue.probed:
            # The probe's own attempt does not excuse the next probe: counted, it made the
            # time-based wakes a second apart instead of ``probe_interval``.
            queue.probed = False
        else:
            queue.attempted = True
        if waiter.event.is_set() and not waiter.busy:
            queue.pending -= 1
        waiter.event.clear()
        waiter.busy = True

    def attempted(self, waiter: Waiter, *, full: bool) -> None:
        """``waiter``'s attempt ended; ``full``: it leased all it asked for, so more may be ready."""
        waiter.busy = False
        queue = self._queues.get(waiter.queue_name)
        if queue is None or waiter not in queue.waiters:
            return
        if waiter.event.is_set():
            queue.pending += 1  # woken during its attempt: it looks again
        elif full and queue.pending == 0:
            self.notify(waiter.queue_name, 1)

    def wake(self, waiter: Waiter) -> None:
        """Wake one waiter (a stream whose credit came back looks at once)."""
        queue = self._queues.get(waiter.queue_name)
        if waiter.event.is_set() or queue is None or waiter not in queue.waiters:
            return
        waiter.event.set()
        if not waiter.busy:
            queue.pending += 1

    def notify(self, queue_name: str, count: int) -> None:
        """Wake up to ``count`` waiters of ``queue_name``: idle ones first, oldest first; then busy
        ones, which make another attempt when the one under way ends."""
        queue = self._queues.get(queue_name)
        if queue is None or count <= 0:
            return
        for wanted_busy in (False, True):
            for waiter in queue.waiters:
                if count <= 0:
                    return
                if waiter.busy is wanted_busy and not waiter.event.is_set():
                    waiter.event.set()
                    queue.pending += not waiter.busy
                    count -= 1

    def notify_threadsafe(self, queue_name: str, count: int) -> None:
        self._loop.call_soon_threadsafe(self.notify, queue_name, count)

    def wake_all(self) -> None:
        """Wake every waiter (the server is stopping: each makes a last attempt and answers)."""
        for queue in self._queues.values():
            for waiter in queue.waiters:
                self.wake(waiter)

    def _probe(self, queue_name: str) -> None:
        queue = self._queues.get(queue_name)
        if queue is None:
            return
        if not queue.attempted:
            queue.probed = True
            self.notify(queue_name, 1)
        queue.attempted = False
        queue.probe = self._loop.call_later(self._probe_interval, self._probe, queue_name)
