"""The stream's half of the stack: WebSocket API with IAM on $connect, its routes to the stream
function, the dispatcher on the items table's stream (inserts only) and on a schedule, posting to
this stage's connections only, and alarms on the dispatcher."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from infra.constructs.monitoring import DISPATCHER_ITERATOR_AGE_MS
from infra.constructs.stream import STREAM_BATCH
from querator.config import EnvVar

if TYPE_CHECKING:
    from tests.infra.synth import Synth

pytestmark = pytest.mark.infra


def _routes(synth: Synth) -> dict[str, dict[str, Any]]:
    return {
        r["Properties"]["RouteKey"]: r["Properties"]
        for r in synth.of_type("AWS::ApiGatewayV2::Route").values()
    }


def test_the_websocket_api_authorizes_connect_with_iam_and_routes_everything_to_the_stream_function(
    synth: Synth,
) -> None:
    (api,) = synth.of_type("AWS::ApiGatewayV2::Api").values()
    assert api["Properties"]["ProtocolType"] == "WEBSOCKET"
    routes = _routes(synth)
    assert set(routes) == {"$connect", "$disconnect", "$default"}
    assert routes["$connect"]["AuthorizationType"] == "AWS_IAM"
    stream_fn = synth.logical_id(synth.stack.stream.function.function)
    integrations = synth.of_type("AWS::ApiGatewayV2::Integration").values()
    assert {json.dumps(i["Properties"]["IntegrationUri"]) for i in integrations} == {
        json.dumps(i["Properties"]["IntegrationUri"]) for i in integrations if stream_fn in json.dumps(i)
    }
    assert len(list(integrations)) == 3


def test_the_stage_logs_each_connection_and_message_with_the_signer(synth: Synth) -> None:
    (stage,) = synth.of_type("AWS::ApiGatewayV2::Stage").values()
    props = stage["Properties"]
    assert props["StageName"] == synth.stack.config.stage
    assert props["AutoDeploy"] is True
    fields = json.loads(props["AccessLogSettings"]["Format"])
    assert {"connectionId", "eventType", "routeKey", "userArn", "status", "integrationError"} <= set(fields)
    assert props["AccessLogSettings"]["DestinationArn"] == {
        "Fn::GetAtt": [synth.logical_id(synth.stack.stream.access_log), "Arn"]
    }


def test_the_dispatcher_reads_only_inserts_of_the_items_tables_stream(synth: Synth) -> None:
    (mapping,) = synth.of_type("AWS::Lambda::EventSourceMapping").values()
    props = mapping["Properties"]
    assert props["EventSourceArn"] == {
        "Fn::GetAtt": [synth.logical_id(synth.stack.tables.items), "StreamArn"]
    }
    assert props["FunctionName"] == {"Ref": synth.logical_id(synth.stack.stream.dispatcher.function)}
    assert props["StartingPosition"] == "LATEST"
    assert props["BatchSize"] == STREAM_BATCH
    assert props["BisectBatchOnFunctionError"] is True
    (pattern,) = props["FilterCriteria"]["Filters"]
    assert json.loads(pattern["Pattern"]) == {"eventName": ["INSERT"]}


def test_a_schedule_sweeps_for_items_ready_by_time_at_the_reapers_rate(synth: Synth) -> None:
    rule = synth.resources[synth.logical_id(synth.stack.stream.sweep)]["Properties"]
    assert rule["ScheduleExpression"] == "rate(1 minute)"
    (target,) = rule["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": [synth.logical_id(synth.stack.stream.dispatcher.function), "Arn"]}
    assert target["RetryPolicy"]["MaximumRetryAttempts"] == 0


@pytest.mark.parametrize("which", ["function", "dispatcher"])
def test_the_stream_functions_post_to_this_stages_connections_only(synth: Synth, which: str) -> None:
    fn = getattr(synth.stack.stream, which)
    env = synth.resources[synth.logical_id(fn.function)]["Properties"]["Environment"]["Variables"]
    assert env[EnvVar.CONNECTIONS_TABLE] == {"Ref": synth.logical_id(synth.stack.tables.connections)}
    assert synth.logical_id(synth.stack.stream.api) in json.dumps(env[EnvVar.STREAM_ENDPOINT])
    manage = [
        s
        for p in synth.of_type("AWS::IAM::Policy").values()
        if {"Ref": synth.logical_id(fn.role)} in p["Properties"]["Roles"]
        for s in p["Properties"]["PolicyDocument"]["Statement"]
        if "execute-api:ManageConnections" in json.dumps(s["Action"])
    ]
    (statement,) = manage
    parts = statement["Resource"]["Fn::Join"][1]
    assert {"Ref": synth.logical_id(synth.stack.stream.api)} in parts
    assert parts[-1] == f"/{synth.stack.config.stage}/POST/@connections/*"
    # No other function may post to connections.
    others = [
        name
        for name, other in synth.stack.functions.items()
        if other not in (synth.stack.stream.function, synth.stack.stream.dispatcher)
        and "ManageConnections"
        in json.dumps(
            [
                p
                for p in synth.of_type("AWS::IAM::Policy").values()
                if {"Ref": synth.logical_id(other.role)} in p["Properties"]["Roles"]
            ]
        )
    ]
    assert others == []


def test_the_dispatcher_lagging_the_stream_alarms(synth: Synth) -> None:
    alarm = synth.resources[synth.logical_id(synth.stack.monitoring.alarms["DispatcherIteratorAge"])][
        "Properties"
    ]
    assert alarm["MetricName"] == "IteratorAge"
    assert alarm["Statistic"] == "Maximum"
    assert alarm["Threshold"] == DISPATCHER_ITERATOR_AGE_MS
    assert alarm["Dimensions"] == [
        {"Name": "FunctionName", "Value": {"Ref": synth.logical_id(synth.stack.stream.dispatcher.function)}}
    ]
    assert "DispatcherErrors" in synth.stack.monitoring.alarms


def test_the_stack_outputs_the_stream_url(synth: Synth) -> None:
    assert synth.logical_id(synth.stack.stream.api) in json.dumps(synth.outputs["StreamUrl"]["Value"])


def test_the_stream_function_requires_a_ticket_of_the_queue_at_every_subscribe(synth: Synth) -> None:
    # $connect names no queue: without tickets a consumer granted one queue could subscribe to any.
    assert synth.stack.config.stream_tickets_required
    for fn, required in ((synth.stack.stream.function, "required"), (synth.stack.stream.dispatcher, None)):
        env = synth.resources[synth.logical_id(fn.function)]["Properties"]["Environment"]["Variables"]
        assert env.get(EnvVar.STREAM_TICKETS) == required
