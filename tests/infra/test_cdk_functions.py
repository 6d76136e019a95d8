"""Each function: least-privilege DynamoDB grants from ``infra.permissions``, runtime, env and logs."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from infra.config import StageConfig
from infra.permissions import DYNAMODB_ACTIONS, FUNCTION_NAMES, TableRole
from infra.timeouts import (
    API_GATEWAY_SECONDS,
    LEASE_CLAIM_SECONDS,
    LEASE_WAIT_CAP_MAX,
    REAPER_MARGIN_SECONDS,
    limits,
)
from querator.config import METRICS_NAMESPACE, SERVICE_NAME, EnvVar
from querator.storage.dynamodb.connections import BY_QUEUE_INDEX

if TYPE_CHECKING:
    from tests.infra.synth import Synth

pytestmark = pytest.mark.infra


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _statements_of_role(synth: Synth, role_id: str) -> list[dict[str, Any]]:
    statements = []
    for policy in synth.of_type("AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            statements += policy["Properties"]["PolicyDocument"]["Statement"]
    return statements


def _grants(synth: Synth, name: str, prefix: str) -> set[tuple[str, str]]:
    """(action, resource) pairs of the function's role for actions with ``prefix``, resources by role."""
    fn = synth.stack.functions[name]
    tables = {
        synth.logical_id(synth.stack.tables.items): TableRole.ITEMS.value,
        synth.logical_id(synth.stack.tables.catalog): TableRole.CATALOG.value,
        synth.logical_id(synth.stack.tables.connections): TableRole.CONNECTIONS.value,
        synth.logical_id(fn.log_group): "own-log-group",
    }
    pairs = set()
    for statement in _statements_of_role(synth, synth.logical_id(fn.role)):
        assert statement["Effect"] == "Allow"
        actions = [a for a in _as_list(statement["Action"]) if a.startswith(prefix)]
        if not actions or set(actions) <= STREAM_READS:
            continue  # the event source mapping's reads of the items table's stream (below)
        for action in actions:
            for granted in _as_list(statement["Resource"]):
                # A table or log group is referenced by its Arn attribute, never by a literal or "*";
                # a table's index as "<its Arn>/index/<name>", and only for a Query.
                resource = granted
                if "Fn::Join" in granted:
                    resource, suffix = granted["Fn::Join"][1]
                    assert suffix == f"/index/{BY_QUEUE_INDEX}"
                    assert action == "dynamodb:Query"
                logical_id, attribute = resource["Fn::GetAtt"]
                assert attribute == "Arn"
                pairs.add((action, tables[logical_id]))
    return pairs


#: What Lambda's event source mapping needs to read a DynamoDB stream (granted by DynamoEventSource).
STREAM_READS = frozenset(
    {"dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator", "dynamodb:ListStreams"}
)


def test_only_the_dispatcher_reads_the_items_tables_stream_and_only_that_stream(synth: Synth) -> None:
    stream_arn = {"Fn::GetAtt": [synth.logical_id(synth.stack.tables.items), "StreamArn"]}
    readers = {}
    for name in FUNCTION_NAMES:
        fn = synth.stack.functions[name]
        for statement in _statements_of_role(synth, synth.logical_id(fn.role)):
            actions = set(_as_list(statement["Action"])) & STREAM_READS
            if actions:
                readers.setdefault(name, set()).update(
                    (a, json.dumps(r, sort_keys=True))
                    for a in actions
                    for r in _as_list(statement["Resource"])
                )
    assert set(readers) == {"dispatcher"}
    assert readers["dispatcher"] == {
        ("dynamodb:ListStreams", json.dumps("*")),  # takes no resource
        *{(a, json.dumps(stream_arn, sort_keys=True)) for a in STREAM_READS - {"dynamodb:ListStreams"}},
    }


@pytest.mark.parametrize("name", FUNCTION_NAMES)
def test_each_function_has_exactly_its_dynamodb_actions_on_exactly_its_tables(
    synth: Synth, name: str
) -> None:
    expected = {
        (action, table.value) for table, actions in DYNAMODB_ACTIONS[name].items() for action in actions
    }
    assert _grants(synth, name, "dynamodb:") == expected


@pytest.mark.parametrize("name", FUNCTION_NAMES)
def test_each_function_writes_logs_only_to_its_own_log_group(synth: Synth, name: str) -> None:
    assert _grants(synth, name, "logs:") == {
        ("logs:CreateLogStream", "own-log-group"),
        ("logs:PutLogEvents", "own-log-group"),
    }
    role = synth.resources[synth.logical_id(synth.stack.functions[name].role)]
    assert "ManagedPolicyArns" not in role["Properties"]


