"""Storage layer: DynamoDB errors to domain errors, by error code, in one place.

``ConditionalCheckFailedException`` is not here: it is information (a lost race, a stale id) that
each store method interprets where it happens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from querator.domain.errors import QueratorError, StoreThrottledError, StoreUnavailableError

if TYPE_CHECKING:
    from botocore.exceptions import ClientError

THROTTLING_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "LimitExceededException",
        "TransactionConflictException",
    }
)
UNAVAILABLE_CODES = frozenset({"InternalServerError", "ServiceUnavailable", "ResourceNotFoundException"})


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def translate(exc: ClientError, operation: str) -> QueratorError:
    """The domain error for a DynamoDB failure; raise it ``from exc``."""
    code = error_code(exc)
    if code in THROTTLING_CODES:
        return StoreThrottledError(f"the store is throttling {operation}; retry", store_code=code)
    if code in UNAVAILABLE_CODES:
        return StoreUnavailableError(f"{operation} failed: {code}", store_code=code)
    return QueratorError(f"{operation} failed: {code}", store_code=code)
