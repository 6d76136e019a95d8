"""Storage layer: the item store on one DynamoDB table (docs/adr/0050-engine-v2.md).

Adapter notes, where it deviates from or adds to the ``ItemStore`` port:

- Under one partition key live the items (ids sort in FIFO order), the partition's head row (lease
  cursor, marks, counters) and lease records keyed by deadline (``schema``). Every read is a key
  range of what the caller needs; nothing reads a partition whole except ``iter_items`` (tests,
  exports) and ``source_ids`` (import).
- Writes of fresh ids go out as ``BatchWriteItem`` (25 a request); unprocessed items are retried with
  backoff and, when retries run out, the call raises ``StoreThrottledError``: it never reports a
  write that did not happen.
- Every write that must not race is a single conditional request (``expressions``); a move between
  two keys is a two-item transaction, so an item is never lost or doubled between them. Batches of
  such writes (claims, completes, moves) run on a small thread pool, so a 1,000-item call costs
  tens of round trips, not a thousand.
- Counters are added in one ``UpdateItem`` per call and partition after the items' write. If that
  write fails the items' write still stands and the error is logged: a counter may drift, an item
  is never lost or reported wrongly.
- Fair queues (docs/adr/0080-priority-fair-redrive.md) keep each group lane's registration, cursor
  and sweep mark in a row of its own (``~R<lane>``) and a capped queue's group ledgers in rows
  ``~S<g>``; the head row only says that lanes exist (``gl``) and where each band's ring stands
  (``rg<band>``). A lease reads a band's lanes with one Query (``lanes``), so the head row does
  not grow with the groups; a FIFO queue's requests do not change (no lane, no extra request).
- The boto3 client is injected; botocore's own retries (standard mode) sit below this code.

The store is composed of a mixin per role, each in a module named after it (``items``,
``leasing``, ``lanes``, ``upkeep``, ``idempotency``, ``bulk``: the Spark producer's writer too),
over ``base.DynamoDBStoreBase``; engine v3's claim log is ``log``, split the same way.
"""

from __future__ import annotations

from querator.storage.dynamodb.bulk import DynamoDBBulkLoad
from querator.storage.dynamodb.idempotency import DynamoDBIdempotency
from querator.storage.dynamodb.items import DynamoDBItems
from querator.storage.dynamodb.lanes import DynamoDBLanes
from querator.storage.dynamodb.leasing import DynamoDBLeasing
from querator.storage.dynamodb.upkeep import DynamoDBUpkeep


class DynamoDBItemStore(
    DynamoDBItems, DynamoDBLeasing, DynamoDBLanes, DynamoDBUpkeep, DynamoDBIdempotency, DynamoDBBulkLoad
):
    """Items of every queue in one table, a queue partition per partition key."""
