"""Storage layer: engine v3's claim log in SQLite (``store.SQLiteClaimLog``, the ``log_*`` tables), its
rows split by role (``items``, ``leasing``, ``upkeep``) as ``querator.storage.embedded.log`` is."""

from __future__ import annotations

from querator.storage.sqlite.log.store import SQLiteClaimLog

__all__ = ["SQLiteClaimLog"]
