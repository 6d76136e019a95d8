"""The cost meter charges DynamoDB's published capacity rules, checked on moto in-process."""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.exceptions import ClientError, ParamValidationError
from moto import mock_aws

from benchmarks.meter import (
    CostMeter,
    item_size,
    number_size,
    read_units,
    unfiltered_request,
    value_size,
    write_units,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

TABLE = "meter-test"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        yield


@pytest.fixture
def raw(aws: None) -> Any:
    client = boto3.client("dynamodb", region_name="us-east-1")
    client.create_table(
        TableName=TABLE,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    return client


@pytest.fixture
def metered(raw: Any) -> tuple[CostMeter, Any]:
    client = boto3.client("dynamodb", region_name="us-east-1")
    meter = CostMeter(raw)
    meter.attach(client)
    return meter, client


def item(sk: str, payload: str = "x", pk: str = "q") -> dict[str, Any]:
    return {"pk": {"S": pk}, "sk": {"S": sk}, "payload": {"S": payload}}


def key(sk: str) -> dict[str, Any]:
    return {"pk": {"S": "q"}, "sk": {"S": sk}}


# -- size rules -------------------------------------------------------------------------------------


def test_number_size_counts_significant_digits() -> None:
    assert number_size("0") == 2
    assert number_size("7") == 2
    assert number_size("12") == 2
    assert number_size("123") == 3
    assert number_size("-1000") == 2  # trailing zeros are trimmed
    assert number_size("0.00123") == 3  # and leading ones
    assert number_size("1.5E+10") == 2
    assert number_size("1" * 38) == 20


def test_value_sizes_follow_the_published_rules() -> None:
    assert value_size({"S": "héllo"}) == 6  # UTF-8 bytes
    assert value_size({"B": b"\x00" * 10}) == 10
    assert value_size({"BOOL": True}) == 1
    assert value_size({"NULL": True}) == 1
    assert value_size({"SS": ["a", "bc"]}) == 3
    assert value_size({"NS": ["1", "123"]}) == 2 + 3
    assert value_size({"BS": [b"ab", b"c"]}) == 3
    assert value_size({"L": [{"S": "ab"}, {"BOOL": False}]}) == 3 + (2 + 1) + (1 + 1)
    assert value_size({"M": {"k": {"S": "abc"}, "nn": {"N": "5"}}}) == 3 + (1 + 3 + 1) + (2 + 2 + 1)
    with pytest.raises(ValueError, match="unknown"):
        value_size({"X": 1})


def test_item_size_adds_attribute_names() -> None:
    assert item_size({"pk": {"S": "q"}, "n": {"N": "42"}, "flag": {"BOOL": True}}) == (2 + 1) + (1 + 2) + (
        4 + 1
    )


def test_unit_rounding() -> None:
    assert [write_units(s) for s in (0, 1, 1024, 1025, 3000)] == [1, 1, 1, 2, 3]
    assert read_units(0, consistent=False) == 0.5
    assert read_units(0, consistent=True) == 1.0
    assert read_units(4097, consistent=False) == 1.0
    assert read_units(4097, consistent=True) == 2.0


def test_unfiltered_request_drops_narrowing_and_unused_placeholders() -> None:
    request = unfiltered_request(
        {
            "TableName": TABLE,
            "KeyConditionExpression": "#pk = :pk",
            "FilterExpression": "#st = :st",
            "ProjectionExpression": "#pk, #st",
            "Select": "SPECIFIC_ATTRIBUTES",
            "ExpressionAttributeNames": {"#pk": "pk", "#st": "state"},
            "ExpressionAttributeValues": {":pk": {"S": "q"}, ":st": {"S": "ready"}},
            "Limit": 10,
            "ScanIndexForward": False,
        }
    )
    assert request == {
        "TableName": TABLE,
        "KeyConditionExpression": "#pk = :pk",
        "ExpressionAttributeNames": {"#pk": "pk"},
        "ExpressionAttributeValues": {":pk": {"S": "q"}},
        "Limit": 10,
        "ScanIndexForward": False,
    }
    assert unfiltered_request(
        {
            "TableName": TABLE,
            "FilterExpression": "#a = :a",
            "ExpressionAttributeNames": {"#a": "a"},
            "ExpressionAttributeValues": {":a": {"N": "1"}},
        }
    ) == {"TableName": TABLE}


# -- writes ---------------------------------------------------------------------------------------


def test_put_of_a_small_item_is_one_unit(metered: tuple[CostMeter, Any]) -> None:
    meter, client = metered
    client.put_item(TableName=TABLE, Item=item("a", "p" * 90))
    snap = meter.snapshot()
    assert snap.requests == 1
    assert snap.requests_by_operation == {"PutItem": 1}
    assert snap.write_units == 1
    assert snap.read_units == 0


def test_put_of_a_1500_byte_binary_payload_is_two_units(metered: tuple[CostMeter, Any]) -> None:
    meter, client = metered
    client.put_item(TableName=TABLE, Item={**key("a"), "payload": {"B": b"\x01" * 1500}})
    assert meter.snapshot().write_units == 2


def test_overwrite_is_charged_on_the_larger_item(metered: tuple[CostMeter, Any]) -> None:
    meter, client = metered
    client.put_item(TableName=TABLE, Item=item("a", "p" * 2000))
    meter.reset()
    client.put_item(TableName=TABLE, Item=item("a", "small"))
    assert meter.snapshot().write_units == 2


def test_update_growing_an_item_past_1kb_is_two_units(metered: tuple[CostMeter, Any]) -> None:
    meter, client = metered
    before = item("a", "p" * 887)
    assert item_size(before) == 900
    client.put_item(TableName=TABLE, Item=before)
    meter.reset()
    client.update_item(
        TableName=TABLE,
        Key=key("a"),
        UpdateExpression="SET payload = :p",
        ExpressionAttributeValues={":p": {"S": "p" * 1087}},
    )
    assert item_size(item("a", "p" * 1087)) == 1100
    assert meter.snapshot().write_units == 2


def test_delete_is_charged_on_the_deleted_item(metered: tuple[CostMeter, Any]) -> None:
    meter, client = metered
    client.put_item(TableName=TABLE, Item=item("a", "p" * 2500))
    meter.reset()
    client.delete_item(TableName=TABLE, Key=key("a"))
    client.delete_item(TableName=TABLE, Key=key("missing"))
    snap = meter.snapshot()
    assert snap.write_units == 3 + 1
    assert snap.requests_by_operation == {"DeleteItem": 2}


def test_failed_conditional_put_is_counted_and_charged(metered: tuple[CostMeter, Any]) -> None:
    meter, client = metered
    client.put_item(TableName=TABLE, Item=item("a"))
    meter.reset()
    with pytest.raises(ClientError, match="ConditionalCheckFailed"):
        client.put_item(
            TableName=TABLE, Item=item("a", "p" * 3000), ConditionExpression="attribute_not_exists(pk)"
        )
    snap = meter.snapshot()
    assert snap.failed_conditional_writes == 1
    assert snap.write_units == 1  # the existing small item, not the 3 KB one we tried to write
    assert snap.requests == 1


def test_other_errors_count_as_requests_without_units(metered: tuple[CostMeter, Any]) -> None:
    meter, client = metered
    with pytest.raises(ClientError, match="ResourceNotFound"):
        client.put_item(TableName="no-such-table", Item=item("a"))
    snap = meter.snapshot()
    assert (snap.requests, snap.write_units, snap.failed_conditional_writes) == (1, 0, 0)


def test_batch_write_of_25_small_puts_is_25_units_in_one_request(metered: tuple[CostMeter, Any]) -> None:
    meter, client = metered
    client.batch_write_item(
        RequestItems={TABLE: [{"PutRequest": {"Item": item(f"{i:02}")}} for i in range(25)]}
    )
    snap = meter.snapshot()
    assert snap.requests == 1
    assert snap.requests_by_operation == {"BatchWriteItem": 1}
    assert snap.write_units == 25


def test_transaction_of_a_delete_and_a_put_is_four_units(metered: tuple[CostMeter, Any]) -> None:
    meter, client = metered
    client.put_item(TableName=TABLE, Item=item("a"))
    meter.reset()
    client.transact_write_items(
        TransactItems=[
            {"Delete": {"TableName": TABLE, "Key": key("a")}},
            {"Put": {"TableName": TABLE, "Item": item("b")}},
        ]
    )
    assert meter.snapshot().write_units == 4


def test_cancelled_transaction_is_charged_at_the_transactional_rate(metered: tuple[CostMeter, Any]) -> None:
    meter, client = metered
    client.put_item(TableName=TABLE, Item=item("a"))
    meter.reset()
    with pytest.raises(ClientError, match="TransactionCanceled"):
        client.transact_write_items(
            TransactItems=[
                {
                    "Put": {
                        "TableName": TABLE,
                        "Item": item("a"),
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
                {"Put": {"TableName": TABLE, "Item": item("b")}},
            ]
        )
    snap = meter.snapshot()
    assert (snap.write_units, snap.failed_conditional_writes) == (4, 1)


# -- reads ----------------------------------------------------------------------------------------


def test_eventually_consistent_get_of_a_small_item_is_half_a_unit(metered: tuple[CostMeter, Any]) -> None:
    meter, client = metered
    client.put_item(TableName=TABLE, Item=item("a"))
    meter.reset()
    client.get_item(TableName=TABLE, Key=key("a"))
    client.get_item(TableName=TABLE, Key=key("missing"), ConsistentRead=True)
    snap = meter.snapshot()
    assert snap.read_units == 0.5 + 1
    assert snap.write_units == 0


def test_query_is_charged_for_every_item_it_evaluated(metered: tuple[CostMeter, Any]) -> None:
    meter, client = metered
    items = [item(f"{i:02}", "p" * 1000) for i in range(10)]
    for it in items:
        client.put_item(TableName=TABLE, Item=it)
    client.put_item(TableName=TABLE, Item=item("other", "p" * 1000, pk="elsewhere"))
    meter.reset()
    response = client.query(
        TableName=TABLE,
        KeyConditionExpression="#pk = :pk",
        FilterExpression="#payload = :none",
        ProjectionExpression="#pk",
        ExpressionAttributeNames={"#pk": "pk", "#payload": "payload"},
        ExpressionAttributeValues={":pk": {"S": "q"}, ":none": {"S": "nothing"}},
    )
    assert response["Items"] == []
    total = sum(item_size(it) for it in items)
    assert total == 10 * 1014
    snap = meter.snapshot()
    assert snap.read_units == math.ceil(total / 4096) * 0.5 == 1.5
    assert snap.requests_by_operation == {"Query": 1}


def test_batch_and_transactional_gets(metered: tuple[CostMeter, Any]) -> None:
    meter, client = metered
    client.put_item(TableName=TABLE, Item=item("a", "p" * 5000))
    meter.reset()
    client.batch_get_item(RequestItems={TABLE: {"Keys": [key("a"), key("missing")]}})
    assert meter.snapshot().read_units == 1.0 + 0.5
    meter.reset()
    client.transact_get_items(TransactItems=[{"Get": {"TableName": TABLE, "Key": key("a")}}])
    assert meter.snapshot().read_units == 2 * 2


def test_the_meters_own_peeks_are_not_metered(raw: Any) -> None:
    meter = CostMeter(raw)
    meter.attach(raw)  # misuse: the raw client metered too must not recurse or double count
    raw.put_item(TableName=TABLE, Item=item("a"))
    assert meter.snapshot().requests_by_operation == {"PutItem": 1}


def test_counts_are_consistent_across_threads(metered: tuple[CostMeter, Any]) -> None:
    meter, client = metered

    def produce(worker: int) -> None:
        for i in range(10):
            client.put_item(TableName=TABLE, Item=item(f"{worker}-{i}"))

    threads = [threading.Thread(target=produce, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    snap = meter.snapshot()
    assert (snap.requests, snap.write_units) == (40, 40)


def test_malformed_calls_keep_botocores_error(metered: tuple[CostMeter, Any]) -> None:
    meter, client = metered
    with pytest.raises(ParamValidationError):
        client.put_item(TableName=TABLE)
    assert meter.snapshot().requests == 0  # never sent


# -- PynamoDB -------------------------------------------------------------------------------------


def test_pynamodb_calls_are_metered_through_the_session(raw: Any) -> None:
    from pynamodb.attributes import UnicodeAttribute  # noqa: PLC0415 - only this test needs PynamoDB
    from pynamodb.models import Model  # noqa: PLC0415

    class Row(Model):
        class Meta:
            table_name = TABLE
            region = "us-east-1"

        pk = UnicodeAttribute(hash_key=True)
        sk = UnicodeAttribute(range_key=True)
        payload = UnicodeAttribute()

    meter = CostMeter(raw)
    meter.attach_session(Row._get_connection().connection.session)
    Row(pk="q", sk="a", payload="p" * 1500).save()
    Row.get("q", "a")
    snap = meter.snapshot()
    assert snap.requests_by_operation == {"PutItem": 1, "GetItem": 1}
    assert snap.write_units == 2
    assert snap.read_units == 0.5
