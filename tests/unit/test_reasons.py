"""Unit: the failure reasons the domain records on an item (``querator.domain.reasons``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from querator.domain import reasons
from querator.domain.errors import InvalidRequestError
from querator.domain.lifecycle import Action, Decision, RetryPlan
from querator.domain.model import MAX_REASON_BYTES, Item, RetryRequest, StorageItem, validate_reason
from querator.domain.text import clip_utf8

pytestmark = pytest.mark.disable_socket

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def item(**fields: object) -> Item:
    return Item(id="0" * 30, created_at=NOW, expire_deadline=NOW + timedelta(hours=1), **fields)  # type: ignore[arg-type]


def test_a_retry_with_a_reason_records_it_and_counts_one_failure():
    back = reasons.after_retry(item(), RetryPlan(Action.REQUEUE, NOW, "retry"), "ValueError: bad input")

    assert (back.last_reason, back.failures) == ("ValueError: bad input", 1)
    again = reasons.after_retry(back, RetryPlan(Action.REQUEUE, NOW, "retry"), "TimeoutError")
    assert (again.last_reason, again.failures) == ("TimeoutError", 2)


def test_a_retry_without_a_reason_records_nothing():
    failed = item(last_reason="TimeoutError", failures=2)

    assert reasons.after_retry(failed, RetryPlan(Action.REQUEUE, NOW, "retry"), "") == failed
    assert reasons.after_retry(failed, RetryPlan(Action.DEAD_LETTER, reason="dead"), "") == failed


def test_a_retry_on_the_last_attempt_keeps_the_consumers_reason_after_max_attempts():
    plan = RetryPlan(Action.DEAD_LETTER, reason="max_attempts")

    assert reasons.after_retry(item(failures=2), plan, "boom").last_reason == "max attempts: boom"
    assert reasons.after_retry(item(failures=2), plan, "boom").failures == 3
    # Without a reason this time: the one it had; without any: the service's alone.
    before = item(last_reason="old", failures=1)
    assert reasons.after_retry(before, plan, "").last_reason == "max attempts: old"
    assert reasons.after_retry(item(), plan, "").last_reason == "max attempts"


@pytest.mark.parametrize(
    ("decision", "lease_deadline", "expected"),
    [
        ("lease_expired", NOW, "lease ran out"),
        ("max_attempts", NOW, "max attempts: lease ran out"),
        ("expired", NOW, "expired: lease ran out"),
        ("expired", None, "expired: TimeoutError"),
        ("expired", NOW + timedelta(seconds=1), "expired: TimeoutError"),
    ],
)
def test_the_services_own_reasons(decision, lease_deadline, expected):
    found = item(last_reason="TimeoutError", failures=1, lease_deadline=lease_deadline)

    taken = reasons.after_decision(found, Decision(Action.DEAD_LETTER, decision), NOW)

    assert (taken.last_reason, taken.failures) == (expected, 2)


def test_a_straggler_put_back_records_nothing():
    found = item()

    assert reasons.after_decision(found, Decision(Action.REQUEUE, "straggler"), NOW) == found


def test_a_combined_reason_is_cut_to_the_limit_at_a_character_boundary():
    long = "é" * MAX_REASON_BYTES  # two bytes each

    ended = reasons.ended(item(), reasons.MAX_ATTEMPTS, long[: MAX_REASON_BYTES // 2])

    assert len(ended.last_reason.encode()) <= MAX_REASON_BYTES
    assert ended.last_reason.startswith("max attempts: éé") and ended.last_reason.endswith("…")
    validate_reason(ended.last_reason)


def test_clip_keeps_the_start_or_the_end():
    assert clip_utf8("abcdef", 10) == "abcdef"
    assert clip_utf8("abcdefghij" * 2, 10) == "abcdefg…"
    assert clip_utf8("abcdefghij" * 2, 10, keep_end=True) == "…defghij"
    assert len(clip_utf8("€" * 100, 10).encode()) <= 10


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("x" * (MAX_REASON_BYTES + 1), "reason is longer than 1024 bytes"),
        ("é" * 513, "reason is longer than 1024 bytes"),
        ("two\nlines", "reason may not hold control characters"),
        ("\x1b[31mred", "reason may not hold control characters"),
    ],
)
def test_a_reason_over_the_limit_or_with_control_characters_is_refused(reason, message):
    with pytest.raises(InvalidRequestError, match=message) as caught:
        RetryRequest(id="a", reason=reason)

    assert caught.value.context.get("field") == "reason"


def test_a_reason_of_exactly_the_limit_is_taken():
    assert RetryRequest(id="a", reason="x" * MAX_REASON_BYTES).reason == "x" * MAX_REASON_BYTES
    assert RetryRequest(id="a", reason="é" * 512).reason == "é" * 512


def test_an_import_checks_what_it_keeps():
    with pytest.raises(InvalidRequestError, match="last_reason"):
        StorageItem(last_reason="x" * (MAX_REASON_BYTES + 1))
    with pytest.raises(InvalidRequestError, match="failures"):
        StorageItem(failures=-1)


def test_dead_letters_and_redriven_items_keep_the_failures():
    failed = item(last_reason="boom", failures=3)

    dead = failed.as_dead_letter(new_id="1" * 30, source_queue="jobs", expire_deadline=NOW)
    back = dead.as_redriven(new_id="2" * 30, now=NOW, expire_deadline=NOW)

    assert (dead.last_reason, dead.failures, dead.source_queue) == ("boom", 3, "jobs")
    assert (back.last_reason, back.failures, back.attempts) == ("boom", 3, 0)


def test_a_reason_counts_in_the_reply_size():
    assert item(last_reason="x" * 100).reply_size() == item().reply_size() + 200
