"""The DynamoDB tables equal ``querator.storage.dynamodb.schema`` and keep their data outside dev."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from aws_cdk import App, Stack
from aws_cdk.assertions import Template

from infra.config import StageConfig
from infra.constructs.table import QueueTables
from querator.storage.dynamodb import schema

if TYPE_CHECKING:
    from tests.infra.synth import Synth

pytestmark = pytest.mark.infra

DEFINITIONS = {
    "items": schema.items_table_definition("placeholder"),
    "catalog": schema.catalog_table_definition("placeholder"),
}


def _table(synth: Synth, which: str) -> dict[str, Any]:
    table = synth.stack.tables.items if which == "items" else synth.stack.tables.catalog
    return synth.resources[synth.logical_id(table)]


@pytest.mark.parametrize("which", ["items", "catalog"])
def test_table_keys_and_billing_equal_the_schema_module(synth: Synth, which: str) -> None:
    props = _table(synth, which)["Properties"]
    definition = DEFINITIONS[which]
    assert props["KeySchema"] == definition["KeySchema"]
    assert sorted(props["AttributeDefinitions"], key=lambda a: a["AttributeName"]) == sorted(
        definition["AttributeDefinitions"], key=lambda a: a["AttributeName"]
    )
    assert props["BillingMode"] == definition["BillingMode"] == "PAY_PER_REQUEST"
    # The schema defines no secondary index; neither may the deployed table.
    assert props.get("GlobalSecondaryIndexes") == definition.get("GlobalSecondaryIndexes")
    assert props.get("LocalSecondaryIndexes") == definition.get("LocalSecondaryIndexes")


@pytest.mark.parametrize("which", ["items", "catalog"])
def test_tables_have_point_in_time_recovery_and_kms_encryption(synth: Synth, which: str) -> None:
    props = _table(synth, which)["Properties"]
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    # SSEEnabled with no key of ours: KMS with the account's AWS-managed aws/dynamodb key (not the
    # AWS-owned default, whose use does not show in CloudTrail).
    assert props["SSESpecification"] == {"SSEEnabled": True}


def test_only_the_items_table_expires_records_by_ttl_on_the_schema_attribute(synth: Synth) -> None:
    assert _table(synth, "items")["Properties"]["TimeToLiveSpecification"] == {
        "AttributeName": schema.TTL,
        "Enabled": True,
    }
    assert "TimeToLiveSpecification" not in _table(synth, "catalog")["Properties"]


def test_dev_stage_tables_are_deleted_with_the_stack(synth: Synth) -> None:
    for which in ("items", "catalog"):
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
    # THEN both tables survive a stack deletion or replacement and refuse DeleteTable
    assert len(tables) == len(DEFINITIONS)
    for table in tables.values():
        assert table["DeletionPolicy"] == table["UpdateReplacePolicy"] == "Retain"
        assert table["Properties"]["DeletionProtectionEnabled"] is True


def test_table_construct_ids_are_stable(synth: Synth) -> None:
    # Renaming a stateful construct replaces the table and loses its data.
    assert synth.stack.tables.items.node.path == "querator-dev/Tables/Items"
    assert synth.stack.tables.catalog.node.path == "querator-dev/Tables/Catalog"


def test_outputs_name_the_api_url_and_both_tables(synth: Synth) -> None:
    assert synth.outputs["ItemsTableName"]["Value"] == {"Ref": synth.logical_id(synth.stack.tables.items)}
    assert synth.outputs["CatalogTableName"]["Value"] == {"Ref": synth.logical_id(synth.stack.tables.catalog)}
    api_url = str(synth.outputs["ApiUrl"]["Value"])
    assert synth.logical_id(synth.stack.api.api) in api_url
