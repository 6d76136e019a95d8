"""Storage layer, the DynamoDB item store's upkeep role: the schedule pass, sweep marks, recounts
(conditional on the head row's version) and the paged purge of a partition."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from querator.domain.priority import band_of, is_group_lane, lane_of
from querator.storage.counters import CounterDeltas
from querator.storage.dynamodb import codec, expressions, schema
from querator.storage.dynamodb.base import CONDITION_FAILED, DynamoDBStoreBase, _add_clauses
from querator.storage.dynamodb.errors import error_code, translate

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from querator.ports import Recount


class DynamoDBUpkeep(DynamoDBStoreBase):
    """``UpkeepPort`` on the items table."""

    def pass_schedule(
        self,
        queue: str,
        partition: int,
        *,
        old_mark: str,
        new_mark: str,
        now: datetime,
        bands: Sequence[str] = ("",),
    ) -> int:
        counts = CounterDeltas()
        for band in bands:
            start, end = band + old_mark, band + new_mark
            while True:
                # A leased one left the scheduled count when it was claimed (note_leased).
                page = self.scan(
                    queue,
                    partition,
                    start=start,
                    end=end,
                    limit=1000,
                    scheduled_only=True,
                    never_leased=True,
                )
                for state in page.items:
                    counts.add(state.created_at, sign=-1, leased=False, scheduled=True)
                if page.done:
                    break
                start = page.read_to
        counts.items = counts.created = 0
        adds, names, values = _add_clauses(counts)
        names.update({"#sm": schema.HEAD_SCHEDULE_MARK})
        values[":new"] = {"S": new_mark}
        update = "SET #sm = :new" + (f" ADD {', '.join(adds)}" if adds else "")
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "Key": codec.head_key(queue, partition),
            "UpdateExpression": update,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
        }
        if old_mark:
            kwargs["ConditionExpression"] = expressions.SCHEDULE_PASS_CONDITION
            values[":old"] = {"S": old_mark}
        else:
            kwargs["ConditionExpression"] = "attribute_not_exists(#sm)"
        try:
            self._client.update_item(**kwargs)
        except ClientError as exc:
            if error_code(exc) == CONDITION_FAILED:
                return 0  # another pass counted this range first
            raise translate(exc, "reaper") from exc
        return -counts.scheduled

    def save_recount(self, queue: str, partition: int, recount: Recount | None) -> None:
        if recount is None:
            update, values = "REMOVE #rc", None
        else:
            update, values = "SET #rc = :rc", {":rc": codec.encode_recount(recount)}
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "Key": codec.head_key(queue, partition),
            "UpdateExpression": update,
            "ExpressionAttributeNames": {"#rc": schema.HEAD_RECOUNT},
        }
        if values:
            kwargs["ExpressionAttributeValues"] = values
        try:
            self._client.update_item(**kwargs)
        except ClientError as exc:
            raise translate(exc, "reaper") from exc

    def finish_recount(self, queue: str, partition: int, recount: Recount, *, now: datetime) -> bool:
        values: dict[str, Any] = {
            ":n": {"N": str(recount.items)},
            ":nl": {"N": str(recount.leased)},
            ":ns": {"N": str(recount.scheduled)},
            ":ca": {"N": str(recount.created_sum)},
            ":cl": {"N": str(recount.leased_created_sum)},
            ":cs": {"N": str(recount.scheduled_created_sum)},
            ":at": codec.num(now),
            ":ver": {"N": str(recount.version)},
        }
        names = {
            **expressions.HEAD_COUNT_UPDATE_NAMES,
            "#ver": schema.HEAD_VERSION,
            "#rc": schema.HEAD_RECOUNT,
            "#rct": schema.HEAD_RECOUNTED_AT,
        }
        try:
            self._client.update_item(
                TableName=self._table,
                Key=codec.head_key(queue, partition),
                UpdateExpression=(
                    "SET #n = :n, #nl = :nl, #ns = :ns, #ca = :ca, #cl = :cl, #cs = :cs, #rct = :at"
                    " REMOVE #rc"
                ),
                # Only a still picture may replace the counters: any write since the recount began
                # moved the version, and its deltas are already in the counters (not in the recount).
                ConditionExpression=(
                    expressions.RECOUNT_CONDITION
                    if recount.version
                    else expressions.RECOUNT_FROM_ZERO_CONDITION
                ),
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            if error_code(exc) == CONDITION_FAILED:
                self.save_recount(queue, partition, None)
                return False
            raise translate(exc, "reaper") from exc
        return True

    def set_sweep(self, queue: str, partition: int, mark: str) -> None:
        if is_group_lane(lane_of(mark)):
            try:
                # A lane the reaper dropped since has no sweep to keep (False: nothing moved).
                self._set_lane_mark(queue, partition, mark, schema.LANE_SWEEP)
            except ClientError as exc:
                raise translate(exc, "reaper") from exc
            return
        try:
            self._client.update_item(
                TableName=self._table,
                Key=codec.head_key(queue, partition),
                UpdateExpression="SET #swp = :mark",
                ExpressionAttributeNames={"#swp": schema.band_attribute(schema.HEAD_SWEEP, band_of(mark))},
                ExpressionAttributeValues={":mark": {"S": mark}},
            )
        except ClientError as exc:
            raise translate(exc, "reaper") from exc

    def purge_page(self, queue: str, partition: int, *, limit: int) -> int:
        try:
            reply = self._client.query(
                TableName=self._table,
                KeyConditionExpression="pk = :pk",
                ProjectionExpression="pk, sk",
                ExpressionAttributeValues={":pk": {"S": schema.partition_key(queue, partition)}},
                Limit=limit,
            )
        except ClientError as exc:
            raise translate(exc, "purge") from exc
        keys = [{"DeleteRequest": {"Key": attrs}} for attrs in codec.rows(reply)]
        # Deleted rows are gone from the next Query: the partition itself is the bookmark.
        self._batch_write(keys, "purge")
        return len(keys)
