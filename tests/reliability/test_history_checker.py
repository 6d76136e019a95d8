"""The history checker on hand-written histories: it passes what the model allows and names what it
does not, so the concurrent history test (``test_history.py``) can fail only for the store's faults.

Times are milliseconds after a fixed instant; leases last 2 seconds, as in the concurrent test.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.reliability.history import Event, History, check

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=2)


def at(ms: float) -> datetime:
    return T0 + timedelta(milliseconds=ms)


def produce(ms: float, *items: tuple[str, str]) -> Event:
    return Event("produce", "producer-0", at(ms), at(ms + 1), items=items)


def lease(
    thread: str, invoked: float, returned: float, item: tuple[str, str], attempts: int, clock_read: float
) -> Event:
    """A lease of one item whose deadline is the call's clock read (at or after ``invoked``) plus
    the lease timeout."""
    return Event(
        "lease",
        thread,
        at(invoked),
        at(returned),
        items=(item,),
        deadlines=(at(clock_read) + LEASE,),
        attempts=(attempts,),
    )


def end(kind: str, thread: str, invoked: float, item: tuple[str, str]) -> Event:
    return Event(kind, thread, at(invoked), at(invoked + 0.2), items=(item,))  # type: ignore[arg-type]


def history_of(*events: Event) -> History:
    history = History()
    for event in events:
        history.record(event)
    return history


def test_a_lease_whose_clock_read_came_before_another_consumers_lease_and_retry_passes() -> None:
    # GIVEN the interleaving the concurrent test recorded on SQLite: consumer-0's call reads the
    #       clock at 2.5 ms and waits for the store; meanwhile consumer-2 leases the item (attempts
    #       2) and retries it; consumer-0's claim then takes the moved copy (attempts 3) with a
    #       deadline 2 ms earlier than consumer-2's
    first, second, third = ("a1", "x"), ("a5", "x"), ("a9", "x")
    history = history_of(
        produce(-3000, first),
        lease("consumer-1", -2500, -2499, first, 1, -2500),
        lease("consumer-0", 0, 7, third, 3, 2.5),
        lease("consumer-2", 4.8, 5.0, second, 2, 4.8),
        end("retry", "consumer-2", 5.1, second),
        end("complete", "consumer-0", 7.1, third),
    )

    # WHEN it is checked
    verdict = check(history, dead_letter_identities=[], left_in_queue=[])

    # THEN it satisfies the model: each lease was granted after the one before it ended
    assert verdict.violations == []
    assert verdict.completed == 1
    assert verdict.requeued == 2


def test_two_live_leases_of_one_item_are_a_violation() -> None:
    # GIVEN an item leased again, as a moved copy, while its first lease is live and not ended
    first, copy = ("a1", "x"), ("a5", "x")
    history = history_of(
        produce(0, first),
        lease("consumer-0", 10, 11, first, 1, 10),
        lease("consumer-1", 500, 501, copy, 2, 500),
        end("complete", "consumer-1", 600, copy),
    )

    # WHEN it is checked
    verdict = check(history, dead_letter_identities=[], left_in_queue=[])

    # THEN the checker names the double delivery
    assert any("leased again" in v and "was live" in v for v in verdict.violations), verdict.violations


def test_the_same_attempt_handed_out_twice_is_a_violation() -> None:
    # GIVEN the original position leased again after a copy of it was leased (both attempts 1)
    first, copy = ("a1", "x"), ("a5", "x")
    history = history_of(
        produce(0, first),
        lease("consumer-0", 10, 11, first, 1, 10),
        end("retry", "consumer-0", 12, first),
        lease("consumer-1", 20, 21, copy, 1, 20),
        end("complete", "consumer-1", 30, copy),
    )

    # WHEN it is checked
    verdict = check(history, dead_letter_identities=[], left_in_queue=[])

    # THEN the attempts do not count the leases
    assert "x: attempts 1 then 1" in verdict.violations


def test_attempts_that_disagree_with_real_time_are_a_violation() -> None:
    # GIVEN a lease with attempts 2 that returned before the lease with attempts 1 was invoked
    first, copy = ("a1", "x"), ("a5", "x")
    history = history_of(
        produce(0, first),
        lease("consumer-0", 10, 11, copy, 2, 10),
        end("complete", "consumer-0", 12, copy),
        lease("consumer-1", 3000, 3001, first, 1, 3000),
        end("complete", "consumer-1", 3002, first),
    )

    # WHEN it is checked
    verdict = check(history, dead_letter_identities=[], left_in_queue=[])

    # THEN the order the store's attempts give is named as against real time, and the item as
    #      ended twice
    assert "x: the lease with attempts 2 returned before the one with attempts 1 was invoked" in (
        verdict.violations
    )
    assert "x ended 2 times (completed 2)" in verdict.violations


def test_a_first_lease_that_is_not_attempt_one_is_a_violation() -> None:
    # GIVEN one lease of an item, with attempts 2
    item = ("a1", "x")
    history = history_of(
        produce(0, item),
        lease("consumer-0", 10, 11, item, 2, 10),
        end("complete", "consumer-0", 12, item),
    )

    # WHEN it is checked
    verdict = check(history, dead_letter_identities=[], left_in_queue=[])

    # THEN the checker names it
    assert verdict.violations == ["x: first lease has attempts 2"]
