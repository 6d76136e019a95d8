"""Spark producer: bounded retries (capped exponential backoff, full jitter) and a per-partition rate limit.

Pure apart from the injected ``sleep`` and ``clock``, so the tests drive both with fakes. Which
errors are worth retrying is decided here once, for both write paths: the store throttled or was
briefly unavailable, or another attempt of the same chunk is still writing.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from querator.domain.errors import RequestInProgressError, RetryLaterError, StoreUnavailableError
from querator.service import IDEMPOTENCY_STALE_AFTER

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")

#: A store that says the table does not exist will not change its mind within a retry budget.
_PERMANENT_STORE_CODES = frozenset({"ResourceNotFoundException"})
#: A chunk whose earlier attempt died mid-write stays "in progress" until its record is stale, then
#: the next attempt takes it over and finishes it without duplicates (docs/adr/0004). Waiting that
#: long lets a retried task finish the job by itself instead of failing it.
DEFAULT_IN_PROGRESS_WAIT = IDEMPOTENCY_STALE_AFTER.total_seconds() + 60


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How often and how patiently one produce call is retried.

    The defaults wait at most about a minute in total per chunk (the sum of the caps), which rides
    out DynamoDB's adaptive capacity and on-demand scaling but not a table that stays throttled.
    """

    #: Calls in total, the first included.
    max_attempts: int = 10
    #: Cap of the first delay; each retry doubles it.
    base_delay: float = 0.1
    #: No single delay is longer than this.
    max_delay: float = 10.0
    #: Seconds to keep retrying a chunk that another attempt is still writing, or that a dead
    #: attempt left half-written (``RequestInProgressError``); these retries do not count against
    #: ``max_attempts``. 0 treats them like any other retryable error.
    in_progress_wait: float = DEFAULT_IN_PROGRESS_WAIT

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base_delay < 0 or self.max_delay < 0 or self.in_progress_wait < 0:
            raise ValueError("delays may not be negative")

    def delay(self, retry: int, rng: random.Random) -> float:
        """Full jitter (AWS's recommendation): uniform over [0, min(cap, base * 2**retry)]."""
        return rng.uniform(0, min(self.max_delay, self.base_delay * 2**retry))


class RetriesExhaustedError(Exception):
    """A call still failed with a retryable error when its attempts ran out."""

    def __init__(self, attempts: int, last: BaseException) -> None:
        super().__init__(f"gave up after {attempts} attempts: {type(last).__name__}: {last}")
        self.attempts = attempts
        self.last = last


def is_retryable(exc: BaseException) -> bool:
    """Throttled, briefly unavailable, or the same idempotent produce still in progress elsewhere."""
    if isinstance(exc, RetryLaterError | RequestInProgressError):
        return True
    if isinstance(exc, StoreUnavailableError):
        return exc.context.get("store_code") not in _PERMANENT_STORE_CODES
    return False


def call_with_retries(
    call: Callable[[], T],
    *,
    policy: RetryPolicy,
    retryable: Callable[[BaseException], bool] = is_retryable,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
) -> tuple[T, int]:
    """Run ``call`` until it succeeds; return its result and the number of attempts made.

    Raises
    ------
    RetriesExhaustedError
        ``policy.max_attempts`` attempts failed with a retryable error, or an in-progress chunk
        stayed in progress for longer than ``policy.in_progress_wait``.
    Exception
        Any error ``retryable`` refuses, at once, unchanged.
    """
    rng = rng or random.Random()  # noqa: S311 - spreading retries, not security
    started = clock()
    attempts = counted = 0
    while True:
        attempts += 1
        try:
            return call(), attempts
        except Exception as exc:
            if not retryable(exc):
                raise
            waiting = isinstance(exc, RequestInProgressError) and policy.in_progress_wait > 0
            if waiting:
                if clock() - started >= policy.in_progress_wait:
                    raise RetriesExhaustedError(attempts, exc) from exc
            else:
                counted += 1
                if counted >= policy.max_attempts:
                    raise RetriesExhaustedError(attempts, exc) from exc
            sleep(policy.delay(min(attempts - 1, 30), rng))


class RateLimiter:
    """Paces one Spark partition to at most ``items_per_second`` on average (``None``: no limit).

    A chunk goes out when the previous one's share of time has passed, so the average rate over the
    partition stays under the limit while each chunk is still one produce call.
    """

    def __init__(
        self,
        items_per_second: float | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if items_per_second is not None and items_per_second <= 0:
            raise ValueError("items_per_second must be greater than zero")
        self._rate = items_per_second
        self._clock = clock
        self._sleep = sleep
        self._next: float | None = None

    def acquire(self, items: int) -> float:
        """Wait until ``items`` more may go out; return the seconds waited."""
        if self._rate is None:
            return 0.0
        now = self._clock()
        start = now if self._next is None else max(now, self._next)
        waited = start - now
        if waited > 0:
            self._sleep(waited)
        self._next = start + items / self._rate
        return waited

    def charge(self, items: int) -> None:
        """Count ``items`` already sent: the next ``acquire`` waits for their share of time, counted
        from when they went out (the last ``acquire``), not from now. Counting from now would add
        each chunk's share on top of the time its write took, a rate below the limit by as much as
        the writes take (a third of the time in the Spark benchmark)."""
        if self._rate is None:
            return
        start = self._clock() if self._next is None else self._next
        self._next = start + items / self._rate


__all__ = ["RateLimiter", "RetriesExhaustedError", "RetryPolicy", "call_with_retries", "is_retryable"]
