"""The reaper's schedule, and the alarms on every signal the design names."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from infra.permissions import FUNCTION_NAMES, REAPER
from querator.config import METRICS_NAMESPACE, SERVICE_NAME, EnvVar, Metric
from tests.infra.conftest import ALARM_EMAIL

if TYPE_CHECKING:
    from tests.infra.synth import Synth

pytestmark = pytest.mark.infra


def _alarms(synth: Synth) -> list[dict[str, Any]]:
    return [a["Properties"] for a in synth.of_type("AWS::CloudWatch::Alarm").values()]


def _alarm_on(synth: Synth, namespace: str, metric: str, dimensions: list[dict[str, Any]]) -> dict[str, Any]:
    found = [
        a
        for a in _alarms(synth)
        if a.get("Namespace") == namespace
        and a.get("MetricName") == metric
        and a.get("Dimensions") == dimensions
    ]
    assert len(found) == 1, f"no single alarm on {namespace}/{metric} {dimensions}"
    return found[0]


def _dimensions(synth: Synth) -> list[dict[str, Any]]:
    return [{"Name": "service", "Value": SERVICE_NAME}, {"Name": "stage", "Value": synth.stack.config.stage}]


def test_every_custom_metric_an_alarm_watches_carries_the_stage(synth: Synth) -> None:
    custom = [a for a in _alarms(synth) if a.get("Namespace") == METRICS_NAMESPACE]
    assert len(custom) == 3
    assert all(a["Dimensions"] == _dimensions(synth) for a in custom)


def test_the_functions_publish_the_stage_their_alarms_select_on(synth: Synth) -> None:
    for fn in synth.stack.functions.values():
        variables = synth.resources[synth.logical_id(fn.function)]["Properties"]["Environment"]["Variables"]
        assert variables[EnvVar.STAGE] == synth.stack.config.stage
        # The engine is written out: a deployed stack keeps it until it is deployed again.
        assert variables[EnvVar.ENGINE] == str(synth.stack.config.engine)


def test_the_account_concurrency_alarm_fires_before_the_limit(synth: Synth) -> None:
    # Account-wide: the metric without dimensions.
    (alarm,) = [a for a in _alarms(synth) if a.get("MetricName") == "ConcurrentExecutions"]
    assert alarm["Namespace"] == "AWS/Lambda"
    assert "Dimensions" not in alarm
    assert alarm["Statistic"] == "Maximum"
    assert alarm["Threshold"] == synth.stack.config.account_concurrency_alarm == 800


def test_the_dashboard_counts_client_errors_apart_from_empty_leases(synth: Synth) -> None:
    (dashboard,) = synth.of_type("AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    assert "api4xx - FILL(leaseEmpty, 0)" in body
    assert Metric.LEASE_EMPTY in body


def test_the_schedule_invokes_the_reaper_every_minute(synth: Synth) -> None:
    reaper_id = synth.logical_id(synth.stack.functions[REAPER].function)
    rule = synth.resources[synth.logical_id(synth.stack.reaper.schedule)]
    props = rule["Properties"]
    assert props["ScheduleExpression"] == "rate(1 minute)"
    assert props["State"] == "ENABLED"
    (target,) = props["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": [reaper_id, "Arn"]}
    # A missed run is made good by the next one; retries would only overlap it.
    assert target["RetryPolicy"]["MaximumRetryAttempts"] == 0
    rule_id = synth.logical_id(synth.stack.reaper.schedule)
    assert any(
        p["Properties"]["Principal"] == "events.amazonaws.com"
        and p["Properties"]["FunctionName"] == {"Fn::GetAtt": [reaper_id, "Arn"]}
        and p["Properties"]["SourceArn"] == {"Fn::GetAtt": [rule_id, "Arn"]}
        for p in synth.of_type("AWS::Lambda::Permission").values()
    )


@pytest.mark.parametrize(
    ("metric", "statistic"),
    [
        (Metric.OLDEST_ITEM_AGE, "Maximum"),
        (Metric.DEAD_LETTER_DEPTH, "Maximum"),
        (Metric.REAPER_UNFINISHED, "Sum"),
    ],
)
def test_queue_health_alarms_watch_the_powertools_metrics(synth: Synth, metric: str, statistic: str) -> None:
    # The functions publish each metric with exactly service=<SERVICE_NAME> and stage=<stage>; an
    # alarm with any other dimension set would watch a metric that never receives data.
    alarm = _alarm_on(synth, METRICS_NAMESPACE, metric, _dimensions(synth))
    assert alarm["Statistic"] == statistic
    assert alarm["ComparisonOperator"].startswith("GreaterThan")


def test_oldest_item_age_and_dead_letter_thresholds_are_the_stage_settings(synth: Synth) -> None:
    service = _dimensions(synth)
    config = synth.stack.config
    assert _alarm_on(synth, METRICS_NAMESPACE, Metric.OLDEST_ITEM_AGE, service)["Threshold"] == (
        config.oldest_item_age_alarm_seconds
    )
    assert _alarm_on(synth, METRICS_NAMESPACE, Metric.DEAD_LETTER_DEPTH, service)["Threshold"] == (
        config.dead_letter_depth_alarm
    )


@pytest.mark.parametrize("name", FUNCTION_NAMES)
@pytest.mark.parametrize("metric", ["Errors", "Throttles"])
def test_each_function_has_error_and_throttle_alarms(synth: Synth, name: str, metric: str) -> None:
    fn_id = synth.logical_id(synth.stack.functions[name].function)
    alarm = _alarm_on(synth, "AWS/Lambda", metric, [{"Name": "FunctionName", "Value": {"Ref": fn_id}}])
    assert alarm["Threshold"] == 1
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"


def test_a_reaper_that_stops_running_alarms(synth: Synth) -> None:
    fn_id = synth.logical_id(synth.stack.functions[REAPER].function)
    alarm = _alarm_on(synth, "AWS/Lambda", "Invocations", [{"Name": "FunctionName", "Value": {"Ref": fn_id}}])
    assert alarm["ComparisonOperator"] == "LessThanThreshold"
    # No invocations publish no datapoint at all, so missing data must count as "not running".
    assert alarm["TreatMissingData"] == "breaching"
    assert alarm["Period"] == 600  # ten one-minute schedule periods


@pytest.mark.parametrize("which", ["items", "catalog", "connections"])
def test_each_table_has_a_throttle_alarm_on_reads_and_writes(synth: Synth, which: str) -> None:
    table = getattr(synth.stack.tables, which)
    table_ref = {"Ref": synth.logical_id(table)}
    watched = set()
    for alarm in _alarms(synth):
        for query in alarm.get("Metrics", []):
            metric = query.get("MetricStat", {}).get("Metric", {})
            if metric.get("Namespace") == "AWS/DynamoDB" and metric["Dimensions"] == [
                {"Name": "TableName", "Value": table_ref}
            ]:
                watched.add(metric["MetricName"])
    assert watched == {"ReadThrottleEvents", "WriteThrottleEvents"}


def test_every_alarm_notifies_the_alarm_topic_which_mails_the_configured_address(synth: Synth) -> None:
    topic_id = synth.logical_id(synth.stack.monitoring.topic)
    for alarm in _alarms(synth):
        assert alarm["AlarmActions"] == [{"Ref": topic_id}]
        assert alarm["OKActions"] == [{"Ref": topic_id}]
    (subscription,) = synth.of_type("AWS::SNS::Subscription").values()
    assert subscription["Properties"]["Protocol"] == "email"
    assert subscription["Properties"]["Endpoint"] == ALARM_EMAIL
    assert subscription["Properties"]["TopicArn"] == {"Ref": topic_id}


def test_the_dashboard_shows_every_alarm(synth: Synth) -> None:
    (dashboard,) = synth.of_type("AWS::CloudWatch::Dashboard").values()
    body = str(dashboard["Properties"]["DashboardBody"])
    for alarm in synth.stack.monitoring.alarms.values():
        assert synth.logical_id(alarm) in body
