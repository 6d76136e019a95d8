"""Storage layer, the in-memory store: the state its rows keep (``_Partition``), and the base of
the rows' role mixins."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from querator.ports import PartitionHead

if TYPE_CHECKING:
    from querator.domain.model import Item
    from querator.ports import IdempotencyRecord, LeaseRecord


@dataclass(slots=True)
class _Partition:
    head: PartitionHead = field(default_factory=PartitionHead)
    has_head: bool = False
    ids: list[str] = field(default_factory=list)
    items: dict[str, Item] = field(default_factory=dict)
    record_keys: list[str] = field(default_factory=list)
    records: dict[str, LeaseRecord] = field(default_factory=dict)

    def empty(self) -> bool:
        return not self.items and not self.records and not self.has_head


class MemoryRowsBase:
    """What the rows' role mixins share: the store's dicts and sorted lists (the caller holds the
    store's lock), and the partitions' head rows."""

    def __init__(self) -> None:
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self._idem: dict[tuple[str, str], tuple[IdempotencyRecord, int]] = {}
        #: (expiry, queue, key) of every record written; stale entries are skipped when popped.
        self._idem_expiry: list[tuple[int, str, str]] = []
        #: Lease rate-limit buckets by (queue, bucket): one per group that ever leased, dropped
        #: with the queue.
        self._buckets: dict[tuple[str, str], int] = {}

    def _get(self, queue: str, partition: int) -> _Partition | None:
        return self._partitions.get((queue, partition))

    def _make(self, queue: str, partition: int) -> _Partition:
        return self._partitions.setdefault((queue, partition), _Partition())

    def head(self, queue: str, partition: int) -> PartitionHead:
        part = self._get(queue, partition)
        return PartitionHead() if part is None else part.head

    def write_head(self, queue: str, partition: int, head: PartitionHead) -> None:
        part = self._make(queue, partition)
        part.head, part.has_head = head, True
