"""The service in someone else's CDK app: a shop's stack embeds ``QueratorService`` with stage settings
of its own, grants its ingest role production to ``orders-*`` and its e-mail worker consumption of
``emails``, and synthesizes offline with cdk-nag (AwsSolutions) clean; each grant is exactly its
routes. Docs: docs/deploy.md, "The service in your own CDK app"."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_iam as iam

from infra.config import StageConfig
from infra.nag import add_checks
from infra.permissions import QueueGrantError
from infra.service import QueratorService
from tests.infra.synth import fake_assets

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.infra

STAGE = "shop"
META = ["GET/health", "GET/openapi.json", "GET/docs"]


@dataclass(frozen=True)
class ShopApp:
    service: QueratorService
    stack: Stack
    resources: dict[str, dict[str, Any]]
    report: dict[str, Any] | None
    error: str | None

    def logical_id(self, construct: Any) -> str:
        return str(self.stack.get_logical_id(construct.node.default_child))

    def statements_of(self, role: str) -> list[dict[str, Any]]:
        """Every statement of the policies attached to ``role`` (a logical id)."""
        return [
            statement
            for resource in self.resources.values()
            if resource["Type"] == "AWS::IAM::Policy" and {"Ref": role} in resource["Properties"]["Roles"]
            for statement in resource["Properties"]["PolicyDocument"]["Statement"]
        ]


def build_shop(root: Path) -> ShopApp:
    """What a user writes: their own app and stack, the service with their settings, their roles."""
    assets = fake_assets(root)  # the built layer and the functions' folders, here stand-ins
    app = App(outdir=str(root / "cdk.out"))
    stack = Stack(app, "Shop")
    queue = QueratorService(
        stack,
        "Queue",
        config=StageConfig(
            stage=STAGE,
            log_retention_days=90,
            reaper_rate_minutes=5,
            tracing=False,
            api_cloud_watch_role=False,
            alarm_email="oncall@shop.example",
            reserved_concurrency={"lease": 50},
            layer_asset_path=assets["layerAssetPath"],
            functions_asset_root=assets["functionsAssetRoot"],
        ),
    )
    ingest = iam.Role(stack, "Ingest", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    queue.grant_produce(ingest, queues=["orders-*"])
    mailer = iam.Role(stack, "Mailer", assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"))
    queue.grant_consume(mailer, queues=["emails"])
    add_checks(app)
    error = None
    try:
        app.synth()
    except RuntimeError as exc:  # jsii raises validation failures as RuntimeError
        error = str(exc)
    template = json.loads((root / "cdk.out" / "Shop.template.json").read_text(encoding="utf-8"))
    report_path = root / "cdk.out" / "validation-report.json"
    report = json.loads(report_path.read_text(encoding="utf-8")) if report_path.exists() else None
    return ShopApp(queue, stack, template["Resources"], report, error)


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> ShopApp:
    return build_shop(tmp_path_factory.mktemp("shop"))


def _tails(app: ShopApp, statement: dict[str, Any]) -> list[str]:
    """``<METHOD>/<path>`` of each REST API resource of an execute-api statement (``$connect`` for
    the stream's), after checking the rest of each ARN is this service's API and stage."""
    api, stream = app.logical_id(app.service.api.api), app.logical_id(app.service.stream.api)
    tails = []
    for resource in statement["Resource"]:
        *_, reference, tail = resource["Fn::Join"][1]
        assert reference in ({"Ref": api}, {"Ref": stream}), resource
        assert tail.startswith(f"/{STAGE}/"), resource
        tails.append(tail.removeprefix(f"/{STAGE}/"))
    return tails


def test_the_users_app_synthesizes_with_cdk_nag_clean(shop: ShopApp) -> None:
    assert shop.error is None, shop.error
    assert shop.report is None or shop.report["pluginReports"] == []


def test_the_users_settings_reach_the_service(shop: ShopApp) -> None:
    lease = shop.service.functions["lease"].function.node.default_child
    assert (
        shop.resources[shop.stack.get_logical_id(lease)]["Properties"]["ReservedConcurrentExecutions"] == 50
    )
    assert not [r for r in shop.resources.values() if r["Type"] == "AWS::ApiGateway::Account"]
    for table in (r for r in shop.resources.values() if r["Type"] == "AWS::DynamoDB::Table"):
        assert table["DeletionPolicy"] == "Retain"


def test_the_producer_may_produce_to_orders_prefix_and_read_their_settings_nothing_else(
    shop: ShopApp,
) -> None:
    (statement,) = shop.statements_of(shop.logical_id(_role(shop, "Ingest")))
    assert (statement["Effect"], statement["Action"]) == ("Allow", "execute-api:Invoke")
    assert sorted(_tails(shop, statement)) == sorted(
        [*META, "POST/v1/queues/orders-*/queues.info", "POST/v1/queues/orders-*/queue.produce"]
    )


def test_the_worker_may_consume_emails_and_get_their_stream_tickets_nothing_else(shop: ShopApp) -> None:
    (statement,) = shop.statements_of(shop.logical_id(_role(shop, "Mailer")))
    assert (statement["Effect"], statement["Action"]) == ("Allow", "execute-api:Invoke")
    assert sorted(_tails(shop, statement)) == sorted(
        [
            *META,
            "POST/v1/queues/emails/queues.info",
            "POST/v1/queues/emails/queue.lease",
            "POST/v1/queues/emails/queue.complete",
            "POST/v1/queues/emails/queue.retry",
            "POST/v1/queues/emails/queue.renew",
            "POST/v1/queues/emails/stream.ticket",
            "$connect",
        ]
    )


def _role(shop: ShopApp, construct_id: str) -> iam.Role:
    role = shop.stack.node.find_child(construct_id)
    assert isinstance(role, iam.Role)
    return role


def test_a_grant_refuses_a_pattern_before_it_adds_anything(shop: ShopApp) -> None:
    role = iam.Role(shop.stack, "Refused", assumed_by=iam.AccountRootPrincipal())
    with pytest.raises(QueueGrantError, match=r"orders\*x"):
        shop.service.grant_admin(role, queues=["orders*x"])
    assert role.node.try_find_child("DefaultPolicy") is None
