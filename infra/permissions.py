"""Least-privilege DynamoDB actions of every Lambda function, written down once.

The functions construct grants exactly these actions and the infra tests compare every role's policy
with this table, so a grant cannot be widened by accident. Source: the DynamoDB calls each function's
code paths issue (``querator.storage.dynamodb.store`` and ``.catalog``, as listed by the lead when the
handlers were split); a ``TransactWriteItems`` is authorized by the actions of its parts (``PutItem``,
``UpdateItem``, ``DeleteItem``, ``ConditionCheckItem``), so it has no action of its own here.
When a code path starts issuing a new call, add the action here and the tests follow.
"""

from __future__ import annotations

from enum import StrEnum
from types import MappingProxyType
from typing import Final

from querator.api.routes import Function


class TableRole(StrEnum):
    """The two tables of ``querator.storage.dynamodb.schema``."""

    #: Items, idempotency records of produce.
    ITEMS = "items"
    #: Queue definitions and the reaper's bookmark.
    CATALOG = "catalog"


#: The scheduled function; not an HTTP route, so not in ``routes.Function``.
REAPER: Final = "reaper"

#: Every function the stack deploys: the route-serving ones and the reaper.
FUNCTION_NAMES: Final[tuple[str, ...]] = (
    Function.PRODUCE,
    Function.LEASE,
    Function.ITEMS,
    Function.QUEUES,
    Function.ADMIN,
    Function.META,
    REAPER,
)

_Grants = MappingProxyType[TableRole, frozenset[str]]


def _grants(**per_table: tuple[str, ...]) -> _Grants:
    return MappingProxyType(
        {
            TableRole(table): frozenset(f"dynamodb:{action}" for action in actions)
            for table, actions in per_table.items()
        }
    )


#: function name → table → IAM actions (``dynamodb:*`` spelled out, never wildcards).
DYNAMODB_ACTIONS: Final[MappingProxyType[str, _Grants]] = MappingProxyType(
    {
        Function.PRODUCE: _grants(
            items=("BatchWriteItem", "PutItem", "GetItem", "UpdateItem"),
            catalog=("GetItem",),
        ),
        Function.LEASE: _grants(
            items=("Query", "GetItem", "UpdateItem", "PutItem", "DeleteItem", "ConditionCheckItem"),
            catalog=("GetItem",),
        ),
        # complete, retry, renew
        Function.ITEMS: _grants(
            items=("GetItem", "UpdateItem", "PutItem", "DeleteItem", "ConditionCheckItem"),
            catalog=("GetItem",),
        ),
        Function.QUEUES: _grants(
            catalog=("GetItem", "PutItem", "UpdateItem", "DeleteItem", "Query"),
            # queues.delete removes the queue's items
            items=("Query", "BatchWriteItem", "DeleteItem"),
        ),
        # stats, clear, storage list / import / delete
        Function.ADMIN: _grants(
            items=(
                "Query",
                "GetItem",
                "PutItem",
                "DeleteItem",
                "BatchWriteItem",
                "UpdateItem",
                "ConditionCheckItem",
            ),
            catalog=("GetItem",),
        ),
        # health, openapi
        Function.META: _grants(catalog=("Query",)),
        REAPER: _grants(
            catalog=("Query", "GetItem", "PutItem", "UpdateItem", "DeleteItem"),
            items=(
                "Query",
                "GetItem",
                "PutItem",
                "DeleteItem",
                "UpdateItem",
                "BatchWriteItem",
                "ConditionCheckItem",
            ),
        ),
    }
)
