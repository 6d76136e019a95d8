"""Redrive: move dead letters back to the queue they came from (or to a named queue).

Each item moves with the store's atomic ``move`` (delete from the dead-letter queue guarded on the
item not being validly leased, put of the replacement under a fresh id), so an interrupted call that
is repeated finds every moved item gone from the dead-letter queue and cannot store it twice: the
dead-letter queue itself is the bookmark (docs/adr/0080-priority-fair-redrive.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from querator.domain import lifecycle
from querator.domain.errors import InvalidRequestError
from querator.domain.ids import key_after
from querator.domain.model import MAX_BATCH, Item, RedriveOutcome, validate_queue_name
from querator.ports import Guard, Move
from querator.service.tuning import PAGE_MAX, REDRIVE_PAGE_BYTES

if TYPE_CHECKING:
    from datetime import datetime, timedelta

    from querator.domain.ids import IdFactory
    from querator.domain.model import QueueInfo
    from querator.ports import Clock, ItemStore
    from querator.service.logs import Logs
    from querator.service.queues import QueueDirectory


class Redriver:
    """``queue.redrive``: reads the dead-letter queue in key order and moves items page by page."""

    def __init__(
        self,
        store: ItemStore,
        queues: QueueDirectory,
        clock: Clock,
        ids: IdFactory,
        *,
        budget: timedelta,
        logs: Logs | None = None,
    ) -> None:
        self._logs = logs
        self._store = store
        self._queues = queues
        self._catalog = queues.catalog
        self._clock = clock
        self._ids = ids
        self._budget = budget

    def redrive(
        self, queue_name: str, *, to: str | None = None, limit: int = MAX_BATCH, feeders_only: bool = False
    ) -> RedriveOutcome:
        """Move up to ``limit`` items of ``queue_name`` to ``to`` (else to each item's source queue).

        Stops early when the call's budget runs out (the reply's ``remaining`` says more are left).
        Raises ``InvalidRequestError`` for a bad ``to`` or ``limit`` before moving anything.

        ``feeders_only`` (a caller granted this dead-letter queue alone): items move only back into
        the queues that dead-letter here, and only those recorded as coming from one of them; ``to``
        must be one of them. What else is in the queue stays (counted as ``stranded``).
        """
        if not 1 <= limit <= MAX_BATCH:
            raise InvalidRequestError(f"limit must be between 1 and {MAX_BATCH}", field="limit")
        source = self._queues.live(queue_name)
        # O(queues): which queues dead-letter here. Redrive is an operator's call, not the hot path.
        queues = {q.name: q for q in self._catalog.iterate() if not q.deleting}
        feeders = sorted(name for name, q in queues.items() if q.dead_queue == source.name)
        fixed = self._check_target(source, to, queues) if to is not None else None
        if feeders_only and fixed is not None and fixed.name not in feeders:
            raise InvalidRequestError(
                f"queue '{fixed.name}' (in 'to') does not name '{source.name}' as its dead_queue; on"
                f" the scoped path of '{source.name}' items go back only to the queues that dead-letter"
                " there (the plain route, with a whole-API grant, moves them anywhere)",
                field="to",
            )
        if fixed is None and not feeders:
            raise InvalidRequestError(
                f"queue '{source.name}' is not the dead_queue of any queue; name the queue to move"
                " its items to with 'to'",
                field="to",
            )
        # Dead letters stored before their source queue was recorded go back to the one queue that
        # dead-letters here, when there is exactly one.
        unknown_source = queues.get(feeders[0]) if len(feeders) == 1 else None

        now = self._clock.now()
        stop_at = now + self._budget
        moved = stranded = 0

        def target_of(item: Item) -> QueueInfo | None:
            if feeders_only and item.source_queue not in feeders:
                return None  # not known to come from a queue that dead-letters here
            if fixed is not None:
                return fixed
            if item.source_queue:
                return queues.get(item.source_queue)
            return unknown_source

        for partition in range(source.partitions):
            start = ""
            while moved < limit and self._clock.now() < stop_at:
                # Whole items in one Query (a page of 100 B items costs a few read units, where
                # reading states and then each item would cost one unit an item), at most as many
                # as may still move, and a bounded payload size: one call holds one page at a time.
                page = self._store.list_items(
                    source.name,
                    partition,
                    limit=min(PAGE_MAX, limit - moved),
                    lower=start,
                    max_bytes=REDRIVE_PAGE_BYTES,
                )
                if not page:
                    break  # the partition's end
                moves: list[Move] = []
                for item in page:
                    if item.is_leased(now):
                        continue  # someone holds it in the dead-letter queue: it stays, as remaining
                    target = target_of(item)
                    if target is None:
                        stranded += 1
                        continue
                    moves.append(self._move(item, target, now))
                if moves:
                    result = self._store.move(
                        source.name, partition, moves, guard=Guard.NOT_VALIDLY_LEASED, now=now
                    )
                    moved += len(result.applied)
                start = key_after(page[-1].id)
        heads = self._store.heads(source.name, list(range(source.partitions)))
        held = sum(head.items for head in heads)
        if self._logs is not None:
            for partition, listed in enumerate(heads):
                # A fair dead-letter queue's dead letters sit in its groups' lanes, logs of their own.
                head = self._store.with_lanes(source.name, partition, listed) if listed.has_lanes else listed
                for band in head.leasable_lanes():
                    after: str | None = ""
                    while after is not None and moved < limit and self._clock.now() < stop_at:
                        done, left, after = self._logs.redrive_page(
                            source,
                            partition,
                            band,
                            after=after,
                            limit=min(PAGE_MAX, limit - moved),
                            target_of=target_of,
                            now=now,
                        )
                        moved += done
                        stranded += left
                counts = self._logs.counts(source.name, partition, head.leasable_lanes())
                held += counts.total + counts.scheduled
        remaining = max(held - stranded, 0)
        return RedriveOutcome(moved=moved, remaining=remaining, stranded=stranded)

    def _check_target(self, source: QueueInfo, to: str, queues: dict[str, QueueInfo]) -> QueueInfo:
        validate_queue_name(to, "to")
        if to == source.name:
            raise InvalidRequestError("'to' must be another queue than 'queue_name'", field="to")
        target = queues.get(to)
        if target is None:
            raise InvalidRequestError(f"queue '{to}' (in 'to') does not exist", field="to")
        users = sorted(name for name, q in queues.items() if q.dead_queue == to)
        if users:
            raise InvalidRequestError(
                f"queue '{to}' (in 'to') is the dead_queue of {', '.join(users)}; redrive moves items"
                " out of dead-letter queues, not into them",
                field="to",
            )
        return target

    def _move(self, item: Item, target: QueueInfo, now: datetime) -> Move:
        """The dead letter as a new item at the target's tail: payload, reference, encoding, kind,
        priority and group kept; ``attempts`` from 0 and ``created_at`` now, so ``expire_timeout`` counts
        from now."""
        replacement = item.as_redriven(
            new_id=self._ids.new_id(now, item.priority, target.lane_for(item.group)),
            now=now,
            expire_deadline=lifecycle.expire_deadline(now, target.expire_timeout),
        )
        # As dead-lettering does: the same item always lands in the same partition of its target.
        partition = item.landing_partition(target.partitions)
        return Move(item=item, target_queue=target.name, target_partition=partition, replacement=replacement)


__all__ = ["Redriver"]
