"""HTTP wire layer: the single route table.

Handlers, the local server, the OpenAPI document and the CDK app all read ``ROUTES``, so a path, its
method, the Lambda function that serves it and its body limit are written down once.

Every route whose body names exactly one queue has a scoped twin, ``POST /v1/queues/{queue}/<name>``:
the same endpoint, models and limit, the queue taken from the path (``querator.api.paths``), so that
an IAM policy on the path can grant one queue or a prefix of queues (docs/api.md, "Access per queue").
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from types import MappingProxyType
from typing import Final

from querator.api import paths, schemas
from querator.api.errors import unknown_path, wrong_method

#: A synchronous Lambda payload is at most 6 MB; leave room for the API Gateway event around the body.
LARGE_BODY_LIMIT: Final = 5_000_000
#: Every endpoint that does not carry payloads (contract: 256 KB).
SMALL_BODY_LIMIT: Final = 262_144


class StrEnum(str, Enum):
    """``enum.StrEnum`` (Python 3.11+) for 3.10: members are their values, as text too."""

    def __str__(self) -> str:
        return str(self.value)


class Function(StrEnum):
    """Names of the Lambda functions, in one place for the route table, the stack and the tests."""

    PRODUCE = "produce"
    LEASE = "lease"
    #: complete, retry, renew: short calls on leased items.
    ITEMS = "items"
    QUEUES = "queues"
    #: stats, clear and storage inspection: rare, and each bounded (docs/adr/0050-engine-v2.md).
    ADMIN = "admin"
    META = "meta"
    #: Scheduled, not an HTTP route: no route names it.
    REAPER = "reaper"
    #: The WebSocket API's routes (``$connect``, ``$disconnect``, ``$default``), not the REST API's.
    STREAM = "stream"
    #: Invoked by DynamoDB Streams of the items table and a schedule: pushes to stream subscribers.
    DISPATCHER = "dispatcher"


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """One endpoint. ``request_model`` is ``None`` for the GETs, which take no body;
    ``response_model`` is ``None`` where the body is not a schema (the OpenAPI document)."""

    name: str
    method: str
    path: str
    function: str
    request_model: type[schemas.WireRequest] | None
    response_model: type[schemas.WireResponse] | None
    body_limit: int = SMALL_BODY_LIMIT
    summary: str
    #: A scoped twin: ``path`` is ``/v1/queues/{queue}/<name>`` and the queue comes from it.
    scoped: bool = False
    #: The plain route a scoped twin serves the same way (same ``name``); ``None`` on a plain route.
    plain: Route | None = None

    @property
    def base(self) -> Route:
        """The plain route: itself, or the one this scoped twin twins."""
        return self.plain if self.plain is not None else self


def scoped_path(name: str) -> str:
    """The path template of route ``name``'s scoped twin: ``/v1/queues/{queue}/queue.produce``."""
    return paths.scoped_template(name)


def _twin(route: Route) -> Route:
    return replace(route, path=scoped_path(route.name), scoped=True, plain=route)


def _post(
    name: str,
    function: str,
    request_model: type[schemas.WireRequest],
    response_model: type[schemas.WireResponse],
    summary: str,
    *,
    body_limit: int = SMALL_BODY_LIMIT,
) -> Route:
    return Route(
        name=name,
        method="POST",
        path=f"/v1/{name}",
        function=function,
        request_model=request_model,
        response_model=response_model,
        body_limit=body_limit,
        summary=summary,
    )


