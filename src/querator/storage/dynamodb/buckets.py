"""Storage layer: lease rate-limit buckets on DynamoDB (docs/adr/0081-lease-rate-limits.md).

A bucket is one row holding GCRA's ``tat`` (``querator.domain.ratelimit``). DynamoDB's update
expressions have no ``max``, so a take is a compare-and-set: compute the new ``tat`` from the one
last seen and write it on the condition that the row still holds that one. A lost race costs one
failed conditional write, whose reply carries the row as it is (``ReturnValuesOnConditionCheckFailure``),
so the retry needs no read. This process remembers each bucket's last ``tat`` and takes from one
bucket one thread at a time, so its own consumers never race each other: one ``UpdateItem`` per
take while this process is the only one taking, and none at all when the remembered bucket is
empty (the first take after its next token is due writes, and learns of others' takes if it loses).
A return is one unconditional ``ADD`` of minus the tokens' time.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from querator.domain import ratelimit
from querator.domain.model import timestamp_us
from querator.storage.dynamodb import codec, schema
from querator.storage.dynamodb.errors import error_code, translate

if TYPE_CHECKING:
    from datetime import datetime

    from mypy_boto3_dynamodb import DynamoDBClient

    from querator.domain.ratelimit import Grant, RateLimit

_CONDITION_FAILED = "ConditionalCheckFailedException"
#: Compare-and-set tries of one take against other processes' takes; after them the take gives
#: nothing and says to come back a token later (fewer leases, never more).
_TRIES = 4
#: A bucket row expires this long after it was last due full (TTL deletes it for free; a row
#: deleted is a full bucket, so nothing depends on when).
_EXPIRY_S = 86_400
#: Buckets this process remembers at most (the oldest are forgotten: the next take reads by losing).
_REMEMBERED_MAX = 10_000

#: ``tat`` as this process last saw it; ``None``: the row does not exist.
_Unknown = object()


class RateBuckets:
    """The buckets of every queue in the items table, for ``DynamoDBItemStore``."""

    def __init__(self, client: DynamoDBClient, table: str) -> None:
        self._client = client
        self._table = table
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], int | None] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}

    def _bucket_lock(self, key: tuple[str, str]) -> threading.Lock:
        with self._lock:
            lock = self._locks.get(key)
            if lock is None:
                if len(self._locks) >= _REMEMBERED_MAX:
                    self._locks.clear()
                    self._seen.clear()
                lock = self._locks[key] = threading.Lock()
            return lock

    def take(self, queue: str, bucket: str, *, wanted: int, limit: RateLimit, now: datetime) -> Grant:
        key = (queue, bucket)
        now_us = timestamp_us(now)
        with self._bucket_lock(key):
            seen: object = self._seen.get(key, _Unknown)
            for _ in range(_TRIES):
                known = None if seen is _Unknown else seen
                grant = ratelimit.take(known, now_us, wanted, limit)  # type: ignore[arg-type]
                if grant.granted == 0 and seen is not _Unknown:
                    return grant  # empty as last seen: another process's return would only add
                try:
                    self._client.update_item(
                        TableName=self._table,
                        Key=schema.bucket_key(queue, bucket),
                        UpdateExpression="SET #tat = :new, #ttl = :ttl",
                        # Closes the race with other processes taking from the bucket: the new
                        # value was computed from the one this process saw.
                        ConditionExpression=(
                            "attribute_not_exists(#tat)" if known is None else "#tat = :old"
                        ),
                        ExpressionAttributeNames={"#tat": schema.BUCKET_TAT, "#ttl": schema.TTL},
                        ExpressionAttributeValues={
                            ":new": {"N": str(grant.tat_us)},
                            ":ttl": {"N": str(grant.tat_us // 1_000_000 + _EXPIRY_S)},
                            **({} if known is None else {":old": {"N": str(known)}}),
                        },
                        ReturnValuesOnConditionCheckFailure="ALL_OLD",
                    )
                except ClientError as exc:
                    if error_code(exc) != _CONDITION_FAILED:
                        raise translate(exc, "lease") from exc
                    seen = self._read(exc.response, queue, bucket)
                    continue
                self._seen[key] = grant.tat_us
                return grant
            self._seen.pop(key, None)
            # Lost every try to other processes: give nothing now, come back a token later.
            return ratelimit.Grant(0, now_us, now_us + limit.interval_us)

    def _read(self, response: object, queue: str, bucket: str) -> int | None:
        """The row's ``tat`` from a failed condition's reply, or read when the reply lacks it."""
        row = codec.returned(response, "Item")  # type: ignore[arg-type]
        if row is None:
            try:
                row = codec.returned(
                    self._client.get_item(
                        TableName=self._table, Key=schema.bucket_key(queue, bucket), ConsistentRead=True
                    ),
                    "Item",
                )
            except ClientError as exc:
                raise translate(exc, "lease") from exc
        if row is None or schema.BUCKET_TAT not in row:
            return None
        return int(row[schema.BUCKET_TAT]["N"])

    def give_back(self, queue: str, bucket: str, *, count: int, limit: RateLimit) -> None:
        key = (queue, bucket)
        with self._bucket_lock(key):
            try:
                reply = self._client.update_item(
                    TableName=self._table,
                    Key=schema.bucket_key(queue, bucket),
                    UpdateExpression="ADD #tat :back",
                    # Only a bucket that exists: a return to a row TTL removed would create one
                    # with a negative time, which is a full bucket anyway.
                    ConditionExpression="attribute_exists(#tat)",
                    ExpressionAttributeNames={"#tat": schema.BUCKET_TAT},
                    ExpressionAttributeValues={":back": {"N": str(-count * limit.interval_us)}},
                    ReturnValues="UPDATED_NEW",
                )
            except ClientError as exc:
                if error_code(exc) == _CONDITION_FAILED:
                    self._seen.pop(key, None)
                    return
                raise translate(exc, "lease") from exc
            row = codec.returned(reply, "Attributes")
            if row is not None and schema.BUCKET_TAT in row:
                self._seen[key] = int(row[schema.BUCKET_TAT]["N"])
            else:
                self._seen.pop(key, None)
