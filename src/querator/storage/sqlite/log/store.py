"""Storage layer, engine v3's claim log in SQLite: its rows composed of the role mixins, and its
transactions."""

from __future__ import annotations

from querator.storage.embedded.log.store import ClaimLogEngine
from querator.storage.sqlite.database import _Transaction
from querator.storage.sqlite.log.items import SQLiteLogItemRows, SQLiteLogItems
from querator.storage.sqlite.log.leasing import SQLiteLogLeasingRows
from querator.storage.sqlite.log.upkeep import SQLiteLogUpkeepRows


class _SQLiteLogRows(SQLiteLogItemRows, SQLiteLogLeasingRows, SQLiteLogUpkeepRows):
    """``embedded.log.base.LogRows`` on one connection inside a transaction: one statement per method."""

    __slots__ = ()


class _LogTransaction(_Transaction):
    """A transaction over ``_SQLiteLogRows``."""

    __slots__ = ()

    def __enter__(self) -> _SQLiteLogRows:
        return _SQLiteLogRows(self._begin())


class SQLiteClaimLog(SQLiteLogItems, ClaimLogEngine):
    """``ClaimLog`` in a ``SQLiteDatabase`` (the ``log_*`` tables, beside v2's in the same file);
    safe across threads and processes on one machine: every call is one transaction."""

    def _read(self) -> _LogTransaction:
        return _LogTransaction(self._db, write=False)

    def _write(self) -> _LogTransaction:
        return _LogTransaction(self._db, write=True)
