"""Lease: claim items of one partition from its cursor, waiting (long-poll) when there are none."""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from querator.domain import lifecycle
from querator.domain.errors import (
    DuplicateClientError,
    InvalidRequestError,
    LeaseRateLimitedError,
    NothingToLeaseError,
    StoreThrottledError,
    StoreUnavailableError,
)
from querator.domain.ids import visible_bound
from querator.domain.lifecycle import Action
from querator.domain.model import MAX_BATCH, Lease
from querator.domain.priority import is_group_lane, lane_of, ledger_group
from querator.ports import ClaimInterruptedError, GroupLedger, Guard, Move
from querator.service.logs import is_log_id, reply_bytes_at_most
from querator.service.ratelimit import GROUP_WAIT_MAX, Limited, RateGate
from querator.service.tuning import (
    CURSOR_LAG,
    FIRST_PAGE_MIN,
    ITEMS_PER_CONCURRENT_CLAIM,
    LANES_PAGE,
    LANES_PER_TURN,
    LOSSES_BEFORE_RESCAN,
    MAX_LANES_PER_LEASE,
    MAX_REPLY_BYTES,
    MAX_RESCANS,
    MIN_POOL,
    OUTRACED_RETRIES,
    PAGE_MAX,
    POLL_FIRST,
    POLL_MAX,
    RECORDS_PER_CALL,
    WAVE_MAX,
)

if TYPE_CHECKING:
    import random
    from collections.abc import Iterator, Sequence
    from datetime import datetime, timedelta

    from querator.domain.model import Item, ItemState, QueueInfo
    from querator.ports import BatchResult, Clock, ItemStore, Page, PartitionHead
    from querator.service.logs import Logs
    from querator.service.queues import QueueDirectory
    from querator.service.settle import Settler

log = logging.getLogger("querator.service")


class _Holdings(threading.local):
    """What the calling thread's lease call holds so far: the items it claimed and which of them
    ``note_leased`` counted. A lease that fails midway gives exactly these back."""

    def __init__(self) -> None:
        #: By (partition, id): a lease tries partitions in turn, and ids are a partition's.
        self.claimed: dict[tuple[int, str], Item] = {}
        self.counted: set[tuple[int, str]] = set()
        #: Items leased from engine v3's logs, by partition (their claims are the logs' records).
        self.logged: dict[int, list[Item]] = {}
        #: Whether the call's last try left a band with items in it, every claim lost to other
        #: consumers: that try found items, so it must not count as finding nothing.
        self.outraced = False

    def clear(self) -> None:
        self.claimed.clear()
        self.counted.clear()
        self.logged.clear()


class _HoldingStore:
    """The item store as the leaser sees it: every claim and every count also lands in the calling
    thread's ``_Holdings``, so no claim site (band, lane, capped group) has to report its own."""

    def __init__(self, store: ItemStore, holdings: _Holdings, gate: RateGate) -> None:
        self._store = store
        self._holdings = holdings
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def claim(
        self, queue: str, partition: int, ids: Sequence[str], *, lease_deadline: datetime, now: datetime
    ) -> BatchResult[Item]:
        try:
            result = self._store.claim(queue, partition, ids, lease_deadline=lease_deadline, now=now)
        except ClaimInterruptedError as exc:
            self._hold(partition, exc.claimed)
            # What applied is held now; the rest of the service knows the failure itself.
            raise (exc.__cause__ or exc) from None
        self._hold(partition, result.applied)
        return result

    def claim_in_group(self, queue: str, partition: int, item_id: str, **kwargs: Any) -> Item | None:
        item = self._store.claim_in_group(queue, partition, item_id, **kwargs)
        if item is not None:
            self._hold(partition, [item])
        return item

    def note_leased(self, queue: str, partition: int, items: Sequence[Item], **kwargs: Any) -> None:
        self._store.note_leased(queue, partition, items, **kwargs)
        self._holdings.counted.update((partition, item.id) for item in items)

    def _hold(self, partition: int, items: Sequence[Item]) -> None:
        self._holdings.claimed.update(((partition, item.id), item) for item in items)
        self._gate.spend(items)


