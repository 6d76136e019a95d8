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
    RetryLaterError,
)
from querator.domain.ids import ITEMS_END, IdFactory, parse_item_id, visible_bound
from querator.domain.lifecycle import Action
from querator.domain.model import (
    MAX_BATCH,
    REPLY_SIZE_THRESHOLD,
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
    timestamp_us,
    validate_queue_name,
)
from querator.ports import Guard, IdempotencyRecord, Move, Recount

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from querator.domain.model import ItemState, NewItem, RetryRequest, StorageItem
    from querator.ports import Clock, ItemStore, LeaseRecord, PartitionHead, QueueCatalog

log = logging.getLogger(__name__)

NOT_LEASED = "item is unknown, stale or not leased"
#: A pending idempotency record older than this belongs to a request that died while writing.
IDEMPOTENCY_STALE_AFTER = timedelta(minutes=15)
#: How long a produce with an idempotency key is remembered.
IDEMPOTENCY_TTL = timedelta(hours=24)
_FIRST_PAGE_MIN = 50
_PAGE_MAX = 1000
#: The reaper's first read of a partition's waiting items: the oldest one's age, and whether any expired.
_REAPER_FIRST_PAGE = 10
#: Lost claims in a row, with nothing won, after which a lease reads its page again.
_LOSSES_BEFORE_RESCAN = 3
#: Re-reads of a page lost to other consumers before a lease moves on to the next partition.
_MAX_RESCANS = 3
#: Claims of one lease in flight at once, reached by doubling from one while nothing is lost:
#: one more in flight per this many candidates (a lease of 10 claims one at a time, of 128 or more
#: 16 at a time).
_WAVE_MAX = 16
_ITEMS_PER_CONCURRENT_CLAIM = 8
#: Candidates a lease may jump among after a lost race: at least this many, or twice its batch (its
#: lease record lists them all, and putting an expired lease back reads each of them once).
_MIN_POOL = 8
#: Lease records a lease call (or the reaper, per read) puts back at most.
_RECORDS_PER_CALL = 25
#: The cursor never passes ids younger than this: a write minted that recently may still be on its
#: way (write latency, retries, clock skew between processes); docs/adr/0050-engine-v2.md.
CURSOR_LAG = timedelta(seconds=1)
#: The sweep reads ids this long after they became visible: longer than any write may take to land
#: (function timeouts are 30 s at most), so a straggler it misses cannot exist.
SWEEP_DELAY = timedelta(minutes=2)
#: A lease or listing reply stays under this: Lambda answers at most 6 MB (6,291,456 bytes).
MAX_REPLY_BYTES = 5_000_000
#: What an item's fixed fields (id, deadlines, attempts, keys, JSON punctuation) add to a reply.
_REPLY_ITEM_OVERHEAD = 400
#: Defaults for how long one call may keep writing: a lease claiming after its wait, a clear, the
#: purge inside ``queues.delete`` (the reaper finishes a delete that needs longer).
DEFAULT_CLAIM_BUDGET = timedelta(seconds=5)
DEFAULT_CLEAR_BUDGET = timedelta(seconds=20)
DEFAULT_PURGE_BUDGET = timedelta(seconds=10)
#: How often the reaper recounts each partition's items to heal counter drift (O(stored) each time).
DEFAULT_RECOUNT_PERIOD = timedelta(hours=24)
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
    #: Age of the oldest waiting item of every queue that is not a dead-letter queue (how far behind
    #: consumers are); dead-letter queues report ``dead_letter_depth`` instead.
    oldest_item_age: timedelta = timedelta(0)
    #: Items stored in queues that serve as another queue's dead-letter queue (from their counters).
    dead_letter_depth: int = 0
    #: Expired leases found through their lease records.
    recovered: int = 0
    #: Items put back at the tail after their lease ran out.
    requeued: int = 0
    #: Never-leased items the sweep found behind a cursor (and requeued or dead-lettered).
    stragglers: int = 0
    #: Scheduled items that came due since the last pass.
    came_due: int = 0
    #: Partitions whose counters a finished recount replaced.
    recounted: int = 0


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
    claim_budget, clear_budget, purge_budget
        How long a lease may keep claiming once it found items, a clear may keep deleting, and a
        queue delete may purge before leaving the rest to the reaper (on the service's clock).
    recount_period
        How often the reaper recounts a partition to heal drift in the counters ``stats`` reads.
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
        claim_budget: timedelta = DEFAULT_CLAIM_BUDGET,
        clear_budget: timedelta = DEFAULT_CLEAR_BUDGET,
        purge_budget: timedelta = DEFAULT_PURGE_BUDGET,
        recount_period: timedelta = DEFAULT_RECOUNT_PERIOD,
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
        self._claim_budget = claim_budget
        self._clear_budget = clear_budget
        self._purge_budget = purge_budget
        self._recount_period = recount_period
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
        # A big queue takes longer than a request may run: the reaper finishes what is left.
        self._purge(info, stop_at=self._clock.now() + self._purge_budget)

    def _purge(self, info: QueueInfo, *, stop_at: datetime) -> bool:
        """Delete a deleting queue's rows page by page, in bounded memory; True once it is gone.

        Deleted rows are gone from the next read, so the partitions themselves are the bookmark.
        """
        for partition in range(info.partitions):
            while self._store.purge_page(info.name, partition, limit=_PAGE_MAX):
                if self._clock.now() >= stop_at:
                    return False
        self._catalog.remove(info.name)
        return True

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
            self._store.put_new(queue.name, partition, stored, now=now)
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
            self._store.put_absent(queue.name, partition, stored, now=now)
        else:
            self._store.put_new(queue.name, partition, stored, now=now)
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
        until ``timeout`` and then raises ``NothingToLeaseError``. Claiming stops once the call has
        spent ``claim_budget`` past the attempt that found items, so a lease of 1,000 answers within
        the platform's deadline with what it has claimed; the rest stays unclaimed.
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
        """Claim up to ``batch_size`` items of one partition, reading from its lease cursor.

        Reads O(batch): expired leases come from the lease records already due (one key range), and
        the candidates from the cursor on, past which no valid lease sits except the few claimed
        since the cursor last moved (docs/adr/0050-engine-v2.md).
        """
        head, due = self._store.head(queue.name, partition, now=now, records=_RECORDS_PER_CALL)
        if due:
            # Expired leases go back to the tail (new ids above the cursor) before this lease reads.
            self._recover(queue, partition, due, now, ReapReport())
        stop_at = now + self._claim_budget
        lease_deadline = now + queue.lease_timeout
        end = visible_bound(now)
        # The cursor never passes ids younger than CURSOR_LAG: a write minted a moment ago may still
        # be on its way to the store, and the cursor must not jump over it (docs/adr/0050).
        cursor_cap = visible_bound(now - CURSOR_LAG)
        start = head.cursor
        first_open: str | None = None  # the oldest item this call saw available and left unclaimed
        claimed: list[Item] = []
        reply_bytes = 0
        limit = min(_PAGE_MAX, max(_FIRST_PAGE_MIN, 2 * batch_size))
        read_to = start
        evaluated = 0
        rescans = 0
        while len(claimed) < batch_size and self._clock.now() < stop_at:
            page = self._store.scan(
                queue.name, partition, start=start, end=end, limit=limit, available_at=now
            )
            candidates: list[ItemState] = []
            settle: list[tuple[ItemState, lifecycle.Decision]] = []
            for state in page.items:
                decision = lifecycle.decide_for_lease(state, queue, now)
                if decision.action is Action.LEASE:
                    candidates.append(state)
                elif decision.action is not Action.KEEP:
                    settle.append((state, decision))
            if settle:
                report = ReapReport()
                self._settle_states(queue, partition, settle, now, report)
                if report.skipped:
                    first_open = _min_id(first_open, settle[0][0].id)
            # The pool: more candidates than wanted, so that after a lost race a consumer can jump
            # to one its competitors are not claiming (each loss is a charged write), but few enough
            # that the lease record listing them stays a small write.
            wanted = batch_size - len(claimed)
            pool = candidates[: max(2 * wanted, _MIN_POOL)]
            # The first item is taken whatever its size (a lease returns at least one); after it the
            # reply must stay under the cap.
            won: list[Item] = []
            untried: set[str] = set()
            contended = False
            if pool:
                first = _reply_bytes(pool[0])
                room = MAX_REPLY_BYTES - reply_bytes if claimed else max(MAX_REPLY_BYTES, first)
                won, untried, contended = self._claim(
                    queue, partition, pool, wanted, room, lease_deadline, now, stop_at
                )
            claimed += won
            won_ids = {item.id for item in won}
            reply_bytes += sum(_reply_bytes(s) for s in pool if s.id in won_ids)
            pooled = {s.id for s in pool}
            leftover = [s.id for s in candidates if s.id in untried or s.id not in pooled]
            if leftover:
                first_open = _min_id(first_open, min(leftover))
            if contended and not claimed and rescans < _MAX_RESCANS:
                # Other consumers took this page's candidates since it was read: read it again rather
                # than keep trying stale ids (a Query costs reads; each lost claim is a charged write).
                rescans += 1
                continue
            read_to = page.read_to
            evaluated += page.evaluated
            if contended or page.done or first_open is not None:
                break
            start = page.read_to
            limit = _PAGE_MAX
        cursor = min(read_to, cursor_cap) if first_open is None else min(first_open, read_to, cursor_cap)
        # The cursor moves only past items: over an empty range it would save no later read, and
        # an idle consumer's every poll would be a write.
        moved = cursor > head.cursor and evaluated > 0
        if claimed or moved:
            self._store.note_leased(queue.name, partition, claimed, cursor=cursor if moved else None)
        # Claimed out of order after a lost race; the reply is oldest first all the same (contract).
        return sorted(claimed, key=lambda item: item.id)

    def _claim(
        self,
        queue: QueueInfo,
        partition: int,
        candidates: list[ItemState],
        wanted: int,
        max_bytes: int,
        lease_deadline: datetime,
        now: datetime,
        stop_at: datetime,
    ) -> tuple[list[Item], set[str], bool]:
        """Claim up to ``wanted`` of ``candidates`` (oldest first) in waves of concurrent conditional
        writes, never more than ``max_bytes`` of reply.

        Files one lease record for the candidates first, so a claim is never without a record that
        brings it back when its lease runs out, even if this process dies right after the claim.

        Returns the items won, the ids not tried, and whether it stopped because of contention.
        Alone, a consumer claims strictly oldest first and never loses; its waves double from 1 to
        one claim in flight per ``_ITEMS_PER_CONCURRENT_CLAIM`` candidates, at most ``_WAVE_MAX``.
        A lost race means other consumers are claiming from the same page, so the rest of it is
        going stale, and every further loss is a charged write: after a loss the wave drops back to
        one claim taken from a random point of the remaining candidates; the call stops after two
        losses in a row once it has won something (the contract returns as soon as one item is
        leased) and gives the page up after ``_LOSSES_BEFORE_RESCAN`` losses in a row with nothing
        won. Measured in docs/adr/0050-engine-v2.md.
        """
        pending = [s.id for s in candidates]
        if not pending:
            return [], set(), False
        sizes = {s.id: _reply_bytes(s) for s in candidates}
        self._store.record_lease(queue.name, partition, pending, deadline=lease_deadline)
        # Small leases claim one at a time, as concurrent consumers of the same page lose least that
        # way (every loss is a charged write); large ones need concurrency to fit their deadline.
        wave_max = max(1, min(_WAVE_MAX, wanted // _ITEMS_PER_CONCURRENT_CLAIM))
        won: list[Item] = []
        room = max_bytes
        wave = 1
        losses = 0
        at = 0
        while pending and len(won) < wanted and self._clock.now() < stop_at:
            if at + min(wave, len(pending)) > len(pending):
                at = 0
            batch: list[str] = []
            while at < len(pending) and len(batch) < min(wave, wanted - len(won)):
                if sizes[pending[at]] > room:
                    break
                room -= sizes[pending[at]]
                batch.append(pending.pop(at))
            if not batch:
                break  # the reply is full: the rest stays unclaimed
            got = self._store.claim(queue.name, partition, batch, lease_deadline=lease_deadline, now=now)
            won += got
            room += sum(sizes[i] for i in batch) - sum(sizes[i.id] for i in got)
            if len(got) == len(batch):
                losses = 0
                wave = min(wave * 2, wave_max)
                continue
            losses += len(batch) - len(got)
            if (won and losses > 1) or losses >= _LOSSES_BEFORE_RESCAN:
                return won, set(pending), True
            wave = 1
            at = self._rng.randrange(len(pending)) if pending else 0
        return won, set(pending), False

    def _recover(
        self,
        queue: QueueInfo,
        partition: int,
        records: Sequence[LeaseRecord],
        now: datetime,
        report: ReapReport,
    ) -> None:
        """Put back the expired leases of lease records that are due, then drop the records.

        Reads only the records' items: O(expired), however many valid leases the partition holds.
        An item whose lease was renewed is covered by the record its renewal filed; a record whose
        item could not be settled (dead-letter queue missing) is kept for the next try.
        """
        for record in records:
            states = self._store.states(queue.name, partition, record.ids)
            expired = [
                (state, lifecycle.decide_for_lease(state, queue, now))
                for state in states
                if state.lease_deadline is not None and state.lease_deadline <= now
            ]
            skipped = report.skipped
            self._settle_states(queue, partition, expired, now, report)
            report.recovered += len(expired)
            if report.skipped == skipped:
                self._store.drop_lease_record(queue.name, partition, record.key)

    def _settle_states(
        self,
        queue: QueueInfo,
        partition: int,
        found: Sequence[tuple[ItemState, lifecycle.Decision]],
        now: datetime,
        report: ReapReport,
        *,
        requeue_guard: Guard = Guard.LEASE_EXPIRED,
    ) -> None:
        """Requeue or dead-letter items found by a read, counting what happened in ``report``.

        ``requeue_guard``: the state a requeued item must still be in (an expired lease, or never
        leased for the sweep's stragglers); a competitor that acted first makes the move a no-op.
        """
        if not found:
            return
        if not queue.dead_queue:
            # Dead-lettering without a dead-letter queue deletes: the ids suffice, no item is read.
            self._delete_dead(
                queue, partition, [(s, d) for s, d in found if d.action is Action.DEAD_LETTER], now, report
            )
            found = [(s, d) for s, d in found if d.action is not Action.DEAD_LETTER]
            if not found:
                return
        items = self._store.get_many(queue.name, partition, [state.id for state, _ in found])
        requeue: list[Move] = []
        dead: list[tuple[Item, Guard, str]] = []
        for state, decision in found:
            item = items.get(state.id)
            if item is None:
                continue  # someone else got there first
            if decision.action is Action.REQUEUE:
                requeue.append(self._requeue_move(queue, partition, item, now))
            elif decision.action is Action.DEAD_LETTER:
                guard = Guard.LEASE_EXPIRED if item.lease_deadline is not None else Guard.NOT_VALIDLY_LEASED
                dead.append((item, guard, decision.reason))
        if requeue:
            moved = self._store.move(queue.name, partition, requeue, guard=requeue_guard, now=now)
            report.requeued += sum(moved)
        for guard in (Guard.LEASE_EXPIRED, Guard.NOT_VALIDLY_LEASED):
            batch = [(item, reason) for item, g, reason in dead if g is guard]
            if not batch:
                continue
            try:
                done = self._dead_letter(queue, partition, [item for item, _ in batch], guard, now, report)
            except DeadLetterQueueMissingError:
                log.warning("dead_queue of %s is missing; %d item(s) stay", queue.name, len(batch))
                report.skipped += len(batch)
                continue
            for (_, reason), ok in zip(batch, done, strict=True):
                if ok:
                    report.counts_by_reason[reason] = report.counts_by_reason.get(reason, 0) + 1

    def _delete_dead(
        self,
        queue: QueueInfo,
        partition: int,
        found: Sequence[tuple[ItemState, lifecycle.Decision]],
        now: datetime,
        report: ReapReport,
    ) -> None:
        for guard in (Guard.LEASE_EXPIRED, Guard.NOT_VALIDLY_LEASED):
            batch = [
                (s, d) for s, d in found if (s.lease_deadline is not None) == (guard is Guard.LEASE_EXPIRED)
            ]
            if not batch:
                continue
            failed = set(
                self._store.delete(queue.name, partition, [s.id for s, _ in batch], guard=guard, now=now)
            )
            for state, decision in batch:
                if state.id not in failed:
                    report.deleted += 1
                    report.counts_by_reason[decision.reason] = (
                        report.counts_by_reason.get(decision.reason, 0) + 1
                    )

    def _requeue_move(self, queue: QueueInfo, partition: int, item: Item, visible_at: datetime) -> Move:
        return Move(
            item=item,
            target_queue=queue.name,
            target_partition=partition,
            replacement=self._requeued(item, visible_at),
        )

    def _requeued(self, item: Item, visible_at: datetime) -> Item:
        """The item back in the queue: a new id at ``visible_at`` (the tail, or a scheduled time)."""
        return replace(item, id=self._ids.new_id(visible_at), lease_deadline=None, enqueue_at=None)

    def _dead_letter(
        self,
        queue: QueueInfo,
        partition: int,
        items: Sequence[Item],
        guard: Guard,
        now: datetime,
        report: ReapReport,
    ) -> list[bool]:
        """Move ``items`` to the queue's dead-letter queue (delete them when it has none)."""
        if not queue.dead_queue:
            failed = set(
                self._store.delete(queue.name, partition, [i.id for i in items], guard=guard, now=now)
            )
            done = [i.id not in failed for i in items]
            report.deleted += sum(done)
            return done
        try:
            target = self._cached_record(queue.dead_queue)
        except QueueNotFoundError as exc:
            raise DeadLetterQueueMissingError(
                f"dead_queue '{queue.dead_queue}' of '{queue.name}' does not exist"
            ) from exc
        moves = []
        for item in items:
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
            moves.append(
                Move(item=item, target_queue=target.name, target_partition=target_partition, replacement=dead)
            )
        done = self._store.move(queue.name, partition, moves, guard=guard, now=now)
        report.dead_lettered += sum(done)
        return done

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
        items = self._store.get_many(queue.name, partition, list(wanted))
        requeue: list[Move] = []
        dead: list[Item] = []
        for item_id, request in wanted.items():
            item = items.get(item_id)
            if item is None or not item.is_leased(now):
                failed.append(IdFailure(id=item_id, reason=NOT_LEASED))
                continue
            plan = lifecycle.plan_retry(request, item.attempts, queue, now)
            if plan.action is Action.DEAD_LETTER:
                dead.append(item)
                continue
            assert plan.visible_at is not None  # noqa: S101 - plan_retry sets it for REQUEUE
            replacement = self._requeued(item, plan.visible_at)
            if plan.visible_at > now:
                replacement = replace(replacement, enqueue_at=plan.visible_at)
            requeue.append(
                Move(item=item, target_queue=queue.name, target_partition=partition, replacement=replacement)
            )
        outcomes: dict[str, bool] = {}
        if requeue:
            done = self._store.move(queue.name, partition, requeue, guard=Guard.LEASE_VALID, now=now)
            outcomes.update((m.item.id, ok) for m, ok in zip(requeue, done, strict=True))
        if dead:
            done = self._dead_letter(queue, partition, dead, Guard.LEASE_VALID, now, ReapReport())
            outcomes.update((item.id, ok) for item, ok in zip(dead, done, strict=True))
        applied = [i for i in wanted if outcomes.get(i)]
        failed += [IdFailure(id=i, reason=NOT_LEASED) for i, ok in outcomes.items() if not ok]
        return BatchOutcome(applied=applied, failed=failed)

    def renew(
        self, queue_name: str, partition: int, ids: Sequence[str], *, lease_timeout: timedelta | None = None
    ) -> RenewOutcome:
        """Set valid leases to now + ``lease_timeout`` (default: the queue's).

        A lease record is filed under the new deadline first, so a renewed lease that later runs
        out is found like any other.
        """
        queue, valid, failed = self._leased_ids(queue_name, partition, ids)
        timeout = queue.lease_timeout if lease_timeout is None else lease_timeout
        if timeout <= timedelta(0):
            raise InvalidRequestError("lease_timeout must be greater than zero", field="lease_timeout")
        now = self._clock.now()
        deadline = now + timeout
        if valid:
            self._store.record_lease(queue.name, partition, valid, deadline=deadline)
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
        """Counts and ages per partition from the partitions' counters: one read per 100 partitions.

        Counts are exact while no write of the queue failed between its items and its counters;
        ``scheduled`` counts items whose time had not come at the reaper's last pass (so an item
        that came due since then counts as scheduled until the next pass), ages are to the second.
        """
        queue = self._live_queue(queue_name)
        now = self._clock.now()
        heads = self._store.heads(queue.name, list(range(queue.partitions)))
        return [_partition_stats(partition, head, now) for partition, head in enumerate(heads)]

    def clear(self, queue_name: str, scope: ClearScope) -> int:
        """Remove un-leased items (``QUEUE``), scheduled ones (``SCHEDULED``), leased ones too
        (``DESTRUCTIVE``). Returns how many were removed.

        Works page by page in bounded memory; when ``clear_budget`` runs out first it raises
        ``RetryLaterError`` saying how many it removed: calling again continues (removed items are
        gone, so the partition itself is the bookmark).
        """
        if not scope & (ClearScope.QUEUE | ClearScope.SCHEDULED):
            raise InvalidRequestError("clear needs 'queue' or 'scheduled'")
        queue = self._live_queue(queue_name)
        now = self._clock.now()
        stop_at = self._clock.now() + self._clear_budget
        bound = visible_bound(now)
        destructive = ClearScope.DESTRUCTIVE in scope
        guard = Guard.ANY if destructive else Guard.NOT_VALIDLY_LEASED
        removed = 0
        for partition in range(queue.partitions):
            head, due = self._store.head(queue.name, partition, now=now, records=_RECORDS_PER_CALL)
            ranges: list[tuple[str, str]] = []
            if ClearScope.QUEUE in scope:
                if due and not destructive:
                    # Expired leases are waiting items too: back to the queue, then cleared with it.
                    self._recover(queue, partition, due, now, ReapReport())
                # Below the cursor every item is leased or gone: a non-destructive clear starts there.
                ranges.append(("" if destructive else head.cursor, bound))
            if ClearScope.SCHEDULED in scope:
                ranges.append((bound, ITEMS_END))
            for first, end in ranges:
                start = first
                while True:
                    page = self._store.scan(
                        queue.name,
                        partition,
                        start=start,
                        end=end,
                        limit=_PAGE_MAX,
                        available_at=None if destructive else now,
                    )
                    ids = [state.id for state in page.items]
                    failed = self._store.delete(queue.name, partition, ids, guard=guard, now=now)
                    removed += len(ids) - len(failed)
                    if page.done:
                        break
                    start = page.read_to
                    if self._clock.now() >= stop_at:
                        raise RetryLaterError(
                            f"clear removed {removed} item(s) of '{queue.name}' and has more to remove;"
                            " call it again to continue"
                        )
        return removed

    def list_items(
        self, queue_name: str, partition: int, *, pivot: str = "", limit: int = 1000
    ) -> list[Item]:
        """Items of one partition that are not scheduled, in FIFO order from ``pivot`` (inclusive).

        A page stops early rather than pass ``MAX_REPLY_BYTES`` of payload; ``pivot`` continues it.
        """
        queue = self._listable(queue_name, partition, limit)
        return self._store.list_items(
            queue.name,
            partition,
            limit=limit,
            pivot=pivot,
            upper=visible_bound(self._clock.now()),
            max_bytes=MAX_REPLY_BYTES,
        )

    def list_scheduled(
        self, queue_name: str, partition: int, *, pivot: str = "", limit: int = 1000
    ) -> list[Item]:
        """Scheduled items of one partition, in the order they become visible."""
        queue = self._listable(queue_name, partition, limit)
        return self._store.list_items(
            queue.name,
            partition,
            limit=limit,
            pivot=pivot,
            lower=visible_bound(self._clock.now()),
            max_bytes=MAX_REPLY_BYTES,
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
        leased = [i for i in fresh if i.lease_deadline is not None and i.lease_deadline > now]
        for deadline in sorted({i.lease_deadline for i in leased if i.lease_deadline is not None}):
            # An imported lease is found by its record when it runs out, like any other.
            ids = [i.id for i in leased if i.lease_deadline == deadline]
            self._store.record_lease(queue.name, partition, ids, deadline=deadline)
        self._store.put_new(queue.name, partition, fresh, now=now)
        return [i.id for i in fresh]

    def delete_items(self, queue_name: str, partition: int, ids: Sequence[str]) -> None:
        """Delete items in any state; deleting an item that is gone already succeeds."""
        queue, valid, failed = self._leased_ids(queue_name, partition, ids)
        if failed:
            raise InvalidRequestError(f"'{failed[0].id}' is not an item id", id=failed[0].id)
        self._store.delete(queue.name, partition, valid, guard=Guard.ANY, now=self._clock.now())

    # -- reaper -----------------------------------------------------------------------------------

    def reap(self, now: datetime, time_budget: timedelta) -> ReapReport:
        """Do what nobody else does, in every queue: O(partitions + due items) a run.

        Per partition: put back expired leases whose records are due (consumers do it too, but an
        idle queue has none), dead-letter items that outlived ``expire_timeout`` (the head of the
        cursor's range), requeue stragglers behind the cursor (the sweep), and count scheduled items
        that came due. Queue deletes run first with at most half the budget, page by page, so a huge
        delete never starves the rest. Stops when ``time_budget`` (on the service's clock) is spent,
        saving a bookmark the next run resumes from.
        """
        started = self._clock.now()
        stop_at = started + time_budget
        report = ReapReport()
        every_queue = list(self._catalog.iterate())
        for queue in (q for q in every_queue if q.deleting):
            if not self._purge(queue, stop_at=started + time_budget / 2):
                report.finished = False
                break
            report.queues_deleted += 1
        queue_from, partition_from = _parse_bookmark(self._catalog.load_bookmark())
        dead_queues = {q.dead_queue for q in every_queue if q.dead_queue}
        for queue in every_queue:
            if queue.deleting or queue.name < queue_from:
                continue
            report.queues += 1
            first = partition_from if queue.name == queue_from else 0
            for partition in range(first, queue.partitions):
                # Every run reaps at least one partition, so runs make progress whatever the budget.
                if report.partitions and self._clock.now() >= stop_at:
                    self._catalog.save_bookmark(_bookmark(queue.name, partition))
                    report.finished = False
                    return report
                report.partitions += 1
                self._reap_partition(queue, partition, now, report, queue.name in dead_queues, stop_at)
        self._catalog.save_bookmark(None)
        return report

    def _reap_partition(
        self,
        queue: QueueInfo,
        partition: int,
        now: datetime,
        report: ReapReport,
        is_dead_queue: bool,
        stop_at: datetime,
    ) -> None:
        head, due = self._store.head(queue.name, partition, now=now, records=_RECORDS_PER_CALL)
        while due:
            self._recover(queue, partition, due, now, report)
            if len(due) < _RECORDS_PER_CALL or self._clock.now() >= stop_at:
                break
            head, due = self._store.head(queue.name, partition, now=now, records=_RECORDS_PER_CALL)
        if is_dead_queue:
            report.dead_letter_depth += max(head.items, 0)
        self._reap_head(queue, partition, head, now, report, stop_at, is_dead_queue=is_dead_queue)
        self._sweep(queue, partition, head, now, report, stop_at)
        if head.recount is not None or (
            head.recounted_at is not None and now - head.recounted_at >= self._recount_period
        ):
            self._recount(queue, partition, head, now, report, stop_at)
        elif head.scheduled > 0 and head.schedule_mark:
            # Not while a recount runs: the pass would move the version and void the recount.
            report.came_due += self._store.pass_schedule(
                queue.name, partition, old_mark=head.schedule_mark, new_mark=visible_bound(now), now=now
            )

    def _reap_head(
        self,
        queue: QueueInfo,
        partition: int,
        head: PartitionHead,
        now: datetime,
        report: ReapReport,
        stop_at: datetime,
        *,
        is_dead_queue: bool = False,
    ) -> None:
        """Dead-letter the waiting items that outlived ``expire_timeout``; note the oldest one's age
        (not in dead-letter queues: an old dead letter is not a consumer falling behind).

        An item expires ``expire_timeout`` after it became visible, which is what its id sorts by,
        so everything expired is at the head of the range from the cursor: reading stops at the
        first id younger than that, and one short read suffices when nothing is due.
        """
        expired_below = visible_bound(now - queue.expire_timeout)
        start = head.cursor
        limit = _REAPER_FIRST_PAGE
        first = True
        end = visible_bound(now)
        while True:
            page = self._store.scan(
                queue.name, partition, start=start, end=end, limit=limit, available_at=now
            )
            report.scanned += len(page.items)
            if first and page.items and not is_dead_queue:
                report.oldest_item_age = max(report.oldest_item_age, now - page.items[0].created_at)
            first = False
            found = []
            for state in page.items:
                if state.id >= expired_below:
                    break
                decision = lifecycle.decide_for_reaper(state, queue, now)
                if decision.action is Action.DEAD_LETTER:
                    found.append((state, decision))
            self._settle_states(queue, partition, found, now, report)
            if page.done or page.read_to >= expired_below or self._clock.now() >= stop_at:
                return
            # Past the first page only expired items are wanted: read no further than they go.
            start, end, limit = page.read_to, expired_below, _PAGE_MAX

    def _sweep(
        self,
        queue: QueueInfo,
        partition: int,
        head: PartitionHead,
        now: datetime,
        report: ReapReport,
        stop_at: datetime,
    ) -> None:
        """Requeue items that were never leased but sit below the cursor: writes that landed after a
        lease read past their place. Each id is read once, ``SWEEP_DELAY`` after it became visible,
        when every write minted with it has landed or failed."""
        end = min(head.cursor, visible_bound(now - SWEEP_DELAY))
        start = head.sweep
        if start >= end:
            return
        while True:
            page = self._store.scan(
                queue.name, partition, start=start, end=end, limit=_PAGE_MAX, never_leased=True
            )
            found = []
            for state in page.items:
                decision = lifecycle.decide_for_lease(state, queue, now)
                # A straggler still to lease goes to the tail; one already expired is dead-lettered.
                found.append((state, decision if decision.action is Action.DEAD_LETTER else _STRAGGLER))
            report.stragglers += len(found)
            self._settle_states(queue, partition, found, now, report, requeue_guard=Guard.NEVER_LEASED)
            if page.done:
                self._store.set_sweep(queue.name, partition, end)
                return
            start = page.read_to
            if self._clock.now() >= stop_at:
                self._store.set_sweep(queue.name, partition, start)
                return

    def _recount(
        self,
        queue: QueueInfo,
        partition: int,
        head: PartitionHead,
        now: datetime,
        report: ReapReport,
        stop_at: datetime,
    ) -> None:
        """Count the partition's items page by page (over several runs if need be) and replace the
        counters with the count if nothing changed them meanwhile, so drift from a lost counter
        write heals. O(stored) once per ``recount_period``, in the reaper's budget."""
        recount = head.recount or Recount(version=head.version)
        totals = {
            name: getattr(recount, name)
            for name in (
                "items",
                "leased",
                "scheduled",
                "created_sum",
                "leased_created_sum",
                "scheduled_created_sum",
            )
        }
        position = recount.position
        while True:
            page = self._store.scan(queue.name, partition, start=position, end=ITEMS_END, limit=_PAGE_MAX)
            for state in page.items:
                created = timestamp_us(state.created_at) // 1_000_000
                totals["items"] += 1
                totals["created_sum"] += created
                if state.lease_deadline is not None:
                    totals["leased"] += 1
                    totals["leased_created_sum"] += created
                if state.enqueue_at is not None and state.id >= head.schedule_mark:
                    totals["scheduled"] += 1
                    totals["scheduled_created_sum"] += created
            report.scanned += len(page.items)
            progress = Recount(position=page.read_to, version=recount.version, **totals)
            if page.done:
                report.recounted += self._store.finish_recount(queue.name, partition, progress, now=now)
                return
            position = page.read_to
            if self._clock.now() >= stop_at:
                self._store.save_recount(queue.name, partition, progress)
                return


def _partition_stats(partition: int, head: PartitionHead, now: datetime) -> PartitionStats:
    now_s = timestamp_us(now) // 1_000_000
    total = max(head.items - head.scheduled, 0)
    leased = max(head.leased, 0)
    age = now_s * total - (head.created_sum - head.scheduled_created_sum)
    leased_age = now_s * leased - head.leased_created_sum
    return PartitionStats(
        partition=partition,
        total=total,
        total_leased=leased,
        scheduled=max(head.scheduled, 0),
        average_age=timedelta(seconds=max(age, 0) / total) if total else timedelta(0),
        average_leased_age=timedelta(seconds=max(leased_age, 0) / leased) if leased else timedelta(0),
    )


def _reply_bytes(state: ItemState) -> int:
    """What an item adds to a lease reply at most: base64 payload and strings, plus its fixed part."""
    variable = max(state.payload_size, REPLY_SIZE_THRESHOLD)
    return 4 * -(-variable // 3) + _REPLY_ITEM_OVERHEAD


def _min_id(current: str | None, candidate: str) -> str:
    return candidate if current is None else min(current, candidate)


#: A straggler found by the sweep goes back to the tail like an expired lease.
_STRAGGLER = lifecycle.Decision(Action.REQUEUE, "straggler")


def _bookmark(queue: str, partition: int) -> str:
    return f"{queue}~{partition}"


def _parse_bookmark(bookmark: str | None) -> tuple[str, int]:
    if not bookmark:
        return "", 0
    queue, partition, *_ = bookmark.split("~")
    return queue, int(partition)


__all__ = ["QueueService", "ReapReport"]
