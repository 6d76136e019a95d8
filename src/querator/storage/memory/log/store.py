"""Storage layer, engine v3's claim log in memory: its rows composed of the role mixins, under one
lock, with an undo list."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING

from querator.storage.embedded.log.store import ClaimLogEngine
from querator.storage.memory.log.items import MemoryLogItemRows
from querator.storage.memory.log.leasing import MemoryLogLeasingRows
from querator.storage.memory.log.upkeep import MemoryLogUpkeepRows

if TYPE_CHECKING:
    from collections.abc import Iterator


class _MemoryLogRows(MemoryLogItemRows, MemoryLogLeasingRows, MemoryLogUpkeepRows):
    """``embedded.log.base.LogRows`` over sorted lists and dicts; the caller holds the store's lock.

    Every change pushes its inverse on ``undo``: a call that raises midway is rolled back whole, as
    SQLite's transaction is (the engine writes as it goes).
    """


class InMemoryClaimLog(ClaimLogEngine):
    """``ClaimLog`` in this process's memory; thread-safe, lost when the process ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows = _MemoryLogRows()

    @contextmanager
    def _read(self) -> Iterator[_MemoryLogRows]:
        with self._lock:
            self._rows.undo = []
            try:
                yield self._rows
            except BaseException:
                for undo in reversed(self._rows.undo):
                    undo()
                raise
            finally:
                self._rows.undo = []

    _write = _read
