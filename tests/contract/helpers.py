"""Small builders for the contract suite."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from querator.domain.model import NewItem, QueueInfo
from querator.service import QueueService

LEASE = timedelta(seconds=30)
EXPIRE = timedelta(hours=1)


def make_queue(service: QueueService, name: str = "jobs", **fields: Any) -> QueueInfo:
    placeholder = datetime(2000, 1, 1, tzinfo=UTC)  # the service stamps its own times
    fields.setdefault("lease_timeout", LEASE)
    fields.setdefault("expire_timeout", EXPIRE)
    return service.create_queue(
        QueueInfo(name=name, created_at=placeholder, updated_at=placeholder, **fields)
    )


def items(*payloads: str, **fields: Any) -> list[NewItem]:
    return [NewItem(payload=p.encode(), **fields) for p in payloads]


def payloads(found: Any) -> list[bytes]:
    return [item.payload for item in found]


def beside(service: QueueService, clock: Any, **options: Any) -> QueueService:
    """Another service over the same storage, with its own clock and options (budgets, rng), as a
    second process would be: with the same engine (v3's claim log when ``service`` has one)."""
    options.setdefault("store", service.store)
    options.setdefault("log", service.log)
    return QueueService(catalog=service.catalog, clock=clock, **options)
