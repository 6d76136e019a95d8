"""Python client of the queue's HTTP API: ``Client``, its typed results and errors, and a consumer worker.

Ships without the server: it imports only the pure duration helpers of ``querator.api`` (an
import-linter contract keeps it so).

>>> from querator.client import Client
>>> with Client("http://127.0.0.1:2319") as client:  # doctest: +SKIP
...     client.produce("orders", [b"hello"])
...     lease = client.lease("orders", 10)
...     client.complete("orders", lease.items)
"""

from __future__ import annotations

from querator.client.client import DEFAULT_URL, Client
from querator.client.errors import (
    ApiError,
    AuthError,
    BadRequestError,
    ConnectionFailedError,
    DuplicateClientError,
    ItemNotLeasedError,
    PayloadTooLargeError,
    QueratorClientError,
    QueueExistsError,
    QueueNotFoundError,
    RequestFailedError,
    RequestInProgressError,
    RetryError,
    ServerError,
    StreamClosedError,
    TooManyRequestsError,
    UnknownMethodError,
    UnsupportedContentError,
)
from querator.client.models import (
    MAX_REASON_BYTES,
    ImportedItems,
    Lease,
    LeasedItem,
    NewItem,
    PartitionStats,
    Produced,
    QueueInfo,
    QueueStats,
    Redriven,
    Renewal,
    RenewedItem,
    RetryItem,
    StoredItem,
    check_reason,
    reason_text,
)
from querator.client.worker import (
    DeadLetter,
    RetryLater,
    WorkerReport,
    consume,
    default_backoff,
    failure_reason,
)

__all__ = [
    "DEFAULT_URL",
    "MAX_REASON_BYTES",
    "ApiError",
    "AuthError",
    "BadRequestError",
    "Client",
    "ConnectionFailedError",
    "DeadLetter",
    "DuplicateClientError",
    "ImportedItems",
    "ItemNotLeasedError",
    "Lease",
    "LeasedItem",
    "NewItem",
    "PartitionStats",
    "PayloadTooLargeError",
    "Produced",
    "QueratorClientError",
    "QueueExistsError",
    "QueueInfo",
    "QueueNotFoundError",
    "QueueStats",
    "Redriven",
    "Renewal",
    "RenewedItem",
    "RequestFailedError",
    "RequestInProgressError",
    "RetryError",
    "RetryItem",
    "RetryLater",
    "ServerError",
    "StoredItem",
    "StreamClosedError",
    "TooManyRequestsError",
    "UnknownMethodError",
    "UnsupportedContentError",
    "WorkerReport",
    "check_reason",
    "consume",
    "default_backoff",
    "failure_reason",
    "reason_text",
]
