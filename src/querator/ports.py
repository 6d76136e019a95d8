"""Ports: what the service needs from the outside world, as structural protocols.

The DynamoDB adapters in ``querator.storage.dynamodb`` implement them; the contract suite in
``tests/contract`` proves the behaviour against every store the tests can reach.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from datetime import datetime

    from querator.domain.model import Item, ItemState, QueueInfo


class Clock(Protocol):
    def now(self) -> datetime: ...

    def sleep(self, seconds: float) -> None: ...


class Guard(enum.Enum):
    """The state an item must still be in for a conditional write to apply.

    Each guard closes a race between two actors on the same item; the storage adapter turns it into
    a condition expression, so the check and the write are one atomic step.
    """

    #: The item was never leased under this id: two consumers racing for it cannot both win.
    NEVER_LEASED = "never_leased"
    #: The caller's lease is still valid: a consumer whose lease ran out can no longer act.
    LEASE_VALID = "lease_valid"
    #: The lease ran out: the item may be requeued or dead-lettered, once.
    LEASE_EXPIRED = "lease_expired"
    #: Not held by a valid lease (never leased, or the lease ran out): a valid lease is never taken.
    NOT_VALIDLY_LEASED = "not_validly_leased"
    #: Any state; the item may also be gone already (storage delete, destructive clear).
    ANY = "any"


@dataclass(frozen=True, slots=True, kw_only=True)
class Page:
    """One page of a partition scan, oldest first; ``next_start`` continues after it."""

    items: list[ItemState] = field(default_factory=list)
    next_start: str | None = None


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


class ItemStore(Protocol):
    """Items of every queue, by (queue name, partition). Every method raises on store failure."""

    def put_new(self, queue: str, partition: int, items: Sequence[Item]) -> None:
        """Durably write items under ids nobody else holds (fresh ids). All or raise."""
        ...

    def put_absent(self, queue: str, partition: int, items: Sequence[Item]) -> list[str]:
        """Write each item unless its id exists; return the ids written."""
        ...

    def scan(
        self,
        queue: str,
        partition: int,
        *,
        limit: int,
        start_after: str | None = None,
        due_at: datetime | None = None,
        available_only: bool = False,
    ) -> Page:
        """Item states in id (FIFO) order; with ``due_at`` only those visible then, and with
        ``available_only`` only those not held by a valid lease at ``due_at``."""
        ...

    def list_items(
        self, queue: str, partition: int, *, limit: int, pivot: str = "", lower: str = "", upper: str = ""
    ) -> list[Item]:
        """Whole items in id order from ``max(pivot, lower)`` (inclusive) to ``upper`` (exclusive)."""
        ...

    def iter_items(self, queue: str, partition: int) -> Iterator[Item]: ...

    def get(self, queue: str, partition: int, item_id: str) -> Item | None: ...

    def claim(
        self,
        queue: str,
        partition: int,
        ids: Sequence[str],
        *,
        lease_deadline: datetime,
        now: datetime,
    ) -> list[Item]:
        """Lease each item that was never leased and has not expired; return those won, in order."""
        ...

    def renew(
        self,
        queue: str,
        partition: int,
        ids: Sequence[str],
        *,
        lease_deadline: datetime,
        now: datetime,
    ) -> list[str]:
        """Move valid leases to ``lease_deadline``; return the ids that failed."""
        ...

    def delete(
        self, queue: str, partition: int, ids: Sequence[str], *, guard: Guard, now: datetime
    ) -> list[str]:
        """Delete items still in the guarded state; return the ids that failed the guard."""
        ...

    def move(
        self,
        queue: str,
        partition: int,
        item_id: str,
        *,
        guard: Guard,
        now: datetime,
        target_queue: str,
        target_partition: int,
        replacement: Item,
    ) -> bool:
        """Atomically delete an item in the guarded state and write ``replacement`` in its place."""
        ...

    def purge(self, queue: str, partition: int) -> int:
        """Delete every item of a partition (queue delete); return how many."""
        ...

    def source_ids(self, queue: str, partition: int) -> set[str]: ...

    def begin_idempotent(
        self, queue: str, record: IdempotencyRecord, *, stale_before: datetime, expires_at: datetime
    ) -> tuple[bool, IdempotencyRecord | None]:
        """Store ``record`` unless a live record with its key exists.

        Returns ``(stored, previous)``: ``stored`` is False when a live record won, which is then
        ``previous``; when True, ``previous`` is the dead record it replaced, if any.
        """
        ...

    def finish_idempotent(self, queue: str, key: str, *, partition: int, ids: Sequence[str]) -> None:
        """Mark the record done with the receipt that retries of the request get."""
        ...


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
