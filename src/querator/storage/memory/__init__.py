"""Storage layer: the in-memory store and catalog, the reference implementation of the ports.

Shipped in the package (like procrastinate's in-memory connector) for service unit tests, for
``querator serve --store memory`` and for ``querator.embedded``. One lock per store makes every
port call, and so every guarded write, atomic. Rows of a partition are a dict by id plus a sorted
list of ids, so a range read is a ``bisect`` and a slice: O(log n + k). Inserting or removing an id
shifts the list (a ``memmove``), which stays microseconds at 100,000 items a partition.
Everything is lost when the process ends.

The store's own part of each role is in a module named after it (``items``, ``leasing``,
``lanes``, ``upkeep``, ``idempotency``, ``bulk``): the rows that role reads and writes, composed in
``store._MemoryRows`` under the semantics of ``querator.storage.embedded``; ``log`` is engine v3's
claim log, split the same way, and ``catalog`` the queue catalog.
"""

from __future__ import annotations

from querator.storage.memory.catalog import InMemoryQueueCatalog
from querator.storage.memory.log import InMemoryClaimLog
from querator.storage.memory.store import InMemoryItemStore

__all__ = ["InMemoryClaimLog", "InMemoryItemStore", "InMemoryQueueCatalog"]
