"""Alarms and a dashboard for the signals that say the queue is unhealthy.

Custom metrics are the ones the functions publish with Powertools (``querator.config.Metric``, in
namespace ``Querator`` with the dimensions ``service=querator`` and ``stage=<stage>``, so one stage's
datapoints never feed another's alarms); the rest come from AWS/Lambda, AWS/DynamoDB and
AWS/ApiGateway, per resource of the stage, except the account's concurrent executions. Alarms notify
an SNS topic; a stage that retains data cannot be synthesized without one (``infra.config``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from querator.api.routes import Function
from querator.config import METRICS_NAMESPACE, SERVICE_NAME, Metric

if TYPE_CHECKING:
    from collections.abc import Mapping

    from aws_cdk import aws_apigateway as apigw
    from aws_cdk import aws_apigatewayv2 as apigw2

    from infra.config import StageConfig
    from infra.constructs.functions import ServiceFunction
    from infra.constructs.table import QueueTables

PERIOD: Final = Duration.minutes(5)

Comparison = cloudwatch.ComparisonOperator
Missing = cloudwatch.TreatMissingData


def custom_metric(name: str, statistic: str, stage: str) -> cloudwatch.Metric:
    """A Powertools metric: its namespace and exactly the dimensions it is published with."""
    return cloudwatch.Metric(
        namespace=METRICS_NAMESPACE,
        metric_name=name,
        dimensions_map=metric_dimensions(stage),
        statistic=statistic,
        period=PERIOD,
    )


def metric_dimensions(stage: str) -> dict[str, str]:
    """``service`` from Powertools, ``stage`` from ``querator.observability`` (``EnvVar.STAGE``)."""
    return {"service": SERVICE_NAME, "stage": stage}


#: Milliseconds the dispatcher may lag the items table's stream before it is an alarm.
DISPATCHER_ITERATOR_AGE_MS: Final = 60_000


@dataclass(frozen=True, slots=True)
class Signal:
    """One alarm: what it watches and when it fires."""

    construct_id: str
    description: str
    metric: cloudwatch.IMetric
    threshold: float
    comparison: cloudwatch.ComparisonOperator = Comparison.GREATER_THAN_OR_EQUAL_TO_THRESHOLD
    evaluation_periods: int = 1
    missing: cloudwatch.TreatMissingData = Missing.NOT_BREACHING


class QueueMonitoring(Construct):
    """The alarms (``alarms`` by construct id), the dashboard and the optional alarm topic."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StageConfig,
        tables: QueueTables,
        functions: Mapping[str, ServiceFunction],
        api: apigw.RestApi | apigw2.HttpApi,
    ) -> None:
        super().__init__(scope, construct_id)
        self.topic = self._topic(config)
        signals = [
            Signal(
                "OldestItemAge",
                f"An item has waited over {config.oldest_item_age_alarm_seconds} s to be leased: "
                "consumers are missing or too slow.",
                custom_metric(Metric.OLDEST_ITEM_AGE, "Maximum", config.stage),
                config.oldest_item_age_alarm_seconds,
                Comparison.GREATER_THAN_THRESHOLD,
            ),
            Signal(
                "DeadLetterDepth",
                "Dead-letter queues hold items: some items exhausted their attempts or expired.",
                custom_metric(Metric.DEAD_LETTER_DEPTH, "Maximum", config.stage),
                config.dead_letter_depth_alarm,
                Comparison.GREATER_THAN_THRESHOLD,
            ),
            Signal(
                "ReaperFallingBehind",
                "Reaper runs ran out of time before finishing for three periods in a row.",
                custom_metric(Metric.REAPER_UNFINISHED, "Sum", config.stage),
                1,
                evaluation_periods=3,
            ),
            Signal(
                "ReaperNotRunning",
                "The reaper was not invoked: the schedule is disabled or failing.",
                # Two schedule periods at least, so one late run is not an alarm.
                functions[Function.REAPER].function.metric_invocations(
                    period=Duration.minutes(max(10, 2 * config.reaper_rate_minutes)), statistic="Sum"
                ),
                1,
                Comparison.LESS_THAN_THRESHOLD,
                missing=Missing.BREACHING,
            ),
            Signal(
                "AccountConcurrency",
                "The account's concurrent Lambda executions near the limit: waiting leases, produce and "
                "complete share it, and every function of every stack in the region is throttled at it.",
                lambda_.Function.metric_all_concurrent_executions(period=PERIOD, statistic="Maximum"),
                config.account_concurrency_alarm,
            ),
            Signal(
                "Api5xx",
                "The API answered 5xx (handler crash, timeout or integration error).",
                api.metric_server_error(period=PERIOD, statistic="Sum"),
                5,
            ),
        ]
        for name, fn in functions.items():
            title = name.capitalize()
            signals += [
                Signal(
                    f"{title}Errors",
                    f"The {name} function failed (unhandled exception or timeout).",
                    fn.function.metric_errors(period=PERIOD, statistic="Sum"),
                    1,
                ),
                Signal(
                    f"{title}Throttles",
                    f"The {name} function was throttled (account or reserved concurrency).",
                    fn.function.metric_throttles(period=PERIOD, statistic="Sum"),
                    1,
                ),
            ]
        signals.append(
            Signal(
                "DispatcherIteratorAge",
                "The stream dispatcher is over a minute behind the items table's writes: subscribers "
                "get items late (dispatcher errors, throttles or too little concurrency).",
                functions[Function.DISPATCHER].function.metric(
                    "IteratorAge", period=PERIOD, statistic="Maximum"
                ),
                DISPATCHER_ITERATOR_AGE_MS,
            )
        )
        for title, table in (
            ("Items", tables.items),
            ("Catalog", tables.catalog),
            ("Connections", tables.connections),
        ):
            signals.append(
                Signal(
                    f"{title}TableThrottles",
                    f"DynamoDB throttled requests on the {title.lower()} table (hot partition or "
                    "on-demand scaling).",
                    cloudwatch.MathExpression(
                        expression="reads + writes",
                        using_metrics={
                            "reads": table.metric("ReadThrottleEvents", period=PERIOD, statistic="Sum"),
                            "writes": table.metric("WriteThrottleEvents", period=PERIOD, statistic="Sum"),
                        },
                        period=PERIOD,
                        label=f"{title} throttle events",
                    ),
                    1,
                )
            )
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        for signal in signals:
            alarm = cloudwatch.Alarm(
                self,
                signal.construct_id,
                alarm_description=signal.description,
                metric=signal.metric,
                threshold=signal.threshold,
                comparison_operator=signal.comparison,
                evaluation_periods=signal.evaluation_periods,
                treat_missing_data=signal.missing,
            )
            if self.topic is not None:
                alarm.add_alarm_action(cw_actions.SnsAction(self.topic))
                alarm.add_ok_action(cw_actions.SnsAction(self.topic))
            self.alarms[signal.construct_id] = alarm
        self.dashboard = self._dashboard(config, tables, functions, api)

    def _topic(self, config: StageConfig) -> sns.ITopic | None:
        if config.alarm_topic_arn:
            return sns.Topic.from_topic_arn(self, "AlarmTopic", config.alarm_topic_arn)
        if not config.alarm_email:
            return None
        topic = sns.Topic(
            self, "AlarmTopic", display_name=f"querator {config.stage} alarms", enforce_ssl=True
        )
        # Not KMS-encrypted: alarm notifications carry alarm names and states only, and CloudWatch
        # cannot publish to a topic under the AWS-managed SNS key.
        topic.add_subscription(subscriptions.EmailSubscription(config.alarm_email))
        return topic

    def _dashboard(
        self,
        config: StageConfig,
        tables: QueueTables,
        functions: Mapping[str, ServiceFunction],
        api: apigw.RestApi | apigw2.HttpApi,
    ) -> cloudwatch.Dashboard:
        dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=f"querator-{config.stage}")
        dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Queue",
                left=[
                    custom_metric(Metric.OLDEST_ITEM_AGE, "Maximum", config.stage),
                ],
                right=[custom_metric(Metric.DEAD_LETTER_DEPTH, "Maximum", config.stage)],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Items per period",
                left=[
                    custom_metric(name, "Sum", config.stage)
                    for name in (
                        Metric.ITEMS_PRODUCED,
                        Metric.ITEMS_LEASED,
                        Metric.ITEMS_COMPLETED,
                        Metric.DEAD_LETTERED,
                        Metric.EXPIRED_DELETED,
                    )
                ],
                width=12,
            ),
        )
        dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Reaper",
                left=[custom_metric(Metric.REAPER_SCANNED, "Sum", config.stage)],
                right=[custom_metric(Metric.REAPER_UNFINISHED, "Sum", config.stage)],
                width=12,
            ),
            cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(self.alarms.values()), width=12),
        )
        dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Function errors",
                left=[fn.function.metric_errors(period=PERIOD, label=name) for name, fn in functions.items()],
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="Function throttles",
                left=[
                    fn.function.metric_throttles(period=PERIOD, label=name) for name, fn in functions.items()
                ],
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="Function duration p99",
                left=[
                    fn.function.metric_duration(period=PERIOD, statistic="p99", label=name)
                    for name, fn in functions.items()
                ],
                width=8,
            ),
        )
        dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="API: client errors apart from leases that found nothing (454)",
                left=[self.client_errors(config, api)],
                right=[custom_metric(Metric.LEASE_EMPTY, "Sum", config.stage)],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Account concurrent executions",
                left=[lambda_.Function.metric_all_concurrent_executions(period=PERIOD, statistic="Maximum")],
                width=12,
            ),
        )
        dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="DynamoDB consumed capacity",
                left=[
                    tables.items.metric_consumed_write_capacity_units(period=PERIOD, label="items writes"),
                    tables.items.metric_consumed_read_capacity_units(period=PERIOD, label="items reads"),
                ],
                right=[
                    tables.catalog.metric_consumed_read_capacity_units(period=PERIOD, label="catalog reads"),
                ],
                width=24,
            ),
        )
        return dashboard

    @staticmethod
    def client_errors(config: StageConfig, api: apigw.RestApi | apigw2.HttpApi) -> cloudwatch.MathExpression:
        """API Gateway's 4XX count less the 454 answers of leases that waited and found nothing: an
        empty queue is the normal state of a long-poll, not a client error."""
        return cloudwatch.MathExpression(
            expression="MAX([api4xx - FILL(leaseEmpty, 0), 0])",
            using_metrics={
                "api4xx": api.metric_client_error(period=PERIOD, statistic="Sum"),
                "leaseEmpty": custom_metric(Metric.LEASE_EMPTY, "Sum", config.stage),
            },
            period=PERIOD,
            label="4XX without lease-empty",
        )
