"""Record a history of concurrent clients on one queue partition, for ``tests.linearizability.fifo``.

One producer and four consumers run at once against a service (any store; the real clock). The
producer produces the items in small batches; each consumer leases (one item, or a few), then
completes most of what it got, retries some (one item a call, to the tail) and abandons a few, whose
lease then runs out. Every call is recorded with ``time.monotonic()`` at its invocation and return;
an item left to run out (abandoned, or completed too late) becomes an ``expire`` whose window opens
at its lease deadline. Items are followed by their payload: an item that goes back gets a new id.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from querator.domain.errors import NothingToLeaseError
from querator.domain.model import NewItem, QueueInfo, RetryRequest
from tests.linearizability.fifo import Op

if TYPE_CHECKING:
    from querator.service import QueueService

CONSUMERS = 4
#: Short, so an abandoned item comes back within the run (a store whose lease call takes longer,
#: such as the single-threaded moto server under four consumers, needs longer).
LEASE = timedelta(seconds=1)
#: How long a lease waits for items before it says there are none (it polls meanwhile).
LEASE_WAIT = timedelta(milliseconds=300)
#: A deadline read on the wall clock, placed on the monotonic one: the two may drift this much
#: within a run. Opening an expiry's window earlier only lets the checker accept more.
CLOCK_SLACK = 0.05
#: A run that has not ended by then fails rather than hangs.
RUN_SECONDS = 60.0


class NetworkLike:
    """An embedded item store that answers each call after a random pause of up to
    ``most_seconds``, as a store across a network does. In one process the embedded stores answer
    within a few microseconds, under the interpreter's lock, so concurrent consumers rarely come
    between a lease's read and its claims; over HTTP and on DynamoDB they do all the time, and that
    is where order can break."""

    def __init__(self, store: Any, *, seed: int, most_seconds: float = 0.002) -> None:
        self._store = store
        self._rng = random.Random(seed)
        self._most = most_seconds

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if not callable(attribute):
            return attribute

        def after_a_pause(*args: Any, **kwargs: Any) -> Any:
            time.sleep(self._rng.uniform(0, self._most))
            return attribute(*args, **kwargs)

        return after_a_pause


@dataclass
class Recording:
    ops: list[Op] = field(default_factory=list)
    completed: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, *ops: Op) -> None:
        with self.lock:
            self.ops.extend(ops)
            for op in ops:
                if op.kind == "complete":
                    self.completed.update(op.items)


def make_queue(service: QueueService, name: str, *, lease: timedelta = LEASE) -> None:
    placeholder = datetime(2000, 1, 1, tzinfo=UTC)
    service.create_queue(
        QueueInfo(
            name=name,
            lease_timeout=lease,
            expire_timeout=timedelta(hours=1),
            created_at=placeholder,
            updated_at=placeholder,
        )
    )


def record(service: QueueService, queue: str, *, items: int, max_batch: int, seed: int) -> list[Op]:
    """Run the clients until every item is completed; return the history. ``max_batch``: each lease
    asks for 1 to that many items."""
    recording = Recording()
    identities = [f"item-{n:03d}" for n in range(items)]
    # Wall clock to monotonic: the service stamps deadlines with the wall clock.
    wall_origin, mono_origin = datetime.now(UTC), time.monotonic()
    stop = threading.Event()
    failures: list[BaseException] = []

    def on_monotonic(moment: datetime) -> float:
        return mono_origin + (moment - wall_origin).total_seconds()

    def produce() -> None:
        rng = random.Random(seed)
        at = 0
        while at < items:
            batch = identities[at : at + rng.randint(1, 3)]
            at += len(batch)
            invoked = time.monotonic()
            service.produce(queue, [NewItem(payload=i.encode()) for i in batch])
            recording.add(Op("produce", "producer", invoked, time.monotonic(), tuple(batch)))

    def consume(index: int) -> None:
        rng = random.Random(seed * 10 + index + 1)
        name = f"consumer-{index}"
        while not stop.is_set():
            batch = rng.randint(1, max_batch)
            invoked = time.monotonic()
            try:
                lease = service.lease(queue, batch_size=batch, client_id=name, timeout=LEASE_WAIT)
            except NothingToLeaseError:
                recording.add(Op("lease", name, invoked, time.monotonic(), (), batch=batch))
                continue
            returned = time.monotonic()
            held = {item.id: item.payload.decode() for item in lease.items}
            recording.add(Op("lease", name, invoked, returned, tuple(held.values()), batch=batch))
            deadlines = {item.id: item.lease_deadline for item in lease.items}
            # Most are completed together; some retried one a call; a few abandoned.
            complete, retry, abandon = [], [], []
            for item_id in held:
                roll = rng.random()
                (complete if roll < 0.8 else retry if roll < 0.93 else abandon).append(item_id)
            ran_out = list(abandon)
            for item_id in retry:
                invoked = time.monotonic()
                outcome = service.retry(queue, lease.partition, [RetryRequest(id=item_id)])
                if outcome.applied:
                    recording.add(Op("retry", name, invoked, time.monotonic(), (held[item_id],)))
                else:
                    ran_out.append(item_id)  # too late: its lease ran out first
            if complete:
                invoked = time.monotonic()
                outcome = service.complete(queue, lease.partition, complete)
                done = tuple(held[i] for i in outcome.applied)
                if done:
                    recording.add(Op("complete", name, invoked, time.monotonic(), done))
                ran_out += [i for i in complete if i not in set(outcome.applied)]
            recording.add(
                *(
                    Op("expire", name, on_monotonic(deadlines[i]) - CLOCK_SLACK, float("inf"), (held[i],))
                    for i in ran_out
                    if deadlines[i] is not None
                )
            )

    def guarded(target: object, *args: object) -> None:
        try:
            target(*args)  # type: ignore[operator]
        except BaseException as exc:  # re-raised by the caller below
            failures.append(exc)
            stop.set()

    threads = [threading.Thread(target=guarded, args=(produce,))]
    threads += [threading.Thread(target=guarded, args=(consume, n)) for n in range(CONSUMERS)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + RUN_SECONDS
    while not stop.is_set() and time.monotonic() < deadline:
        with recording.lock:
            if len(recording.completed) == items:
                break
        stop.wait(0.02)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    if failures:
        raise failures[0]
    missing = sorted(set(identities) - recording.completed)
    assert not missing, f"not completed within {RUN_SECONDS} s: {missing}"
    return recording.ops