QUEUES_CREATE: Final = _post(
    "queues.create", Function.QUEUES, schemas.CreateQueueRequest, schemas.OkResponse, "Create a queue."
)
QUEUES_UPDATE: Final = _post(
    "queues.update",
    Function.QUEUES,
    schemas.UpdateQueueRequest,
    schemas.OkResponse,
    "Change the fields present in the request.",
)
QUEUES_INFO: Final = _post(
    "queues.info", Function.QUEUES, schemas.QueueInfoRequest, schemas.QueueInfoResponse, "One queue."
)
QUEUES_LIST: Final = _post(
    "queues.list",
    Function.QUEUES,
    schemas.ListQueuesRequest,
    schemas.ListQueuesResponse,
    "Queues in name order from pivot (inclusive).",
)
QUEUES_DELETE: Final = _post(
    "queues.delete",
    Function.QUEUES,
    schemas.DeleteQueueRequest,
    schemas.OkResponse,
    "Delete a queue and its items.",
)
PRODUCE: Final = _post(
    "queue.produce",
    Function.PRODUCE,
    schemas.ProduceRequest,
    schemas.OkResponse,
    "Store 1-1000 items; replies once every item is durably stored.",
    body_limit=LARGE_BODY_LIMIT,
)
LEASE: Final = _post(
    "queue.lease",
    Function.LEASE,
    schemas.LeaseRequest,
    schemas.LeaseResponse,
    "Lease items of one partition, by priority then oldest first; waits up to request_timeout, then 454.",
)
COMPLETE: Final = _post(
    "queue.complete", Function.ITEMS, schemas.CompleteRequest, schemas.OkResponse, "Delete leased items."
)
RETRY: Final = _post(
    "queue.retry",
    Function.ITEMS,
    schemas.RetryRequest,
    schemas.OkResponse,
    "Put leased items back: now, at retry_at, or into the dead-letter queue.",
)
RENEW: Final = _post(
    "queue.renew",
    Function.ITEMS,
    schemas.RenewRequest,
    schemas.RenewResponse,
    "Set leases to end at now + lease_timeout: counted from now, so it may shorten a lease.",
)
REPRIORITIZE: Final = _post(
    "queue.reprioritize",
    # An operator's call on any item (admin callers); a consumer changes the priority of the items
    # it holds with queue.retry's priority.
    Function.ADMIN,
    schemas.ReprioritizeRequest,
    schemas.ReprioritizeResponse,
    "Change the priority of waiting and scheduled items (new ids) and of leased ones (when they go back).",
)
STATS: Final = _post(
    "queue.stats",
    Function.ADMIN,
    schemas.StatsRequest,
    schemas.StatsResponse,
    "Counts and ages per partition, from counters kept beside the items (one read per partition).",
)
CLEAR: Final = _post(
    "queue.clear",
    Function.ADMIN,
    schemas.ClearRequest,
    schemas.OkResponse,
    "Remove un-leased, scheduled or (destructive) leased items; 454 when it must be called again.",
)
REDRIVE: Final = _post(
    "queue.redrive",
    Function.ADMIN,
    schemas.RedriveRequest,
    schemas.RedriveResponse,
    "Move dead letters back to the queues they came from (or to 'to'); call until remaining is 0.",
)
STREAM_TICKET: Final = _post(
    "stream.ticket",
    # A consumer's call, on the lease function: a per-queue grant of queue.lease comes with it.
    Function.LEASE,
    schemas.StreamTicketRequest,
    schemas.StreamTicketResponse,
    "A short-lived ticket that lets a stream subscribe to this queue (per-queue access).",
)
ITEMS_LIST: Final = _post(
    "storage/items.list",
    Function.ADMIN,
    schemas.ListItemsRequest,
    schemas.ListItemsResponse,
    "Page through the items of one partition in lease order (priority, then FIFO).",
)
SCHEDULED_LIST: Final = _post(
    "storage/scheduled.list",
    Function.ADMIN,
    schemas.ListScheduledRequest,
    schemas.ListItemsResponse,
    "Page through the scheduled items of one partition.",
)
ITEMS_IMPORT: Final = _post(
    "storage/items.import",
    Function.ADMIN,
    schemas.ImportItemsRequest,
    schemas.ImportItemsResponse,
    "Write items verbatim under new ids, skipping known source_ids.",
    body_limit=LARGE_BODY_LIMIT,
)
ITEMS_DELETE: Final = _post(
    "storage/items.delete",
    Function.ADMIN,
    schemas.DeleteItemsRequest,
    schemas.OkResponse,
    "Delete items in any state; deleting twice succeeds.",
)
HEALTH: Final = Route(
    name="health",
    method="GET",
    path="/health",
    function=Function.META,
    request_model=None,
    response_model=schemas.HealthResponse,
    summary="Liveness.",
)
OPENAPI: Final = Route(
    name="openapi",
    method="GET",
    path="/openapi.json",
    function=Function.META,
    request_model=None,
    response_model=None,
    summary="This API as an OpenAPI 3.1 document.",
)
DOCS: Final = Route(
    name="docs",
    method="GET",
    path="/docs",
    function=Function.META,
    request_model=None,
    response_model=None,
    summary="Swagger UI over this API's OpenAPI document (HTML).",
)

