"""Spark producer: the write path, as a port with two adapters, built inside each executor.

A ``Target`` is a small picklable description of where items go; Spark ships it to the executors
and each Python worker turns it into a ``Producer`` there (``connect``), because boto3 clients and
HTTP sessions do not pickle. Connections are cached per worker process, so the tasks a worker runs
one after another share them. Neither adapter builds DynamoDB items or URLs itself: the direct path
goes through ``QueueService.produce`` (the product's own rules and idempotency), the HTTP path
through ``querator.client``.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from querator.client import Client, QueratorClientError
from querator.client import NewItem as ClientItem
from querator.client import errors as client_errors
from querator.clock import SystemClock
from querator.config import DEFAULT_ENGINE
from querator.domain.errors import (
    InvalidRequestError,
    PayloadTooLargeError,
    QueratorError,
    QueueNotFoundError,
    RequestInProgressError,
    StoreThrottledError,
    StoreUnavailableError,
)
from querator.domain.model import MAX_PAYLOAD_BYTES, ROW_PAYLOAD_BYTES
from querator.service import QueueService
from querator.storage.dynamodb.bulk import IN_FLIGHT, ChunkWriter, bulk_client, bulk_payloads
from querator.storage.dynamodb.catalog import DynamoDBQueueCatalog
from querator.storage.dynamodb.log import DynamoDBClaimLog
from querator.storage.dynamodb.store import DynamoDBItemStore

if TYPE_CHECKING:
    from collections.abc import Sequence

    from querator.config import Settings
    from querator.domain.model import NewItem
    from querator.storage.dynamodb.objects import PayloadObjects


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkReceipt:
    """What one produce call did."""

    #: Items the call carried; all stored, now or (``replayed``) by an earlier attempt.
    items: int
    #: True when an earlier call with the same idempotency key stored them and this one stored
    #: nothing; ``None`` when the write path cannot tell (the HTTP reply is ``{"code": 200}`` either way).
    replayed: bool | None
    #: The queue partition they landed in, when the write path says.
    partition: int | None = None


class Producer(Protocol):
    """Stores one chunk of items in a queue with one idempotent produce call.

    ``route`` is the chunk's place in the job's plan; the direct path sends the chunk to queue
    partition ``route mod partitions`` (the HTTP path leaves the choice to the service).

    Errors are the domain's (``querator.domain.errors``), so retry decisions are the same for
    both paths: ``RetryLaterError`` / ``RequestInProgressError`` / ``StoreUnavailableError`` are
    worth retrying, anything else is not.
    """

    def produce(
        self, queue: str, items: Sequence[NewItem], *, idempotency_key: str, route: int = 0
    ) -> ChunkReceipt: ...

    def check_queue(self, queue: str) -> int:
        """The queue's partition count; raises ``QueueNotFoundError`` when it does not exist."""
        ...


class Target(Protocol):
    """A picklable description of a write path; ``connect`` runs in the executor."""

    def connect(self) -> Producer: ...


#: A target may say the largest payload its path stores (``payload_limit``, as ``DirectTarget`` and
#: ``HttpTarget`` do): a row with a larger one is an invalid row. Without it, 1 MiB (the API's).
def payload_limit_of(target: Target) -> int:
    limit = getattr(target, "payload_limit", MAX_PAYLOAD_BYTES)
    return limit if isinstance(limit, int) else MAX_PAYLOAD_BYTES


# -- direct: QueueService over the DynamoDB tables ------------------------------------------------

#: The Spark local property naming one run of a produce job (set by the driver, read in the tasks):
#: a chunk record's owner is the run and the task, so a task's retry resumes its chunk at once.
RUN_PROPERTY = "querator.produce.run"


