"""LocalStack init hook (ready stage): create Querator's two tables from the product's schema module.

LocalStack runs ``*.py`` hooks with its own interpreter, which has boto3. ``schema.py`` is mounted
read-only at ``/opt/querator/schema.py`` (docker-compose.yml) and loaded by path, so the tables are
built from the same definitions as the CDK stack and the tests. This is for ``querator serve`` with
``AWS_ENDPOINT_URL_DYNAMODB=http://localhost:4566``; a cdklocal deployment creates its own tables.
"""

from __future__ import annotations

import importlib.util
import os

import boto3

# Overridable so the hook can be tried outside the container (tests/infra runs it against moto).
SCHEMA_PATH = os.environ.get("QUERATOR_SCHEMA_PATH", "/opt/querator/schema.py")
ENDPOINT = os.environ.get("QUERATOR_INIT_ENDPOINT", "http://localhost:4566")

spec = importlib.util.spec_from_file_location("querator_schema", SCHEMA_PATH)
assert spec is not None and spec.loader is not None, SCHEMA_PATH  # noqa: S101 - a hook, not a module
schema = importlib.util.module_from_spec(spec)
spec.loader.exec_module(schema)

client = boto3.client(
    "dynamodb",
    endpoint_url=ENDPOINT,
    region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
    aws_access_key_id="test",
    aws_secret_access_key="test",  # noqa: S106 - LocalStack's dummy key
)
schema.create_tables(
    client,
    items_table=os.environ.get("QUERATOR_ITEMS_TABLE", "querator-local-items"),
    catalog_table=os.environ.get("QUERATOR_CATALOG_TABLE", "querator-local-catalog"),
)
print("querator tables ready")  # noqa: T201 - shows in `docker compose logs`
