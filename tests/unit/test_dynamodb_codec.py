"""Unit: what the DynamoDB codec stores of an item's failures (engine v2's rows and, through
``storage.dynamodb.log``'s entries, engine v3's packed rows): nothing for an item that never failed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from querator.domain.model import Item
from querator.storage.dynamodb import codec, schema
from querator.storage.dynamodb.log import base as log

pytestmark = pytest.mark.disable_socket

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def item(**fields: object) -> Item:
    return Item(
        id="0660ef638f743e518f1d6e953f44a8",
        payload=b"p" * 100,
        created_at=NOW,
        expire_deadline=NOW + timedelta(hours=1),
        **fields,  # type: ignore[arg-type]
    )


def test_an_item_that_never_failed_stores_no_failure_attribute():
    attrs = codec.encode_item("jobs", 0, item(attempts=1))

    assert set(attrs) == {
        schema.PK,
        schema.SK,
        schema.ATTEMPTS,
        schema.EXPIRE_DEADLINE,
        schema.CREATED_AT,
        "payload",
    }
    assert codec.decode_item(attrs) == item(attempts=1)


def test_a_failed_item_stores_its_reason_and_count_and_reads_them_back():
    failed = item(attempts=2, last_reason="ValueError: bad input", failures=2, source_queue="jobs")

    attrs = codec.encode_item("dlq", 0, failed)

    assert attrs[schema.LAST_REASON] == {"S": "ValueError: bad input"}
    assert attrs[schema.FAILURES] == {"N": "2"}
    assert codec.decode_item(attrs) == failed


def test_a_packed_rows_entry_grows_by_the_reason_and_a_few_bytes_only_when_it_failed():
    plain = log._value_size({"M": log._entry(item())})
    reason = "x" * 100

    failed = log._value_size({"M": log._entry(item(last_reason=reason, failures=1))})

    # "why" and "nf" and their values: the reason, a one-digit count, and the names.
    assert failed - plain == len(reason) + len(schema.LAST_REASON) + len(schema.FAILURES) + 2 + 2