@dataclass(frozen=True, slots=True, kw_only=True)
class DirectTarget:
    """Write straight into the product's tables through ``QueueService`` (bulk loads, fastest).

    Needs DynamoDB access to both tables from the executors (docs/spark.md lists the IAM actions).

    Parameters
    ----------
    settings
        The table names and region, as the functions read them (``querator.config.Settings``).
    endpoint_url
        A DynamoDB endpoint other than AWS's (a local store); ``None`` leaves it to boto3, which
        honours ``AWS_ENDPOINT_URL_DYNAMODB`` in the executor's environment.
    engine
        The storage engine new chunks are written for (``querator.config.ENGINES``): 2, a row per
        item; 3, the partitions' claim logs, packed (a chunk once begun keeps its engine).
    """

    settings: Settings
    endpoint_url: str | None = None
    engine: int = DEFAULT_ENGINE

    def connect(self) -> DirectProducer:
        return DirectProducer(self.service(), _chunk_writer(self))

    @property
    def payload_limit(self) -> int:
        """1 MiB when engine v3 writes with a payload bucket (``settings.payload_bucket``), else
        what a DynamoDB row holds (docs/spark.md)."""
        if self.engine == 3 and self.settings.payload_bucket:
            return MAX_PAYLOAD_BYTES
        return ROW_PAYLOAD_BYTES

    def service(self) -> QueueService:
        """The worker process's ``QueueService`` over these tables (built once, then reused)."""
        return _direct_service(self)


def _client(target: DirectTarget) -> Any:
    return bulk_client(target.settings.region, target.endpoint_url)


def _payloads(target: DirectTarget) -> PayloadObjects | None:
    # A local store's endpoint (moto) serves the payload bucket too.
    return bulk_payloads(target.settings.region, target.settings.payload_bucket, target.endpoint_url)


@functools.lru_cache(maxsize=4)
def _chunk_writer(target: DirectTarget) -> ChunkWriter:
    # One per worker process: its thread pool and connections serve every task the worker runs.
    client = _client(target)
    return ChunkWriter(
        client,
        target.settings.items_table,
        store=DynamoDBItemStore(client, target.settings.items_table),
        catalog=DynamoDBQueueCatalog(
            target.settings.catalog_table, host=client.meta.endpoint_url, region=client.meta.region_name
        ),
        clock=SystemClock(),
        engine=target.engine,
        log=DynamoDBClaimLog(
            client, target.settings.items_table, concurrency=IN_FLIGHT, payloads=_payloads(target)
        ),
    )


def _build_direct_service(target: DirectTarget) -> QueueService:
    """The executor-side composition root, as ``querator.bootstrap`` does it from explicit settings.

    With engine v3's claim log whatever engine the chunks are written for: this service only reads
    (the queue check, the export), and a service with the log reads what both engines stored.
    """
    client = _client(target)
    return QueueService(
        catalog=DynamoDBQueueCatalog(
            target.settings.catalog_table, host=client.meta.endpoint_url, region=client.meta.region_name
        ),
        store=DynamoDBItemStore(client, target.settings.items_table),
        clock=SystemClock(),
        log=DynamoDBClaimLog(client, target.settings.items_table, payloads=_payloads(target)),
    )


@functools.lru_cache(maxsize=4)
def _direct_service(target: DirectTarget) -> QueueService:
    # One service per worker process: its client keeps connections open across tasks, and its
    # partition choice keeps filling the queue's partitions evenly across those tasks.
    return _build_direct_service(target)


class DirectProducer:
    """``Producer`` over the chunk writer (``querator.storage.dynamodb.bulk``); the queue check goes through
    ``QueueService``. Errors are the domain's."""

    def __init__(self, service: QueueService, writer: ChunkWriter) -> None:
        self._service = service
        self._writer = writer
        # Outside a Spark task (tests, a driver-side call), retries through this producer own the chunk.
        self._fallback_owner = f"local-{uuid.uuid4().hex}"

    def produce(
        self, queue: str, items: Sequence[NewItem], *, idempotency_key: str, route: int = 0
    ) -> ChunkReceipt:
        outcome = self._writer.write(
            queue, items, chunk_key=idempotency_key, owner=self._owner(), route=route
        )
        return ChunkReceipt(items=outcome.items, replayed=outcome.replayed, partition=outcome.partition)

    def _owner(self) -> str:
        """The run of the job and the Spark task: the same for every attempt of that task."""
        from pyspark import TaskContext  # noqa: PLC0415 - pyspark only where Spark runs

        context = TaskContext.get()
        run = context.getLocalProperty(RUN_PROPERTY) if context is not None else None
        if context is None or not run:
            return self._fallback_owner
        return f"{run}:{context.stageId()}:{context.partitionId()}"

    def check_queue(self, queue: str) -> int:
        return self._service.get_queue(queue).partitions


