"""Lease rate limits: the tokens one lease call takes, uses and gives back
(docs/adr/0081-lease-rate-limits.md).

A lease takes tokens only where it is about to claim (it has candidates), as many as it is about
to claim: an idle poll takes none, and a lease that finds nothing writes no bucket. The queue's
bucket is taken from before a claim; a group's (fair queues) when the group's items are offered
to one, and a group whose bucket is empty sits out the rest of the call while the rotation goes on
to the others. Each bucket is taken from again within a call only when the call wants more of it
than it took. When the call ends, tokens taken and not used (claims lost to other consumers, a
reply that filled, an item gone) go back; when it fails midway, everything it took goes back with
the items (a lease that fails holds nothing).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Protocol, TypeVar

from querator.domain.model import timestamp_us, utc_from_timestamp_us
from querator.domain.priority import is_group_lane, ledger_group

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from querator.domain.model import Item, QueueInfo
    from querator.domain.ratelimit import RateLimit
    from querator.ports import ItemStore

log = logging.getLogger("querator.service")


class _Keyed(Protocol):
    """What ``RateGate.within_groups`` offers: an item read (engine v2) or a lane about to be
    claimed (engine v3's logs), whose id or lane names its group."""

    @property
    def id(self) -> str: ...


_Offered = TypeVar("_Offered", bound=_Keyed)

#: The queue's own bucket; a group's is its ledger group (``g`` and 16 hex digits).
QUEUE_BUCKET = ""


def group_bucket(item_id: str) -> str | None:
    """The bucket of an item's group in a fair queue; ``None`` for an item without a group (not
    limited per group, like ``max_leased_per_group``)."""
    return ledger_group(item_id) or None


@dataclass(slots=True)
class _Bucket:
    taken: int = 0
    used: int = 0
    #: The bucket had fewer tokens than asked: not asked again in this call.
    empty: bool = False
    #: When the bucket has a token again, after this call's takes (microseconds).
    next_us: int = 0


@dataclass(slots=True)
class _Call:
    """One lease call's buckets, by name."""

    buckets: dict[str, _Bucket] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Limited:
    """What the limits say after a call: ``next_lease_at``, when the queue's bucket has a token
    again (``None``: it has one now, or the queue has no limit); ``groups_at``, the earliest time
    a group whose bucket was empty has one (``None``: no group was held back)."""

    next_lease_at: datetime | None = None
    groups_at: datetime | None = None


class RateGate:
    """The rate limits of the lease calls of one process; per-call state is per thread."""

    def __init__(self, store: ItemStore) -> None:
        self._store = store
        self._call = threading.local()

    def _state(self) -> _Call:
        state = getattr(self._call, "state", None)
        if state is None:
            state = self._call.state = _Call()
        return state

    def begin(self) -> None:
        """A lease call starts: it holds no tokens."""
        self._call.state = _Call()

    def allow(self, queue: QueueInfo, wanted: int, candidates: int, now: datetime) -> int:
        """How many of ``wanted`` claims (from ``candidates``) the queue's limit lets this call
        make now; ``wanted`` itself when the queue has no limit. Tokens are asked for at most as
        many claims as there are candidates."""
        limit = queue.queue_rate
        if limit is None:
            return wanted
        wanted = min(wanted, candidates)
        return min(wanted, self._ensure(queue, QUEUE_BUCKET, wanted, limit, now))

    def exhausted(self, queue: QueueInfo) -> bool:
        """The queue's bucket gave this call all it will: no more claims in this call."""
        if queue.queue_rate is None:
            return False
        bucket = self._state().buckets.get(QUEUE_BUCKET)
        return bucket is not None and bucket.empty and bucket.used >= bucket.taken

    def within_groups(
        self, queue: QueueInfo, pool: list[_Offered], wanted: int, now: datetime
    ) -> list[_Offered]:
        """``pool`` (in its order) without the items their groups' limits do not let this call
        claim now: a bucket per group offered, asked once for as many as the group has in the
        first ``wanted`` of the pool (its turns), not again while it has tokens left."""
        limit = queue.group_rate
        if limit is None or not pool:
            return pool
        state = self._state()
        groups = [group_bucket(s.id) for s in pool]
        asked = Counter(g for g in groups[:wanted] if g is not None)
        for group, count in asked.items():
            bucket = state.buckets.get(group)
            if bucket is None or not bucket.empty:
                self._ensure(queue, group, count, limit, now)
        room = {name: b.taken - b.used for name, b in state.buckets.items() if name != QUEUE_BUCKET}
        kept = []
        for offered, of_group in zip(pool, groups, strict=True):
            if of_group is None:
                kept.append(offered)
            elif room.get(of_group, 0) > 0:
                room[of_group] -= 1
                kept.append(offered)
        return kept

    def held_back(self, lane: str) -> bool:
        """The group of ``lane`` was held back by its limit in this call."""
        if not is_group_lane(lane):
            return False
        bucket = self._state().buckets.get(ledger_group(lane))
        return bucket is not None and bucket.empty and bucket.used >= bucket.taken

    def spend(self, items: Sequence[Item]) -> None:
        """Count claimed items against the buckets they were taken from."""
        state = self._state()
        if not state.buckets:
            return
        for item in items:
            for name in (QUEUE_BUCKET, group_bucket(item.id)):
                bucket = state.buckets.get(name) if name is not None else None
                if bucket is not None:
                    bucket.used += 1

    def finish(self, queue: QueueInfo, leased: Sequence[Item], now: datetime) -> Limited:
        """End the call: give back what was taken for claims that did not end in ``leased`` (all of
        it when the call failed and gave its items back) and say when to come back."""
        state = self._state()
        self._call.state = _Call()
        if not state.buckets:
            return Limited()
        used = Counter(g for item in leased if (g := group_bucket(item.id)) is not None)
        used[QUEUE_BUCKET] = len(leased)
        next_lease_at = groups_at = None
        for name, bucket in state.buckets.items():
            limit = queue.queue_rate if name == QUEUE_BUCKET else queue.group_rate
            if limit is None:
                continue
            unused = bucket.taken - min(used[name], bucket.taken)
            if unused:
                try:
                    self._store.return_tokens(queue.name, name, count=unused, limit=limit)
                except Exception:  # best-effort: a lost return only delays later leases
                    log.warning(
                        "lease of %s: %d token(s) of bucket %r not given back", queue.name, unused, name
                    )
                else:
                    bucket.next_us -= unused * limit.interval_us
            at = utc_from_timestamp_us(bucket.next_us)
            if at <= now:
                continue
            if name == QUEUE_BUCKET:
                next_lease_at = at
            elif bucket.empty and (groups_at is None or at < groups_at):
                groups_at = at
        return Limited(next_lease_at=next_lease_at, groups_at=groups_at)

    def _ensure(self, queue: QueueInfo, name: str, wanted: int, limit: RateLimit, now: datetime) -> int:
        """Tokens of bucket ``name`` this call holds unused, after taking up to ``wanted`` of them."""
        state = self._state()
        bucket = state.buckets.setdefault(name, _Bucket(next_us=timestamp_us(now)))
        left = bucket.taken - bucket.used
        if left < wanted and not bucket.empty:
            grant = self._store.take_tokens(queue.name, name, wanted=wanted - left, limit=limit, now=now)
            bucket.taken += grant.granted
            bucket.next_us = grant.next_us
            bucket.empty = grant.granted < wanted - left
            left += grant.granted
        return left


#: How long a waiting lease held back only by groups' limits sleeps at most before it looks again:
#: other groups' items may arrive meanwhile.
GROUP_WAIT_MAX = timedelta(milliseconds=250)
