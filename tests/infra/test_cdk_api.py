"""The REST API: one IAM-authenticated method per entry of ``querator.api.routes.ROUTES``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from querator.api.routes import ROUTES

if TYPE_CHECKING:
    from tests.infra.synth import Synth

pytestmark = pytest.mark.infra


def _getatts(value: Any) -> list[list[str]]:
    """Every ``Fn::GetAtt`` inside an intrinsic (the integration URI is a ``Fn::Join``)."""
    if isinstance(value, dict):
        if "Fn::GetAtt" in value:
            return [value["Fn::GetAtt"]]
        return [found for item in value.values() for found in _getatts(item)]
    if isinstance(value, list):
        return [found for item in value for found in _getatts(item)]
    return []


def _paths(synth: Synth) -> dict[str, str]:
    """Resource logical id → full path, from the PathPart / ParentId chain."""
    resources = synth.of_type("AWS::ApiGateway::Resource")

    def path_of(logical_id: str) -> str:
        props = resources[logical_id]["Properties"]
        parent = props["ParentId"]
        prefix = path_of(parent["Ref"]) if "Ref" in parent else ""
        return f"{prefix}/{props['PathPart']}"

    return {logical_id: path_of(logical_id) for logical_id in resources}


def _methods(synth: Synth) -> list[dict[str, Any]]:
    return list(synth.of_type("AWS::ApiGateway::Method").values())


def test_every_route_exists_with_its_method_and_function_and_nothing_else(synth: Synth) -> None:
    paths = _paths(synth)
    function_by_id = {synth.logical_id(fn.function): name for name, fn in synth.stack.functions.items()}
    deployed = set()
    for method in _methods(synth):
        props = method["Properties"]
        (target,) = [att for att in _getatts(props["Integration"]["Uri"]) if att[1] == "Arn"]
        deployed.add((props["HttpMethod"], paths[props["ResourceId"]["Ref"]], function_by_id[target[0]]))
    routed = {(route.method, route.path, route.function) for route in ROUTES}
    # What no route matches goes to the meta function, which answers 400 / 501 in the envelope.
    other_methods = {("ANY", route.path, "meta") for route in ROUTES}
    parents = ("", "/v1", "/v1/storage", "/v1/queues/{queue}", "/v1/queues/{queue}/storage")
    unknown_paths = {("ANY", f"{parent}/{{proxy+}}", "meta") for parent in parents}
    # "/v1/queues" has the variable child "{queue}" (one per resource): it takes unknown segments.
    unknown_paths.add(("ANY", "/v1/queues/{queue}", "meta"))
    assert deployed == routed | other_methods | unknown_paths


def test_the_catch_alls_may_invoke_only_the_meta_function_with_one_permission(synth: Synth) -> None:
    meta = synth.logical_id(synth.stack.functions["meta"].function)
    wildcard = [
        perm
        for perm in synth.of_type("AWS::Lambda::Permission").values()
        if perm["Properties"]["Principal"] == "apigateway.amazonaws.com"
        and "/*/*" in str(perm["Properties"].get("SourceArn"))
    ]
    assert {perm["Properties"]["FunctionName"]["Fn::GetAtt"][0] for perm in wildcard} == {meta}


def test_every_method_requires_iam_sigv4(synth: Synth) -> None:
    methods = _methods(synth)
    assert methods
    assert {m["Properties"]["AuthorizationType"] for m in methods} == {"AWS_IAM"}


def test_every_integration_is_a_lambda_proxy(synth: Synth) -> None:
    for method in _methods(synth):
        integration = method["Properties"]["Integration"]
        assert integration["Type"] == "AWS_PROXY"
        assert integration["IntegrationHttpMethod"] == "POST"


def test_stage_is_throttled_and_writes_json_access_logs(synth: Synth) -> None:
    (stage,) = synth.of_type("AWS::ApiGateway::Stage").values()
    props = stage["Properties"]
    assert props["StageName"] == "dev"
    (settings,) = props["MethodSettings"]
    assert settings["ThrottlingRateLimit"] == synth.stack.config.api_throttle_rate
    assert settings["ThrottlingBurstLimit"] == synth.stack.config.api_throttle_burst
    assert settings["LoggingLevel"] == "ERROR"
    assert settings["DataTraceEnabled"] is False
    assert props["AccessLogSetting"]["DestinationArn"] == {
        "Fn::GetAtt": [synth.logical_id(synth.stack.api.access_logs), "Arn"]
    }
    assert '"status":"$context.status"' in props["AccessLogSetting"]["Format"]


def test_api_gateway_may_invoke_each_route_function(synth: Synth) -> None:
    permitted = {
        perm["Properties"]["FunctionName"]["Fn::GetAtt"][0]
        for perm in synth.of_type("AWS::Lambda::Permission").values()
        if perm["Properties"]["Principal"] == "apigateway.amazonaws.com"
    }
    route_functions = {synth.logical_id(synth.stack.functions[route.function].function) for route in ROUTES}
    # ... and the stream function, for the WebSocket API's routes (only from that API).
    stream_function = synth.logical_id(synth.stack.stream.function.function)
    assert permitted == route_functions | {stream_function}
    for perm in synth.of_type("AWS::Lambda::Permission").values():
        if perm["Properties"]["FunctionName"]["Fn::GetAtt"][0] == stream_function:
            assert {"Ref": synth.logical_id(synth.stack.stream.api)} in perm["Properties"]["SourceArn"][
                "Fn::Join"
            ][1]


def test_the_access_log_records_integration_latency_and_error_and_the_callers_arn(synth: Synth) -> None:
    (stage,) = synth.of_type("AWS::ApiGateway::Stage").values()
    fields = json.loads(stage["Properties"]["AccessLogSetting"]["Format"])
    assert fields["integrationLatency"] == "$context.integrationLatency"
    assert fields["integrationError"] == "$context.integration.error"
    assert fields["userArn"] == "$context.identity.userArn"
    assert {"requestId", "status", "resourcePath", "httpMethod", "responseLatency"} <= set(fields)
