"""Who may call the API: the grants of producers, consumers and admins (``infra.permissions.Caller``),
on every queue or on named queues and prefixes, and the three whole-API managed policies.

A grant allows ``execute-api:Invoke`` on exactly the routes ``infra.permissions.invoke_paths`` lists
for its caller and queues, method and path spelled out (never ``<api-id>/<stage>/*``, which would let
a producer clear or delete queues), each ARN built by the API's ``execute_api_arn``; consumers may
also open the stream (``$connect`` of the WebSocket API; its messages need no further grant). The
catch-all methods that answer 400/501 are in no grant: an unsigned or unauthorized request to them
gets API Gateway's 403, as before.

A ``*`` in a grant is the queue segment of the scoped routes (``/v1/queues/*/queue.produce`` in a
whole-API grant, ``/v1/queues/orders-*/queue.produce`` for a prefix) and nothing else; cdk-nag's
AwsSolutions-IAM5 finding on each such resource is acknowledged where the grant is made, resource by
resource, so any other wildcard in the same policy is still reported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.nag import acknowledge
from infra.permissions import INVOKE, Caller, invoke_paths

if TYPE_CHECKING:
    from collections.abc import Sequence

    from constructs import IConstruct

    from infra.config import StageConfig
    from infra.constructs.stream import QueueStream


class ExecuteApi(Protocol):
    """An API whose routes can be granted: the REST API (``QueueApi``) or the HTTP API flavour."""

    def execute_api_arn(self, method: str, path: str) -> str: ...


def invoke_arns(
    api: ExecuteApi, stream: QueueStream, caller: Caller, queues: Sequence[str] | None
) -> list[str]:
    """The resources of a grant of ``caller`` on ``queues`` (``None``: every queue)."""
    arns = [api.execute_api_arn(method, path) for method, path in invoke_paths(caller, queues)]
    if caller is Caller.CONSUMER:
        arns.append(stream.connect_arn)
    return arns


def acknowledge_queue_wildcards(scope: IConstruct, arns: Sequence[str], queues: Sequence[str] | None) -> None:
    """Acknowledge cdk-nag's IAM5 on ``scope`` for each of ``arns`` whose ``*`` is the queue segment."""
    whom = "every queue" if queues is None else "the queues " + ", ".join(repr(q) for q in queues)
    for arn in arns:
        shown = _as_nag_shows(Stack.of(scope).resolve(arn))
        if "*" in shown:
            acknowledge(
                scope,
                f"AwsSolutions-IAM5[Resource::{shown}]",
                f"A grant of {whom}: the '*' stands for the queue segment of the scoped routes "
                "(/v1/queues/<queue>/<route>), the method and the rest of the path are spelled out.",
            )


def _as_nag_shows(resolved: Any) -> str:
    """A resolved ARN as cdk-nag writes it in a finding's id: references as ``<LogicalId>`` (or
    ``<AWS::Region>``), attributes as ``<LogicalId.Attribute>``."""
    if isinstance(resolved, str):
        return resolved
    if "Ref" in resolved:
        return f"<{resolved['Ref']}>"
    if "Fn::GetAtt" in resolved:
        return "<{}.{}>".format(*resolved["Fn::GetAtt"])
    if "Fn::Join" in resolved:
        separator, parts = resolved["Fn::Join"]
        return str(separator).join(_as_nag_shows(part) for part in parts)
    raise ValueError(f"cannot tell how cdk-nag shows {resolved!r}")


class CallerPolicies(Construct):
    """One whole-API managed policy per caller (``policies`` by ``Caller``)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StageConfig,
        api: ExecuteApi,
        stream: QueueStream,
    ) -> None:
        super().__init__(scope, construct_id)
        self.policies: dict[Caller, iam.ManagedPolicy] = {}
        for caller in Caller:
            arns = invoke_arns(api, stream, caller, None)
            self.policies[caller] = policy = iam.ManagedPolicy(
                self,
                caller.value.capitalize(),
                description=f"querator {config.stage}: the API routes of a {caller.value}",
                statements=[iam.PolicyStatement(actions=[INVOKE], resources=arns)],
            )
            acknowledge_queue_wildcards(policy, arns, None)
