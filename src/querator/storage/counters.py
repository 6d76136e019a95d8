"""Storage layer: what one call changes in a partition's counters (``ports.PartitionHead``).

Every store adds the same deltas by the same rules; only how it writes them differs (one
``UpdateItem`` for DynamoDB, the head row in the same transaction for the embedded stores).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from querator.domain.model import timestamp_us
from querator.domain.priority import unbanded

if TYPE_CHECKING:
    from datetime import datetime

    from querator.domain.model import Item, ItemState
    from querator.ports import PartitionHead


@dataclass(slots=True)
class CounterDeltas:
    """Deltas of a head row's counters; sums are of ``created_at`` in whole seconds."""

    items: int = 0
    leased: int = 0
    scheduled: int = 0
    created: int = 0
    leased_created: int = 0
    scheduled_created: int = 0
    #: Cumulative, never recounted: items produced (or imported) and items completed, for rates.
    produced: int = 0
    completed: int = 0

    def add(self, item_created: datetime, *, sign: int, leased: bool, scheduled: bool) -> None:
        seconds = timestamp_us(item_created) // 1_000_000
        self.items += sign
        self.created += sign * seconds
        if leased:
            self.leased += sign
            self.leased_created += sign * seconds
        if scheduled:
            self.scheduled += sign
            self.scheduled_created += sign * seconds

    def lease(self, item_created: datetime, *, was_scheduled: bool) -> None:
        """Count a claimed item as leased; one still counted as scheduled (it came due since the
        last schedule pass) leaves that count in the same step, so it is never in both."""
        seconds = timestamp_us(item_created) // 1_000_000
        self.leased += 1
        self.leased_created += seconds
        if was_scheduled:
            self.scheduled -= 1
            self.scheduled_created -= seconds

    def changed(self) -> bool:
        return any(
            (
                self.items,
                self.leased,
                self.scheduled,
                self.created,
                self.leased_created,
                self.scheduled_created,
            )
        )

    def applied(self, head: PartitionHead, **changes: Any) -> PartitionHead:
        """``head`` with the deltas added, and ``changes`` (fields of the head) made in the same
        copy; any change of a counter moves the version, so a recount under way learns of it."""
        return replace(
            head,
            **changes,
            version=head.version + 1 if self.changed() else head.version,
            items=head.items + self.items,
            leased=head.leased + self.leased,
            scheduled=head.scheduled + self.scheduled,
            created_sum=head.created_sum + self.created,
            leased_created_sum=head.leased_created_sum + self.leased_created,
            scheduled_created_sum=head.scheduled_created_sum + self.scheduled_created,
            produced=head.produced + self.produced,
            completed=head.completed + self.completed,
        )


def scheduled_when_written(item: Item, now: datetime) -> bool:
    """Counted as scheduled when written: produced or retried for a time still ahead, and not
    leased (an imported lease counts as leased only: an item is counted in one state)."""
    return item.enqueue_at is not None and item.enqueue_at > now and item.lease_deadline is None


def still_scheduled(state: ItemState | Item, schedule_mark: str) -> bool:
    """Still counted as scheduled: never leased under this id (a claim takes an item off the
    scheduled count, ``CounterDeltas.lease``), and the schedule pass has not reached its id yet
    (the mark is a time, ``visible_bound``, so it is compared with the id's digits, whatever its
    band).

    By the mark the store read, never by the caller's clock: a pass with a later clock may have
    taken the item off the count already.
    """
    return state.lease_deadline is None and scheduled_until_claimed(state, schedule_mark)


def scheduled_until_claimed(item: ItemState | Item, schedule_mark: str) -> bool:
    """A claimed item was still counted as scheduled just before its claim (which needs an item
    never leased): it was scheduled and the schedule pass had not reached its id."""
    return item.enqueue_at is not None and unbanded(item.id) >= schedule_mark
