"""The queue service as one construct: what a stage deploys, for this app's stack or anyone's CDK app.

``QueratorService(scope, id, config=StageConfig(...))`` adds the tables, the core layer, the
functions, the REST API, the reaper's schedule, the stream, the alarms and dashboard, and the three
whole-API caller policies to ``scope``; ``QueratorStack`` is this construct and the stack's outputs.
A user's own app embeds it the same way and grants its own principals with ``grant_produce``,
``grant_consume`` and ``grant_admin`` (docs/deploy.md, "The service in your own CDK app").

Construct ids below are stable: they make the logical ids, and a renamed Tables/Items/Catalog would
replace the tables (and lose their data).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from constructs import Construct

from infra.constructs.api import QueueApi
from infra.constructs.callers import CallerPolicies
from infra.constructs.core_layer import CoreLayer
from infra.constructs.functions import QueueFunctions
from infra.constructs.monitoring import QueueMonitoring
from infra.constructs.reaper import Reaper
from infra.constructs.stream import QueueStream
from infra.constructs.table import QueueTables
from infra.permissions import DISPATCHER, REAPER, STREAM

if TYPE_CHECKING:
    from infra.config import StageConfig
    from infra.constructs.functions import ServiceFunction


class QueratorService(Construct):
    """Tables, layer, functions, API, reaper schedule, stream, alarms, dashboard and caller policies
    of one stage."""

    def __init__(self, scope: Construct, construct_id: str, *, config: StageConfig) -> None:
        super().__init__(scope, construct_id)
        self.config = config
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
        self.api = QueueApi(self, "Api", config=config, functions=self.api_functions.by_name)
        self.monitoring = QueueMonitoring(
            self, "Monitoring", config=config, tables=self.tables, functions=self.functions, api=self.api.api
        )
        self.callers = CallerPolicies(
            self, "Callers", config=config, api=self.api.api, stream=self.stream.api
        )