class Leaser:
    """Leases items; owns the waiting clients (one waiting lease per client id and queue) and the
    partition rotation (which partition this process tries first).

    A lease holds nothing it did not return: when any step fails after items were claimed (a store
    error on a claim, a count, a read), the items are given back before the error goes on, at the
    tail and with their attempt not spent (``give_back``), on every store.
    """

    def __init__(
        self,
        store: ItemStore,
        queues: QueueDirectory,
        settler: Settler,
        clock: Clock,
        rng: random.Random,
        claim_budget: timedelta,
        logs: Logs | None = None,
    ) -> None:
        self._holdings = _Holdings()
        self._logs = logs
        self._gate = RateGate(store)
        # Typed as the port: the wrapper adds bookkeeping to three of its methods, nothing else.
        self._store = cast("ItemStore", _HoldingStore(store, self._holdings, self._gate))
        self._queues = queues
        self._settler = settler
        self._clock = clock
        self._rng = rng
        self._claim_budget = claim_budget
        self._lock = threading.Lock()
        self._lease_turn: dict[str, int] = {}
        self._waiting: set[tuple[str, str]] = set()
        #: Set by ``stop_waiting`` when the process stops serving: no lease waits any more.
        self._stopping = threading.Event()

    def _sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` in steps of at most ``POLL_MAX``, so that a stop (``stop_waiting``)
        still answers within one step while a rate limit's longer wait runs."""
        while seconds > 0 and not self._stopping.is_set():
            step = min(seconds, POLL_MAX)
            self._clock.sleep(step)
            seconds -= step

    @staticmethod
    def _nap(limited: Limited, pause: float, now: datetime) -> float:
        """How long a waiting lease sleeps before it tries again: until the queue's limit has a
        lease (nothing can be leased before), until a held-back group has one (at most
        ``GROUP_WAIT_MAX``: other groups' items may come meanwhile), else the polling pause."""
        if limited.next_lease_at is not None:
            return max((limited.next_lease_at - now).total_seconds(), 0.001)
        if limited.groups_at is not None:
            wait = min(limited.groups_at - now, GROUP_WAIT_MAX)
            return max(wait.total_seconds(), 0.001)
        return pause

    def stop_waiting(self) -> None:
        """End every wait: a waiting lease tries the store once more and answers with what it
        finds, or with nothing to lease; later leases do not wait at all."""
        self._stopping.set()

    def lease(self, queue_name: str, *, batch_size: int, client_id: str, timeout: timedelta) -> Lease:
        """Lease up to ``batch_size`` items of one partition, by priority, then oldest first.

        Returns as soon as at least one item is leased; with nothing to lease it polls the store
        until ``timeout`` and then raises ``NothingToLeaseError``. Claiming stops once the call has
        spent ``claim_budget`` past the attempt that found items, so a lease of 1,000 answers within
        the platform's deadline with what it has claimed; the rest stays unclaimed.

        Under a rate limit (docs/adr/0081-lease-rate-limits.md) it leases what the limits let it,
        says in ``next_lease_at`` when the queue's limit has a lease again, waits for that time
        rather than polling, and raises ``LeaseRateLimitedError`` (with ``next_lease_at``) when the
        wait ends first.
        """
        if not 1 <= batch_size <= MAX_BATCH:
            raise InvalidRequestError(f"batch_size must be between 1 and {MAX_BATCH}", field="batch_size")
        if not client_id:
            raise InvalidRequestError("client_id is required", field="client_id")
        if timeout.total_seconds() < 0:
            raise InvalidRequestError("request_timeout may not be negative", field="request_timeout")
        queue = self._queues.queue(queue_name)
        waiter = (queue.name, client_id)
        with self._lock:
            if waiter in self._waiting:
                raise DuplicateClientError(
                    f"client_id '{client_id}' already has a waiting lease on '{queue.name}'"
                )
            self._waiting.add(waiter)
        try:
            started = self._clock.now()
            deadline = started + timeout
            pause = POLL_FIRST
            retries = 0
            while True:
                lease, limited = self._lease_once(queue, batch_size, self._clock.now())
                if lease.items:
                    return lease
                if (
                    self._holdings.outraced
                    and retries < OUTRACED_RETRIES
                    and self._clock.now() < started + self._claim_budget
                ):
                    retries += 1
                    # Items were there, but other consumers won every claim on them: try again at
                    # once rather than answer "nothing to lease" with items waiting (an empty
                    # reply means nothing was leasable; tests/linearizability checks that too).
                    continue
                now = self._clock.now()
                remaining = (deadline - now).total_seconds()
                # Checked between polls (at most POLL_MAX apart), so a stop answers within that.
                if remaining <= 0 or self._stopping.is_set():
                    back_at = limited.next_lease_at or limited.groups_at
                    if back_at is not None:
                        raise LeaseRateLimitedError(
                            f"the lease rate limit of '{queue.name}' has no lease left; next lease at"
                            f" {back_at.isoformat().replace('+00:00', 'Z')}",
                            next_lease_at=back_at,
                        )
                    raise NothingToLeaseError(f"nothing to lease in '{queue.name}'")
                self._sleep(min(self._nap(limited, pause, now), remaining))
                pause = min(pause * 2, POLL_MAX)
                queue = self._queues.queue(queue_name)
        finally:
            with self._lock:
                self._waiting.discard(waiter)

    def give_back(self, queue_name: str, partition: int, ids: Sequence[str]) -> int:
        """Put validly leased items back at once, their attempt not spent: for a lease whose reply
        could not be written. At the tail, as a lease that ran out would go (new ids; a stale holder
        of the old ids can no longer act). Returns how many went back."""
        queue = self._queues.queue(queue_name)
        now = self._clock.now()
        given = 0
        if self._logs is not None:
            logged = [i for i in ids if is_log_id(i)]
            given += self._logs.give_back_ids(queue, partition, logged, now) if logged else 0
            ids = [i for i in ids if not is_log_id(i)]
        if not ids:
            return given
        found = self._store.get_many(queue.name, partition, list(ids))
        leased = [item for item in found.values() if item.is_leased(now)]
        return given + self._put_back(queue, partition, leased, now)

    def _put_back(self, queue: QueueInfo, partition: int, items: Sequence[Item], now: datetime) -> int:
        moves = [
            Move(
                item=item,
                target_queue=queue.name,
                target_partition=partition,
                # The claim counted an attempt that never reached a consumer: it is not spent.
                replacement=replace(
                    self._settler.requeued(queue, item, now), attempts=max(item.attempts - 1, 0)
                ),
            )
            for item in items
        ]
        if not moves:
            return 0
        moved = self._store.move(queue.name, partition, moves, guard=Guard.LEASE_VALID, now=now).applied
        if queue.max_leased_per_group and moved:
            self._store.forget_leases(queue.name, partition, moved)
        return len(moved)

    def _lease_once(self, queue: QueueInfo, batch_size: int, now: datetime) -> tuple[Lease, Limited]:
        self._holdings.clear()
        self._holdings.outraced = False
        self._gate.begin()
        leased: list[Item] = []
        try:
            lease = self._lease_partitions(queue, batch_size, now)
            leased = lease.items
        except BaseException:
            self._give_back_holdings(queue, now)
            raise
        finally:
            self._holdings.clear()
            # Tokens taken for claims that did not end in the reply go back (all of them when the
            # call failed: the items went back too).
            limited = self._gate.finish(queue, leased, now)
        return replace(lease, next_lease_at=limited.next_lease_at), limited

    def _give_back_holdings(self, queue: QueueInfo, now: datetime) -> None:
        """After a failure midway: count what was claimed but not yet counted (so the move that
        gives it back keeps the counters true), then put it all back. Best effort: whatever cannot
        be given back now (the store still failing) returns when its lease record falls due."""
        by_partition: dict[int, list[Item]] = {}
        for (partition, _), item in self._holdings.claimed.items():
            by_partition.setdefault(partition, []).append(item)
        counted = set(self._holdings.counted)
        if self._logs is not None:
            for partition, items in self._holdings.logged.items():
                self._give_back_logged(queue, partition, items, now)
        for partition, items in by_partition.items():
            try:
                uncounted = [item for item in items if (partition, item.id) not in counted]
                if uncounted:
                    self._store.note_leased(queue.name, partition, uncounted, cursor=None)
                given = self._put_back(queue, partition, items, now)
            except Exception:  # the original failure goes on; this one is only logged
                log.exception(
                    "a failed lease of %s could not give back %d item(s) of partition %d; they return"
                    " when their lease runs out",
                    queue.name,
                    len(items),
                    partition,
                )
                continue
            log.warning(
                "a failed lease of %s gave back %d of %d claimed item(s) of partition %d",
                queue.name,
                given,
                len(items),
                partition,
            )

    def _give_back_logged(self, queue: QueueInfo, partition: int, items: list[Item], now: datetime) -> None:
        assert self._logs is not None  # noqa: S101 - only called with logs
        try:
            given = self._logs.give_back(queue, partition, items, now)
        except Exception:  # the original failure goes on; this one is only logged
            log.exception(
                "a failed lease of %s could not give back %d item(s) of partition %d; they return"
                " when their lease runs out",
                queue.name,
                len(items),
                partition,
            )
            return
        log.warning(
            "a failed lease of %s gave back %d of %d claimed item(s) of partition %d",
            queue.name,
            given,
            len(items),
            partition,
        )

    def _lease_partitions(self, queue: QueueInfo, batch_size: int, now: datetime) -> Lease:
        with self._lock:
            # Rotate the first partition tried, so one consumer drains every partition in turn.
            start = self._lease_turn.get(queue.name, self._rng.randrange(queue.partitions))
            self._lease_turn[queue.name] = start + 1
        for offset in range(queue.partitions):
            partition = (start + offset) % queue.partitions
            items = self._lease_partition(queue, partition, batch_size, now)
            if items:
                return Lease(queue_name=queue.name, partition=partition, items=items)
            if self._gate.exhausted(queue):
                break  # the queue's rate limit has nothing more for this call: no other partition
        return Lease(queue_name=queue.name, partition=start % queue.partitions)

    def _lease_partition(
        self, queue: QueueInfo, partition: int, batch_size: int, now: datetime
    ) -> list[Item]:
        """Claim up to ``batch_size`` items of one partition, highest priority first.

        Reads O(batch + bands in use): expired leases come from the lease records already due (one
        key range), and the candidates from each priority's band, from its cursor on, past which no
        valid lease sits except the few claimed since the cursor last moved
        (docs/adr/0050-engine-v2.md, docs/adr/0080-priority-fair-redrive.md). A partition whose
        items are all of priority 5 reads one band, as before priorities existed.
        """
        head, due = self._store.head(queue.name, partition, now=now, records=RECORDS_PER_CALL)
        if due:
            # Expired leases go back to the tail (new ids above the cursor) before this lease reads.
            try:
                recovered = self._settler.recover(queue, partition, due, now)
            except (StoreUnavailableError, StoreThrottledError) as exc:
                # Putting back others' expired leases is upkeep (the reaper's too), not this call's
                # work: a store that fails it (a slow transaction, a throttle) must not fail the
                # lease. The records stay due, so the next lease or reaper run tries again.
                log.warning("lease of %s: expired leases not put back yet (%s)", queue.name, exc)
            else:
                if recovered.entered_bands - head.bands - {""}:
                    # A priority given while leased put an item in a band this head row did not
                    # name: read the head again, or a lower priority would be leased before it.
                    head, _ = self._store.head(queue.name, partition, now=now)
        stop_at = now + self._claim_budget
        if self._logs is not None:
            return self._lease_both(queue, partition, head, batch_size, now, stop_at)
        if queue.fair or head.has_lanes:
            return self._lease_fair(queue, partition, head, batch_size, now, stop_at)
        return self._lease_bands(queue, partition, head, batch_size, now, stop_at)

    def _lease_both(
        self,
        queue: QueueInfo,
        partition: int,
        head: PartitionHead,
        batch_size: int,
        now: datetime,
        stop_at: datetime,
    ) -> list[Item]:
        """With engine v3's logs: band by band, highest priority first, and within a band what
        engine v2 still holds there first (it is older), then the band's log (or lanes' logs). So a
        table written by engine v2 keeps priority order across both engines while it drains: a v2
        item of priority 5 never comes before a log item of priority 0. A partition whose v2
        counters say it holds nothing there reads no v2 band."""
        assert self._logs is not None  # noqa: S101 - only called with logs
        claimed: list[Item] = []
        # A fair queue's lanes are registered for its logs too: the v2 counters, not the registry,
        # say whether v2 rows are left to serve.
        fair = queue.fair or head.has_lanes
        v2_left = head.items > 0
        reply_bytes = 0
        for band in head.leasable_bands():
            if len(claimed) >= batch_size or (claimed and self._clock.now() >= stop_at):
                break
            if v2_left:
                wanted = batch_size - len(claimed)
                if fair:
                    won, reply_bytes, drained = self._lease_lanes(
                        queue, partition, head, band, wanted, reply_bytes, now, stop_at
                    )
                else:
                    won, reply_bytes, cursor, drained = self._lease_band(
                        queue, partition, head, band, wanted, reply_bytes, now, stop_at
                    )
                    if won or cursor is not None:
                        self._store.note_leased(queue.name, partition, won, cursor=cursor)
                claimed += won
                # The band's log only once its v2 rows have nothing more to give (they are older).
                if not drained or len(claimed) >= batch_size:
                    break
            wanted = batch_size - len(claimed)
            if fair:
                won, reply_bytes, drained = self._lease_log_lanes(
                    queue, partition, head, band, wanted, reply_bytes, now, stop_at
                )
            else:
                won, reply_bytes, drained = self._logs.lease_band(
                    queue, partition, band, wanted, reply_bytes, self._gate, now
                )
                if won:
                    self._holdings.logged.setdefault(partition, []).extend(won)
            claimed += won
            # A lower priority only once this one has nothing more to give.
            if not drained:
                break
        if fair:
            return claimed  # priority first, then the rotation's order
        # v2's claims come back out of order after a lost race; ids sort in lease order across both
        # engines (a band's v2 ids before its log's), and the reply is in that order (contract).
        return sorted(claimed, key=lambda item: item.id)

    def _lease_log_lanes(
        self,
        queue: QueueInfo,
        partition: int,
        head: PartitionHead,
        band: str,
        wanted: int,
        reply_bytes: int,
        now: datetime,
        stop_at: datetime,
    ) -> tuple[list[Item], int, bool]:
        """A fair lease of one band's logs (engine v3): its lanes (the band's own log, items without
        a group, and a log per group) in ``_rotation``'s order, one item of each lane per turn;
        returns the items in that order, the reply's bytes so far, and whether every lane has
        nothing leasable left (so a lower priority may be read).

        The first turn reads the lanes' heads along the rotation until as many lanes have items
        as are wanted, each then giving one. Only once the rotation came round (every lane of the
        band read) are further turns dealt, over the lanes read, by their heads' counts: a second
        item of a lane never comes before the first item of a lane not yet read, as in
        ``_lease_lanes``. Each lane's share is then claimed at once: one claim, one head write per
        lane taken from, with a group's ``max_leased_per_group`` checked in that write
        (``ClaimLog.claim(max_leased=...)``), so consumers racing for a group never pass it. The
        ring (the lane served last) goes to the partition's head, so the turn carries over.

        Reads: a head read per lane looked at (at most ``MAX_LANES_PER_LEASE``, O(lanes touched),
        from the partition's lane registry a page at a time), and with a cap and several bands in
        use, the group's heads in the other bands. Writes: a claim per lane taken from, and one
        head write of the partition for the ring.
        """
        assert self._logs is not None  # noqa: S101 - only called with logs
        rotation = self._rotation(queue, partition, head, band)
        lanes: list[_LogLane] = []
        offering = 0
        came_round = False
        while (
            offering < wanted
            and len(lanes) < MAX_LANES_PER_LEASE
            # The first lane is read whatever the budget says, as a band's first page is.
            and (not lanes or self._clock.now() < stop_at)
        ):
            following = next(rotation, None)
            if following is None:
                came_round = True
                break
            lanes.append(self._log_lane(queue, partition, head, band, following[0], now))
            offering += lanes[-1].room > 0
        if not came_round and offering < wanted and len(lanes) >= MAX_LANES_PER_LEASE:
            # Read its most lanes: when they were all of the band's, further turns may serve them.
            came_round = next(rotation, None) is None
        turns = _deal_turns(lanes, wanted, came_round)
        # Groups whose rate limit has nothing left sit this call out; the rotation goes on past them.
        turns = self._gate.within_groups(queue, turns, wanted, now)
        turns = turns[: self._gate.allow(queue, len(turns), len(turns), now)] if turns else []
        # The reply cap, by each lane's largest item ever (a claim cannot see sizes before it
        # writes): the first turn is taken whatever its size, a lease returns at least one item.
        first = turns[0].per_item if turns else 0
        room = MAX_REPLY_BYTES - reply_bytes if reply_bytes else max(MAX_REPLY_BYTES, first)
        fitting = 0
        for turn in turns:
            if turn.per_item > room:
                break
            room -= turn.per_item
            fitting += 1
        full = fitting < len(turns)
        shares: dict[str, int] = {}
        for turn in turns[:fitting]:
            shares[turn.lane] = shares.get(turn.lane, 0) + 1
        by_lane = {lane.lane: lane for lane in lanes}
        won: dict[str, list[Item]] = {}
        short = False
        for lane_name, share in shares.items():
            lane = by_lane[lane_name]
            items = self._logs.claim_lane(
                queue, partition, lane_name, share, now, max_leased=lane.cap, room=share * lane.per_item
            )
            # Held at once: a later claim that fails gives these back with it.
            self._holdings.logged.setdefault(partition, []).extend(items)
            self._gate.spend(items)
            lane.taken = len(items)
            won[lane_name] = items
            # Fewer than dealt: other consumers claimed them (or the group's cap) first.
            short = short or len(items) < share
        # The reply in turn order: each turn's items in rotation order, turn after turn.
        claimed: list[Item] = []
        served = {lane: iter(items) for lane, items in won.items()}
        last = None
        for turn in turns[:fitting]:
            item = next(served[turn.lane], None)
            if item is not None:
                claimed.append(item)
                last = turn.lane
        reply_bytes += sum(reply_bytes_at_most(item.reply_size()) for item in claimed)
        if shares and not claimed:
            self._holdings.outraced = True  # items were there; others won every claim on them
        drained = all(lane.waiting <= lane.taken or self._gate.held_back(lane.lane) for lane in lanes)
        ring = last
        if ring is None and len(lanes) >= MAX_LANES_PER_LEASE and drained:
            # A call that read its most lanes and found them all empty moves the ring past them, so
            # the next call reads the lanes after them rather than the same empty ones again.
            ring = lanes[-1].lane
        if ring is not None:
            self._store.note_leased(queue.name, partition, [], cursor=None, ring=(band, ring))
        stopped = short or full or self._gate.exhausted(queue)
        return claimed, reply_bytes, came_round and not stopped and drained

    def _log_lane(
        self, queue: QueueInfo, partition: int, head: PartitionHead, band: str, lane: str, now: datetime
    ) -> _LogLane:
        """What a fair lease may take from one lane's log: its head's waiting items, under its
        group's ``max_leased_per_group``. The cap is one per group across priorities: the group's
        leases in the other bands in use count against it (read from their heads; a claim racing in
        another band at the same moment is not seen, the one gap the claim's own check leaves)."""
        assert self._logs is not None  # noqa: S101 - only called with logs
        seen = self._logs.lane_head(queue, partition, lane, now)
        waiting = max(seen.waiting, 0)
        cap: int | None = None
        room = waiting
        if queue.max_leased_per_group and is_group_lane(lane):
            group = ledger_group(lane)
            others = [b + group for b in head.leasable_bands() if b != band]
            cap = max(queue.max_leased_per_group - self._logs.leased_in(queue, partition, others), 0)
            room = max(min(waiting, cap - seen.leased), 0)
        return _LogLane(
            lane=lane, waiting=waiting, room=room, cap=cap, per_item=reply_bytes_at_most(seen.largest)
        )

    def _lease_bands(
        self,
        queue: QueueInfo,
        partition: int,
        head: PartitionHead,
        batch_size: int,
        now: datetime,
        stop_at: datetime,
    ) -> list[Item]:
        """A FIFO lease of engine v2's rows: band by band, highest priority first."""
        claimed: list[Item] = []
        reply_bytes = 0
        for band in head.leasable_bands():
            won, reply_bytes, cursor, drained = self._lease_band(
                queue, partition, head, band, batch_size - len(claimed), reply_bytes, now, stop_at
            )
            claimed += won
            if won or cursor is not None:
                # A head write per band that leased or moved its cursor (one, unless the batch spans bands).
                self._store.note_leased(queue.name, partition, won, cursor=cursor)
            # A lower priority only once this one has nothing more to give: not when the batch is
            # full, and not when items of this band were left (lost races, a full reply, the budget).
            if not drained or len(claimed) >= batch_size or self._clock.now() >= stop_at:
                break
        # Claimed out of order after a lost race; the reply is in priority, then FIFO order (contract).
        return sorted(claimed, key=lambda item: item.id)

    def _lease_fair(
        self,
        queue: QueueInfo,
        partition: int,
        head: PartitionHead,
        batch_size: int,
        now: datetime,
        stop_at: datetime,
    ) -> list[Item]:
        """A fair lease: band by band, highest priority first, round-robin over the band's lanes
        (its items without a group, then each group's lane) from the one after the band's ring;
        O(batch + lanes touched) reads (docs/adr/0080-priority-fair-redrive.md)."""
        claimed: list[Item] = []
        reply_bytes = 0
        for band in head.leasable_bands():
            won, reply_bytes, drained = self._lease_lanes(
                queue, partition, head, band, batch_size - len(claimed), reply_bytes, now, stop_at
            )
            claimed += won
            if not drained or len(claimed) >= batch_size or self._clock.now() >= stop_at:
                break
        return claimed  # priority first, then the rotation's order

    def _rotation(
        self, queue: QueueInfo, partition: int, head: PartitionHead, band: str
    ) -> Iterator[tuple[str, str]]:
        """The lanes of ``band`` in turn, as (lane, cursor), from the one after the band's ring: its
        group lanes after the ring, the band itself (items without a group), then the group lanes
        up to and with the ring. Read from the store a page at a time, as far as the caller goes."""
        ring = head.rings.get(band, "")
        after = ring
        while True:
            page = self._store.lanes(queue.name, partition, band, after=after, limit=LANES_PAGE)
            yield from ((lane.lane, lane.cursor) for lane in page)
            if len(page) < LANES_PAGE:
                break
            after = page[-1].lane
        yield band, head.cursor_in(band)
        after = ""
        while ring > band:
            page = self._store.lanes(queue.name, partition, band, after=after, limit=LANES_PAGE)
            for lane in page:
                if lane.lane > ring:
                    return
                yield lane.lane, lane.cursor
            if len(page) < LANES_PAGE:
                return
            after = page[-1].lane

    def _lease_lanes(
        self,
        queue: QueueInfo,
        partition: int,
        head: PartitionHead,
        band: str,
        batch_size: int,
        reply_bytes: int,
        now: datetime,
        stop_at: datetime,
    ) -> tuple[list[Item], int, bool]:
        """Claim up to ``batch_size`` items of ``band``'s lanes, one per lane per turn in the
        rotation's order; returns the items, the reply's bytes so far, and whether every lane was
        read to its end with nothing leasable left.

        The first turn walks the rotation a few lanes at a time, taking the oldest item of each lane
        that has one, until the batch is full. Only once the walk has come round (every lane of the
        band read) do further turns start, over the lanes read, from the first lane after the ring
        again: a second item of a lane never comes before the first item of a lane not yet read,
        whatever the batch and the number of lanes. The ring is then the lane of the last item, so
        the next call goes on from the lane after it (the turn carries over).
        """
        rotation = self._rotation(queue, partition, head, band)
        lanes: list[_LaneRead] = []
        claimed: list[Item] = []
        came_round = stopped = False
        # The first turn: on along the rotation, until as many lanes offered an item as are wanted.
        while (
            len(claimed) < batch_size
            and len(lanes) < MAX_LANES_PER_LEASE
            # The first turn is read whatever the budget says, as a band's first page is.
            and (not lanes or self._clock.now() < stop_at)
            and not self._gate.exhausted(queue)
        ):
            want = batch_size - len(claimed)
            asked = min(want, LANES_PER_TURN, MAX_LANES_PER_LEASE - len(lanes))
            turn = list(itertools.islice(rotation, asked))
            came_round = len(turn) < asked
            share = -(-want // max(len(turn), 1))
            limit = min(PAGE_MAX, max(2 * share, 2))
            read = [
                self._read_lane(queue, partition, lane, cursor, limit, now, stop_at) for lane, cursor in turn
            ]
            lanes += read
            if came_round or not read:
                break  # the further turns below serve these lanes' first items with the others'
            offered = [lane.candidates[0] for lane in read if lane.candidates]
            for lane in read:
                lane.taken = min(1, len(lane.candidates))
            won, reply_bytes, stopped = self._claim_turns(
                queue, partition, offered, want, reply_bytes, now, stop_at
            )
            claimed += won
            if stopped:
                break
        if not (came_round or stopped) and len(claimed) < batch_size and len(lanes) >= MAX_LANES_PER_LEASE:
            # Read its most lanes: when they were all of the band's, further turns may serve them.
            came_round = next(rotation, None) is None
        # Further turns, once every lane has been read: round-robin over those with items left.
        while came_round and not stopped and len(claimed) < batch_size and self._clock.now() < stop_at:
            pool = self._next_turns(queue, partition, lanes, batch_size - len(claimed), now, stop_at)
            if not pool:
                break
            won, reply_bytes, stopped = self._claim_turns(
                queue, partition, pool, batch_size - len(claimed), reply_bytes, now, stop_at
            )
            claimed += won
            stopped = stopped or not won  # lost to competitors, or every group with items is capped
        emptied = self._note_lanes(queue, partition, band, lanes, claimed, now)
        return claimed, reply_bytes, came_round and not stopped and emptied

    def _next_turns(
        self,
        queue: QueueInfo,
        partition: int,
        lanes: list[_LaneRead],
        wanted: int,
        now: datetime,
        stop_at: datetime,
    ) -> list[ItemState]:
        """The candidates of the next turns over ``lanes`` (all of the band's, in rotation order),
        one of each lane per turn, enough for ``wanted``: a lane read to fewer candidates than those
        turns need is read on first. Marks them taken (offered to a claim)."""
        live = [lane for lane in lanes if lane.taken < len(lane.candidates) or not lane.ended]
        if not live:
            return []
        share = -(-wanted // len(live))
        for lane in live:
            if not lane.ended and len(lane.candidates) < lane.taken + share:
                lane.read_on(
                    self._read_lane(queue, partition, lane.lane, lane.read_to, 2 * share, now, stop_at)
                )
        # A turn is complete only where every lane that may hold more was read that far.
        turns = min(
            (len(lane.candidates) for lane in live if not lane.ended),
            default=max(len(lane.candidates) for lane in live),
        )
        first = min(lane.taken for lane in live)
        pool = [
            lane.candidates[turn]
            for turn in range(first, turns)
            for lane in live
            if lane.taken <= turn < len(lane.candidates)
        ]
        for lane in live:
            lane.taken = max(lane.taken, min(turns, len(lane.candidates)))
        return pool

    def _claim_turns(
        self,
        queue: QueueInfo,
        partition: int,
        pool: list[ItemState],
        wanted: int,
        reply_bytes: int,
        now: datetime,
        stop_at: datetime,
    ) -> tuple[list[Item], int, bool]:
        """Claim up to ``wanted`` of ``pool`` (in rotation order, which alone they are won in);
        returns the items in that order, the reply's bytes, and whether the lease must stop here
        (claims lost races, or the reply is full)."""
        # Groups whose rate limit has nothing left sit this call out; the rotation goes on past them.
        pool = self._gate.within_groups(queue, pool, wanted, now)
        if not pool:
            return [], reply_bytes, False
        first = reply_size(pool[0])
        room = MAX_REPLY_BYTES - reply_bytes if reply_bytes else max(MAX_REPLY_BYTES, first)
        contended = False
        if queue.max_leased_per_group:
            won = self._claim_capped(queue, partition, pool, wanted, room, now, stop_at)
        else:
            won, _, contended = self._claim(
                queue, partition, pool, wanted, room, now + queue.lease_timeout, now, stop_at
            )
        won_ids = {item.id for item in won}
        reply_bytes += sum(reply_size(s) for s in pool if s.id in won_ids)
        order = {s.id: n for n, s in enumerate(pool)}
        won.sort(key=lambda item: order[item.id])
        # An item left that would not fit means the reply is full: a later, smaller one must not
        # jump its turn (the claims stop at the first that does not fit, in order).
        full = any(reply_size(s) > MAX_REPLY_BYTES - reply_bytes for s in pool if s.id not in won_ids)
        return won, reply_bytes, contended or (len(won) < wanted and full) or self._gate.exhausted(queue)

    def _note_lanes(
        self,
        queue: QueueInfo,
        partition: int,
        band: str,
        lanes: list[_LaneRead],
        claimed: list[Item],
        now: datetime,
    ) -> bool:
        """Move the cursors of the lanes read and the band's ring (the lane of the last item, which
        is the last lane served in rotation order), and count the items leased; returns whether
        every lane was read to its end with nothing left."""
        won_ids = {item.id for item in claimed}
        cursor_cap = visible_bound(now - CURSOR_LAG)
        drained = True
        for lane in lanes:
            # The oldest item of the lane this call saw and left: the lane's cursor stops there.
            left = [s.id for s in lane.candidates if s.id not in won_ids] + (
                [lane.skipped] if lane.skipped else []
            )
            open_at = min(left) if left else None
            # A group held back by its rate limit does not keep lower priorities waiting: its items
            # are not leasable in this call (its cursor still stops at them).
            drained = drained and (self._gate.held_back(lane.lane) or (lane.done and open_at is None))
            new = min(lane.read_to, lane.lane + cursor_cap, *([open_at] if open_at else []))
            if new > lane.cursor and lane.evaluated > 0:
                self._store.note_leased(queue.name, partition, [], cursor=new)
        ring = (band, lane_of(claimed[-1].id)) if claimed else None
        if ring is None and len(lanes) >= MAX_LANES_PER_LEASE and drained:
            # A call that read its most lanes and found them all empty moves the ring past them, so
            # the next call reads the lanes after them rather than the same empty ones again.
            ring = (band, lanes[-1].lane)
        if claimed or ring is not None:
            self._store.note_leased(queue.name, partition, claimed, cursor=None, ring=ring)
        return drained

    def _read_lane(
        self,
        queue: QueueInfo,
        partition: int,
        lane: str,
        cursor: str,
        wanted: int,
        now: datetime,
        stop_at: datetime,
    ) -> _LaneRead:
        """Up to ``wanted`` leasable items of one lane from ``cursor``, settling what it finds
        expired or dead on the way; reads on past the few valid leases above the cursor (claimed
        since it last moved) like a band's lease does."""
        candidates: list[ItemState] = []
        skipped: str | None = None
        start, limit, evaluated = cursor, wanted, 0
        while True:
            page = self._store.scan(
                queue.name,
                partition,
                start=start,
                end=lane + visible_bound(now),
                limit=limit,
                available_at=now,
            )
            found, left = self._sort_page(queue, partition, page, now)
            candidates += found
            skipped = skipped or left
            evaluated += page.evaluated
            if len(candidates) >= wanted or page.done or skipped or self._clock.now() >= stop_at:
                return _LaneRead(lane, cursor, candidates, page.read_to, skipped, page.done, evaluated)
            start, limit = page.read_to, PAGE_MAX

    def _sort_page(
        self, queue: QueueInfo, partition: int, page: Page, now: datetime
    ) -> tuple[list[ItemState], str | None]:
        """The page's items a lease may claim, after settling those whose lease ran out or whose
        time is up; and the first id a settle had to leave (its dead-letter queue is missing), where
        a cursor must stop."""
        candidates: list[ItemState] = []
        settle: list[tuple[ItemState, lifecycle.Decision]] = []
        for state in page.items:
            decision = lifecycle.decide_for_lease(state, queue, now)
            if decision.action is Action.LEASE:
                candidates.append(state)
            elif decision.action is not Action.KEEP:
                settle.append((state, decision))
        if not settle:
            return candidates, None
        try:
            skipped = self._settler.settle(queue, partition, settle, now).skipped
        except (StoreUnavailableError, StoreThrottledError) as exc:
            # Upkeep on the way, like the put-back of expired leases: a failure leaves these items
            # for a later call (the cursor stops at the first), and the lease goes on.
            log.warning("lease of %s: %d item(s) not settled yet (%s)", queue.name, len(settle), exc)
            skipped = len(settle)
        return candidates, settle[0][0].id if skipped else None

    def _claim_capped(
        self,
        queue: QueueInfo,
        partition: int,
        pool: list[ItemState],
        wanted: int,
        max_bytes: int,
        now: datetime,
        stop_at: datetime,
    ) -> list[Item]:
        """Claim from ``pool`` in its order, never letting a group hold more than
        ``max_leased_per_group`` valid leases: each claim enters the group's ledger in the same
        atomic step, conditioned on the ledger the count was made from (a competitor's claim in
        between makes it read the ledger again). Items without a group are not capped."""
        wanted = self._gate.allow(queue, wanted, len(pool), now)
        if not wanted:
            return []
        lease_deadline = now + queue.lease_timeout
        self._store.record_lease(queue.name, partition, [s.id for s in pool], deadline=lease_deadline)
        sizes = {s.id: reply_size(s) for s in pool}
        won: list[Item] = []
        room = max_bytes
        full: set[str] = set()
        # Each group's ledger as this call last read or wrote it: a claim that succeeded moved it
        # to a version this call knows, so the next claim in the group needs no read.
        ledgers: dict[str, GroupLedger] = {}
        pending = list(pool)
        while pending and len(won) < wanted and (not won or self._clock.now() < stop_at):
            state = pending.pop(0)
            if sizes[state.id] > room and won:
                break
            lane = lane_of(state.id)
            if not is_group_lane(lane):
                got = self._store.claim(
                    queue.name, partition, [state.id], lease_deadline=lease_deadline, now=now
                ).applied
                won += got
                room -= sum(sizes[i.id] for i in got)
                continue
            group = ledger_group(state.id)
            if group in full:
                continue
            for _ in range(MAX_RESCANS + 2):
                ledger = (
                    ledgers.get(group) or self._store.group_ledgers(queue.name, partition, [group])[group]
                )
                counted, forget = self._valid_leases(queue, partition, ledger, now)
                if counted >= queue.max_leased_per_group:
                    full.add(group)
                    break
                item = self._store.claim_in_group(
                    queue.name,
                    partition,
                    state.id,
                    version=ledger.version,
                    forget=forget,
                    lease_deadline=lease_deadline,
                    now=now,
                )
                if item is not None:
                    won.append(item)
                    room -= sizes[state.id]
                    leases = {i: d for i, d in ledger.leases.items() if i not in forget}
                    leases[item.id] = lease_deadline
                    ledgers[group] = GroupLedger(version=ledger.version + 1, leases=leases)
                    break
                ledgers.pop(group, None)  # moved by a competitor (or the item is gone): read it again
                if not self._available(queue, partition, state.id, now):
                    break  # taken by a competitor (or gone): on to the next item
        return won

    def _valid_leases(
        self, queue: QueueInfo, partition: int, ledger: GroupLedger, now: datetime
    ) -> tuple[int, list[str]]:
        """How many of the ledger's leases are valid, and the ids it may forget. An entry whose
        deadline passed is checked against its item: a renewed lease still counts."""
        live = [i for i, deadline in ledger.leases.items() if deadline > now]
        stale = [i for i, deadline in ledger.leases.items() if deadline <= now]
        if not stale:
            return len(live), []
        renewed = {
            s.id
            for s in self._store.states(queue.name, partition, stale)
            if s.lease_deadline is not None and s.lease_deadline > now
        }
        return len(live) + len(renewed), [i for i in stale if i not in renewed]

    def _available(self, queue: QueueInfo, partition: int, item_id: str, now: datetime) -> bool:
        states = self._store.states(queue.name, partition, [item_id])
        return bool(states) and states[0].lease_deadline is None and states[0].expire_deadline > now

    def _lease_band(
        self,
        queue: QueueInfo,
        partition: int,
        head: PartitionHead,
        band: str,
        batch_size: int,
        reply_bytes: int,
        now: datetime,
        stop_at: datetime,
    ) -> tuple[list[Item], int, str | None, bool]:
        """Claim up to ``batch_size`` items of one priority's band; returns the items, the reply's
        bytes so far, the band's new cursor (``None``: it stays), and whether the band was read to
        its end with nothing leasable left behind."""
        lease_deadline = now + queue.lease_timeout
        end = band + visible_bound(now)
        # The cursor never passes ids younger than CURSOR_LAG: a write minted a moment ago may still
        # be on its way to the store, and the cursor must not jump over it (docs/adr/0050).
        cursor_cap = band + visible_bound(now - CURSOR_LAG)
        old_cursor = start = head.cursor_in(band)
        first_open: str | None = None  # the oldest item this call saw available and left unclaimed
        claimed: list[Item] = []
        limit = min(PAGE_MAX, max(FIRST_PAGE_MIN, 2 * batch_size))
        read_to = start
        evaluated = 0
        rescans = 0
        drained = False
        reads = 0
        # The first page is read whatever the budget says: a slow head read or a slow recovery of
        # expired leases must not turn a lease into "nothing to lease" while items wait.
        while len(claimed) < batch_size and (reads == 0 or self._clock.now() < stop_at):
            reads += 1
            page = self._store.scan(
                queue.name, partition, start=start, end=end, limit=limit, available_at=now
            )
            candidates, left = self._sort_page(queue, partition, page, now)
            if left is not None:
                first_open = _min_id(first_open, left)
            # The pool: more candidates than wanted, so that after a lost race a consumer goes on to
            # the next-oldest without reading again, but few enough that the lease record listing
            # them stays a small write.
            wanted = batch_size - len(claimed)
            pool = candidates[: max(2 * wanted, MIN_POOL)]
            # The first item is taken whatever its size (a lease returns at least one); after it the
            # reply must stay under the cap.
            won: list[Item] = []
            untried: set[str] = set()
            contended = False
            if pool:
                first = reply_size(pool[0])
                room = MAX_REPLY_BYTES - reply_bytes if reply_bytes else max(MAX_REPLY_BYTES, first)
                won, untried, contended = self._claim(
                    queue, partition, pool, wanted, room, lease_deadline, now, stop_at
                )
                # Every candidate of the band's last page tried and lost (fewer than
                # LOSSES_BEFORE_RESCAN of them): the page went stale, the band is not empty; read it
                # again. (Short of the band's end, the next page is read, as after any short pool.)
                contended = contended or (page.done and not (won or untried))
            claimed += won
            won_ids = {item.id for item in won}
            reply_bytes += sum(reply_size(s) for s in pool if s.id in won_ids)
            pooled = {s.id for s in pool}
            leftover = [s.id for s in candidates if s.id in untried or s.id not in pooled]
            if leftover:
                first_open = _min_id(first_open, min(leftover))
            if contended and not claimed and rescans < MAX_RESCANS:
                # Other consumers took this page's candidates since it was read: read it again rather
                # than keep trying stale ids (a Query costs reads; each lost claim is a charged write).
                rescans += 1
                continue
            if contended and not claimed:
                self._holdings.outraced = True
            read_to = page.read_to
            evaluated += page.evaluated
            drained = page.done and not contended and first_open is None
            if contended or page.done or first_open is not None:
                break
            start = page.read_to
            limit = PAGE_MAX
        cursor = min(read_to, cursor_cap) if first_open is None else min(first_open, read_to, cursor_cap)
        # The cursor moves only past items: over an empty range it would save no later read, and
        # an idle consumer's every poll would be a write.
        moved = cursor > old_cursor and evaluated > 0
        return claimed, reply_bytes, cursor if moved else None, drained

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
        Claims go strictly oldest first, alone or not: each wave takes the oldest candidates not
        tried yet, so an item a lease returns never passes an older one it left waiting (every older
        candidate was won by this call or lost to a competitor that holds it; docs/api.md promises
        oldest first, and tests/linearizability checks it). Alone, a consumer never loses; its waves
        double from 1 to one claim in flight per ``ITEMS_PER_CONCURRENT_CLAIM`` candidates, at most
        ``WAVE_MAX``. A lost race means other consumers are claiming from the same page, so the
        rest of it is going stale, and every further loss is a charged write: after a loss the wave
        drops back to one claim, of the next-oldest candidate; the call stops after two losses in a
        row once it has won something (the contract returns as soon as one item is leased) and
        gives the page up after ``LOSSES_BEFORE_RESCAN`` losses in a row with nothing won. Measured
        in docs/adr/0050-engine-v2.md.
        """
        pending = [s.id for s in candidates]
        if not pending:
            return [], set(), False
        # The queue's rate limit, taken here where the claims are about to be made: an idle poll
        # (no candidates) takes no token.
        wanted = self._gate.allow(queue, wanted, len(pending), now)
        if not wanted:
            return [], set(pending), False
        sizes = {s.id: reply_size(s) for s in candidates}
        self._store.record_lease(queue.name, partition, pending, deadline=lease_deadline)
        # Small leases claim one at a time, as concurrent consumers of the same page lose least that
        # way (every loss is a charged write); large ones need concurrency to fit their deadline.
        wave_max = max(1, min(WAVE_MAX, wanted // ITEMS_PER_CONCURRENT_CLAIM))
        won: list[Item] = []
        room = max_bytes
        wave = 1
        losses = 0
        # The budget counts from the read that found items: the first claim is always made.
        while pending and len(won) < wanted and (not won or self._clock.now() < stop_at):
            batch: list[str] = []
            while pending and len(batch) < min(wave, wanted - len(won)):
                if sizes[pending[0]] > room:
                    break
                room -= sizes[pending[0]]
                batch.append(pending.pop(0))
            if not batch:
                break  # the reply is full: the rest stays unclaimed
            got = self._store.claim(
                queue.name, partition, batch, lease_deadline=lease_deadline, now=now
            ).applied
            won += got
            room += sum(sizes[i] for i in batch) - sum(sizes[i.id] for i in got)
            if len(got) == len(batch):
                losses = 0
                wave = min(wave * 2, wave_max)
                continue
            losses += len(batch) - len(got)
            if (won and losses > 1) or losses >= LOSSES_BEFORE_RESCAN:
                return won, set(pending), True
            wave = 1
        return won, set(pending), False


@dataclass(slots=True)
class _LaneRead:
    """What a fair lease read of one lane: its cursor, the candidates, where the read stopped, the
    first id a skipped settle left (where the cursor must stop), whether the lane ended, how many
    ids were evaluated, and how many candidates were offered to claims (its turns taken)."""

    lane: str
    cursor: str
    candidates: list[ItemState]
    read_to: str
    skipped: str | None
    done: bool
    evaluated: int
    taken: int = 0

    @property
    def ended(self) -> bool:
        """Nothing more to read in this call: the lane's end, or an item a settle had to leave."""
        return self.done or self.skipped is not None

    def read_on(self, more: _LaneRead) -> None:
        """Add a further read of the lane, from where this one stopped."""
        self.candidates += more.candidates
        self.read_to, self.skipped, self.done = more.read_to, more.skipped, more.done
        self.evaluated += more.evaluated


@dataclass(slots=True)
class _LogLane:
    """What a fair lease of engine v3's logs saw of one lane's head: its waiting items, how many
    of them it may claim (``room``: under the group's cap), the ``max_leased`` its claim passes
    (``None``: no cap), what its largest item adds to a reply, and how many it took."""

    lane: str
    waiting: int
    room: int
    cap: int | None
    per_item: int
    taken: int = 0

    @property
    def id(self) -> str:
        """Where the rate gate finds the lane's group (``ratelimit.group_bucket``)."""
        return self.lane


def _deal_turns(lanes: list[_LogLane], wanted: int, came_round: bool) -> list[_LogLane]:
    """Up to ``wanted`` turns over ``lanes`` (in rotation order), one per lane with room per turn:
    a single turn until the rotation came round, then as many as their rooms allow."""
    live = [lane for lane in lanes if lane.room > 0]
    turns: list[_LogLane] = []
    depth = 0
    while live and len(turns) < wanted:
        for lane in live:
            if len(turns) < wanted:
                turns.append(lane)
        depth += 1
        if not came_round:
            break
        live = [lane for lane in live if lane.room > depth]
    return turns


def reply_size(state: ItemState) -> int:
    """What a read item adds to a lease reply at most (its stored ``payload_size``, 0 under the
    threshold, counts as the threshold: ``reply_bytes_at_most``)."""
    return reply_bytes_at_most(state.payload_size)


def _min_id(current: str | None, candidate: str) -> str:
    return candidate if current is None else min(current, candidate)
