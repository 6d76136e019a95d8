"""The HTTP API flavour of the edge (``apiFlavour: http``), generated from ``querator.api.routes.ROUTES``.

The same surface as the REST API of ``infra.constructs.api``, for $1.00 per million calls instead of
$3.50 (docs/adr/0094-api-flavour.md): every route, and the ``$default`` route that catches what no
route matches, is IAM-authorized (SigV4), so nobody outside the account can make it invoke a function.
The Lambda integrations use payload format 1.0, the REST proxy's event and response shape, so the
handlers (``querator.api.gateway``) need no second reader. The API is served on the ``$default``
stage: on a named stage an HTTP API puts the stage in the event's ``path`` (``/dev/v1/...``), which
the handlers' exact route lookup would answer with 501.

What an HTTP API does not have, and this flavour therefore lacks: WAF, resource policies, private
endpoints, usage plans and per-client throttling, request validation, execution logs, X-Ray traces of
the API, and LocalStack Community (it serves only REST APIs). Bodies are capped at 10 MB by API
Gateway as on REST; the handlers answer 413 over a route's own limit as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aws_cdk import Duration
from aws_cdk import aws_apigatewayv2 as apigw2
from aws_cdk import aws_apigatewayv2_authorizers as authorizers
from aws_cdk import aws_apigatewayv2_integrations as integrations
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.constructs.common import AccessLogSettings, execute_api_arn, removal_policy, retention
from infra.timeouts import API_GATEWAY_SECONDS
from querator.api.routes import ROUTES, Function

if TYPE_CHECKING:
    from collections.abc import Mapping

    from infra.config import StageConfig
    from infra.constructs.functions import ServiceFunction

#: The stage the API is served on: no stage segment in the URL, nor in the events' ``path``.
STAGE: Final = "$default"

#: One JSON line per request, the REST API's fields in an HTTP API's variables (``routeKey`` and
#: ``path`` for REST's ``resourcePath``): who signed (``userArn``), how long the function took, and
#: why API Gateway could not reach it (``integrationError``: timeout, throttle, permission).
ACCESS_LOG_FIELDS: Final = {
    "requestId": "$context.requestId",
    "ip": "$context.identity.sourceIp",
    "user": "$context.identity.user",
    "userArn": "$context.identity.userArn",
    "caller": "$context.identity.caller",
    "requestTime": "$context.requestTime",
    "httpMethod": "$context.httpMethod",
    "routeKey": "$context.routeKey",
    "path": "$context.path",
    "status": "$context.status",
    "protocol": "$context.protocol",
    "responseLength": "$context.responseLength",
    "responseLatency": "$context.responseLatency",
    "integrationLatency": "$context.integrationLatency",
    "integrationStatus": "$context.integrationStatus",
    "integrationError": "$context.integration.error",
    "error": "$context.error.message",
}


def _integration(construct_id: str, function: ServiceFunction) -> integrations.HttpLambdaIntegration:
    return integrations.HttpLambdaIntegration(
        construct_id,
        function.target,
        # 1.0 is the REST proxy's event and response: the handlers read httpMethod, path, headers.
        payload_format_version=apigw2.PayloadFormatVersion.VERSION_1_0,
        # Scoped: the route's own path, and for the $default route ``<api>/*/*``, which matches what
        # API Gateway sends for it (``<api>/<stage>/$default``). CDK's unscoped ``<api>/*/*/*`` does not
        # match that ARN (one segment short): the catch-all would answer 500 without invoking.
        scope_permission_to_route=True,
        # REST's limit on both flavours, so the lease wait cap (infra/timeouts.py) holds for either.
        timeout=Duration.seconds(API_GATEWAY_SECONDS),
    )


class HttpQueueApi(Construct):
    """HttpApi with one IAM-authorized route per entry of ``ROUTES``, a ``$default`` catch-all,
    stage throttling and JSON access logs."""

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
        authorizer = authorizers.HttpIamAuthorizer()
        self.api = apigw2.HttpApi(
            self,
            "Api",
            api_name=f"querator-{config.stage}",
            description="Querator lease queue (docs/api.md)",
            create_default_stage=False,
            default_authorizer=authorizer,
        )
        self.stage = apigw2.HttpStage(
            self,
            "Stage",
            http_api=self.api,
            stage_name=STAGE,
            auto_deploy=True,
            access_log_settings=AccessLogSettings(self.access_logs, ACCESS_LOG_FIELDS),
            throttle=apigw2.ThrottleSettings(
                rate_limit=config.api_throttle_rate, burst_limit=config.api_throttle_burst
            ),
        )
        self.routes: list[apigw2.HttpRoute] = []
        for route in ROUTES:
            # One integration per route: CDK binds an integration's Lambda permission once, on its
            # first route, so a shared route-scoped one would leave the other routes unauthorized.
            integration = _integration(
                f"{route.method} {route.path}".replace("/", "|"), functions[route.function]
            )
            self.routes += self.api.add_routes(
                path=route.path,
                methods=[apigw2.HttpMethod[route.method]],
                integration=integration,
                authorizer=authorizer,
            )
        # What no route matches (an unknown path, a known path with another method) goes to the meta
        # function, which answers the contract's 501 / 400 in its envelope, as REST's catch-alls do.
        # Still IAM: an unsigned request gets API Gateway's 403 before any function runs.
        self.default_route = apigw2.HttpRoute(
            self,
            "DefaultRoute",
            http_api=self.api,
            route_key=apigw2.HttpRouteKey.DEFAULT,
            integration=_integration("Misses", functions[Function.META]),
            authorizer=authorizer,
        )
        self.routes.append(self.default_route)
        self.url = self.stage.url

    def execute_api_arn(self, method: str, path: str) -> str:
        """``arn:aws:execute-api:<region>:<account>:<api-id>/$default/<METHOD>/<path>``: what an IAM
        policy grants to invoke ``method path`` (``ANY``: every method; ``{param}``: any value)."""
        return execute_api_arn(self, self.api.api_id, STAGE, method, path)
