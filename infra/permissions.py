"""Least-privilege DynamoDB and S3 actions of every Lambda function, written down once.

The functions construct grants exactly these actions and the infra tests compare every role's policy
with this table, so a grant cannot be widened by accident. The table is measured, not guessed:
``tests/infra/test_deployed_stack.py`` deploys every stage onto moto's CloudFormation, runs each
function's deployed asset through the whole lifecycle and records every AWS call it makes; a call its
policy does not allow fails that test, and so does an action here that no call needed. When a code
path starts issuing a new call, that test names it: add the action here.

IAM has no action for a transaction: a ``TransactWriteItems`` is authorized by the actions of its
parts (``PutItem``, ``UpdateItem``, ``DeleteItem``, ``ConditionCheckItem``) on each part's table.
Today every transaction is a move (``Delete`` + ``Put``), so no function holds ``ConditionCheckItem``.
"""

from __future__ import annotations

from enum import Enum
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

from querator.api import paths
from querator.api.routes import ROUTES, Function, Route
from querator.storage.dynamodb import objects

if TYPE_CHECKING:
    from collections.abc import Sequence


class StrEnum(str, Enum):
    """``enum.StrEnum`` (Python 3.11+) for 3.10: members are their values, as text too."""

    def __str__(self) -> str:
        return str(self.value)


class TableRole(StrEnum):
    """The two tables of ``querator.storage.dynamodb.schema``."""

    #: Items, idempotency records of produce.
    ITEMS = "items"
    #: Queue definitions and the reaper's bookmark.
    CATALOG = "catalog"
    #: The stream's WebSocket connections (``querator.storage.dynamodb.connections``).
    CONNECTIONS = "connections"


#: The scheduled function (it serves no route).
REAPER: Final = Function.REAPER
#: The stream's functions: the WebSocket API's routes, and the pushes on writes and on a schedule.
STREAM: Final = Function.STREAM
DISPATCHER: Final = Function.DISPATCHER

#: Every function the stack deploys: the route-serving ones and the reaper.
FUNCTION_NAMES: Final[tuple[str, ...]] = tuple(Function)

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
        # Batch writes (engine v2), the sequencer's UpdateItem and packed rows' PutItem (v3);
        # idempotent produce: a conditional put of the record (a retry gets the winner
        # back from the failed condition, so no read) and the update that finishes it.
        Function.PRODUCE: _grants(
            items=("BatchWriteItem", "PutItem", "UpdateItem"),
            catalog=("GetItem",),
        ),
        # One Query for the partition's head row and the lease records due, one for candidates;
        # the lease record (put), claims and the head row (updates); expired leases are read back
        # in batches and moved (a Delete + Put transaction) or deleted, and their records dropped.
        # stream.ticket: the signing key is read from the catalog, and made there by the first
        # ticket (a conditional put: racing first tickets agree on one key).
        # Engine v3 (claim logs): a log's head is one strong GetItem, a claim one UpdateItem.
        Function.LEASE: _grants(
            items=("Query", "GetItem", "BatchGetItem", "UpdateItem", "PutItem", "DeleteItem"),
            catalog=("GetItem", "PutItem"),
        ),
        # complete (conditional delete, reading the head row when a scheduled item came due), retry
        # (batched read, then move or delete), renew (a lease record, then updates); the head row's
        # counters after each.
        # Engine v3: a settle reads the log's head (GetItem) and writes its record.
        Function.ITEMS: _grants(
            items=("Query", "GetItem", "BatchGetItem", "UpdateItem", "PutItem", "DeleteItem"),
            catalog=("GetItem",),
        ),
        Function.QUEUES: _grants(
            catalog=("GetItem", "PutItem", "UpdateItem", "DeleteItem", "Query"),
            # queues.delete purges the queue's rows: a keys-only Query and batched deletes
            items=("Query", "BatchWriteItem"),
        ),
        # stats (a batched read of the head rows), listings; clear (conditional deletes, putting
        # expired leases back first), storage import (batched writes) and delete; redrive (which
        # queues dead-letter into this one: a Query of the catalog; moves: Delete + Put
        # transactions); reprioritize (batched read, then moves or updates); the head row's
        # counters after each.
        # Engine v3: stats and clear read each log's head (GetItem).
        Function.ADMIN: _grants(
            items=(
                "Query",
                "GetItem",
                "BatchGetItem",
                "UpdateItem",
                "PutItem",
                "DeleteItem",
                "BatchWriteItem",
            ),
            catalog=("GetItem", "Query"),
        ),
        # health, openapi
        Function.META: _grants(catalog=("Query",)),
        # Reads every queue and its bookmark; per partition the head row and due lease records, the
        # head of the waiting items, the sweep behind the cursor: expired leases and stragglers are
        # read back in batches and moved or deleted; marks, counters and recounts update the head
        # row; interrupted queue deletes are purged and their records removed.
        # Engine v3: each log's head (GetItem) says what is due or expired.
        REAPER: _grants(
            catalog=("Query", "GetItem", "PutItem", "DeleteItem"),
            items=(
                "Query",
                "GetItem",
                "BatchGetItem",
                "UpdateItem",
                "PutItem",
                "DeleteItem",
                "BatchWriteItem",
            ),
        ),
        # A subscription's row (put, read, credit and held items updated, deleted on disconnect);
        # pushes lease as ``queue.lease`` does and messages settle as ``queue.complete`` / ``retry``
        # / ``renew`` do, through the same code.
        STREAM: _grants(
            connections=("PutItem", "GetItem", "UpdateItem", "DeleteItem"),
            items=("Query", "GetItem", "BatchGetItem", "UpdateItem", "PutItem", "DeleteItem"),
            catalog=("GetItem",),
        ),
        # A queue's subscribers (a Query of the by_queue index), every subscription (the timed
        # sweep's Scan); credit and held items; a gone connection's row; leases as ``queue.lease``.
        DISPATCHER: _grants(
            connections=("Query", "Scan", "GetItem", "UpdateItem", "DeleteItem"),
            items=("Query", "GetItem", "BatchGetItem", "UpdateItem", "PutItem", "DeleteItem"),
            catalog=("GetItem",),
        ),
    }
)
#: S3 actions on the payload bucket that are about objects: granted on ``<bucket ARN>/o/*`` only
#: (``PAYLOAD_OBJECTS``), the keys ``querator.storage.dynamodb.objects`` makes.
S3_OBJECT_ACTIONS: Final = frozenset({"s3:GetObject", "s3:PutObject", "s3:DeleteObject"})
#: S3 actions on the payload bucket itself: granted on the bucket's ARN, for listings of the objects'
#: prefix only (an ``s3:prefix`` condition, ``PAYLOAD_LISTING``).
S3_BUCKET_ACTIONS: Final = frozenset({"s3:ListBucket"})
#: Every payload object's key starts with this (``querator.storage.dynamodb.objects.PREFIX``).
PAYLOAD_PREFIX: Final = objects.PREFIX
#: The object resource of the grants, after the bucket's ARN.
PAYLOAD_OBJECTS: Final = f"/{PAYLOAD_PREFIX}*"
#: The condition on a listing: of the objects' prefix (or a longer one), nothing else of the bucket.
PAYLOAD_LISTING: Final = MappingProxyType(
    {"StringLike": MappingProxyType({"s3:prefix": f"{PAYLOAD_PREFIX}*"})}
)


