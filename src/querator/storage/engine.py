"""Storage layer: the ``ItemStore`` port's semantics over sorted rows, shared by the embedded stores.

The in-memory and SQLite stores differ only in where rows live (``Rows``); what each port method
means (guards, counters, marks, lease records, idempotency) is written once here, after the
DynamoDB store, which is the reference (docs/adr/0060-embedded-stores.md). Every port method runs
in one transaction of the backing store, so each guarded write is atomic, and the head row's
counters change in the same transaction as the items (no drift, unlike DynamoDB's separate write).
Every read is a key range of what the caller needs: O(log n + k), never O(what the partition holds),
except ``iter_items`` and ``source_ids``, as in the reference.
"""

from __future__ import annotations

import secrets
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from querator.domain import ratelimit
from querator.domain.ids import ITEMS_END, key_after, time_key, visible_bound
from querator.domain.model import timestamp_us
from querator.domain.priority import band_of, band_start, held_end, is_group_lane, lane_of, ledger_group
from querator.ports import (
    BatchResult,
    GroupLedger,
    Guard,
    IdempotencyRecord,
    Lane,
    LeaseRecord,
    Page,
    PartitionHead,
    Recount,
)
from querator.storage.counters import (
    CounterDeltas,
    scheduled_until_claimed,
    scheduled_when_written,
    still_scheduled,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence
    from contextlib import AbstractContextManager
    from datetime import datetime

    from querator.domain.model import Item, ItemState
    from querator.domain.ratelimit import Grant, RateLimit
    from querator.ports import Move


class Rows(Protocol):
    """One transaction's view of a store's rows; ranges are ``[start, end)`` in id order."""

    def head(self, queue: str, partition: int) -> PartitionHead: ...

    def write_head(self, queue: str, partition: int, head: PartitionHead) -> None: ...

    def item(self, queue: str, partition: int, item_id: str) -> Item | None: ...

    def put(self, queue: str, partition: int, item: Item) -> None: ...

    def remove(self, queue: str, partition: int, item_id: str) -> None: ...

    def items(self, queue: str, partition: int, start: str, end: str, limit: int) -> list[Item]: ...

    def states(self, queue: str, partition: int, start: str, end: str, limit: int) -> list[ItemState]: ...

    def records_due(self, queue: str, partition: int, below: str, limit: int) -> list[LeaseRecord]:
        """Lease records with keys below ``below``, in key (deadline) order."""
        ...

    def put_record(self, queue: str, partition: int, record: LeaseRecord) -> None: ...

    def drop_record(self, queue: str, partition: int, key: str) -> None: ...

    def purge(self, queue: str, partition: int, limit: int) -> int:
        """Delete up to ``limit`` rows of the partition (items, lease records, head); how many."""
        ...

    def idempotency(self, queue: str, key: str) -> tuple[IdempotencyRecord, int] | None:
        """The record and its expiry (epoch seconds)."""
        ...

    def put_idempotency(self, queue: str, record: IdempotencyRecord, expires_s: int) -> None: ...

    def drop_expired_idempotency(self, now_s: int, limit: int) -> None:
        """Delete up to ``limit`` idempotency records that expired before ``now_s``, oldest first."""
        ...

    def bucket(self, queue: str, key: str) -> int | None:
        """A lease rate-limit bucket's ``tat`` (``None``: never taken from)."""
        ...

    def put_bucket(self, queue: str, key: str, tat_us: int) -> None: ...


#: Expired idempotency records deleted with each new one.
_EXPIRED_PER_WRITE = 4


def lease_record_key(deadline: datetime) -> str:
    """The deadline as an id's time prefix (so records sort by deadline) and a unique suffix."""
    return f"{time_key(deadline)}{secrets.token_hex(8)}"


def _guard_holds(item: Item | None, guard: Guard, now: datetime) -> bool:
    """``guard`` (``querator.ports.Guard``) on the item as it is now; the same races as the
    reference's condition expressions (``storage.dynamodb.expressions``)."""
    if guard is Guard.ANY:
        return True
    if item is None:
        return False
    if guard is Guard.NEVER_LEASED:
        return item.lease_deadline is None
    if guard is Guard.LEASE_VALID:
        return item.lease_deadline is not None and item.lease_deadline > now
    if guard is Guard.LEASE_EXPIRED:
        return item.lease_deadline is not None and item.lease_deadline <= now
    return item.lease_deadline is None or item.lease_deadline <= now  # NOT_VALIDLY_LEASED


def _lanes_of(ids: Iterable[str]) -> set[str]:
    """The bands (other than priority 5's) and group lanes that ``ids`` need named."""
    lanes: set[str] = set()
    for item_id in ids:
        lane = lane_of(item_id)
        lanes |= {lane, band_of(lane)}
    return lanes - {""}


def _with_bands(head: PartitionHead, ids: Iterable[str], now: datetime) -> PartitionHead:
    """``head`` naming the bands and group lanes of ``ids`` (priority 5's band is always known),
    registered at ``now``."""
    lanes = _lanes_of(ids)
    if not lanes:
        return head
    registered = {**head.band_registered, **dict.fromkeys(lanes, now)}
    has_lanes = head.has_lanes or any(is_group_lane(lane) for lane in lanes)
    return replace(head, band_registered=registered, has_lanes=has_lanes)


def _with_cursor(head: PartitionHead, cursor: str) -> PartitionHead:
    lane = lane_of(cursor)
    if lane == "":
        return replace(head, cursor=cursor)
    return replace(head, band_cursors={**head.band_cursors, lane: cursor})


def _lane_cursor(head: PartitionHead, lane: str) -> str:
    """The cursor of ``lane`` as stored (``""``: it never moved)."""
    return head.cursor if lane == "" else head.band_cursors.get(lane, "")


def _admitting(head: PartitionHead, ids: Iterable[str]) -> PartitionHead:
    """``head`` with each lane's cursor pulled back to the oldest of ``ids`` written below it.

    Ids are minted before the write transaction begins; one that waited for the write lock (another
    writer of the same file held it) can land below a cursor that a lease moved meanwhile, where no
    lease would read it until the sweep, two minutes later. Pulled back in the same transaction as
    the write, the cursor keeps its promise (every id below it is leased, being settled or gone) and
    the late item is the next one leased, in FIFO order. The next lease re-reads what lies between
    (what was claimed while the writer waited).
    """
    oldest: dict[str, str] = {}
    for item_id in ids:
        lane = lane_of(item_id)
        if item_id < oldest.get(lane, ITEMS_END):
            oldest[lane] = item_id
    for lane, item_id in oldest.items():
        if item_id < _lane_cursor(head, lane):
            head = _with_cursor(head, item_id)
    return head


def _with_sweep(head: PartitionHead, mark: str) -> PartitionHead:
    lane = lane_of(mark)
    if lane == "":
        return replace(head, sweep=mark)
    return replace(head, band_sweeps={**head.band_sweeps, lane: mark})


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


class SortedRowsStore:
    """``ItemStore`` over ``Rows``; subclasses provide ``_read`` and ``_write`` transactions."""

    def _read(self) -> AbstractContextManager[Rows]:
        raise NotImplementedError

    def _write(self) -> AbstractContextManager[Rows]:
        raise NotImplementedError

    # -- writes of new items ---------------------------------------------------------------------

    def put_new(self, queue: str, partition: int, items: Sequence[Item], *, now: datetime) -> None:
        with self._write() as rows:
            for item in items:
                rows.put(queue, partition, item)
            self._count_added(rows, queue, partition, items, now)

    def put_absent(
        self, queue: str, partition: int, items: Sequence[Item], *, now: datetime
    ) -> BatchResult[str]:
        result: BatchResult[str] = BatchResult()
        with self._write() as rows:
            written = []
            for item in items:
                # A put never replaces a live item (the reference's PUT_ABSENT_CONDITION).
                if rows.item(queue, partition, item.id) is None:
                    rows.put(queue, partition, item)
                    written.append(item)
                    result.applied.append(item.id)
                else:
                    result.rejected.append(item.id)
            self._count_added(rows, queue, partition, written, now)
        return result

    @staticmethod
    def _count_added(rows: Rows, queue: str, partition: int, items: Sequence[Item], now: datetime) -> None:
        counts = CounterDeltas()
        for item in items:
            counts.add(
                item.created_at,
                sign=1,
                leased=item.lease_deadline is not None,
                scheduled=scheduled_when_written(item, now),
            )
        # Every write of new items is production (produce, its resumption, import), as in the reference.
        counts.produced = counts.items
        if counts.items:
            head = rows.head(queue, partition)
            # The schedule mark starts at the partition's first write (as in the reference).
            mark = head.schedule_mark or visible_bound(now)
            # ... and so does the clock of its first recount, a recount period later.
            recounted = head.recounted_at or now
            rows.write_head(
                queue,
                partition,
                _admitting(
                    _with_bands(
                        counts.applied(head, schedule_mark=mark, recounted_at=recounted),
                        (item.id for item in items),
                        now,
                    ),
                    (item.id for item in items),
                ),
            )

    # -- reads -----------------------------------------------------------------------------------

    def head(
        self, queue: str, partition: int, *, now: datetime, records: int = 0
    ) -> tuple[PartitionHead, list[LeaseRecord]]:
        with self._read() as rows:
            due = rows.records_due(queue, partition, visible_bound(now), records) if records else []
            return rows.head(queue, partition), due

    def heads(self, queue: str, partitions: Sequence[int]) -> list[PartitionHead]:
        with self._read() as rows:
            return [rows.head(queue, p) for p in partitions]

    def scan(
        self,
        queue: str,
        partition: int,
        *,
        start: str,
        end: str,
        limit: int,
        available_at: datetime | None = None,
        never_leased: bool = False,
        scheduled_only: bool = False,
    ) -> Page:
        if start >= end:
            return Page(read_to=end)
        with self._read() as rows:
            # One more than the limit tells whether the range ended (DynamoDB may say "not done" on
            # an exact fit; the caller reads an empty page then, here it need not).
            read = rows.states(queue, partition, start, end, limit + 1)
        done = len(read) <= limit
        read = read[:limit]
        found = [
            s
            for s in read
            if (available_at is None or s.lease_deadline is None or s.lease_deadline <= available_at)
            and (not never_leased or s.lease_deadline is None)
            and (not scheduled_only or s.enqueue_at is not None)
        ]
        return Page(
            items=found, read_to=end if done else key_after(read[-1].id), done=done, evaluated=len(read)
        )

    def states(self, queue: str, partition: int, ids: Sequence[str]) -> list[ItemState]:
        with self._read() as rows:
            found = (rows.item(queue, partition, i) for i in dict.fromkeys(ids))
            return [item.state() for item in found if item is not None]

    def get_many(self, queue: str, partition: int, ids: Sequence[str]) -> dict[str, Item]:
        with self._read() as rows:
            found = (rows.item(queue, partition, i) for i in dict.fromkeys(ids))
            return {item.id: item for item in found if item is not None}

    def get(self, queue: str, partition: int, item_id: str) -> Item | None:
        with self._read() as rows:
            return rows.item(queue, partition, item_id)

    def list_items(
        self,
        queue: str,
        partition: int,
        *,
        limit: int,
        pivot: str = "",
        lower: str = "",
        upper: str = "",
        max_bytes: int | None = None,
    ) -> list[Item]:
        start, end = max(pivot, lower), upper or ITEMS_END
        if start >= end:
            return []
        with self._read() as rows:
            found = rows.items(queue, partition, start, end, limit)
        if max_bytes is None:
            return found
        kept: list[Item] = []
        size = 0
        for item in found:
            size += len(item.payload)
            if kept and size > max_bytes:
                break
            kept.append(item)
        return kept

    def iter_items(self, queue: str, partition: int, *, page_size: int = 500) -> Iterator[Item]:
        pivot = ""
        while True:
            page = self.list_items(queue, partition, limit=page_size + 1, pivot=pivot)
            yield from page[:page_size]
            if len(page) <= page_size:
                return
            pivot = page[page_size].id

    def source_ids(self, queue: str, partition: int) -> set[str]:
        return {item.source_id for item in self.iter_items(queue, partition) if item.source_id}

    # -- leases ----------------------------------------------------------------------------------

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

    def lanes(self, queue: str, partition: int, band: str, *, after: str, limit: int) -> list[Lane]:
        with self._read() as rows:
            head = rows.head(queue, partition)
        found = sorted(
            lane
            for lane in head.band_registered
            if is_group_lane(lane) and band_of(lane) == band and lane > after
        )[:limit]
        return [
            Lane(lane=lane, cursor=head.cursor_in(lane), registered=head.band_registered[lane])
            for lane in found
        ]

    def with_lanes(self, queue: str, partition: int, head: PartitionHead) -> PartitionHead:
        return head  # the head row holds them already

    def group_ledgers(self, queue: str, partition: int, groups: Sequence[str]) -> dict[str, GroupLedger]:
        with self._read() as rows:
            ledgers = rows.head(queue, partition).group_ledgers
        return {group: ledgers.get(group, GroupLedger()) for group in groups}

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
        group = ledger_group(item_id)
        with self._write() as rows:
            head = rows.head(queue, partition)
            ledger = head.group_ledgers.get(group, GroupLedger())
            if ledger.version != version:
                return None
            item = rows.item(queue, partition, item_id)
            if item is None or item.lease_deadline is not None or item.expire_deadline <= now:
                return None
            leased = replace(item, lease_deadline=lease_deadline, attempts=item.attempts + 1)
            rows.put(queue, partition, leased)
            leases = {i: d for i, d in ledger.leases.items() if i not in set(forget)}
            leases[item_id] = lease_deadline
            ledgers = {**head.group_ledgers, group: GroupLedger(version=version + 1, leases=leases)}
            rows.write_head(queue, partition, replace(head, group_ledgers=ledgers))
        return leased

    def forget_leases(self, queue: str, partition: int, ids: Sequence[str]) -> None:
        by_group: dict[str, set[str]] = {}
        for item_id in ids:
            if is_group_lane(lane_of(item_id)):
                by_group.setdefault(ledger_group(item_id), set()).add(item_id)
        if not by_group:
            return
        with self._write() as rows:
            head = rows.head(queue, partition)
            ledgers = dict(head.group_ledgers)
            for group, gone in by_group.items():
                if group in ledgers:
                    old = ledgers[group]
                    leases = {i: d for i, d in old.leases.items() if i not in gone}
                    ledgers[group] = GroupLedger(version=old.version, leases=leases)
            rows.write_head(queue, partition, replace(head, group_ledgers=ledgers))

    def register_bands(self, queue: str, partition: int, ids: Iterable[str], *, now: datetime) -> None:
        ids = list(ids)
        if not _lanes_of(ids):
            return
        with self._write() as rows:
            rows.write_head(queue, partition, _with_bands(rows.head(queue, partition), ids, now))

    def drop_band(self, queue: str, partition: int, band: str, *, registered_before: datetime) -> bool:
        with self._write() as rows:
            head = rows.head(queue, partition)
            registered = head.band_registered.get(band)
            if registered is None or registered >= registered_before:
                return False
            # One transaction: the band is empty now, and no write can land in it unnamed.
            if rows.states(queue, partition, band_start(band), held_end(band), 1):
                return False
            remaining = {b: t for b, t in head.band_registered.items() if b != band}
            rows.write_head(queue, partition, replace(head, band_registered=remaining))
        return True

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

    # -- removals and moves ----------------------------------------------------------------------

    def delete(
        self,
        queue: str,
        partition: int,
        ids: Sequence[str],
        *,
        guard: Guard,
        now: datetime,
        completed: bool = False,
    ) -> BatchResult[str]:
        result: BatchResult[str] = BatchResult()
        counts = CounterDeltas()
        with self._write() as rows:
            mark = rows.head(queue, partition).schedule_mark
            for item_id in dict.fromkeys(ids):
                item = rows.item(queue, partition, item_id)
                if not _guard_holds(item, guard, now):
                    result.rejected.append(item_id)
                    continue
                result.applied.append(item_id)
                if item is None:
                    continue  # Guard.ANY: gone already is fine
                rows.remove(queue, partition, item_id)
                counts.add(
                    item.created_at,
                    sign=-1,
                    leased=item.lease_deadline is not None,
                    scheduled=still_scheduled(item, mark),
                )
            if completed:
                counts.completed = -counts.items
            if counts.items:
                rows.write_head(queue, partition, counts.applied(rows.head(queue, partition)))
        return result

    def move(
        self, queue: str, partition: int, moves: Sequence[Move], *, guard: Guard, now: datetime
    ) -> BatchResult[str]:
        result: BatchResult[str] = BatchResult()
        deltas: dict[tuple[str, int], CounterDeltas] = {}
        with self._write() as rows:
            mark = rows.head(queue, partition).schedule_mark
            for move in moves:
                item = rows.item(queue, partition, move.item.id)
                target = (move.target_queue, move.target_partition)
                # Delete in the guarded state and put where nothing lives, or neither (a transaction).
                if (
                    not _guard_holds(item, guard, now)
                    or item is None
                    or rows.item(*target, move.replacement.id)
                ):
                    result.rejected.append(move.item.id)
                    continue
                rows.remove(queue, partition, item.id)
                rows.put(*target, move.replacement)
                result.applied.append(move.item.id)
                deltas.setdefault((queue, partition), CounterDeltas()).add(
                    item.created_at,
                    sign=-1,
                    leased=item.lease_deadline is not None,
                    scheduled=still_scheduled(item, mark),
                )
                deltas.setdefault(target, CounterDeltas()).add(
                    move.replacement.created_at,
                    sign=1,
                    leased=move.replacement.lease_deadline is not None,
                    scheduled=scheduled_when_written(move.replacement, now),
                )
            arrived: dict[tuple[str, int], list[str]] = {}
            for move in moves:
                if move.item.id in result.applied:
                    target = (move.target_queue, move.target_partition)
                    arrived.setdefault(target, []).append(move.replacement.id)
            for (target_queue, target_partition), counts in deltas.items():
                head = counts.applied(rows.head(target_queue, target_partition))
                if (target_queue, target_partition) != (queue, partition) and not head.schedule_mark:
                    head = replace(head, schedule_mark=visible_bound(now))
                came = arrived.get((target_queue, target_partition), [])
                head = _admitting(_with_bands(head, came, now), came)
                rows.write_head(target_queue, target_partition, head)
        return result

    def purge_page(self, queue: str, partition: int, *, limit: int) -> int:
        with self._write() as rows:
            return rows.purge(queue, partition, limit)

    # -- the reaper's marks ----------------------------------------------------------------------

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
        with self._write() as rows:
            head = rows.head(queue, partition)
            # Of two reapers that counted the same range, the second finds the mark moved.
            if head.schedule_mark != old_mark:
                return 0
            came = CounterDeltas()
            for band in bands:
                start, end = band + old_mark, band + new_mark
                while start < end:
                    read = rows.states(queue, partition, start, end, 1000)
                    for state in read:
                        # A leased one left the scheduled count when it was claimed (note_leased).
                        if state.enqueue_at is not None and state.lease_deadline is None:
                            came.add(state.created_at, sign=-1, leased=False, scheduled=True)
                    if len(read) < 1000:
                        break
                    start = key_after(read[-1].id)
            came.items = came.created = 0
            rows.write_head(queue, partition, replace(came.applied(head), schedule_mark=new_mark))
        return -came.scheduled

    def set_sweep(self, queue: str, partition: int, mark: str) -> None:
        with self._write() as rows:
            rows.write_head(queue, partition, _with_sweep(rows.head(queue, partition), mark))

    def save_recount(self, queue: str, partition: int, recount: Recount | None) -> None:
        with self._write() as rows:
            rows.write_head(queue, partition, replace(rows.head(queue, partition), recount=recount))

    def finish_recount(self, queue: str, partition: int, recount: Recount, *, now: datetime) -> bool:
        with self._write() as rows:
            head = rows.head(queue, partition)
            if head.version != recount.version:
                # A write overtook the recount: its deltas are in the counters, not in the recount.
                rows.write_head(queue, partition, replace(head, recount=None))
                return False
            rows.write_head(
                queue,
                partition,
                replace(
                    head,
                    items=recount.items,
                    leased=recount.leased,
                    scheduled=recount.scheduled,
                    created_sum=recount.created_sum,
                    leased_created_sum=recount.leased_created_sum,
                    scheduled_created_sum=recount.scheduled_created_sum,
                    recount=None,
                    recounted_at=now,
                ),
            )
            return True

    # -- lease rate limits ------------------------------------------------------------------------

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

    # -- idempotent produce ----------------------------------------------------------------------

    def begin_idempotent(
        self, queue: str, record: IdempotencyRecord, *, stale_before: datetime, expires_at: datetime
    ) -> tuple[bool, IdempotencyRecord | None]:
        with self._write() as rows:
            # What DynamoDB's TTL does: a few expired records go with each new one, so they never pile
            # up faster than they are written.
            rows.drop_expired_idempotency(int(record.started_at.timestamp()), _EXPIRED_PER_WRITE)
            found = rows.idempotency(queue, record.key)
            previous = None if found is None else found[0]
            # A retry finds the first request's record unless it belongs to an earlier queue of the
            # same name, expired, or its writer died while pending (the reference's IDEM_BEGIN).
            if found is not None and previous is not None:
                live = (
                    previous.queue_created_at == record.queue_created_at
                    and found[1] >= int(record.started_at.timestamp())
                    and (previous.done or previous.started_at >= stale_before)
                )
                if live:
                    return False, previous
            rows.put_idempotency(queue, record, int(expires_at.timestamp()))
        return True, previous

    def finish_idempotent(
        self, queue: str, key: str, *, partition: int, ids: Sequence[str], done: bool = True
    ) -> None:
        with self._write() as rows:
            found = rows.idempotency(queue, key)
            if found is not None:
                finished = replace(found[0], done=done, partition=partition, ids=list(ids))
                rows.put_idempotency(queue, finished, found[1])
