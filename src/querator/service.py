"""Service layer: the queue's use cases over the ``QueueCatalog`` and ``ItemStore`` ports.

The service decides (with ``querator.domain.lifecycle``) and the store applies each decision with one
conditional write, so concurrent callers are safe without locks here. Time comes from the injected
clock once per call and is passed down; nothing below calls ``now()``.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import zlib
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING

from querator.domain import lifecycle
from querator.domain.errors import (
    ConflictError,
    DeadLetterQueueMissingError,
    DuplicateClientError,
    InvalidRequestError,
    NothingToLeaseError,
    QueueDeletingError,
    QueueNotFoundError,
    RequestInProgressError,
)
from querator.domain.ids import IdFactory, parse_item_id, visible_at_of, visible_bound
from querator.domain.lifecycle import Action
from querator.domain.model import (
    MAX_BATCH,
    BatchOutcome,
    ClearScope,
    IdFailure,
    Item,
    Lease,
    PartitionStats,
    ProduceReceipt,
    QueueInfo,
    QueueUpdate,
    Renewal,
    RenewOutcome,
    check_aware,
    validate_queue_name,
)
from querator.ports import Guard, IdempotencyRecord

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from querator.domain.model import ItemState, NewItem, RetryRequest, StorageItem
    from querator.ports import Clock, ItemStore, QueueCatalog

log = logging.getLogger(__name__)

NOT_LEASED = "item is unknown, stale or not leased"
#: A pending idempotency record older than this belongs to a request that died while writing.
IDEMPOTENCY_STALE_AFTER = timedelta(minutes=15)
#: How long a produce with an idempotency key is remembered.
IDEMPOTENCY_TTL = timedelta(hours=24)
_FIRST_PAGE_MIN = 50
_PAGE_MAX = 1000
#: Pages one lease reads in one partition before giving up on it: bounds the work behind a long
#: run of leased items at the head of a partition (20,000 items at the page maximum).
_LEASE_MAX_PAGES = 20
#: Lost claims in a row, with nothing won, after which a lease reads its page again.
_LOSSES_BEFORE_RESCAN = 3
_POLL_FIRST = 0.02
_POLL_MAX = 0.5
_UPDATE_RETRIES = 3
#: See ``QueueService``: long enough to take the catalog read off most hot-path calls, short enough
#: that a queue update reaches every process within about a second.
DEFAULT_QUEUE_CACHE_TTL = timedelta(seconds=1)


@dataclass(slots=True)
class ReapReport:
    """What one reaper run did, for metrics."""

    queues: int = 0
    partitions: int = 0
    scanned: int = 0
    dead_lettered: int = 0
    deleted: int = 0
    #: Items that should have been dead-lettered but their dead-letter queue is missing.
    skipped: int = 0
    queues_deleted: int = 0
    #: False when the time budget ran out first; the next run resumes from a bookmark.
    finished: bool = True
    counts_by_reason: dict[str, int] = field(default_factory=dict)
    #: Age of the oldest due, un-leased item this run read (how far behind consumers are).
    oldest_item_age: timedelta = timedelta(0)
    #: Items read in queues that serve as another queue's dead-letter queue.
    dead_letter_depth: int = 0


class QueueService:
    """Use cases of the lease queue.

    Parameters
    ----------
    catalog, store
        The storage ports.
    clock
        Source of ``now`` and of waiting (a fake clock in tests).
    ids
        Mints item ids; one per process keeps produce order.
    queue_cache_ttl
        How long produce, lease, complete, retry and renew trust a queue's catalog record before
        reading it again (docs/adr/0008-queue-cache.md); ``timedelta(0)`` reads it on every call.
    """

    def __init__(
        self,
        *,
        catalog: QueueCatalog,
        store: ItemStore,
        clock: Clock,
        ids: IdFactory | None = None,
        rng: random.Random | None = None,
        queue_cache_ttl: timedelta = DEFAULT_QUEUE_CACHE_TTL,
    ) -> None:
        self._catalog = catalog
        self._store = store
        self._clock = clock
        self._ids = ids or IdFactory()
        self._rng = rng or random.Random()  # noqa: S311 - spreading load, not security
        self._lock = threading.Lock()
        self._produced: dict[str, list[int]] = {}
        self._lease_turn: dict[str, int] = {}
        self._waiting: set[tuple[str, str]] = set()
        self._queue_ttl = queue_cache_ttl
        #: Queue name -> (trusted until, catalog record): the hot path's copy of the catalog.
        self._queues: dict[str, tuple[datetime, QueueInfo]] = {}

    # -- queues -----------------------------------------------------------------------------------

    def create_queue(self, info: QueueInfo) -> QueueInfo:
        """Create a queue. Raises ``QueueAlreadyExistsError``, ``InvalidRequestError``."""
        now = self._clock.now()
        info = replace(info, created_at=now, updated_at=now, deleting=False)
        self._check_dead_queue(info)
        self._catalog.create(info)
        self._forget_queue(info.name)
        return info

    def get_queue(self, name: str) -> QueueInfo:
        return self._catalog.get(validate_queue_name(name))

    def list_queues(self, *, pivot: str = "", limit: int = 100) -> list[QueueInfo]:
        if not 1 <= limit <= MAX_BATCH:
            raise InvalidRequestError(f"limit must be between 1 and {MAX_BATCH}", field="limit")
        return self._catalog.list(pivot=pivot, limit=limit)

    def update_queue(self, update: QueueUpdate) -> QueueInfo:
        """Change the fields present in ``update``; the rest stay as they are."""
        for attempt in range(_UPDATE_RETRIES):
            current = self._live_queue(update.name)
            changes = {
                name: value
                for name in (
                    "lease_timeout",
                    "expire_timeout",
                    "max_attempts",
                    "dead_queue",
                    "reference",
                    "partitions",
                )
                if (value := getattr(update, name)) is not None
            }
            info = replace(current, **changes, updated_at=max(self._clock.now(), current.updated_at))
            if info.partitions < current.partitions:
                # Items in the dropped partitions would be stranded; see docs/adr/0003-partitions.md.
                raise InvalidRequestError(
                    "requested_partitions cannot be reduced", field="requested_partitions"
                )
            if "dead_queue" in changes:
                self._check_dead_queue(info)
            try:
                self._catalog.replace(info, expected_updated_at=current.updated_at)
                self._forget_queue(info.name)
            except ConflictError:
                if attempt == _UPDATE_RETRIES - 1:
                    raise
                continue
            return info
        raise AssertionError("unreachable")  # pragma: no cover

    def delete_queue(self, name: str) -> None:
        """Delete a queue and all its items (resumed by the reaper if interrupted)."""
        validate_queue_name(name)
        users = [q.name for q in self._catalog.iterate() if q.dead_queue == name]
        if users:
            raise InvalidRequestError(
                f"queue '{name}' is the dead_queue of {', '.join(users)}; change those first", queue=name
            )
        info = self._catalog.mark_deleting(name)
        self._forget_queue(name)
        if self._queue_ttl > timedelta(0):
            # Other processes may still trust their copy of the queue for up to the cache TTL and
            # produce into it; purge only once every copy has expired, so nothing lands after.
            self._clock.sleep(self._queue_ttl.total_seconds())
        self._purge(info)

    def _purge(self, info: QueueInfo) -> int:
        removed = sum(self._store.purge(info.name, p) for p in range(info.partitions))
        self._catalog.remove(info.name)
        return removed

    def _check_dead_queue(self, info: QueueInfo) -> None:
        if not info.dead_queue:
            return
        try:
            target = self._catalog.get(info.dead_queue)
        except QueueNotFoundError as exc:
            raise InvalidRequestError(
                f"dead_queue '{info.dead_queue}' does not exist", field="dead_queue"
            ) from exc
        if target.dead_queue:
            raise InvalidRequestError(
                f"dead_queue '{info.dead_queue}' has a dead_queue of its own", field="dead_queue"
            )

    def _live_queue(self, name: str) -> QueueInfo:
        info = self._catalog.get(validate_queue_name(name))
        if info.deleting:
            raise QueueDeletingError(f"queue '{name}' is being deleted", queue=name)
        return info

    def _queue(self, name: str) -> QueueInfo:
        """The queue's record for the hot path: this process's copy while it is fresh.

        Every produce, lease, complete, retry and renew needs the queue's settings; reading the
        catalog each time was a third of the requests at batch 1 and capped one queue at what one
        catalog item can be read per second. An unknown queue is never cached, so a queue created
        elsewhere is visible at once; an update elsewhere within ``queue_cache_ttl``.
        """
        info = self._cached_record(name)
        if info.deleting:
            raise QueueDeletingError(f"queue '{name}' is being deleted", queue=name)
        return info

    def _cached_record(self, name: str) -> QueueInfo:
        now = self._clock.now()
        with self._lock:
            cached = self._queues.get(name)
        if cached is not None and cached[0] > now:
            return cached[1]
        info = self._catalog.get(validate_queue_name(name))
        with self._lock:
            self._queues[name] = (now + self._queue_ttl, info)
        return info

    def _forget_queue(self, name: str) -> None:
        with self._lock:
            self._queues.pop(name, None)

    def _check_partition(self, queue: QueueInfo, partition: int) -> None:
        if not 0 <= partition < queue.partitions:
            raise InvalidRequestError(
                f"partition {partition} does not exist in queue '{queue.name}'", field="partition"
            )

    # -- produce ----------------------------------------------------------------------------------

    def produce(
        self, queue_name: str, items: Sequence[NewItem], *, idempotency_key: str | None = None
    ) -> ProduceReceipt:
        """Store ``items`` in one partition; return only once every item is durably stored.

        With ``idempotency_key``, a retry of the same request stores nothing again and returns the
        first receipt (see docs/adr/0004-idempotent-produce.md for the one double fault it does not cover).
        """
        if not 1 <= len(items) <= MAX_BATCH:
            raise InvalidRequestError(f"produce takes 1 to {MAX_BATCH} items", field="items")
        queue = self._queue(queue_name)
        now = self._clock.now()
        partition = self._choose_partition(queue, len(items))
        stored = [self._new_item(queue, item, now) for item in items]
        if idempotency_key is None:
            self._store.put_new(queue.name, partition, stored)
            return ProduceReceipt(queue_name=queue.name, partition=partition, ids=[i.id for i in stored])
        return self._produce_once(queue, partition, stored, idempotency_key, now)

    def _produce_once(
        self, queue: QueueInfo, partition: int, stored: list[Item], key: str, now: datetime
    ) -> ProduceReceipt:
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        record = IdempotencyRecord(
            key=digest,
            partition=partition,
            ids=[i.id for i in stored],
            done=False,
            started_at=now,
            queue_created_at=queue.created_at,
        )
        won, previous = self._store.begin_idempotent(
            queue.name, record, stale_before=now - IDEMPOTENCY_STALE_AFTER, expires_at=now + IDEMPOTENCY_TTL
        )
        if not won:
            assert previous is not None  # noqa: S101 - the store returns the record that won
            if not previous.done:
                raise RequestInProgressError("a produce with this idempotency key is still in progress")
            return ProduceReceipt(
                queue_name=queue.name, partition=previous.partition, ids=previous.ids, replayed=True
            )
        resumed = (
            previous is not None
            and not previous.done
            and previous.queue_created_at == queue.created_at
            and len(previous.ids) == len(stored)
        )
        if resumed and previous is not None:
            # The first writer died mid-way: write its ids where missing, so nothing lands twice.
            stored = [replace(item, id=old) for item, old in zip(stored, previous.ids, strict=True)]
            partition = previous.partition
            self._store.put_absent(queue.name, partition, stored)
        else:
            self._store.put_new(queue.name, partition, stored)
        ids = [item.id for item in stored]
        self._store.finish_idempotent(queue.name, digest, partition=partition, ids=ids)
        return ProduceReceipt(queue_name=queue.name, partition=partition, ids=ids)

    def _new_item(self, queue: QueueInfo, item: NewItem, now: datetime) -> Item:
        scheduled = item.enqueue_at is not None and item.enqueue_at > now
        visible = item.enqueue_at if scheduled and item.enqueue_at is not None else now
        return Item(
            id=self._ids.new_id(visible),
            payload=item.payload,
            reference=item.reference,
            encoding=item.encoding,
            kind=item.kind,
            expire_deadline=lifecycle.expire_deadline(visible, queue.expire_timeout),
            created_at=now,
            enqueue_at=visible if scheduled else None,
        )

    def _choose_partition(self, queue: QueueInfo, count: int) -> int:
        """The partition this process has sent the fewest items to (docs/adr/0003-partitions.md)."""
        if queue.partitions == 1:
            return 0
        with self._lock:
            sent = self._produced.setdefault(queue.name, [])
            # Partitions added by an update start at zero and catch up before the others get more.
            sent.extend(0 for _ in range(queue.partitions - len(sent)))
            least = min(sent[: queue.partitions])
            choices = [p for p in range(queue.partitions) if sent[p] == least]
            partition = self._rng.choice(choices)
            sent[partition] += count
            return partition

    # -- lease ------------------------------------------------------------------------------------

    def lease(
        self, queue_name: str, *, batch_size: int, client_id: str, timeout: timedelta = timedelta(0)
    ) -> Lease:
        """Lease up to ``batch_size`` items of one partition, oldest first.

        Returns as soon as at least one item is leased; with nothing to lease it polls the store
        until ``timeout`` and then raises ``NothingToLeaseError``.
        """
        if not 1 <= batch_size <= MAX_BATCH:
            raise InvalidRequestError(f"batch_size must be between 1 and {MAX_BATCH}", field="batch_size")
        if not client_id:
            raise InvalidRequestError("client_id is required", field="client_id")
        if timeout < timedelta(0):
            raise InvalidRequestError("request_timeout may not be negative", field="request_timeout")
        queue = self._queue(queue_name)
        waiter = (queue.name, client_id)
        with self._lock:
            if waiter in self._waiting:
                raise DuplicateClientError(
                    f"client_id '{client_id}' already has a waiting lease on '{queue.name}'"
                )
            self._waiting.add(waiter)
        try:
            deadline = self._clock.now() + timeout
            pause = _POLL_FIRST
            while True:
                lease = self._lease_once(queue, batch_size, self._clock.now())
                if lease.items:
                    return lease
                remaining = (deadline - self._clock.now()).total_seconds()
                if remaining <= 0:
                    raise NothingToLeaseError(f"nothing to lease in '{queue.name}'")
                self._clock.sleep(min(pause, remaining))
                pause = min(pause * 2, _POLL_MAX)
                queue = self._queue(queue_name)
        finally:
            with self._lock:
                self._waiting.discard(waiter)

    def _lease_once(self, queue: QueueInfo, batch_size: int, now: datetime) -> Lease:
        with self._lock:
            # Rotate the first partition tried, so one consumer drains every partition in turn.
            start = self._lease_turn.get(queue.name, self._rng.randrange(queue.partitions))
            self._lease_turn[queue.name] = start + 1
        for offset in range(queue.partitions):
            partition = (start + offset) % queue.partitions
            items = self._lease_partition(queue, partition, batch_size, now)
            if items:
                return Lease(queue_name=queue.name, partition=partition, items=items)
        return Lease(queue_name=queue.name, partition=start % queue.partitions)

    def _lease_partition(
        self, queue: QueueInfo, partition: int, batch_size: int, now: datetime
    ) -> list[Item]:
        lease_deadline = now + queue.lease_timeout
        claimed: list[Item] = []
        start_after: str | None = None
        limit = min(_PAGE_MAX, max(_FIRST_PAGE_MIN, 2 * batch_size))
        for _ in range(_LEASE_MAX_PAGES):
            page = self._store.scan(
                queue.name, partition, limit=limit, start_after=start_after, due_at=now, available_only=True
            )
            candidates = []
            requeued = False
            for state in page.items:
                decision = lifecycle.decide_for_lease(state, queue, now)
                if decision.action is Action.LEASE:
                    candidates.append(state.id)
                elif decision.action is not Action.KEEP:
                    self._settle(queue, partition, state, decision, now, ReapReport())
                    requeued = requeued or decision.action is Action.REQUEUE
            won, contended = self._claim(
                queue, partition, candidates, batch_size - len(claimed), lease_deadline, now
            )
            claimed += won
            if len(claimed) >= batch_size or (contended and claimed):
                break
            if contended:
                # Other consumers took this page's candidates since it was read: read it again rather
                # than keep trying stale ids (a Query costs reads; each lost claim is a charged write).
                continue
            if page.next_start is None:
                if not requeued:
                    break
                # Requeued items now sit at the tail, after everything this scan has read.
                start_after = page.items[-1].id
            else:
                start_after = page.next_start
            limit = _PAGE_MAX
        return claimed

    def _claim(
        self,
        queue: QueueInfo,
        partition: int,
        candidates: list[str],
        wanted: int,
        lease_deadline: datetime,
        now: datetime,
    ) -> tuple[list[Item], bool]:
        """Claim up to ``wanted`` of ``candidates`` (oldest first), one conditional write each.

        Returns the items won (oldest first) and whether it stopped because of contention. Alone, a
        consumer claims strictly oldest first and never loses. A lost race means other consumers are
        claiming from the same page, so the rest of it is going stale, and every further loss is a
        charged write: after a loss this consumer continues from a random point of the remaining
        candidates, stops after two losses in a row once it has won something (the contract returns
        as soon as one item is leased), and gives the page up after ``_LOSSES_BEFORE_RESCAN`` losses
        in a row with nothing won. Measured in docs/adr/0001-data-model.md.
        """
        pending = list(candidates)
        won: list[Item] = []
        at = losses = 0
        while pending and len(won) < wanted:
            item_id = pending.pop(at)
            got = self._store.claim(queue.name, partition, [item_id], lease_deadline=lease_deadline, now=now)
            if got:
                won += got
                losses = 0
            else:
                losses += 1
                if (won and losses > 1) or losses >= _LOSSES_BEFORE_RESCAN:
                    return sorted(won, key=lambda item: item.id), True
                if pending:
                    at = self._rng.randrange(len(pending))
            if at >= len(pending):
                at = 0
        # Claimed out of order after a lost race; the reply is oldest first all the same (contract).
        return sorted(won, key=lambda item: item.id), False

    def _settle(
        self,
        queue: QueueInfo,
        partition: int,
        state: ItemState,
        decision: lifecycle.Decision,
        now: datetime,
        report: ReapReport,
    ) -> None:
        """Requeue or dead-letter an item found in a scan, counting what happened in ``report``."""
        item = self._store.get(queue.name, partition, state.id)
        if item is None:
            return  # someone else got there first
        guard = Guard.LEASE_EXPIRED if item.lease_deadline is not None else Guard.NOT_VALIDLY_LEASED
        if decision.action is Action.REQUEUE:
            self._store.move(
                queue.name,
                partition,
                item.id,
                guard=Guard.LEASE_EXPIRED,
                now=now,
                target_queue=queue.name,
                target_partition=partition,
                replacement=self._requeued(item, now),
            )
            return
        try:
            done = self._dead_letter(queue, partition, item, guard, now, report)
        except DeadLetterQueueMissingError:
            log.warning("dead_queue of %s is missing; item %s stays", queue.name, item.id)
            report.skipped += 1
            return
        if done:
            report.counts_by_reason[decision.reason] = report.counts_by_reason.get(decision.reason, 0) + 1

    def _requeued(self, item: Item, visible_at: datetime) -> Item:
        """The item back in the queue: a new id at ``visible_at`` (the tail, or a scheduled time)."""
        return replace(item, id=self._ids.new_id(visible_at), lease_deadline=None, enqueue_at=None)

    def _dead_letter(
        self, queue: QueueInfo, partition: int, item: Item, guard: Guard, now: datetime, report: ReapReport
    ) -> bool:
        if not queue.dead_queue:
            if self._store.delete(queue.name, partition, [item.id], guard=guard, now=now):
                return False
            report.deleted += 1
            return True
        try:
            target = self._cached_record(queue.dead_queue)
        except QueueNotFoundError as exc:
            raise DeadLetterQueueMissingError(
                f"dead_queue '{queue.dead_queue}' of '{queue.name}' does not exist"
            ) from exc
        dead = Item(
            id=self._ids.new_id(now),
            payload=item.payload,
            reference=item.reference,
            encoding=item.encoding,
            kind=item.kind,
            attempts=item.attempts,
            created_at=item.created_at,
            expire_deadline=lifecycle.expire_deadline(now, target.expire_timeout),
            source_id=item.id,
        )
        # The same item always lands in the same partition of the dead-letter queue.
        target_partition = zlib.crc32(item.id.encode()) % target.partitions
        moved = self._store.move(
            queue.name,
            partition,
            item.id,
            guard=guard,
            now=now,
            target_queue=target.name,
            target_partition=target_partition,
            replacement=dead,
        )
        if moved:
            report.dead_lettered += 1
        return moved

    # -- complete, retry, renew -------------------------------------------------------------------

    def complete(self, queue_name: str, partition: int, ids: Sequence[str]) -> BatchOutcome:
        """Delete leased items; ids that are unknown, stale or not leased are reported as failed."""
        queue, valid, failed = self._leased_ids(queue_name, partition, ids)
        now = self._clock.now()
        rejected = set(self._store.delete(queue.name, partition, valid, guard=Guard.LEASE_VALID, now=now))
        return BatchOutcome(
            applied=[i for i in valid if i not in rejected],
            failed=failed + [IdFailure(id=i, reason=NOT_LEASED) for i in valid if i in rejected],
        )

    def retry(self, queue_name: str, partition: int, requests: Sequence[RetryRequest]) -> BatchOutcome:
        """Put leased items back: at the tail, at ``retry_at``, or into the dead-letter queue."""
        queue, valid, failed = self._leased_ids(queue_name, partition, [r.id for r in requests])
        now = self._clock.now()
        applied = []
        report = ReapReport()
        for request in requests:
            if request.id not in valid:
                continue
            if request.retry_at is not None:
                check_aware(request.retry_at, "retry_at")
            item = self._store.get(queue.name, partition, request.id)
            if item is None or not item.is_leased(now):
                failed.append(IdFailure(id=request.id, reason=NOT_LEASED))
                continue
            plan = lifecycle.plan_retry(request, item.attempts, queue, now)
            if plan.action is Action.DEAD_LETTER:
                done = self._dead_letter(queue, partition, item, Guard.LEASE_VALID, now, report)
            else:
                assert plan.visible_at is not None  # noqa: S101 - plan_retry sets it for REQUEUE
                replacement = self._requeued(item, plan.visible_at)
                if plan.visible_at > now:
                    replacement = replace(replacement, enqueue_at=plan.visible_at)
                done = self._store.move(
                    queue.name,
                    partition,
                    item.id,
                    guard=Guard.LEASE_VALID,
                    now=now,
                    target_queue=queue.name,
                    target_partition=partition,
                    replacement=replacement,
                )
            if done:
                applied.append(request.id)
            else:
                failed.append(IdFailure(id=request.id, reason=NOT_LEASED))
        return BatchOutcome(applied=applied, failed=failed)

    def renew(
        self, queue_name: str, partition: int, ids: Sequence[str], *, lease_timeout: timedelta | None = None
    ) -> RenewOutcome:
        """Extend valid leases to now + ``lease_timeout`` (default: the queue's)."""
        queue, valid, failed = self._leased_ids(queue_name, partition, ids)
        timeout = queue.lease_timeout if lease_timeout is None else lease_timeout
        if timeout <= timedelta(0):
            raise InvalidRequestError("lease_timeout must be greater than zero", field="lease_timeout")
        now = self._clock.now()
        deadline = now + timeout
        rejected = set(self._store.renew(queue.name, partition, valid, lease_deadline=deadline, now=now))
        return RenewOutcome(
            queue_name=queue.name,
            partition=partition,
            items=[Renewal(id=i, lease_deadline=deadline) for i in valid if i not in rejected],
            failed=failed + [IdFailure(id=i, reason=NOT_LEASED) for i in valid if i in rejected],
        )

    def _leased_ids(
        self, queue_name: str, partition: int, ids: Sequence[str]
    ) -> tuple[QueueInfo, list[str], list[IdFailure]]:
        if not 1 <= len(ids) <= MAX_BATCH:
            raise InvalidRequestError(f"ids must hold 1 to {MAX_BATCH} ids", field="ids")
        queue = self._queue(queue_name)
        self._check_partition(queue, partition)
        valid: list[str] = []
        failed: list[IdFailure] = []
        for item_id in dict.fromkeys(ids):  # a repeated id is applied once
            try:
                valid.append(parse_item_id(item_id))
            except InvalidRequestError as exc:
                failed.append(IdFailure(id=item_id, reason=str(exc)))
        return queue, valid, failed

    # -- inspection and maintenance ---------------------------------------------------------------

    def check_health(self) -> None:
        """Read the catalog once; raises the store's error when it cannot be reached."""
        self._catalog.list(pivot="", limit=1)

    def stats(self, queue_name: str) -> list[PartitionStats]:
        """Counts and ages per partition, read from storage."""
        queue = self._live_queue(queue_name)
        now = self._clock.now()
        return [self._partition_stats(queue, p, now) for p in range(queue.partitions)]

    def _partition_stats(self, queue: QueueInfo, partition: int, now: datetime) -> PartitionStats:
        total = leased = scheduled = 0
        age = leased_age = timedelta(0)
        for item in self._store.iter_items(queue.name, partition):
            if item.is_leased(now):
                leased += 1
                leased_age += now - item.created_at
            if visible_at_of(item.id) > now:
                scheduled += 1
                continue
            total += 1
            age += now - item.created_at
        return PartitionStats(
            partition=partition,
            total=total,
            total_leased=leased,
            scheduled=scheduled,
            average_age=age / total if total else timedelta(0),
            average_leased_age=leased_age / leased if leased else timedelta(0),
        )

    def clear(self, queue_name: str, scope: ClearScope) -> int:
        """Remove un-leased items (``QUEUE``), scheduled ones (``SCHEDULED``), leased ones too
        (``DESTRUCTIVE``). Returns how many were removed."""
        if not scope & (ClearScope.QUEUE | ClearScope.SCHEDULED):
            raise InvalidRequestError("clear needs 'queue' or 'scheduled'")
        queue = self._live_queue(queue_name)
        now = self._clock.now()
        bound = visible_bound(now)
        guard = Guard.ANY if scope & ClearScope.DESTRUCTIVE else Guard.NOT_VALIDLY_LEASED
        removed = 0
        for partition in range(queue.partitions):
            ids = [
                item.id
                for item in self._store.iter_items(queue.name, partition)
                if (ClearScope.SCHEDULED in scope and item.id >= bound)
                or (ClearScope.QUEUE in scope and item.id < bound)
            ]
            removed += len(ids) - len(self._store.delete(queue.name, partition, ids, guard=guard, now=now))
        return removed

    def list_items(
        self, queue_name: str, partition: int, *, pivot: str = "", limit: int = 1000
    ) -> list[Item]:
        """Items of one partition that are not scheduled, in FIFO order from ``pivot`` (inclusive)."""
        queue = self._listable(queue_name, partition, limit)
        return self._store.list_items(
            queue.name, partition, limit=limit, pivot=pivot, upper=visible_bound(self._clock.now())
        )

    def list_scheduled(
        self, queue_name: str, partition: int, *, pivot: str = "", limit: int = 1000
    ) -> list[Item]:
        """Scheduled items of one partition, in the order they become visible."""
        queue = self._listable(queue_name, partition, limit)
        return self._store.list_items(
            queue.name, partition, limit=limit, pivot=pivot, lower=visible_bound(self._clock.now())
        )

    def _listable(self, queue_name: str, partition: int, limit: int) -> QueueInfo:
        if not 1 <= limit <= MAX_BATCH:
            raise InvalidRequestError(f"limit must be between 1 and {MAX_BATCH}", field="limit")
        queue = self._live_queue(queue_name)
        self._check_partition(queue, partition)
        return queue

    def import_items(self, queue_name: str, partition: int, items: Sequence[StorageItem]) -> list[str]:
        """Write items verbatim under new ids, skipping those whose ``source_id`` is already there."""
        if not 1 <= len(items) <= MAX_BATCH:
            raise InvalidRequestError(f"import takes 1 to {MAX_BATCH} items", field="items")
        queue = self._live_queue(queue_name)
        self._check_partition(queue, partition)
        now = self._clock.now()
        seen = self._store.source_ids(queue.name, partition) if any(i.source_id for i in items) else set()
        fresh: list[Item] = []
        for item in items:
            if item.source_id and item.source_id in seen:
                continue
            seen.add(item.source_id)
            created = item.created_at or now
            visible = item.enqueue_at if item.enqueue_at is not None and item.enqueue_at > now else now
            fresh.append(
                Item(
                    id=self._ids.new_id(visible),
                    payload=item.payload,
                    reference=item.reference,
                    encoding=item.encoding,
                    kind=item.kind,
                    attempts=item.attempts,
                    lease_deadline=item.lease_deadline,
                    expire_deadline=item.expire_deadline
                    or lifecycle.expire_deadline(visible, queue.expire_timeout),
                    created_at=created,
                    enqueue_at=item.enqueue_at if visible > now else None,
                    source_id=item.source_id,
                )
            )
        self._store.put_new(queue.name, partition, fresh)
        return [i.id for i in fresh]

    def delete_items(self, queue_name: str, partition: int, ids: Sequence[str]) -> None:
        """Delete items in any state; deleting an item that is gone already succeeds."""
        queue, valid, failed = self._leased_ids(queue_name, partition, ids)
        if failed:
            raise InvalidRequestError(f"'{failed[0].id}' is not an item id", id=failed[0].id)
        self._store.delete(queue.name, partition, valid, guard=Guard.ANY, now=self._clock.now())

    # -- reaper -----------------------------------------------------------------------------------

    def reap(self, now: datetime, time_budget: timedelta) -> ReapReport:
        """Dead-letter what ran out of attempts or expired while nobody leased, in every queue.

        Stops when ``time_budget`` (measured on the service's clock) is spent, saving a bookmark the
        next run resumes from, and finishes deleting queues whose delete was interrupted.
        """
        started = self._clock.now()
        report = ReapReport()
        queue_from, partition_from, item_from = _parse_bookmark(self._catalog.load_bookmark())
        every_queue = list(self._catalog.iterate())
        dead_queues = {q.dead_queue for q in every_queue if q.dead_queue}
        queues = [q for q in every_queue if q.name >= queue_from]
        for queue in queues:
            report.queues += 1
            if queue.deleting:
                self._purge(queue)
                report.queues_deleted += 1
                continue
            first = partition_from if queue.name == queue_from else 0
            for partition in range(first, queue.partitions):
                report.partitions += 1
                start_after = item_from if (queue.name, partition) == (queue_from, partition_from) else None
                while True:
                    page = self._store.scan(queue.name, partition, limit=_PAGE_MAX, start_after=start_after)
                    for state in page.items:
                        report.scanned += 1
                        report.dead_letter_depth += queue.name in dead_queues
                        waiting = visible_at_of(state.id) <= now and not _validly_leased(state, now)
                        if waiting and now - state.created_at > report.oldest_item_age:
                            report.oldest_item_age = now - state.created_at
                        decision = lifecycle.decide_for_reaper(state, queue, now)
                        if decision.action is Action.DEAD_LETTER:
                            self._settle(queue, partition, state, decision, now, report)
                    start_after = page.next_start
                    if self._clock.now() - started >= time_budget:
                        # Resume after this page, or with the next partition when this one is done.
                        mark = (partition, start_after) if start_after is not None else (partition + 1, None)
                        self._catalog.save_bookmark(_bookmark(queue.name, *mark))
                        report.finished = False
                        return report
                    if start_after is None:
                        break
        self._catalog.save_bookmark(None)
        return report


def _validly_leased(state: ItemState, now: datetime) -> bool:
    return state.lease_deadline is not None and state.lease_deadline > now


def _bookmark(queue: str, partition: int, item_id: str | None) -> str:
    return f"{queue}~{partition}~{item_id or ''}"


def _parse_bookmark(bookmark: str | None) -> tuple[str, int, str | None]:
    if not bookmark:
        return "", 0, None
    queue, partition, item_id = bookmark.split("~")
    return queue, int(partition), item_id or None


__all__ = ["QueueService", "ReapReport"]
