"""Domain layer: lifecycle decisions, pure functions of an item, its queue's policy and ``now``.

The lease path and the reaper both ask these functions what to do with an item and then let the
storage layer do it, so the two can never disagree (Querator's scan-for-actions / take-action split).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datetime import datetime, timedelta

    from querator.domain.model import ItemState, QueueInfo, RetryRequest


class Action(enum.Enum):
    #: Nothing to do: the item is validly leased, or not due.
    KEEP = "keep"
    #: Hand the item to the consumer asking for it.
    LEASE = "lease"
    #: The lease ran out with attempts left: back to the tail under a new id.
    REQUEUE = "requeue"
    #: Ran out of attempts or outlived ``expire_timeout``: to the dead-letter queue, or deleted.
    DEAD_LETTER = "dead_letter"


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    #: Why, for logs and reports: "max_attempts", "expired", "lease_expired", "dead", "" otherwise.
    reason: str = ""


#: The two answers a lease page gives for nearly every item, made once (a lease of one reads 50 or more).
_KEEP = Decision(Action.KEEP)
_LEASE = Decision(Action.LEASE)


def attempts_exhausted(attempts: int, max_attempts: int) -> bool:
    """``max_attempts`` counts leases; 0 means unlimited."""
    return max_attempts > 0 and attempts >= max_attempts


def expire_deadline(visible_at: datetime, expire_timeout: timedelta) -> datetime:
    """An item expires ``expire_timeout`` after it first becomes visible (its produce or enqueue time)."""
    return visible_at + expire_timeout


def decide_for_lease(item: ItemState, queue: QueueInfo, now: datetime) -> Decision:
    """What a consumer asking for work at ``now`` does with a due item it found.

    A valid lease is never taken away: a leased item whose deadline is still ahead is kept, even
    when it is past its expire deadline (the reaper or the next lease deals with it afterwards).
    """
    if item.lease_deadline is not None and item.lease_deadline > now:
        return _KEEP
    if item.expire_deadline <= now:
        return Decision(Action.DEAD_LETTER, "expired")
    if item.lease_deadline is not None:
        if attempts_exhausted(item.attempts, queue.max_attempts):
            return Decision(Action.DEAD_LETTER, "max_attempts")
        return Decision(Action.REQUEUE, "lease_expired")
    return _LEASE


def decide_for_reaper(item: ItemState, queue: QueueInfo, now: datetime) -> Decision:
    """What the reaper does with an item: only what nobody else would do.

    It dead-letters items that ran out of attempts or outlived ``expire_timeout``. Items whose
    lease ran out with attempts left are kept: the next lease requeues them at the tail, and doing
    it here too would only double the writes.
    """
    decision = decide_for_lease(item, queue, now)
    if decision.action is Action.DEAD_LETTER:
        return decision
    return Decision(Action.KEEP)


@dataclass(frozen=True, slots=True)
class RetryPlan:
    action: Action
    #: For ``REQUEUE``: when the item becomes visible again.
    visible_at: datetime | None = None
    reason: str = ""


def plan_retry(request: RetryRequest, attempts: int, queue: QueueInfo, now: datetime) -> RetryPlan:
    """Where a retried item goes: the tail now, a scheduled time, or the dead-letter queue.

    An item that has used all its attempts goes to the dead-letter queue even when the consumer
    asked for a plain retry: another lease would exceed ``max_attempts``.
    """
    if request.dead:
        return RetryPlan(Action.DEAD_LETTER, reason="dead")
    if attempts_exhausted(attempts, queue.max_attempts):
        return RetryPlan(Action.DEAD_LETTER, reason="max_attempts")
    if request.retry_at is not None and request.retry_at > now:
        return RetryPlan(Action.REQUEUE, visible_at=request.retry_at, reason="retry_at")
    return RetryPlan(Action.REQUEUE, visible_at=now, reason="retry")
