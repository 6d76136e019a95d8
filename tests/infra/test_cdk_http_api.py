"""The HTTP API flavour (``apiFlavour: http``, stage prod's): the REST API's surface on an HttpApi.

What moto's CloudFormation cannot run (it does not model API Gateway v2, tests/infra/deployment.py)
is checked here on the template: routes, authorization, integrations, permissions, the caller
policies' ARNs. The handlers are fed an HTTP API payload-1.0 event in tests/functions.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from cfnlint.api import ManualArgs, lint

from infra.constructs.api import QueueApi
from infra.constructs.http_api import HttpQueueApi
from infra.permissions import Caller, invoke_paths
from querator.api.routes import ROUTES
from tests.infra.conftest import ALARM_EMAIL
from tests.infra.synth import cdk_context, fake_assets, synthesize
from tests.infra.test_cdk_checks import CFN_LINT_IGNORED

if TYPE_CHECKING:
    from tests.infra.synth import Synth

pytestmark = pytest.mark.infra


@pytest.fixture(scope="module")
def http_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The dev stage switched to the HTTP API, with an alarm e-mail so every alarm has its action."""
    root = tmp_path_factory.mktemp("infra-http")
    context = cdk_context(**fake_assets(root), alarmEmail=ALARM_EMAIL, apiFlavour="http")
    return synthesize(root / "cdk.out", context)


def _api(synth: Synth) -> HttpQueueApi:
    assert isinstance(synth.stack.api, HttpQueueApi)
    return synth.stack.api


def _routes(synth: Synth) -> dict[str, dict[str, Any]]:
    """Route key → properties, of the queue API only (the stream's WebSocket API has routes too)."""
    api = {"Ref": synth.logical_id(_api(synth).api)}
    return {
        route["Properties"]["RouteKey"]: route["Properties"]
        for route in synth.of_type("AWS::ApiGatewayV2::Route").values()
        if route["Properties"]["ApiId"] == api
    }


def _integration_of(synth: Synth, route: dict[str, Any]) -> dict[str, Any]:
    target = route["Target"]["Fn::Join"][1][1]["Ref"]
    props: dict[str, Any] = synth.resources[target]["Properties"]
    return props


def _function_of(synth: Synth) -> dict[str, str]:
    return {synth.logical_id(fn.function): name for name, fn in synth.stack.functions.items()}


def test_the_stack_has_an_http_api_and_no_rest_api(http_synth: Synth) -> None:
    assert not http_synth.of_type("AWS::ApiGateway::RestApi")
    assert not http_synth.of_type("AWS::ApiGateway::Method")
    apis = http_synth.of_type("AWS::ApiGatewayV2::Api")
    assert {api["Properties"]["ProtocolType"] for api in apis.values()} == {"HTTP", "WEBSOCKET"}


def test_every_route_and_the_catch_all_exist_and_nothing_else(http_synth: Synth) -> None:
    assert set(_routes(http_synth)) == {f"{r.method} {r.path}" for r in ROUTES} | {"$default"}


def test_every_route_the_catch_all_included_requires_iam_sigv4(http_synth: Synth) -> None:
    routes = _routes(http_synth)
    assert {key: props["AuthorizationType"] for key, props in routes.items()} == dict.fromkeys(
        routes, "AWS_IAM"
    )


def test_each_route_integrates_its_function_in_the_rest_proxys_payload_format(http_synth: Synth) -> None:
    functions = _function_of(http_synth)
    served = {}
    for key, route in _routes(http_synth).items():
        integration = _integration_of(http_synth, route)
        assert integration["IntegrationType"] == "AWS_PROXY"
        # 1.0: httpMethod, path, headers and a statusCode/multiValueHeaders reply, as from REST.
        assert integration["PayloadFormatVersion"] == "1.0"
        assert integration["TimeoutInMillis"] == 29_000
        served[key] = functions[integration["IntegrationUri"]["Fn::GetAtt"][0]]
    assert served == {f"{r.method} {r.path}": r.function for r in ROUTES} | {"$default": "meta"}


def test_api_gateway_may_invoke_each_routes_function_on_that_route_and_meta_on_any(http_synth: Synth) -> None:
    api = {"Ref": http_synth.logical_id(_api(http_synth).api)}
    functions = _function_of(http_synth)
    permitted: set[tuple[str, str]] = set()
    for perm in http_synth.of_type("AWS::Lambda::Permission").values():
        props = perm["Properties"]
        parts = props.get("SourceArn", {}).get("Fn::Join", ["", []])[1]
        if props["Principal"] != "apigateway.amazonaws.com" or api not in parts:
            continue
        # ..., {"Ref": <the HttpApi>}, "/*/*<path>": any stage and method, this route's path.
        permitted.add((functions[props["FunctionName"]["Fn::GetAtt"][0]], parts[-1]))
    expected = {(r.function, f"/*/*{r.path}") for r in ROUTES}
    # The catch-all's one permission, for API Gateway's "<api>/<stage>/$default" (CDK's unscoped
    # "/*/*/*" would not match it): the meta function, any stage and route.
    assert permitted == expected | {("meta", "/*/*")}