PLAIN_ROUTES: Final[tuple[Route, ...]] = (
    QUEUES_CREATE,
    QUEUES_UPDATE,
    QUEUES_INFO,
    QUEUES_LIST,
    QUEUES_DELETE,
    PRODUCE,
    LEASE,
    COMPLETE,
    RETRY,
    RENEW,
    REPRIORITIZE,
    STATS,
    CLEAR,
    REDRIVE,
    STREAM_TICKET,
    ITEMS_LIST,
    SCHEDULED_LIST,
    ITEMS_IMPORT,
    ITEMS_DELETE,
    HEALTH,
    OPENAPI,
    DOCS,
)
#: Routes that span queues or none: no scoped twin (queues.list needs the whole-API grant).
_UNSCOPED: Final = frozenset({QUEUES_LIST.name, HEALTH.name, OPENAPI.name, DOCS.name})
#: The scoped twins, in the order of the plain routes.
SCOPED_ROUTES: Final[tuple[Route, ...]] = tuple(_twin(r) for r in PLAIN_ROUTES if r.name not in _UNSCOPED)
ROUTES: Final[tuple[Route, ...]] = PLAIN_ROUTES + SCOPED_ROUTES

_BY_PATH: Final = MappingProxyType({route.path: route for route in ROUTES})
_SCOPED_BY_NAME: Final = MappingProxyType({route.name: route for route in SCOPED_ROUTES})


def by_path(path: str) -> Route | None:
    """The route at ``path`` (exact match; a scoped twin by its template), or ``None``."""
    return _BY_PATH.get(path)


def scoped(name: str) -> Route | None:
    """The scoped twin of route ``name``, or ``None`` when it has none."""
    return _SCOPED_BY_NAME.get(name)


def match(path: str) -> tuple[Route, str | None] | None:
    """(route, queue segment as sent) of a request path: a plain route with ``None``, a scoped twin
    with the path's queue segment (not decoded); ``None`` when no route has this path."""
    route = _BY_PATH.get(path)
    if route is not None and not route.scoped:
        return route, None
    # A template asked literally (".../{queue}/...") is a twin whose queue "{queue}" is refused.
    split = paths.split_scoped(path)
    if split is None:
        return None
    segment, name = split
    twin = _SCOPED_BY_NAME.get(name)
    return None if twin is None else (twin, segment)


def for_function(function: str) -> tuple[Route, ...]:
    """The routes one Lambda function serves (what the CDK app wires to it)."""
    return tuple(route for route in ROUTES if route.function == function)


def resolve(method: str, path: str) -> Route:
    """The route for a request, applying the contract's rules for the misses.

    Raises
    ------
    WireError
        501 for an unknown path, 400 for a known path with another method.
    """
    matched = match(path)
    if matched is None:
        raise unknown_path(method, path)
    route = matched[0]
    if method.upper() != route.method:
        raise wrong_method(method, path, route.method)
    return route
