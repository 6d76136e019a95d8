"""Storage layer, the embedded stores' shared core: the rows a store gives (``Rows``), the guards
on them, and the base of the role mixins (``RowsStoreBase``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from querator.ports import Guard, IdempotencyRecord, LeaseRecord, PartitionHead

if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from datetime import datetime

    from querator.domain.model import Item, ItemState
    from querator.ports import ItemStore


class Rows(Protocol):
    """One transaction's view of a store's rows; ranges are ``[start, end)`` in id order."""

    def head(self, queue: str, partition: int) -> PartitionHead: ...

    def write_head(self, queue: str, partition: int, head: PartitionHead) -> None: ...

    def item(self, queue: str, partition: int, item_id: str) -> Item | None: ...

    def put(self, queue: str, partition: int, item: Item) -> None: ...

    def remove(self, queue: str, partition: int, item_id: str) -> None: ...

    def items(self, queue: str, partition: int, start: str, end: str, limit: int) -> list[Item]: ...

    def states(self, queue: str, partition: int, start: str, end: str, limit: int) -> list[ItemState]: ...

    def records_due(self, queue: str, partition: int, below: str, limit: int) -> list[LeaseRecord]:
        """Lease records with keys below ``below``, in key (deadline) order."""
        ...

    def put_record(self, queue: str, partition: int, record: LeaseRecord) -> None: ...

    def drop_record(self, queue: str, partition: int, key: str) -> None: ...

    def purge(self, queue: str, partition: int, limit: int) -> int:
        """Delete up to ``limit`` rows of the partition (items, lease records, head); how many."""
        ...

    def idempotency(self, queue: str, key: str) -> tuple[IdempotencyRecord, int] | None:
        """The record and its expiry (epoch seconds)."""
        ...

    def put_idempotency(self, queue: str, record: IdempotencyRecord, expires_s: int) -> None: ...

    def drop_expired_idempotency(self, now_s: int, limit: int) -> None:
        """Delete up to ``limit`` idempotency records that expired before ``now_s``, oldest first."""
        ...

    def bucket(self, queue: str, key: str) -> int | None:
        """A lease rate-limit bucket's ``tat`` (``None``: never taken from)."""
        ...

    def put_bucket(self, queue: str, key: str, tat_us: int) -> None: ...


def _guard_holds(item: Item | None, guard: Guard, now: datetime) -> bool:
    """``guard`` (``querator.ports.Guard``) on the item as it is now; the same races as the
    reference's condition expressions (``storage.dynamodb.expressions``)."""
    if guard is Guard.ANY:
        return True
    if item is None:
        return False
    if guard is Guard.NEVER_LEASED:
        return item.lease_deadline is None
    if guard is Guard.LEASE_VALID:
        return item.lease_deadline is not None and item.lease_deadline > now
    if guard is Guard.LEASE_EXPIRED:
        return item.lease_deadline is not None and item.lease_deadline <= now
    return item.lease_deadline is None or item.lease_deadline <= now  # NOT_VALIDLY_LEASED


if TYPE_CHECKING:
    # The role mixins call one another's methods (a produce registers its bands): typed as the port.
    _Port = ItemStore
else:
    _Port = object


class RowsStoreBase(_Port):
    """What the role mixins share: the transactions a store provides (``_read``, ``_write``)."""

    def _read(self) -> AbstractContextManager[Rows]:
        raise NotImplementedError

    def _write(self) -> AbstractContextManager[Rows]:
        raise NotImplementedError
