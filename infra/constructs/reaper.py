"""The reaper: its function and the EventBridge schedule that invokes it.

The reaper resumes from a bookmark, so a missed or failed run is made good by the next one: neither
EventBridge nor Lambda retries it (a retry would only overlap the next scheduled run).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from constructs import Construct

from infra.constructs.functions import ServiceFunction
from infra.permissions import REAPER

if TYPE_CHECKING:
    from infra.config import StageConfig
    from infra.constructs.core_layer import CoreLayer
    from infra.constructs.payloads import PayloadBucket
    from infra.constructs.table import QueueTables


class Reaper(Construct):
    """``rate(N minutes)`` → the reaper function."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StageConfig,
        layer: CoreLayer,
        tables: QueueTables,
        payloads: PayloadBucket,
    ) -> None:
        super().__init__(scope, construct_id)
        self.function = ServiceFunction(
            self, "Function", name=REAPER, config=config, layer=layer, tables=tables, payloads=payloads
        )
        self.function.function.configure_async_invoke(retry_attempts=0, max_event_age=Duration.minutes(1))
        self.schedule = events.Rule(
            self,
            "Schedule",
            description="Dead-letters expired items and publishes queue metrics",
            schedule=events.Schedule.rate(Duration.minutes(config.reaper_rate_minutes)),
            targets=[
                targets.LambdaFunction(
                    self.function.target, retry_attempts=0, max_event_age=Duration.minutes(1)
                )
            ],
        )
