"""Ports, the bulk load role: what an import (``queue.import``) needs beyond writing items.

The Spark producer's direct path writes DynamoDB rows itself (``querator.storage.dynamodb.bulk``,
DynamoDB only); through the port it takes only what every store gives.
"""

from __future__ import annotations

from typing import Protocol


class BulkLoadPort(Protocol):
    """What an import reads of a partition before it writes."""

    def source_ids(self, queue: str, partition: int) -> set[str]: ...
