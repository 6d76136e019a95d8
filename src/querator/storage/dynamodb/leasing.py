"""Storage layer, the DynamoDB item store's leasing role: lease records (``~L<deadline>``), claims (a
conditional write each, run concurrently), a lease's counters and cursor, renewals and coming
priorities, and lease rate-limit tokens (``buckets.RateBuckets``)."""

from __future__ import annotations

import secrets
from functools import partial
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from querator.domain.errors import QueratorError
from querator.domain.priority import is_group_lane, lane_of
from querator.ports import BatchResult, ClaimInterruptedError, Guard
from querator.storage.counters import CounterDeltas, scheduled_until_claimed
from querator.storage.dynamodb import codec, expressions, schema
from querator.storage.dynamodb.base import CONDITION_FAILED, DynamoDBStoreBase, _call, log
from querator.storage.dynamodb.errors import error_code, translate

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from datetime import datetime

    from querator.domain.model import Item
    from querator.domain.ratelimit import Grant, RateLimit


class DynamoDBLeasing(DynamoDBStoreBase):
    """``LeasingPort`` on the items table."""

    def record_lease(self, queue: str, partition: int, ids: Sequence[str], *, deadline: datetime) -> str:
        key = codec.lease_record_key(deadline, secrets.token_hex(8))
        try:
            self._client.put_item(
                TableName=self._table,
                Item=codec.encode_lease_record(queue, partition, key, list(ids), deadline),
            )
        except ClientError as exc:
            raise translate(exc, "lease") from exc
        return key

    def drop_lease_record(self, queue: str, partition: int, key: str) -> None:
        try:
            self._client.delete_item(
                TableName=self._table,
                Key={schema.PK: {"S": schema.partition_key(queue, partition)}, schema.SK: {"S": key}},
            )
        except ClientError as exc:
            raise translate(exc, "lease") from exc

    def claim(
        self, queue: str, partition: int, ids: Sequence[str], *, lease_deadline: datetime, now: datetime
    ) -> BatchResult[Item]:
        token = secrets.token_bytes(8)
        values: codec.AttributeMap = {
            ":deadline": codec.num(lease_deadline),
            ":now": codec.num(now),
            ":one": {"N": "1"},
            ":claim": {"B": token},
        }

        def claim_one(item_id: str) -> Item | None:
            try:
                reply = self._client.update_item(
                    TableName=self._table,
                    Key=codec.item_key(queue, partition, item_id),
                    UpdateExpression=expressions.CLAIM_OWNED_UPDATE,
                    ConditionExpression=expressions.CLAIM_CONDITION,
                    ExpressionAttributeNames=expressions.CLAIM_OWNED_NAMES,
                    ExpressionAttributeValues=values,
                    # The write returns the whole item for free, so the scan reads only small attributes.
                    ReturnValues="ALL_NEW",
                    # A failed condition returns the item as it is, for free (no read).
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
            except ClientError as exc:
                if error_code(exc) == CONDITION_FAILED:
                    current = codec.returned(exc.response, "Item")
                    if current is not None and current.get(schema.CLAIM_TOKEN, {}).get("B") == token:
                        # botocore retried this claim after its reply was lost, and the first attempt
                        # had applied: the lease is this caller's, not a competitor's.
                        return codec.decode_item(current)
                    return None  # another consumer won this one
                raise translate(exc, "lease") from exc
            return codec.decode_item(reply["Attributes"])

        claimed, error = self._each_settled(claim_one, list(ids))
        if error is not None:
            # The claims that applied beside the failure are the caller's: it must know them, or
            # they would stay leased to nobody until their deadline (their attempt spent).
            raise ClaimInterruptedError([item for item in claimed if item is not None]) from error
        return BatchResult(
            applied=[item for item in claimed if item is not None],
            rejected=[item_id for item_id, item in zip(ids, claimed, strict=True) if item is None],
        )

    def note_leased(
        self,
        queue: str,
        partition: int,
        items: Sequence[Item],
        *,
        cursor: str | None,
        ring: tuple[str, str] | None = None,
    ) -> None:
        # Only the leased counters (the items were counted when they were written), and the
        # scheduled ones of items that came due since the last schedule pass: each leaves the
        # scheduled count as it enters the leased one. The mark is read after the claims (only when
        # a scheduled item is among them), as a delete reads it; the pass counts only items never
        # leased, so an item is taken off once (but for a pass whose read and write both fall
        # between a claim and this read: drift that the recount heals).
        mark: str | None = ""
        if any(item.enqueue_at is not None for item in items):
            try:
                mark = self.heads(queue, [partition])[0].schedule_mark
            except QueratorError as exc:
                # The items are leased already: a failed read costs the count (the recount heals it),
                # never the reply. They stay counted as scheduled until the recount.
                log.warning("schedule mark of %s~%d not read after lease: %s", queue, partition, exc)
                mark = None
        counts = CounterDeltas()
        for item in items:
            was_scheduled = mark is not None and scheduled_until_claimed(item, mark)
            counts.lease(item.created_at, was_scheduled=was_scheduled)
        in_lane = cursor is not None and is_group_lane(lane_of(cursor))
        # A band's cursor and the ring go with the counters; a group lane's cursor is on its row.
        writes: list[Callable[[], None]] = [
            partial(
                self._update_head,
                queue,
                partition,
                counts,
                cursor=None if in_lane else cursor,
                ring=ring,
                operation="lease",
            )
        ]
        if cursor is not None and in_lane:
            writes.append(partial(self._note_lane_cursor, queue, partition, cursor))
        self._each(_call, writes)

    def _note_lane_cursor(self, queue: str, partition: int, cursor: str) -> None:
        """Move a group lane's cursor; log, never raise (as the head row's cursor): a cursor left
        behind costs the next lease a longer read, never an item."""
        try:
            self._set_lane_mark(queue, partition, cursor, schema.LANE_CURSOR)
        except (ClientError, QueratorError) as exc:
            log.warning("cursor of %s~%d not moved to %s after lease: %s", queue, partition, cursor, exc)

    def renew(
        self, queue: str, partition: int, ids: Sequence[str], *, lease_deadline: datetime, now: datetime
    ) -> BatchResult[str]:
        values = {":deadline": codec.num(lease_deadline)}
        return self._update_leased(queue, partition, ids, expressions.RENEW_UPDATE, {}, values, now, "renew")

    def set_next_priority(
        self, queue: str, partition: int, ids: Sequence[str], *, priority: int, now: datetime
    ) -> BatchResult[str]:
        names = {"#np": schema.NEXT_PRIORITY}
        values = {":priority": {"N": str(priority)}}
        update = expressions.NEXT_PRIORITY_UPDATE
        return self._update_leased(queue, partition, ids, update, names, values, now, "reprioritize")

    def _update_leased(
        self,
        queue: str,
        partition: int,
        ids: Sequence[str],
        update: str,
        names: dict[str, str],
        values: dict[str, Any],
        now: datetime,
        operation: str,
    ) -> BatchResult[str]:
        """``update`` on each item whose lease is still valid, concurrently (rejected: the others)."""
        condition, guard_names = expressions.GUARD_CONDITIONS[Guard.LEASE_VALID]

        def update_one(item_id: str) -> str | None:
            try:
                self._client.update_item(
                    TableName=self._table,
                    Key=codec.item_key(queue, partition, item_id),
                    UpdateExpression=update,
                    ConditionExpression=condition,
                    ExpressionAttributeNames={**guard_names, **names},
                    ExpressionAttributeValues={**values, ":now": codec.num(now)},
                )
            except ClientError as exc:
                if error_code(exc) == CONDITION_FAILED:
                    return item_id
                raise translate(exc, operation) from exc
            return None

        refused = {i for i in self._each(update_one, list(ids)) if i is not None}
        return BatchResult(
            applied=[i for i in ids if i not in refused], rejected=[i for i in ids if i in refused]
        )

    def take_tokens(self, queue: str, bucket: str, *, wanted: int, limit: RateLimit, now: datetime) -> Grant:
        return self._buckets.take(queue, bucket, wanted=wanted, limit=limit, now=now)

    def return_tokens(self, queue: str, bucket: str, *, count: int, limit: RateLimit) -> None:
        self._buckets.give_back(queue, bucket, count=count, limit=limit)
