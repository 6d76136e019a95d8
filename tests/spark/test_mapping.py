"""Spark producer, pure part: rows to items, row and chunk keys, chunking (no Spark)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from querator.domain.errors import InvalidRequestError
from querator.domain.model import MAX_PAYLOAD_BYTES, MAX_REFERENCE_BYTES, NewItem
from querator.spark.mapping import (
    MAX_CHUNK_WIRE_BYTES,
    ColumnMap,
    InvalidRowError,
    chunk_key,
    chunks_of,
    describe_row,
    item_digest,
    row_key,
    row_to_item,
    wire_size,
)

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

pytestmark = pytest.mark.spark

BODY = ColumnMap(payload=("body",))


# -- row_to_item ---------------------------------------------------------------------------------


def test_a_string_payload_is_stored_as_utf8():
    assert row_to_item({"body": "héllo"}, BODY).payload == "héllo".encode()


def test_a_binary_payload_is_stored_as_is():
    assert row_to_item({"body": bytearray(b"\x00\xff")}, BODY).payload == b"\x00\xff"


def test_a_single_non_text_payload_column_is_stored_as_json():
    assert row_to_item({"body": {"a": [1, 2]}}, BODY).payload == b'{"a":[1,2]}'


def test_several_payload_columns_make_a_json_object_in_column_order():
    columns = ColumnMap(payload=("b", "a", "when", "amount", "raw"))
    row = {
        "a": 1,
        "b": "x",
        "when": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        "amount": Decimal("1.10"),
        "raw": b"\x01",
    }
    payload = row_to_item(row, columns).payload
    assert payload.startswith(b'{"b":"x","a":1,')
    assert json.loads(payload) == {
        "b": "x",
        "a": 1,
        "when": "2026-01-02T03:04:05.000000Z",
        "amount": "1.10",
        "raw": "AQ==",
    }


def test_optional_columns_and_defaults_fill_the_item():
    columns = ColumnMap(
        payload=("body",), reference="ref", kind="kind", encoding="enc", enqueue_at="at", default_kind="k0"
    )
    item = row_to_item(
        {"body": "x", "ref": "r-1", "kind": None, "enc": "text/plain", "at": "2030-01-01T00:00:00+02:00"},
        columns,
    )
    assert item == NewItem(
        payload=b"x",
        reference="r-1",
        kind="k0",
        encoding="text/plain",
        enqueue_at=datetime(2029, 12, 31, 22, 0, tzinfo=UTC),
    )


def test_an_aware_datetime_enqueue_at_is_kept_in_utc_and_empty_means_now():
    columns = ColumnMap(payload=("body",), enqueue_at="at")
    at = datetime(2030, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=1)))
    assert row_to_item({"body": "x", "at": at}, columns).enqueue_at == datetime(2030, 1, 1, tzinfo=UTC)
    assert row_to_item({"body": "x", "at": ""}, columns).enqueue_at is None
    assert row_to_item({"body": "x", "at": None}, columns).enqueue_at is None


@pytest.mark.parametrize(
    ("row", "column", "fragment"),
    [
        ({"body": None}, "body", "null"),
        ({}, "body", "no such column"),
        ({"body": "x" * (MAX_PAYLOAD_BYTES + 1)}, "body", "more than"),
        ({"body": "x", "at": "tomorrow"}, "at", "invalid timestamp"),
        ({"body": "x", "at": "2030-01-01T00:00:00"}, "at", "invalid timestamp"),
        ({"body": "x", "at": datetime(2030, 1, 1)}, "at", "no time zone"),
        ({"body": "x", "at": 17}, "at", "expected a timestamp"),
        ({"body": "x", "ref": 5}, "ref", "expected a string"),
        ({"body": "x", "ref": "r" * (MAX_REFERENCE_BYTES + 1)}, "ref", "longer than"),
        ({"body": float("nan")}, "body", "JSON"),
        ({"body": object()}, "body", "JSON"),
    ],
)
def test_a_bad_row_raises_an_error_naming_its_column(row, column, fragment):
    columns = ColumnMap(payload=("body",), reference="ref", enqueue_at="at")
    row = {"ref": None, "at": None, **row}
    with pytest.raises(InvalidRowError, match=fragment) as caught:
        row_to_item(row, columns)
    assert caught.value.context["column"] == column
    assert isinstance(caught.value, InvalidRequestError)


PRIORITY = ColumnMap(payload=("body",), priority="prio")


@pytest.mark.parametrize(
    ("value", "priority"),
    [
        (0, 0),
        (9, 9),
        (3, 3),
        (None, 5),
        ("", 5),
        ("  ", 5),
        ("7", 7),
        (" 2 ", 2),
        ("05", 5),
        (Decimal("1"), 1),
    ],
)
def test_a_priority_column_gives_the_items_priority_and_null_or_empty_means_five(value, priority):
    assert row_to_item({"body": "x", "prio": value}, PRIORITY).priority == priority


def test_without_a_priority_column_every_item_has_priority_five():
    assert row_to_item({"body": "x", "prio": 1}, BODY).priority == 5


@pytest.mark.parametrize(
    "value", [10, -1, 99, "10", "-1", "high", "3.0", "²", 2.0, 2.5, True, Decimal("2.5"), [1], "1" * 200]
)
def test_a_bad_priority_is_an_invalid_row_naming_its_column(value):
    with pytest.raises(
        InvalidRowError, match=r"prio: the priority must be an integer between 0 and 9, got"
    ) as caught:
        row_to_item({"body": "x", "prio": value}, PRIORITY)
    assert caught.value.context["column"] == "prio"
    assert isinstance(caught.value, InvalidRequestError)
    assert len(str(caught.value)) < 120  # a long value is cut short in the report


GROUP = ColumnMap(payload=("body",), group="grp")


@pytest.mark.parametrize(
    ("value", "group"),
    [
        ("acme", "acme"),
        ("tenant 42 / eu-west", "tenant 42 / eu-west"),
        ("é" * 64, "é" * 64),  # 128 bytes of UTF-8: the longest group
        ("g" * 128, "g" * 128),
        ("👩\u200d💻", "👩\u200d💻"),  # a zero-width joiner is a format character, allowed
        (None, ""),
        ("", ""),
    ],
)
def test_a_group_column_gives_the_items_group_and_null_or_empty_means_none(value, group):
    assert row_to_item({"body": "x", "grp": value}, GROUP).group == group


def test_without_a_group_column_no_item_has_a_group():
    assert row_to_item({"body": "x", "grp": "acme"}, BODY).group == ""


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("g" * 129, "longer than 128 bytes"),
        ("é" * 64 + "g", "longer than 128 bytes"),  # 129 bytes, 65 characters
        ("two\nlines", "control characters"),
        ("tab\there", "control characters"),
        ("line\u2028separator", "control characters"),
        ("nul\x00", "control characters"),
        (42, "expected a string, got int"),
        (b"acme", "expected a string, got bytes"),
    ],
)
def test_a_bad_group_is_an_invalid_row_naming_its_column(value, fragment):
    with pytest.raises(InvalidRowError, match=f"^grp: .*{fragment}") as caught:
        row_to_item({"body": "x", "grp": value}, GROUP)
    assert caught.value.context["column"] == "grp"
    assert isinstance(caught.value, InvalidRequestError)
    assert len(str(caught.value)) < 120  # the value is not repeated in the report


def test_a_column_map_refuses_no_payload_and_repeated_payload_columns():
    with pytest.raises(ValueError, match="payload"):
        ColumnMap(payload=())
    with pytest.raises(ValueError, match="repeat"):
        ColumnMap(payload=("a", "a"))


def test_source_columns_lists_each_column_once_payload_first():
    columns = ColumnMap(payload=("a", "b"), key="id", reference="a", kind="k", priority="p", group="g")
    assert columns.source_columns == ("a", "b", "id", "k", "p", "g")


# -- keys ----------------------------------------------------------------------------------------


def test_row_key_without_a_key_column_follows_content_and_job():
    item = row_to_item({"body": "x"}, BODY)
    same = row_key({"body": "x"}, BODY, item, job_id="j1")
    assert same == row_key({"body": "x"}, BODY, row_to_item({"body": "x"}, BODY), job_id="j1")
    assert same != row_key({"body": "y"}, BODY, row_to_item({"body": "y"}, BODY), job_id="j1")
    assert same != row_key({"body": "x"}, BODY, item, job_id="j2")


def test_row_key_with_a_key_column_ignores_the_rest_of_the_row():
    columns = ColumnMap(payload=("body",), key="id")
    a = row_key({"id": 7, "body": "x"}, columns, row_to_item({"id": 7, "body": "x"}, columns), job_id="j")
    b = row_key({"id": 7, "body": "y"}, columns, row_to_item({"id": 7, "body": "y"}, columns), job_id="j")
    c = row_key({"id": "7", "body": "x"}, columns, row_to_item({"id": 7, "body": "x"}, columns), job_id="j")
    assert a == b
    assert a != c  # 7 and "7" are different keys


def test_a_null_key_is_an_invalid_row():
    columns = ColumnMap(payload=("body",), key="id")
    with pytest.raises(InvalidRowError, match="null"):
        row_key(
            {"id": None, "body": "x"}, columns, row_to_item({"id": None, "body": "x"}, columns), job_id="j"
        )


def test_item_digest_tells_apart_every_field():
    base = NewItem(payload=b"ab", reference="r", kind="k", encoding="e")
    variants = [
        base,
        NewItem(
            payload=b"ab", reference="r", kind="k", encoding="e", enqueue_at=datetime(2030, 1, 1, tzinfo=UTC)
        ),
        NewItem(payload=b"b", reference="ra", kind="k", encoding="e"),
        NewItem(payload=b"ab", reference="", kind="rk", encoding="e"),
        NewItem(payload=b"ab", reference="r", kind="ke", encoding=""),
        NewItem(payload=b"ab", reference="r", kind="k", encoding="e", priority=0),
        NewItem(payload=b"ab", reference="r", kind="k", encoding="e", priority=9),
        NewItem(payload=b"ab", reference="r", kind="k", encoding="e", group="acme"),
        NewItem(payload=b"ab", reference="r", kind="k", encoding="e", group="acme2"),
        NewItem(payload=b"ab", reference="r", kind="k", encoding="e", priority=0, group="acme"),
        NewItem(payload=b"ab", reference="r", kind="k", encoding="e", group="priority=0"),
    ]
    assert len({item_digest(v) for v in variants}) == len(variants)


def test_item_digest_of_priority_five_is_the_digest_from_before_priorities():
    # The digest orders rows and names chunks: a job of priority 5 items keeps its chunk keys.
    item = NewItem(payload=b"ab", reference="r", kind="k", encoding="e", priority=5)
    assert item_digest(item) == "196ab1757877a965044cb253f55ff4b6f896823ad171aaf5aec5cd002e1beea9"


def test_item_digest_without_a_group_is_the_digest_from_before_groups():
    # The digest orders rows and names chunks: a job whose items have no group keeps its chunk keys.
    item = NewItem(payload=b"ab", reference="r", kind="k", encoding="e", group="")
    assert item_digest(item) == "196ab1757877a965044cb253f55ff4b6f896823ad171aaf5aec5cd002e1beea9"
    assert item_digest(NewItem(payload=b"ab", reference="r", kind="k", encoding="e", group="g")) != (
        item_digest(item)
    )


def test_row_key_without_a_key_column_tells_apart_rows_that_differ_only_in_their_group():
    columns = ColumnMap(payload=("body",), group="grp")
    keys = {
        row_key(row, columns, row_to_item(row, columns), job_id="j")
        for row in ({"body": "x", "grp": "a"}, {"body": "x", "grp": "b"}, {"body": "x", "grp": None})
    }
    assert len(keys) == 3


def test_chunk_key_depends_on_job_queue_and_exact_rows():
    keys = ["a", "b"]
    first = chunk_key("job", "q", keys)
    assert first == chunk_key("job", "q", iter(keys))
    assert first.startswith("spark-")
    assert first != chunk_key("job2", "q", keys)
    assert first != chunk_key("job", "q2", keys)
    assert first != chunk_key("job", "q", ["a"])
    assert first != chunk_key("job", "q", ["b", "a"])
    assert first != chunk_key("job", "q", ["ab"])


def test_describe_row_is_short_and_prefers_the_key():
    columns = ColumnMap(payload=("body",), key="id")
    assert describe_row({"id": 3, "body": "x" * 10_000}, columns) == "id=3"
    assert len(describe_row({"id": None, "body": "x" * 10_000}, columns)) <= 200


# -- chunking ------------------------------------------------------------------------------------


def test_chunks_respect_the_item_limit_and_keep_order():
    chunks = list(chunks_of(range(2500), size_of=lambda _: 1, max_items=1000))
    assert [len(c) for c in chunks] == [1000, 1000, 500]
    assert [x for c in chunks for x in c] == list(range(2500))


def test_chunks_respect_the_body_limit():
    big = NewItem(payload=b"x" * 300_000)
    chunks = list(chunks_of([big] * 40, size_of=wire_size))
    assert all(sum(wire_size(i) for i in c) <= MAX_CHUNK_WIRE_BYTES for c in chunks)
    assert sum(len(c) for c in chunks) == 40
    assert len(chunks) > 1


def test_wire_size_bounds_the_json_the_client_sends():
    item = NewItem(payload=bytes(range(256)) * 10, reference='quote"d', kind="k", encoding="é")
    body = json.dumps(
        {
            "bytes": __import__("base64").b64encode(item.payload).decode(),
            "reference": item.reference,
            "kind": item.kind,
            "encoding": item.encoding,
            "enqueue_at": "2030-01-01T00:00:00.000000Z",
            "priority": 9,
        }
    )
    assert wire_size(item) >= len(body.encode())


def test_wire_size_counts_the_group_when_there_is_one_and_nothing_when_not():
    plain = NewItem(payload=bytes(range(256)) * 10, reference="r", kind="k", encoding="e")
    grouped = NewItem(payload=plain.payload, reference="r", kind="k", encoding="e", group="é" * 64)
    body = json.dumps(
        {
            "bytes": __import__("base64").b64encode(grouped.payload).decode(),
            "reference": grouped.reference,
            "kind": grouped.kind,
            "encoding": grouped.encoding,
            "group": grouped.group,
            "enqueue_at": "2030-01-01T00:00:00.000000Z",
            "priority": 9,
        }
    )
    assert wire_size(grouped) >= len(body.encode())
    # An item without a group has the size it had before groups: a job's chunks are cut the same.
    assert wire_size(plain) == 4 * ((len(plain.payload) + 2) // 3) + 3 * 3 + 120


def test_an_empty_stream_has_no_chunks():
    assert list(chunks_of([], size_of=lambda _: 1)) == []
