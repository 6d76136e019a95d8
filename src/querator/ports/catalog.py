"""Ports: the queue catalog (queue definitions and the reaper's bookmark)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterator
    from datetime import datetime

    from querator.domain.model import QueueInfo


class QueueCatalog(Protocol):
    """The queues and the reaper's bookmark."""

    def create(self, info: QueueInfo) -> None:
        """Raises ``QueueAlreadyExistsError``."""
        ...

    def get(self, name: str) -> QueueInfo:
        """Raises ``QueueNotFoundError``."""
        ...

    def list(self, *, pivot: str, limit: int) -> list[QueueInfo]: ...

    def iterate(self) -> Iterator[QueueInfo]: ...

    def replace(self, info: QueueInfo, *, expected_updated_at: datetime) -> None:
        """Write ``info`` if nobody changed the queue since ``expected_updated_at``."""
        ...

    def mark_deleting(self, name: str) -> QueueInfo: ...

    def remove(self, name: str) -> None: ...

    def load_bookmark(self) -> str | None: ...

    def save_bookmark(self, bookmark: str | None) -> None: ...

    def stream_key(self, candidate: str | None) -> str | None:
        """The key stream tickets are signed with: the stored one, else ``candidate`` once stored by
        a conditional write, so first uses that race agree on one key. ``candidate`` ``None``: only
        read (``None`` if no ticket was ever issued), for the stream's checks, which may not write."""
        ...
