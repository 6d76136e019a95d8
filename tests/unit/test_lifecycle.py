"""Unit: lifecycle decisions as properties (hypothesis)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from querator.domain.errors import InvalidRequestError
from querator.domain.lifecycle import Action, decide_for_lease, decide_for_reaper, plan_retry
from querator.domain.model import ItemState, QueueInfo, RetryRequest

NOW = datetime(2026, 6, 1, tzinfo=UTC)
offsets = st.integers(-10_000, 10_000).map(lambda s: NOW + timedelta(seconds=s))


@st.composite
def queues(draw):
    lease = timedelta(seconds=draw(st.integers(1, 600)))
    return QueueInfo(
        name="q",
        lease_timeout=lease,
        expire_timeout=lease + timedelta(seconds=draw(st.integers(0, 10_000))),
        max_attempts=draw(st.integers(0, 5)),
        created_at=NOW,
        updated_at=NOW,
    )


@st.composite
def states(draw):
    return ItemState(
        id="0" * 30,
        attempts=draw(st.integers(0, 6)),
        lease_deadline=draw(st.none() | offsets),
        expire_deadline=draw(offsets),
        created_at=NOW - timedelta(hours=1),
    )


@given(item=states(), queue=queues())
def test_a_valid_lease_is_never_taken_away(item, queue):
    if item.lease_deadline is not None and item.lease_deadline > NOW:
        assert decide_for_lease(item, queue, NOW).action is Action.KEEP
        assert decide_for_reaper(item, queue, NOW).action is Action.KEEP


@given(item=states(), queue=queues())
def test_only_never_leased_unexpired_items_are_leased(item, queue):
    decision = decide_for_lease(item, queue, NOW)
    assert (decision.action is Action.LEASE) == (item.lease_deadline is None and item.expire_deadline > NOW)


@given(item=states(), queue=queues())
def test_expired_leases_are_requeued_until_attempts_run_out(item, queue):
    decision = decide_for_lease(item, queue, NOW)
    lease_ran_out = item.lease_deadline is not None and item.lease_deadline <= NOW
    if lease_ran_out and item.expire_deadline > NOW:
        exhausted = queue.max_attempts > 0 and item.attempts >= queue.max_attempts
        assert decision.action is (Action.DEAD_LETTER if exhausted else Action.REQUEUE)


@given(item=states(), queue=queues())
def test_the_reaper_only_dead_letters_and_agrees_with_the_lease_path(item, queue):
    reaper = decide_for_reaper(item, queue, NOW)
    assert reaper.action in {Action.KEEP, Action.DEAD_LETTER}
    if reaper.action is Action.DEAD_LETTER:
        assert decide_for_lease(item, queue, NOW) == reaper


@given(queue=queues(), attempts=st.integers(0, 6), retry_at=st.none() | offsets, dead=st.booleans())
def test_retry_goes_to_the_tail_a_scheduled_time_or_the_dead_letter_queue(queue, attempts, retry_at, dead):
    plan = plan_retry(RetryRequest(id="x", retry_at=retry_at, dead=dead), attempts, queue, NOW)
    exhausted = queue.max_attempts > 0 and attempts >= queue.max_attempts
    if dead or exhausted:
        assert plan.action is Action.DEAD_LETTER
    else:
        assert plan.action is Action.REQUEUE
        assert plan.visible_at == (retry_at if retry_at is not None and retry_at > NOW else NOW)


@pytest.mark.parametrize(
    "fields",
    [
        {"lease_timeout": timedelta(0)},
        {"expire_timeout": timedelta(seconds=-1)},
        {"lease_timeout": timedelta(hours=2), "expire_timeout": timedelta(hours=1)},
        {"max_attempts": 65537},
        {"partitions": 0},
        {"reference": "x" * 2001},
        {"dead_queue": "q"},
    ],
)
def test_queue_info_refuses_invalid_values(fields):
    base = {"lease_timeout": timedelta(seconds=1), "expire_timeout": timedelta(hours=1)}
    with pytest.raises(InvalidRequestError):
        QueueInfo(name="q", created_at=NOW, updated_at=NOW, **{**base, **fields})
