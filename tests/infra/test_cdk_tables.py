"""The DynamoDB tables equal ``querator.storage.dynamodb.schema`` and keep their data outside dev."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from aws_cdk import App, Stack
from aws_cdk.assertions import Template

from infra.config import StageConfig
from infra.constructs.table import QueueTables
from querator.storage.dynamodb import schema
from querator.storage.dynamodb.connections import TTL as CONNECTION_TTL
from querator.storage.dynamodb.connections import connections_table_definition

if TYPE_CHECKING:
    from tests.infra.synth import Synth

pytestmark = pytest.mark.infra

DEFINITIONS = {
    "items": schema.items_table_definition("placeholder"),
    "catalog": schema.catalog_table_definition("placeholder"),
    "connections": connections_table_definition("placeholder"),
}


def _table(synth: Synth, which: str) -> dict[str, Any]:
    table = {
        "items": synth.stack.tables.items,
        "catalog": synth.stack.tables.catalog,
        "connections": synth.stack.tables.connections,
    }[which]
    return synth.resources[synth.logical_id(table)]


def _index(index: dict[str, Any]) -> dict[str, Any]:
    return {key: index[key] for key in ("IndexName", "KeySchema", "Projection")}


@pytest.mark.parametrize("which", ["items", "catalog", "connections"])
def test_table_keys_and_billing_equal_the_schema_module(synth: Synth, which: str) -> None:
    props = _table(synth, which)["Properties"]
    definition = DEFINITIONS[which]
    assert props["KeySchema"] == definition["KeySchema"]
    assert sorted(props["AttributeDefinitions"], key=lambda a: a["AttributeName"]) == sorted(
        definition["AttributeDefinitions"], key=lambda a: a["AttributeName"]
    )
    assert props["BillingMode"] == definition["BillingMode"] == "PAY_PER_REQUEST"
    # The deployed table has exactly the indexes of the schema (the connections' by_queue).
    assert [_index(i) for i in props.get("GlobalSecondaryIndexes", [])] == [
        _index(i) for i in definition.get("GlobalSecondaryIndexes", [])
    ]
    assert props.get("LocalSecondaryIndexes") == definition.get("LocalSecondaryIndexes")


def test_only_the_items_table_has_a_stream_and_it_carries_keys_only(synth: Synth) -> None:
    assert _table(synth, "items")["Properties"]["StreamSpecification"] == {"StreamViewType": "KEYS_ONLY"}
    for which in ("catalog", "connections"):
        assert "StreamSpecification" not in _table(synth, which)["Properties"]


@pytest.mark.parametrize("which", ["items", "catalog", "connections"])
def test_tables_have_point_in_time_recovery_and_kms_encryption(synth: Synth, which: str) -> None:
    props = _table(synth, which)["Properties"]
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    # SSEEnabled with no key of ours: KMS with the account's AWS-managed aws/dynamodb key (not the
    # AWS-owned default, whose use does not show in CloudTrail).
    assert props["SSESpecification"] == {"SSEEnabled": True}


def test_items_and_connections_expire_records_by_ttl_on_their_schema_attribute(synth: Synth) -> None:
    assert _table(synth, "items")["Properties"]["TimeToLiveSpecification"] == {
        "AttributeName": schema.TTL,
        "Enabled": True,
    }
    assert "TimeToLiveSpecification" not in _table(synth, "catalog")["Properties"]
    # A connection whose $disconnect never came leaves its row to expire.
    assert _table(synth, "connections")["Properties"]["TimeToLiveSpecification"] == {
        "AttributeName": CONNECTION_TTL,
        "Enabled": True,
    }


def test_dev_stage_tables_are_deleted_with_the_stack(synth: Synth) -> None:
    for which in ("items", "catalog", "connections"):
        table = _table(synth, which)
        assert table["DeletionPolicy"] == table["UpdateReplacePolicy"] == "Delete"
        assert table["Properties"].get("DeletionProtectionEnabled") is False


def test_tables_outside_dev_are_retained_and_protected() -> None:
    # GIVEN the tables construct alone in a prod-stage stack (a full synth is not needed for this)
    app = App()
    stack = Stack(app, "TablesOnly")
    QueueTables(stack, "Tables", config=StageConfig(stage="prod", alarm_email="ops@example.com"))
    # WHEN synthesized
    tables = Template.from_stack(stack).find_resources("AWS::DynamoDB::Table")
    # THEN every table survives a stack deletion or replacement and refuse DeleteTable
    assert len(tables) == len(DEFINITIONS)
    for table in tables.values():
        assert table["DeletionPolicy"] == table["UpdateReplacePolicy"] == "Retain"
        assert table["Properties"]["DeletionProtectionEnabled"] is True


def test_table_logical_ids_are_stable(synth: Synth) -> None:
    # A changed logical id replaces the table and loses its data: these are the ids deployed stacks
    # have had since before the service became a construct of its own (infra.stack.SERVICE_ID).
    assert synth.logical_id(synth.stack.tables.items) == "TablesItems7D42244B"
    assert synth.logical_id(synth.stack.tables.catalog) == "TablesCatalogA41E506D"
    assert synth.logical_id(synth.stack.tables.connections) == "TablesConnectionsF6D675B1"


def test_outputs_name_the_api_url_and_both_tables(synth: Synth) -> None:
    assert synth.outputs["ItemsTableName"]["Value"] == {"Ref": synth.logical_id(synth.stack.tables.items)}
    assert synth.outputs["CatalogTableName"]["Value"] == {"Ref": synth.logical_id(synth.stack.tables.catalog)}
    api_url = str(synth.outputs["ApiUrl"]["Value"])
    assert synth.logical_id(synth.stack.api.api) in api_url
