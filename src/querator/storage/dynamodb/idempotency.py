"""Storage layer, the DynamoDB item store's idempotency role: one record per key (``schema.idempotency_key``),
begun with a conditional put, expired by TTL."""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from querator.storage.dynamodb import codec, expressions, schema
from querator.storage.dynamodb.base import CONDITION_FAILED, DynamoDBStoreBase
from querator.storage.dynamodb.errors import error_code, translate

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from querator.ports import IdempotencyRecord


class DynamoDBIdempotency(DynamoDBStoreBase):
    """``IdempotencyPort`` on the items table."""

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
                old = codec.returned(exc.response, "Item") or self._get_idempotency(queue, record.key)
                found = codec.decode_idempotency(record.key, old)
                if found is not None and not found.done and _own(found, record):
                    # Our own record: botocore retried this put after its reply was lost. What it
                    # replaced, if anything, went with that reply, so a dead writer's items, if
                    # there were any, are not resumed.
                    return True, None
                return False, found
            raise translate(exc, "produce") from exc
        # A new record replaced nothing: AWS and moto leave Attributes out, LocalStack sends {}.
        return True, codec.decode_idempotency(record.key, codec.returned(reply, "Attributes"))

    def _get_idempotency(self, queue: str, key: str) -> codec.AttributeMap | None:
        try:
            reply = self._client.get_item(
                TableName=self._table,
                Key={schema.PK: {"S": schema.idempotency_key(queue, key)}, schema.SK: {"S": schema.IDEM_SK}},
                ConsistentRead=True,
            )
        except ClientError as exc:
            raise translate(exc, "produce") from exc
        return codec.returned(reply, "Item")

    def finish_idempotent(
        self, queue: str, key: str, *, partition: int, ids: Sequence[str], done: bool = True
    ) -> None:
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
                    ":true": {"BOOL": done},
                    ":part": {"N": str(partition)},
                    ":ids": {"L": [{"S": item_id} for item_id in ids]},
                },
            )
        except ClientError as exc:
            raise translate(exc, "produce") from exc


def _own(found: IdempotencyRecord, record: IdempotencyRecord) -> bool:
    """Whether ``found`` is the record ``record``'s request wrote. By its owner token; a record
    written before tokens by its ids, unique to the request that minted them (engine v2 only: under
    engine v3 every request begins with none, so equal ids said nothing, and concurrent produces
    with one key all took themselves for the first)."""
    if found.owner or record.owner:
        return found.owner == record.owner
    return bool(record.ids) and found.ids == record.ids
