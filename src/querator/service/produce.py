"""Produce: new items into one partition, balanced, and exactly once with an idempotency key."""

from __future__ import annotations

import hashlib
import threading
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING

from querator.domain import lifecycle
from querator.domain.errors import InvalidRequestError, RequestInProgressError
from querator.domain.model import (
    MAX_BATCH,
    ROW_PAYLOAD_BYTES,
    Item,
    ProduceReceipt,
    check_payload_limit,
    resolve_time,
)
from querator.ports import IdempotencyRecord
from querator.service.logs import is_log_id
from querator.service.tuning import IDEMPOTENCY_STALE_AFTER, IDEMPOTENCY_TTL

if TYPE_CHECKING:
    import random
    from collections.abc import Sequence
    from datetime import datetime

    from querator.domain.ids import IdFactory
    from querator.domain.model import NewItem, QueueInfo
    from querator.ports import Clock, ItemStore
    from querator.service.logs import Logs
    from querator.service.queues import QueueDirectory


class Producer:
    """Writes produced items; owns the partition balancer (what this process sent where)."""

    def __init__(
        self,
        store: ItemStore,
        queues: QueueDirectory,
        clock: Clock,
        ids: IdFactory,
        rng: random.Random,
        logs: Logs | None = None,
    ) -> None:
        self._store = store
        self._logs = logs
        self._queues = queues
        self._clock = clock
        self._ids = ids
        self._rng = rng
        self._lock = threading.Lock()
        #: Queue name -> items this process sent to each partition.
        self._produced: dict[str, list[int]] = {}

    @property
    def payload_limit(self) -> int:
        """The largest payload the store takes: engine v3's log's, a row's under engine v2."""
        return self._logs.log.payload_limit if self._logs is not None else ROW_PAYLOAD_BYTES

    def produce(
        self, queue_name: str, items: Sequence[NewItem], *, idempotency_key: str | None = None
    ) -> ProduceReceipt:
        """Store ``items`` in one partition; return only once every item is durably stored.

        With ``idempotency_key``, a retry of the same request stores nothing again and returns the
        first receipt (see docs/adr/0004-idempotent-produce.md for the one double fault it does not cover).
        """
        if not 1 <= len(items) <= MAX_BATCH:
            raise InvalidRequestError(f"produce takes 1 to {MAX_BATCH} items", field="items")
        check_payload_limit([item.payload for item in items], self.payload_limit)
        queue = self._queues.queue(queue_name)
        now = self._clock.now()
        partition = self._choose_partition(queue, len(items))
        stored = [self._new_item(queue, item, now) for item in items]
        # With engine v3's logs every queue's items go there: a FIFO queue's to its band's log, a
        # fair queue's to its group's lane (``service.logs.lane_key``), registered in the
        # partition's lane registry before the write, as engine v2 registers its lanes.
        logs = self._logs
        if idempotency_key is None:
            if logs is not None:
                stored = logs.write(queue, partition, stored, now)
            else:
                self._store.put_new(queue.name, partition, stored, now=now)
            return ProduceReceipt(queue_name=queue.name, partition=partition, ids=[i.id for i in stored])
        return self._produce_once(queue, partition, stored, idempotency_key, now)

    def _produce_once(
        self, queue: QueueInfo, partition: int, stored: list[Item], key: str, now: datetime
    ) -> ProduceReceipt:
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        record = IdempotencyRecord(
            key=digest,
            partition=partition,
            ids=[] if self._logs is not None else [i.id for i in stored],
            done=False,
            started_at=now,
            queue_created_at=queue.created_at,
            owner=uuid.uuid4().hex,
        )
        won, previous = self._store.begin_idempotent(
            queue.name, record, stale_before=now - IDEMPOTENCY_STALE_AFTER, expires_at=now + IDEMPOTENCY_TTL
        )
        if not won:
            assert previous is not None  # noqa: S101 - the store returns the record that won
            if not previous.done:
                raise RequestInProgressError("a produce with this idempotency key is still in progress")
            return ProduceReceipt(
                queue_name=queue.name, partition=previous.partition, ids=previous.ids, replayed=True
            )
        resumed = (
            previous is not None
            and not previous.done
            and previous.queue_created_at == queue.created_at
            and len(previous.ids) == len(stored)
        )
        logs = self._logs
        if resumed and previous is not None:
            # The first writer died mid-way: write its ids where missing, so nothing lands twice.
            partition = previous.partition
            if logs is not None and any(is_log_id(i) or not i for i in previous.ids):
                stored = logs.write_taken(queue, partition, previous.ids, stored, now)
            else:
                stored = [replace(item, id=old) for item, old in zip(stored, previous.ids, strict=True)]
                self._store.put_absent(queue.name, partition, stored, now=now)
        elif logs is not None:
            # The positions are taken and noted before they are written, so a retry after a crash
            # writes the same positions: nothing lands twice (scheduled items, which have none, may).
            taken = logs.take(queue, partition, stored, now)
            self._store.finish_idempotent(queue.name, digest, partition=partition, ids=taken, done=False)
            stored = logs.write_taken(queue, partition, taken, stored, now)
        else:
            self._store.put_new(queue.name, partition, stored, now=now)
        ids = [item.id for item in stored]
        self._store.finish_idempotent(queue.name, digest, partition=partition, ids=ids)
        return ProduceReceipt(queue_name=queue.name, partition=partition, ids=ids)

    def _new_item(self, queue: QueueInfo, item: NewItem, now: datetime) -> Item:
        enqueue_at = resolve_time(item.enqueue_at, item.enqueue_in, now, "enqueue_in")
        scheduled = enqueue_at is not None and enqueue_at > now
        visible = enqueue_at if scheduled and enqueue_at is not None else now
        return Item(
            id=self._ids.new_id(visible, item.priority, queue.lane_for(item.group)),
            payload=item.payload,
            reference=item.reference,
            encoding=item.encoding,
            kind=item.kind,
            group=item.group,
            expire_deadline=lifecycle.expire_deadline(visible, queue.expire_timeout),
            created_at=now,
            enqueue_at=visible if scheduled else None,
        )

    def _choose_partition(self, queue: QueueInfo, count: int) -> int:
        """The partition this process has sent the fewest items to (docs/adr/0003-partitions.md)."""
        if queue.partitions == 1:
            return 0
        with self._lock:
            sent = self._produced.setdefault(queue.name, [])
            # Partitions added by an update start at zero and catch up before the others get more.
            sent.extend(0 for _ in range(queue.partitions - len(sent)))
            least = min(sent[: queue.partitions])
            choices = [p for p in range(queue.partitions) if sent[p] == least]
            partition = self._rng.choice(choices)
            sent[partition] += count
            return partition
