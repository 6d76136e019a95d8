"""A recorded history of concurrent queue operations, and a checker for the FIFO-with-leases model.

Every call is recorded with the wall-clock time it was invoked and the time it returned (the
service's clock is the same ``datetime.now(UTC)``), so the checker can order two calls only when one
returned before the other began, and treats overlapping calls as concurrent, as a linearizability
checker does. Items are followed by identity (their payload), because an item that goes back to the
queue gets a new id.

The model (docs/adr/0004 and the contract, "Item identity and fencing" and "Lifecycle"):

1. no item is held by two live leases: a lease is granted only when the item's previous lease was
   ended (complete / retry) or its deadline had passed;
2. a lease's holder can end it only while it is valid (fencing): an applied complete or retry was
   invoked before the lease's deadline;
3. every produced item ends exactly once: completed once, or in the dead-letter queue once, never both;
4. order: the items of one lease come oldest first (ascending ids); the ids one producer gets grow
   from one produce to the next; an item that goes back to the queue (retry now, expired lease) gets
   an id after every item produced before it went back (tail placement);
5. ``attempts`` counts leases: it grows by one with each lease of the same item.

The leases of one item are put in the order of their ``attempts`` (the store's count of them), and
that order must agree with real time: a lease that returned before another was invoked comes first.
Not by deadline: a lease's deadline is its call's clock read plus the lease timeout, and a call that
read the clock, waited for the store, and then took an item another consumer leased and retried
meanwhile holds the later lease with the earlier deadline.
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

#: The clocks agree (one process, one wall clock); this absorbs rounding to microseconds.
SLACK = timedelta(milliseconds=1)


@dataclass(frozen=True)
class Event:
    kind: Literal["produce", "lease", "complete", "retry", "retry_dead"]
    thread: str
    invoked: datetime
    returned: datetime
    #: produce: (id, identity) per item; lease: (id, identity); complete / retry: the ids applied.
    items: tuple[tuple[str, str], ...] = ()
    #: lease only: the deadline and attempts of each item, in reply order.
    deadlines: tuple[datetime, ...] = ()
    attempts: tuple[int, ...] = ()


class History:
    """Thread-safe event log."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[Event] = []

    def record(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)


def now() -> datetime:
    return datetime.now(UTC)


@dataclass
class _Lease:
    id: str
    identity: str
    invoked: datetime
    returned: datetime
    deadline: datetime
    attempts: int
    #: When the holder ended it (complete / retry applied): the ending call's (invoked, returned).
    ended: tuple[datetime, datetime] | None = None
    ended_by: str = ""


@dataclass
class Verdict:
    violations: list[str] = field(default_factory=list)
    leases: int = 0
    completed: int = 0
    dead_lettered: int = 0
    requeued: int = 0

    def fail(self, message: str) -> None:
        self.violations.append(message)


def check(history: History, *, dead_letter_identities: list[str], left_in_queue: list[str]) -> Verdict:
    """Check ``history`` against the model; the census of the dead-letter queue and of what is
    still in the queue at the end complete it."""
    verdict = Verdict()
    events = sorted(history.events, key=lambda e: e.invoked)
    produced: dict[str, tuple[str, Event]] = {}
    leases_by_id: dict[str, _Lease] = {}
    leases_by_identity: dict[str, list[_Lease]] = defaultdict(list)

    for event in events:
        if event.kind == "produce":
            for item_id, identity in event.items:
                if identity in produced:
                    verdict.fail(f"{identity} produced twice")
                produced[identity] = (item_id, event)
        elif event.kind == "lease":
            verdict.leases += 1
            ids = [i for i, _ in event.items]
            if ids != sorted(ids):
                verdict.fail(f"lease not oldest first: {ids}")
            for (item_id, identity), deadline, attempts in zip(
                event.items, event.deadlines, event.attempts, strict=True
            ):
                lease = _Lease(item_id, identity, event.invoked, event.returned, deadline, attempts)
                if item_id in leases_by_id:
                    verdict.fail(f"id {item_id} leased twice: an id is valid for one lease")
                leases_by_id[item_id] = lease
                leases_by_identity[identity].append(lease)

    for event in events:
        if event.kind not in ("complete", "retry", "retry_dead"):
            continue
        for item_id, _ in event.items:
            lease = leases_by_id.get(item_id)
            if lease is None:
                verdict.fail(f"{event.kind} applied to {item_id}, which no lease handed out")
                continue
            # 2. Fencing: the holder acted while its lease was valid.
            if event.invoked > lease.deadline + SLACK:
                verdict.fail(f"{event.kind} of {lease.identity} applied after its lease ended")
            if lease.ended is not None:
                verdict.fail(f"lease {item_id} of {lease.identity} ended twice")
            lease.ended = (event.invoked, event.returned)
            lease.ended_by = event.kind

    produce_events = [e for e in events if e.kind == "produce"]
    for identity, leases in leases_by_identity.items():
        leases.sort(key=lambda lease: (lease.attempts, lease.invoked))
        for before, after in itertools.pairwise(leases):
            # The order by attempts agrees with real time: the later lease did not end before
            # the earlier one began.
            if after.returned + SLACK < before.invoked:
                verdict.fail(
                    f"{identity}: the lease with attempts {after.attempts} returned before the one"
                    f" with attempts {before.attempts} was invoked"
                )
            # 1. No two live leases: the later grant happened after the earlier lease was over.
            #    The grant is somewhere in [after.invoked, after.returned].
            ended_first = before.ended is not None and before.ended[0] <= after.returned
            expired_first = after.returned + SLACK >= before.deadline
            if not (ended_first or expired_first):
                verdict.fail(
                    f"{identity} leased again at {after.invoked.time()}-{after.returned.time()}"
                    f" while the lease until {before.deadline.time()} was live"
                )
            # 5. Attempts count leases.
            if after.attempts != before.attempts + 1:
                verdict.fail(f"{identity}: attempts {before.attempts} then {after.attempts}")
            # 4. Tail placement: the new id sorts after every item whose produce returned before
            #    the item went back (the retry was invoked, or the earlier lease expired).
            verdict.requeued += 1
            back_at = before.ended[0] if before.ended is not None else before.deadline
            earlier = [
                item_id for e in produce_events if e.returned < back_at - SLACK for item_id, _ in e.items
            ]
            if earlier and after.id <= max(earlier):
                verdict.fail(f"{identity} went back to the queue but not to its tail")
        if leases and leases[0].attempts != 1:
            verdict.fail(f"{identity}: first lease has attempts {leases[0].attempts}")

    # 4. One producer's ids grow from one produce to the next.
    by_thread: dict[str, list[Event]] = defaultdict(list)
    for event in produce_events:
        by_thread[event.thread].append(event)
    for thread, produces in by_thread.items():
        ids = [item_id for e in sorted(produces, key=lambda e: e.invoked) for item_id, _ in e.items]
        if ids != sorted(ids):
            verdict.fail(f"producer {thread} got ids out of order")

    # 3. Every produced item ends exactly once.
    completed = [lease.identity for lease in leases_by_id.values() if lease.ended_by == "complete"]
    verdict.completed = len(completed)
    verdict.dead_lettered = len(dead_letter_identities)
    ends = completed + dead_letter_identities
    for identity in produced:
        n = ends.count(identity)
        if n != 1:
            verdict.fail(f"{identity} ended {n} times (completed {completed.count(identity)})")
    unknown = set(ends) - set(produced)
    if unknown:
        verdict.fail(f"items nobody produced ended: {sorted(unknown)[:5]}")
    if left_in_queue:
        verdict.fail(f"items left in the queue: {left_in_queue[:5]}")
    return verdict
