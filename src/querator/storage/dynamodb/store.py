"""Storage layer: the item store on one DynamoDB table (see docs/adr/0001-data-model.md).

Adapter notes, where it deviates from or adds to the ``ItemStore`` port:

- Writes of fresh ids go out as ``BatchWriteItem`` (25 a request); unprocessed items are retried with
  backoff and, when retries run out, the call raises ``StoreThrottledError``: it never reports a
  write that did not happen.
- Every write that must not race is a single conditional request (``expressions``); a move between
  two keys is a two-item transaction, so an item is never lost or doubled between them.
- The boto3 client is injected; botocore's own retries (standard mode) sit below this code.
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from querator.domain.errors import StoreThrottledError
from querator.domain.ids import visible_bound
from querator.ports import Guard, IdempotencyRecord, Page
from querator.storage.dynamodb import codec, expressions, schema
from querator.storage.dynamodb.errors import error_code, translate, translating_no_reply

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from datetime import datetime

    from mypy_boto3_dynamodb import DynamoDBClient

    from querator.domain.model import Item

log = logging.getLogger(__name__)

BATCH_WRITE_LIMIT = 25
CONDITION_FAILED = "ConditionalCheckFailedException"
_UNPROCESSED_RETRIES = 8
_TRANSACTION_RETRIES = 3


class DynamoDBItemStore:
    """Items of every queue in one table, a queue partition per partition key."""

    def __init__(
        self, client: DynamoDBClient, table_name: str, *, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self._client = translating_no_reply(client)
        self._table = table_name
        self._sleep = sleep

    # -- writes of new items ---------------------------------------------------------------------

    def put_new(self, queue: str, partition: int, items: Sequence[Item]) -> None:
        requests = [{"PutRequest": {"Item": codec.encode_item(queue, partition, item)}} for item in items]
        self._batch_write(requests, "produce")

    def put_absent(self, queue: str, partition: int, items: Sequence[Item]) -> list[str]:
        written = []
        for item in items:
            if self._put_if_absent(codec.encode_item(queue, partition, item)):
                written.append(item.id)
        return written

    def _put_if_absent(self, attrs: codec.AttributeMap) -> bool:
        try:
            self._client.put_item(
                TableName=self._table,
                Item=attrs,
                ConditionExpression=expressions.PUT_ABSENT_CONDITION,
                ExpressionAttributeNames=expressions.PUT_ABSENT_NAMES,
            )
        except ClientError as exc:
            if error_code(exc) == CONDITION_FAILED:
                return False
            raise translate(exc, "put") from exc
        return True

    def _batch_write(self, requests: list[dict[str, Any]], operation: str) -> None:
        for start in range(0, len(requests), BATCH_WRITE_LIMIT):
            pending: list[Any] = requests[start : start + BATCH_WRITE_LIMIT]
            for attempt in range(_UNPROCESSED_RETRIES + 1):
                try:
                    reply = self._client.batch_write_item(RequestItems={self._table: pending})
                except ClientError as exc:
                    raise translate(exc, operation) from exc
                pending = list(reply.get("UnprocessedItems", {}).get(self._table, []))
                if not pending:
                    break
                if attempt == _UNPROCESSED_RETRIES:
                    raise StoreThrottledError(
                        f"the store left {len(pending)} writes of {operation} unprocessed; retry"
                    )
                # Full jitter, as AWS recommends for UnprocessedItems.
                self._sleep(random.uniform(0, min(1.0, 0.025 * 2**attempt)))  # noqa: S311

    # -- reads -----------------------------------------------------------------------------------

    def scan(
        self,
        queue: str,
        partition: int,
        *,
        limit: int,
        start_after: str | None = None,
        due_at: datetime | None = None,
        available_only: bool = False,
    ) -> Page:
        names = dict(expressions.STATE_PROJECTION_NAMES)
        values: dict[str, Any] = {":pk": {"S": schema.partition_key(queue, partition)}}
        condition = "pk = :pk"
        if due_at is not None:
            # Ids sort by visible-at time: everything due is the key range below the bound.
            condition = "pk = :pk AND sk < :bound"
            values[":bound"] = {"S": visible_bound(due_at)}
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": condition,
            "ProjectionExpression": expressions.STATE_PROJECTION,
            "Limit": limit,
        }
        if available_only:
            if due_at is None:
                raise ValueError("available_only needs due_at")
            kwargs["FilterExpression"] = expressions.AVAILABLE_FILTER
            names.update(expressions.AVAILABLE_FILTER_NAMES)
            values[":now"] = codec.num(due_at)
        if start_after is not None:
            kwargs["ExclusiveStartKey"] = codec.item_key(queue, partition, start_after)
        kwargs["ExpressionAttributeNames"] = names
        kwargs["ExpressionAttributeValues"] = values
        try:
            reply = self._client.query(**kwargs)
        except ClientError as exc:
            raise translate(exc, "scan") from exc
        last = reply.get("LastEvaluatedKey")
        return Page(
            items=[codec.decode_state(attrs) for attrs in reply.get("Items", [])],
            next_start=None if last is None else str(last[schema.SK]["S"]),
        )

    def list_items(
        self, queue: str, partition: int, *, limit: int, pivot: str = "", lower: str = "", upper: str = ""
    ) -> list[Item]:
        """Whole items in id order, from ``max(pivot, lower)`` inclusive to ``upper`` exclusive."""
        start = max(pivot, lower)
        values: dict[str, Any] = {":pk": {"S": schema.partition_key(queue, partition)}}
        if start and upper:
            # BETWEEN is inclusive at both ends; the upper bound is exclusive, so step just below it.
            last = _just_below(upper)
            if start > last:
                return []
            condition = "pk = :pk AND sk BETWEEN :start AND :last"
            values[":start"] = {"S": start}
            values[":last"] = {"S": last}
        elif start:
            condition = "pk = :pk AND sk >= :start"
            values[":start"] = {"S": start}
        elif upper:
            condition = "pk = :pk AND sk < :upper"
            values[":upper"] = {"S": upper}
        else:
            condition = "pk = :pk"
        items: list[Item] = []
        start_key: dict[str, Any] | None = None
        while len(items) < limit:
            kwargs: dict[str, Any] = {
                "TableName": self._table,
                "KeyConditionExpression": condition,
                "ExpressionAttributeValues": values,
                "Limit": limit - len(items),
            }
            if start_key is not None:
                kwargs["ExclusiveStartKey"] = start_key
            try:
                reply = self._client.query(**kwargs)
            except ClientError as exc:
                raise translate(exc, "list") from exc
            items.extend(codec.decode_item(attrs) for attrs in reply.get("Items", []))
            start_key = reply.get("LastEvaluatedKey")
            if start_key is None:
                break
        return items

    def iter_items(self, queue: str, partition: int, *, page_size: int = 500) -> Iterator[Item]:
        pivot = ""
        while True:
            page = self.list_items(queue, partition, limit=page_size + 1, pivot=pivot)
            yield from page[:page_size]
            if len(page) <= page_size:
                return
            pivot = page[page_size].id

    def get(self, queue: str, partition: int, item_id: str) -> Item | None:
        try:
            reply = self._client.get_item(
                TableName=self._table, Key=codec.item_key(queue, partition, item_id), ConsistentRead=True
            )
        except ClientError as exc:
            raise translate(exc, "get") from exc
        attrs = reply.get("Item")
        return None if attrs is None else codec.decode_item(attrs)

    def source_ids(self, queue: str, partition: int) -> set[str]:
        found: set[str] = set()
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "pk = :pk",
            "ProjectionExpression": "#src",
            "ExpressionAttributeNames": {"#src": schema.SOURCE_ID},
            "ExpressionAttributeValues": {":pk": {"S": schema.partition_key(queue, partition)}},
        }
        for attrs in self._query_all(kwargs, "import"):
            if schema.SOURCE_ID in attrs:
                found.add(attrs[schema.SOURCE_ID]["S"])
        return found

    def _query_all(self, kwargs: dict[str, Any], operation: str) -> Iterator[codec.AttributeMap]:
        while True:
            try:
                reply = self._client.query(**kwargs)
            except ClientError as exc:
                raise translate(exc, operation) from exc
            yield from reply.get("Items", [])
            last = reply.get("LastEvaluatedKey")
            if last is None:
                return
            kwargs = {**kwargs, "ExclusiveStartKey": last}

    # -- conditional writes on leased items --------------------------------------------------------

    def claim(
        self, queue: str, partition: int, ids: Sequence[str], *, lease_deadline: datetime, now: datetime
    ) -> list[Item]:
        won: list[Item] = []
        values = {":deadline": codec.num(lease_deadline), ":now": codec.num(now), ":one": {"N": "1"}}
        for item_id in ids:
            try:
                reply = self._client.update_item(
                    TableName=self._table,
                    Key=codec.item_key(queue, partition, item_id),
                    UpdateExpression=expressions.CLAIM_UPDATE,
                    ConditionExpression=expressions.CLAIM_CONDITION,
                    ExpressionAttributeNames=expressions.CLAIM_NAMES,
                    ExpressionAttributeValues=values,
                    # The write returns the whole item for free, so the scan reads only small attributes.
                    ReturnValues="ALL_NEW",
                )
            except ClientError as exc:
                if error_code(exc) == CONDITION_FAILED:
                    continue  # another consumer won this one
                raise translate(exc, "lease") from exc
            won.append(codec.decode_item(reply["Attributes"]))
        return won

    def renew(
        self, queue: str, partition: int, ids: Sequence[str], *, lease_deadline: datetime, now: datetime
    ) -> list[str]:
        condition, names = expressions.GUARD_CONDITIONS[Guard.LEASE_VALID]
        failed = []
        for item_id in ids:
            try:
                self._client.update_item(
                    TableName=self._table,
                    Key=codec.item_key(queue, partition, item_id),
                    UpdateExpression=expressions.RENEW_UPDATE,
                    ConditionExpression=condition,
                    ExpressionAttributeNames=names,
                    ExpressionAttributeValues={
                        ":deadline": codec.num(lease_deadline),
                        ":now": codec.num(now),
                    },
                )
            except ClientError as exc:
                if error_code(exc) == CONDITION_FAILED:
                    failed.append(item_id)
                    continue
                raise translate(exc, "renew") from exc
        return failed

    def delete(
        self, queue: str, partition: int, ids: Sequence[str], *, guard: Guard, now: datetime
    ) -> list[str]:
        if guard is Guard.ANY:
            # Unconditional deletes batch 25 to a request, and deleting a missing item succeeds.
            requests = [{"DeleteRequest": {"Key": codec.item_key(queue, partition, i)}} for i in ids]
            self._batch_write(requests, "delete")
            return []
        condition, names = expressions.GUARD_CONDITIONS[guard]
        failed = []
        for item_id in ids:
            try:
                self._client.delete_item(
                    TableName=self._table,
                    Key=codec.item_key(queue, partition, item_id),
                    ConditionExpression=condition,
                    ExpressionAttributeNames=names,
                    ExpressionAttributeValues={":now": codec.num(now)} if ":now" in condition else {},
                )
            except ClientError as exc:
                if error_code(exc) == CONDITION_FAILED:
                    failed.append(item_id)
                    continue
                raise translate(exc, "delete") from exc
        return failed

    def move(
        self,
        queue: str,
        partition: int,
        item_id: str,
        *,
        guard: Guard,
        now: datetime,
        target_queue: str,
        target_partition: int,
        replacement: Item,
    ) -> bool:
        condition, names = expressions.GUARD_CONDITIONS[guard]
        delete: dict[str, Any] = {
            "TableName": self._table,
            "Key": codec.item_key(queue, partition, item_id),
            "ConditionExpression": condition,
            "ExpressionAttributeNames": names,
        }
        if ":now" in condition:
            delete["ExpressionAttributeValues"] = {":now": codec.num(now)}
        put: dict[str, Any] = {
            "TableName": self._table,
            "Item": codec.encode_item(target_queue, target_partition, replacement),
            "ConditionExpression": expressions.PUT_ABSENT_CONDITION,
            "ExpressionAttributeNames": expressions.PUT_ABSENT_NAMES,
        }
        for attempt in range(_TRANSACTION_RETRIES + 1):
            try:
                # The stubs' TypedDicts want literal keys; the dicts above are built incrementally.
                transaction: Any = [{"Delete": delete}, {"Put": put}]
                self._client.transact_write_items(TransactItems=transaction)
            except ClientError as exc:
                reasons = [r.get("Code", "") for r in exc.response.get("CancellationReasons", [])]
                if error_code(exc) == "TransactionCanceledException" and "ConditionalCheckFailed" in reasons:
                    return False  # the item is no longer in the guarded state: someone else acted
                retryable = (
                    error_code(exc) == "TransactionCanceledException" and "TransactionConflict" in reasons
                )
                if retryable and attempt < _TRANSACTION_RETRIES:
                    self._sleep(random.uniform(0, 0.01 * 2**attempt))  # noqa: S311
                    continue
                raise translate(exc, "move") from exc
            return True
        return False  # pragma: no cover - the loop returns or raises

    def purge(self, queue: str, partition: int) -> int:
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "pk = :pk",
            "ProjectionExpression": "pk, sk",
            "ExpressionAttributeValues": {":pk": {"S": schema.partition_key(queue, partition)}},
        }
        keys = [{"DeleteRequest": {"Key": attrs}} for attrs in self._query_all(kwargs, "purge")]
        self._batch_write(keys, "purge")
        return len(keys)

    # -- idempotent produce ----------------------------------------------------------------------

    def begin_idempotent(
        self, queue: str, record: IdempotencyRecord, *, stale_before: datetime, expires_at: datetime
    ) -> tuple[bool, IdempotencyRecord | None]:
        try:
            reply = self._client.put_item(
                TableName=self._table,
                Item=codec.encode_idempotency(queue, record, expires_at),
                ConditionExpression=expressions.IDEM_BEGIN_CONDITION,
                ExpressionAttributeNames=expressions.IDEM_BEGIN_NAMES,
                ExpressionAttributeValues={
                    ":qcreated": codec.num(record.queue_created_at),
                    ":now_s": {"N": str(int(record.started_at.timestamp()))},
                    ":false": {"BOOL": False},
                    ":stale": codec.num(stale_before),
                },
                # The record this one replaced, if any: a pending one whose writer died is resumed.
                ReturnValues="ALL_OLD",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if error_code(exc) == CONDITION_FAILED:
                returned: codec.AttributeMap | None = exc.response.get("Item")  # type: ignore[assignment]
                old = returned or self._get_idempotency(queue, record.key)
                return False, None if old is None else codec.decode_idempotency(record.key, old)
            raise translate(exc, "produce") from exc
        previous = reply.get("Attributes")
        return True, None if previous is None else codec.decode_idempotency(record.key, previous)

    def _get_idempotency(self, queue: str, key: str) -> codec.AttributeMap | None:
        try:
            reply = self._client.get_item(
                TableName=self._table,
                Key={schema.PK: {"S": schema.idempotency_key(queue, key)}, schema.SK: {"S": schema.IDEM_SK}},
                ConsistentRead=True,
            )
        except ClientError as exc:
            raise translate(exc, "produce") from exc
        return reply.get("Item")

    def finish_idempotent(self, queue: str, key: str, *, partition: int, ids: Sequence[str]) -> None:
        try:
            self._client.update_item(
                TableName=self._table,
                Key={schema.PK: {"S": schema.idempotency_key(queue, key)}, schema.SK: {"S": schema.IDEM_SK}},
                UpdateExpression="SET #done = :true, #part = :part, #ids = :ids",
                ExpressionAttributeNames={
                    "#done": schema.IDEM_DONE,
                    "#part": schema.IDEM_PARTITION,
                    "#ids": schema.IDEM_IDS,
                },
                ExpressionAttributeValues={
                    ":true": {"BOOL": True},
                    ":part": {"N": str(partition)},
                    ":ids": {"L": [{"S": item_id} for item_id in ids]},
                },
            )
        except ClientError as exc:
            raise translate(exc, "produce") from exc


def _just_below(bound: str) -> str:
    """The largest key below a visible-at bound: ids are hex, and 'g' sorts after every hex digit."""
    return f"{int(bound, 16) - 1:0{len(bound)}x}g"