def test_no_policy_grants_a_wildcard_action_or_a_wildcard_dynamodb_resource(synth: Synth) -> None:
    for policy in synth.of_type("AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = _as_list(statement["Action"])
            assert not [a for a in actions if "*" in a]
            dynamodb_actions = [a for a in actions if a.startswith("dynamodb:")]
            # ListStreams (the dispatcher's event source mapping) is the one that takes no resource.
            if dynamodb_actions and dynamodb_actions != ["dynamodb:ListStreams"]:
                assert "*" not in _as_list(statement["Resource"])


@pytest.mark.parametrize("name", FUNCTION_NAMES)
def test_each_function_runs_its_asset_on_the_stage_runtime_with_the_layer(synth: Synth, name: str) -> None:
    fn = synth.stack.functions[name]
    props = synth.resources[synth.logical_id(fn.function)]["Properties"]
    assert props["Runtime"] == "python3.12"
    assert props["Architectures"] == ["arm64"]
    assert props["Handler"] == "handler.lambda_handler"
    assert props["Layers"] == [{"Ref": synth.logical_id(synth.stack.layer.layer)}]
    assert props["TracingConfig"] == {"Mode": "Active"}
    assert "ReservedConcurrentExecutions" not in props  # none configured for dev in cdk.json


@pytest.mark.parametrize("name", FUNCTION_NAMES)
def test_each_function_gets_the_environment_named_in_querator_config(synth: Synth, name: str) -> None:
    fn = synth.stack.functions[name]
    variables = synth.resources[synth.logical_id(fn.function)]["Properties"]["Environment"]["Variables"]
    assert variables[EnvVar.ITEMS_TABLE] == {"Ref": synth.logical_id(synth.stack.tables.items)}
    assert variables[EnvVar.CATALOG_TABLE] == {"Ref": synth.logical_id(synth.stack.tables.catalog)}
    assert variables[EnvVar.POWERTOOLS_SERVICE_NAME] == SERVICE_NAME
    assert variables[EnvVar.POWERTOOLS_METRICS_NAMESPACE] == METRICS_NAMESPACE
    assert variables[EnvVar.LEASE_WAIT_CAP] == "20"
    assert variables[EnvVar.REAPER_MARGIN] == str(REAPER_MARGIN_SECONDS)
    assert set(variables) <= {
        value for key, value in vars(EnvVar).items() if key.isupper() and isinstance(value, str)
    }


@pytest.mark.parametrize("name", FUNCTION_NAMES)
def test_each_function_logs_json_to_its_own_log_group_with_the_stage_retention(
    synth: Synth, name: str
) -> None:
    fn = synth.stack.functions[name]
    props = synth.resources[synth.logical_id(fn.function)]["Properties"]
    log_group_id = synth.logical_id(fn.log_group)
    assert props["LoggingConfig"]["LogFormat"] == "JSON"
    assert props["LoggingConfig"]["LogGroup"] == {"Ref": log_group_id}
    # The dev stage of cdk.json keeps logs 14 days.
    assert synth.resources[log_group_id]["Properties"]["RetentionInDays"] == 14


def test_a_lease_waits_less_than_its_function_runs_and_the_function_less_than_api_gateway(
    synth: Synth,
) -> None:
    props = synth.resources[synth.logical_id(synth.stack.functions["lease"].function)]["Properties"]
    assert 20 < props["Timeout"] < 29


@pytest.mark.parametrize("name", FUNCTION_NAMES)
def test_each_function_gets_the_memory_of_the_table(synth: Synth, name: str) -> None:
    props = synth.resources[synth.logical_id(synth.stack.functions[name].function)]["Properties"]
    assert props["MemorySize"] == limits(StageConfig())[name].memory_mb
    if name == "lease":
        # A waiting lease bills its whole wait at this size (ADR 0012): the smallest that claims in time.
        assert props["MemorySize"] == 256


def test_the_reaper_finishes_within_half_its_schedule_period(synth: Synth) -> None:
    # Half the period stays free: a late EventBridge delivery never starts a run over the last one.
    props = synth.resources[synth.logical_id(synth.stack.functions["reaper"].function)]["Properties"]
    assert props["Timeout"] * 2 <= 60
    assert props["Timeout"] > REAPER_MARGIN_SECONDS


@pytest.mark.parametrize("minutes", [1, 2, 5, 60])
def test_the_reaper_never_overlaps_itself_at_any_rate(minutes: int) -> None:
    timeout = limits(StageConfig(reaper_rate_minutes=minutes))["reaper"].timeout_seconds
    assert timeout * 2 <= minutes * 60
    assert timeout <= 900  # Lambda's maximum


@pytest.mark.parametrize("name", [n for n in FUNCTION_NAMES if n not in ("reaper", "dispatcher")])
def test_every_function_behind_the_api_ends_before_api_gateway_gives_up(synth: Synth, name: str) -> None:
    props = synth.resources[synth.logical_id(synth.stack.functions[name].function)]["Properties"]
    assert props["Timeout"] <= API_GATEWAY_SECONDS


def test_the_longest_lease_wait_leaves_the_claims_their_time_within_api_gateways_limit() -> None:
    longest = StageConfig(lease_wait_cap_seconds=LEASE_WAIT_CAP_MAX)
    assert limits(longest)["lease"].timeout_seconds == LEASE_WAIT_CAP_MAX + LEASE_CLAIM_SECONDS
    assert limits(longest)["lease"].timeout_seconds < API_GATEWAY_SECONDS


def test_a_retry_of_a_full_batch_gets_api_gateways_whole_limit(synth: Synth) -> None:
    # 1,000 ids, a read and a move each: 15 s was not enough at ~10 ms a request.
    props = synth.resources[synth.logical_id(synth.stack.functions["items"].function)]["Properties"]
    assert props["Timeout"] == API_GATEWAY_SECONDS
