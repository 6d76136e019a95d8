"""The queue directory: the hot path's cached copy of the catalog, and queue lookups."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from querator.domain.errors import InvalidRequestError, QueueDeletingError
from querator.domain.model import validate_queue_name

if TYPE_CHECKING:
    from datetime import datetime, timedelta

    from querator.domain.model import QueueInfo
    from querator.ports import Clock, QueueCatalog


class QueueDirectory:
    """Finds queues for the use cases; owns the queue cache and its lock.

    Every produce, lease, complete, retry and renew needs the queue's settings; reading the catalog
    each time was a third of the requests at batch 1 and capped one queue at what one catalog item
    can be read per second. An unknown queue is never cached, so a queue created elsewhere is
    visible at once; an update elsewhere within ``ttl`` (docs/adr/0008-queue-cache.md).
    """

    def __init__(self, catalog: QueueCatalog, clock: Clock, ttl: timedelta) -> None:
        self.catalog = catalog
        self.ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        #: Queue name -> (trusted until, catalog record).
        self._queues: dict[str, tuple[datetime, QueueInfo]] = {}

    def queue(self, name: str) -> QueueInfo:
        """The queue's record for the hot path: this process's copy while it is fresh."""
        info = self.cached(name)
        if info.deleting:
            raise QueueDeletingError(f"queue '{name}' is being deleted", queue=name)
        return info

    def cached(self, name: str) -> QueueInfo:
        """The record, from the cache while fresh, even when the queue is being deleted."""
        now = self._clock.now()
        with self._lock:
            cached = self._queues.get(name)
        if cached is not None and cached[0] > now:
            return cached[1]
        info = self.catalog.get(validate_queue_name(name))
        with self._lock:
            self._queues[name] = (now + self.ttl, info)
        return info

    def live(self, name: str) -> QueueInfo:
        """The catalog's current record (not the cache): admin calls see their own writes."""
        info = self.catalog.get(validate_queue_name(name))
        if info.deleting:
            raise QueueDeletingError(f"queue '{name}' is being deleted", queue=name)
        return info

    def forget(self, name: str) -> None:
        with self._lock:
            self._queues.pop(name, None)


def check_partition(queue: QueueInfo, partition: int) -> None:
    if not 0 <= partition < queue.partitions:
        raise InvalidRequestError(
            f"partition {partition} does not exist in queue '{queue.name}'", field="partition"
        )
