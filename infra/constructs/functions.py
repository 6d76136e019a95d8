"""The Lambda functions: one per ``routes.Function`` (the reaper and the stream's included), each with
its own role.

Every function gets the same environment (names from ``querator.config.EnvVar``), JSON logs into its
own log group with the stage's retention, and only the DynamoDB actions that
``infra.permissions.DYNAMODB_ACTIONS`` lists for it, on only the tables listed there; a function that
``infra.permissions.S3_ACTIONS`` lists also gets the payload bucket's name and exactly those actions,
on the payload objects' keys (and a listing of their prefix). Roles are explicit so no AWS-managed
policy (with ``logs:*`` on every log group) is attached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, cast

from aws_cdk import CfnElement, Duration, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.constructs.common import ARCHITECTURES, RUNTIMES, removal_policy, retention
from infra.nag import acknowledge
from infra.permissions import (
    DYNAMODB_ACTIONS,
    PAYLOAD_LISTING,
    PAYLOAD_OBJECTS,
    S3_ACTIONS,
    S3_BUCKET_ACTIONS,
    S3_OBJECT_ACTIONS,
    TableRole,
)
from infra.timeouts import REAPER_MARGIN_SECONDS, limits
from querator.api.routes import Function
from querator.config import METRICS_NAMESPACE, SERVICE_NAME, EnvVar
from querator.storage.dynamodb.connections import BY_QUEUE_INDEX

#: The secondary indexes of each table (from the schemas), granted by name.
INDEXES: Final[dict[TableRole, tuple[str, ...]]] = {TableRole.CONNECTIONS: (BY_QUEUE_INDEX,)}

if TYPE_CHECKING:
    from collections.abc import Mapping

    from aws_cdk import aws_dynamodb as dynamodb

    from infra.config import StageConfig
    from infra.constructs.core_layer import CoreLayer
    from infra.constructs.payloads import PayloadBucket
    from infra.constructs.table import QueueTables


def environment(
    config: StageConfig, tables: QueueTables, payloads: PayloadBucket | None = None
) -> dict[str, str]:
    """The environment every function starts with (names from ``querator.config``); ``payloads``:
    the payload bucket, for a function that handles items (``S3_ACTIONS``)."""
    stage_settings = {}
    if config.store_read_timeout_seconds is not None:
        stage_settings[EnvVar.STORE_READ_TIMEOUT] = str(config.store_read_timeout_seconds)
    if payloads is not None:
        stage_settings[EnvVar.PAYLOAD_BUCKET] = payloads.bucket_name
    return {
        **stage_settings,
        EnvVar.ITEMS_TABLE: tables.items.table_name,
        EnvVar.CATALOG_TABLE: tables.catalog.table_name,
        EnvVar.LEASE_WAIT_CAP: str(config.lease_wait_cap_seconds),
        EnvVar.REAPER_MARGIN: str(REAPER_MARGIN_SECONDS),
        EnvVar.STAGE: config.stage,
        # Written out, not left to the code's default: a deployed stack runs the engine its stage
        # names until it is deployed again with another (docs/deploy.md, "Engines").
        EnvVar.ENGINE: str(config.engine),
        EnvVar.POWERTOOLS_SERVICE_NAME: SERVICE_NAME,
        EnvVar.POWERTOOLS_METRICS_NAMESPACE: METRICS_NAMESPACE,
        EnvVar.POWERTOOLS_LOG_LEVEL: "INFO",
        EnvVar.POWERTOOLS_TRACE_DISABLED: "false" if config.tracing else "true",
    }


class ServiceFunction(Construct):
    """One function with its role, log group and grants; ``target`` is what callers invoke."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        name: str,
        config: StageConfig,
        layer: CoreLayer,
        tables: QueueTables,
        payloads: PayloadBucket,
    ) -> None:
        super().__init__(scope, construct_id)
        self.name = name
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            retention=retention(config),
            removal_policy=removal_policy(config),
        )
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"querator {name} function ({config.stage})",
        )
        self.log_group.grant_write(self.role)
        table_of: Mapping[TableRole, dynamodb.Table] = {
            TableRole.ITEMS: tables.items,
            TableRole.CATALOG: tables.catalog,
            TableRole.CONNECTIONS: tables.connections,
        }
        for table, actions in DYNAMODB_ACTIONS[name].items():
            indexes = INDEXES.get(table, ())
            if not indexes:
                table_of[table].grant(self.role, *sorted(actions))
                continue
            # CDK's table grant gives every action on "<table>/index/*" too. Here a Query is of the
            # index (the table's own key is looked up by GetItem), so the index gets exactly that,
            # by name, and the table the rest.
            arn = table_of[table].table_arn
            on_table = sorted(actions - {"dynamodb:Query"})
            if on_table:
                self.role.add_to_policy(iam.PolicyStatement(actions=on_table, resources=[arn]))
            if "dynamodb:Query" in actions:
                self.role.add_to_policy(
                    iam.PolicyStatement(
                        actions=["dynamodb:Query"], resources=[f"{arn}/index/{index}" for index in indexes]
                    )
                )
        s3_actions = S3_ACTIONS.get(name, frozenset())
        self._grant_payloads(payloads, s3_actions)

        size = limits(config)[name]
        code, handler = layer.function_code(config.functions_asset_root, name)
        self.function = lambda_.Function(
            self,
            "Function",
            description=f"querator {name}",
            runtime=RUNTIMES[config.runtime],
            architecture=ARCHITECTURES[config.architecture],
            code=code,
            handler=handler,
            layers=layer.layers,
            memory_size=size.memory_mb,
            timeout=Duration.seconds(size.timeout_seconds),
            environment=environment(config, tables, payloads if s3_actions else None),
            role=self.role,
            log_group=self.log_group,
            logging_format=lambda_.LoggingFormat.JSON,
            application_log_level_v2=lambda_.ApplicationLogLevel.INFO,
            system_log_level_v2=lambda_.SystemLogLevel.WARN,
            tracing=lambda_.Tracing.ACTIVE if config.tracing else lambda_.Tracing.DISABLED,
            reserved_concurrent_executions=config.reserved_concurrency.get(name),
        )
        provisioned = config.provisioned_concurrency.get(name, 0)
        self.target: lambda_.IFunction = self.function
        if provisioned > 0:
            self.target = lambda_.Alias(
                self,
                "Live",
                alias_name="live",
                version=self.function.current_version,
                provisioned_concurrent_executions=provisioned,
            )
        acknowledge(
            self.function,
            "AwsSolutions-L1",
            "The runtime is a stage setting (python3.12 default, python3.13) that must match the "
            "layer's compiled wheels; it moves with a layer rebuild, not with the newest release.",
        )
        if config.tracing:
            acknowledge(
                self.role,
                "AwsSolutions-IAM5[Resource::*]",
                "X-Ray's PutTraceSegments/PutTelemetryRecords support no resource-level permissions; "
                "CDK adds them with Resource * when tracing is active.",
            )

    def _grant_payloads(self, payloads: PayloadBucket, actions: frozenset[str]) -> None:
        """Exactly ``actions`` on the payload bucket: object actions on ``<bucket>/o/*``, a listing
        on the bucket for the objects' prefix only. Not CDK's ``grant_*``, which add ``s3:*Object*``
        style wildcards and ``s3:List*`` on the whole bucket."""
        unknown = actions - S3_OBJECT_ACTIONS - S3_BUCKET_ACTIONS
        if unknown:
            raise ValueError(f"{self.name}: S3 actions with no resource here: {sorted(unknown)}")
        on_objects = sorted(actions & S3_OBJECT_ACTIONS)
        if on_objects:
            self.role.add_to_policy(
                iam.PolicyStatement(actions=on_objects, resources=[payloads.bucket_arn + PAYLOAD_OBJECTS])
            )
            acknowledge(
                self.role,
                f"AwsSolutions-IAM5[Resource::<{self._logical_id(payloads)}.Arn>{PAYLOAD_OBJECTS}]",
                "Object keys are made at run time (a time and a random part); the grant is the "
                "payload bucket's o/ prefix, the only keys the store writes, and nothing else.",
            )
        on_bucket = sorted(actions & S3_BUCKET_ACTIONS)
        if on_bucket:
            self.role.add_to_policy(
                iam.PolicyStatement(
                    actions=on_bucket,
                    resources=[payloads.bucket_arn],
                    conditions={op: dict(values) for op, values in PAYLOAD_LISTING.items()},
                )
            )

    @staticmethod
    def _logical_id(payloads: PayloadBucket) -> str:
        return Stack.of(payloads).get_logical_id(cast("CfnElement", payloads.bucket.node.default_child))


class QueueFunctions(Construct):
    """The functions behind the API, by ``routes.Function`` name."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StageConfig,
        layer: CoreLayer,
        tables: QueueTables,
        payloads: PayloadBucket,
    ) -> None:
        super().__init__(scope, construct_id)
        self.by_name: dict[str, ServiceFunction] = {
            name: ServiceFunction(
                self,
                name.capitalize(),
                name=name,
                config=config,
                layer=layer,
                tables=tables,
                payloads=payloads,
            )
            for name in (
                Function.PRODUCE,
                Function.LEASE,
                Function.ITEMS,
                Function.QUEUES,
                Function.ADMIN,
                Function.META,
            )
        }