# -- HTTP: the queue's API through querator.client ------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpTarget:
    """Write through the HTTP API (``queue.produce``), for jobs that may not touch the tables.

    Parameters
    ----------
    base_url
        The API's stage URL (or ``http://127.0.0.1:2319`` for ``querator serve``).
    sigv4_region
        Sign requests with SigV4 for this region, with the executor's own credentials (its instance
        profile or Glue role); ``None``: unsigned.
    request_timeout
        Read timeout of one produce call, in seconds.
    """

    base_url: str
    sigv4_region: str | None = None
    request_timeout: float = 30.0

    def connect(self) -> HttpProducer:
        return HttpProducer(_http_client(self))

    @property
    def payload_limit(self) -> int:
        """The API's (1 MiB); a server that keeps less refuses the item, and its chunk fails."""
        return MAX_PAYLOAD_BYTES


@functools.lru_cache(maxsize=4)
def _http_client(target: HttpTarget) -> Client:
    # The client's own retries are off: the job's retry policy is the one budget for both paths,
    # and two nested loops would multiply the attempts.
    return Client(
        target.base_url,
        sigv4_region=target.sigv4_region,
        timeout=target.request_timeout,
        max_retries=0,
        max_connections=2,
    )


class HttpProducer:
    """``Producer`` over ``querator.client.Client``; the client's errors become the domain's.

    The server's ``Idempotency-Replayed`` reply header says whether an idempotent call was a replay;
    a server that does not send it gives ``replayed=None``, and the job counts those items as
    confirmed, not as written.
    """

    def __init__(self, client: Client) -> None:
        self._client = client

    def produce(
        self, queue: str, items: Sequence[NewItem], *, idempotency_key: str, route: int = 0
    ) -> ChunkReceipt:
        wire_items = [client_item(item) for item in items]
        try:
            produced = self._client.produce(queue, wire_items, idempotency_key=idempotency_key)
        except QueratorClientError as exc:
            raise domain_error(exc) from exc
        # The server says (Idempotency-Replayed) whether an earlier attempt stored this chunk.
        return ChunkReceipt(items=len(items), replayed=produced.replayed)

    def check_queue(self, queue: str) -> int:
        try:
            return self._client.queue_info(queue).requested_partitions
        except QueratorClientError as exc:
            raise domain_error(exc) from exc


def client_item(item: NewItem) -> ClientItem:
    """The item as ``querator.client`` sends it (which sends the priority when it is not 5, and the
    group when there is one)."""
    return ClientItem(
        payload=item.payload,
        reference=item.reference,
        encoding=item.encoding,
        kind=item.kind,
        enqueue_at=item.enqueue_at,
        priority=item.priority,
        group=item.group,
    )


def domain_error(exc: QueratorClientError) -> QueratorError:
    """The domain error a client error stands for, so both write paths retry on the same errors."""
    if isinstance(exc, client_errors.ConnectionFailedError):
        # Safe to resend: every call carries an idempotency key.
        return StoreUnavailableError(f"queue.produce got no reply: {exc}", store_code="connection")
    if isinstance(exc, client_errors.RetryError):  # 454, and 429 from API Gateway's throttling
        return StoreThrottledError(f"queue.produce: {exc}", store_code=f"http {exc.code}")
    if isinstance(exc, client_errors.UnknownMethodError):
        return QueratorError(f"queue.produce: {exc}")
    if isinstance(exc, client_errors.ServerError):
        return StoreUnavailableError(f"queue.produce: {exc}", store_code=f"http {exc.code}")
    # The client picks this subclass by the stable class of an idempotent produce still being written.
    if isinstance(exc, client_errors.RequestInProgressError):
        return RequestInProgressError(f"queue.produce: {exc}")
    if isinstance(exc, client_errors.QueueNotFoundError):
        return QueueNotFoundError(f"queue.produce: {exc}")
    if isinstance(exc, client_errors.PayloadTooLargeError):
        return PayloadTooLargeError(f"queue.produce: {exc}")
    if isinstance(exc, client_errors.BadRequestError):
        return InvalidRequestError(f"queue.produce: {exc}")
    return QueratorError(f"queue.produce: {exc}")


__all__ = [
    "RUN_PROPERTY",
    "ChunkReceipt",
    "DirectProducer",
    "DirectTarget",
    "HttpProducer",
    "HttpTarget",
    "Producer",
    "Target",
    "client_item",
    "domain_error",
]
