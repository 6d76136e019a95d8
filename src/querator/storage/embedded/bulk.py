"""Storage layer, the embedded stores' bulk load role: what an import (``queue.import``) reads
before it writes. The embedded stores have no bulk path of their own: an import writes with
``put_new`` (items), and the Spark producer writes to DynamoDB only."""

from __future__ import annotations

from querator.storage.embedded.base import RowsStoreBase


class RowsBulkLoad(RowsStoreBase):
    """``BulkLoadPort`` over ``Rows``."""

    def source_ids(self, queue: str, partition: int) -> set[str]:
        return {item.source_id for item in self.iter_items(queue, partition) if item.source_id}
