"""Engine v3's use cases over the claim log (``querator.ports.log``; docs/adr/0100).

A service built with a ``ClaimLog`` writes new items of FIFO queues into logs, one per band of a
partition, and leases, completes, retries and renews them there; what engine v2 stored before is
served by v2's code until it is gone (an id's shape says which engine holds it:
``querator.domain.positions``). This module holds the v3 side of each call; the components
(``Producer``, ``Leaser``, ``ItemCalls``, ``Reaper``) decide which side a call goes to.

What a call costs here is the log's: a lease of a band is a head read, a claim (one write) and a
read of its run's rows; a complete is one write per lease record it touches, whatever the batch.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from querator.domain import lifecycle, reasons
from querator.domain.errors import DeadLetterQueueMissingError, QueueNotFoundError, RetryLaterError
from querator.domain.lifecycle import Action
from querator.domain.model import ClearScope, IdFailure, Item, reply_bytes_at_most, timestamp_us
from querator.domain.positions import (
    HOLE_TIMEOUT_S,
    SCHEDULED_MARK,
    parse_position_id,
    parse_scheduled_id,
    position_id,
    scheduled_id_of,
)
from querator.domain.priority import BANDS, band, band_of, lane_of
from querator.ports import Guard
from querator.ports.log import ClaimReadError, LogKey, Settled, Settlement
from querator.service.settle import SettleOutcome
from querator.service.tuning import MAX_REPLY_BYTES, NOT_LEASED, REDRIVE_PAGE_BYTES, UNKNOWN_ITEM

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from datetime import datetime

    from querator.domain.model import QueueInfo, RetryRequest
    from querator.ports import Clock, ItemStore
    from querator.ports.log import ClaimLog, LogHead
    from querator.service.queues import QueueDirectory
    from querator.service.ratelimit import RateGate

log = logging.getLogger("querator.service")

#: Expired lease records and due scheduled items a lease puts back before it claims, per band: the
#: rest is the next lease's (or the reaper's), so a lease stays O(batch + this).
UPKEEP_PER_LEASE = 32
#: How a lease waits for a hole in its run (a writer between its two steps): first look again after
#: this, doubling up to ``HOLE_POLL_MAX``; after ``HOLE_TIMEOUT_S`` the log fills the hole.
HOLE_POLL_FIRST = 0.01
HOLE_POLL_MAX = 0.25
#: Claims one lease makes of one log whose runs come short of what it wants while items still wait
#: (positions skipped: deleted, moved or filled while waiting; items found expired and
#: dead-lettered): after them the band counts as not drained, so the lease returns what it has
#: rather than a lower priority.
SHORT_RUN_CLAIMS = 8
#: Waiting items the reaper reads from a log's cursor for ones that outlived ``expire_timeout``.
REAPER_PAGE = 100
#: Payload bytes a page of a log that a clear or a redrive reads holds at most (and one item more):
#: a page is read whole and settled before the next, and items are up to 1 MiB each.
PAGE_BYTES = REDRIVE_PAGE_BYTES
#: Every band a FIFO queue's logs may use: a deleted queue's purge goes through all of them (its
#: partition head, which names the bands in use, may be gone first).
ALL_BANDS = BANDS


def is_log_id(item_id: str) -> bool:
    """Whether ``item_id`` names an item of a claim log (a position or a scheduled item)."""
    return parse_position_id(item_id) is not None or parse_scheduled_id(item_id) is not None


def log_key(queue: str, partition: int, item_id: str) -> LogKey:
    """The log holding ``item_id`` (a log id) in ``partition``."""
    return LogKey(queue, partition, lane_of(item_id))


def lane_key(queue: QueueInfo, partition: int, priority: int, group: str) -> LogKey:
    """The log an item of ``priority`` and ``group`` goes to in ``queue``'s ``partition``."""
    return LogKey(queue.name, partition, band(priority) + queue.lane_for(group))


def log_end(band_key: str) -> str:
    """A key after every id of ``band_key``'s log (positions, then its schedule)."""
    return band_key + chr(ord(SCHEDULED_MARK) + 1)


@dataclass(slots=True)
class LogCounts:
    """What a partition's logs hold (``total``: waiting and leased) and did (cumulative)."""

    total: int = 0
    leased: int = 0
    scheduled: int = 0
    produced: int = 0
    completed: int = 0
    #: Sums of ``created_at`` seconds of the ``total`` and of the ``leased`` items (``LogAges``).
    total_created: int = 0
    leased_created: int = 0


@dataclass(slots=True, kw_only=True)
class LogUpkeep:
    """What the reaper's pass over one log did (``Logs.reap``)."""

    outcome: SettleOutcome
    #: Scheduled items moved to the tail.
    came_due: int = 0
    #: When the oldest waiting item was created (``None``: none waits).
    oldest: datetime | None = None
    #: Waiting items read from the cursor for ones past ``expire_timeout`` (the reaper's
    #: ``scanned``, as engine v2's pass counts the items it reads).
    scanned: int = 0


