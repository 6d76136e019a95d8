"""Helpers of the Spark suite: fresh tables on the session's moto server, and reading a queue back."""

from __future__ import annotations

import tempfile
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from querator.clock import SystemClock
from querator.config import Settings
from querator.domain.model import QueueInfo
from querator.spark.export import iter_partition
from querator.spark.producer import DirectTarget
from querator.testing import build_service, dynamodb_client

if TYPE_CHECKING:
    from querator.domain.model import Item
    from querator.service import QueueService

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc


@dataclass(frozen=True)
class Store:
    """Fresh tables on the session's moto server: a driver-side service and the executors' target."""

    service: QueueService
    target: DirectTarget
    endpoint: str
    #: The produce jobs' staging directory (plans and job records), one per store.
    staging: str


def fresh_store(endpoint: str) -> Store:
    prefix = f"s{uuid.uuid4().hex[:8]}"
    service = build_service(dynamodb_client(endpoint), clock=SystemClock(), prefix=prefix)
    # build_service makes the payload bucket <prefix>-payloads beside the tables, as a stack has one.
    settings = Settings(
        items_table=f"{prefix}-items",
        catalog_table=f"{prefix}-queues",
        region="us-east-1",
        payload_bucket=f"{prefix}-payloads",
    )
    return Store(
        service=service,
        target=DirectTarget(settings=settings, endpoint_url=endpoint),
        endpoint=endpoint,
        staging=tempfile.mkdtemp(prefix=f"querator-staging-{prefix}-"),
    )


def create_queue(service: QueueService, name: str, *, partitions: int = 4, dead_queue: str = "") -> str:
    now = datetime.now(UTC)
    service.create_queue(
        QueueInfo(
            name=name,
            lease_timeout=timedelta(minutes=1),
            expire_timeout=timedelta(days=1),
            partitions=partitions,
            dead_queue=dead_queue,
            created_at=now,
            updated_at=now,
        )
    )
    return name


def stored_by_partition(service: QueueService, queue: str) -> dict[int, list[Item]]:
    partitions = service.get_queue(queue).partitions
    return {p: [item for item, _ in iter_partition(service, queue, p)] for p in range(partitions)}


def count_items(store: Store, queue: str) -> int:
    """Items in every partition of ``queue`` (waiting, leased and scheduled), as its partitions'
    counts say (far cheaper on moto than reading them): engine v2's counters and v3's log heads."""
    return sum(p.total + p.scheduled for p in store.service.stats(queue))


def stored(service: QueueService, queue: str) -> list[Item]:
    return [item for items in stored_by_partition(service, queue).values() for item in items]
