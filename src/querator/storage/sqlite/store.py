"""Storage layer, the SQLite item store: its rows composed of the role mixins, and its transactions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from querator.storage.embedded.store import SortedRowsStore
from querator.storage.sqlite.database import SQLiteDatabase, _Transaction
from querator.storage.sqlite.idempotency import SQLiteIdempotencyRows
from querator.storage.sqlite.items import SQLiteItemRows, SQLiteItems
from querator.storage.sqlite.leasing import SQLiteLeasing, SQLiteLeasingRows
from querator.storage.sqlite.upkeep import SQLiteUpkeepRows

if TYPE_CHECKING:
    from querator.domain.model import ItemState


class _SQLiteRows(SQLiteItemRows, SQLiteLeasingRows, SQLiteUpkeepRows, SQLiteIdempotencyRows):
    """``embedded.base.Rows`` on one connection inside a transaction."""


class _RowsTransaction(_Transaction):
    """A transaction over ``_SQLiteRows`` (engine v2's)."""

    __slots__ = ("_states",)

    def __init__(
        self, database: SQLiteDatabase, *, write: bool, states: dict[tuple[Any, ...], ItemState]
    ) -> None:
        super().__init__(database, write=write)
        self._states = states

    def __enter__(self) -> _SQLiteRows:
        return _SQLiteRows(self._begin(), self._states)


class SQLiteItemStore(SQLiteItems, SQLiteLeasing, SortedRowsStore):
    """``ItemStore`` in a ``SQLiteDatabase``; safe across threads and processes on one machine."""

    def __init__(self, database: SQLiteDatabase) -> None:
        self._db = database
        #: ``_SQLiteRows.states``'s rows already converted; emptied when over ``_KNOWN_STATES``.
        self._states: dict[tuple[Any, ...], ItemState] = {}

    def _read(self) -> _RowsTransaction:
        return _RowsTransaction(self._db, write=False, states=self._states)

    def _write(self) -> _RowsTransaction:
        return _RowsTransaction(self._db, write=True, states=self._states)
