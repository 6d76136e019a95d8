"""The queue service as one construct: what a stage deploys, for this app's stack or anyone's CDK app.

``QueratorService(scope, id, config=StageConfig(...))`` adds the tables, the payload bucket, the core
layer, the functions, the REST API, the reaper's schedule, the stream, the alarms and dashboard, and
the three whole-API caller policies to ``scope``; ``QueratorStack`` is this construct and the stack's outputs.
A user's own app embeds it the same way and grants its own principals with ``grant_produce``,
``grant_consume`` and ``grant_admin`` (docs/deploy.md, "The service in your own CDK app").

Construct ids below are stable: they make the logical ids, and a renamed Tables/Items/Catalog would
replace the tables (and lose their data), a renamed Payloads/Bucket the payload bucket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.constructs.api import QueueApi
from infra.constructs.callers import CallerPolicies, acknowledge_queue_wildcards, invoke_arns
from infra.constructs.core_layer import CoreLayer
from infra.constructs.functions import QueueFunctions
from infra.constructs.http_api import HttpQueueApi
from infra.constructs.monitoring import QueueMonitoring
from infra.constructs.payloads import PayloadBucket
from infra.constructs.reaper import Reaper
from infra.constructs.stream import QueueStream
from infra.constructs.table import QueueTables
from infra.permissions import DISPATCHER, INVOKE, REAPER, STREAM, Caller

if TYPE_CHECKING:
    from collections.abc import Sequence

    from infra.config import StageConfig
    from infra.constructs.functions import ServiceFunction


class QueratorService(Construct):
    """Tables, payload bucket, layer, functions, API, reaper schedule, stream, alarms, dashboard and
    caller policies of one stage."""

    def __init__(self, scope: Construct, construct_id: str, *, config: StageConfig) -> None:
        super().__init__(scope, construct_id)
        self.config = config
        self.tables = QueueTables(self, "Tables", config=config)
        self.payloads = PayloadBucket(self, "Payloads", config=config)
        self.layer = CoreLayer(self, "CoreLayer", config=config)
        tables, payloads, layer = self.tables, self.payloads, self.layer
        self.api_functions = QueueFunctions(
            self, "Functions", config=config, layer=layer, tables=tables, payloads=payloads
        )
        self.reaper = Reaper(self, "Reaper", config=config, layer=layer, tables=tables, payloads=payloads)
        self.stream = QueueStream(
            self, "Stream", config=config, layer=layer, tables=tables, payloads=payloads
        )
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
        self.callers = CallerPolicies(self, "Callers", config=config, api=self.api, stream=self.stream)

    def grant_produce(self, grantee: iam.IGrantable, *, queues: Sequence[str] | None = None) -> iam.Grant:
        """Let ``grantee`` produce to ``queues`` (names, and prefixes ending in ``*``; ``None``: every
        queue) and read their settings (``queues.info``)."""
        return self.grant(grantee, Caller.PRODUCER, queues)

    def grant_consume(self, grantee: iam.IGrantable, *, queues: Sequence[str] | None = None) -> iam.Grant:
        """Let ``grantee`` lease, complete, retry and renew on ``queues``, read their settings, get
        their stream tickets (``stream.ticket``) and open the stream (a subscribe shows a ticket)."""
        return self.grant(grantee, Caller.CONSUMER, queues)

    def grant_admin(self, grantee: iam.IGrantable, *, queues: Sequence[str] | None = None) -> iam.Grant:
        """Let ``grantee`` run ``queues``: create, update, delete, stats, clear, redrive,
        reprioritize, ``storage/*``. Listing queues spans them all: only ``queues=None`` grants it."""
        return self.grant(grantee, Caller.ADMIN, queues)

    def grant(
        self, grantee: iam.IGrantable, caller: Caller, queues: Sequence[str] | None = None
    ) -> iam.Grant:
        """Add to ``grantee``'s identity policy ``execute-api:Invoke`` on exactly the routes of
        ``caller`` for ``queues`` (``infra.permissions.invoke_paths``; ``QueueGrantError`` for a
        pattern that is neither a name nor a prefix)."""
        arns = invoke_arns(self.api, self.stream, caller, queues)
        grant = iam.Grant.add_to_principal(grantee=grantee, actions=[INVOKE], resource_arns=arns)
        if isinstance(grantee, Construct):
            acknowledge_queue_wildcards(grantee, arns, queues)
        return grant

    def managed_policy(
        self,
        scope: Construct,
        construct_id: str,
        *,
        caller: Caller,
        queues: Sequence[str] | None = None,
        description: str | None = None,
    ) -> iam.ManagedPolicy:
        """A managed policy with exactly what ``grant`` would add, to attach to principals elsewhere
        (another stack, an account's roles)."""
        arns = invoke_arns(self.api, self.stream, caller, queues)
        policy = iam.ManagedPolicy(
            scope,
            construct_id,
            description=description,
            statements=[iam.PolicyStatement(actions=[INVOKE], resources=arns)],
        )
        acknowledge_queue_wildcards(policy, arns, queues)
        return policy
