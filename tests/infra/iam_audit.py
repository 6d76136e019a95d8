"""Each recorded AWS call as the IAM requests it makes, checked against the caller's deployed policy.

IAM authorizes some operations through the actions of their parts: a ``TransactWriteItems`` is
``PutItem`` / ``UpdateItem`` / ``DeleteItem`` / ``ConditionCheckItem`` on each part's table (there is no
``dynamodb:TransactWriteItems`` action), a ``TransactGetItems`` is ``GetItem`` on each. Batch
operations have their own actions, on every table they name.

S3 (the payload bucket) likewise: a ``CopyObject`` is ``s3:GetObject`` on its source and
``s3:PutObject`` on its target, a ``DeleteObjects`` ``s3:DeleteObject`` on each key, a ``HeadObject``
``s3:GetObject``, a ``ListObjectsV2`` ``s3:ListBucket`` on the bucket with its prefix as
``s3:prefix``.
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


def _object(bucket: str, key: str) -> str:
    return f"arn:aws:s3:::{bucket}/{key}"


def s3_requests(call: Call) -> list[Request]:
    """What IAM checks for an S3 call as ``deployment.s3_call`` named it."""
    body = call.body
    bucket = body["Bucket"]
    if call.operation in {"GetObject", "HeadObject"}:
        return [Request("s3:GetObject", _object(bucket, body["Key"]))]
    if call.operation in {"PutObject", "DeleteObject"}:
        return [Request(f"s3:{call.operation}", _object(bucket, body["Key"]))]
    if call.operation == "CopyObject":
        source_bucket, _, source_key = body["CopySource"].lstrip("/").partition("/")
        source_key = source_key.split("?versionId=")[0]
        return [
            Request("s3:GetObject", _object(source_bucket, source_key)),
            Request("s3:PutObject", _object(bucket, body["Key"])),
        ]
    if call.operation == "DeleteObjects":
        return [Request("s3:DeleteObject", _object(bucket, key)) for key in body["Keys"]]
    if call.operation == "ListObjectsV2":
        return [Request("s3:ListBucket", f"arn:aws:s3:::{bucket}", (("s3:prefix", body["Prefix"]),))]
    raise AssertionError(f"a function called s3:{call.operation}; teach the audit its IAM actions")


def iam_requests(call: Call, stream_api: str = "", stage: str = "") -> list[Request]:
    """What IAM checks for ``call``; fails on a call this audit cannot map (so it is never ignored).
    ``stream_api`` / ``stage``: the WebSocket API's id and stage, for posts to its connections."""
    if call.service == "execute-api" and call.operation.startswith("POST /@connections/"):
        connection = call.operation.removeprefix("POST /@connections/")
        resource = (
            f"arn:aws:execute-api:{REGION}:{ACCOUNT}:{stream_api}/{stage}/POST/@connections/{connection}"
        )
        return [Request("execute-api:ManageConnections", resource)]
    if call.service == "s3":
        return s3_requests(call)
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
    (`items`, `catalog`, ...), `payloads` (the payload bucket) and `payloads/o/*` (any of its
    objects under the prefix the store writes), `own log group`, or the resource itself."""
    if table := re.search(r":table/.*Tables([A-Za-z]+?)[0-9A-F]{8}-", resource):
        return table.group(1).lower()
    if bucket := re.fullmatch(r"arn:aws:s3:::[^/]*payloadsbucket[^/]*(/.*)?", resource, re.IGNORECASE):
        key = bucket.group(1) or ""
        return "payloads" + ("/o/*" if key.startswith("/o/") else key)
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
        # One entry per action and resource role: each object key is a resource of its own.
        counted: dict[tuple[str, str], int] = {}
        for r, n in a.used.items():
            pair = (r.action.removeprefix("dynamodb:"), short(r.resource))
            counted[pair] = counted.get(pair, 0) + n
        used = ", ".join(f"{action}@{resource}x{n}" for (action, resource), n in sorted(counted.items()))
        unused = ", ".join(f"{r.action}@{short(r.resource)}" for r in a.unused) or "-"
        platform = ", ".join(sorted({r.action for r in a.platform})) or "-"
        lines.append(f"  {a.function:8} | {used} | {unused} | {platform}")
        lines += [f"  {a.function:8} DENIED {r.action} {r.resource}" for r in a.denied]
    return "\n".join(lines)
