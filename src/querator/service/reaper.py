"""The reaper: what nobody else does, in every queue, O(partitions + due items) a run."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from querator.domain import lifecycle
from querator.domain.ids import ITEMS_END, visible_bound
from querator.domain.lifecycle import Action
from querator.domain.model import timestamp_us
from querator.domain.priority import band_start, held_end, unbanded
from querator.ports import Guard, Recount
from querator.service.tuning import (
    BAND_IDLE,
    PAGE_MAX,
    PAYLOAD_SWEEP,
    REAPER_FIRST_PAGE,
    RECORDS_PER_CALL,
    SWEEP_DELAY,
)

if TYPE_CHECKING:
    from datetime import datetime

    from querator.domain.model import QueueInfo
    from querator.ports import Clock, ItemStore, PartitionHead, QueueCatalog
    from querator.service.admin import QueueAdmin
    from querator.service.logs import Logs
    from querator.service.settle import SettleOutcome, Settler

#: A straggler found by the sweep goes back to the tail like an expired lease.
_STRAGGLER = lifecycle.Decision(Action.REQUEUE, "straggler")


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
    #: The queue that holds that item ("" when none waits): the metric is one figure per stage (a
    #: dimension per queue would be a custom metric per queue), so the run's log line names the queue.
    oldest_item_queue: str = ""
    #: Items stored in queues that serve as another queue's dead-letter queue (from their counters).
    dead_letter_depth: int = 0
    #: Expired leases found through their lease records.
    recovered: int = 0
    #: Items put back at the tail after their lease ran out.
    requeued: int = 0
    #: Payload objects deleted past their time (``ClaimLog.sweep_payloads``).
    payloads_swept: int = 0
    #: Never-leased items the sweep found behind a cursor (and requeued or dead-lettered).
    stragglers: int = 0
    #: Scheduled items that came due since the last pass.
    came_due: int = 0
    #: Bands of priorities found empty and idle, no longer read by leases.
    bands_dropped: int = 0
    #: Partitions whose counters a finished recount replaced.
    recounted: int = 0

    def add(self, outcome: SettleOutcome) -> None:
        """Fold in what a settle did."""
        self.requeued += outcome.requeued
        self.dead_lettered += outcome.dead_lettered
        self.deleted += outcome.deleted
        self.skipped += outcome.skipped
        self.recovered += outcome.recovered
        for reason, count in outcome.counts_by_reason.items():
            self.counts_by_reason[reason] = self.counts_by_reason.get(reason, 0) + count


class Reaper:
    """Puts back expired leases of idle queues, dead-letters expired items, sweeps stragglers, counts
    scheduled items that came due, recounts, and finishes queue deletes."""

    def __init__(
        self,
        catalog: QueueCatalog,
        store: ItemStore,
        settler: Settler,
        admin: QueueAdmin,
        clock: Clock,
        recount_period: timedelta,
        logs: Logs | None = None,
    ) -> None:
        self._logs = logs
        self._catalog = catalog
        self._store = store
        self._settler = settler
        self._admin = admin
        self._clock = clock
        self._recount_period = recount_period

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
            if not self._admin.purge(queue, stop_at=started + time_budget / 2):
                report.finished = False
                break
            report.queues_deleted += 1
        if self._logs is not None:
            report.payloads_swept = self._logs.log.sweep_payloads(now=now, limit=PAYLOAD_SWEEP)
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
        head, due = self._store.head(queue.name, partition, now=now, records=RECORDS_PER_CALL)
        while due:
            report.add(self._settler.recover(queue, partition, due, now))
            if len(due) < RECORDS_PER_CALL or self._clock.now() >= stop_at:
                break
            head, due = self._store.head(queue.name, partition, now=now, records=RECORDS_PER_CALL)
        if is_dead_queue:
            report.dead_letter_depth += max(head.items, 0)
        if head.has_lanes:
            # A fair queue's group lanes are reaped, swept and scheduled like bands (O(lanes) here,
            # once a run; a lease reads only the lanes it serves).
            head = self._store.with_lanes(queue.name, partition, head)
        for band in head.leasable_lanes():
            self._reap_head(queue, partition, head, band, now, report, stop_at, is_dead_queue=is_dead_queue)
            self._sweep(queue, partition, head, band, now, report, stop_at)
        if self._logs is not None:
            # A fair queue's group lanes are logs of their own (``with_lanes`` named them above).
            for band in head.leasable_lanes():
                self._reap_log(queue, partition, band, now, report, stop_at, is_dead_queue=is_dead_queue)
        self._drop_idle_bands(queue, partition, head, now, report)
        if head.recount is not None or (
            head.recounted_at is not None and now - head.recounted_at >= self._recount_period
        ):
            self._recount(queue, partition, head, now, report, stop_at)
        elif head.scheduled > 0 and head.schedule_mark:
            # Not while a recount runs: the pass would move the version and void the recount.
            report.came_due += self._store.pass_schedule(
                queue.name,
                partition,
                old_mark=head.schedule_mark,
                new_mark=visible_bound(now),
                now=now,
                bands=head.leasable_lanes(),
            )

    def _reap_head(
        self,
        queue: QueueInfo,
        partition: int,
        head: PartitionHead,
        band: str,
        now: datetime,
        report: ReapReport,
        stop_at: datetime,
        *,
        is_dead_queue: bool = False,
    ) -> None:
        """Dead-letter the waiting items of one priority's band that outlived ``expire_timeout``;
        note the oldest one's age (not in dead-letter queues: an old dead letter is not a consumer
        falling behind).

        An item expires ``expire_timeout`` after it became visible, which is what its id sorts by
        within its band, so everything expired is at the head of the range from the band's cursor:
        reading stops at the first id younger than that, and one short read suffices when nothing
        is due.
        """
        expired_below = band + visible_bound(now - queue.expire_timeout)
        start = head.cursor_in(band)
        limit = REAPER_FIRST_PAGE
        first = True
        end = band + visible_bound(now)
        while True:
            page = self._store.scan(
                queue.name, partition, start=start, end=end, limit=limit, available_at=now
            )
            report.scanned += len(page.items)
            if first and page.items and not is_dead_queue:
                age = now - page.items[0].created_at
                if age > report.oldest_item_age:
                    report.oldest_item_age, report.oldest_item_queue = age, queue.name
            first = False
            found = []
            for state in page.items:
                if state.id >= expired_below:
                    break
                decision = lifecycle.decide_for_reaper(state, queue, now)
                if decision.action is Action.DEAD_LETTER:
                    found.append((state, decision))
            report.add(self._settler.settle(queue, partition, found, now))
            if page.done or page.read_to >= expired_below or self._clock.now() >= stop_at:
                return
            # Past the first page only expired items are wanted: read no further than they go.
            start, end, limit = page.read_to, expired_below, PAGE_MAX

    def _reap_log(
        self,
        queue: QueueInfo,
        partition: int,
        band: str,
        now: datetime,
        report: ReapReport,
        stop_at: datetime,
        *,
        is_dead_queue: bool,
    ) -> None:
        """Engine v3's upkeep of one band's log (``Logs.reap``), folded into the report."""
        assert self._logs is not None  # noqa: S101 - only called with logs
        upkeep = self._logs.reap(queue, partition, band, now, stop_at)
        report.add(upkeep.outcome)
        report.came_due += upkeep.came_due
        report.scanned += upkeep.scanned
        oldest = upkeep.oldest
        if is_dead_queue:
            # A dead-letter queue's depth is what its logs hold too (one head read of the band).
            report.dead_letter_depth += self._logs.counts(queue.name, partition, [band]).total
        if oldest is not None and not is_dead_queue and now - oldest > report.oldest_item_age:
            report.oldest_item_age, report.oldest_item_queue = now - oldest, queue.name

    def _sweep(
        self,
        queue: QueueInfo,
        partition: int,
        head: PartitionHead,
        band: str,
        now: datetime,
        report: ReapReport,
        stop_at: datetime,
    ) -> None:
        """Requeue items of one band that were never leased but sit below its cursor: writes that
        landed after a lease read past their place. Each id is read once, ``SWEEP_DELAY`` after it
        became visible, when every write minted with it has landed or failed."""
        end = min(head.cursor_in(band), band + visible_bound(now - SWEEP_DELAY))
        start = head.sweep_in(band)
        if start >= end:
            return
        while True:
            page = self._store.scan(
                queue.name, partition, start=start, end=end, limit=PAGE_MAX, never_leased=True
            )
            found = []
            for state in page.items:
                decision = lifecycle.decide_for_lease(state, queue, now)
                # A straggler still to lease goes to the tail; one already expired is dead-lettered.
                found.append((state, decision if decision.action is Action.DEAD_LETTER else _STRAGGLER))
            report.stragglers += len(found)
            report.add(self._settler.settle(queue, partition, found, now, requeue_guard=Guard.NEVER_LEASED))
            if page.done:
                self._store.set_sweep(queue.name, partition, end)
                return
            start = page.read_to
            if self._clock.now() >= stop_at:
                self._store.set_sweep(queue.name, partition, start)
                return

    def _drop_idle_bands(
        self, queue: QueueInfo, partition: int, head: PartitionHead, now: datetime, report: ReapReport
    ) -> None:
        """Stop naming bands that are empty and were not registered for ``BAND_IDLE``, so leases do
        not read them (a range read each) for ever after a priority was used once.

        Check, drop (only if not registered since), check again: a writer registers a band before
        it writes, so an item that landed between the first check and the drop was registered more
        than ``BAND_IDLE`` ago and is in place by the second check, which registers the band again.
        """
        idle_since = now - BAND_IDLE
        for band in sorted(head.bands):
            registered = head.band_registered.get(band)
            if registered is not None and registered >= idle_since:
                continue
            if self._band_holds_items(queue, partition, band):
                continue
            if not self._store.drop_band(queue.name, partition, band, registered_before=idle_since):
                continue
            if self._band_holds_items(queue, partition, band):
                self._store.register_bands(queue.name, partition, [band_start(band)], now=now)
                continue
            report.bands_dropped += 1

    def _band_holds_items(self, queue: QueueInfo, partition: int, band: str) -> bool:
        # A state read of one row (the payload is not read): leased, scheduled or waiting, any counts.
        page = self._store.scan(queue.name, partition, start=band_start(band), end=held_end(band), limit=1)
        if page.items:
            return True
        # Engine v3 keeps the band's items in its log: its head counts them.
        return self._logs is not None and self._logs.holds_items(queue.name, partition, band)

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
            page = self._store.scan(queue.name, partition, start=position, end=ITEMS_END, limit=PAGE_MAX)
            for state in page.items:
                created = timestamp_us(state.created_at) // 1_000_000
                totals["items"] += 1
                totals["created_sum"] += created
                if state.lease_deadline is not None:
                    totals["leased"] += 1
                    totals["leased_created_sum"] += created
                # As the stores count (storage.counters.still_scheduled): a claim took a leased
                # item off the scheduled count, so each item is counted in one state.
                if (
                    state.enqueue_at is not None
                    and state.lease_deadline is None
                    and unbanded(state.id) >= head.schedule_mark
                ):
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


def _bookmark(queue: str, partition: int) -> str:
    return f"{queue}~{partition}"


def _parse_bookmark(bookmark: str | None) -> tuple[str, int]:
    if not bookmark:
        return "", 0
    queue, partition, *_ = bookmark.split("~")
    return queue, int(partition)
