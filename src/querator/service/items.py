"""Calls on items by id: complete, retry and renew leased items; list, import and delete stored ones."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING

from querator.domain import lifecycle, reasons
from querator.domain.errors import InvalidRequestError
from querator.domain.ids import parse_item_id, visible_at_of, visible_bound
from querator.domain.lifecycle import Action
from querator.domain.model import (
    MAX_BATCH,
    MAX_PAYLOAD_BYTES,
    ROW_PAYLOAD_BYTES,
    BatchOutcome,
    IdFailure,
    Item,
    Renewal,
    RenewOutcome,
    Reprioritized,
    check_aware,
    check_payload_limit,
    resolve_time,
)
from querator.domain.positions import POSITION_MARK
from querator.domain.priority import band_end, band_start, priority_of, validate_priority
from querator.ports import Guard, Move
from querator.ports.log import LogKey
from querator.service.logs import is_log_id, log_end
from querator.service.queues import check_partition
from querator.service.tuning import LISTING_PAYLOAD_BYTES, NOT_LEASED, UNKNOWN_ITEM

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from datetime import datetime

    from querator.domain.ids import IdFactory
    from querator.domain.model import QueueInfo, RetryRequest, StorageItem
    from querator.ports import Clock, ItemStore
    from querator.service.logs import Logs
    from querator.service.queues import QueueDirectory
    from querator.service.settle import Settler


#: Payload bytes a page of a log that an import reads for the ``source_id`` it holds may take in memory.
SOURCE_ID_PAGE_BYTES = 4_000_000


class ItemCalls:
    """complete / retry / renew (the holder of a lease) and the storage calls (an operator)."""

    def __init__(
        self,
        store: ItemStore,
        queues: QueueDirectory,
        settler: Settler,
        clock: Clock,
        ids: IdFactory,
        logs: Logs | None = None,
    ) -> None:
        self._store = store
        self._logs = logs
        self._queues = queues
        self._settler = settler
        self._clock = clock
        self._ids = ids

    def complete(self, queue_name: str, partition: int, ids: Sequence[str]) -> BatchOutcome:
        """Delete leased items; ids that are unknown, stale or not leased are reported as failed."""
        queue, valid, failed = self._leased_ids(queue_name, partition, ids)
        now = self._clock.now()
        logged, valid_v2 = self._split(valid)
        done = (
            self._logs.complete(queue, partition, logged, now) if self._logs is not None and logged else set()
        )
        if valid_v2:
            result = self._store.delete(
                queue.name, partition, valid_v2, guard=Guard.LEASE_VALID, now=now, completed=True
            )
            self._free_slots(queue, partition, result.applied)
            done |= set(result.applied)
        return BatchOutcome(
            applied=[i for i in valid if i in done],
            failed=failed + [IdFailure(id=i, reason=NOT_LEASED) for i in valid if i not in done],
        )

    def _split(self, ids: Sequence[str]) -> tuple[list[str], list[str]]:
        """``ids`` as (engine v3's, engine v2's). Without logs every id is v2's: a v3 id then names
        nothing the store holds and fails as any unknown id does."""
        if self._logs is None:
            return [], list(ids)
        return [i for i in ids if is_log_id(i)], [i for i in ids if not is_log_id(i)]

    def retry(self, queue_name: str, partition: int, requests: Sequence[RetryRequest]) -> BatchOutcome:
        """Put leased items back: at the tail, at ``retry_at``, or into the dead-letter queue.

        One batched read of the items and one concurrent round of moves, so 1,000 ids cost about
        70 round trips instead of 2,000 in a row.
        """
        queue, valid, failed = self._leased_ids(queue_name, partition, [r.id for r in requests])
        now = self._clock.now()
        wanted = {r.id: r for r in requests if r.id in valid}
        for request in wanted.values():
            if request.retry_at is not None:
                check_aware(request.retry_at, "retry_at")
            if request.retry_in is not None:
                # Counted from this call's clock, the one the item's lease and schedule are read by.
                retry_at = resolve_time(None, request.retry_in, now, "retry_in")
                wanted[request.id] = replace(request, retry_at=retry_at, retry_in=None)
        logged, _ = self._split(list(wanted))
        done: set[str] = set()
        if logged and self._logs is not None:
            done = self._logs.retry(queue, partition, [wanted.pop(i) for i in logged], now)
            failed += [IdFailure(id=i, reason=NOT_LEASED) for i in logged if i not in done]
        items = self._store.get_many(queue.name, partition, list(wanted)) if wanted else {}
        requeue: list[Move] = []
        dead: list[Item] = []
        # Each item as it goes back (or to the dead-letter queue), with the failure this retry records.
        failing: dict[str, Item] = {}
        for item_id, request in wanted.items():
            item = items.get(item_id)
            if item is None or not item.is_leased(now):
                failed.append(IdFailure(id=item_id, reason=NOT_LEASED))
                continue
            plan = lifecycle.plan_retry(request, item.attempts, queue, now)
            failing[item_id] = reasons.after_retry(item, plan, request.reason)
            if plan.action is Action.DEAD_LETTER:
                dead.append(item)
                continue
            assert plan.visible_at is not None  # noqa: S101 - plan_retry sets it for REQUEUE
            replacement = self._settler.requeued(queue, failing[item_id], plan.visible_at, request.priority)
            if plan.visible_at > now:
                replacement = replace(replacement, enqueue_at=plan.visible_at)
            requeue.append(
                Move(item=item, target_queue=queue.name, target_partition=partition, replacement=replacement)
            )
        attempted = [m.item.id for m in requeue] + [item.id for item in dead]
        if requeue:
            done |= set(
                self._store.move(queue.name, partition, requeue, guard=Guard.LEASE_VALID, now=now).applied
            )
        if dead:
            moved, _ = self._settler.dead_letter(
                queue, partition, dead, Guard.LEASE_VALID, now, entering=failing
            )
            done |= moved
        failed += [IdFailure(id=i, reason=NOT_LEASED) for i in attempted if i not in done]
        self._free_slots(queue, partition, [i for i in done if not is_log_id(i)])
        asked = dict.fromkeys(r.id for r in requests)
        return BatchOutcome(applied=[i for i in asked if i in done], failed=failed)

    def _free_slots(self, queue: QueueInfo, partition: int, ended: Sequence[str]) -> None:
        """In a capped fair queue, leases that ended leave their group's ledger at once (else their
        slot stays taken until their deadline)."""
        if queue.max_leased_per_group and ended:
            self._store.forget_leases(queue.name, partition, ended)

    def renew(
        self, queue_name: str, partition: int, ids: Sequence[str], *, lease_timeout: timedelta | None = None
    ) -> RenewOutcome:
        """Set valid leases to now + ``lease_timeout`` (default: the queue's).

        A lease record is filed under the new deadline first, so a renewed lease that later runs
        out is found like any other.

        Raises
        ------
        InvalidRequestError
            ``lease_timeout`` is not above zero, or is longer than the queue's ``expire_timeout``
            (nothing is renewed).
        """
        queue, valid, failed = self._leased_ids(queue_name, partition, ids)
        timeout = queue.lease_timeout if lease_timeout is None else lease_timeout
        if timeout <= timedelta(0):
            raise InvalidRequestError("lease_timeout must be greater than zero", field="lease_timeout")
        if timeout > queue.expire_timeout:
            # The rule a queue's own lease_timeout obeys. Refused, not capped (SQS's
            # ChangeMessageVisibility refuses past its 12 h too): a consumer that asked for more
            # than it gets would work on past its lease. Without it "2562047h" leased an item
            # until the year 2319, out of the reach of expire_timeout and dead-lettering.
            raise InvalidRequestError(
                f"lease_timeout may not be longer than the queue's expire_timeout "
                f"({_seconds(timeout)} > {_seconds(queue.expire_timeout)})",
                field="lease_timeout",
            )
        now = self._clock.now()
        deadline = now + timeout
        logged, valid_v2 = self._split(valid)
        renewed = (
            self._logs.renew(queue, partition, logged, deadline, now)
            if self._logs is not None and logged
            else set()
        )
        rejected = {i for i in logged if i not in renewed}
        if valid_v2:
            self._store.record_lease(queue.name, partition, valid_v2, deadline=deadline)
            rejected |= set(
                self._store.renew(queue.name, partition, valid_v2, lease_deadline=deadline, now=now).rejected
            )
        return RenewOutcome(
            queue_name=queue.name,
            partition=partition,
            items=[Renewal(id=i, lease_deadline=deadline) for i in valid if i not in rejected],
            failed=failed + [IdFailure(id=i, reason=NOT_LEASED) for i in valid if i in rejected],
        )

    def reprioritize(
        self, queue_name: str, partition: int, ids: Sequence[str], priority: int
    ) -> Reprioritized:
        """Give items a new priority: a waiting or scheduled item moves to the new priority's band
        under a new id (at the tail of that priority, or still at its scheduled time); a leased one
        keeps its id and lease and goes back to the queue with the new priority.

        One batched read and one round of guarded writes. An id that is unknown or gone fails
        (``IdFailure``); the others are applied. Ids of engine v3's logs follow the same rules
        there (``Logs.reprioritize``).
        """
        validate_priority(priority)
        queue, valid, failed = self._leased_ids(queue_name, partition, ids)
        now = self._clock.now()
        logged, valid_v2 = self._split(valid)
        result: dict[str, str] = {}
        if logged and self._logs is not None:
            result, log_failed = self._logs.reprioritize(queue, partition, logged, priority, now)
            failed += log_failed
        items = self._store.get_many(queue.name, partition, valid_v2) if valid_v2 else {}
        leased: list[str] = []
        moves: list[Move] = []
        for item_id in valid_v2:
            item = items.get(item_id)
            if item is None:
                failed.append(IdFailure(id=item_id, reason=UNKNOWN_ITEM))
            elif item.is_leased(now):
                leased.append(item_id)
            elif (
                decision := lifecycle.decide_for_lease(item.state(), queue, now)
            ).action is Action.DEAD_LETTER:
                # Its lease ran out on its last attempt (or its time is up) and nobody has settled it
                # yet: moving it would give it attempts past max_attempts. It goes where the next
                # lease would send it, and the id fails: the item is no longer in the queue.
                self._settler.settle(queue, partition, [(item.state(), decision)], now)
                failed.append(IdFailure(id=item_id, reason=UNKNOWN_ITEM))
            elif item.lease_deadline is None and item.priority == priority:
                result[item_id] = item_id
            else:
                # At its scheduled time if it has one still ahead, else at the tail of its new priority
                # (never behind that band's lease cursor, which a lease may have moved past its time).
                # A lease that ran out but was not put back yet may carry another priority to go
                # back with (given while it was leased): it moves now, even within its own band.
                # A lapsed lease goes with the failure it records, as the expiry path records it
                # (``Settler.requeue_move``); a waiting or scheduled item's decision records nothing.
                scheduled = item.enqueue_at is not None and visible_at_of(item_id) > now
                visible = visible_at_of(item_id) if scheduled else now
                replacement = replace(
                    reasons.after_decision(item, decision, now),
                    id=self._ids.new_id(visible, priority, queue.lane_for(item.group)),
                    lease_deadline=None,
                    enqueue_at=item.enqueue_at if scheduled else None,
                    next_priority=None,
                )
                moves.append(
                    Move(
                        item=item,
                        target_queue=queue.name,
                        target_partition=partition,
                        replacement=replacement,
                    )
                )
        if leased:
            marked = self._store.set_next_priority(queue.name, partition, leased, priority=priority, now=now)
            result.update({i: i for i in marked.applied})
            # Its lease ended between the read and the write: it is waiting again, try again.
            failed += [IdFailure(id=i, reason=NOT_LEASED) for i in marked.rejected]
        if moves:
            moved = self._store.move(queue.name, partition, moves, guard=Guard.NOT_VALIDLY_LEASED, now=now)
            done = set(moved.applied)
            for move in moves:
                if move.item.id in done:
                    result[move.item.id] = move.replacement.id
                else:
                    # Leased or gone since the read: the caller may look again and repeat.
                    failed.append(IdFailure(id=move.item.id, reason=UNKNOWN_ITEM))
        return Reprioritized(ids={i: result[i] for i in valid if i in result}, failed=failed)

    def _leased_ids(
        self, queue_name: str, partition: int, ids: Sequence[str]
    ) -> tuple[QueueInfo, list[str], list[IdFailure]]:
        if not 1 <= len(ids) <= MAX_BATCH:
            raise InvalidRequestError(f"ids must hold 1 to {MAX_BATCH} ids", field="ids")
        queue = self._queues.queue(queue_name)
        check_partition(queue, partition)
        valid: list[str] = []
        failed: list[IdFailure] = []
        for item_id in dict.fromkeys(ids):  # a repeated id is applied once
            try:
                valid.append(parse_item_id(item_id))
            except InvalidRequestError as exc:
                failed.append(IdFailure(id=item_id, reason=str(exc)))
        return queue, valid, failed

    # -- storage inspection -------------------------------------------------------------------------

    def list_items(
        self, queue_name: str, partition: int, *, pivot: str = "", limit: int = 1000
    ) -> list[Item]:
        """Items of one partition that are not scheduled, in lease order (priority, then FIFO) from
        ``pivot`` (inclusive).

        A page stops early rather than pass ``LISTING_PAYLOAD_BYTES`` of payload (``MAX_REPLY_BYTES``
        in base64); ``pivot`` continues it.
        """
        queue = self._listable(queue_name, partition, limit)
        bound = visible_bound(self._clock.now())
        return self._list_bands(
            queue, partition, pivot, limit, lambda band: (band_start(band), band + bound), scheduled=False
        )

    def list_scheduled(
        self, queue_name: str, partition: int, *, pivot: str = "", limit: int = 1000
    ) -> list[Item]:
        """Scheduled items of one partition, by priority, then in the order they become visible."""
        queue = self._listable(queue_name, partition, limit)
        bound = visible_bound(self._clock.now())
        return self._list_bands(
            queue, partition, pivot, limit, lambda band: (band + bound, band_end(band)), scheduled=True
        )

    def _list_bands(
        self,
        queue: QueueInfo,
        partition: int,
        pivot: str,
        limit: int,
        key_range: Callable[[str], tuple[str, str]],
        *,
        scheduled: bool,
    ) -> list[Item]:
        """Up to ``limit`` items of ``key_range`` in each band in use, bands in priority order, from
        ``pivot`` on: one head read, then a Query per band the page reaches. With engine v3's logs,
        each band's log follows its v2 range (v3 ids sort after v2's within a band)."""
        head, _ = self._store.head(queue.name, partition, now=self._clock.now())
        if head.has_lanes:
            head = self._store.with_lanes(queue.name, partition, head)
        found: list[Item] = []
        budget = LISTING_PAYLOAD_BYTES
        # Bands and group lanes in key order (a fair queue: each band's items without a group, then
        # each group's), so ``pivot`` pages through them; with logs, each lane's log after its v2
        # range, in key order too (a group lane's log sorts before its band's own).
        now = self._clock.now()
        lanes = head.leasable_lanes()
        steps = [(lane, lane, False) for lane in lanes]
        if self._logs is not None:
            steps += [(lane + POSITION_MARK, lane, True) for lane in lanes]
        steps.sort(key=lambda step: (priority_of(step[1] + "0" * 30), step[0]))
        for _, band, in_log in steps:
            if not in_log:
                lower, upper = key_range(band)
                if max(pivot, lower) >= upper:
                    continue
                page = self._store.list_items(
                    queue.name,
                    partition,
                    limit=limit - len(found),
                    pivot=pivot,
                    lower=lower,
                    upper=upper,
                    max_bytes=budget,
                )
            elif self._logs is not None and pivot < log_end(band):
                page = self._logs.list_band(
                    queue.name,
                    partition,
                    band,
                    pivot=pivot,
                    limit=limit - len(found),
                    scheduled=scheduled,
                    max_bytes=budget,
                    now=now,
                )
            else:
                continue
            found += page
            budget -= sum(len(item.payload) for item in page)
            # Each band's page holds at least one item, and stops short of ``limit`` when its range
            # ended or its next item would pass ``budget``: only a budget that any item fits in
            # says which, so the next band is read with such a budget only (a page in priority order
            # that never passes ``LISTING_PAYLOAD_BYTES``).
            if len(found) >= limit or budget < MAX_PAYLOAD_BYTES:
                break
        return found

    def _listable(self, queue_name: str, partition: int, limit: int) -> QueueInfo:
        if not 1 <= limit <= MAX_BATCH:
            raise InvalidRequestError(f"limit must be between 1 and {MAX_BATCH}", field="limit")
        queue = self._queues.live(queue_name)
        check_partition(queue, partition)
        return queue

    def import_items(self, queue_name: str, partition: int, items: Sequence[StorageItem]) -> list[str]:
        """Write items verbatim under new ids, skipping those whose ``source_id`` is already there.

        With engine v3's logs an imported item is appended as a produced one is (``Logs.write``): at
        the tail of its priority's log (its group's, in a fair queue), after everything produced or
        imported before it, or to the log's schedule; it keeps its ``created_at`` (for its age), and
        its place in lease order is when it was imported (docs/ordering.md). Only an item whose
        lease is still valid, or whose lapsed lease sends it to the dead-letter queue, is written
        as engine v2 writes it (``_keeps_v2_row``)."""
        if not 1 <= len(items) <= MAX_BATCH:
            raise InvalidRequestError(f"import takes 1 to {MAX_BATCH} items", field="items")
        limit = self._logs.log.payload_limit if self._logs is not None else ROW_PAYLOAD_BYTES
        check_payload_limit([item.payload for item in items], limit)
        queue = self._queues.live(queue_name)
        check_partition(queue, partition)
        now = self._clock.now()
        seen = self._source_ids(queue, partition, now) if any(i.source_id for i in items) else set()
        fresh: list[Item] = []
        #: Each fresh item's index in ``items`` (a refusal names the item as the request had it).
        indexes: list[int] = []
        for index, item in enumerate(items):
            if item.source_id and item.source_id in seen:
                continue
            indexes.append(index)
            seen.add(item.source_id)
            created = item.created_at or now
            enqueue_at = resolve_time(item.enqueue_at, item.enqueue_in, now, "enqueue_in")
            visible = enqueue_at if enqueue_at is not None and enqueue_at > now else now
            fresh.append(
                Item(
                    id=self._ids.new_id(visible, item.priority, queue.lane_for(item.group)),
                    payload=item.payload,
                    reference=item.reference,
                    encoding=item.encoding,
                    kind=item.kind,
                    group=item.group,
                    attempts=item.attempts,
                    lease_deadline=item.lease_deadline,
                    # ``expire_timeout`` counts from when the item first becomes visible here (the
                    # import, or its ``enqueue_at``), not from a kept ``created_at`` (docs/api.md).
                    expire_deadline=item.expire_deadline
                    or lifecycle.expire_deadline(visible, queue.expire_timeout),
                    created_at=created,
                    enqueue_at=enqueue_at if visible > now else None,
                    source_id=item.source_id,
                    source_queue=item.source_queue,
                    last_reason=item.last_reason,
                    failures=item.failures,
                )
            )
        if self._logs is None:
            self._put_v2_rows(queue, partition, fresh, now)
            return [i.id for i in fresh]
        as_rows = [_keeps_v2_row(queue, item, now) for item in fresh]
        # What keeps an engine v2 row holds its payload in the row.
        in_rows = [b""] * len(items)
        for index, kept, row in zip(indexes, fresh, as_rows, strict=True):
            in_rows[index] = kept.payload if row else b""
        check_payload_limit(in_rows, ROW_PAYLOAD_BYTES)
        waiting = [_as_waiting(queue, item, now) for item, row in zip(fresh, as_rows, strict=True) if not row]
        logged = iter(self._logs.write(queue, partition, waiting, now) if waiting else [])
        rows = [item for item, row in zip(fresh, as_rows, strict=True) if row]
        if rows:
            self._put_v2_rows(queue, partition, rows, now)
        return [item.id if row else next(logged).id for item, row in zip(fresh, as_rows, strict=True)]

    def _put_v2_rows(self, queue: QueueInfo, partition: int, items: Sequence[Item], now: datetime) -> None:
        leased = [i for i in items if i.lease_deadline is not None and i.lease_deadline > now]
        for deadline in sorted({i.lease_deadline for i in leased if i.lease_deadline is not None}):
            # An imported lease is found by its record when it runs out, like any other.
            ids = [i.id for i in leased if i.lease_deadline == deadline]
            self._store.record_lease(queue.name, partition, ids, deadline=deadline)
        self._store.put_new(queue.name, partition, items, now=now)

    def _source_ids(self, queue: QueueInfo, partition: int, now: datetime) -> set[str]:
        """The ``source_id`` of every item stored in the partition: its engine v2 rows and, with
        engine v3, every lane's log (leased, waiting and scheduled items). Reads the partition, as
        engine v2's import always did; only an import that gives source ids asks."""
        seen = self._store.source_ids(queue.name, partition)
        if self._logs is None:
            return seen
        head, _ = self._store.head(queue.name, partition, now=now)
        if head.has_lanes:
            head = self._store.with_lanes(queue.name, partition, head)
        for lane in head.leasable_lanes():
            key = LogKey(queue.name, partition, lane)
            log_head = self._logs.log.head(key)
            if log_head.waiting <= 0 and not log_head.leased and not log_head.scheduled:
                continue
            # Pages of whole items, as many as ``SOURCE_ID_PAGE_BYTES`` holds of the largest the
            # log was given: small items a thousand a read, large ones a few (bounded memory).
            limit = max(1, min(MAX_BATCH, SOURCE_ID_PAGE_BYTES // max(log_head.largest, 1)))
            after = ""
            while True:
                page = self._logs.log.list_items(key, after=after, limit=limit, now=now)
                seen.update(item.source_id for item in page if item.source_id)
                if len(page) < limit:
                    break
                after = page[-1].id
        return seen

    def delete_items(self, queue_name: str, partition: int, ids: Sequence[str]) -> None:
        """Delete items in any state; deleting an item that is gone already succeeds."""
        queue, valid, failed = self._leased_ids(queue_name, partition, ids)
        if failed:
            raise InvalidRequestError(f"'{failed[0].id}' is not an item id", id=failed[0].id)
        logged, valid = self._split(valid)
        if logged and self._logs is not None:
            self._logs.delete(queue, partition, logged, self._clock.now())
        if valid:
            self._store.delete(queue.name, partition, valid, guard=Guard.ANY, now=self._clock.now())


def _keeps_v2_row(queue: QueueInfo, item: Item, now: datetime) -> bool:
    """Whether an imported item is written as engine v2 writes it, even with engine v3's logs: a
    lease still valid (a log holds a lease only as a claim of its own positions; a v2 row keeps the
    deadline, with a lease record that finds it when it runs out), or a lapsed lease whose attempts
    or time are up (the next lease or the reaper dead-letters it, as a lease's decision says: it is
    never leased again, so its place in the order does not matter)."""
    if item.lease_deadline is None:
        return False
    if item.lease_deadline > now:
        return True
    return lifecycle.decide_for_lease(item.state(), queue, now).action is Action.DEAD_LETTER


def _as_waiting(queue: QueueInfo, item: Item, now: datetime) -> Item:
    """An imported item as a log stores it: waiting, without a lease. A lease that ran out is taken
    back as a lease that finds it takes it back: its failure recorded (``lease ran out``)."""
    if item.lease_deadline is None:
        return item
    decision = lifecycle.decide_for_lease(item.state(), queue, now)
    return replace(reasons.after_decision(item, decision, now), lease_deadline=None)


def _seconds(value: timedelta) -> str:
    """``90s``: a duration in the one unit every client reads (the domain has no Go formatting)."""
    seconds = value.total_seconds()
    return f"{seconds:.0f}s" if seconds == int(seconds) else f"{seconds}s"
