"""The deployed-stack harness's moto server answers a retried transaction as DynamoDB does."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

from tests.infra.deployment import RecordingMoto

if TYPE_CHECKING:
    from collections.abc import Iterator


def transaction(table: str) -> list[dict[str, Any]]:
    """Put one item if absent: applied twice, the second fails its condition."""
    put = {"TableName": table, "Item": {"pk": {"S": "a"}}, "ConditionExpression": "attribute_not_exists(pk)"}
    return [{"Put": put}]


@pytest.fixture
def moto() -> Iterator[RecordingMoto]:
    server = RecordingMoto()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def dynamodb(moto: RecordingMoto) -> Any:
    # moto's backends are per process: every test its own table.
    table = f"t-{uuid.uuid4().hex[:8]}"
    client = moto.client("dynamodb")
    client.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return client, table


def test_a_transaction_sent_again_with_its_token_succeeds_without_applying_twice(
    moto: RecordingMoto, dynamodb: Any
) -> None:
    client, table = dynamodb
    client.transact_write_items(TransactItems=transaction(table), ClientRequestToken="same")
    # What botocore does after a read timeout: the same request, the same token.
    client.transact_write_items(TransactItems=transaction(table), ClientRequestToken="same")
    assert moto.recorder.replayed_transactions == 1
    assert client.scan(TableName=table)["Count"] == 1


def test_a_new_token_is_a_new_transaction(moto: RecordingMoto, dynamodb: Any) -> None:
    client, table = dynamodb
    client.transact_write_items(TransactItems=transaction(table), ClientRequestToken="first")
    with pytest.raises(ClientError) as failed:
        client.transact_write_items(TransactItems=transaction(table), ClientRequestToken="second")
    assert failed.value.response["Error"]["Code"] == "TransactionCanceledException"
    assert moto.recorder.replayed_transactions == 0
