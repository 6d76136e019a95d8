"""Each recorded AWS call as the IAM requests it makes, checked against the caller's deployed policy.

IAM authorizes some operations through the actions of their parts: a ``TransactWriteItems`` is
``PutItem`` / ``UpdateItem`` / ``DeleteItem`` / ``ConditionCheckItem`` on each part's table (there is no
``dynamodb:TransactWriteItems`` action), a ``TransactGetItems`` is ``GetItem`` on each. Batch
operations have their own actions, on every table they name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from tests.infra import iam_policy
from tests.infra.deployment import ACCOUNT, REGION
from tests.infra.iam_policy import Request, allowed

if TYPE_CHECKING:
    from tests.infra.deployment import Call, DeployedFunction, Deployment

_TRANSACT_PART: Final = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
    "Get": "GetItem",
}


def _table(name: str) -> str:
    return f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{name}"


def iam_requests(call: Call, stream_api: str = "", stage: str = "") -> list[Request]:
    """What IAM checks for ``call``; fails on a call this audit cannot map (so it is never ignored).
    ``stream_api`` / ``stage``: the WebSocket API's id and stage, for posts to its connections."""
    if call.service == "execute-api" and call.operation.startswith("POST /@connections/"):
        connection = call.operation.removeprefix("POST /@connections/")
        resource = (
            f"arn:aws:execute-api:{REGION}:{ACCOUNT}:{stream_api}/{stage}/POST/@connections/{connection}"
        )
        return [Request("execute-api:ManageConnections", resource)]
    if call.service != "dynamodb":
        raise AssertionError(
            f"a function called {call.service}:{call.operation}; teach the audit its resource"
        )
    body = call.body
    if call.operation in {"BatchWriteItem", "BatchGetItem"}:
        return [Request(f"dynamodb:{call.operation}", _table(t)) for t in body["RequestItems"]]
    if call.operation in {"TransactWriteItems", "TransactGetItems"}:
        requests = []
        for part in body["TransactItems"]:
            ((kind, spec),) = part.items()
            requests.append(Request(f"dynamodb:{_TRANSACT_PART[kind]}", _table(spec["TableName"])))
        return requests
    resource = _table(body["TableName"])
    if "IndexName" in body:
        resource += f"/index/{body['IndexName']}"
    return [Request(f"dynamodb:{call.operation}", resource)]


def role_statements(deployment: Deployment, fn: DeployedFunction) -> list[dict[str, Any]]:
    """Every statement of the function's role: inline policies and attached managed ones."""
    return iam_policy.role_statements(deployment.moto.client("iam"), fn.role_arn.rsplit("/", 1)[1])


def _matches(pattern: str, value: str, *, case: bool) -> bool:
    return iam_policy.matches(pattern, value, case=case)


def grants(statements: list[dict[str, Any]]) -> list[Request]:
    """Every (action, resource pattern) pair the Allow statements grant."""
    return sorted(
        {
            Request(action, resource)
            for statement in statements
            if statement["Effect"] == "Allow"
            for action in iam_policy.as_list(statement["Action"])
            for resource in iam_policy.as_list(statement["Resource"])
        }
    )


def platform_grant(deployment: Deployment, fn: DeployedFunction, grant: Request) -> bool:
    """Grants used by Lambda itself, not by the function's code: writing the function's own log group
    (the runtime ships its output) and X-Ray's trace uploads when the function is traced."""
    if grant.action in {"logs:CreateLogStream", "logs:PutLogEvents"}:
        log_group = deployment.physical[fn.properties["LoggingConfig"]["LogGroup"]["Ref"]]
        return grant.resource.split(":log-group:")[-1].removesuffix(":*") == log_group
    if grant.action in {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}:
        return fn.tracing and grant.resource == "*"
    if grant.action in STREAM_READS:
        # The event source mapping's poller reads the items table's stream as the dispatcher's role
        # (ListStreams takes no resource); the function's code never does.
        items = deployment.outputs["ItemsTableName"]
        return fn.name == "dispatcher" and (
            grant.resource == "*"
            if grant.action == "dynamodb:ListStreams"
            else f"table/{items}/stream/" in grant.resource
        )
    return False


#: What Lambda's event source mapping calls to read a DynamoDB stream.
STREAM_READS: Final = frozenset(
    {"dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator", "dynamodb:ListStreams"}
)


@dataclass
class Audit:
    """One function's policy against what its code did."""

    function: str
    used: dict[Request, int]
    granted: list[Request]
    #: Requests the policy does not allow.
    denied: list[Request]
    #: Grants no recorded call needed (platform grants excluded).
    unused: list[Request]
    platform: list[Request]

    def actions(self, which: str) -> list[str]:
        pairs = self.used if which == "used" else self.granted
        return sorted({f"{r.action} {short(r.resource)}" for r in pairs})


def short(resource: str) -> str:
    """A grant's or call's resource as one word a stage does not change: the table's role
    (`items`, `catalog`, ...), `own log group`, or the resource itself."""
    if table := re.search(r":table/.*Tables([A-Za-z]+?)[0-9A-F]{8}-", resource):
        return table.group(1).lower()
    if ":log-group:" in resource:
        return "own log group"
    return resource


def audit(deployment: Deployment, fn: DeployedFunction) -> Audit:
    statements = role_statements(deployment, fn)
    used: dict[Request, int] = {}
    stream_api = deployment.physical_of("AWS::ApiGatewayV2::Api")
    for call in deployment.calls_of(fn.name):
        for request in iam_requests(call, stream_api, deployment.stage):
            used[request] = used.get(request, 0) + 1
    granted = grants(statements)
    platform = [g for g in granted if platform_grant(deployment, fn, g)]
    unused = [
        g
        for g in granted
        if g not in platform
        and not any(
            _matches(g.action, u.action, case=False) and _matches(g.resource, u.resource, case=True)
            for u in used
        )
    ]
    denied = sorted(r for r in used if not allowed(statements, r))
    return Audit(fn.name, used, granted, denied, unused, platform)


def report(stage: str, audits: list[Audit]) -> str:
    """A table a reviewer can read: per function, the actions used and the grants left over."""
    lines = [f"policy audit, stage {stage}: function | used (calls) | granted but unused | platform"]
    for a in audits:
        used = ", ".join(
            f"{r.action.removeprefix('dynamodb:')}@{short(r.resource)}x{n}" for r, n in sorted(a.used.items())
        )
        unused = ", ".join(f"{r.action}@{short(r.resource)}" for r in a.unused) or "-"
        platform = ", ".join(sorted({r.action for r in a.platform})) or "-"
        lines.append(f"  {a.function:8} | {used} | {unused} | {platform}")
        lines += [f"  {a.function:8} DENIED {r.action} {r.resource}" for r in a.denied]
    return "\n".join(lines)
