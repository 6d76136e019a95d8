"""Storage layer, the in-memory store's catalog: queues and the reaper's bookmark."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import TYPE_CHECKING

from querator.domain.errors import ConflictError, QueueAlreadyExistsError, QueueNotFoundError

if TYPE_CHECKING:
    from collections.abc import Iterator
    from datetime import datetime

    from querator.domain.model import QueueInfo


class InMemoryQueueCatalog:
    """``QueueCatalog`` in this process's memory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[str, QueueInfo] = {}
        self._bookmark: str | None = None
        self._stream_key: str | None = None

    def create(self, info: QueueInfo) -> None:
        with self._lock:
            if info.name in self._queues:
                raise QueueAlreadyExistsError(f"queue '{info.name}' already exists")
            self._queues[info.name] = info

    def get(self, name: str) -> QueueInfo:
        with self._lock:
            info = self._queues.get(name)
        if info is None:
            raise QueueNotFoundError(f"queue '{name}' does not exist", queue=name)
        return info

    def list(self, *, pivot: str, limit: int) -> list[QueueInfo]:
        with self._lock:
            names = sorted(n for n in self._queues if n >= pivot)[:limit]
            return [self._queues[n] for n in names]

    def iterate(self) -> Iterator[QueueInfo]:
        with self._lock:
            queues = [self._queues[n] for n in sorted(self._queues)]
        yield from queues

    def replace(self, info: QueueInfo, *, expected_updated_at: datetime) -> None:
        with self._lock:
            current = self._queues.get(info.name)
            # Optimistic concurrency, as in the reference: the second of two updates must not undo
            # the first.
            if current is None or current.updated_at != expected_updated_at:
                raise ConflictError(f"queue '{info.name}' changed or was deleted meanwhile")
            self._queues[info.name] = info

    def mark_deleting(self, name: str) -> QueueInfo:
        with self._lock:
            current = self._queues.get(name)
            if current is None:
                raise QueueNotFoundError(f"queue '{name}' does not exist", queue=name)
            info = self._queues[name] = replace(current, deleting=True)
        return info

    def remove(self, name: str) -> None:
        with self._lock:
            self._queues.pop(name, None)

    def load_bookmark(self) -> str | None:
        return self._bookmark

    def save_bookmark(self, bookmark: str | None) -> None:
        self._bookmark = bookmark

    def stream_key(self, candidate: str | None) -> str | None:
        with self._lock:
            if self._stream_key is None:
                self._stream_key = candidate
            return self._stream_key
