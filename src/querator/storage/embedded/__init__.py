"""Storage layer: the embedded stores' shared semantics (memory, SQLite), one module per role.

The ``ItemStore`` port over sorted rows (``store.SortedRowsStore``; docs/adr/0060-embedded-stores.md)
is composed of a mixin per role, each in a module named after it, over ``base.RowsStoreBase``:
``items``, ``leasing``, ``lanes``, ``upkeep``, ``idempotency``, ``bulk``. Engine v3's claim log
(``log``) is split the same way. A store gives the rows (``base.Rows``, ``log.base.LogRows``) and
keeps its own part of each role in a module of the same name (``querator.storage.memory``,
``querator.storage.sqlite``).
"""
