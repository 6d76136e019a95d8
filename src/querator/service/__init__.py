"""Service layer: the queue's use cases over the ``QueueCatalog`` and ``ItemStore`` ports.

The service decides (with ``querator.domain.lifecycle``) and the store applies each decision with one
conditional write, so concurrent callers are safe without locks here. Time comes from the injected
clock once per call and is passed down; nothing below calls ``now()``.

``QueueService`` is the one entry point; it composes one component per kind of work, each owning its
own process state (docs/adr/0061-service-package.md):

- ``queues.QueueDirectory``: queue lookups and the queue cache;
- ``admin.QueueAdmin``: create / update / delete queues, stats, clear;
- ``produce.Producer``: produce, the partition balancer, idempotent produce;
- ``lease.Leaser``: lease, claims, the waiting clients;
- ``settle.Settler``: requeue and dead-letter, returning what it did;
- ``items.ItemCalls``: complete / retry / renew and the storage calls;
- ``redrive.Redriver``: dead letters back to the queues they came from;
- ``reaper.Reaper``: the scheduled pass over every queue.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import TYPE_CHECKING

from querator.domain.ids import IdFactory
from querator.service.admin import QueueAdmin
from querator.service.items import ItemCalls
from querator.service.lease import Leaser
from querator.service.logs import Logs
from querator.service.produce import Producer
from querator.service.queues import QueueDirectory
from querator.service.reaper import Reaper, ReapReport
from querator.service.redrive import Redriver
from querator.service.settle import Settler
from querator.service.tickets import StreamTicket, TicketSigner
from querator.service.tuning import (
    CURSOR_LAG,
    DEFAULT_CLAIM_BUDGET,
    DEFAULT_CLEAR_BUDGET,
    DEFAULT_PURGE_BUDGET,
    DEFAULT_QUEUE_CACHE_TTL,
    DEFAULT_RECOUNT_PERIOD,
    IDEMPOTENCY_STALE_AFTER,
    MAX_REPLY_BYTES,
    SWEEP_DELAY,
)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from querator.domain.model import (
        BatchOutcome,
        ClearScope,
        Item,
        Lease,
        NewItem,
        PartitionStats,
        ProduceReceipt,
        QueueInfo,
        QueueUpdate,
        RedriveOutcome,
        RenewOutcome,
        Reprioritized,
        RetryRequest,
        StorageItem,
    )
    from querator.ports import Clock, ItemStore, QueueCatalog
    from querator.ports.log import ClaimLog


class QueueService:
    """Use cases of the lease queue.

    Parameters
    ----------
    catalog, store
        The storage ports.
    clock
        Source of ``now`` and of waiting (a fake clock in tests).
    ids
        Mints item ids; one per process keeps produce order.
    rng
        Spreads load (first partition tried, partition of a produce, claim after a lost race);
        seeded in tests.
    queue_cache_ttl
        How long produce, lease, complete, retry and renew trust a queue's catalog record before
        reading it again (docs/adr/0008-queue-cache.md); ``timedelta(0)`` reads it on every call.
    claim_budget, clear_budget, purge_budget
        How long a lease may keep claiming once it found items, a clear may keep deleting, and a
        queue delete may purge before leaving the rest to the reaper (on the service's clock).
    recount_period
        How often the reaper recounts a partition to heal drift in the counters ``stats`` reads.
    log
        Engine v3's claim log (``querator.ports.log``; docs/adr/0100): given, new items are written
        there (a fair queue's to its groups' lane logs) and what engine v2 stored is served until it
        is gone; ``None``: engine v2 alone.
    """

    def __init__(
        self,
        *,
        catalog: QueueCatalog,
        store: ItemStore,
        clock: Clock,
        ids: IdFactory | None = None,
        rng: random.Random | None = None,
        queue_cache_ttl: timedelta = DEFAULT_QUEUE_CACHE_TTL,
        claim_budget: timedelta = DEFAULT_CLAIM_BUDGET,
        clear_budget: timedelta = DEFAULT_CLEAR_BUDGET,
        purge_budget: timedelta = DEFAULT_PURGE_BUDGET,
        recount_period: timedelta = DEFAULT_RECOUNT_PERIOD,
        log: ClaimLog | None = None,
    ) -> None:
        ids = ids or IdFactory()
        rng = rng or random.Random()  # noqa: S311 - spreading load, not security
        self.catalog = catalog
        self.store = store
        self._queues = QueueDirectory(catalog, clock, queue_cache_ttl)
        self.log = log
        logs = Logs(log, store, self._queues, clock) if log is not None else None
        settler = Settler(store, self._queues, ids)
        self._admin = QueueAdmin(
            store,
            self._queues,
            settler,
            clock,
            clear_budget=clear_budget,
            purge_budget=purge_budget,
            logs=logs,
        )
        self._producer = Producer(store, self._queues, clock, ids, rng, logs)
        self._leaser = Leaser(store, self._queues, settler, clock, rng, claim_budget, logs)
        self._items = ItemCalls(store, self._queues, settler, clock, ids, logs)
        self._reaper = Reaper(catalog, store, settler, self._admin, clock, recount_period, logs)
        self._redriver = Redriver(store, self._queues, clock, ids, budget=clear_budget, logs=logs)
        self._tickets = TicketSigner(catalog)
        self._clock = clock

    #: The ports this service runs on, for tools that work beside it (benchmarks, tests, migrations):
    #: another service over the same storage is ``QueueService(catalog=s.catalog, store=s.store, ...)``.
    catalog: QueueCatalog
    store: ItemStore
    log: ClaimLog | None

    # -- queues -----------------------------------------------------------------------------------

    def create_queue(self, info: QueueInfo) -> QueueInfo:
        """Create a queue. Raises ``QueueAlreadyExistsError``, ``InvalidRequestError``."""
        return self._admin.create_queue(info)

    def get_queue(self, name: str) -> QueueInfo:
        return self._admin.get_queue(name)

    def list_queues(self, *, pivot: str = "", limit: int = 100) -> list[QueueInfo]:
        return self._admin.list_queues(pivot=pivot, limit=limit)

    def update_queue(self, update: QueueUpdate) -> QueueInfo:
        """Change the fields present in ``update``; the rest stay as they are."""
        return self._admin.update_queue(update)

    def delete_queue(self, name: str) -> None:
        """Delete a queue and all its items (resumed by the reaper if interrupted)."""
        self._admin.delete_queue(name)

    # -- items ------------------------------------------------------------------------------------

    def produce(
        self, queue_name: str, items: Sequence[NewItem], *, idempotency_key: str | None = None
    ) -> ProduceReceipt:
        """Store ``items`` in one partition; return only once every item is durably stored."""
        return self._producer.produce(queue_name, items, idempotency_key=idempotency_key)

    def lease(
        self, queue_name: str, *, batch_size: int, client_id: str, timeout: timedelta = timedelta(0)
    ) -> Lease:
        """Lease up to ``batch_size`` items of one partition, by priority then oldest first, waiting
        up to ``timeout``."""
        return self._leaser.lease(queue_name, batch_size=batch_size, client_id=client_id, timeout=timeout)

    @property
    def payload_limit(self) -> int:
        """The largest payload this service's store keeps: 1 MiB under engine v3 (on DynamoDB with a
        payload bucket), 380,000 bytes otherwise (docs/adr/0102-large-payloads.md)."""
        return self._producer.payload_limit

    def stop_waiting(self) -> None:
        """The process is stopping: waiting leases answer now (with items, or nothing to lease) and
        later ones do not wait. The local server calls it on SIGTERM; a Lambda never needs it."""
        self._leaser.stop_waiting()

    def give_back(self, queue_name: str, partition: int, ids: Sequence[str]) -> int:
        """Put leased items back at once, their attempt not spent, for a lease whose reply could
        not be written; at the tail, under new ids. Returns how many went back (ids no longer
        validly leased are left alone)."""
        return self._leaser.give_back(queue_name, partition, ids)

    def complete(self, queue_name: str, partition: int, ids: Sequence[str]) -> BatchOutcome:
        """Delete leased items; ids that are unknown, stale or not leased are reported as failed."""
        return self._items.complete(queue_name, partition, ids)

    def retry(self, queue_name: str, partition: int, requests: Sequence[RetryRequest]) -> BatchOutcome:
        """Put leased items back: at the tail, at ``retry_at``, or into the dead-letter queue."""
        return self._items.retry(queue_name, partition, requests)

    def renew(
        self, queue_name: str, partition: int, ids: Sequence[str], *, lease_timeout: timedelta | None = None
    ) -> RenewOutcome:
        """Set valid leases to now + ``lease_timeout`` (default: the queue's)."""
        return self._items.renew(queue_name, partition, ids, lease_timeout=lease_timeout)

    def reprioritize(
        self, queue_name: str, partition: int, ids: Sequence[str], priority: int
    ) -> Reprioritized:
        """Give waiting and scheduled items a new priority (a new id each), and leased ones the
        priority they go back with; ids that are unknown or gone are reported as failed."""
        return self._items.reprioritize(queue_name, partition, ids, priority)

    # -- inspection and maintenance ---------------------------------------------------------------

    def stream_ticket(self, queue_name: str) -> StreamTicket:
        """A short-lived ticket that lets a stream subscribe to ``queue_name`` (``service.tickets``);
        raises ``QueueNotFoundError`` for a queue that does not exist."""
        self._queues.live(queue_name)
        return self._tickets.issue(queue_name, self._clock.now())

    def check_stream_ticket(self, ticket: str, queue_name: str) -> None:
        """Raises ``InvalidRequestError`` unless ``ticket`` is a valid, unexpired ticket of ``queue_name``."""
        self._tickets.check(ticket, queue_name, self._clock.now())

    def check_health(self) -> None:
        """Read the catalog once; raises the store's error when it cannot be reached."""
        self._admin.check_health()

    def stats(self, queue_name: str) -> list[PartitionStats]:
        """Counts and ages per partition, from the partitions' counters."""
        return self._admin.stats(queue_name)

    def clear(self, queue_name: str, scope: ClearScope) -> int:
        """Remove items in ``scope``; returns how many (``RetryLaterError`` when out of budget)."""
        return self._admin.clear(queue_name, scope)

    def redrive(
        self, queue_name: str, *, to: str | None = None, limit: int = 1000, feeders_only: bool = False
    ) -> RedriveOutcome:
        """Move up to ``limit`` dead letters of ``queue_name`` back to their source queues (or to
        ``to``); calling until ``remaining`` is 0 moves each exactly once. ``feeders_only``: only
        into, and only items from, the queues whose dead_queue this is (``Redriver.redrive``)."""
        return self._redriver.redrive(queue_name, to=to, limit=limit, feeders_only=feeders_only)

    def list_items(
        self, queue_name: str, partition: int, *, pivot: str = "", limit: int = 1000
    ) -> list[Item]:
        """Items of one partition that are not scheduled, by priority then FIFO, from ``pivot``
        (inclusive)."""
        return self._items.list_items(queue_name, partition, pivot=pivot, limit=limit)

    def list_scheduled(
        self, queue_name: str, partition: int, *, pivot: str = "", limit: int = 1000
    ) -> list[Item]:
        """Scheduled items of one partition, in the order they become visible."""
        return self._items.list_scheduled(queue_name, partition, pivot=pivot, limit=limit)

    def import_items(self, queue_name: str, partition: int, items: Sequence[StorageItem]) -> list[str]:
        """Write items verbatim under new ids, skipping those whose ``source_id`` is already there."""
        return self._items.import_items(queue_name, partition, items)

    def delete_items(self, queue_name: str, partition: int, ids: Sequence[str]) -> None:
        """Delete items in any state; deleting an item that is gone already succeeds."""
        self._items.delete_items(queue_name, partition, ids)

    def reap(self, now: datetime, time_budget: timedelta) -> ReapReport:
        """One reaper run over every queue, within ``time_budget``."""
        return self._reaper.reap(now, time_budget)


__all__ = [
    "CURSOR_LAG",
    "DEFAULT_QUEUE_CACHE_TTL",
    "IDEMPOTENCY_STALE_AFTER",
    "MAX_REPLY_BYTES",
    "SWEEP_DELAY",
    "QueueService",
    "ReapReport",
]
