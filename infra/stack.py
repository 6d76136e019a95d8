"""The stack of one stage: the service construct (``infra.service``) and the stack's outputs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from aws_cdk import CfnOutput, Stack

from infra.permissions import Caller
from infra.service import QueratorService

if TYPE_CHECKING:
    from constructs import Construct

    from infra.config import StageConfig

#: The service's construct id in this stack. CDK leaves an id ``Default`` out of the logical ids of
#: everything under it, so the resources keep the logical ids they had when the stack composed them
#: itself (Tables/Items..., not Service/Tables/Items...): an update of a stack deployed before the
#: service was a construct replaces nothing, and its tables keep their data.
SERVICE_ID: Final = "Default"
#: Scoped examples the stack outputs (docs/deploy.md, "Access per queue"): a producer of the queues
#: whose names start with ``orders-`` and a worker of ``emails``. Unattached, they cost nothing.
EXAMPLE_POLICIES: Final = {
    "ExampleOrdersProducer": (Caller.PRODUCER, ("orders-*",)),
    "ExampleEmailsWorker": (Caller.CONSUMER, ("emails",)),
}


class QueratorStack(Stack):
    """One stage: ``QueratorService`` and the outputs a deployer reads."""

    def __init__(self, scope: Construct, construct_id: str, *, config: StageConfig, **kwargs: Any) -> None:
        super().__init__(
            scope,
            construct_id,
            description=f"Querator lease queue, stage {config.stage}",
            **kwargs,
        )
        self.config = config
        self.service = service = QueratorService(self, SERVICE_ID, config=config)
        # The parts under the names they had on the stack, which the infra tests and scripts read.
        self.tables, self.layer, self.api_functions = service.tables, service.layer, service.api_functions
        self.payloads = service.payloads
        self.reaper, self.stream, self.functions = service.reaper, service.stream, service.functions
        self.api, self.monitoring, self.callers = service.api, service.monitoring, service.callers
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
        for name, (caller, queues) in EXAMPLE_POLICIES.items():
            example = service.managed_policy(
                self,
                name,
                caller=caller,
                queues=queues,
                description=f"querator {config.stage}: example, {caller.value} of {', '.join(queues)}",
            )
            CfnOutput(
                self,
                f"{name}PolicyArn",
                value=example.managed_policy_arn,
                description=f"A scoped grant, {caller.value} of {', '.join(queues)}: docs/deploy.md",
            )
        CfnOutput(self, "ItemsTableName", value=self.tables.items.table_name)
        CfnOutput(self, "CatalogTableName", value=self.tables.catalog.table_name)
        CfnOutput(
            self,
            "PayloadBucketName",
            value=self.payloads.bucket_name,
            description="Payloads over 64 KiB, as S3 objects under o/ (docs/deploy.md)",
        )