class Logs:
    """The v3 side of produce, lease, complete, retry, renew and the reaper's upkeep."""

    def __init__(self, log: ClaimLog, store: ItemStore, queues: QueueDirectory, clock: Clock) -> None:
        self.log = log
        self._store = store
        self._queues = queues
        self._clock = clock

    # -- produce ----------------------------------------------------------------------------------

    def write(self, queue: QueueInfo, partition: int, items: Sequence[Item], now: datetime) -> list[Item]:
        """Append ``items`` (as the producer built them; their v2 ids say only their lane) to their
        logs, and return them as stored, in the order given. One append per lane they span."""
        by_lane = _by_lane(queue, partition, items)
        self._register(queue, partition, by_lane, now)
        stored: dict[int, Item] = {}
        for key, entries in by_lane.items():
            written = self.log.append(key, [_for_schedule(item, now) for _, item in entries], now=now)
            stored.update(zip((n for n, _ in entries), written, strict=True))
        return [stored[n] for n in range(len(items))]

    def take(self, queue: QueueInfo, partition: int, items: Sequence[Item], now: datetime) -> list[str]:
        """The positions an idempotent produce records before it writes (scheduled items have
        none: ``""``), in the order of ``items``."""
        by_lane = _by_lane(queue, partition, items)
        self._register(queue, partition, by_lane, now)
        ids = [""] * len(items)
        for key, entries in by_lane.items():
            ready = [(n, item) for n, item in entries if not _scheduled(item, now)]
            if ready:
                created = sum(timestamp_us(item.created_at) // 1_000_000 for _, item in ready)
                largest = max(item.reply_size() for _, item in ready)
                taken = self.log.take_positions(key, len(ready), now=now, created=created, largest=largest)
                for (n, _), taken_id in zip(ready, taken, strict=True):
                    ids[n] = taken_id
        return ids

    def write_taken(
        self, queue: QueueInfo, partition: int, ids: Sequence[str], items: Sequence[Item], now: datetime
    ) -> list[Item]:
        """Write ``items`` at the positions ``take`` returned (again, after a crash: what was
        written stays as it is); scheduled items are appended to their schedules."""
        by_lane = _by_lane(queue, partition, items)
        stored: dict[int, Item] = {}
        for key, entries in by_lane.items():
            ready = [(n, item) for n, item in entries if ids[n]]
            later = [(n, item) for n, item in entries if not ids[n]]
            if ready:
                written = self.log.write_taken(
                    key, [ids[n] for n, _ in ready], [item for _, item in ready], now=now
                )
                stored.update(zip((n for n, _ in ready), written, strict=True))
            if later:
                written = self.log.append(key, [_for_schedule(item, now) for _, item in later], now=now)
                stored.update(zip((n for n, _ in later), written, strict=True))
        return [stored[n] for n in range(len(items))]

    def _settle(
        self,
        key: LogKey,
        settlements: Sequence[Settlement],
        *,
        guard: Guard,
        now: datetime,
        completed: bool = False,
    ) -> Settled:
        """``ClaimLog.settle``, after naming the bands its moves go to in their partitions' head
        rows (a lease, a listing and the reaper read only the bands named)."""
        targets = {s.to for s in settlements if s.to is not None and s.to.lane}
        for target in sorted(targets):
            self._store.register_bands(target.queue, target.partition, [target.lane + "0" * 30], now=now)
        return self.log.settle(key, settlements, guard=guard, now=now, completed=completed)

    def _register(
        self, queue: QueueInfo, partition: int, by_lane: dict[LogKey, list[tuple[int, Item]]], now: datetime
    ) -> None:
        # A lease reads the bands the partition's head row names (engine v2's registration, which
        # v3 shares), so a band is named before its first item is written.
        lanes = [key.lane + "0" * 30 for key in by_lane if key.lane]
        if lanes:
            self._store.register_bands(queue.name, partition, lanes, now=now)

    # -- lease --------------------------------------------------------------------------------------

    def lease_band(
        self,
        queue: QueueInfo,
        partition: int,
        band_key: str,
        wanted: int,
        reply_bytes: int,
        gate: RateGate,
        now: datetime,
    ) -> tuple[list[Item], int, bool]:
        """Lease up to ``wanted`` items of one band's log, oldest first: the items, the reply's
        bytes so far, and whether the band has nothing more to give (so a lower priority may be
        read). Expired leases and due scheduled items of the band go back to its tail first; an
        expired item given a higher priority while leased (``queue.reprioritize``) goes back to
        that priority's log, which the caller may have read already (or not known of): it is
        leased from there first, so no lower priority is leased before it."""
        key = LogKey(queue.name, partition, band_key)
        head = self.log.head(key)
        upkeep = False
        first: list[Item] = []
        if head.next_expiry is not None and head.next_expiry <= now:
            recovered = self._recover_quietly(queue, key, now)
            upkeep = recovered is not None and recovered.recovered > 0
            entered = recovered.entered_bands if recovered is not None else set()
            for other in sorted((b for b in entered if _rank(b) < _rank(band_key)), key=_rank):
                won, reply_bytes, drained = self.lease_band(
                    queue, partition, other, wanted - len(first), reply_bytes, gate, now
                )
                first += won
                if not drained or len(first) >= wanted:
                    return first, reply_bytes, False
        if first:
            leased, reply_bytes, drained = self._lease_own(
                queue, key, head, upkeep, wanted - len(first), reply_bytes, gate, now
            )
            return first + leased, reply_bytes, drained
        return self._lease_own(queue, key, head, upkeep, wanted, reply_bytes, gate, now)

    def _lease_own(
        self,
        queue: QueueInfo,
        key: LogKey,
        head: LogHead,
        upkeep: bool,
        wanted: int,
        reply_bytes: int,
        gate: RateGate,
        now: datetime,
    ) -> tuple[list[Item], int, bool]:
        """``lease_band``'s lease of its own log, its expired leases put back (``upkeep``: the
        head changed since it was read).

        A claim's run counts the positions it skips (deleted or moved while waiting, filled) against
        its count, so a run can come short while items still wait behind it: then the head is read
        again and the rest claimed, up to ``SHORT_RUN_CLAIMS`` claims a call. A band is drained only
        when its log has nothing left waiting, so a lower priority is never leased before it.
        """
        if head.next_due is not None and head.next_due <= now:
            upkeep = self._promote_quietly(queue, key, now) or upkeep
        if upkeep:
            head = self.log.head(key)
        leased: list[Item] = []
        for _ in range(SHORT_RUN_CLAIMS):
            if head.waiting <= 0:
                return leased, reply_bytes, True
            won, reply_bytes, taken, count = self._claim_run(
                queue, key, head, wanted - len(leased), reply_bytes, gate, now
            )
            leased += won
            if not count:
                return leased, reply_bytes, False  # the reply cap or the rate limit: more waits
            if taken >= head.waiting:
                return leased, reply_bytes, True  # took all the head said were waiting
            if len(leased) >= wanted or (taken >= count and len(won) == taken):
                return leased, reply_bytes, False  # a whole run handed out: more waits behind it
            # Short: skipped positions, other consumers took some, or expired items dead-lettered.
            head = self.log.head(key)
        return leased, reply_bytes, head.waiting <= 0

    def _claim_run(
        self,
        queue: QueueInfo,
        key: LogKey,
        head: LogHead,
        wanted: int,
        reply_bytes: int,
        gate: RateGate,
        now: datetime,
    ) -> tuple[list[Item], int, int, int]:
        """One claim of up to ``wanted`` items after ``head``'s cursor: the items leased, the
        reply's bytes so far, the positions the run took (items and holes) and the count it asked
        for (0: none asked, the reply cap or the rate limit had no room)."""
        per_item = reply_bytes_at_most(head.largest)
        room = MAX_REPLY_BYTES - reply_bytes if reply_bytes else max(MAX_REPLY_BYTES, per_item)
        # Sized by the largest item the log was ever given, so a run never passes the reply cap.
        count = min(wanted, room // per_item)
        count = gate.allow(queue, count, head.waiting, now) if count else 0
        if not count:
            return [], reply_bytes, 0, 0
        try:
            claim = self.log.claim(key, count=count, deadline=now + queue.lease_timeout, now=now, room=room)
        except ClaimReadError as exc:
            # The run was taken but never reached this call: back at once, its attempt not spent
            # (holes of it written since are read first: they are the run's items too).
            self._give_back_ids_quietly(queue, key, exc.ids, exc.token)
            raise exc.cause from exc
        # Every item the claim holds, as read so far: what a failure gives back.
        held = list(claim.items)
        try:
            items = self._collect(key, claim.token, held, claim.holes)
            leased = self._sort_claimed(queue, key, items, now)
        except BaseException:
            # A lease holds nothing it did not return (the record would otherwise hold the items
            # until their deadline): everything it claimed goes back, the attempt not spent, with
            # its holes written meanwhile (read again once; the rest return when the record is due).
            if claim.holes:
                held += self._collect_quietly(queue, key, claim.token)
            self._give_back_quietly(queue, key, held)
            raise
        # The tokens of what was claimed are used: a later band of this call takes its own.
        gate.spend(items)
        reply_bytes += sum(reply_bytes_at_most(item.reply_size()) for item in leased)
        return leased, reply_bytes, len(claim.items) + len(claim.holes), count

    def lane_head(self, queue: QueueInfo, partition: int, lane: str, now: datetime) -> LogHead:
        """A fair lease's look at one lane's log (a band, or a band and a group): its head, after
        its expired leases and due scheduled items went back to its tail (as ``lease_band`` does
        for a band). One strong read of a small row when there is no upkeep to do."""
        key = LogKey(queue.name, partition, lane)
        head = self.log.head(key)
        upkeep = False
        if head.next_expiry is not None and head.next_expiry <= now:
            recovered = self._recover_quietly(queue, key, now)
            upkeep = recovered is not None and recovered.recovered > 0
        if head.next_due is not None and head.next_due <= now:
            upkeep = self._promote_quietly(queue, key, now) or upkeep
        return self.log.head(key) if upkeep else head

    def leased_in(self, queue: QueueInfo, partition: int, lanes: Iterable[str]) -> int:
        """The leased positions of ``lanes``' logs, from their heads (a group's leases in other
        bands, for its ``max_leased_per_group``)."""
        return sum(max(self.log.head(LogKey(queue.name, partition, lane)).leased, 0) for lane in lanes)

    def claim_lane(
        self,
        queue: QueueInfo,
        partition: int,
        lane: str,
        count: int,
        now: datetime,
        *,
        max_leased: int | None = None,
        room: int | None = None,
    ) -> list[Item]:
        """Lease up to ``count`` items of one lane's log, oldest first, with one claim (one head
        write), never leaving more than ``max_leased`` of its positions leased (a group's
        ``max_leased_per_group``, checked in the claim's own write: concurrent consumers cannot
        pass it), nor more than ``room`` reply bytes (``ClaimLog.claim``). Returns the items a
        consumer may have (expired ones are dead-lettered)."""
        key = LogKey(queue.name, partition, lane)
        try:
            claim = self.log.claim(
                key,
                count=count,
                deadline=now + queue.lease_timeout,
                now=now,
                max_leased=max_leased,
                room=room,
            )
        except ClaimReadError as exc:
            self._give_back_ids_quietly(queue, key, exc.ids, exc.token)
            raise exc.cause from exc
        # Every item the claim holds, as read so far: what a failure gives back (as ``lease_band``).
        held = list(claim.items)
        try:
            items = self._collect(key, claim.token, held, claim.holes)
            return self._sort_claimed(queue, key, items, now)
        except BaseException:
            if claim.holes:
                held += self._collect_quietly(queue, key, claim.token)
            self._give_back_quietly(queue, key, held)
            raise

    def _collect(self, key: LogKey, token: str, items: list[Item], holes: list[str]) -> list[Item]:
        """``items`` with the claim's holes read again until written or filled (a writer between its
        two steps writes within milliseconds; one that died is filled after ``HOLE_TIMEOUT_S``).
        What it finds is added to ``items`` as it comes, so a failure midway gives it back too."""
        pause = HOLE_POLL_FIRST
        # Bounded: the log fills every hole once the claim is HOLE_TIMEOUT_S old.
        for _ in range(int(HOLE_TIMEOUT_S / HOLE_POLL_FIRST) + 2):
            if not holes:
                break
            self._clock.sleep(pause)
            pause = min(pause * 2, HOLE_POLL_MAX)
            found = self.log.collect(key, token, now=self._clock.now())
            items += found.items
            holes = found.holes
        return sorted(items, key=lambda item: item.id)

    def _collect_quietly(self, queue: QueueInfo, key: LogKey, token: str) -> list[Item]:
        """The holes of a failed lease's record written since it last read them (none when the
        store fails this too: they return when the record is due)."""
        try:
            return self.log.collect(key, token, now=self._clock.now()).items
        except Exception:  # the original failure goes on; this one is only logged
            log.exception("a failed lease of %s could not read its holes again", queue.name)
            return []

    def _sort_claimed(self, queue: QueueInfo, key: LogKey, items: list[Item], now: datetime) -> list[Item]:
        """The claimed items a consumer may have: those whose time is up are dead-lettered (or
        dropped) instead, as a v2 lease does when it finds them."""
        expired = [item for item in items if item.expire_deadline <= now]
        if not expired:
            return items
        gone = set(self._dead_letter(queue, key, expired, Guard.LEASE_VALID, now, entering=_expired(expired)))
        return [item for item in items if item.id not in gone]

    # -- settling -------------------------------------------------------------------------------------

    def complete(self, queue: QueueInfo, partition: int, ids: Sequence[str], now: datetime) -> set[str]:
        """Settle validly leased log ids; returns those applied."""
        applied: set[str] = set()
        for key, key_ids in _by_log(queue.name, partition, ids).items():
            result = self._settle(
                key, [Settlement(id=i) for i in key_ids], guard=Guard.LEASE_VALID, now=now, completed=True
            )
            applied |= set(result.applied)
        return applied

    def retry(
        self, queue: QueueInfo, partition: int, requests: Sequence[RetryRequest], now: datetime
    ) -> set[str]:
        """Put validly leased log items back as ``requests`` say (``retry_at`` already resolved):
        the tail, the schedule, or the dead-letter queue. Returns the ids applied."""
        applied: set[str] = set()
        wanted = {r.id: r for r in requests}
        for key, key_ids in _by_log(queue.name, partition, list(wanted)).items():
            items = self.log.get(key, key_ids, now=now)
            back: list[Settlement] = []
            dead: list[Item] = []
            # Each item with the failure this retry records on it (``querator.domain.reasons``).
            failing: dict[str, Item] = {}
            for item_id in key_ids:
                item = items.get(item_id)
                if item is None or not item.is_leased(now):
                    continue
                request = wanted[item_id]
                plan = lifecycle.plan_retry(request, item.attempts, queue, now)
                failing[item_id] = reasons.after_retry(item, plan, request.reason)
                if plan.action is Action.DEAD_LETTER:
                    dead.append(item)
                    continue
                assert plan.visible_at is not None  # noqa: S101 - plan_retry sets it for REQUEUE
                # A priority ``queue.reprioritize`` gave it while leased, unless the retry names one.
                priority = item.returning_priority if request.priority is None else request.priority
                back.append(_move(queue, partition, failing[item_id], priority, plan.visible_at, now))
            if back:
                applied |= set(self._settle(key, back, guard=Guard.LEASE_VALID, now=now).applied)
            if dead:
                applied |= set(
                    self._dead_letter(
                        queue,
                        key,
                        dead,
                        Guard.LEASE_VALID,
                        now,
                        entering=failing,
                    )
                )
        return applied

    def renew(
        self, queue: QueueInfo, partition: int, ids: Sequence[str], deadline: datetime, now: datetime
    ) -> set[str]:
        applied: set[str] = set()
        for key, key_ids in _by_log(queue.name, partition, ids).items():
            applied |= set(self.log.renew(key, key_ids, deadline=deadline, now=now).applied)
        return applied

    def reprioritize(
        self, queue: QueueInfo, partition: int, ids: Sequence[str], priority: int, now: datetime
    ) -> tuple[dict[str, str], list[IdFailure]]:
        """``queue.reprioritize`` of log ids, as v2 does it (``ItemCalls.reprioritize``): a waiting
        or scheduled item moves to the new priority's log under a new id (at its tail, or in its
        schedule at the same time); a validly leased one keeps its id and lease, and its record
        keeps the priority it goes back with; one whose lease ran out moves now (to where the next
        lease would send it, with the failure that records: a dead letter when its attempts or time
        are up, and its id fails).
        Returns each applied id with the id its item has now, and the ids that failed.

        Per log: one ``get``, then one ``set_next_priority`` (one write per lease record) and one
        ``settle`` (one atomic step per item moved)."""
        result: dict[str, str] = {}
        failed: list[IdFailure] = []
        for key, key_ids in _by_log(queue.name, partition, ids).items():
            items = self.log.get(key, key_ids, now=now)
            leased: list[str] = []
            moves: list[Settlement] = []
            for item_id in key_ids:
                item = items.get(item_id)
                if item is None:
                    failed.append(IdFailure(id=item_id, reason=UNKNOWN_ITEM))
                elif item.is_leased(now):
                    leased.append(item_id)
                elif (
                    decision := lifecycle.decide_for_lease(item.state(), queue, now)
                ).action is Action.DEAD_LETTER:
                    # Moving it would give it attempts past max_attempts (or it outlived
                    # expire_timeout): it goes where the next lease would send it, and the id
                    # fails, the item being no longer in the queue.
                    try:
                        self._dead_letter(
                            queue,
                            key,
                            [item],
                            Guard.NOT_VALIDLY_LEASED,
                            now,
                            entering={item_id: reasons.after_decision(item, decision, now)},
                        )
                    except DeadLetterQueueMissingError:
                        log.warning("dead_queue of %s is missing; the item stays", queue.name)
                    failed.append(IdFailure(id=item_id, reason=UNKNOWN_ITEM))
                elif item.lease_deadline is None and item.priority == priority:
                    result[item_id] = item_id
                else:
                    # A lease that ran out, not put back yet, moves even within its band: it may
                    # carry another priority to go back with, given while it was leased. It goes
                    # with the failure its lapse records, as ``recover`` would record it (a waiting
                    # or scheduled item's decision records nothing).
                    lapsed = reasons.after_decision(item, decision, now)
                    moves.append(_move(queue, partition, lapsed, priority, item.enqueue_at, now))
            if leased:
                marked = self.log.set_next_priority(key, leased, priority=priority, now=now)
                result.update({i: i for i in marked.applied})
                # Its lease ended between the read and the write: it waits again; the caller may repeat.
                failed += [IdFailure(id=i, reason=NOT_LEASED) for i in marked.rejected]
            if moves:
                # Not a valid lease: a consumer that leased the item since the read keeps it.
                settled = self._settle(key, moves, guard=Guard.NOT_VALIDLY_LEASED, now=now)
                result.update({i: settled.moved[i] for i in settled.applied})
                failed += [IdFailure(id=i, reason=UNKNOWN_ITEM) for i in settled.rejected]
        return result, failed

    def give_back(self, queue: QueueInfo, partition: int, items: Iterable[Item], now: datetime) -> int:
        """Put validly leased items back at the tail at once, their attempt not spent (a lease whose
        reply could not be written). Returns how many went."""
        given = 0
        by_key: dict[LogKey, list[Item]] = {}
        for item in items:
            by_key.setdefault(log_key(queue.name, partition, item.id), []).append(item)
        for key, key_items in by_key.items():
            given += len(self._put_back(queue, key, key_items, now))
        return given

    def give_back_ids(self, queue: QueueInfo, partition: int, ids: Sequence[str], now: datetime) -> int:
        """``give_back`` for ids (read first: the items go back as they were)."""
        found: list[Item] = []
        for key, key_ids in _by_log(queue.name, partition, ids).items():
            found += [item for item in self.log.get(key, key_ids, now=now).values() if item.is_leased(now)]
        return self.give_back(queue, partition, found, now)

    def _put_back(self, queue: QueueInfo, key: LogKey, items: Sequence[Item], now: datetime) -> list[str]:
        back = [
            Settlement(
                id=item.id,
                to=key,
                item=_unclaimed(item),
            )
            for item in items
        ]
        return self._settle(key, back, guard=Guard.LEASE_VALID, now=now).applied if back else []

    def _give_back_ids_quietly(self, queue: QueueInfo, key: LogKey, ids: Sequence[str], token: str) -> None:
        """Give back the run ``token`` took (``ids``), read first: its holes written since turn
        into items of the record (``collect``), then every id is read as stored."""
        try:
            now = self._clock.now()
            self.log.collect(key, token, now=now)
            items = [item for item in self.log.get(key, ids, now=now).values() if item.is_leased(now)]
        except Exception:  # the original failure goes on; this one is only logged
            log.exception(
                "a failed lease of %s could not read back the %d item(s) it claimed; they return when"
                " their lease runs out",
                queue.name,
                len(ids),
            )
            return
        self._give_back_quietly(queue, key, items)

    def _give_back_quietly(self, queue: QueueInfo, key: LogKey, items: Sequence[Item]) -> None:
        try:
            given = len(self._put_back(queue, key, items, self._clock.now()))
        except Exception:  # the original failure goes on; this one is only logged
            log.exception(
                "a failed lease of %s could not give back %d item(s); they return when their lease runs out",
                queue.name,
                len(items),
            )
            return
        log.warning("a failed lease of %s gave back %d of %d claimed item(s)", queue.name, given, len(items))

    def _dead_letter(
        self,
        queue: QueueInfo,
        key: LogKey,
        items: Sequence[Item],
        guard: Guard,
        now: datetime,
        *,
        entering: Mapping[str, Item],
    ) -> list[str]:
        """Move ``items`` to the queue's dead-letter queue (drop them when it has none); the ids
        that went. ``entering``: by id, each item as it enters the dead-letter queue, with the
        failure that sends it there (``querator.domain.reasons``)."""
        if not queue.dead_queue:
            return self._settle(key, [Settlement(id=i.id) for i in items], guard=guard, now=now).applied
        try:
            target = self._queues.cached(queue.dead_queue)
        except QueueNotFoundError as exc:
            raise DeadLetterQueueMissingError(
                f"dead_queue '{queue.dead_queue}' of '{queue.name}' does not exist"
            ) from exc
        moves = [
            Settlement(
                id=item.id,
                # The same item always lands in the same partition of the dead-letter queue, with the
                # priority it goes back with (given by queue.reprioritize while leased), as in v2.
                to=lane_key(
                    target, item.landing_partition(target.partitions), item.returning_priority, item.group
                ),
                item=entering.get(item.id, item).as_dead_letter(
                    new_id="",  # the dead-letter queue's log assigns it
                    source_queue=queue.name,
                    expire_deadline=lifecycle.expire_deadline(now, target.expire_timeout),
                ),
            )
            for item in items
        ]
        return self._settle(key, moves, guard=guard, now=now).applied

    # -- upkeep ---------------------------------------------------------------------------------------

    def recover(
        self, queue: QueueInfo, key: LogKey, now: datetime, limit: int = UPKEEP_PER_LEASE
    ) -> SettleOutcome:
        """Settle up to ``limit`` expired lease records of ``key``: each undone item to the tail
        with its attempt counted, or to the dead-letter queue when its attempts or time are up."""
        outcome = SettleOutcome()
        for run in self.log.expired(key, now=now, limit=limit):
            back: list[Settlement] = []
            dead: dict[str, list[Item]] = {}
            for item in run.items:
                decision = lifecycle.decide_for_lease(
                    replace(item, lease_deadline=run.deadline).state(), queue, now
                )
                if decision.action is Action.DEAD_LETTER:
                    dead.setdefault(decision.reason, []).append(item)
                else:
                    # Its lease ran out: the failure is recorded on the item it goes back as.
                    lapsed = reasons.after_decision(replace(item, lease_deadline=run.deadline), decision, now)
                    back.append(
                        Settlement(
                            id=item.id,
                            to=lane_key(queue, key.partition, item.returning_priority, item.group),
                            item=replace(lapsed, lease_deadline=None, enqueue_at=None, next_priority=None),
                        )
                    )
            if back:
                moved = self._settle(key, back, guard=Guard.LEASE_EXPIRED, now=now).applied
                outcome.requeued += len(moved)
                went = set(moved)
                outcome.entered_bands |= {
                    s.to.lane for s in back if s.id in went and s.to is not None and s.to.lane != key.lane
                }
            for reason, items in dead.items():
                decision = lifecycle.Decision(Action.DEAD_LETTER, reason)
                entering = {
                    i.id: reasons.after_decision(replace(i, lease_deadline=run.deadline), decision, now)
                    for i in items
                }
                try:
                    gone = self._dead_letter(queue, key, items, Guard.LEASE_EXPIRED, now, entering=entering)
                except DeadLetterQueueMissingError:
                    log.warning("dead_queue of %s is missing; %d item(s) stay", queue.name, len(items))
                    outcome.skipped += len(items)
                    continue
                if queue.dead_queue:
                    outcome.dead_lettered += len(gone)
                else:
                    outcome.deleted += len(gone)
                outcome.count(reason, len(gone))
            outcome.recovered += len(run.items)
        return outcome

    def reap(
        self, queue: QueueInfo, partition: int, band_key: str, now: datetime, stop_at: datetime
    ) -> LogUpkeep:
        """The reaper's pass over one band's log: expired leases back (an idle queue has no lease to
        do it), due scheduled items to the tail, and waiting items that outlived
        ``expire_timeout`` dead-lettered from the cursor on (the first page: positions follow
        produce time, so those are the oldest)."""
        key = LogKey(queue.name, partition, band_key)
        outcome = SettleOutcome()
        head = self.log.head(key)
        while head.next_expiry is not None and head.next_expiry <= now:
            done = self.recover(queue, key, now, limit=UPKEEP_PER_LEASE)
            outcome.add(done)
            # Records that settle nothing (a missing dead-letter queue) stay due: not again now.
            if not _settled(done) or self._clock.now() >= stop_at:
                break
            head = self.log.head(key)
        came_due = 0
        while head.next_due is not None and head.next_due <= now:
            moved = self.log.promote(key, now=now, limit=UPKEEP_PER_LEASE)
            came_due += moved
            if moved < UPKEEP_PER_LEASE or self._clock.now() >= stop_at:
                break
            head = self.log.head(key)
        if came_due or outcome.recovered:
            head = self.log.head(key)
        if head.waiting <= 0:
            return LogUpkeep(outcome=outcome, came_due=came_due)
        scanned, oldest = self._reap_expired(queue, key, head, outcome, now, stop_at)
        return LogUpkeep(outcome=outcome, came_due=came_due, oldest=oldest, scanned=scanned)

    def _reap_expired(
        self,
        queue: QueueInfo,
        key: LogKey,
        head: LogHead,
        outcome: SettleOutcome,
        now: datetime,
        stop_at: datetime,
    ) -> tuple[int, datetime | None]:
        """Dead-letter (or drop) the waiting items that outlived ``expire_timeout``, from the cursor
        on, a window of ``REAPER_PAGE`` positions at a time while windows start expired and the
        budget lasts; returns the items read and when the oldest of them was created.

        Positions follow produce time, so the expired items lead the window. They are taken with one
        claim, as a lease takes them, and settled as one record: the cursor passes them with one
        write, where settling each waiting item would leave a tombstone in the head per item (10,000
        expired items: a 90 KB head that every claim would write). The window is read with ``get``
        of positions at and after the cursor, which looks up no lease records: O(window), however
        many leases are held. A claim that meets a position another lease took meanwhile gets the
        next ones; those not expired go back to the tail at once, their attempt not spent.
        """
        scanned = 0
        oldest: datetime | None = None
        while head.waiting > 0:
            ids = [
                position_id(key.lane, head.cursor + n)
                for n in range(min(REAPER_PAGE, head.tail - head.cursor))
            ]
            found = self.log.get(key, ids, now=now)
            scanned += len(found)
            if found:
                first = min(item.created_at for item in found.values())
                oldest = first if oldest is None else min(oldest, first)
            # The expired items leading the window, and the positions between them that hold nothing
            # (deleted while waiting, or not written yet): a claim skips the first and files the
            # second as holes of its record, which fills them if they are still holes when it ends.
            lead = 0
            for n, item_id in enumerate(ids):
                item = found.get(item_id)
                if item is None:
                    continue
                if item.expire_deadline > now:
                    break
                lead = n + 1
            if not lead:
                break
            if not self._claim_expired(queue, key, lead, outcome, now):
                break
            if lead < len(ids) or self._clock.now() >= stop_at:
                break
            head = self.log.head(key)
        return scanned, oldest

    def _claim_expired(
        self, queue: QueueInfo, key: LogKey, count: int, outcome: SettleOutcome, now: datetime
    ) -> bool:
        """Claim ``count`` positions from the cursor for the reaper and dead-letter what expired;
        whether it went on (False: the dead-letter queue is missing, and they went back)."""
        try:
            claim = self.log.claim(key, count=count, deadline=now + queue.lease_timeout, now=now)
        except ClaimReadError as exc:
            self._give_back_ids_quietly(queue, key, exc.ids, exc.token)
            raise exc.cause from exc
        expired = [item for item in claim.items if item.expire_deadline <= now]
        young = [item for item in claim.items if item.expire_deadline > now]
        if young:
            self._put_back(queue, key, young, now)
        if not expired:
            return True
        try:
            gone = self._dead_letter(queue, key, expired, Guard.LEASE_VALID, now, entering=_expired(expired))
        except DeadLetterQueueMissingError:
            log.warning("dead_queue of %s is missing; %d item(s) stay", queue.name, len(expired))
            outcome.skipped += len(expired)
            self._put_back(queue, key, expired, now)
            return False
        if queue.dead_queue:
            outcome.dead_lettered += len(gone)
        else:
            outcome.deleted += len(gone)
        outcome.count("expired", len(gone))
        return True

    def list_band(
        self,
        queue: str,
        partition: int,
        band_key: str,
        *,
        pivot: str,
        limit: int,
        scheduled: bool,
        max_bytes: int,
        now: datetime,
    ) -> list[Item]:
        """Up to ``limit`` items of one band's log from ``pivot`` (inclusive), in id order: its
        leased and waiting items, or (``scheduled``) its schedule; at most ``max_bytes`` of payload
        (at least one item). One listing of the log: it reads on past a page the store cut short,
        so fewer than ``limit`` items here mean the part asked for ended or ``max_bytes`` did."""
        key = LogKey(queue, partition, band_key)
        after = _just_before(pivot) if pivot else ""
        if scheduled:
            after = max(after, band_key + SCHEDULED_MARK)
        page = self.log.list_items(
            key, after=after, limit=limit, now=now, max_bytes=max_bytes, schedule=scheduled
        )
        found: list[Item] = []
        budget = max_bytes
        for item in page:
            if (parse_scheduled_id(item.id) is not None) != scheduled:
                break  # positions sort before the schedule: the part asked for ended
            if found and len(item.payload) > budget:
                break  # the item that took the page past ``max_bytes``: the next page's first
            found.append(item)
            budget -= len(item.payload)
        return found

    def counts(self, queue: str, partition: int, bands: Iterable[str]) -> LogCounts:
        """What the partition's logs of ``bands`` hold and did, from their heads, with the sums
        their ages come from (a log that holds nothing is not asked for them)."""
        counts = LogCounts()
        for band_key in bands:
            key = LogKey(queue, partition, band_key)
            head = self.log.head(key)
            counts.total += max(head.waiting, 0) + head.leased
            counts.leased += head.leased
            counts.scheduled += head.scheduled
            counts.produced += head.produced
            counts.completed += head.completed
            if head.waiting > 0 or head.leased > 0:
                ages = self.log.ages(key)
                counts.total_created += ages.waiting_created + ages.leased_created
                counts.leased_created += ages.leased_created
        return counts

    def clear(
        self,
        queue: QueueInfo,
        partition: int,
        bands: Iterable[str],
        scope: ClearScope,
        now: datetime,
        stop_at: datetime,
    ) -> int:
        """``queue.clear`` of the partition's logs: waiting items (expired leases first back among
        them) with one head write a log, scheduled ones and (``QUEUE`` and ``DESTRUCTIVE``) leased
        ones page by page. ``DESTRUCTIVE`` only widens ``QUEUE``: with ``SCHEDULED`` alone leased
        items stay (docs/api.md). Raises ``RetryLaterError`` when ``stop_at`` passes with more to
        remove."""
        removed = 0
        leased_too = ClearScope.QUEUE in scope and ClearScope.DESTRUCTIVE in scope
        for band_key in bands:
            key = LogKey(queue.name, partition, band_key)
            if ClearScope.QUEUE in scope:
                if not leased_too:
                    # Expired leases are waiting items too: back to the tail, then cleared with them.
                    while _settled(self.recover(queue, key, now)):
                        self._check_budget(queue, removed, stop_at)
                removed += self.log.skip_waiting(key, now=now)
            head = self.log.head(key)
            if leased_too and head.leased:
                # Leased items are the positions below the cursor: listed first, in pages as large as
                # the head says they are, and the listing stops at the first waiting one, so a clear
                # reads what it removes, not the backlog.
                removed += self._remove_listed(
                    queue, key, "", _is_leased_position, head.leased, now, stop_at, removed
                )
            if ClearScope.SCHEDULED in scope and head.scheduled:
                # The schedule sorts after every position: read from its start.
                floor = band_key + SCHEDULED_MARK
                removed += self._remove_listed(
                    queue, key, floor, _is_scheduled, head.scheduled, now, stop_at, removed
                )
        return removed

    def _remove_listed(
        self,
        queue: QueueInfo,
        key: LogKey,
        after: str,
        wanted: Callable[[Item], bool],
        expected: int,
        now: datetime,
        stop_at: datetime,
        removed: int,
    ) -> int:
        """Settle the log's items from ``after`` on while ``wanted`` says so, in pages of up to
        ``expected`` (how many the head counts) and ``PAGE_BYTES`` of payload; the first item it
        refuses ends the run (the part asked for is one key range)."""
        done = seen = 0
        limit = max(1, min(REAPER_PAGE, expected))
        # Leased items are positions: a run of them never reaches the schedule.
        schedule = after >= key.lane + SCHEDULED_MARK
        while True:
            page = self.log.list_items(
                key, after=after, limit=limit, now=now, max_bytes=PAGE_BYTES, schedule=schedule
            )
            taken = list(itertools.takewhile(wanted, page))
            if taken:
                settled = self._settle(key, [Settlement(id=i.id) for i in taken], guard=Guard.ANY, now=now)
                done += len(settled.applied)
            seen += len(taken)
            if len(taken) < len(page) or not _goes_on(page, limit, PAGE_BYTES) or seen >= expected:
                return done
            after = taken[-1].id
            self._check_budget(queue, removed + done, stop_at)

    def _check_budget(self, queue: QueueInfo, removed: int, stop_at: datetime) -> None:
        if self._clock.now() >= stop_at:
            raise RetryLaterError(
                f"clear removed {removed} item(s) of '{queue.name}' and has more to remove;"
                " call it again to continue"
            )

    def redrive_page(
        self,
        source: QueueInfo,
        partition: int,
        band_key: str,
        *,
        after: str,
        limit: int,
        target_of: Callable[[Item], QueueInfo | None],
        now: datetime,
    ) -> tuple[int, int, str | None]:
        """Move up to ``limit`` dead letters of one band's log to the queue ``target_of`` names
        (``None``: stranded, it stays) as new items at its tail, each move atomic: (moved,
        stranded, where the next page starts; ``None`` at the log's end)."""
        key = LogKey(source.name, partition, band_key)
        page = self.log.list_items(key, after=after, limit=limit, now=now, max_bytes=PAGE_BYTES)
        moves: list[Settlement] = []
        stranded = 0
        for item in page:
            if item.is_leased(now):
                continue  # someone holds it in the dead-letter queue: it stays, as remaining
            target = target_of(item)
            if target is None:
                stranded += 1
                continue
            moves.append(
                Settlement(
                    id=item.id,
                    # As dead-lettering does: the same item always lands in the same partition.
                    to=lane_key(target, item.landing_partition(target.partitions), item.priority, item.group),
                    item=item.as_redriven(
                        new_id="",  # the target's log assigns it
                        now=now,
                        expire_deadline=lifecycle.expire_deadline(now, target.expire_timeout),
                    ),
                )
            )
        moved = len(self._settle(key, moves, guard=Guard.NOT_VALIDLY_LEASED, now=now).applied) if moves else 0
        return moved, stranded, (page[-1].id if _goes_on(page, limit, PAGE_BYTES) else None)

    def holds_items(self, queue: str, partition: int, band_key: str) -> bool:
        """Whether a band's log holds anything (waiting, leased or scheduled)."""
        head = self.log.head(LogKey(queue, partition, band_key))
        return head.waiting > 0 or head.leased > 0 or head.scheduled > 0

    def delete(self, queue: QueueInfo, partition: int, ids: Sequence[str], now: datetime) -> None:
        """Delete log items in any state (a storage call; unknown ones are gone already)."""
        for key, key_ids in _by_log(queue.name, partition, ids).items():
            self.log.delete(key, key_ids, now=now)

    def purge(self, queue: str, partition: int, bands: Iterable[str], limit: int) -> int:
        """Delete up to ``limit`` rows of a deleted queue's logs in ``partition``; 0 once gone."""
        for band_key in bands:
            removed = self.log.purge(LogKey(queue, partition, band_key), limit=limit)
            if removed:
                return removed
        return 0

    def _recover_quietly(self, queue: QueueInfo, key: LogKey, now: datetime) -> SettleOutcome | None:
        try:
            return self.recover(queue, key, now)
        except Exception as exc:  # upkeep on the way: the records stay due for the next call
            log.warning("lease of %s: expired leases not put back yet (%s)", queue.name, exc)
            return None

    def _promote_quietly(self, queue: QueueInfo, key: LogKey, now: datetime) -> bool:
        try:
            return self.log.promote(key, now=now, limit=UPKEEP_PER_LEASE) > 0
        except Exception as exc:  # upkeep on the way: the items stay due for the next call
            log.warning("lease of %s: scheduled items not moved to the tail yet (%s)", queue.name, exc)
            return False


def _move(
    queue: QueueInfo, partition: int, item: Item, priority: int, due: datetime | None, now: datetime
) -> Settlement:
    """``item`` back to ``priority``'s log of its lane in ``partition``, unleased: at its tail, or
    in its schedule when ``due`` is later than ``now``; its coming priority spent."""
    later = due if due is not None and due > now else None
    return Settlement(
        id=item.id,
        to=lane_key(queue, partition, priority, item.group),
        item=replace(item, lease_deadline=None, enqueue_at=later, next_priority=None),
    )


def _unclaimed(item: Item) -> Item:
    """A claimed item as it was before the claim, which never reached a consumer: no lease, and
    the attempt the claim counted not spent."""
    return replace(item, lease_deadline=None, attempts=max(item.attempts - 1, 0))


def _expired(claimed: Iterable[Item]) -> dict[str, Item]:
    """Waiting items a claim took (a lease's, or the reaper's) as the service dead-letters them
    for outliving ``expire_timeout``: nobody was handed them, so they keep the attempts they had
    (docs/api.md, "Dead letters")."""
    return {item.id: reasons.ended(_unclaimed(item), reasons.EXPIRED) for item in claimed}


def _rank(lane: str) -> int:
    """Where a lane's band comes in lease order (0: priority 0)."""
    return BANDS.index(band_of(lane))


def _is_leased_position(item: Item) -> bool:
    return item.lease_deadline is not None and parse_scheduled_id(item.id) is None


def _is_scheduled(item: Item) -> bool:
    return parse_scheduled_id(item.id) is not None


def _settled(outcome: SettleOutcome) -> int:
    return outcome.requeued + outcome.dead_lettered + outcome.deleted


def _goes_on(page: Sequence[Item], limit: int, max_bytes: int) -> bool:
    """Whether the log may hold more after a page ``ClaimLog.list_items`` listed with ``limit`` and
    ``max_bytes``: the page is full, or its payloads passed ``max_bytes``; else its range ended."""
    return bool(page) and (len(page) >= limit or sum(len(item.payload) for item in page) > max_bytes)


def _just_before(item_id: str) -> str:
    """An ``after`` bound that lists from ``item_id`` on, itself included: a log id's digits less
    one (its mark alone below the first); any other id (engine v2's) is not in a log, so itself."""
    if not is_log_id(item_id):
        return item_id
    digits = len(item_id) - len(item_id.rstrip("0123456789abcdef"))
    prefix, value = item_id[: len(item_id) - digits], int(item_id[len(item_id) - digits :], 16)
    return prefix if value == 0 else f"{prefix}{value - 1:0{digits}x}"


def _for_schedule(item: Item, now: datetime) -> Item:
    """A scheduled item under the scheduled id its v2 id gives (produce order within a due time)."""
    return replace(item, id=scheduled_id_of(item.id)) if _scheduled(item, now) else item


def _scheduled(item: Item, now: datetime) -> bool:
    return item.enqueue_at is not None and item.enqueue_at > now


def _by_lane(queue: QueueInfo, partition: int, items: Sequence[Item]) -> dict[LogKey, list[tuple[int, Item]]]:
    """``items`` (with their index) by the log of their lane, in order."""
    by_lane: dict[LogKey, list[tuple[int, Item]]] = {}
    for n, item in enumerate(items):
        by_lane.setdefault(LogKey(queue.name, partition, lane_of(item.id)), []).append((n, item))
    return by_lane


def _by_log(queue: str, partition: int, ids: Sequence[str]) -> dict[LogKey, list[str]]:
    by_log: dict[LogKey, list[str]] = {}
    for item_id in ids:
        by_log.setdefault(log_key(queue, partition, item_id), []).append(item_id)
    return by_log


__all__ = ["Logs", "is_log_id", "lane_key", "log_end", "log_key", "reply_bytes_at_most"]
