"""Ports, the idempotency role: the records an idempotent produce leaves, so a retry returns the
first call's ids without writing again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class IdempotencyRecord:
    """What a produce with an idempotency key stored, so a retry can answer without writing again."""

    key: str
    partition: int
    ids: list[str]
    #: False while the first request is still writing (or died while writing).
    done: bool
    started_at: datetime
    #: The queue's ``created_at`` when the record was written; a record of a deleted and re-created
    #: queue of the same name does not count.
    queue_created_at: datetime
    #: A token unique to the request that began the record: a store whose client retried its own
    #: conditional write after a lost reply (botocore) recognises the record as its own by it, and
    #: only by it (``ids`` are empty at the start under engine v3, the same for every request).
    owner: str = ""


class IdempotencyPort(Protocol):
    """Idempotency records of produce, by (queue, key)."""

    def begin_idempotent(
        self, queue: str, record: IdempotencyRecord, *, stale_before: datetime, expires_at: datetime
    ) -> tuple[bool, IdempotencyRecord | None]:
        """Store ``record`` unless a live record with its key exists.

        Returns ``(stored, previous)``: ``stored`` is False when a live record won, which is then
        ``previous``; when True, ``previous`` is the dead record it replaced, if any.
        """
        ...

    def finish_idempotent(
        self, queue: str, key: str, *, partition: int, ids: Sequence[str], done: bool = True
    ) -> None:
        """Mark the record done with the receipt that retries of the request get; ``done=False``:
        only record ``ids`` and leave it in progress (engine v3 notes the positions it took before
        it writes them, so a retry after a crash writes those again)."""
        ...
