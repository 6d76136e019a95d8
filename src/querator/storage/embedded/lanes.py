"""Storage layer, the embedded stores' lanes role: bands and group lanes, named in the head row
(``PartitionHead.band_registered``), rings and group ledgers (kept in the head row too)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from querator.domain.priority import band_of, band_start, held_end, is_group_lane, lane_of, ledger_group
from querator.ports import GroupLedger, Lane, PartitionHead
from querator.storage.embedded.base import RowsStoreBase

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from datetime import datetime

    from querator.domain.model import Item


def _lanes_of(ids: Iterable[str]) -> set[str]:
    """The bands (other than priority 5's) and group lanes that ``ids`` need named."""
    lanes: set[str] = set()
    for item_id in ids:
        lane = lane_of(item_id)
        lanes |= {lane, band_of(lane)}
    return lanes - {""}


def _with_bands(head: PartitionHead, ids: Iterable[str], now: datetime) -> PartitionHead:
    """``head`` naming the bands and group lanes of ``ids`` (priority 5's band is always known),
    registered at ``now``."""
    lanes = _lanes_of(ids)
    if not lanes:
        return head
    registered = {**head.band_registered, **dict.fromkeys(lanes, now)}
    has_lanes = head.has_lanes or any(is_group_lane(lane) for lane in lanes)
    return replace(head, band_registered=registered, has_lanes=has_lanes)


class RowsLanes(RowsStoreBase):
    """``LanesPort`` over ``Rows``."""

    def lanes(self, queue: str, partition: int, band: str, *, after: str, limit: int) -> list[Lane]:
        with self._read() as rows:
            head = rows.head(queue, partition)
        found = sorted(
            lane
            for lane in head.band_registered
            if is_group_lane(lane) and band_of(lane) == band and lane > after
        )[:limit]
        return [
            Lane(lane=lane, cursor=head.cursor_in(lane), registered=head.band_registered[lane])
            for lane in found
        ]

    def with_lanes(self, queue: str, partition: int, head: PartitionHead) -> PartitionHead:
        return head  # the head row holds them already

    def group_ledgers(self, queue: str, partition: int, groups: Sequence[str]) -> dict[str, GroupLedger]:
        with self._read() as rows:
            ledgers = rows.head(queue, partition).group_ledgers
        return {group: ledgers.get(group, GroupLedger()) for group in groups}

    def claim_in_group(
        self,
        queue: str,
        partition: int,
        item_id: str,
        *,
        version: int,
        forget: Sequence[str],
        lease_deadline: datetime,
        now: datetime,
    ) -> Item | None:
        group = ledger_group(item_id)
        with self._write() as rows:
            head = rows.head(queue, partition)
            ledger = head.group_ledgers.get(group, GroupLedger())
            if ledger.version != version:
                return None
            item = rows.item(queue, partition, item_id)
            if item is None or item.lease_deadline is not None or item.expire_deadline <= now:
                return None
            leased = replace(item, lease_deadline=lease_deadline, attempts=item.attempts + 1)
            rows.put(queue, partition, leased)
            leases = {i: d for i, d in ledger.leases.items() if i not in set(forget)}
            leases[item_id] = lease_deadline
            ledgers = {**head.group_ledgers, group: GroupLedger(version=version + 1, leases=leases)}
            rows.write_head(queue, partition, replace(head, group_ledgers=ledgers))
        return leased

    def forget_leases(self, queue: str, partition: int, ids: Sequence[str]) -> None:
        by_group: dict[str, set[str]] = {}
        for item_id in ids:
            if is_group_lane(lane_of(item_id)):
                by_group.setdefault(ledger_group(item_id), set()).add(item_id)
        if not by_group:
            return
        with self._write() as rows:
            head = rows.head(queue, partition)
            ledgers = dict(head.group_ledgers)
            for group, gone in by_group.items():
                if group in ledgers:
                    old = ledgers[group]
                    leases = {i: d for i, d in old.leases.items() if i not in gone}
                    ledgers[group] = GroupLedger(version=old.version, leases=leases)
            rows.write_head(queue, partition, replace(head, group_ledgers=ledgers))

    def register_bands(self, queue: str, partition: int, ids: Iterable[str], *, now: datetime) -> None:
        ids = list(ids)
        if not _lanes_of(ids):
            return
        with self._write() as rows:
            rows.write_head(queue, partition, _with_bands(rows.head(queue, partition), ids, now))

    def drop_band(self, queue: str, partition: int, band: str, *, registered_before: datetime) -> bool:
        with self._write() as rows:
            head = rows.head(queue, partition)
            registered = head.band_registered.get(band)
            if registered is None or registered >= registered_before:
                return False
            # One transaction: the band is empty now, and no write can land in it unnamed.
            if rows.states(queue, partition, band_start(band), held_end(band), 1):
                return False
            remaining = {b: t for b, t in head.band_registered.items() if b != band}
            rows.write_head(queue, partition, replace(head, band_registered=remaining))
        return True
