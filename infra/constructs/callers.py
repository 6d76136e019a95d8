"""Managed policies for the API's callers: producers, consumers, admins (``infra.permissions.Caller``).

Each allows ``execute-api:Invoke`` on exactly the routes of its functions in this stage, plus the
read-only ``queues.info`` every client reads (``SHARED_PATHS``), method and path spelled out (no
``<api-id>/<stage>/*``, which would let a producer clear or delete queues). The stack outputs their
ARNs; attaching them to a user, group or role is the deployer's decision (docs/deploy.md). The
catch-all methods that answer 400/501 are in nobody's policy: an unsigned or unauthorized request to
them gets API Gateway's 403, as before. Consumers may also open the stream (``$connect`` of the
WebSocket API; its messages need no further grant).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.nag import acknowledge
from infra.permissions import Caller, caller_routes, iam_path

if TYPE_CHECKING:
    from aws_cdk import CfnElement
    from aws_cdk import aws_apigateway as apigw
    from aws_cdk import aws_apigatewayv2 as apigw2

    from infra.config import StageConfig


class CallerPolicies(Construct):
    """One managed policy per caller (``policies`` by ``Caller``)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StageConfig,
        api: apigw.RestApi,
        stream: apigw2.WebSocketApi,
    ) -> None:
        super().__init__(scope, construct_id)
        self.policies: dict[Caller, iam.ManagedPolicy] = {}
        connect = Stack.of(self).format_arn(
            service="execute-api", resource=stream.api_id, resource_name=f"{config.stage}/$connect"
        )
        for caller in Caller:
            stream_grants = (
                [iam.PolicyStatement(actions=["execute-api:Invoke"], resources=[connect])]
                if caller is Caller.CONSUMER
                else []
            )
            self.policies[caller] = iam.ManagedPolicy(
                self,
                caller.value.capitalize(),
                description=f"querator {config.stage}: the API routes of a {caller.value}",
                statements=[
                    iam.PolicyStatement(
                        actions=["execute-api:Invoke"],
                        resources=[
                            api.arn_for_execute_api(route.method, iam_path(route), config.stage)
                            for route in caller_routes(caller)
                        ],
                    ),
                    *stream_grants,
                ],
            )
            api_id = Stack.of(self).get_logical_id(cast("CfnElement", api.node.default_child))
            for route in caller_routes(caller):
                if route.scoped:
                    acknowledge(
                        self.policies[caller],
                        "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:execute-api:<AWS::Region>:"
                        f"<AWS::AccountId>:<{api_id}>/{config.stage}/{route.method}{iam_path(route)}]",
                        "The whole-API policy grants the route for every queue: its one wildcard is the "
                        "queue segment of the scoped path; per-queue grants name the queue there.",
                    )
