"""Storage layer: engine v3's claim log (``ports.log.ClaimLog``) over one transaction's rows, shared
by the embedded stores.

The in-memory and SQLite claim logs differ only in where rows live (``LogRows``); what each port
method means is written once here, in the model of docs/adr/0100-engine-v3-candidates.md (L-spill):

- a **head** per log: ``tail`` (the sequencer), ``cursor``, counters, the largest item, and the
  *tombstones* (waiting positions deleted, above the cursor);
- write-once **packed rows** keyed by their first position: the encoded items of one append, in
  order, up to ``ROW_BYTES`` (a *filler* row, with no items, marks positions filled after their
  writer was taken for dead);
- **lease records**, one per claim (and per part a renew split off), found by deadline (``expired``)
  and by position (``settle``): a record's token begins with the first position of the run it
  was claimed from, so the records holding a position are those of the latest run starting at or
  before it, one key range;
- **schedule rows** keyed by their scheduled id (lane, due time, random), so by due time.

DynamoDB keeps up to 32 records in the head and spills the rest to rows, to save a read; here every
record is a row of its own (an index lookup costs what a head decode would). A store may keep a head
field in another form when it reads the same (SQLite: ``storage.sqlite``'s notes). Every port call runs in
one transaction of the backing store, so claims never race and nothing is half applied; a hole can
still come from ``take_positions`` without ``write_taken`` (a writer in another process that died),
and ``collect`` fills it as the port says.
"""

from __future__ import annotations

from querator.storage.embedded.log.items import LogItems
from querator.storage.embedded.log.leasing import LogLeasing
from querator.storage.embedded.log.upkeep import LogUpkeep


class ClaimLogEngine(LogItems, LogLeasing, LogUpkeep):
    """``ClaimLog`` over ``LogRows``; subclasses provide ``_read`` and ``_write`` transactions."""
