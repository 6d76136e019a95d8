"""Storage layer, the in-memory item store: its rows composed of the role mixins, under one lock."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING

from querator.storage.embedded.store import SortedRowsStore
from querator.storage.memory.idempotency import MemoryIdempotencyRows
from querator.storage.memory.items import MemoryItemRows
from querator.storage.memory.leasing import MemoryLeasingRows
from querator.storage.memory.upkeep import MemoryUpkeepRows

if TYPE_CHECKING:
    from collections.abc import Iterator


class _MemoryRows(MemoryItemRows, MemoryLeasingRows, MemoryUpkeepRows, MemoryIdempotencyRows):
    """``embedded.base.Rows`` over dicts and sorted id lists; the caller holds the store's lock."""


class InMemoryItemStore(SortedRowsStore):
    """``ItemStore`` in this process's memory; thread-safe, lost when the process ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows = _MemoryRows()

    @contextmanager
    def _read(self) -> Iterator[_MemoryRows]:
        with self._lock:
            yield self._rows

    _write = _read
