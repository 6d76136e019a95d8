"""Ports: engine v3's claim log (docs/adr/0100-engine-v3-candidates.md).

A *log* is one lane of one partition (``LogKey``: a band, or a band and a group in a fair queue).
Its items sit at positions (``querator.domain.positions``) handed out once, in produce order, by a
sequencer in the log's *head*; items produced together are stored together in write-once *packed
rows*. A lease claims a *run* of positions after the head's *cursor* with one conditional write that
also files a *lease record* (a token, the positions it holds, their deadline); completing, retrying
and renewing write the record, not the items, and finished rows go by TTL. So a delivered item
costs a share of three small head writes and of the bytes of its row, not three writes of its own.

What the service sees, and every store keeps (the contract suite in ``tests/contract`` holds them to
it on every store):

- **Order.** A log hands out positions oldest first, to any number of consumers: concurrent claims
  get disjoint runs, each in position order, and a claim never fails because another one won (a
  fetch-and-add on the cursor, not a race per item).
- **Fencing.** An id is valid for one lease: a position is written once, an item that goes back to
  the queue is appended at a new position, and a settled position is done for good. A holder whose
  lease ran out, or whose position was settled, gets the id back as rejected.
- **Nothing held that was not returned.** A claim returns every position it took, either as an item
  or as a *hole* (see ``collect``): the run is the caller's to settle, or it expires.
- **A dead writer** (a produce that took positions and stopped before writing them) leaves a hole.
  A claim that meets one waits ``HOLE_TIMEOUT_S`` for it (``collect``), then fills it: the position
  is done, and a writer that was only late finds it taken and appends its items at new positions,
  so its call still succeeds and nothing lands behind the cursor.
- **Atomic moves.** Whatever settles a position and appends an item elsewhere (a retry, an expired
  lease going to the tail, a dead letter) does both or neither.
- **Costs** (DynamoDB): ``append`` one sequencer write plus the bytes of its rows; ``claim`` one head
  write plus reading the run's rows; ``settle``/``renew`` one write per record touched (a
  transaction when items move); reads O(what the call returns), never O(what the log holds).

Every method raises on a store error; a method that raised may have applied part of its work only
where its docstring says so.

``ClaimLog`` is the composition of one protocol per role, each in a module of its own (``items``,
``leasing``, ``upkeep``), as the item store's are (``querator.ports``); every name is importable
from here as well.
"""

from __future__ import annotations

from typing import Protocol

from querator.ports.log.items import LogHead, LogItemsPort, LogKey
from querator.ports.log.leasing import Claim, ClaimReadError, LogLeasingPort, Settled, Settlement
from querator.ports.log.upkeep import LeaseRun, LogAges, LogUpkeepPort


class ClaimLog(LogItemsPort, LogLeasingPort, LogUpkeepPort, Protocol):
    """Engine v3's storage of items: one log per ``LogKey``."""


__all__ = [
    "Claim",
    "ClaimLog",
    "ClaimReadError",
    "LeaseRun",
    "LogAges",
    "LogHead",
    "LogItemsPort",
    "LogKey",
    "LogLeasingPort",
    "LogUpkeepPort",
    "Settled",
    "Settlement",
]
