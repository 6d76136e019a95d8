"""Domain layer: priorities, and the band of keys each one occupies in a partition.

A priority is 0-9, lower leases first, 5 by default. An item's id is its place in the partition, so
the priority is part of the id: a *band* prefix puts every priority in a key range of its own, the
ranges sort in priority order, and FIFO within a priority is the id order it always was.

- Priority 5 has the empty band: its ids are the 30 hex digits of ``querator.domain.ids``, so every
  item stored before priorities existed reads as priority 5 and a FIFO queue's keys do not change.
- Priorities 0-4 are ``.0``-``.4`` followed by those digits: ``.`` sorts before every hex digit.
- Priorities 6-9 are ``p6``-``p9`` followed by them: ``p`` sorts after every hex digit and before
  ``~``, where a partition's head row and lease records live.

Ids stay safe in URLs, JSON and shells. See docs/adr/0080-priority-fair-redrive.md and
docs/ordering.md.
"""

from __future__ import annotations

from querator.domain.errors import InvalidRequestError

MIN_PRIORITY = 0
MAX_PRIORITY = 9
DEFAULT_PRIORITY = 5

#: Band prefix of each priority, in priority (= key) order.
BANDS: tuple[str, ...] = (".0", ".1", ".2", ".3", ".4", "", "p6", "p7", "p8", "p9")
_PRIORITY_OF_BAND = {band: priority for priority, band in enumerate(BANDS)}


def band(priority: int) -> str:
    """The key prefix of ``priority``'s band."""
    return BANDS[priority]


def band_of(key: str) -> str:
    """The band of an item id (or of a key inside a band: cursors, range bounds)."""
    return key[:2] if key[:1] in (".", "p") else ""


#: A group's lane after the band (``querator.domain.groups.group_lane``): ``g`` + 16 hex digits.
_LANE_LENGTH = 17
_HEX = frozenset("0123456789abcdef")


def lane_of(key: str) -> str:
    """The lane of an item id (or of a key inside a lane): in a fair queue its band and its group's
    ``g`` + 16 hex digits (``.3g0123456789abcdef``), else its band alone (``querator.domain.groups``)."""
    prefix = band_of(key)
    rest = key[len(prefix) : len(prefix) + _LANE_LENGTH]
    if len(rest) == _LANE_LENGTH and rest[0] == "g" and _HEX.issuperset(rest[1:]):
        return prefix + rest
    return prefix


def is_group_lane(lane: str) -> bool:
    """Whether ``lane`` is a group's lane (not a whole band)."""
    return lane != band_of(lane)


def ledger_group(key: str) -> str:
    """The group whose ledger an item's lease goes into (``max_leased_per_group``): its group lane
    without the band, ``g`` + 16 hex digits, one ledger for the group across priorities; ``""`` for
    an id outside a group lane."""
    lane = lane_of(key)
    return lane[len(band_of(lane)) :]


def priority_of(item_id: str) -> int:
    """The priority an item id was minted for."""
    return _PRIORITY_OF_BAND[band_of(item_id)]


def unbanded(key: str) -> str:
    """The key without its band (and group lane): the id's time-ordered digits (or a bound's)."""
    return key[len(lane_of(key)) :]


def band_start(band_prefix: str) -> str:
    """The smallest key of items in the band (below it: the bands of higher priorities)."""
    return f"{band_prefix}0"


def band_end(band_prefix: str) -> str:
    """A key after every item of the band and before the next band (``g`` follows the hex digits)."""
    return f"{band_prefix}g"


def held_end(lane: str) -> str:
    """A key after every item a band or lane holds: for a band, its own items and its group lanes'
    (``g`` + hex sort below ``h``); for a group lane, its items (``band_end``)."""
    return band_end(lane) if is_group_lane(lane) else f"{lane}h"


def validate_priority(value: object, what: str = "priority") -> int:
    """``value`` as a priority, or ``InvalidRequestError`` naming ``what``: a JSON integer 0-9
    (``True`` and ``2.5`` are not integers here, as the contract says)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{what} must be an integer between 0 and 9", field=what)
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidRequestError(f"{what} must be between 0 and 9", field=what)
    return value


__all__ = [
    "BANDS",
    "DEFAULT_PRIORITY",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "band",
    "band_end",
    "band_of",
    "band_start",
    "held_end",
    "is_group_lane",
    "lane_of",
    "ledger_group",
    "priority_of",
    "unbanded",
    "validate_priority",
]
