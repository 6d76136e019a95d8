"""HTTP wire layer: what each route does, as one short function over ``QueueService``.

Each endpoint turns a parsed request into domain arguments, calls one service method and shapes the
reply. They know nothing of Lambda or of the HTTP server in front of them: ``Call`` carries the few
things of the request that are not in its body. ``ENDPOINTS`` is keyed by route name, and a test
checks that it covers the route table exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, Final

from querator.api import routes, schemas
from querator.api.errors import failed_ids_error
from querator.config import Metric
from querator.domain.errors import InvalidRequestError, NothingToLeaseError
from querator.domain.model import BatchOutcome
from querator.observability import count, logger
from querator.service import QueueService

#: Longest accepted ``Idempotency-Key`` header; the key is hashed before it is stored.
MAX_IDEMPOTENCY_KEY = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """What an endpoint knows of its request besides the body."""

    #: The request's time, for replies that show ages or lease state.
    now: datetime
    #: The longest this call may wait (lease long-poll): the platform cap, bounded by the time the
    #: function has left.
    wait_limit: timedelta
    idempotency_key: str | None = None
    #: The queue of a scoped route's path (``/v1/queues/{queue}/...``): the caller may be granted
    #: that queue alone, so what reaches other queues is narrowed (docs/api.md, "Access per queue").
    scoped_queue: str | None = None
    #: Headers the endpoint adds to a successful reply.
    reply_headers: dict[str, str] = field(default_factory=dict)
    #: What undoes the endpoint's effect when its reply cannot be built: a lease gives its items back
    #: (a lease holds nothing it did not return). Set by the endpoint, run by ``undone_on_failure``.
    undo: list[Callable[[], object]] = field(default_factory=list)


@contextmanager
def undone_on_failure(call: Call, path: str) -> Iterator[None]:
    """Around an endpoint and the building of its reply, in every transport (the functions'
    gateway, ``Embedded``): when the endpoint acted but its reply cannot be built, or the call is
    interrupted, run ``call.undo`` (nobody will hear of the effect) and let the error go on."""
    try:
        yield
    except BaseException:
        for undo in call.undo:
            try:
                undo()
            except Exception:  # the reply's own failure is the one reported; this one is only logged
                logger.exception("could not undo a call whose reply failed", extra={"path": path})
        raise


#: On a produce with an ``Idempotency-Key``: ``true`` when an earlier request with that key stored the
#: items and this one stored nothing (bulk producers count those as duplicates), else ``false``.
REPLAYED_HEADER: Final = "Idempotency-Replayed"

Endpoint = Callable[[QueueService, Any, Call], schemas.WireResponse]


def _ok() -> schemas.OkResponse:
    # Made per reply, not once at import: an instance builds its (deferred) model, and a function
    # builds only the models of the routes it serves, at Lambda's init (gateway.FunctionApp.prepare).
    return schemas.OkResponse()


def _applied(outcome: BatchOutcome) -> schemas.OkResponse:
    """200 when every id was applied; otherwise 400 naming the failed ids (the others stay applied)."""
    if outcome.failed:
        raise failed_ids_error(outcome.failed, applied=len(outcome.applied))
    return _ok()


# -- queues ---------------------------------------------------------------------------------------


def create_queue(
    service: QueueService, request: schemas.CreateQueueRequest, call: Call
) -> schemas.WireResponse:
    _check_dead_queue(request.dead_queue, call)
    service.create_queue(request.to_domain(call.now))
    return _ok()


def update_queue(
    service: QueueService, request: schemas.UpdateQueueRequest, call: Call
) -> schemas.WireResponse:
    _check_dead_queue(request.dead_queue, call)
    service.update_queue(request.to_domain())
    return _ok()


def _check_dead_queue(dead_queue: str | None, call: Call) -> None:
    """On a scoped path, a dead-letter queue in the queue's own namespace only: its name starts with
    the queue's (``orders`` → ``orders-dead``). Dead-lettering writes into that queue, and a caller
    granted ``orders`` alone must not make ``orders``' items land in a queue it was not granted;
    a prefix grant (``orders*``) covers both. The plain route (a whole-API grant) names any."""
    queue = call.scoped_queue
    if queue is not None and dead_queue and not dead_queue.startswith(queue):
        raise InvalidRequestError(
            f"dead_queue '{dead_queue}' is not in the namespace of '{queue}': on the scoped path a"
            f" queue's dead-letter queue must start with its name (e.g. '{queue}-dead'); set it on the"
            " plain route with a whole-API grant",
            field="dead_queue",
        )


def queue_info(service: QueueService, request: schemas.QueueInfoRequest, call: Call) -> schemas.WireResponse:
    return schemas.QueueInfoResponse.from_domain(service.get_queue(request.queue_name))


def list_queues(
    service: QueueService, request: schemas.ListQueuesRequest, call: Call
) -> schemas.WireResponse:
    return schemas.ListQueuesResponse.from_domain(
        service.list_queues(pivot=request.pivot, limit=request.limit)
    )


def delete_queue(
    service: QueueService, request: schemas.DeleteQueueRequest, call: Call
) -> schemas.WireResponse:
    service.delete_queue(request.queue_name)
    return _ok()


# -- items ----------------------------------------------------------------------------------------


def produce(service: QueueService, request: schemas.ProduceRequest, call: Call) -> schemas.WireResponse:
    receipt = service.produce(request.queue_name, request.to_domain(), idempotency_key=call.idempotency_key)
    count(Metric.ITEMS_PRODUCED, 0 if receipt.replayed else len(receipt.ids))
    if call.idempotency_key is not None:
        call.reply_headers[REPLAYED_HEADER] = "true" if receipt.replayed else "false"
    return _ok()


def lease(service: QueueService, request: schemas.LeaseRequest, call: Call) -> schemas.WireResponse:
    # Without request_timeout a lease answers at once (like SQS's short poll); see docs/adr/0005.
    wait = min(request.request_timeout or timedelta(0), call.wait_limit)
    try:
        leased = service.lease(
            request.queue_name, batch_size=request.batch_size, client_id=request.client_id, timeout=wait
        )
    except NothingToLeaseError:
        count(Metric.LEASE_EMPTY, 1)
        raise
    ids = [item.id for item in leased.items]
    call.undo.append(lambda: service.give_back(leased.queue_name, leased.partition, ids))
    count(Metric.ITEMS_LEASED, len(leased.items))
    return schemas.LeaseResponse.from_domain(leased)


def complete(service: QueueService, request: schemas.CompleteRequest, call: Call) -> schemas.WireResponse:
    outcome = service.complete(request.queue_name, request.partition, request.ids)
    count(Metric.ITEMS_COMPLETED, len(outcome.applied))
    return _applied(outcome)


def retry(service: QueueService, request: schemas.RetryRequest, call: Call) -> schemas.WireResponse:
    return _applied(service.retry(request.queue_name, request.partition, request.to_domain()))


def renew(service: QueueService, request: schemas.RenewRequest, call: Call) -> schemas.WireResponse:
    outcome = service.renew(
        request.queue_name, request.partition, request.ids, lease_timeout=request.lease_timeout
    )
    if outcome.failed:
        raise failed_ids_error(outcome.failed, applied=len(outcome.items))
    return schemas.RenewResponse.from_domain(outcome)


def reprioritize(
    service: QueueService, request: schemas.ReprioritizeRequest, call: Call
) -> schemas.WireResponse:
    outcome = service.reprioritize(request.queue_name, request.partition, request.ids, request.priority)
    if outcome.failed:
        raise failed_ids_error(outcome.failed, applied=len(outcome.ids))
    return schemas.ReprioritizeResponse.from_domain(request.queue_name, request.partition, outcome)


# -- inspection and maintenance ---------------------------------------------------------------------


def stats(service: QueueService, request: schemas.StatsRequest, call: Call) -> schemas.WireResponse:
    return schemas.StatsResponse.from_domain(request.queue_name, service.stats(request.queue_name))


def clear(service: QueueService, request: schemas.ClearRequest, call: Call) -> schemas.WireResponse:
    service.clear(request.queue_name, request.to_domain())
    return _ok()


def redrive(service: QueueService, request: schemas.RedriveRequest, call: Call) -> schemas.WireResponse:
    outcome = service.redrive(
        request.queue_name, to=request.to, limit=request.limit, feeders_only=call.scoped_queue is not None
    )
    count(Metric.ITEMS_REDRIVEN, outcome.moved)
    return schemas.RedriveResponse.from_domain(outcome)


def stream_ticket(
    service: QueueService, request: schemas.StreamTicketRequest, call: Call
) -> schemas.WireResponse:
    issued = service.stream_ticket(request.queue_name)
    return schemas.StreamTicketResponse(ticket=issued.ticket, expires_at=issued.expires_at)


def list_items(service: QueueService, request: schemas.ListItemsRequest, call: Call) -> schemas.WireResponse:
    found = service.list_items(
        request.queue_name, request.partition, pivot=request.pivot, limit=request.limit
    )
    return schemas.ListItemsResponse.from_domain(found, call.now)


def list_scheduled(
    service: QueueService, request: schemas.ListScheduledRequest, call: Call
) -> schemas.WireResponse:
    found = service.list_scheduled(
        request.queue_name, request.partition, pivot=request.pivot, limit=request.limit
    )
    return schemas.ListItemsResponse.from_domain(found, call.now)


def import_items(
    service: QueueService, request: schemas.ImportItemsRequest, call: Call
) -> schemas.WireResponse:
    ids = service.import_items(request.queue_name, request.partition, request.to_domain())
    return schemas.ImportItemsResponse.from_domain(ids)


def delete_items(
    service: QueueService, request: schemas.DeleteItemsRequest, call: Call
) -> schemas.WireResponse:
    service.delete_items(request.queue_name, request.partition, request.ids)
    return _ok()


def health(service: QueueService, request: None, call: Call) -> schemas.WireResponse:
    service.check_health()
    return schemas.HealthResponse()


ENDPOINTS: Final[Mapping[str, Endpoint]] = MappingProxyType(
    {
        routes.QUEUES_CREATE.name: create_queue,
        routes.QUEUES_UPDATE.name: update_queue,
        routes.QUEUES_INFO.name: queue_info,
        routes.QUEUES_LIST.name: list_queues,
        routes.QUEUES_DELETE.name: delete_queue,
        routes.PRODUCE.name: produce,
        routes.LEASE.name: lease,
        routes.COMPLETE.name: complete,
        routes.RETRY.name: retry,
        routes.RENEW.name: renew,
        routes.REPRIORITIZE.name: reprioritize,
        routes.STATS.name: stats,
        routes.CLEAR.name: clear,
        routes.REDRIVE.name: redrive,
        routes.STREAM_TICKET.name: stream_ticket,
        routes.ITEMS_LIST.name: list_items,
        routes.SCHEDULED_LIST.name: list_scheduled,
        routes.ITEMS_IMPORT.name: import_items,
        routes.ITEMS_DELETE.name: delete_items,
        routes.HEALTH.name: health,
    }
)


def idempotency_key(headers: Mapping[str, str] | None) -> str | None:
    """The ``Idempotency-Key`` header (any case), or ``None``; a blank or oversized key is a 400."""
    for name, value in (headers or {}).items():
        if name.lower() == "idempotency-key":
            key = value.strip()
            if not key or len(key) > MAX_IDEMPOTENCY_KEY:
                raise InvalidRequestError(
                    f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters", field="Idempotency-Key"
                )
            return key
    return None
