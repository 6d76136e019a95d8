"""Queue administration: create, update, delete (with its purge), stats, clear, health."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING

from querator.domain.errors import (
    ConflictError,
    InvalidRequestError,
    QueueAlreadyExistsError,
    QueueDeletingError,
    QueueNotFoundError,
    RetryLaterError,
)
from querator.domain.ids import visible_bound
from querator.domain.model import (
    MAX_BATCH,
    ClearScope,
    PartitionStats,
    timestamp_us,
    validate_new_queue_name,
    validate_queue_name,
)
from querator.domain.priority import band_end, band_start
from querator.ports import Guard
from querator.service.logs import ALL_BANDS
from querator.service.tuning import PAGE_MAX, RECORDS_PER_CALL, UPDATE_RETRIES

if TYPE_CHECKING:
    from datetime import datetime

    from querator.domain.model import QueueInfo, QueueUpdate
    from querator.ports import Clock, ItemStore, PartitionHead
    from querator.service.logs import LogCounts, Logs
    from querator.service.queues import QueueDirectory
    from querator.service.settle import Settler


class QueueAdmin:
    """The calls that change or inspect whole queues (rare, each bounded by its budget)."""

    def __init__(
        self,
        store: ItemStore,
        queues: QueueDirectory,
        settler: Settler,
        clock: Clock,
        *,
        clear_budget: timedelta,
        purge_budget: timedelta,
        logs: Logs | None = None,
    ) -> None:
        self._logs = logs
        self._store = store
        self._queues = queues
        self._catalog = queues.catalog
        self._settler = settler
        self._clock = clock
        self._clear_budget = clear_budget
        self._purge_budget = purge_budget

    def create_queue(self, info: QueueInfo) -> QueueInfo:
        """Create a queue. Raises ``QueueAlreadyExistsError``, ``InvalidRequestError``."""
        validate_new_queue_name(info.name)
        now = self._clock.now()
        info = replace(info, created_at=now, updated_at=now, deleting=False)
        self._check_dead_queue(info)
        try:
            self._catalog.create(info)
        except QueueAlreadyExistsError:
            # The name is free again once the reaper has emptied a deleted queue (docs/api.md).
            self._queues.live(info.name)
            raise
        self._queues.forget(info.name)
        return info

    def get_queue(self, name: str) -> QueueInfo:
        """The queue's record; ``QueueDeletingError`` (453) while ``queues.delete`` removes it."""
        return self._queues.live(name)

    def list_queues(self, *, pivot: str = "", limit: int = 100) -> list[QueueInfo]:
        if not 1 <= limit <= MAX_BATCH:
            raise InvalidRequestError(f"limit must be between 1 and {MAX_BATCH}", field="limit")
        return self._catalog.list(pivot=pivot, limit=limit)

    def update_queue(self, update: QueueUpdate) -> QueueInfo:
        """Change the fields present in ``update``; the rest stay as they are."""
        for attempt in range(UPDATE_RETRIES):
            current = self._queues.live(update.name)
            changes = {
                name: value
                for name in (
                    "lease_timeout",
                    "expire_timeout",
                    "max_attempts",
                    "dead_queue",
                    "reference",
                    "partitions",
                    "delivery",
                    "max_leased_per_group",
                    "rate_limit",
                    "rate_limit_per_group",
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
                if info.dead_queue:
                    self._check_not_a_dead_queue(info)
            if info.delivery != current.delivery:
                self._check_empty_for_delivery(current)
            try:
                self._catalog.replace(info, expected_updated_at=current.updated_at)
                self._queues.forget(info.name)
            except ConflictError:
                if attempt == UPDATE_RETRIES - 1:
                    raise
                continue
            return info
        raise AssertionError("unreachable")  # pragma: no cover

    def _check_empty_for_delivery(self, queue: QueueInfo) -> None:
        """``delivery`` changes only on an empty queue: fair and FIFO items sit under differently
        shaped ids, and a queue holding both would serve neither as asked."""
        heads = self._store.heads(queue.name, list(range(queue.partitions)))
        held = sum(max(head.items, 0) for head in heads)
        if self._logs is not None:
            # Engine v3's logs hold items too, counted in their heads.
            for partition, head in enumerate(heads):
                counts = self._log_counts(queue.name, partition, head)
                held += counts.total + counts.scheduled
        if held:
            raise InvalidRequestError(
                f"delivery can change only while '{queue.name}' is empty; it holds {held} item(s)",
                field="delivery",
            )

    def delete_queue(self, name: str) -> None:
        """Delete a queue and all its items (resumed by the reaper if interrupted)."""
        validate_queue_name(name)
        users = self._dead_lettering_into(name)
        if users:
            raise InvalidRequestError(
                f"queue '{name}' is the dead_queue of {', '.join(users)}; change those first", queue=name
            )
        info = self._catalog.mark_deleting(name)
        self._queues.forget(name)
        if self._queues.ttl > timedelta(0):
            # Other processes may still trust their copy of the queue for up to the cache TTL and
            # produce into it; purge only once every copy has expired, so nothing lands after.
            self._clock.sleep(self._queues.ttl.total_seconds())
        # A big queue takes longer than a request may run: the reaper finishes what is left, and
        # the call says so rather than a 200 while the queue is still there (docs/api.md).
        if not self.purge(info, stop_at=self._clock.now() + self._purge_budget):
            raise QueueDeletingError(
                f"queue '{name}' is being deleted: the reaper removes the rest of its items", queue=name
            )

    def purge(self, info: QueueInfo, *, stop_at: datetime) -> bool:
        """Delete a deleting queue's rows page by page, in bounded memory; True once it is gone.

        Deleted rows are gone from the next read, so the partitions themselves are the bookmark.
        """
        for partition in range(info.partitions):
            if self._logs is not None:
                # Engine v3's logs first: the partition's head row, gone last, names their bands,
                # and its lane registry (rows of their own on DynamoDB) a fair queue's group lanes.
                head, _ = self._store.head(info.name, partition, now=self._clock.now())
                if head.has_lanes:
                    head = self._store.with_lanes(info.name, partition, head)
                lanes = [lane for lane in head.leasable_lanes() if lane not in ALL_BANDS]
                while self._logs.purge(info.name, partition, [*ALL_BANDS, *lanes], limit=PAGE_MAX):
                    if self._clock.now() >= stop_at:
                        return False
            while self._store.purge_page(info.name, partition, limit=PAGE_MAX):
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

    def _check_not_a_dead_queue(self, info: QueueInfo) -> None:
        """A dead-letter queue gets no ``dead_queue`` of its own: dead letters end there, so a
        chain never forms (a create needs no check: no queue can name it yet)."""
        users = self._dead_lettering_into(info.name)
        if users:
            raise InvalidRequestError(
                f"'{info.name}' is the dead_queue of {', '.join(users)} and cannot have one of its own",
                field="dead_queue",
            )

    def _dead_lettering_into(self, name: str) -> list[str]:
        """The queues whose ``dead_queue`` is ``name``: O(queues), for an operator's call (an
        update, a delete), never the hot path."""
        return [q.name for q in self._catalog.iterate() if q.dead_queue == name]

    def check_health(self) -> None:
        """Read the catalog once; raises the store's error when it cannot be reached."""
        self._catalog.list(pivot="", limit=1)

    def stats(self, queue_name: str) -> list[PartitionStats]:
        """Counts and ages per partition from the partitions' counters: one read per 100 partitions.

        Counts are exact while no write of the queue failed between its items and its counters;
        ``scheduled`` counts items whose time had not come at the reaper's last pass (so an item
        that came due since then counts as scheduled until the next pass, or until a lease moves it
        to the leased count), ages are to the second. Each item counts in one state: scheduled,
        leased or ready.
        """
        queue = self._queues.live(queue_name)
        now = self._clock.now()
        heads = self._store.heads(queue.name, list(range(queue.partitions)))
        if self._logs is None:
            return [partition_stats(partition, head, now) for partition, head in enumerate(heads)]
        # Engine v3's logs count what they hold in their heads (a read per band in use).
        return [
            partition_stats(partition, head, now, self._log_counts(queue.name, partition, head))
            for partition, head in enumerate(heads)
        ]

    def _log_counts(self, queue: str, partition: int, head: PartitionHead) -> LogCounts:
        """What the partition's logs hold, from their heads: a read per band in use and, in a fair
        queue, per group lane registered."""
        assert self._logs is not None  # noqa: S101 - only called with logs
        if head.has_lanes:
            head = self._store.with_lanes(queue, partition, head)
        return self._logs.counts(queue, partition, head.leasable_lanes())

    def clear(self, queue_name: str, scope: ClearScope) -> int:
        """Remove un-leased items (``QUEUE``), scheduled ones (``SCHEDULED``), leased ones too
        (``DESTRUCTIVE`` with ``QUEUE``; with ``SCHEDULED`` alone it removes no leased item).
        Returns how many were removed.

        Works page by page in bounded memory; when ``clear_budget`` runs out first it raises
        ``RetryLaterError`` saying how many it removed: calling again continues (removed items are
        gone, so the partition itself is the bookmark).
        """
        if not scope & (ClearScope.QUEUE | ClearScope.SCHEDULED):
            raise InvalidRequestError("clear needs 'queue' or 'scheduled'")
        queue = self._queues.live(queue_name)
        now = self._clock.now()
        stop_at = self._clock.now() + self._clear_budget
        bound = visible_bound(now)
        # ``destructive`` widens ``queue`` to leased items; it adds nothing to ``scheduled`` alone.
        destructive = ClearScope.QUEUE in scope and ClearScope.DESTRUCTIVE in scope
        guard = Guard.ANY if destructive else Guard.NOT_VALIDLY_LEASED
        removed = 0
        for partition in range(queue.partitions):
            head, due = self._store.head(queue.name, partition, now=now, records=RECORDS_PER_CALL)
            if head.has_lanes:
                head = self._store.with_lanes(queue.name, partition, head)
            ranges: list[tuple[str, str]] = []
            if ClearScope.QUEUE in scope:
                if due and not destructive:
                    # Expired leases are waiting items too: back to the queue, then cleared with it.
                    self._settler.recover(queue, partition, due, now)
                # Below a band's cursor every item is leased or gone: a non-destructive clear starts there.
                for band in head.leasable_lanes():
                    ranges.append((band_start(band) if destructive else head.cursor_in(band), band + bound))
            if ClearScope.SCHEDULED in scope:
                ranges += [(band + bound, band_end(band)) for band in head.leasable_lanes()]
            for first, end in ranges:
                start = first
                while True:
                    page = self._store.scan(
                        queue.name,
                        partition,
                        start=start,
                        end=end,
                        limit=PAGE_MAX,
                        available_at=None if destructive else now,
                    )
                    ids = [state.id for state in page.items]
                    removed += len(
                        self._store.delete(queue.name, partition, ids, guard=guard, now=now).applied
                    )
                    if page.done:
                        break
                    start = page.read_to
                    if self._clock.now() >= stop_at:
                        raise RetryLaterError(
                            f"clear removed {removed} item(s) of '{queue.name}' and has more to remove;"
                            " call it again to continue"
                        )
            if self._logs is not None:
                removed += self._logs.clear(queue, partition, head.leasable_lanes(), scope, now, stop_at)
        return removed


def _mean_seconds(total_seconds: float, count: int) -> timedelta:
    """A mean age from a sum of ages; never negative (a clock behind an item's creation)."""
    return timedelta(seconds=max(total_seconds, 0) / count) if count else timedelta(0)


def partition_stats(
    partition: int, head: PartitionHead, now: datetime, logs: LogCounts | None = None
) -> PartitionStats:
    """One partition's counts and ages from engine v2's head row and (``logs``) what engine v3's
    logs hold there: each engine's sums of ages, then one mean."""
    now_s = timestamp_us(now) // 1_000_000
    # The counters keep each item in one state, so these bounds hold but for drift (a lost counter
    # write, a lease and a schedule pass racing on DynamoDB) until the recount: the reply never shows
    # more leased than stored or a negative count, whatever drift there is.
    items = max(head.items, 0)
    scheduled = min(max(head.scheduled, 0), items)
    total = items - scheduled
    leased = min(max(head.leased, 0), total)
    age = now_s * total - (head.created_sum - head.scheduled_created_sum)
    leased_age = now_s * leased - head.leased_created_sum
    produced, completed = head.produced, head.completed
    if logs is not None:
        total += logs.total
        leased += logs.leased
        scheduled += logs.scheduled
        age += now_s * logs.total - logs.total_created
        leased_age += now_s * logs.leased - logs.leased_created
        produced += logs.produced
        completed += logs.completed
    return PartitionStats(
        partition=partition,
        total=total,
        total_leased=leased,
        scheduled=scheduled,
        average_age=_mean_seconds(age, total),
        average_leased_age=_mean_seconds(leased_age, leased),
        produced=produced,
        completed=completed,
    )
