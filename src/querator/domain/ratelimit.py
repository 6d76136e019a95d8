"""Domain layer: lease rate limits (a queue's ``rate_limit`` and ``rate_limit_per_group``).

A limit is a token bucket (docs/adr/0081-lease-rate-limits.md) whose burst is one second's worth
of tokens (at least one): over any ``T`` seconds a bucket hands out at most ``rate * T`` tokens
plus that burst. It is kept as one number, GCRA's *theoretical arrival time* (``tat``, whole
microseconds since the epoch): the time at which the bucket would be full again. Taking ``n``
tokens moves it ``n`` token intervals on; time refills it by itself, so nothing is written while
nobody leases and a bucket nobody took from for a second is full whatever it holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from querator.domain.errors import InvalidRequestError

#: The most a rate limit may be (leases a second): beyond it a limit would not limit anything a
#: queue can serve, and the token interval (a whole microsecond at least) stays exact.
MAX_RATE_LIMIT = 100_000.0
#: The least a non-zero limit may be (one lease a day): a smaller one is a mistake, not a limit.
MIN_RATE_LIMIT = 1 / 86_400
_SECOND_US = 1_000_000


#: ``MIN_RATE_LIMIT`` as a refusal shows it: rounded up, so the figure shown is itself allowed.
_LEAST_SHOWN = f"{math.ceil(MIN_RATE_LIMIT * 1e10) / 1e10:.10f}"


def validate_rate_limit(value: float, field: str) -> float:
    """Return ``value`` as a float: 0 (no limit) or leases a second in
    [``MIN_RATE_LIMIT``, ``MAX_RATE_LIMIT``]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequestError(f"{field} must be a number of leases a second", field=field)
    if value != 0 and not MIN_RATE_LIMIT <= value <= MAX_RATE_LIMIT:
        raise InvalidRequestError(
            f"{field} must be 0 (no limit) or between one a day (1/86400, {_LEAST_SHOWN})"
            f" and {MAX_RATE_LIMIT:g} leases a second",
            field=field,
        )
    # -0.0 is no limit too, and stored as 0.0 on every store (JSON would echo the sign).
    return float(value) if value != 0 else 0.0


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A bucket's shape: ``per_second`` tokens a second, a burst of one second's worth (at least one)."""

    per_second: float

    @property
    def interval_us(self) -> int:
        """Microseconds between two tokens (at least one)."""
        return max(1, round(_SECOND_US / self.per_second))

    @property
    def window_us(self) -> int:
        """How far ahead of now ``tat`` may be: the burst, in time (one second, or one interval)."""
        return max(_SECOND_US, self.interval_us)

    @property
    def burst(self) -> int:
        """Tokens a full bucket holds."""
        return self.window_us // self.interval_us


@dataclass(frozen=True, slots=True)
class Grant:
    """What a take gave: ``granted`` tokens, the bucket's new ``tat``, and ``next_us``: the first
    time (microseconds) at which a token is there again (``<= now``: there is one now)."""

    granted: int
    tat_us: int
    next_us: int


def take(tat_us: int | None, now_us: int, wanted: int, limit: RateLimit) -> Grant:
    """Take up to ``wanted`` tokens from a bucket at ``tat_us`` (``None``: never taken from, full).

    A ``tat`` further ahead than ``limit``'s window is kept as it is, though a lower rate set it
    before the queue's limit was raised: a lease's ``now`` is read before it waits on the store, so
    a bucket another lease filled meanwhile looks the same, and reading it as a fresh bucket would
    let a burst through (the limit raised waits out the old rate's next token; docs/api.md).
    """
    base = now_us if tat_us is None else max(tat_us, now_us)
    available = max(0, (now_us + limit.window_us - base) // limit.interval_us)
    granted = min(max(wanted, 0), available)
    new_tat = base + granted * limit.interval_us
    return Grant(granted, new_tat, new_tat + limit.interval_us - limit.window_us)


def give_back(tat_us: int | None, count: int, limit: RateLimit) -> int | None:
    """The bucket's ``tat`` after ``count`` tokens taken and not used come back (a lease that
    claimed fewer items than it took tokens for). Below now it is simply a full bucket."""
    if tat_us is None:
        return None
    return tat_us - count * limit.interval_us