def test_the_stage_is_the_default_one_throttled_with_json_access_logs(http_synth: Synth) -> None:
    api = _api(http_synth)
    (stage,) = [
        s["Properties"]
        for s in http_synth.of_type("AWS::ApiGatewayV2::Stage").values()
        if s["Properties"]["ApiId"] == {"Ref": http_synth.logical_id(api.api)}
    ]
    # $default: the event's path has no stage segment, which the handlers' route lookup needs.
    assert stage["StageName"] == "$default"
    assert stage["AutoDeploy"] is True
    assert stage["DefaultRouteSettings"]["ThrottlingRateLimit"] == http_synth.stack.config.api_throttle_rate
    assert stage["DefaultRouteSettings"]["ThrottlingBurstLimit"] == http_synth.stack.config.api_throttle_burst
    assert stage["AccessLogSettings"]["DestinationArn"] == {
        "Fn::GetAtt": [http_synth.logical_id(api.access_logs), "Arn"]
    }
    fields = json.loads(stage["AccessLogSettings"]["Format"])
    assert fields["userArn"] == "$context.identity.userArn"
    assert fields["integrationError"] == "$context.integration.error"
    assert {"requestId", "status", "routeKey", "httpMethod", "responseLatency", "integrationLatency"} <= set(
        fields
    )


def test_the_api_url_output_is_the_default_stages_url(http_synth: Synth) -> None:
    parts = http_synth.outputs["ApiUrl"]["Value"]["Fn::Join"][1]
    assert parts[1] == {"Ref": http_synth.logical_id(_api(http_synth).api)}
    assert parts[-1] == "/"


@pytest.mark.parametrize("caller", list(Caller))
def test_each_caller_policy_invokes_exactly_its_routes_on_the_http_api(
    http_synth: Synth, caller: Caller
) -> None:
    policy = http_synth.resources[http_synth.logical_id(http_synth.stack.callers.policies[caller])]
    (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
    api = {"Ref": http_synth.logical_id(_api(http_synth).api)}
    granted = set()
    for resource in statement["Resource"]:
        parts = resource["Fn::Join"][1]
        if parts[-2] != api:  # the consumer's stream $connect, checked by test_cdk_callers
            continue
        stage, method, path = parts[-1].split("/", 3)[1:]
        assert stage == "$default"
        granted.add(f"{method} /{path}")
    # The whole-API grant: the caller's plain routes and their scoped twins for any queue.
    assert granted == {f"{method} {path}" for method, path in invoke_paths(caller)}


def test_execute_api_arn_grants_any_value_of_a_path_parameter_and_any_method_for_any(
    http_synth: Synth,
) -> None:
    api = _api(http_synth)
    resolved = http_synth.stack.resolve(api.execute_api_arn("POST", "/v1/queues/{queue}/queue.produce"))
    assert resolved["Fn::Join"][1][-2] == {"Ref": http_synth.logical_id(api.api)}
    assert resolved["Fn::Join"][1][-1] == "/$default/POST/v1/queues/*/queue.produce"
    assert (
        http_synth.stack.resolve(api.execute_api_arn("ANY", "/v1/x"))["Fn::Join"][1][-1] == "/$default/*/v1/x"
    )


def test_the_rest_apis_execute_api_arn_is_cdks_for_every_route(synth: Synth) -> None:
    # The caller policies are built through execute_api_arn on both flavours; on REST it must name
    # what CDK's arn_for_execute_api named before, or the deployed policies would change.
    api = synth.stack.api
    assert isinstance(api, QueueApi)
    # CDK writes a path parameter as it is ("{queue}"), which IAM would match literally; the twins'
    # segment is checked as "*" below.
    for route in (r for r in ROUTES if "{" not in r.path):
        ours = synth.stack.resolve(api.execute_api_arn(route.method, route.path))
        cdks = synth.stack.resolve(
            api.api.arn_for_execute_api(route.method, route.path, synth.stack.config.stage)
        )
        assert ours == cdks
    param = synth.stack.resolve(api.execute_api_arn("POST", "/v1/queues/{queue}/queue.produce"))
    assert param["Fn::Join"][1][-1] == f"/{synth.stack.config.stage}/POST/v1/queues/*/queue.produce"


def test_the_api_alarms_watch_the_http_apis_metrics(http_synth: Synth) -> None:
    alarm = http_synth.resources[http_synth.logical_id(http_synth.stack.monitoring.alarms["Api5xx"])]
    props = alarm["Properties"]
    # An HTTP API publishes 5xx (REST: 5XXError) per ApiId.
    assert (props["Namespace"], props["MetricName"]) == ("AWS/ApiGateway", "5xx")
    assert props["Dimensions"] == [
        {"Name": "ApiId", "Value": {"Ref": http_synth.logical_id(_api(http_synth).api)}}
    ]


def test_cfn_lint_finds_nothing_in_the_http_flavours_template(http_synth: Synth) -> None:
    template = (http_synth.outdir / f"{http_synth.stack.stack_name}.template.json").read_text(
        encoding="utf-8"
    )
    matches = lint(
        template,
        config=ManualArgs(regions=["us-east-1", "eu-west-1"], ignore_checks=sorted(CFN_LINT_IGNORED)),
    )
    assert [f"{m.rule.id} {m.path} {m.message}" for m in matches] == []


def test_cdk_nag_finds_nothing_and_nothing_of_the_http_api_is_acknowledged(http_synth: Synth) -> None:
    assert http_synth.validation_error is None
    assert not [
        ack for ack in http_synth.acknowledged if ack[0].startswith(f"{http_synth.stack.stack_name}/Api")
    ]
