"""The FIFO linearizability checker on hand-made histories and on generated ones of 4 clients, 40
items: it accepts what a correct queue produces and rejects a planted out-of-order lease."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest

from tests.linearizability.fifo import Op, check

pytestmark = pytest.mark.disable_socket

INF = math.inf


def produce(invoked: float, returned: float, *items: str, client: str = "p") -> Op:
    return Op("produce", client, invoked, returned, items)


def lease(invoked: float, returned: float, *items: str, client: str = "c", batch: int = 1) -> Op:
    return Op("lease", client, invoked, returned, items, batch=max(batch, len(items)))


def test_a_sequential_fifo_history_is_linearizable():
    history = [
        produce(0, 1, "a", "b", "c"),
        lease(2, 3, "a"),
        lease(4, 5, "b", "c", batch=5),
        Op("complete", "c", 6, 7, ("a", "b")),
        Op("retry", "c", 8, 9, ("c",)),
        lease(10, 11, "c"),
        Op("complete", "c", 12, 13, ("c",)),
        lease(14, 15),  # nothing left: a lease that finds nothing
    ]
    assert check(history).linearizable


def test_overlapping_leases_may_take_the_items_in_either_order():
    # c2 got the older item although it was invoked later: both calls overlap, so c2 went first.
    history = [
        produce(0, 1, "a", "b"),
        lease(2, 6, "b", client="c1"),
        lease(3, 5, "a", client="c2"),
    ]
    assert check(history).linearizable


def test_a_lease_of_a_newer_item_while_an_older_one_waits_is_rejected():
    history = [
        produce(0, 1, "a", "b"),
        lease(2, 3, "b", client="c1"),
        lease(4, 5, "a", client="c2"),
    ]
    verdict = check(history)
    assert verdict.linearizable is False
    assert "lease ['b']" in verdict.explain()


def test_a_retried_item_goes_to_the_tail():
    history = [
        produce(0, 1, "a", "b"),
        lease(2, 3, "a"),
        Op("retry", "c", 4, 5, ("a",)),
        lease(6, 7, "b"),
        lease(8, 9, "a"),
    ]
    assert check(history).linearizable
    jumps_back = [*history[:3], lease(6, 7, "a"), lease(8, 9, "b")]
    assert check(jumps_back).linearizable is False


def test_an_expired_lease_goes_back_to_the_tail_after_its_deadline():
    history = [
        produce(0, 1, "a"),
        lease(2, 3, "a", client="c1"),
        produce(4, 5, "b"),
        Op("expire", "c1", 10, INF, ("a",)),
        lease(11, 12, "b", client="c2"),
        lease(13, 14, "a", client="c2"),
    ]
    assert check(history).linearizable
    # Before its deadline the item is still leased: nobody else may have it.
    early = [*history[:3], Op("expire", "c1", 10, INF, ("a",)), lease(6, 7, "a", client="c2")]
    assert check(early).linearizable is False
    # After expiry it is behind b, which was waiting: a lease of it before b is out of order.
    out_of_order = [*history[:4], lease(11, 12, "a", client="c2"), lease(13, 14, "b", client="c2")]
    assert check(out_of_order).linearizable is False


def test_complete_and_retry_need_a_valid_lease():
    assert check([produce(0, 1, "a"), Op("complete", "c", 2, 3, ("a",))]).linearizable is False
    double = [produce(0, 1, "a"), lease(2, 3, "a"), Op("complete", "c", 4, 5, ("a",))]
    assert check(double).linearizable
    assert check([*double, Op("retry", "c", 6, 7, ("a",))]).linearizable is False


def test_a_lease_that_finds_nothing_is_wrong_while_items_wait():
    assert check([produce(0, 1, "a"), lease(2, 3)]).linearizable is False
    # Concurrent with the lease that took the last item, it may have come after it.
    assert check([produce(0, 1, "a"), lease(2, 5, "a", client="c1"), lease(3, 4, client="c2")]).linearizable


def test_concurrent_leases_of_several_items_may_interleave_their_claims():
    # v2 claims a lease's items one by one: c1's claims of a and c went around c2's claim of b.
    history = [
        produce(0, 1, "a", "b", "c"),
        lease(2, 6, "a", "c", client="c1", batch=2),
        lease(3, 5, "b", client="c2"),
    ]
    assert check(history).linearizable
    assert check(history, atomic_leases=True).linearizable is False
    # Alone, a lease of several items may not pass over one it left waiting.
    assert check([produce(0, 1, "a", "b", "c"), lease(2, 6, "a", "c", batch=2)]).linearizable is False


def test_a_lease_may_return_fewer_than_it_asked_for_but_never_more():
    assert check([produce(0, 1, "a", "b"), lease(2, 3, "a", batch=2)]).linearizable
    too_many = Op("lease", "c", 2, 3, ("a", "b"), batch=1)
    assert check([produce(0, 1, "a", "b"), too_many]).linearizable is False


@dataclass
class _Client:
    name: str
    free_at: float = -INF
    held: list[str] = field(default_factory=list)


def simulated(seed: int, *, items: int = 40, plant: bool = False) -> list[Op]:
    """A history of a correct queue: one producer and 4 consumers, each call's interval around the
    moment the queue applied it (up to 3 steps either side, so calls overlap a lot), some retries,
    some leases left to expire. With ``plant``, one lease takes the second waiting item while the
    first, waiting since before it was invoked, is taken only by leases invoked after it returned."""
    rng = random.Random(seed)
    producer, consumers = _Client("producer"), [_Client(f"c{n}") for n in range(4)]
    waiting: list[str] = []
    #: When each waiting item entered the queue by a call (its return): None after an expiry.
    entered: dict[str, float | None] = {}
    history: list[Op] = []
    produced = 0
    planted_until: float | None = None
    skipped = ""
    t = 0.0

    def interval(client: _Client, tight: bool = False) -> tuple[float, float]:
        if tight:
            invoked, returned = t - 0.1, t + 0.1
        else:
            invoked, returned = rng.uniform(max(client.free_at, t - 3), t), t + rng.uniform(0, 3)
        client.free_at = returned
        return invoked, returned

    while produced < items or waiting or any(c.held for c in consumers):
        t += 1
        ready = [c for c in [producer, *consumers] if c.free_at < t - 0.1]
        if not ready:
            continue
        client = rng.choice(ready)
        if client is producer:
            if produced >= items:
                continue
            batch = [f"i{produced + n:02d}" for n in range(min(rng.randint(1, 3), items - produced))]
            produced += len(batch)
            invoked, returned = interval(client)
            waiting += batch
            entered.update(dict.fromkeys(batch, returned))
            history.append(Op("produce", client.name, invoked, returned, tuple(batch)))
        elif client.held:
            held, client.held = client.held, []
            roll = rng.random()
            if roll < 0.15:  # abandoned: the lease runs out a few steps later, at this moment
                deadline = t - rng.uniform(0, 2)
                waiting += held
                entered.update(dict.fromkeys(held))
                history += [Op("expire", client.name, deadline, INF, (item,)) for item in held]
            elif roll < 0.3:
                invoked, returned = interval(client)
                waiting += held
                entered.update(dict.fromkeys(held, returned))
                history.append(Op("retry", client.name, invoked, returned, tuple(held)))
            else:
                invoked, returned = interval(client)
                history.append(Op("complete", client.name, invoked, returned, tuple(held)))
        elif waiting:
            batch = rng.randint(1, 3)
            skip = (
                plant
                and planted_until is None
                and len(history) > 20
                and len(waiting) >= 2
                and (entered[waiting[0]] or INF) < t - 0.1
            )
            if skip:
                taken, skipped = [waiting.pop(1)], waiting[0]
                invoked, returned = interval(client, tight=True)
                planted_until = returned
            else:
                taken, waiting[:] = waiting[:batch], waiting[batch:]
                invoked, returned = interval(client)
                if planted_until is not None and skipped in taken:
                    # The skipped item's lease does not overlap the planted one.
                    invoked = max(invoked, planted_until + 0.01)
            client.held = taken
            history.append(Op("lease", client.name, invoked, returned, tuple(taken), batch=max(batch, 1)))
    assert not plant or planted_until is not None, "no place to plant the anomaly"
    return history


SEEDS = range(12)


@pytest.mark.parametrize("seed", SEEDS)
def test_generated_histories_of_a_correct_queue_are_linearizable(seed):
    history = simulated(seed)
    assert sum(len(op.items) for op in history if op.kind == "produce") == 40
    verdict = check(history, budget=50_000)
    assert verdict.linearizable, verdict.explain()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_planted_out_of_order_lease_is_rejected(seed):
    history = simulated(seed, plant=True)
    verdict = check(history, budget=50_000)
    # Rejected, not merely undecided: the search ran out of orders within its budget.
    assert verdict.linearizable is False, verdict.explain()
