"""Spark producer: which errors are retried, bounded backoff with full jitter, and pacing (no Spark)."""

from __future__ import annotations

import random

import pytest

from querator.domain.errors import (
    QueueNotFoundError,
    RequestInProgressError,
    StoreThrottledError,
    StoreUnavailableError,
)
from querator.spark.retry import (
    DEFAULT_IN_PROGRESS_WAIT,
    RateLimiter,
    RetriesExhaustedError,
    RetryPolicy,
    call_with_retries,
    is_retryable,
)

pytestmark = pytest.mark.spark


# -- retries --------------------------------------------------------------------------


def test_retryable_errors_are_throttling_in_progress_and_transient_unavailability():
    assert is_retryable(StoreThrottledError())
    assert is_retryable(RequestInProgressError())
    assert is_retryable(StoreUnavailableError(store_code="InternalServerError"))
    assert not is_retryable(StoreUnavailableError(store_code="ResourceNotFoundException"))
    assert not is_retryable(QueueNotFoundError())
    assert not is_retryable(RuntimeError())


def test_call_with_retries_backs_off_with_capped_full_jitter_then_succeeds():
    outcomes = [StoreThrottledError(), StoreThrottledError(), StoreThrottledError(), "ok"]
    slept: list[float] = []

    def call() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    policy = RetryPolicy(max_attempts=5, base_delay=1.0, max_delay=2.5)
    result, attempts = call_with_retries(call, policy=policy, sleep=slept.append, rng=random.Random(1))
    assert (result, attempts) == ("ok", 4)
    assert len(slept) == 3
    for retry, delay in enumerate(slept):
        assert 0 <= delay <= min(2.5, 2**retry)


def test_call_with_retries_gives_up_after_max_attempts_with_the_last_error():
    calls = 0

    def call() -> None:
        nonlocal calls
        calls += 1
        raise StoreThrottledError("still throttled")

    with pytest.raises(RetriesExhaustedError, match="3 attempts") as caught:
        call_with_retries(call, policy=RetryPolicy(max_attempts=3), sleep=lambda _: None)
    assert calls == 3
    assert isinstance(caught.value.last, StoreThrottledError)


def test_call_with_retries_does_not_retry_other_errors():
    calls = 0

    def call() -> None:
        nonlocal calls
        calls += 1
        raise QueueNotFoundError()

    with pytest.raises(QueueNotFoundError):
        call_with_retries(call, policy=RetryPolicy(max_attempts=5), sleep=lambda _: None)
    assert calls == 1


def test_an_in_progress_chunk_is_retried_until_its_record_can_be_taken_over():
    time = FakeTime()
    in_progress_until = time.now + 900  # the service takes a pending record over after 15 minutes
    calls = 0

    def call() -> str:
        nonlocal calls
        calls += 1
        if time.now < in_progress_until:
            raise RequestInProgressError()
        return "resumed"

    policy = RetryPolicy(max_attempts=3)
    assert DEFAULT_IN_PROGRESS_WAIT > 900
    result, attempts = call_with_retries(
        call, policy=policy, sleep=time.sleep, clock=time.clock, rng=random.Random(2)
    )
    assert result == "resumed"
    assert attempts == calls > policy.max_attempts
    assert max(time.slept) <= policy.max_delay


def test_an_in_progress_chunk_gives_up_after_the_in_progress_wait():
    time = FakeTime()

    def call() -> None:
        raise RequestInProgressError()

    policy = RetryPolicy(max_attempts=3, in_progress_wait=60)
    with pytest.raises(RetriesExhaustedError):
        call_with_retries(call, policy=policy, sleep=time.sleep, clock=time.clock, rng=random.Random(3))
    assert 60 <= time.now - 100 <= 60 + policy.max_delay


# -- pacing ---------------------------------------------------------------------------------------


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_rate_limiter_paces_chunks_to_the_average_rate():
    time = FakeTime()
    limiter = RateLimiter(100.0, clock=time.clock, sleep=time.sleep)
    start = time.now
    for _ in range(5):
        limiter.acquire(50)
    # 250 items went out after 4 waits of 0.5 s: the 5th chunk starts at 2.0 s, 200 items before it.
    assert time.slept == [0.5, 0.5, 0.5, 0.5]
    assert time.now - start == pytest.approx(2.0)


def test_rate_limiter_does_not_wait_when_work_is_slower_than_the_limit():
    time = FakeTime()
    limiter = RateLimiter(100.0, clock=time.clock, sleep=time.sleep)
    limiter.acquire(50)
    time.now += 10
    assert limiter.acquire(50) == 0
    assert time.slept == []


def test_no_rate_limit_never_waits():
    time = FakeTime()
    limiter = RateLimiter(None, clock=time.clock, sleep=time.sleep)
    assert all(limiter.acquire(1000) == 0 for _ in range(3))
    assert time.slept == []


def test_pacing_charges_only_what_was_written():
    # As the writer paces write units: wait for the earlier chunks' share, charge a chunk once stored.
    time = FakeTime()
    pacer = RateLimiter(800.0, clock=time.clock, sleep=time.sleep)
    pacer.acquire(0)
    pacer.charge(400)  # a chunk of 400 units written
    pacer.acquire(0)  # the next one waits half a second
    # a replayed chunk wrote nothing: nothing charged, the one after it goes at once
    pacer.acquire(0)
    assert time.slept == [0.5]


def test_pacing_counts_a_chunks_share_from_when_it_went_out():
    # A chunk of 400 units at 800 a second has half a second; its write took 0.3 s of it.
    time = FakeTime()
    pacer = RateLimiter(800.0, clock=time.clock, sleep=time.sleep)
    pacer.acquire(0)
    time.now += 0.3
    pacer.charge(400)
    # the next chunk waits the rest of the share, not a whole share more
    assert pacer.acquire(0) == pytest.approx(0.2)
    # a write slower than its share leaves nothing to wait
    time.now += 0.7
    pacer.charge(400)
    assert pacer.acquire(0) == 0
    assert time.slept == [pytest.approx(0.2)]
