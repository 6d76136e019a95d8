"""Stage settings from CDK context: defaults, per-stage objects, ``-c`` strings, and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aws_cdk import App

from infra.config import StageConfig, StageConfigError
from infra.timeouts import limits
from querator.config import DEFAULT_ENGINE

pytestmark = pytest.mark.infra

TOPIC = "arn:aws:sns:eu-west-1:123456789012:querator-alarms"
CDK_JSON = json.loads((Path(__file__).resolve().parents[2] / "cdk.json").read_text(encoding="utf-8"))


def test_dev_stage_from_cdk_json_destroys_its_data_and_keeps_logs_two_weeks() -> None:
    config = StageConfig.from_context(App(context=CDK_JSON["context"]).node)
    assert config.stage == "dev"
    assert config.stack_name == "querator-dev"
    assert not config.retains_data
    assert config.log_retention_days == 14
    assert config.reaper_rate_minutes == 1


def test_prod_stage_retains_data_and_reserves_a_reaper_and_the_long_polls() -> None:
    context = {**CDK_JSON["context"], "stage": "prod", "alarmTopicArn": TOPIC}
    config = StageConfig.from_context(App(context=context).node)
    assert config.stack_name == "querator-prod"
    assert config.retains_data
    # Waiting leases get a pool of their own, so long-polls cannot take produce's and complete's.
    assert dict(config.reserved_concurrency) == {"reaper": 1, "lease": 200}


def test_memory_per_function_replaces_the_table_and_only_for_the_named_function() -> None:
    default = limits(StageConfig(stage="dev"))
    assert default["lease"].memory_mb == 256  # chosen by benchmarks.idle (ADR 0012)
    tuned = limits(StageConfig.from_mapping({"memoryMb": '{"lease": 1024}'}))
    assert tuned["lease"].memory_mb == 1024
    assert tuned["lease"].timeout_seconds == default["lease"].timeout_seconds
    assert {n: lim for n, lim in tuned.items() if n != "lease"} == {
        n: lim for n, lim in default.items() if n != "lease"
    }


def test_the_engine_is_the_products_unless_a_stage_names_one() -> None:
    assert StageConfig(stage="dev").engine == DEFAULT_ENGINE == 3
    # A rollback to engine v2 (docs/deploy.md, "Engines"), from -c as a string.
    assert StageConfig.from_mapping({"stage": "dev", "engine": "2"}).engine == 2


def test_command_line_strings_override_the_stage_object() -> None:
    context = {**CDK_JSON["context"], "stage": "prod", "logRetentionDays": "30", "tracing": "false",
               "provisionedConcurrency": '{"lease": 2}', "alarmEmail": "ops@example.com"}  # fmt: skip
    config = StageConfig.from_context(App(context=context).node)
    assert config.log_retention_days == 30
    assert config.tracing is False
    assert dict(config.provisioned_concurrency) == {"lease": 2}


@pytest.mark.parametrize("stage", sorted(CDK_JSON["context"]["stages"]))
def test_every_stage_in_cdk_json_parses_given_an_alarm_destination(stage: str) -> None:
    context = {**CDK_JSON["context"], "stage": stage, "alarmTopicArn": TOPIC}
    config = StageConfig.from_context(App(context=context).node)
    assert config.stack_name == f"querator-{stage}"


def test_the_local_stage_suits_localstack() -> None:
    config = StageConfig.from_context(App(context={**CDK_JSON["context"], "stage": "local"}).node)
    assert not config.retains_data
    assert not config.api_cloud_watch_role
    assert not config.tracing


@pytest.mark.parametrize(("stage", "flavour"), [("dev", "rest"), ("local", "rest"), ("prod", "http")])
def test_each_stage_gets_the_api_flavour_adr_0094_chose(stage: str, flavour: str) -> None:
    # LocalStack Community serves only REST APIs; prod saves $2.50 per million calls on an HTTP API.
    context = {**CDK_JSON["context"], "stage": stage, "alarmTopicArn": TOPIC}
    assert StageConfig.from_context(App(context=context).node).api_flavour == flavour
    assert StageConfig(stage="staging", alarm_email="ops@example.com").api_flavour == "rest"
    context["apiFlavour"] = "rest"  # -c apiFlavour=rest: a prod that needs WAF or a resource policy
    assert StageConfig.from_context(App(context=context).node).api_flavour == "rest"


def test_an_unnamed_stage_is_not_a_dev_stage_unless_told() -> None:
    assert StageConfig(stage="staging", alarm_email="ops@example.com").retains_data
    assert not StageConfig(stage="staging", retain_data=False).retains_data


def test_a_stage_that_retains_data_needs_an_alarm_destination_and_a_placeholder_is_none() -> None:
    with pytest.raises(StageConfigError, match="alarmTopicArn"):
        StageConfig(stage="staging")
    # cdk.json's prod holds a placeholder, so a plain `cdk synth -c stage=prod` stops and says why.
    placeholder = CDK_JSON["context"]["stages"]["prod"]["alarmTopicArn"]
    assert placeholder.startswith("<")
    with pytest.raises(StageConfigError, match="retains data"):
        StageConfig.from_context(App(context={**CDK_JSON["context"], "stage": "prod"}).node)
    # Either destination replaces it; the placeholder itself never reaches the template.
    context = {**CDK_JSON["context"], "stage": "prod", "alarmEmail": "ops@example.com"}
    config = StageConfig.from_context(App(context=context).node)
    assert config.alarm_topic_arn is None
    assert config.alarm_email == "ops@example.com"
    assert StageConfig(stage="dev").alarm_topic_arn is None  # dev may notify nobody


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"runtime": "python3.9"}, "runtime"),
        ({"architecture": "sparc"}, "architecture"),
        ({"apiFlavour": "websocket"}, "apiFlavour"),
        ({"apiFlavour": "HTTP"}, "apiFlavour"),
        ({"logRetentionDays": 31}, "logRetentionDays"),
        ({"reservedConcurrency": {"nope": 1}}, "reservedConcurrency"),
        ({"memoryMb": {"lease": 64}}, "memoryMb"),
        ({"memoryMb": {"nope": 512}}, "memoryMb"),
        ({"leaseWaitCapSeconds": 25}, "leaseWaitCapSeconds"),
        ({"storeReadTimeoutSeconds": 0}, "storeReadTimeoutSeconds"),
        ({"storeReadTimeoutSeconds": 901}, "storeReadTimeoutSeconds"),
        ({"tracing": "maybe"}, "tracing"),
        ({"reaperRateMinutes": "soon"}, "reaperRateMinutes"),
        ({"engine": 1}, "engine"),
        ({"engine": "v3"}, "engine"),
        ({"typoedKey": 1}, "typoedKey"),
    ],
)
def test_a_wrong_setting_is_refused_naming_its_key(values: dict[str, object], named: str) -> None:
    with pytest.raises(StageConfigError, match=named):
        StageConfig.from_mapping(values)
