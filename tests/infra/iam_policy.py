"""IAM's answer for one (action, resource) request, from a principal's identity policies.

What the deployed-stack tests need of IAM, and no more: statements with ``Effect``, ``Action`` and
``Resource`` (``Sid`` ignored), an explicit Deny winning over any Allow, nothing allowed by default,
and IAM's two wildcards in actions and resources, ``*`` (any run of characters, ``/`` included) and
``?`` (one character); every other character is itself (unlike ``fnmatch``, ``[`` is no class).
Actions match without regard to case, resources with it. A ``Condition`` of ``StringEquals`` or
``StringLike`` on single-valued keys (the reaper's listing, ``s3:prefix``): every key must be in the
request's context and match one of its values (a key the request lacks fails the condition, as in
IAM). A statement with anything else (``NotAction``, another condition operator, ...) fails loudly
rather than being misjudged.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

#: The statement keys this evaluator understands.
KNOWN_KEYS: Final = frozenset({"Sid", "Effect", "Action", "Resource", "Condition"})
#: Condition operators this evaluator understands (on single-valued keys).
KNOWN_OPERATORS: Final = frozenset({"StringEquals", "StringLike"})


@dataclass(frozen=True, order=True)
class Request:
    """One (action, resource) pair IAM evaluates, with the request's condition keys (``context``:
    ``(key, value)`` pairs, e.g. ``("s3:prefix", "o/")`` for a listing)."""

    action: str
    resource: str
    context: tuple[tuple[str, str], ...] = ()


@lru_cache(maxsize=4096)
def _pattern(pattern: str, case: bool) -> re.Pattern[str]:
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(body, 0 if case else re.IGNORECASE | re.DOTALL)


def matches(pattern: str, value: str, *, case: bool) -> bool:
    """Whether IAM's ``pattern`` (``*``, ``?``) matches ``value``; ``case``: case-sensitive."""
    return _pattern(pattern, case).fullmatch(value) is not None


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def condition_holds(condition: dict[str, Any], request: Request) -> bool:
    """Whether every operator's every key of ``condition`` matches the request's value of it."""
    context = dict(request.context)
    for operator, keys in condition.items():
        assert operator in KNOWN_OPERATORS, f"a Condition with {operator} cannot be evaluated here"
        for key, values in keys.items():
            # Condition keys ignore case, their values do not.
            value = next((v for k, v in context.items() if k.lower() == key.lower()), None)
            if value is None:
                return False
            if operator == "StringEquals" and value not in as_list(values):
                return False
            if operator == "StringLike" and not any(matches(v, value, case=True) for v in as_list(values)):
                return False
    return True


def allowed(statements: list[dict[str, Any]], request: Request) -> bool:
    """IAM's answer for one request: an explicit Deny wins, else any Allow, else denied."""
    verdict = False
    for statement in statements:
        unknown = set(statement) - KNOWN_KEYS
        assert not unknown, f"a statement with {sorted(unknown)} cannot be evaluated here: {statement}"
        operators = set(statement.get("Condition", {})) - KNOWN_OPERATORS
        assert not operators, f"a Condition with {sorted(operators)} cannot be evaluated here: {statement}"
        if not any(matches(a, request.action, case=False) for a in as_list(statement["Action"])):
            continue
        if not any(matches(r, request.resource, case=True) for r in as_list(statement["Resource"])):
            continue
        if not condition_holds(statement.get("Condition", {}), request):
            continue
        if statement["Effect"] == "Deny":
            return False
        verdict = True
    return verdict


def _document(document: Any) -> list[dict[str, Any]]:
    parsed = json.loads(document) if isinstance(document, str) else document
    return as_list(parsed["Statement"])


def role_statements(iam: Any, role_name: str) -> list[dict[str, Any]]:
    """Every statement of a role's identity policies: its inline policies and attached managed ones
    (read through ``iam``, a boto3 IAM client)."""
    statements: list[dict[str, Any]] = []
    for name in iam.list_role_policies(RoleName=role_name)["PolicyNames"]:
        statements += _document(iam.get_role_policy(RoleName=role_name, PolicyName=name)["PolicyDocument"])
    for attached in iam.list_attached_role_policies(RoleName=role_name)["AttachedPolicies"]:
        policy = iam.get_policy(PolicyArn=attached["PolicyArn"])["Policy"]
        arn, version = attached["PolicyArn"], policy["DefaultVersionId"]
        document = iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"]
        statements += _document(document)
    for statement in statements:
        unknown = set(statement) - KNOWN_KEYS
        assert not unknown, f"{role_name}: a statement with {sorted(unknown)} cannot be evaluated here"
    return statements
