"""Storage layer: DynamoDB errors to domain errors, by error code, in one place.

``ConditionalCheckFailedException`` is not here: it is information (a lost race, a stale id) that
each store method interprets where it happens.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, cast

from botocore.exceptions import BotoCoreError

from querator.domain.errors import QueratorError, StoreThrottledError, StoreUnavailableError

if TYPE_CHECKING:
    from botocore.exceptions import ClientError
    from mypy_boto3_dynamodb import DynamoDBClient

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


class _NoReplyTranslatingClient:
    """The boto3 client, but a call that got no answer raises ``StoreUnavailableError``.

    botocore reports a timeout or a dropped connection (after its own retries) as a
    ``BotoCoreError``, not a ``ClientError`` with a code. Whether the write happened is then
    unknown, so it is never success: the caller gets the domain's "the store failed", which every
    retrying caller (the client, the Spark producer) treats as retryable.
    """

    def __init__(self, client: DynamoDBClient) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if name == "meta" or not callable(attribute):
            return attribute

        @functools.wraps(attribute)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attribute(*args, **kwargs)
            except BotoCoreError as exc:
                raise StoreUnavailableError(
                    f"{name} got no answer from the store ({type(exc).__name__})", store_code="no_reply"
                ) from exc

        return call


def translating_no_reply(client: DynamoDBClient) -> DynamoDBClient:
    """Wrap ``client`` so transport failures become ``StoreUnavailableError`` (see above)."""
    return cast("DynamoDBClient", _NoReplyTranslatingClient(client))
