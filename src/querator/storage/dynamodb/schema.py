"""Storage layer: the DynamoDB tables, defined once.

The CDK app, the test fixtures and the embedded local store all build their tables from this module,
so key names cannot drift. See docs/adr/0001-data-model.md for why the keys look like this.

Items table
    ``pk`` (S, hash)  ``<queue>~<partition>``: one queue partition is one DynamoDB partition key.
    ``sk`` (S, range) the item id, which sorts in visible-at (FIFO) order (``querator.domain.ids``).
    Idempotency records of produce live under ``<queue>~idem~<key digest>`` with ``sk`` = ``~``
    and expire through TTL on ``ttl``.

Catalog table
    ``kind`` (S, hash) ``queue`` for queues (so ``queues.list`` is one ordered Query),
    ``reaper`` for the reaper's bookmark. ``name`` (S, range) the queue name.
"""

from __future__ import annotations

from typing import Any

SEPARATOR = "~"

# Items table attribute names. Short, because names count toward every item's billed size.
PK = "pk"
SK = "sk"
PAYLOAD = "payload"
REFERENCE = "ref"
ENCODING = "enc"
KIND = "kind"
ATTEMPTS = "attempts"
LEASE_DEADLINE = "lease"
EXPIRE_DEADLINE = "expire"
CREATED_AT = "created"
ENQUEUE_AT = "enqueue"
SOURCE_ID = "src"
TTL = "ttl"

# Idempotency record attributes (same table).
IDEM_SK = SEPARATOR
IDEM_PARTITION = "part"
IDEM_IDS = "ids"
IDEM_DONE = "done"
IDEM_STARTED = "started"
IDEM_QUEUE_CREATED = "qcreated"

# Catalog table.
CATALOG_HASH = "kind"
CATALOG_RANGE = "name"
CATALOG_QUEUE_KIND = "queue"
CATALOG_REAPER_KIND = "reaper"


def partition_key(queue: str, partition: int) -> str:
    return f"{queue}{SEPARATOR}{partition}"


def idempotency_key(queue: str, digest: str) -> str:
    return f"{queue}{SEPARATOR}idem{SEPARATOR}{digest}"


def items_table_definition(table_name: str) -> dict[str, Any]:
    """``CreateTable`` arguments for the items table (on-demand)."""
    return {
        "TableName": table_name,
        "AttributeDefinitions": [
            {"AttributeName": PK, "AttributeType": "S"},
            {"AttributeName": SK, "AttributeType": "S"},
        ],
        "KeySchema": [
            {"AttributeName": PK, "KeyType": "HASH"},
            {"AttributeName": SK, "KeyType": "RANGE"},
        ],
        "BillingMode": "PAY_PER_REQUEST",
    }


def catalog_table_definition(table_name: str) -> dict[str, Any]:
    """``CreateTable`` arguments for the catalog table (on-demand)."""
    return {
        "TableName": table_name,
        "AttributeDefinitions": [
            {"AttributeName": CATALOG_HASH, "AttributeType": "S"},
            {"AttributeName": CATALOG_RANGE, "AttributeType": "S"},
        ],
        "KeySchema": [
            {"AttributeName": CATALOG_HASH, "KeyType": "HASH"},
            {"AttributeName": CATALOG_RANGE, "KeyType": "RANGE"},
        ],
        "BillingMode": "PAY_PER_REQUEST",
    }


def create_tables(client: Any, *, items_table: str, catalog_table: str) -> None:
    """Create both tables (idempotently) and wait until they are active; for local stores and tests."""
    existing = set(client.list_tables().get("TableNames", []))
    for definition in (items_table_definition(items_table), catalog_table_definition(catalog_table)):
        name = definition["TableName"]
        if name in existing:
            continue
        client.create_table(**definition)
        client.get_waiter("table_exists").wait(
            TableName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100}
        )
        if name == items_table:
            # Only idempotency records carry ``ttl``; items leave by completion or the reaper.
            client.update_time_to_live(
                TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL}
            )
