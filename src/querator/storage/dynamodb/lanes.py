"""Storage layer, the DynamoDB item store's lanes role: bands named in the head row (``bt<band>``),
group lanes in rows of their own (``~R<lane>``), and a capped fair queue's group ledgers
(``~S<group>``), each claim in a group a two-item transaction with its ledger."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from querator.domain.errors import QueratorError
from querator.domain.ids import key_after
from querator.domain.priority import band_end, band_of, is_group_lane, lane_of, ledger_group
from querator.storage.dynamodb import codec, expressions, schema
from querator.storage.dynamodb.base import (
    _EPOCH,
    _TRANSACTION_RETRIES,
    CONDITION_FAILED,
    DynamoDBStoreBase,
    _call,
    log,
)
from querator.storage.dynamodb.errors import error_code, translate

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from querator.domain.model import Item
    from querator.ports import GroupLedger, Lane, PartitionHead


#: How long a band's or group lane's registration by this store spares it another write: far less
#: than the reaper's BAND_IDLE (``querator.service.tuning``; a test keeps them apart), so nothing it
#: wrote into a band or lane can be in one the reaper dropped.
REGISTRATION_REUSE = timedelta(minutes=5)
_REGISTERED_MAX = 10_000
#: Ledger entries one update removes: keeps the update expression far below DynamoDB's 4 KB. A
#: claim drops at most this many ended leases with it; the rest stay for a later claim (an entry
#: whose deadline passed is checked against its item anyway).
_LEDGER_REMOVALS = 100


class DynamoDBLanes(DynamoDBStoreBase):
    """``LanesPort`` on the items table."""

    def register_bands(self, queue: str, partition: int, ids: Iterable[str], *, now: datetime) -> None:
        """Name the bands of ``ids`` (other than priority 5's) in the partition's head row, with
        ``now`` as their registration time (``bt<band>``), and their group lanes in lane rows
        (``t``, with ``gl`` on the head row), before items of those bands are written: a lease reads
        only the bands and lanes named, so an item written to one it does not name would never be
        leased. Raises when a write fails (the items are then not written); no request for
        priority 5 items outside group lanes, one for other bands, one more per group lane."""
        lanes = {lane_of(item_id) for item_id in ids}
        fresh = now - REGISTRATION_REUSE
        # What this store registered in the last REGISTRATION_REUSE needs no write: the reaper drops
        # only what nobody registered for BAND_IDLE (an hour), so the registration still holds.
        bands = sorted(
            band
            for band in {band_of(lane) for lane in lanes} - {""}
            if self._registered.get((queue, partition, band), _EPOCH) < fresh
        )
        group_lanes = sorted(
            lane
            for lane in lanes
            if is_group_lane(lane) and self._registered.get((queue, partition, lane), _EPOCH) < fresh
        )
        has_lanes = bool(group_lanes) and self._registered.get((queue, partition, "gl"), _EPOCH) < fresh
        if not bands and not group_lanes:
            return
        writes: list[Callable[[], None]] = []
        if bands or has_lanes:
            writes.append(
                partial(self._register_in_head, queue, partition, bands, has_lanes=has_lanes, now=now)
            )
        writes += [partial(self._register_lane, queue, partition, lane, now=now) for lane in group_lanes]
        self._each(_call, writes)
        with self._pool_lock:
            if len(self._registered) > _REGISTERED_MAX:
                self._registered.clear()
            for key in [*bands, *group_lanes, *(["gl"] if has_lanes else [])]:
                self._registered[queue, partition, key] = now

    def _register_in_head(
        self, queue: str, partition: int, bands: Sequence[str], *, has_lanes: bool, now: datetime
    ) -> None:
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        stamps = []
        for index, band in enumerate(bands):
            names[f"#bt{index}"] = schema.band_attribute(schema.HEAD_BAND_REGISTERED, band)
            stamps.append(f"#bt{index} = :now")
            values[":now"] = codec.num(now)
        if has_lanes:
            names["#gl"] = schema.HEAD_HAS_LANES
            stamps.append("#gl = :true")
            values[":true"] = {"BOOL": True}
        try:
            self._client.update_item(
                TableName=self._table,
                Key=codec.head_key(queue, partition),
                UpdateExpression=f"SET {', '.join(stamps)}",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            raise translate(exc, "produce") from exc

    def _register_lane(self, queue: str, partition: int, lane: str, *, now: datetime) -> None:
        try:
            self._client.update_item(
                TableName=self._table,
                Key=codec.lane_key(queue, partition, lane),
                UpdateExpression=expressions.LANE_REGISTER_UPDATE,
                ExpressionAttributeNames=expressions.LANE_NAMES,
                ExpressionAttributeValues={":now": codec.num(now)},
            )
        except ClientError as exc:
            raise translate(exc, "produce") from exc

    def drop_band(self, queue: str, partition: int, band: str, *, registered_before: datetime) -> bool:
        kwargs: dict[str, Any]
        if is_group_lane(band):
            # A group lane is its row: dropping it deletes the row (cursor and sweep mark with it).
            kwargs = {
                "Key": codec.lane_key(queue, partition, band),
                "ConditionExpression": expressions.LANE_DROP_CONDITION,
                "ExpressionAttributeNames": expressions.LANE_NAMES,
            }
            drop: Callable[..., Any] = self._client.delete_item
        else:
            kwargs = {
                "Key": codec.head_key(queue, partition),
                "UpdateExpression": "REMOVE #bt",
                "ConditionExpression": "#bt < :before",
                "ExpressionAttributeNames": {"#bt": schema.band_attribute(schema.HEAD_BAND_REGISTERED, band)},
            }
            drop = self._client.update_item
        try:
            # No registration since: a writer that registered the band has written its items by
            # then (registered_before is far enough back), so the caller's re-check sees them.
            drop(
                TableName=self._table,
                ExpressionAttributeValues={":before": codec.num(registered_before)},
                **kwargs,
            )
        except ClientError as exc:
            if error_code(exc) == CONDITION_FAILED:
                return False
            raise translate(exc, "reaper") from exc
        with self._pool_lock:
            # Registering it again (the reaper's second check found an item) must write.
            self._registered.pop((queue, partition, band), None)
        return True

    def lanes(self, queue: str, partition: int, band: str, *, after: str, limit: int) -> list[Lane]:
        # A band's lane rows are ``~R<band>g`` + 16 hex digits: one key range, which no other
        # band's lanes enter (``~R.3g…`` and ``~Rp7g…`` sort outside ``~Rg…``'s range).
        start = schema.lane_sort_key(band_end(band))
        if after:
            # Lane rows have one length within a band: ``<after>0`` is past ``after`` and below the next.
            start = max(start, schema.lane_sort_key(key_after(after)))
        last = schema.lane_sort_key(band_end(band) + "~")
        if limit <= 0 or start > last:
            return []
        try:
            reply = self._client.query(
                TableName=self._table,
                KeyConditionExpression="pk = :pk AND sk BETWEEN :start AND :last",
                ExpressionAttributeValues={
                    ":pk": {"S": schema.partition_key(queue, partition)},
                    ":start": {"S": start},
                    ":last": {"S": last},
                },
                Limit=limit,
                ConsistentRead=True,
            )
        except ClientError as exc:
            raise translate(exc, "lease") from exc
        return [codec.decode_lane(attrs) for attrs in codec.rows(reply)]

    def with_lanes(self, queue: str, partition: int, head: PartitionHead) -> PartitionHead:
        if not head.has_lanes:
            return head  # no lane was ever registered: no request (FIFO queues)
        registered = dict(head.band_registered)
        cursors = dict(head.band_cursors)
        sweeps = dict(head.band_sweeps)
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :lanes)",
            "ExpressionAttributeValues": {
                ":pk": {"S": schema.partition_key(queue, partition)},
                ":lanes": {"S": schema.LANE_PREFIX},
            },
            "ConsistentRead": True,
        }
        for attrs in self._query_all(kwargs, "lanes"):
            lane = codec.decode_lane(attrs)
            registered[lane.lane] = lane.registered
            if schema.LANE_CURSOR in attrs:
                cursors[lane.lane] = attrs[schema.LANE_CURSOR]["S"]
            if schema.LANE_SWEEP in attrs:
                sweeps[lane.lane] = attrs[schema.LANE_SWEEP]["S"]
        return replace(head, band_registered=registered, band_cursors=cursors, band_sweeps=sweeps)

    def group_ledgers(self, queue: str, partition: int, groups: Sequence[str]) -> dict[str, GroupLedger]:
        wanted = list(dict.fromkeys(groups))
        keys = [codec.ledger_key(queue, partition, group) for group in wanted]
        prefix = len(schema.LEDGER_PREFIX)
        found = {
            attrs[schema.SK]["S"][prefix:]: attrs
            for attrs in self._batch_get(keys, projection=None, operation="lease")
        }
        return {group: codec.decode_ledger(found.get(group)) for group in wanted}

    def claim_in_group(
        self,
        queue: str,
        partition: int,
        item_id: str,
        *,
        version: int,
        forget: Sequence[str],
        lease_deadline: datetime,
        now: datetime,
    ) -> Item | None:
        deadline = codec.num(lease_deadline)
        claim: dict[str, Any] = {
            "TableName": self._table,
            "Key": codec.item_key(queue, partition, item_id),
            "UpdateExpression": expressions.CLAIM_UPDATE,
            "ConditionExpression": expressions.CLAIM_CONDITION,
            "ExpressionAttributeNames": expressions.CLAIM_NAMES,
            "ExpressionAttributeValues": {":deadline": deadline, ":now": codec.num(now), ":one": {"N": "1"}},
        }
        names = {**expressions.LEDGER_NAMES, "#e": schema.ledger_entry(item_id)}
        values: dict[str, Any] = {":deadline": deadline, ":next": {"N": str(version + 1)}}
        update = "SET #e = :deadline, #v = :next"
        dropped = [f for f in dict.fromkeys(forget) if f != item_id][:_LEDGER_REMOVALS]
        if dropped:
            for index, forgotten in enumerate(dropped):
                names[f"#f{index}"] = schema.ledger_entry(forgotten)
            update += " REMOVE " + ", ".join(f"#f{index}" for index in range(len(dropped)))
        if version:
            condition = expressions.LEDGER_VERSION_CONDITION
            values[":version"] = {"N": str(version)}
        else:
            condition = expressions.LEDGER_NEW_CONDITION
        ledger: dict[str, Any] = {
            "TableName": self._table,
            "Key": codec.ledger_key(queue, partition, ledger_group(item_id)),
            "UpdateExpression": update,
            "ConditionExpression": condition,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
        }
        for attempt in range(_TRANSACTION_RETRIES + 1):
            try:
                # The stubs' TypedDicts want literal keys; the dicts above are built incrementally.
                transaction: Any = [{"Update": claim}, {"Update": ledger}]
                self._client.transact_write_items(TransactItems=transaction)
            except ClientError as exc:
                reasons = [r.get("Code", "") for r in exc.response.get("CancellationReasons", [])]
                cancelled = error_code(exc) == "TransactionCanceledException"
                if cancelled and "ConditionalCheckFailed" in reasons:
                    return None  # the item was taken, or the ledger moved on: the caller reads again
                if cancelled and "TransactionConflict" in reasons and attempt < _TRANSACTION_RETRIES:
                    self._sleep(random.uniform(0, 0.01 * 2**attempt))  # noqa: S311
                    continue
                raise translate(exc, "lease") from exc
            # A transaction returns no attributes: the item is read back (strongly consistent).
            return self.get(queue, partition, item_id)
        return None  # pragma: no cover - the loop returns or raises

    def forget_leases(self, queue: str, partition: int, ids: Sequence[str]) -> None:
        by_group: dict[str, list[str]] = defaultdict(list)
        for item_id in dict.fromkeys(ids):
            if is_group_lane(lane_of(item_id)):
                by_group[ledger_group(item_id)].append(item_id)
        removals = [
            (group, members[start : start + _LEDGER_REMOVALS])
            for group, members in by_group.items()
            for start in range(0, len(members), _LEDGER_REMOVALS)
        ]

        def remove(removal: tuple[str, list[str]]) -> None:
            group, members = removal
            names = {**expressions.LEDGER_NAMES}
            for index, item_id in enumerate(members):
                names[f"#e{index}"] = schema.ledger_entry(item_id)
            try:
                self._client.update_item(
                    TableName=self._table,
                    Key=codec.ledger_key(queue, partition, group),
                    UpdateExpression="REMOVE " + ", ".join(f"#e{index}" for index in range(len(members))),
                    # No version check (a removal frees a slot, it never takes one); no new row.
                    ConditionExpression=expressions.LEDGER_EXISTS_CONDITION,
                    ExpressionAttributeNames=names,
                )
            except ClientError as exc:
                if error_code(exc) != CONDITION_FAILED:
                    log.warning("ledger of %s~%d/%s not updated: %s", queue, partition, group, exc)
            except QueratorError as exc:
                log.warning("ledger of %s~%d/%s not updated: %s", queue, partition, group, exc)

        self._each(remove, removals)
