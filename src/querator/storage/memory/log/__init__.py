"""Storage layer: engine v3's claim log in memory (``store.InMemoryClaimLog``), its rows split by role
(``items``, ``leasing``, ``upkeep``) as ``querator.storage.embedded.log`` is."""

from __future__ import annotations

from querator.storage.memory.log.store import InMemoryClaimLog

__all__ = ["InMemoryClaimLog"]
