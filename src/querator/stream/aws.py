"""The stream's Lambda entry points on a deployed stack: WebSocket events and DynamoDB Streams.

``websocket_event`` serves the WebSocket API's routes (``$connect``, ``$disconnect``, ``$default``)
and ``dispatch_event`` the dispatcher: a batch of DynamoDB Streams records of the items table (the
keys of rows written) or the scheduled sweep. Both drive one ``Dispatcher`` over the connections
table, the HTTP API's own route code in process (``queue.lease`` / ``complete`` / ``retry`` /
``renew``: same claims, same validation) and API Gateway's management API for pushes.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Final

from botocore.exceptions import ClientError

from querator.api.gateway import FunctionApp, build_app
from querator.api.routes import by_path
from querator.bootstrap import get_client, get_service, make_client
from querator.config import ConfigurationError, load_settings
from querator.domain.ids import is_item_id, visible_at_of
from querator.storage.dynamodb import schema
from querator.storage.dynamodb.connections import DynamoDBConnections
from querator.stream.dispatch import Dispatcher

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

_GONE: Final = "GoneException"
#: A packed row's position, after ``schema.LOG_ROW_PREFIX`` (``querator.domain.positions``).
_POSITION_DIGITS: Final = 16
_HEX: Final = frozenset("0123456789abcdef")


def written_queues(records: Iterable[dict[str, Any]], now: datetime) -> set[str]:
    """The queues that got an item ready to lease, from DynamoDB Streams records of the items table.

    Only inserts of rows that hold items count: engine v2's item rows (the sort key is the item's
    id, of any priority) and engine v3's packed rows (a claim log's ``D<position>`` rows, under
    ``<queue>~<partition>~v<lane>~r``: a produce, and an expired lease or a retry appended at the
    tail). Head rows, lease records (in the head or spilled), idempotency and chunk records,
    updates (claims, renewals) and removals do not make anything leasable. An item scheduled for
    later is left to the sweep, which runs when it may be due: a v2 row visible later, and every
    row of a v3 schedule (``S…``; when due it moves to the tail, a packed row again).

    The stream sends keys only (``KEYS_ONLY``): a filler row (a hole a lease filled) has a packed
    row's key and wakes the queue for nothing, unless the record carries its image (``NewImage``),
    which says it is one. Fillers are rare (a writer taken for dead), and a wake costs one lease.
    """
    queues: set[str] = set()
    for record in records:
        if record.get("eventName") != "INSERT":
            continue
        change = record.get("dynamodb") or {}
        keys = change.get("Keys") or {}
        pk = str((keys.get(schema.PK) or {}).get("S", ""))
        sk = str((keys.get(schema.SK) or {}).get("S", ""))
        queue = _log_row_queue(pk, sk, change.get("NewImage"))
        if queue is not None:
            queues.add(queue)
            continue
        if not is_item_id(sk) or schema.SEPARATOR not in pk:
            continue
        if visible_at_of(sk) > now:
            continue
        queues.add(pk.rsplit(schema.SEPARATOR, 1)[0])
    return queues


def _log_row_queue(pk: str, sk: str, image: dict[str, Any] | None) -> str | None:
    """The queue of an engine v3 packed row's key (``None`` for any other key, or a filler's
    image): ``<queue>~<partition>~v<lane>~r`` (``schema.log_rows_key``) and ``D`` + 16 hex digits
    of position."""
    queue, _, rest = pk.partition(schema.SEPARATOR)
    partition, _, rest = rest.partition(schema.SEPARATOR)
    lane, _, mark = rest.partition(schema.SEPARATOR)
    # Queue names and lanes hold no separator (``validate_queue_name``, ``lane_of``).
    if not partition.isdigit() or not lane.startswith(schema.LOG_MARK) or mark != schema.LOG_ROWS_MARK:
        return None
    position = sk[len(schema.LOG_ROW_PREFIX) :]
    if not sk.startswith(schema.LOG_ROW_PREFIX) or len(position) != _POSITION_DIGITS:
        return None
    if not _HEX.issuperset(position) or (image is not None and schema.LOG_FILLER in image):
        return None
    return queue


class InProcessApi:
    """``api(path, body)`` for the dispatcher: the route's own function code, without HTTP."""

    def __init__(self, context: Any) -> None:
        self._context = context
        self._apps: dict[str, FunctionApp] = {}

    def __call__(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        route = by_path(path)
        if route is None:  # the dispatcher only calls routes that exist
            raise LookupError(path)
        app = self._apps.get(route.function)
        if app is None:
            app = self._apps[route.function] = build_app(
                route.function, service=get_service, settings=load_settings
            )
        event = {
            "httpMethod": "POST",
            "path": path,
            "headers": {"Content-Type": "application/json"},
            "body": json.dumps(body),
            "isBase64Encoded": False,
            "requestContext": {},
        }
        reply = app.resolve(event, self._context)
        text = reply.get("body") or ""
        return int(reply["statusCode"]), json.loads(text) if text else {}


def management_post(endpoint: str) -> Callable[[str, str], bool]:
    """``post(connection_id, frame)`` through API Gateway's management API at ``endpoint``."""
    client = _management_client(endpoint, load_settings().region)

    def post(connection_id: str, frame: str) -> bool:
        try:
            client.post_to_connection(ConnectionId=connection_id, Data=frame.encode("utf-8"))
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") == _GONE:
                return False
            raise
        return True

    return post


@functools.cache
def _management_client(endpoint: str, region: str | None) -> Any:
    # Once per process, at init in Lambda (``prepare``): only the stream functions ever need it.
    return make_client("apigatewaymanagementapi", endpoint_url=endpoint, region_name=region)


def prepare() -> None:
    """What the first event would make, made in Lambda's init phase (``lambda_entry(prepare=...)``):
    the stores' clients and the management API's client."""
    get_service()
    settings = load_settings()
    if settings.stream_endpoint:
        _management_client(settings.stream_endpoint, settings.region)


def dispatcher(context: Any) -> Dispatcher:
    """The process's dispatcher over the stack's tables and WebSocket endpoint (from the environment)."""
    settings = load_settings()
    if not settings.connections_table or not settings.stream_endpoint:
        raise ConfigurationError(
            "the stream functions need QUERATOR_CONNECTIONS_TABLE and QUERATOR_STREAM_ENDPOINT"
        )
    connections = DynamoDBConnections(get_client(), settings.connections_table)
    return Dispatcher(
        connections,
        InProcessApi(context),
        management_post(settings.stream_endpoint),
        check_ticket=get_service().check_stream_ticket,
        tickets_required=settings.stream_tickets_required,
    )


def websocket_event(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The WebSocket API's routes. ``$connect`` was authorized by IAM before it got here."""
    request = event.get("requestContext") or {}
    route = request.get("routeKey")
    connection_id = str(request.get("connectionId") or "")
    if route == "$connect":
        return {"statusCode": 200}
    if route == "$disconnect":
        dispatcher(context).disconnect(connection_id)
        return {"statusCode": 200}
    body = event.get("body") or ""
    dispatcher(context).message(connection_id, body)
    return {"statusCode": 200}


def dispatch_event(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """DynamoDB Streams records of the items table, or the scheduled sweep (an EventBridge event)."""
    now = datetime.now(timezone.utc)
    if "Records" in event:
        queues = written_queues(event["Records"], now)
        pushed = dispatcher(context).queues_written(queues) if queues else 0
        return {"queues": len(queues), "pushed": pushed}
    return {"swept": True, "pushed": dispatcher(context).sweep()}
