"""HTTP wire layer: Go durations and RFC 3339 timestamps, as the contract spells them.

Durations are Go ``time.ParseDuration`` syntax on input (``"300ms"``, ``"1h30m"``) and Go's canonical
``Duration.String()`` form on output (``"1m0s"``), so a Querator client reads what it wrote. Python's
``timedelta`` stops at microseconds, so nanoseconds are truncated toward zero on input.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from fractions import Fraction

from querator.domain.errors import InvalidRequestError

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

_NS_PER_UNIT = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 MICRO SIGN, what Go prints
    "μs": 1_000,  # U+03BC GREEK SMALL LETTER MU, which Go accepts as well
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
#: Go's Duration is an int64 of nanoseconds (about 292 years); refuse what Go would refuse.
_MAX_NS = 2**63 - 1
#: No valid duration needs more; the cap keeps a hostile string from costing big-integer work.
_MAX_DURATION_CHARS = 100
#: One ``[0-9]*(.[0-9]*)?unit`` group; like Go, the unit is every character up to the next number.
_COMPONENT = re.compile(r"([0-9]*)(?:\.([0-9]*))?([^0-9.]*)")

_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})"
    r"(?:\.([0-9]{1,9}))?(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)


def parse_duration(text: str) -> timedelta:
    """Parse a Go duration string (``"300ms"``, ``"1.5h"``, ``"1h30m"``, ``"-1s"``, ``"0"``).

    Raises
    ------
    InvalidRequestError
        When ``text`` is not Go duration syntax, has an unknown unit, or is out of Go's range.
    """
    if len(text) > _MAX_DURATION_CHARS:
        raise InvalidRequestError(f"invalid duration: longer than {_MAX_DURATION_CHARS} characters")
    rest = text
    negative = False
    if rest[:1] in ("-", "+"):
        negative = rest[0] == "-"
        rest = rest[1:]
    # Go's one exception to "a unit is required": a bare zero.
    if rest == "0":
        return timedelta(0)
    if not rest:
        raise InvalidRequestError(f"invalid duration {text!r}: expected a number and a unit, e.g. '30s'")
    total = Fraction(0)
    position = 0
    while position < len(rest):
        match = _COMPONENT.match(rest, position)
        # Every character starts a number, a '.' or a unit, so the match always advances; the check
        # only keeps a future edit of the pattern from looping forever.
        if match is None or match.end() == position:
            raise InvalidRequestError(f"invalid duration {text!r}")
        whole, fraction, unit = match.groups()
        if not whole and not fraction:
            raise InvalidRequestError(f"invalid duration {text!r}: a number must come before each unit")
        if not unit:
            raise InvalidRequestError(f"invalid duration {text!r}: missing unit (ns, us, ms, s, m, h)")
        scale = _NS_PER_UNIT.get(unit)
        if scale is None:
            raise InvalidRequestError(
                f"invalid duration {text!r}: unknown unit {unit!r} (use ns, us, ms, s, m, h)"
            )
        total += int(whole or "0") * scale
        if fraction:
            total += Fraction(int(fraction), 10 ** len(fraction)) * scale
        if total > _MAX_NS:
            raise InvalidRequestError(f"invalid duration {text!r}: out of range")
        position = match.end()
    microseconds = int(total / 1000)  # int() truncates toward zero, as Go drops sub-ns fractions
    return timedelta(microseconds=-microseconds if negative else microseconds)


def format_duration(value: timedelta) -> str:
    """Format ``value`` in Go's canonical ``Duration.String()`` form: ``"1h0m0s"``, ``"1.5s"``, ``"3ms"``."""
    nanoseconds = _total_microseconds(value) * 1000
    if nanoseconds == 0:
        return "0s"
    size = abs(nanoseconds)
    if size < 1_000:
        text = f"{size}ns"
    elif size < 1_000_000:
        text = _decimal(size, 3) + "µs"
    elif size < 1_000_000_000:
        text = _decimal(size, 6) + "ms"
    else:
        # Go never folds hours into days: 24h is "24h0m0s".
        seconds, fraction_ns = divmod(size, 1_000_000_000)
        minutes, second = divmod(seconds, 60)
        hours, minute = divmod(minutes, 60)
        text = _decimal(second * 1_000_000_000 + fraction_ns, 9) + "s"
        if minutes:
            text = f"{minute}m{text}"
        if hours:
            text = f"{hours}h{text}"
    return "-" + text if nanoseconds < 0 else text


def _decimal(value: int, digits: int) -> str:
    """``value / 10**digits`` without trailing zeros (Go's ``fmtFrac``)."""
    whole, fraction = divmod(value, 10**digits)
    decimals = f"{fraction:0{digits}d}".rstrip("0")
    return f"{whole}.{decimals}" if decimals else str(whole)


def _total_microseconds(value: timedelta) -> int:
    # Exact integer arithmetic: ``total_seconds()`` is a float and loses microseconds past ~285 years.
    return (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds


def parse_timestamp(text: str) -> datetime:
    """Parse an RFC 3339 timestamp (``Z`` or a numeric offset) into an aware UTC datetime.

    Fractions beyond microseconds are truncated. Timestamps without an offset are refused: a naive
    time would be read in whatever zone the server runs in.

    Raises
    ------
    InvalidRequestError
        When ``text`` is not RFC 3339 or names an impossible date or time.
    """
    match = _RFC3339.fullmatch(text)
    if match is None:
        raise InvalidRequestError(
            f"invalid timestamp {text!r}: expected RFC 3339 with an offset, e.g. '2026-11-22T05:33:11Z'"
        )
    year, month, day, hour, minute, second, fraction, zulu, sign, off_hours, off_minutes = match.groups()
    if zulu:
        zone = UTC
    else:
        if int(off_hours) > 23 or int(off_minutes) > 59:
            raise InvalidRequestError(f"invalid timestamp {text!r}: bad offset")
        offset = timedelta(hours=int(off_hours), minutes=int(off_minutes))
        zone = timezone(-offset if sign == "-" else offset)
    microsecond = int((fraction or "").ljust(6, "0")[:6])
    try:
        parsed = datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), microsecond, tzinfo=zone
        )
        return parsed.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        # Also leap seconds (":60"), which datetime cannot hold.
        raise InvalidRequestError(f"invalid timestamp {text!r}: {exc}") from exc


def format_timestamp(value: datetime) -> str:
    """Format an aware datetime as RFC 3339 in UTC: ``2026-11-22T05:33:11.123456Z``.

    Always six fractional digits, so the strings sort in time order (``11Z`` would sort after
    ``11.5Z``).

    Raises
    ------
    InvalidRequestError
        When ``value`` is naive.
    """
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidRequestError("timestamp must be timezone-aware")
    utc = value.astimezone(UTC)
    return (
        f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}T{utc.hour:02d}:{utc.minute:02d}:{utc.second:02d}"
        f".{utc.microsecond:06d}Z"
    )
