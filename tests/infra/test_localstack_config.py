"""The LocalStack configuration: pinned, local-only, covering the stack's services; its table hook
builds the schema module's tables (run here against moto, since LocalStack needs Docker)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from querator.storage.dynamodb import schema
from querator.testing import dynamodb_client

if TYPE_CHECKING:
    from tests.infra.synth import Synth

pytestmark = pytest.mark.infra

LOCALSTACK = Path(__file__).resolve().parents[2] / "localstack"
#: CloudFormation resource type prefix → the LocalStack service that provides it.
SERVICE_OF = {
    "AWS::DynamoDB": "dynamodb",
    "AWS::Lambda": "lambda",
    "AWS::ApiGateway": "apigateway",
    "AWS::Events": "events",
    "AWS::Logs": "logs",
    "AWS::CloudWatch": "cloudwatch",
    "AWS::SNS": "sns",
    "AWS::IAM": "iam",
}


def _localstack_service() -> dict[str, Any]:
    compose = yaml.safe_load((LOCALSTACK / "docker-compose.yml").read_text(encoding="utf-8"))
    service: dict[str, Any] = compose["services"]["localstack"]
    return service


def test_the_image_is_pinned_to_a_release_and_ports_listen_on_loopback_only() -> None:
    service = _localstack_service()
    image, _, tag = service["image"].partition(":")
    assert image == "localstack/localstack"
    assert tag[:1].isdigit(), "pin a release tag, never latest"
    assert service["ports"]
    assert all(port.startswith("127.0.0.1:") for port in service["ports"])


def test_the_services_list_covers_every_resource_type_of_the_stack(synth: Synth) -> None:
    services = set(_localstack_service()["environment"]["SERVICES"].split(","))
    needed = {
        SERVICE_OF[prefix]
        for resource in synth.resources.values()
        for prefix in SERVICE_OF
        if resource["Type"].startswith(prefix + "::")
    }
    assert needed <= services
    # cdk bootstrap and deploy need these besides the stack's own.
    assert {"cloudformation", "s3", "ssm", "sts"} <= services


def test_the_init_hook_creates_the_schema_modules_tables(moto_server: str) -> None:
    names = {"QUERATOR_ITEMS_TABLE": f"ls-{uuid.uuid4().hex[:8]}-items",
             "QUERATOR_CATALOG_TABLE": f"ls-{uuid.uuid4().hex[:8]}-catalog"}  # fmt: skip
    env = {
        **os.environ,
        **names,
        "QUERATOR_SCHEMA_PATH": str(LOCALSTACK.parent / "src/querator/storage/dynamodb/schema.py"),
        "QUERATOR_INIT_ENDPOINT": moto_server,
    }
    hook = LOCALSTACK / "init" / "ready.d" / "create_tables.py"
    subprocess.run([sys.executable, str(hook)], env=env, check=True, capture_output=True, timeout=120)  # noqa: S603
    client = dynamodb_client(moto_server)
    items = client.describe_table(TableName=names["QUERATOR_ITEMS_TABLE"])["Table"]
    catalog = client.describe_table(TableName=names["QUERATOR_CATALOG_TABLE"])["Table"]
    assert items["KeySchema"] == schema.items_table_definition("x")["KeySchema"]
    assert catalog["KeySchema"] == schema.catalog_table_definition("x")["KeySchema"]
    ttl = client.describe_time_to_live(TableName=names["QUERATOR_ITEMS_TABLE"])["TimeToLiveDescription"]
    assert ttl["AttributeName"] == schema.TTL