def _s3(*actions: str) -> frozenset[str]:
    return frozenset(f"s3:{action}" for action in actions)


#: function name → S3 actions on the payload bucket (docs/adr/0102-large-payloads.md), measured like
#: ``DYNAMODB_ACTIONS``. In IAM a ``CopyObject`` is ``GetObject`` of its source and ``PutObject`` of
#: its target, a ``DeleteObjects`` ``DeleteObject`` of each key, a ``ListObjectsV2`` ``ListBucket``.
#: A function listed here gets ``QUERATOR_PAYLOAD_BUCKET``; one that is not (meta, queues) gets
#: neither the bucket's name nor a grant. A release of the objects of items that ended, where the
#: function has no ``DeleteObject``, fails quietly and leaves them to the reaper's sweep.
S3_ACTIONS: Final[MappingProxyType[str, frozenset[str]]] = MappingProxyType(
    {
        # A payload over a row's is uploaded before the rows that name it. (The delete of an upload
        # left unused, a failed or retried write, is refused and logged: the sweep deletes it.)
        Function.PRODUCE: _s3("PutObject"),
        # A lease reads its items' objects; an item out of attempts is dead-lettered by the lease
        # (its object copied to a key kept as long as the dead letter, the old one deleted), one
        # with no dead-letter queue dropped (its object deleted).
        Function.LEASE: _s3("GetObject", "PutObject", "DeleteObject"),
        # complete (the object deleted), retry into the dead-letter queue (copied, the old deleted).
        Function.ITEMS: _s3("GetObject", "PutObject", "DeleteObject"),
        # storage items.list reads the objects; items.import uploads; items.delete and clear
        # delete; a redrive copies an object when the item's new expiry outlasts its key's time.
        Function.ADMIN: _s3("GetObject", "PutObject", "DeleteObject"),
        # Expired items read whole, dead-lettered (copies) or dropped (deletes); purges of deleted
        # queues; the sweep of objects past their time: a listing of the objects' prefix, deletes.
        REAPER: _s3("GetObject", "PutObject", "DeleteObject", "ListBucket"),
        # Pushes lease as queue.lease does, messages settle as queue.complete / retry do.
        STREAM: _s3("GetObject", "PutObject", "DeleteObject"),
        DISPATCHER: _s3("GetObject", "PutObject", "DeleteObject"),
    }
)
#: Functions that post to WebSocket connections (``execute-api:ManageConnections`` on the stream API).
MANAGES_CONNECTIONS: Final = frozenset({STREAM, DISPATCHER})


