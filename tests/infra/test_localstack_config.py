"""The LocalStack configuration: pinned, local-only, covering the stack's services; its table hook
builds the schema module's tables (run here against moto, since LocalStack needs Docker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from infra.permissions import FUNCTION_NAMES
from querator.storage.dynamodb import schema
from querator.testing import dynamodb_client
from tests.infra.test_cdk_synth_cli import offline_environment

if TYPE_CHECKING:
    from tests.infra.synth import Synth

pytestmark = pytest.mark.infra

ROOT = Path(__file__).resolve().parents[2]
LOCALSTACK = ROOT / "localstack"
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


def _localstack_env() -> dict[str, str]:
    """``localstack/localstack.env`` as ``set -a; . localstack.env`` loads it."""
    values = {}
    for line in (LOCALSTACK / "localstack.env").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def test_the_env_file_sets_the_s3_endpoint_cdklocal_requires_with_the_general_one() -> None:
    env = _localstack_env()
    assert env["AWS_ENDPOINT_URL"].startswith("http://localhost:4566")
    # cdklocal 3.x throws EnvironmentMisconfigurationError on AWS_ENDPOINT_URL alone; S3 needs a
    # host whose subdomains resolve (virtual-hosted asset bucket).
    assert env["AWS_ENDPOINT_URL_S3"] == "http://s3.localhost.localstack.cloud:4566"


@pytest.fixture(scope="module")
def cdklocal_synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``npx cdklocal synth -c stage=local`` with localstack.env loaded, offline: what deploy.sh runs
    before it deploys (its layer in a folder of its own)."""
    cli = ROOT / "node_modules" / ".bin" / "cdklocal"
    assert cli.exists(), "node_modules is missing: run `npm ci` (./run test does)"
    root = tmp_path_factory.mktemp("cdklocal")
    env = {**offline_environment(), **_localstack_env()}
    command = [str(cli), "synth", "--quiet", "-c", "stage=local", "-c", f"layerAssetPath={root / 'layer'}",
               "--output", str(root / "cdk.out")]  # fmt: skip
    result = subprocess.run(  # noqa: S603 - the pinned CLI with fixed arguments
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return root / "cdk.out"


def test_cdklocal_synthesizes_the_local_stage_offline_with_localstack_env(cdklocal_synth: Path) -> None:
    template = json.loads((cdklocal_synth / "querator-local.template.json").read_text(encoding="utf-8"))
    functions = [
        r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"
    ]
    assert len(functions) == len(FUNCTION_NAMES)
    assert not [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::LayerVersion"]
    assert all("Layers" not in f for f in functions)
    report = json.loads((cdklocal_synth / "validation-report.json").read_text(encoding="utf-8"))
    assert report["pluginReports"] == []


def test_the_local_functions_share_one_asset_that_carries_the_layers_contents(cdklocal_synth: Path) -> None:
    # LocalStack Community accepts layers but does not mount them: the code must be in the function.
    # One asset for the nine: a deploy uploads the layer's 27 MB once.
    assets = json.loads((cdklocal_synth / "querator-local.assets.json").read_text(encoding="utf-8"))["files"]
    (folder,) = [
        cdklocal_synth / a["source"]["path"] for a in assets.values() if a["source"].get("packaging") == "zip"
    ]
    assert (folder / "querator" / "__init__.py").is_file(), folder
    assert (folder / "pydantic_core").is_dir(), folder
    assert not (folder / "boto3").exists()
    template = json.loads((cdklocal_synth / "querator-local.template.json").read_text(encoding="utf-8"))
    handlers = [
        r["Properties"]["Handler"]
        for r in template["Resources"].values()
        if r["Type"] == "AWS::Lambda::Function"
    ]
    modules = sorted(h.rpartition(".")[0] for h in handlers)
    assert modules == sorted(f"functions.{name}.handler" for name in FUNCTION_NAMES)
    for module in modules:
        assert (folder / (module.replace(".", "/") + ".py")).is_file(), module
