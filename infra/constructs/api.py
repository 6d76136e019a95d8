"""The REST API, generated from ``querator.api.routes.ROUTES``.

Every method is authenticated with IAM (SigV4), ``/health`` included: the API has no anonymous
surface, so nobody outside the account can make it invoke (and bill) a function; a health check
signs like any other client. Body limits: REST APIs cannot limit a body's size below their fixed
10 MB, so the handlers answer 413 over a route's ``body_limit`` (docs/adr/0010-stack-shape.md).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final

from aws_cdk import RemovalPolicy
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.constructs.common import execute_api_arn, removal_policy, retention
from infra.nag import acknowledge
from querator.api.routes import ROUTES, Function

if TYPE_CHECKING:
    from collections.abc import Mapping

    from infra.config import StageConfig
    from infra.constructs.functions import ServiceFunction


#: One JSON line per request: CDK's standard fields, plus how long the function took
#: (``integrationLatency``), why API Gateway could not reach it (``integrationError``: timeout, Lambda
#: throttle, permission) and who signed the request (``userArn``).
ACCESS_LOG_FIELDS: Final = {
    "requestId": "$context.requestId",
    "ip": "$context.identity.sourceIp",
    "user": "$context.identity.user",
    "userArn": "$context.identity.userArn",
    "caller": "$context.identity.caller",
    "requestTime": "$context.requestTime",
    "httpMethod": "$context.httpMethod",
    "resourcePath": "$context.resourcePath",
    "status": "$context.status",
    "protocol": "$context.protocol",
    "responseLength": "$context.responseLength",
    "responseLatency": "$context.responseLatency",
    "integrationLatency": "$context.integrationLatency",
    "integrationStatus": "$context.integration.status",
    "integrationError": "$context.integration.error",
}


class QueueApi(Construct):
    """RestApi with one IAM-authenticated method per route, throttling and JSON access logs."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StageConfig,
        functions: Mapping[str, ServiceFunction],
    ) -> None:
        super().__init__(scope, construct_id)
        self.access_logs = logs.LogGroup(
            self,
            "AccessLogs",
            retention=retention(config),
            removal_policy=removal_policy(config),
        )
        self.api = apigw.RestApi(
            self,
            "Api",
            rest_api_name=f"querator-{config.stage}",
            description="Querator lease queue (docs/api.md)",
            endpoint_types=[apigw.EndpointType.REGIONAL],
            cloud_watch_role=config.api_cloud_watch_role,
            # Region-wide (AWS::ApiGateway::Account): other stacks' APIs may log through it too.
            cloud_watch_role_removal_policy=RemovalPolicy.RETAIN if config.api_cloud_watch_role else None,
            deploy_options=apigw.StageOptions(
                stage_name=config.stage,
                throttling_rate_limit=config.api_throttle_rate,
                throttling_burst_limit=config.api_throttle_burst,
                access_log_destination=apigw.LogGroupLogDestination(self.access_logs),
                access_log_format=apigw.AccessLogFormat.custom(
                    json.dumps(ACCESS_LOG_FIELDS, separators=(",", ":"))
                ),
                # Errors only: INFO would log every request twice (access log + execution log), and
                # data tracing would put payloads in the logs.
                logging_level=apigw.MethodLoggingLevel.ERROR,
                data_trace_enabled=False,
                metrics_enabled=True,
                tracing_enabled=config.tracing,
            ),
            default_method_options=apigw.MethodOptions(authorization_type=apigw.AuthorizationType.IAM),
        )
        for route in ROUTES:
            resource = self.api.root.resource_for_path(route.path)
            resource.add_method(
                route.method,
                # No console test-invoke permission: it doubles the Lambda permissions per route, and a
                # signed request does the same job.
                apigw.LambdaIntegration(
                    functions[route.function].target, proxy=True, allow_test_invoke=False
                ),
                authorization_type=apigw.AuthorizationType.IAM,
            )
        self._answer_misses_in_the_envelope(functions)
        self.url = self.api.url
        self.stage_name = config.stage

        if config.api_cloud_watch_role:
            acknowledge(
                self.api,
                "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
                "AmazonAPIGatewayPushToCloudWatchLogs]",
                "API Gateway's account-wide logging role needs exactly this AWS-managed policy "
                "(logs for every API in the region); it is what the console would create.",
            )
        acknowledge(
            self.api,
            "AwsSolutions-APIG2",
            "Bodies are validated by the handlers' wire messages: the contract answers 455 for "
            "unknown keys and accepts camelCase aliases, which API Gateway models cannot express.",
        )
        acknowledge(
            self.api,
            "AwsSolutions-APIG3",
            "Every method requires SigV4 (IAM) and the stage is throttled; a WAF web ACL is an "
            "account decision (cost, rules) left to the deployer.",
        )
        acknowledge(
            self.api,
            "AwsSolutions-COG4",
            "Callers are IAM principals (SigV4); a Cognito user pool authorizer would add a second "
            "identity system the contract does not have.",
        )

    def execute_api_arn(self, method: str, path: str) -> str:
        """``arn:aws:execute-api:<region>:<account>:<api-id>/<stage>/<METHOD>/<path>``: what an IAM
        policy grants to invoke ``method path`` (``ANY``: every method; ``{param}``: any value).
        ``path`` may hold IAM's wildcards (``/v1/queues/orders-*/queue.produce``); every grant is
        built through this method, which the HTTP API flavour offers too."""
        return execute_api_arn(self, self.api.rest_api_id, self.stage_name, method, path)

    def _answer_misses_in_the_envelope(self, functions: Mapping[str, ServiceFunction]) -> None:
        """Send what no route matches to the meta function, which answers as the contract says.

        Without this API Gateway answers a known path asked with another method, and any unknown
        path, with its own 403 "Missing Authentication Token"; the contract wants 400 and 501 in
        its envelope. ``ANY`` on a route's resource catches the other methods (the route's own
        method takes precedence), a greedy ``{proxy+}`` under every parent catches unknown paths.
        Both stay IAM-authenticated: an unsigned caller still gets 403 before any function runs.
        """
        meta = apigw.LambdaIntegration(
            functions[Function.META].target,
            proxy=True,
            # One invoke permission for every catch-all method instead of one each: the function's
            # resource policy has a size limit. No allow_test_invoke=False: with one API-wide
            # permission there is no test-invoke permission to leave out, and CDK warns once per
            # method (24 times) that the value is ignored.
            scope_permission_to_method=False,
        )
        leaves = {route.path for route in ROUTES}
        parents = {"/"} | {path.rsplit("/", depth)[0] or "/" for path in leaves for depth in (1, 2)}
        # A resource may have one variable child: under "/v1/queues" that is the scoped routes'
        # "{queue}", which takes any next segment, so it answers in place of a "{proxy+}" there.
        variables = {path for path in parents if path.rsplit("/", 1)[-1].startswith("{")}
        taken = {path.rsplit("/", 1)[0] or "/" for path in variables}
        for path in sorted(leaves | variables):
            self.api.root.resource_for_path(path).add_method("ANY", meta)
        for path in sorted(parents - leaves - taken):
            # add_resource, not add_proxy: add_proxy on the root also puts a MOCK ANY on "/" itself.
            self.api.root.resource_for_path(path).add_resource("{proxy+}").add_method("ANY", meta)
