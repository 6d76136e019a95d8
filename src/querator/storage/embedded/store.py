"""Storage layer: the ``ItemStore`` port's semantics over sorted rows, shared by the embedded stores.

The in-memory and SQLite stores differ only in where rows live (``Rows``); what each port method
means (guards, counters, marks, lease records, idempotency) is written once here, after the
DynamoDB store, which is the reference (docs/adr/0060-embedded-stores.md). Every port method runs
in one transaction of the backing store, so each guarded write is atomic, and the head row's
counters change in the same transaction as the items (no drift, unlike DynamoDB's separate write).
Every read is a key range of what the caller needs: O(log n + k), never O(what the partition holds),
except ``iter_items`` and ``source_ids``, as in the reference.
"""

from __future__ import annotations

from querator.storage.embedded.bulk import RowsBulkLoad
from querator.storage.embedded.idempotency import RowsIdempotency
from querator.storage.embedded.items import RowsItems
from querator.storage.embedded.lanes import RowsLanes
from querator.storage.embedded.leasing import RowsLeasing
from querator.storage.embedded.upkeep import RowsUpkeep


class SortedRowsStore(RowsItems, RowsLeasing, RowsLanes, RowsUpkeep, RowsIdempotency, RowsBulkLoad):
    """``ItemStore`` over ``Rows``; subclasses provide ``_read`` and ``_write`` transactions."""
