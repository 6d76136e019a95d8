"""Go durations and RFC 3339 timestamps on the wire (querator.api.durations)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from querator.api.durations import format_duration, format_timestamp, parse_duration, parse_timestamp
from querator.domain.errors import InvalidRequestError

US = timedelta(microseconds=1)
#: Go's Duration range (int64 nanoseconds), in the microseconds timedelta can hold.
GO_MAX = timedelta(microseconds=(2**63 - 1) // 1000)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # The cases of Go's time.ParseDuration tests, less those below a microsecond.
        ("0", timedelta(0)),
        ("-0", timedelta(0)),
        ("+0", timedelta(0)),
        ("5s", timedelta(seconds=5)),
        ("30s", timedelta(seconds=30)),
        ("1478s", timedelta(seconds=1478)),
        ("-5s", timedelta(seconds=-5)),
        ("+5s", timedelta(seconds=5)),
        ("-0s", timedelta(0)),
        ("5.0s", timedelta(seconds=5)),
        ("5.6s", timedelta(seconds=5.6)),
        ("5.s", timedelta(seconds=5)),
        (".5s", timedelta(milliseconds=500)),
        ("1.004s", timedelta(milliseconds=1004)),
        ("1.0040s", timedelta(milliseconds=1004)),
        ("100.00100s", timedelta(seconds=100, milliseconds=1)),
        ("11us", 11 * US),
        ("12µs", 12 * US),  # micro sign
        ("12μs", 12 * US),  # greek mu
        ("13ms", timedelta(milliseconds=13)),
        ("300ms", timedelta(milliseconds=300)),
        ("15m", timedelta(minutes=15)),
        ("16h", timedelta(hours=16)),
        ("1.5h", timedelta(minutes=90)),
        ("3h30m", timedelta(hours=3, minutes=30)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("10.5s4m", timedelta(minutes=4, seconds=10.5)),
        ("-2m3.4s", -timedelta(minutes=2, seconds=3.4)),
        ("1h2m3s4ms5us6ns", timedelta(hours=1, minutes=2, seconds=3, milliseconds=4, microseconds=5)),
        ("39h9m14.425s", timedelta(hours=39, minutes=9, seconds=14.425)),
        ("52763797000ns", timedelta(seconds=52, microseconds=763797)),
        ("0.3333333333333333333h", timedelta(minutes=20) - US),  # truncated, as Go does
        ("9223372036854775807ns", GO_MAX),
        ("9223372036854775.807us", GO_MAX),
        ("9223372036s854ms775us807ns", GO_MAX),
        ("1500ns", 1 * US),  # below a microsecond: truncated toward zero
        ("-1500ns", -1 * US),
        ("10ns", timedelta(0)),
    ],
)
def test_parse_duration_accepts_go_syntax(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "3",
        "-",
        "+",
        "s",
        ".",
        "-.",
        ".s",
        "+.s",
        "1.5",
        "1d",
        "1 s",
        " 1s",
        "1s ",
        "1e3s",
        "--1s",
        "1h-30m",
        "1S",
        "3000000h",  # over Go's int64 nanoseconds
        "9223372036854775808ns",
        "1" + "0" * 200 + "s",
    ],
)
def test_parse_duration_rejects_what_go_rejects(text: str) -> None:
    with pytest.raises(InvalidRequestError, match="invalid duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        # Go's Duration.String() cases, at microsecond precision.
        (timedelta(0), "0s"),
        (1 * US, "1µs"),
        (1100 * US, "1.1ms"),
        (timedelta(milliseconds=300), "300ms"),
        (timedelta(microseconds=999_999), "999.999ms"),
        (timedelta(seconds=1), "1s"),
        (timedelta(seconds=1.5), "1.5s"),
        (timedelta(seconds=2.2), "2.2s"),
        (timedelta(minutes=1), "1m0s"),
        (timedelta(minutes=1, seconds=1.5), "1m1.5s"),
        (timedelta(minutes=75), "1h15m0s"),
        (timedelta(hours=1), "1h0m0s"),
        (timedelta(hours=24), "24h0m0s"),
        (timedelta(days=2, microseconds=1), "48h0m0.000001s"),
        (timedelta(seconds=-1), "-1s"),
        (-1500 * US, "-1.5ms"),
        (timedelta(minutes=-4, seconds=-10.5), "-4m10.5s"),
        (GO_MAX, "2562047h47m16.854775s"),
    ],
)
def test_format_duration_is_go_canonical(value: timedelta, text: str) -> None:
    assert format_duration(value) == text
    assert parse_duration(text) == value


@given(st.timedeltas(min_value=-GO_MAX, max_value=GO_MAX))
def test_duration_round_trips(value: timedelta) -> None:
    assert parse_duration(format_duration(value)) == value


_UNITS = {"h": timedelta(hours=1), "m": timedelta(minutes=1), "s": timedelta(seconds=1), "ms": 1000 * US}


@given(st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(sorted(_UNITS))), min_size=1, max_size=6))
def test_duration_components_add_up(components: list[tuple[int, str]]) -> None:
    text = "".join(f"{number}{unit}" for number, unit in components)
    assert parse_duration(text) == sum((number * _UNITS[unit] for number, unit in components), timedelta(0))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-22T05:33:11Z", datetime(2026, 11, 22, 5, 33, 11, tzinfo=UTC)),
        ("2026-11-22t05:33:11z", datetime(2026, 11, 22, 5, 33, 11, tzinfo=UTC)),
        ("2026-11-22T05:33:11.123456Z", datetime(2026, 11, 22, 5, 33, 11, 123456, tzinfo=UTC)),
        ("2026-11-22T05:33:11.123456789Z", datetime(2026, 11, 22, 5, 33, 11, 123456, tzinfo=UTC)),
        ("2026-11-22T05:33:11.5+02:00", datetime(2026, 11, 22, 3, 33, 11, 500000, tzinfo=UTC)),
        ("2026-11-22T05:33:11-05:30", datetime(2026, 11, 22, 11, 3, 11, tzinfo=UTC)),
        ("2026-11-22T05:33:11-00:00", datetime(2026, 11, 22, 5, 33, 11, tzinfo=UTC)),
    ],
)
def test_parse_timestamp_gives_aware_utc(text: str, expected: datetime) -> None:
    parsed = parse_timestamp(text)
    assert parsed == expected
    assert parsed.tzinfo is UTC


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-22T05:33:11",  # naive: the zone would be the server's
        "2026-11-22",
        "2026-11-22 05:33:11Z",
        "20261122T053311Z",
        "2026-11-22T05:33Z",
        "2026-02-30T00:00:00Z",
        "2026-11-22T24:00:00Z",
        "2026-11-22T23:59:60Z",  # leap second: datetime cannot hold it
        "2026-11-22T05:33:11+24:00",
        "2026-11-22T05:33:11.Z",
        "2026-11-22T05:33:11.1234567890Z",
        "0000-01-01T00:00:00Z",
        "now",
    ],
)
def test_parse_timestamp_rejects_non_rfc3339(text: str) -> None:
    with pytest.raises(InvalidRequestError, match="invalid timestamp"):
        parse_timestamp(text)


def test_format_timestamp_is_utc_with_z_and_microseconds() -> None:
    assert format_timestamp(datetime(2026, 11, 22, 5, 33, 11, 123456, tzinfo=UTC)) == (
        "2026-11-22T05:33:11.123456Z"
    )
    assert format_timestamp(datetime(2026, 11, 22, 5, 33, 11, tzinfo=UTC)) == "2026-11-22T05:33:11.000000Z"
    plus_two = timezone(timedelta(hours=2))
    assert format_timestamp(datetime(2026, 11, 22, 5, 33, 11, tzinfo=plus_two)) == (
        "2026-11-22T03:33:11.000000Z"
    )


def test_format_timestamp_refuses_naive() -> None:
    with pytest.raises(InvalidRequestError):
        format_timestamp(datetime(2026, 11, 22, 5, 33, 11))  # naive on purpose


@given(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)))
def test_timestamp_round_trips(value: datetime) -> None:
    assert parse_timestamp(format_timestamp(value)) == value


@given(
    st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)),
    st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)),
)
def test_formatted_timestamps_sort_in_time_order(first: datetime, second: datetime) -> None:
    assert (format_timestamp(first) < format_timestamp(second)) == (first < second)
