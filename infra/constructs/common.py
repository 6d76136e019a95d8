"""Stage settings translated to CDK values, shared by the constructs."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final

import jsii
from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_apigatewayv2 as apigw2
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs

if TYPE_CHECKING:
    from collections.abc import Mapping

    from constructs import Construct

    from infra.config import StageConfig

RUNTIMES: Final = {"python3.12": lambda_.Runtime.PYTHON_3_12, "python3.13": lambda_.Runtime.PYTHON_3_13}
ARCHITECTURES: Final = {"arm64": lambda_.Architecture.ARM_64, "x86_64": lambda_.Architecture.X86_64}

_RETENTION: Final = {
    1: logs.RetentionDays.ONE_DAY,
    3: logs.RetentionDays.THREE_DAYS,
    5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK,
    14: logs.RetentionDays.TWO_WEEKS,
    30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS,
    90: logs.RetentionDays.THREE_MONTHS,
    120: logs.RetentionDays.FOUR_MONTHS,
    150: logs.RetentionDays.FIVE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS,
    365: logs.RetentionDays.ONE_YEAR,
    400: logs.RetentionDays.THIRTEEN_MONTHS,
    545: logs.RetentionDays.EIGHTEEN_MONTHS,
    731: logs.RetentionDays.TWO_YEARS,
    1096: logs.RetentionDays.THREE_YEARS,
    1827: logs.RetentionDays.FIVE_YEARS,
    2192: logs.RetentionDays.SIX_YEARS,
    2557: logs.RetentionDays.SEVEN_YEARS,
    2922: logs.RetentionDays.EIGHT_YEARS,
    3288: logs.RetentionDays.NINE_YEARS,
    3653: logs.RetentionDays.TEN_YEARS,
}


def retention(config: StageConfig) -> logs.RetentionDays:
    """The stage's log retention (``StageConfig`` accepts only CloudWatch's values)."""
    return _RETENTION[config.log_retention_days]


def removal_policy(config: StageConfig) -> RemovalPolicy:
    """Stateful resources (tables, logs) outlive the stack outside dev stages."""
    return RemovalPolicy.RETAIN if config.retains_data else RemovalPolicy.DESTROY


def execute_api_arn(scope: Construct, api_id: str, stage: str, method: str, path: str) -> str:
    """The ``execute-api:Invoke`` resource of ``method path`` on ``stage`` of API ``api_id``."""
    if not path.startswith("/"):
        raise ValueError(f"path {path!r} must start with '/'")
    verb = "*" if method.upper() == "ANY" else method.upper()
    pattern = "/".join(
        "*" if part.startswith("{") and part.endswith("}") else part for part in path.split("/")
    )
    return Stack.of(scope).format_arn(
        service="execute-api", resource=api_id, resource_name=f"{stage}/{verb}{pattern}"
    )


@jsii.implements(apigw2.IAccessLogSettings)
class AccessLogSettings:
    """A v2 API stage's JSON access log (the HTTP API flavour, the stream's WebSocket API): CDK takes
    these settings as an interface, not a struct."""

    def __init__(self, group: logs.ILogGroup, fields: Mapping[str, str]) -> None:
        self._destination = apigw2.LogGroupLogDestination(group)
        self._format = apigw.AccessLogFormat.custom(json.dumps(dict(fields), separators=(",", ":")))

    @property
    def destination(self) -> apigw2.IAccessLogDestination:
        return self._destination

    @property
    def format(self) -> apigw.AccessLogFormat:
        return self._format
