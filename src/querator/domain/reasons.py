"""Domain layer: the failure reasons the service records on an item, and when.

An item keeps why it last failed (``Item.last_reason``) and how many failures were recorded on it
(``Item.failures``), through retries, dead-lettering and redrive, so an operator looking at a dead
letter sees its cause. Each failure sets the reason and adds one:

- ``queue.retry`` with a ``reason``: that reason. Without one nothing is recorded (a worker putting
  back items it never ran, as it stops, is no failure).
- A lease that ran out with attempts left (found by a lease or the reaper): ``LEASE_RAN_OUT``.
- Dead-lettered by the service, because the item used its ``max_attempts`` or outlived
  ``expire_timeout``: ``"max attempts"`` or ``"expired"``, then ``": "`` and what ended its last
  attempt (the consumer's reason, or ``"lease ran out"``), or else the reason it already had
  (``"max attempts: ValueError: bad input"``), so the consumer's cause stays in sight.

Reasons are at most ``MAX_REASON_BYTES`` of UTF-8; a combined one is cut to fit (``…``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from querator.domain.lifecycle import Action

if TYPE_CHECKING:
    from datetime import datetime

    from querator.domain.lifecycle import Decision, RetryPlan
    from querator.domain.model import Item

#: The service's own reasons.
LEASE_RAN_OUT = "lease ran out"
MAX_ATTEMPTS = "max attempts"
EXPIRED = "expired"


def ended(item: Item, why: str, cause: str = "") -> Item:
    """``item`` as the service dead-letters it for ``why`` (``MAX_ATTEMPTS``, ``EXPIRED``): one more
    failure, its reason ``why`` and the ``cause`` of the attempt that just ended (else the reason the
    item already had)."""
    last = cause or item.last_reason
    return item.with_failure(f"{why}: {last}" if last else why)


def after_retry(item: Item, plan: RetryPlan, reason: str) -> Item:
    """``item`` as ``queue.retry`` with the consumer's ``reason`` puts it back (or dead-letters it)."""
    if plan.action is Action.DEAD_LETTER and plan.reason == "max_attempts":
        return ended(item, MAX_ATTEMPTS, reason)
    return item.with_failure(reason) if reason else item


def after_decision(item: Item, decision: Decision, now: datetime) -> Item:
    """``item`` as the service takes it back on a lifecycle decision (``decide_for_lease``): its lease
    ran out (requeued), it used its attempts, or it expired; other decisions (a straggler put back
    unleased) record nothing. ``item.lease_deadline`` says whether it was leased."""
    lapsed = item.lease_deadline is not None and item.lease_deadline <= now
    if decision.reason == "lease_expired":
        return item.with_failure(LEASE_RAN_OUT)
    if decision.reason == "max_attempts":
        return ended(item, MAX_ATTEMPTS, LEASE_RAN_OUT)
    if decision.reason == "expired":
        return ended(item, EXPIRED, LEASE_RAN_OUT if lapsed else "")
    return item


__all__ = ["EXPIRED", "LEASE_RAN_OUT", "MAX_ATTEMPTS", "after_decision", "after_retry", "ended"]
