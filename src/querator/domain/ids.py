"""Domain layer: item ids, which are also the items' places in their partition.

An id is ``VVVVVVVVVVVVVV SSSSSSSSSS NNNNNN`` (30 lowercase hex digits, no spaces):

- ``V`` the time the item becomes visible to lease, in microseconds since the epoch; the produce
  time for an ordinary item, ``enqueue_at`` / ``retry_at`` for a scheduled one, the time it went
  back for an expired or retried one;
- ``S`` a per-process counter, seeded at random, so items written at the same microsecond keep the
  order they were produced in;
- ``N`` a random node number, so two processes never mint the same id.

Sorted as strings, ids are in visible-at order, which is FIFO order: the storage layer keeps them
as the sort key, so "everything visible now" is one key range and the oldest item comes first.
An item that goes back to the queue is written under a new id, so an id is valid for one lease
(fencing): a consumer holding an old id can never act on the item after it was handed out again.
See docs/adr/0002-item-ids.md.

An item of a priority other than 5 has its priority's band in front of those digits
(``querator.domain.priority``): ``.3`` + 30 hex digits for priority 3, ``p7`` + 30 for priority 7.
In a fair queue the group's lane follows the band (``querator.domain.groups.group_lane``):
``.3g0123456789abcdef`` + 30 hex digits, so each priority and group is one key range.
"""

from __future__ import annotations

import re
import secrets
import threading
from typing import TYPE_CHECKING

from querator.domain.errors import InvalidRequestError
from querator.domain.model import timestamp_us, utc_from_timestamp_us
from querator.domain.priority import DEFAULT_PRIORITY, band, unbanded

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

_TIME_DIGITS = 14
_SEQ_DIGITS = 10
_NODE_DIGITS = 6
ID_LENGTH = _TIME_DIGITS + _SEQ_DIGITS + _NODE_DIGITS
#: Engine v2's ids, and engine v3's (``querator.domain.positions``: ``l`` and a position, ``m`` and a
#: scheduled item's due time and random digits).
_ID_PATTERN = re.compile(
    rf"(?:\.[0-4]|p[6-9])?(?:g[0-9a-f]{{16}})?(?:[0-9a-f]{{{ID_LENGTH}}}|l[0-9a-f]{{16}}|m[0-9a-f]{{24}})"
)
_SEQ_MODULUS = 16**_SEQ_DIGITS
#: A key that sorts after every item id of every band (``p9`` + hex is the last) and before the head
#: row and lease records (``~``): the end of "all items" ranges.
ITEMS_END = "q"


def visible_at_of(item_id: str) -> datetime:
    """The time the item with this id becomes (or became) visible to lease."""
    return utc_from_timestamp_us(int(unbanded(item_id)[:_TIME_DIGITS], 16))


def time_key(moment: datetime) -> str:
    """``moment`` as an id's time prefix: keys built from it sort in time order (ids, deadlines)."""
    return f"{timestamp_us(moment):0{_TIME_DIGITS}x}"


def visible_bound(now: datetime) -> str:
    """The smallest id that is *not* visible at ``now``: ids below it are due."""
    return f"{timestamp_us(now) + 1:0{_TIME_DIGITS}x}"


def key_after(item_id: str) -> str:
    """The smallest key that sorts after ``item_id`` and before every later id (ids have one
    length): where a range read that stopped at ``item_id`` goes on."""
    return f"{item_id}0"


def join_ids(ids: Sequence[str]) -> str:
    """Ids as one string (lease records, idempotency records): concatenated when all are of
    priority 5 (fixed length, as stored before priorities existed), else each after a comma (the
    leading comma marks the form, so one id of another priority reads back whole)."""
    if all(len(i) == ID_LENGTH for i in ids):
        return "".join(ids)
    return "".join(f",{i}" for i in ids)


def split_ids(joined: str) -> list[str]:
    """The ids ``join_ids`` joined."""
    if joined.startswith(","):
        return joined[1:].split(",")
    return [joined[i : i + ID_LENGTH] for i in range(0, len(joined), ID_LENGTH)]


def is_item_id(value: str) -> bool:
    """Whether ``value`` has the shape of an item id (of any priority)."""
    return _ID_PATTERN.fullmatch(value) is not None


def parse_item_id(value: str) -> str:
    """Return ``value`` when it has the shape of an item id, else raise ``InvalidRequestError``."""
    if not _ID_PATTERN.fullmatch(value):
        raise InvalidRequestError(f"'{value}' is not an item id", id=value)
    return value


class IdFactory:
    """Mints item ids; thread-safe. One per process is enough (and is what keeps produce order)."""

    def __init__(self, *, node: int | None = None, seed: int | None = None) -> None:
        self._node = secrets.randbelow(16**_NODE_DIGITS) if node is None else node
        # Seeded in the lower half: the counter then wraps only after 2**39 ids in one process
        # (days at a million ids a second), and only a wrap can break the produce order of ids
        # minted for the same microsecond.
        self._seq = secrets.randbelow(_SEQ_MODULUS // 2) if seed is None else seed
        self._lock = threading.Lock()

    def new_id(self, visible_at: datetime, priority: int = DEFAULT_PRIORITY, lane: str = "") -> str:
        return self.new_ids(visible_at, 1, priority, lane)[0]

    def new_ids(
        self, visible_at: datetime, count: int, priority: int = DEFAULT_PRIORITY, lane: str = ""
    ) -> list[str]:
        """``count`` ids of ``priority`` that sort in the order returned, all visible at ``visible_at``;
        ``lane``: a group's lane in a fair queue (``querator.domain.groups.group_lane``), else ``""``."""
        prefix = band(priority) + lane + time_key(visible_at)
        with self._lock:
            first = self._seq
            if first + count > _SEQ_MODULUS:
                # The counter would wrap inside this batch: restart it so the batch still sorts in order.
                first = 0
            self._seq = first + count
        return [f"{prefix}{first + i:0{_SEQ_DIGITS}x}{self._node:0{_NODE_DIGITS}x}" for i in range(count)]
