"""Storage layer, the embedded stores' idempotency role: records of idempotent produce, and the
expiry DynamoDB's TTL gives the reference."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from querator.storage.embedded.base import RowsStoreBase

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from querator.ports import IdempotencyRecord


#: Expired idempotency records deleted with each new one.
_EXPIRED_PER_WRITE = 4


class RowsIdempotency(RowsStoreBase):
    """``IdempotencyPort`` over ``Rows``."""

    def begin_idempotent(
        self, queue: str, record: IdempotencyRecord, *, stale_before: datetime, expires_at: datetime
    ) -> tuple[bool, IdempotencyRecord | None]:
        with self._write() as rows:
            # What DynamoDB's TTL does: a few expired records go with each new one, so they never pile
            # up faster than they are written.
            rows.drop_expired_idempotency(int(record.started_at.timestamp()), _EXPIRED_PER_WRITE)
            found = rows.idempotency(queue, record.key)
            previous = None if found is None else found[0]
            # A retry finds the first request's record unless it belongs to an earlier queue of the
            # same name, expired, or its writer died while pending (the reference's IDEM_BEGIN).
            if found is not None and previous is not None:
                live = (
                    previous.queue_created_at == record.queue_created_at
                    and found[1] >= int(record.started_at.timestamp())
                    and (previous.done or previous.started_at >= stale_before)
                )
                if live:
                    return False, previous
            rows.put_idempotency(queue, record, int(expires_at.timestamp()))
        return True, previous

    def finish_idempotent(
        self, queue: str, key: str, *, partition: int, ids: Sequence[str], done: bool = True
    ) -> None:
        with self._write() as rows:
            found = rows.idempotency(queue, key)
            if found is not None:
                finished = replace(found[0], done=done, partition=partition, ids=list(ids))
                rows.put_idempotency(queue, finished, found[1])
