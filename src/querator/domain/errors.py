"""Domain layer: the error tree.

Every error has a stable machine ``code`` and a ``stable_class``: the phrase that the HTTP layer puts
before the first ``;`` of the error envelope's ``message``, which clients match on (docs/api.md lists
them; the Python client keeps a copy, checked against these by a test). Both are part of the API:
change them only on purpose. Docstrings are documentation only. The HTTP status of each class lives in
``querator.api``, never here.
"""

from __future__ import annotations

from typing import ClassVar


class QueratorError(Exception):
    """Unexpected queue error."""

    code: ClassVar[str] = "internal"
    stable_class: ClassVar[str] = "Unexpected queue error"

    def __init__(self, message: str | None = None, **context: object) -> None:
        super().__init__(message or self.stable_class)
        self.context = context

    @property
    def message(self) -> str:
        return str(self)


class InvalidRequestError(QueratorError):
    """Invalid request."""

    code = "invalid_request"
    stable_class = "Invalid request"


class QueueNotFoundError(InvalidRequestError):
    """Queue does not exist."""

    code = "queue_not_found"
    stable_class = "Queue does not exist"


class QueueAlreadyExistsError(InvalidRequestError):
    """Queue already exists."""

    code = "queue_exists"
    stable_class = "Queue already exists"


class ItemNotLeasedError(InvalidRequestError):
    """Item id is unknown, stale or not leased."""

    code = "item_not_leased"
    stable_class = "Item id is unknown, stale or not leased"


class DuplicateClientError(InvalidRequestError):
    """Client id already has a waiting lease on this queue."""

    code = "duplicate_client"
    stable_class = "Client id already has a waiting lease on this queue"


class PayloadTooLargeError(InvalidRequestError):
    """Request is over the size limit."""

    code = "too_large"
    stable_class = "Request is over the size limit"


class ConflictError(QueratorError):
    """Valid request that cannot succeed now."""

    code = "conflict"
    stable_class = "Valid request that cannot succeed now"


class QueueDeletingError(ConflictError):
    """Queue is being deleted."""

    code = "queue_deleting"
    stable_class = "Queue is being deleted"


class DeadLetterQueueMissingError(ConflictError):
    """Dead-letter queue does not exist."""

    code = "dead_queue_missing"
    stable_class = "Dead-letter queue does not exist"


class RequestInProgressError(ConflictError):
    """A request with this idempotency key is still in progress."""

    code = "in_progress"
    stable_class = "A request with this idempotency key is still in progress"


class RetryLaterError(QueratorError):
    """Try again later."""

    code = "retry"
    stable_class = "Try again later"


class NothingToLeaseError(RetryLaterError):
    """Nothing to lease before the request timeout."""

    code = "nothing_to_lease"
    stable_class = "Nothing to lease before the request timeout"


class LeaseRateLimitedError(NothingToLeaseError):
    """Lease rate limit reached: nothing leased before the request timeout because the queue's (or
    every ready group's) lease rate limit has no lease left. ``next_lease_at`` (a context value,
    in the envelope too) says when one is there again. A 454 like ``NothingToLeaseError``, which
    a client that does not know rate limits takes for the same answer (nothing leased, ask again).
    """

    code = "rate_limited"
    stable_class = "Lease rate limit reached"


class StoreThrottledError(RetryLaterError):
    """The store is throttling requests."""

    code = "throttled"
    stable_class = "The store is throttling requests"


class StoreUnavailableError(QueratorError):
    """The store failed; nothing was reported as done."""

    code = "store_unavailable"
    # Never on the wire (a 500 says only "Internal error"), but a stable class all the same.
    stable_class = "The store failed and nothing was reported as done"
