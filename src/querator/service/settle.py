"""Settling items the queue takes back: requeue at the tail, dead-letter, or delete.

Used by the lease (expired leases it finds), the reaper (expired leases, expired items, stragglers)
and ``queue.retry``. Each call returns a ``SettleOutcome`` that the caller folds into its own report.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from querator.domain import lifecycle, reasons
from querator.domain.errors import DeadLetterQueueMissingError, QueueNotFoundError
from querator.domain.lifecycle import Action
from querator.domain.priority import band_of
from querator.ports import Guard, Move

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from datetime import datetime

    from querator.domain.ids import IdFactory
    from querator.domain.model import Item, ItemState, QueueInfo
    from querator.ports import ItemStore, LeaseRecord
    from querator.service.queues import QueueDirectory

log = logging.getLogger("querator.service")


@dataclass(slots=True)
class SettleOutcome:
    """What settling did; every field counts items."""

    requeued: int = 0
    dead_lettered: int = 0
    deleted: int = 0
    #: Should have been dead-lettered, but the dead-letter queue is missing: they stay.
    skipped: int = 0
    #: Expired leases found through their lease records.
    recovered: int = 0
    counts_by_reason: dict[str, int] = field(default_factory=dict)
    #: Bands that requeued items entered from another band (a priority given while they were
    #: leased): a lease that read its head row before settling must read it again to see them.
    entered_bands: set[str] = field(default_factory=set)

    def add(self, other: SettleOutcome) -> None:
        self.requeued += other.requeued
        self.dead_lettered += other.dead_lettered
        self.deleted += other.deleted
        self.skipped += other.skipped
        self.recovered += other.recovered
        self.entered_bands |= other.entered_bands
        for reason, count in other.counts_by_reason.items():
            self.count(reason, count)

    def count(self, reason: str, count: int = 1) -> None:
        self.counts_by_reason[reason] = self.counts_by_reason.get(reason, 0) + count


class Settler:
    """Requeues and dead-letters items of a partition with guarded moves."""

    def __init__(self, store: ItemStore, queues: QueueDirectory, ids: IdFactory) -> None:
        self._store = store
        self._queues = queues
        self._ids = ids

    def recover(
        self, queue: QueueInfo, partition: int, records: Sequence[LeaseRecord], now: datetime
    ) -> SettleOutcome:
        """Put back the expired leases of lease records that are due, then drop the records.

        Reads only the records' items: O(expired), however many valid leases the partition holds.
        An item whose lease was renewed is covered by the record its renewal filed; a record whose
        item could not be settled (dead-letter queue missing) is kept for the next try.
        """
        outcome = SettleOutcome()
        for record in records:
            states = self._store.states(queue.name, partition, record.ids)
            expired = [
                (state, lifecycle.decide_for_lease(state, queue, now))
                for state in states
                if state.lease_deadline is not None and state.lease_deadline <= now
            ]
            settled = self.settle(queue, partition, expired, now)
            settled.recovered += len(expired)
            outcome.add(settled)
            if not settled.skipped:
                self._store.drop_lease_record(queue.name, partition, record.key)
        return outcome

    def settle(
        self,
        queue: QueueInfo,
        partition: int,
        found: Sequence[tuple[ItemState, lifecycle.Decision]],
        now: datetime,
        *,
        requeue_guard: Guard = Guard.LEASE_EXPIRED,
    ) -> SettleOutcome:
        """Requeue or dead-letter items found by a read, as their decisions say.

        ``requeue_guard``: the state a requeued item must still be in (an expired lease, or never
        leased for the sweep's stragglers); a competitor that acted first makes the move a no-op.
        """
        outcome = SettleOutcome()
        if not found:
            return outcome
        if not queue.dead_queue:
            # Dead-lettering without a dead-letter queue deletes: the ids suffice, no item is read.
            dead = [(s, d) for s, d in found if d.action is Action.DEAD_LETTER]
            outcome.add(self._delete_dead(queue, partition, dead, now))
            found = [(s, d) for s, d in found if d.action is not Action.DEAD_LETTER]
            if not found:
                return outcome
        items = self._store.get_many(queue.name, partition, [state.id for state, _ in found])
        requeue: list[Move] = []
        dead_items: list[tuple[Item, Guard, lifecycle.Decision]] = []
        for state, decision in found:
            item = items.get(state.id)
            if item is None:
                continue  # someone else got there first
            if decision.action is Action.REQUEUE:
                requeue.append(self.requeue_move(queue, partition, item, now, decision))
            elif decision.action is Action.DEAD_LETTER:
                guard = Guard.LEASE_EXPIRED if item.lease_deadline is not None else Guard.NOT_VALIDLY_LEASED
                dead_items.append((item, guard, decision))
        if requeue:
            moved = self._store.move(queue.name, partition, requeue, guard=requeue_guard, now=now)
            outcome.requeued += len(moved.applied)
            applied = set(moved.applied)
            outcome.entered_bands |= {
                band_of(m.replacement.id)
                for m in requeue
                if m.item.id in applied and band_of(m.replacement.id) != band_of(m.item.id)
            }
        for guard in (Guard.LEASE_EXPIRED, Guard.NOT_VALIDLY_LEASED):
            batch = [(item, decision) for item, g, decision in dead_items if g is guard]
            if not batch:
                continue
            entering = {item.id: reasons.after_decision(item, why, now) for item, why in batch}
            try:
                done, moved_out = self.dead_letter(
                    queue, partition, [item for item, _ in batch], guard, now, entering=entering
                )
            except DeadLetterQueueMissingError:
                log.warning("dead_queue of %s is missing; %d item(s) stay", queue.name, len(batch))
                outcome.skipped += len(batch)
                continue
            outcome.add(moved_out)
            for item, why in batch:
                if item.id in done:
                    outcome.count(why.reason)
        return outcome

    def _delete_dead(
        self,
        queue: QueueInfo,
        partition: int,
        found: Sequence[tuple[ItemState, lifecycle.Decision]],
        now: datetime,
    ) -> SettleOutcome:
        outcome = SettleOutcome()
        for guard in (Guard.LEASE_EXPIRED, Guard.NOT_VALIDLY_LEASED):
            batch = [
                (s, d) for s, d in found if (s.lease_deadline is not None) == (guard is Guard.LEASE_EXPIRED)
            ]
            if not batch:
                continue
            result = self._store.delete(queue.name, partition, [s.id for s, _ in batch], guard=guard, now=now)
            deleted = set(result.applied)
            for state, decision in batch:
                if state.id in deleted:
                    outcome.deleted += 1
                    outcome.count(decision.reason)
        return outcome

    def requeue_move(
        self,
        queue: QueueInfo,
        partition: int,
        item: Item,
        visible_at: datetime,
        decision: lifecycle.Decision | None = None,
    ) -> Move:
        """``item`` back at the tail at ``visible_at``; with the failure ``decision`` records (a lease
        that ran out), if any."""
        back = item if decision is None else reasons.after_decision(item, decision, visible_at)
        return Move(
            item=item,
            target_queue=queue.name,
            target_partition=partition,
            replacement=self.requeued(queue, back, visible_at),
        )

    def requeued(
        self, queue: QueueInfo, item: Item, visible_at: datetime, priority: int | None = None
    ) -> Item:
        """The item back in the queue: a new id at ``visible_at`` (the tail, or a scheduled time),
        with its priority (or the one ``queue.reprioritize`` gave it while leased) unless
        ``priority`` gives another."""
        new_id = self._ids.new_id(
            visible_at,
            item.returning_priority if priority is None else priority,
            queue.lane_for(item.group),
        )
        return replace(item, id=new_id, lease_deadline=None, enqueue_at=None, next_priority=None)

    def dead_letter(
        self,
        queue: QueueInfo,
        partition: int,
        items: Sequence[Item],
        guard: Guard,
        now: datetime,
        *,
        entering: Mapping[str, Item] | None = None,
    ) -> tuple[set[str], SettleOutcome]:
        """Move ``items`` to the queue's dead-letter queue (delete them when it has none).

        ``entering``: by id, an item as it enters the dead-letter queue, with the failure that sends
        it there (``querator.domain.reasons``); the stored item (``items``) is what the move is
        guarded by. Returns the ids that moved (or were deleted) and the outcome.
        """
        outcome = SettleOutcome()
        if not queue.dead_queue:
            result = self._store.delete(queue.name, partition, [i.id for i in items], guard=guard, now=now)
            outcome.deleted += len(result.applied)
            return set(result.applied), outcome
        try:
            target = self._queues.cached(queue.dead_queue)
        except QueueNotFoundError as exc:
            raise DeadLetterQueueMissingError(
                f"dead_queue '{queue.dead_queue}' of '{queue.name}' does not exist"
            ) from exc
        moves = []
        for item in items:
            dead = (
                (entering or {})
                .get(item.id, item)
                .as_dead_letter(
                    new_id=self._ids.new_id(now, item.returning_priority, target.lane_for(item.group)),
                    source_queue=queue.name,
                    expire_deadline=lifecycle.expire_deadline(now, target.expire_timeout),
                )
            )
            # The same item always lands in the same partition of the dead-letter queue.
            target_partition = item.landing_partition(target.partitions)
            moves.append(
                Move(item=item, target_queue=target.name, target_partition=target_partition, replacement=dead)
            )
        result = self._store.move(queue.name, partition, moves, guard=guard, now=now)
        outcome.dead_lettered += len(result.applied)
        return set(result.applied), outcome