class Caller(StrEnum):
    """Who calls the API, each with a managed policy the stack outputs (docs/deploy.md)."""

    #: Writes items: ``queue.produce``.
    PRODUCER = "producer"
    #: Works items off: ``queue.lease`` and ``complete`` / ``retry`` / ``renew``.
    CONSUMER = "consumer"
    #: Runs the queues: ``queues.*``, ``queue.stats`` / ``clear``, ``storage/*``.
    ADMIN = "admin"


#: Caller → the functions whose routes it may invoke. ``meta`` (health, OpenAPI, docs) is everyone's:
#: a health check signs like any other client. Paths come from ``querator.api.routes``, so a new
#: route joins its function's callers without a change here.
CALLER_FUNCTIONS: Final[MappingProxyType[Caller, frozenset[str]]] = MappingProxyType(
    {
        Caller.PRODUCER: frozenset({Function.PRODUCE, Function.META}),
        Caller.CONSUMER: frozenset({Function.LEASE, Function.ITEMS, Function.META}),
        Caller.ADMIN: frozenset({Function.QUEUES, Function.ADMIN, Function.META}),
    }
)
#: Read-only routes of another function that every caller's own client needs: the queue's settings
#: (the Spark HTTP producer reads the partition count, the consumer worker the lease timeout). By
#: name: the plain route and its scoped twin.
SHARED_ROUTES: Final = frozenset({"queues.info"})
#: The IAM action of calling an API route (and of opening the stream).
INVOKE: Final = "execute-api:Invoke"
#: The scoped routes' queue segment as the route table writes it.
QUEUE_SEGMENT: Final = f"{{{paths.QUEUE_PARAMETER}}}"


def caller_routes(caller: Caller) -> list[Route]:
    """The routes ``caller`` may invoke, plain and scoped, in route-table order."""
    return [r for r in ROUTES if r.function in CALLER_FUNCTIONS[caller] or r.name in SHARED_ROUTES]


class QueueGrantError(ValueError):
    """A grant's ``queues`` is not a list of queue names and prefixes ending in ``*``."""


def check_queue_patterns(queues: Sequence[str]) -> tuple[str, ...]:
    """``queues`` as given, when each is a queue name a scoped route serves (``querator.api.paths``:
    ASCII letters, digits, ``.``, ``_``, ``-``) or such a name's start followed by one ``*`` (a
    prefix); IAM's other wildcards, a ``*`` elsewhere or alone, and an empty list are refused."""
    if isinstance(queues, str) or not queues:
        raise QueueGrantError(
            f"queues={queues!r}: a list of queue names and prefixes ending in '*' "
            "(leave it out for every queue)"
        )
    for pattern in queues:
        name = pattern.removesuffix("*")
        if not name or not paths.is_addressable(name):
            raise QueueGrantError(
                f"queues: {pattern!r} is neither a queue name a scoped route serves (ASCII letters, "
                "digits, '.', '_', '-') nor one's start followed by a single '*'"
            )
    return tuple(queues)


def invoke_paths(caller: Caller, queues: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """``(method, path)`` of every route a grant of ``caller`` on ``queues`` invokes, in route-table
    order: the IAM resources are these under the API's stage.

    ``None``: every queue, the whole-API grant. The caller's plain routes (the body names the queue,
    so IAM cannot tell queues apart) and their scoped twins for any queue (``*`` for the segment).

    A list of names and prefixes: the scoped twins only, once per name or prefix (the segment is the
    name, or the prefix and its ``*``), and the routes of no queue every client calls (``/health``,
    the OpenAPI document and its page). Never a plain route, and so never ``queues.list``, which
    spans queues and needs the whole-API grant.
    """
    routes = caller_routes(caller)
    if queues is None:
        return [(r.method, iam_path(r)) for r in routes]
    patterns = check_queue_patterns(queues)
    unscoped = [(r.method, r.path) for r in routes if r.function == Function.META]
    return unscoped + [(r.method, iam_path(r, pattern)) for pattern in patterns for r in routes if r.scoped]


def iam_path(route: Route, queues: str = "*") -> str:
    """The route's path in an ``execute-api`` resource: a scoped twin's queue segment as ``queues``
    (a name, a prefix and its ``*``, or ``*`` for every queue); a plain route's path as it is."""
    return route.path.replace(QUEUE_SEGMENT, queues)
