"""Storage layer: engine v3's claim log on DynamoDB (``querator.ports.log``; ADR 0100, L-spill).

Adapter notes (the layout is in ``schema``'s docstring, "Claim logs"):

- ``append`` takes positions with one unconditional ``UpdateItem`` on the head (the sequencer:
  ``tail = if_not_exists(tail, :now_us) + :k``, which never fails), then puts its packed rows with
  ``attribute_not_exists``; a row whose first position was filled meanwhile goes to new positions.
- ``claim`` is a fetch-and-add on the head's cursor while the backlog holds the batch (conditional on
  ``cur <= tail_read - k``: the tail only grows, so it fails only when other claims took the
  backlog), an exact claim (``cur = :cur_read``) otherwise; the record goes in by the same write.
  Then the run's rows are read backwards from its end.
- The head keeps at most ``HEAD_RECORDS`` records: the claim that reaches it moves the ``SPILL``
  oldest to ``P``/``L`` rows in one conditional transaction (a concurrent settle cancels it; a later
  claim tries again).
- Whatever settles positions and appends items (retry, expiry, dead letter, promote) is one
  ``TransactWriteItems`` per source record: the source's change conditional on the record's version,
  each target head's tail moved ``:t -> :t + n`` conditionally (a cancelled transaction leaves no
  hole), the target rows put with ``attribute_not_exists``. A cancelled one is read again and
  retried ``_RETRIES`` times, then the call raises ``StoreThrottledError``.
- A hole (a position taken by a writer that has not written it) is filled, once its claim is
  ``HOLE_TIMEOUT_S`` old, by a filler row per position, ascending from where the hole begins (not
  only the claim's own positions): a late writer's row starts at or after the hole's beginning, so
  if any position of its row is filled, its first one is, and its put fails.

The log is composed of a mixin per role of the port, each in a module named after it (``items``,
``leasing``, ``upkeep``), over ``base.DynamoDBLogBase``, as the item store is
(``querator.storage.dynamodb.store``).
"""

from __future__ import annotations

from querator.storage.dynamodb.log.items import DynamoDBLogItems
from querator.storage.dynamodb.log.leasing import DynamoDBLogLeasing
from querator.storage.dynamodb.log.upkeep import DynamoDBLogUpkeep


class DynamoDBClaimLog(DynamoDBLogItems, DynamoDBLogLeasing, DynamoDBLogUpkeep):
    """Engine v3's claim logs in the items table, one partition key per log."""
