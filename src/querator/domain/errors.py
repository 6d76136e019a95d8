"""Domain layer: the error tree.

Every error has a stable machine ``code`` and a ``stable_class``, the short phrase that the HTTP layer
puts before the first ``;`` of the contract's ``message`` so clients can match on it. The HTTP status of
each class lives in ``querator.api``, never here.
"""

from __future__ import annotations

from typing import ClassVar


class QueratorError(Exception):
    """Unexpected queue error."""

    code: ClassVar[str] = "internal"

    def __init__(self, message: str | None = None, **context: object) -> None:
        super().__init__(message or (self.__doc__ or "").strip())
        self.context = context

    @property
    def message(self) -> str:
        return str(self)


class InvalidRequestError(QueratorError):
    """Invalid request."""

    code = "invalid_request"


class QueueNotFoundError(InvalidRequestError):
    """Queue does not exist."""

    code = "queue_not_found"


class QueueAlreadyExistsError(InvalidRequestError):
    """Queue already exists."""

    code = "queue_exists"


class ItemNotLeasedError(InvalidRequestError):
    """Item id is unknown, stale or not leased."""

    code = "item_not_leased"


class DuplicateClientError(InvalidRequestError):
    """Client id already has a waiting lease on this queue."""

    code = "duplicate_client"


class PayloadTooLargeError(InvalidRequestError):
    """Request is over the size limit."""

    code = "too_large"


class ConflictError(QueratorError):
    """Valid request that cannot succeed now."""

    code = "conflict"


class QueueDeletingError(ConflictError):
    """Queue is being deleted."""

    code = "queue_deleting"


class DeadLetterQueueMissingError(ConflictError):
    """Dead-letter queue does not exist."""

    code = "dead_queue_missing"


class RequestInProgressError(ConflictError):
    """A request with this idempotency key is still in progress."""

    code = "in_progress"


class RetryLaterError(QueratorError):
    """Try again later."""

    code = "retry"


class NothingToLeaseError(RetryLaterError):
    """Nothing to lease before the request timeout."""

    code = "nothing_to_lease"


class StoreThrottledError(RetryLaterError):
    """The store is throttling requests."""

    code = "throttled"


class StoreUnavailableError(QueratorError):
    """The store failed; nothing was reported as done."""

    code = "store_unavailable"
