"""The DynamoDB tables, built from ``querator.storage.dynamodb.schema`` (and the stream's
``connections`` definition).

Stateful: the construct ids ``Tables``, ``Items``, ``Catalog`` and ``Connections`` are never renamed,
because a new logical id replaces the table (and its data). Key names, key types, indexes and billing
mode come from the schema modules' ``CreateTable`` definitions, so CDK, the moto fixtures and the
local store cannot drift apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct

from infra.constructs.common import removal_policy
from querator.storage.dynamodb import schema
from querator.storage.dynamodb.connections import TTL as CONNECTION_TTL
from querator.storage.dynamodb.connections import connections_table_definition

if TYPE_CHECKING:
    from collections.abc import Callable

    from infra.config import StageConfig

_ATTRIBUTE_TYPES = {
    "S": dynamodb.AttributeType.STRING,
    "N": dynamodb.AttributeType.NUMBER,
    "B": dynamodb.AttributeType.BINARY,
}
_BILLING = {"PAY_PER_REQUEST": dynamodb.BillingMode.PAY_PER_REQUEST}
_PROJECTIONS = {
    "ALL": dynamodb.ProjectionType.ALL,
    "KEYS_ONLY": dynamodb.ProjectionType.KEYS_ONLY,
}
# The definitions are CreateTable arguments; the name there is a placeholder, CloudFormation names
# the deployed tables (the stack outputs them).
_PLACEHOLDER = "placeholder"


def _key(definition: dict[str, Any], key_type: str) -> dynamodb.Attribute | None:
    types = {a["AttributeName"]: a["AttributeType"] for a in definition["AttributeDefinitions"]}
    for key in definition["KeySchema"]:
        if key["KeyType"] == key_type:
            return dynamodb.Attribute(
                name=key["AttributeName"], type=_ATTRIBUTE_TYPES[types[key["AttributeName"]]]
            )
    return None


class QueueTables(Construct):
    """The items table, the queue catalog and the stream's connections."""

    def __init__(self, scope: Construct, construct_id: str, *, config: StageConfig) -> None:
        super().__init__(scope, construct_id)
        self.items = self._table(
            "Items",
            schema.items_table_definition,
            config=config,
            # Only produce's idempotency records and lease rate-limit buckets carry the attribute;
            # items leave by completion or the reaper, never by TTL.
            ttl_attribute=schema.TTL,
            # Keys only: the stream dispatcher needs to know which queue got which item id, nothing
            # more (a record's size is what a stream read costs).
            stream=dynamodb.StreamViewType.KEYS_ONLY,
        )
        self.catalog = self._table("Catalog", schema.catalog_table_definition, config=config)
        # A row per open WebSocket connection; DynamoDB drops rows whose $disconnect never came.
        self.connections = self._table(
            "Connections", connections_table_definition, config=config, ttl_attribute=CONNECTION_TTL
        )

    def _table(
        self,
        construct_id: str,
        definition_of: Callable[[str], dict[str, Any]],
        *,
        config: StageConfig,
        ttl_attribute: str | None = None,
        stream: dynamodb.StreamViewType | None = None,
    ) -> dynamodb.Table:
        definition = definition_of(_PLACEHOLDER)
        if definition.get("LocalSecondaryIndexes"):
            # No schema has one; fail loudly rather than deploy a table without it.
            raise NotImplementedError("schema defines local secondary indexes: add them to QueueTables")
        partition_key = _key(definition, "HASH")
        if partition_key is None:
            raise ValueError(f"{construct_id}: the schema defines no partition key")
        table = dynamodb.Table(
            self,
            construct_id,
            partition_key=partition_key,
            sort_key=_key(definition, "RANGE"),
            billing_mode=_BILLING[definition["BillingMode"]],
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            # A key in the account's KMS (aws/dynamodb) rather than an AWS-owned one: its use shows
            # in CloudTrail, and no key policy of ours is needed.
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            time_to_live_attribute=ttl_attribute,
            removal_policy=removal_policy(config),
            deletion_protection=config.retains_data,
            stream=stream,
        )
        for index in definition.get("GlobalSecondaryIndexes", []):
            projection = index["Projection"]["ProjectionType"]
            table.add_global_secondary_index(
                index_name=index["IndexName"],
                partition_key=_key({**definition, "KeySchema": index["KeySchema"]}, "HASH"),
                sort_key=_key({**definition, "KeySchema": index["KeySchema"]}, "RANGE"),
                projection_type=_PROJECTIONS[projection],
            )
        return table
