"""The stream on AWS: a WebSocket API whose consumers get leased items pushed (docs/adr/0091).

- **WebSocket API** (IAM-authenticated ``$connect``: a consumer signs the handshake like any API
  call), its ``$connect`` / ``$disconnect`` / ``$default`` routes to the ``stream`` function.
- **Dispatcher**: DynamoDB Streams of the items table (keys only, inserts only by an event-source
  filter, so claims, renewals and completes never invoke it) and a schedule at the reaper's rate
  (items that become ready by time write nothing) invoke the ``dispatcher`` function.
- Both functions keep subscriptions in the connections table and post to connections through the
  stage's callback URL; each may manage connections of this API only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, cast

from aws_cdk import CfnElement, Duration, Stack
from aws_cdk import aws_apigatewayv2 as apigw2
from aws_cdk import aws_apigatewayv2_authorizers as authorizers
from aws_cdk import aws_apigatewayv2_integrations as integrations
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.constructs.common import AccessLogSettings, removal_policy, retention
from infra.constructs.functions import ServiceFunction
from infra.nag import acknowledge
from infra.permissions import DISPATCHER, STREAM
from querator.config import EnvVar

if TYPE_CHECKING:
    from infra.config import StageConfig
    from infra.constructs.core_layer import CoreLayer
    from infra.constructs.payloads import PayloadBucket
    from infra.constructs.table import QueueTables

#: Stream records per dispatcher invocation: one produce call of up to 1,000 items is ~10 batches.
STREAM_BATCH: Final = 100
#: One JSON line per connect, message and disconnect: who signed the connection (``userArn``), the
#: route, how long the function took and why API Gateway could not reach it.
ACCESS_LOG_FIELDS: Final = {
    "requestId": "$context.requestId",
    "connectionId": "$context.connectionId",
    "eventType": "$context.eventType",
    "routeKey": "$context.routeKey",
    "ip": "$context.identity.sourceIp",
    "userArn": "$context.identity.userArn",
    "requestTime": "$context.requestTime",
    "status": "$context.status",
    "integrationLatency": "$context.integrationLatency",
    "integrationError": "$context.integration.error",
    "error": "$context.error.message",
}
#: Tries of a failed batch (halved each time to find the bad record) before it is skipped: a skipped
#: batch loses no item (it waits in its queue for the next write or the sweep), only promptness.
STREAM_RETRIES: Final = 2


class QueueStream(Construct):
    """The WebSocket API, the stream and dispatcher functions, their triggers."""

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
        self.function = ServiceFunction(
            self, "Function", name=STREAM, config=config, layer=layer, tables=tables, payloads=payloads
        )
        self.dispatcher = ServiceFunction(
            self, "Dispatcher", name=DISPATCHER, config=config, layer=layer, tables=tables, payloads=payloads
        )

        def route(name: str) -> apigw2.WebSocketRouteOptions:
            return apigw2.WebSocketRouteOptions(
                integration=integrations.WebSocketLambdaIntegration(name, self.function.target)
            )

        self.api = apigw2.WebSocketApi(
            self,
            "Api",
            description=f"Querator stream, stage {config.stage}: leased items pushed to subscribers",
            connect_route_options=apigw2.WebSocketRouteOptions(
                integration=integrations.WebSocketLambdaIntegration("Connect", self.function.target),
                authorizer=authorizers.WebSocketIamAuthorizer(),
            ),
            disconnect_route_options=route("Disconnect"),
            default_route_options=route("Messages"),
        )
        for route_id in ("$disconnect-Route", "$default-Route"):
            acknowledge(
                self.api.node.find_child(route_id),
                "AwsSolutions-APIG4",
                "A WebSocket API authorizes at $connect only (IAM here): $disconnect and messages "
                "arrive on a connection that was authorized when it opened, and take no authorizer.",
            )
        self.access_log = logs.LogGroup(
            self, "AccessLogs", retention=retention(config), removal_policy=removal_policy(config)
        )
        self.stage = apigw2.WebSocketStage(
            self,
            "Stage",
            web_socket_api=self.api,
            stage_name=config.stage,
            auto_deploy=True,
            access_log_settings=AccessLogSettings(self.access_log, ACCESS_LOG_FIELDS),
            throttle=apigw2.ThrottleSettings(
                rate_limit=config.api_throttle_rate, burst_limit=config.api_throttle_burst
            ),
        )
        # Posting to this stage's connections only (CDK's grant_manage_connections allows any stage).
        connections = Stack.of(self).format_arn(
            service="execute-api",
            resource=self.api.api_id,
            resource_name=f"{config.stage}/POST/@connections/*",
        )
        stack = Stack.of(self)
        api_id = stack.get_logical_id(cast("CfnElement", self.api.node.default_child))
        if config.stream_tickets_required:
            # Per-queue grants reach the stream through tickets: the function serving subscribes
            # refuses one without a ticket of its queue (docs/api.md, "Streaming").
            self.function.function.add_environment(EnvVar.STREAM_TICKETS, "required")
        for fn in (self.function, self.dispatcher):
            fn.function.add_environment(EnvVar.CONNECTIONS_TABLE, tables.connections.table_name)
            fn.function.add_environment(EnvVar.STREAM_ENDPOINT, self.stage.callback_url)
            fn.role.add_to_policy(
                iam.PolicyStatement(actions=["execute-api:ManageConnections"], resources=[connections])
            )
            acknowledge(
                fn.role,
                "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:execute-api:<AWS::Region>:<AWS::AccountId>:"
                f"<{api_id}>/{config.stage}/POST/@connections/*]",
                "Connection ids exist only at run time; the grant is POST to this stream stage's "
                "connections, nothing else of this or any other API.",
            )

        self.dispatcher.function.add_event_source(
            sources.DynamoEventSource(
                tables.items,
                starting_position=lambda_.StartingPosition.LATEST,
                batch_size=STREAM_BATCH,
                retry_attempts=STREAM_RETRIES,
                bisect_batch_on_error=True,
                filters=[lambda_.FilterCriteria.filter({"eventName": lambda_.FilterRule.is_equal("INSERT")})],
            )
        )
        acknowledge(
            self.dispatcher.role,
            "AwsSolutions-IAM5[Resource::*]",
            "dynamodb:ListStreams, which the event source mapping needs to find the items table's "
            "stream, takes no resource (CDK's DynamoEventSource grant); records are read on the "
            "stream's ARN only.",
        )
        self.sweep = events.Rule(
            self,
            "Sweep",
            description="Pushes items that became ready by time to stream subscribers",
            schedule=events.Schedule.rate(Duration.minutes(config.reaper_rate_minutes)),
            targets=[
                targets.LambdaFunction(
                    self.dispatcher.target, retry_attempts=0, max_event_age=Duration.minutes(1)
                )
            ],
        )

    @property
    def connect_arn(self) -> str:
        """What a consumer is granted to open the stream: ``execute-api:Invoke`` on ``$connect`` of
        this stage (its messages need no further grant)."""
        return Stack.of(self).format_arn(
            service="execute-api", resource=self.api.api_id, resource_name=f"{self.stage.stage_name}/$connect"
        )

    @property
    def url(self) -> str:
        """``wss://<api-id>.execute-api.<region>.amazonaws.com/<stage>``: what a consumer connects to."""
        return self.stage.url
