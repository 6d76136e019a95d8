"""Ports: what the service needs from the outside world, as structural protocols.

The DynamoDB adapters in ``querator.storage.dynamodb`` implement them; the contract suite in
``tests/contract`` proves the behaviour against every store the tests can reach.

The item store (``ItemStore``, engine v2's) is the composition of one protocol per role, each in a
module of its own, and every store keeps its part of a role in a module of the same name
(docs/glossary.md, "Where each role lives"): ``items``, ``leasing`` (rate-limit tokens too),
``lanes``, ``upkeep``, ``idempotency``, ``bulk``. ``catalog`` holds the queue catalog, ``log``
engine v3's claim log (split by the same roles). Every name is importable from here as well.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from querator.ports.bulk import BulkLoadPort
from querator.ports.catalog import QueueCatalog
from querator.ports.idempotency import IdempotencyPort, IdempotencyRecord
from querator.ports.items import Applied, BatchResult, Guard, ItemsPort, Move, Page, PartitionHead
from querator.ports.lanes import GroupLedger, Lane, LanesPort
from querator.ports.leasing import ClaimInterruptedError, LeaseRecord, LeasingPort
from querator.ports.upkeep import Recount, UpkeepPort

if TYPE_CHECKING:
    from datetime import datetime


class Clock(Protocol):
    def now(self) -> datetime: ...

    def sleep(self, seconds: float) -> None: ...


class ItemStore(ItemsPort, LeasingPort, LanesPort, UpkeepPort, IdempotencyPort, BulkLoadPort, Protocol):
    """Items of every queue, by (queue name, partition). Every method raises on store failure.

    Every method that adds, leases, settles or removes items also keeps the partition's counters
    (``PartitionHead``); a counter write that fails after the items' write is logged, not raised
    (the items' write is what the caller asked for), and the drift it leaves is documented.
    """


__all__ = [
    "Applied",
    "BatchResult",
    "BulkLoadPort",
    "ClaimInterruptedError",
    "Clock",
    "GroupLedger",
    "Guard",
    "IdempotencyPort",
    "IdempotencyRecord",
    "ItemStore",
    "ItemsPort",
    "Lane",
    "LanesPort",
    "LeaseRecord",
    "LeasingPort",
    "Move",
    "Page",
    "PartitionHead",
    "QueueCatalog",
    "Recount",
    "UpkeepPort",
]
