"""The stack of one stage: it only composes the constructs and names the outputs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aws_cdk import CfnOutput, Stack

from infra.constructs.api import QueueApi
from infra.constructs.callers import CallerPolicies
from infra.constructs.core_layer import CoreLayer
from infra.constructs.functions import QueueFunctions
from infra.constructs.http_api import HttpQueueApi
from infra.constructs.monitoring import QueueMonitoring
from infra.constructs.reaper import Reaper
from infra.constructs.stream import QueueStream
from infra.constructs.table import QueueTables
from infra.permissions import DISPATCHER, REAPER, STREAM

if TYPE_CHECKING:
    from constructs import Construct

    from infra.config import StageConfig
    from infra.constructs.functions import ServiceFunction


class QueratorStack(Stack):
    """Tables, layer, functions, API, reaper schedule, alarms and dashboard of one stage."""

    def __init__(self, scope: Construct, construct_id: str, *, config: StageConfig, **kwargs: Any) -> None:
        super().__init__(
            scope,
            construct_id,
            description=f"Querator lease queue, stage {config.stage}",
            **kwargs,
        )
        self.config = config
        # Construct ids below are stable: renaming Tables/Items/Catalog would replace the tables.
        self.tables = QueueTables(self, "Tables", config=config)
        self.layer = CoreLayer(self, "CoreLayer", config=config)
        self.api_functions = QueueFunctions(
            self, "Functions", config=config, layer=self.layer, tables=self.tables
        )
        self.reaper = Reaper(self, "Reaper", config=config, layer=self.layer, tables=self.tables)
        self.stream = QueueStream(self, "Stream", config=config, layer=self.layer, tables=self.tables)
        self.functions: dict[str, ServiceFunction] = {
            **self.api_functions.by_name,
            REAPER: self.reaper.function,
            STREAM: self.stream.function,
            DISPATCHER: self.stream.dispatcher,
        }
        # One id for both flavours (docs/adr/0094-api-flavour.md): switching replaces the API.
        api_flavour = HttpQueueApi if config.api_flavour == "http" else QueueApi
        self.api: QueueApi | HttpQueueApi = api_flavour(
            self, "Api", config=config, functions=self.api_functions.by_name
        )
        self.monitoring = QueueMonitoring(
            self, "Monitoring", config=config, tables=self.tables, functions=self.functions, api=self.api.api
        )
        self.callers = CallerPolicies(self, "Callers", config=config, api=self.api, stream=self.stream.api)
        CfnOutput(self, "ApiUrl", value=self.api.url, description="Base URL; append /v1/<noun>.<verb>")
        CfnOutput(
            self, "StreamUrl", value=self.stream.url, description="WebSocket URL of the stream (docs/api.md)"
        )
        for caller, policy in self.callers.policies.items():
            CfnOutput(
                self,
                f"{caller.value.capitalize()}PolicyArn",
                value=policy.managed_policy_arn,
                description=f"Attach to principals that call the API as a {caller.value} (docs/deploy.md)",
            )
        CfnOutput(self, "ItemsTableName", value=self.tables.items.table_name)
        CfnOutput(self, "CatalogTableName", value=self.tables.catalog.table_name)
