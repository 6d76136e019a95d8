"""Storage layer, the embedded stores' leasing role: lease records, claims, the lease cursor,
renewals, and lease rate-limit tokens."""

from __future__ import annotations

import secrets
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from querator.domain import ratelimit
from querator.domain.ids import time_key
from querator.domain.model import timestamp_us
from querator.domain.priority import band_of, band_start, lane_of
from querator.ports import BatchResult, Guard, LeaseRecord, PartitionHead
from querator.storage.counters import CounterDeltas, scheduled_until_claimed
from querator.storage.embedded.base import Rows, RowsStoreBase, _guard_holds

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from querator.domain.model import Item
    from querator.domain.ratelimit import Grant, RateLimit


def lease_record_key(deadline: datetime) -> str:
    """The deadline as an id's time prefix (so records sort by deadline) and a unique suffix."""
    return f"{time_key(deadline)}{secrets.token_hex(8)}"


def _with_cursor(head: PartitionHead, cursor: str) -> PartitionHead:
    lane = lane_of(cursor)
    if lane == "":
        return replace(head, cursor=cursor)
    return replace(head, band_cursors={**head.band_cursors, lane: cursor})


def _lane_cursor(head: PartitionHead, lane: str) -> str:
    """The cursor of ``lane`` as stored (``""``: it never moved)."""
    return head.cursor if lane == "" else head.band_cursors.get(lane, "")


#: Most ids a cursor move checks for a never-leased item it would pass; it stops after them.
_CURSOR_CHECK = 1000


def open_before(rows: Rows, queue: str, partition: int, head: PartitionHead, cursor: str) -> str:
    """Where a lease may move its lane's cursor to, at most ``cursor``: not past a never-leased item.

    The lease chose ``cursor`` from what it read, but a write that waited for the lock may have landed
    in that range since (its cursor pull-back then undone by this move): checked here, in the move's
    own transaction, over the ids the lease just read past, O(what it read).
    """
    lane = lane_of(cursor)
    start = max(_lane_cursor(head, lane), band_start(band_of(lane)), lane)
    if cursor <= start:
        return cursor
    passed = rows.states(queue, partition, start, cursor, _CURSOR_CHECK)
    for state in passed:
        if state.lease_deadline is None:
            return state.id
    return cursor if len(passed) < _CURSOR_CHECK else passed[-1].id


class RowsLeasing(RowsStoreBase):
    """``LeasingPort`` over ``Rows``."""

    def record_lease(self, queue: str, partition: int, ids: Sequence[str], *, deadline: datetime) -> str:
        key = lease_record_key(deadline)
        with self._write() as rows:
            rows.put_record(queue, partition, LeaseRecord(key=key, deadline=deadline, ids=list(ids)))
        return key

    def drop_lease_record(self, queue: str, partition: int, key: str) -> None:
        with self._write() as rows:
            rows.drop_record(queue, partition, key)

    def claim(
        self, queue: str, partition: int, ids: Sequence[str], *, lease_deadline: datetime, now: datetime
    ) -> BatchResult[Item]:
        result: BatchResult[Item] = BatchResult()
        with self._write() as rows:
            for item_id in ids:
                item = rows.item(queue, partition, item_id)
                # An id is leased at most once (of two racing consumers only the first wins); an
                # item past its expire deadline is the reaper's (the reference's CLAIM_CONDITION).
                if item is None or item.lease_deadline is not None or item.expire_deadline <= now:
                    result.rejected.append(item_id)
                    continue
                leased = replace(item, lease_deadline=lease_deadline, attempts=item.attempts + 1)
                rows.put(queue, partition, leased)
                result.applied.append(leased)
        return result

    def note_leased(
        self,
        queue: str,
        partition: int,
        items: Sequence[Item],
        *,
        cursor: str | None,
        ring: tuple[str, str] | None = None,
    ) -> None:
        if not items and cursor is None and ring is None:
            return
        with self._write() as rows:
            self._note_leased_in(rows, queue, partition, items, cursor=cursor, ring=ring)

    @staticmethod
    def _note_leased_in(
        rows: Rows,
        queue: str,
        partition: int,
        items: Sequence[Item],
        *,
        cursor: str | None,
        ring: tuple[str, str] | None,
    ) -> None:
        """``note_leased`` inside a transaction already open."""
        head = rows.head(queue, partition)
        counts = CounterDeltas()
        for item in items:
            # By the mark in this transaction: a schedule pass counts only items never leased.
            counts.lease(item.created_at, was_scheduled=scheduled_until_claimed(item, head.schedule_mark))
        head = counts.applied(head)
        if cursor is not None:
            head = _with_cursor(head, open_before(rows, queue, partition, head, cursor))
        if ring is not None:
            head = replace(head, rings={**head.rings, ring[0]: ring[1]})
        rows.write_head(queue, partition, head)

    def set_next_priority(
        self, queue: str, partition: int, ids: Sequence[str], *, priority: int, now: datetime
    ) -> BatchResult[str]:
        return self._change_leased(queue, partition, ids, now, next_priority=priority)

    def renew(
        self, queue: str, partition: int, ids: Sequence[str], *, lease_deadline: datetime, now: datetime
    ) -> BatchResult[str]:
        return self._change_leased(queue, partition, ids, now, lease_deadline=lease_deadline)

    def _change_leased(
        self, queue: str, partition: int, ids: Sequence[str], now: datetime, **changes: Any
    ) -> BatchResult[str]:
        """``changes`` on each item whose lease is still valid (rejected: the others), in one transaction."""
        result: BatchResult[str] = BatchResult()
        with self._write() as rows:
            for item_id in ids:
                item = rows.item(queue, partition, item_id)
                if item is None or not _guard_holds(item, Guard.LEASE_VALID, now):
                    result.rejected.append(item_id)
                    continue
                rows.put(queue, partition, replace(item, **changes))
                result.applied.append(item_id)
        return result

    def take_tokens(self, queue: str, bucket: str, *, wanted: int, limit: RateLimit, now: datetime) -> Grant:
        with self._write() as rows:
            grant = ratelimit.take(rows.bucket(queue, bucket), timestamp_us(now), wanted, limit)
            if grant.granted:
                rows.put_bucket(queue, bucket, grant.tat_us)
        return grant

    def return_tokens(self, queue: str, bucket: str, *, count: int, limit: RateLimit) -> None:
        with self._write() as rows:
            tat = ratelimit.give_back(rows.bucket(queue, bucket), count, limit)
            if tat is not None:
                rows.put_bucket(queue, bucket, tat)
