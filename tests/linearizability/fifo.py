"""A linearizability checker for one partition of a FIFO lease queue (Wing & Gong, as Porcupine does it).

The sequential model is the queue docs/ordering.md promises, the one Querator's own Porcupine tests
check: one FIFO list of waiting items, and the set of leased items.

- ``produce(items)`` appends the items to the tail, in the order given;
- ``lease(n)`` hands out the oldest waiting items, ``1 <= k <= n`` of them, in FIFO order (a lease
  may return fewer than it asked for, never a newer item while an older one waits); a lease that
  found nothing is allowed only while nothing waits. Engine v2 claims a lease's items with one
  conditional write each, so two concurrent leases of several items may interleave their claims
  (one gets items 1 and 3, the other 2): by default a lease of ``k`` items is checked as ``k``
  takes of the oldest waiting item, one after the other within the call; ``atomic_leases=True``
  checks each lease as one step (what a lease claiming its whole run in one write would give);
- ``complete(items)`` ends leased items;
- ``retry(items)`` puts leased items back at the tail;
- ``expire(item)`` is a lease running out: the leased item goes back to the tail. Nobody calls it;
  a history gives it the window from the lease's deadline to the end, so the search may place it
  anywhere in there.

Items are followed by identity (their payload), since an item that goes back gets a new id.

A history is a list of operations, each with the time it was invoked and the time it returned (one
monotonic clock). It is linearizable when the operations can be put in one order that respects
real time (an operation that returned before another was invoked comes first) and in which every
operation's result is what the model gives. The search is Wing & Gong's: repeatedly pick one of the
operations that may come next (invoked before the earliest return among those left), apply it to
the model, and backtrack when none fits, remembering every (operations done, model state) pair
already explored (Lowe's memoization, as in Porcupine) so no state is searched twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["produce", "lease", "complete", "retry", "expire"]

#: States explored before the checker gives up (a verdict of neither yes nor no, which fails a test).
DEFAULT_BUDGET = 200_000


@dataclass(frozen=True)
class Op:
    """One operation of the history. ``items`` are identities: produced (in order), leased (in reply
    order), completed or retried (those applied), or the one item whose lease expired."""

    kind: Kind
    client: str
    invoked: float
    returned: float
    items: tuple[str, ...] = ()
    #: ``lease`` only: the batch size asked for.
    batch: int = 1

    def __post_init__(self) -> None:
        if self.returned < self.invoked:
            raise ValueError(f"{self}: returned before it was invoked")


@dataclass
class Verdict:
    linearizable: bool | None  # None: the budget ran out before an answer
    explored: int
    #: When rejected: the longest prefix of operations the search could linearize, and the
    #: operations that could come next but did not fit the model there (what to look at first).
    longest: list[Op] = field(default_factory=list)
    stuck: list[Op] = field(default_factory=list)

    def explain(self) -> str:
        if self.linearizable:
            return f"linearizable ({self.explored} states explored)"
        if self.linearizable is None:
            return f"undecided: budget of {self.explored} states spent"
        waiting = _Model.replay(self.longest)
        lines = [
            f"not linearizable ({self.explored} states explored); after {len(self.longest)} operations,"
            f" waiting oldest first: {list(waiting)}; none of these fits:",
        ]
        lines += [
            f"  {op.client} {op.kind} {list(op.items)} [{op.invoked:.4f}, {op.returned:.4f}]"
            for op in self.stuck
        ]
        return "\n".join(lines)


class _Model:
    """The sequential FIFO lease queue. A state is the tuple of waiting items, oldest first; which
    items are leased follows from the operations done, so it is not part of the state."""

    @staticmethod
    def step(waiting: tuple[str, ...], leased: frozenset[str], op: Op) -> tuple[str, ...] | None:
        """The state after ``op``, or ``None`` when the model cannot give ``op``'s result here."""
        if op.kind == "produce":
            return waiting + op.items
        if op.kind == "lease":
            if not op.items:
                return waiting if not waiting else None
            k = len(op.items)
            if k > op.batch or waiting[:k] != op.items:
                return None
            return waiting[k:]
        if not all(item in leased for item in op.items):
            return None
        if op.kind == "complete":
            return waiting
        return waiting + op.items  # retry, expire: to the tail

    @staticmethod
    def leased_next(leased: frozenset[str], op: Op) -> frozenset[str]:
        """The leased items after ``op`` (which the model accepted)."""
        if op.kind == "lease":
            return leased | frozenset(op.items)
        if op.kind == "produce":
            return leased
        return leased - frozenset(op.items)

    @staticmethod
    def replay(ops: list[Op]) -> tuple[str, ...]:
        """The waiting items after ``ops``, a sequence the model accepts."""
        waiting: tuple[str, ...] = ()
        leased: frozenset[str] = frozenset()
        for op in ops:
            waiting = _Model.step(waiting, leased, op) or ()
            leased = _Model.leased_next(leased, op)
        return waiting


def check(history: list[Op], *, budget: int = DEFAULT_BUDGET, atomic_leases: bool = False) -> Verdict:
    """Decide whether ``history`` is linearizable against the FIFO lease queue, starting empty."""
    too_many = [op for op in history if op.kind == "lease" and len(op.items) > op.batch]
    if too_many:
        return Verdict(False, 0, [], too_many)
    if not atomic_leases:
        history = [
            take
            for op in history
            for take in (
                [Op("lease", op.client, op.invoked, op.returned, (item,)) for item in op.items]
                if op.kind == "lease" and len(op.items) > 1
                else [op]
            )
        ]
    ops = sorted(history, key=lambda op: (op.invoked, op.returned))
    count = len(ops)
    everything = (1 << count) - 1
    seen: set[tuple[int, tuple[str, ...]]] = set()
    explored = 0
    longest: list[int] | None = None
    stuck: list[int] = []

    # Depth-first, with an explicit stack of (done mask, waiting, leased, path, candidates left).
    def candidates(done: int) -> list[int]:
        pending = [i for i in range(count) if not done >> i & 1]
        first_return = min((ops[i].returned for i in pending), default=math.inf)
        # Invoked no later than the earliest return of what is left: a tie counts as concurrent.
        return [i for i in pending if ops[i].invoked <= first_return]

    stack: list[tuple[int, tuple[str, ...], frozenset[str], list[int], list[int]]] = [
        (0, (), frozenset(), [], candidates(0))
    ]
    while stack:
        done, waiting, leased, path, left = stack[-1]
        if done == everything:
            return Verdict(True, explored)
        if not left:
            stack.pop()
            continue
        i = left.pop()
        op = ops[i]
        after = _Model.step(waiting, leased, op)
        if after is None:
            if longest is None or len(path) > len(longest):
                longest, stuck = path, []
            if path is longest:
                stuck.append(i)
            continue
        next_done = done | 1 << i
        if (next_done, after) in seen:
            continue
        seen.add((next_done, after))
        explored += 1
        if explored > budget:
            return Verdict(None, explored)
        next_leased = _Model.leased_next(leased, op)
        # Try the earliest-invoked candidates first (popped from the end): histories that pass
        # mostly pass in invocation order, so the first path usually goes straight through.
        stack.append((next_done, after, next_leased, [*path, i], sorted(candidates(next_done), reverse=True)))
    best = [ops[i] for i in longest or []]
    return Verdict(False, explored, best, [ops[i] for i in dict.fromkeys(stuck)])
