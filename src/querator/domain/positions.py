"""Domain layer: the ids of items in engine v3's claim log (docs/adr/0100-engine-v3-candidates.md).

A log is one lane of one partition (``querator.domain.priority.lane_of``: a band, or a band and a
group). Each item in it sits at a *position*, an integer the log's sequencer hands out once, in
produce order: positions are the log's FIFO order, and a lease claims a run of them.

An item's id is its lane, ``l`` and the position in 16 hex digits (``l00062b1c3e5f1a20``,
``.3g0123456789abcdefl00062b1c3e5f1a20``), so the priority and group of an id read as they do for
engine v2's ids, and ``l`` (not a hex digit, not ``g``) tells the two engines' ids apart. Within a
lane, ``l`` sorts after every v2 id (hex digits) and before the next band (``p6``…, and ``~``), so
one listing pages through both engines' items in lease order: v2's, which are older, first.

An item scheduled for later (``enqueue_at``, ``retry_at``) waits in the log's *schedule*, outside the
positions, under ``scheduled_id``: its lane, ``m``, the time it becomes due in 14 hex digits of
microseconds and 10 random hex digits. When due it moves to the tail and takes a position id, so the
ids of a listing taken before it was due no longer name it (it was never leased under them).

A position is written once and never reused: an item that goes back to the queue (retried, or its
lease ran out) is appended at a new one, so an id is valid for one lease (fencing), as in v2.
A log's first position is the microsecond clock when the log was first written; a queue deleted and
created again under the same name therefore starts above every position of its earlier life (a log
takes fewer than a million positions a second), and an id of the old queue matches nothing.
"""

from __future__ import annotations

from querator.domain.priority import lane_of

#: What follows the lane in a log item's id.
POSITION_MARK = "l"
#: What follows the lane in a scheduled item's id (after every position id of the lane).
SCHEDULED_MARK = "m"
_DIGITS = 16
_TIME_DIGITS = 14
_UNIQUE_DIGITS = 10
_HEX = frozenset("0123456789abcdef")
#: A writer that took positions and has not written them after this long is taken for dead: a lease
#: whose run holds its positions fills them (and the writer, if it was only late, takes new ones).
HOLE_TIMEOUT_S = 2.0


def position_id(lane: str, position: int) -> str:
    """The id of the item at ``position`` of ``lane``'s log."""
    return f"{lane}{POSITION_MARK}{position:0{_DIGITS}x}"


def parse_position_id(item_id: str) -> tuple[str, int] | None:
    """``(lane, position)`` of a log item's id; ``None`` for anything else (a v2 id, a typo)."""
    lane = lane_of(item_id)
    rest = item_id[len(lane) :]
    if len(rest) != _DIGITS + 1 or rest[0] != POSITION_MARK or not _HEX.issuperset(rest[1:]):
        return None
    return lane, int(rest[1:], 16)


def scheduled_id(lane: str, due_us: int, unique: int) -> str:
    """The id of an item in ``lane``'s schedule, due at ``due_us`` (microseconds since the epoch);
    ``unique`` (random, below 16**10) tells apart items due at the same microsecond."""
    return f"{lane}{SCHEDULED_MARK}{due_us:0{_TIME_DIGITS}x}{unique:0{_UNIQUE_DIGITS}x}"


def parse_scheduled_id(item_id: str) -> tuple[str, int] | None:
    """``(lane, due_us)`` of a scheduled item's id; ``None`` for anything else."""
    lane = lane_of(item_id)
    rest = item_id[len(lane) :]
    if len(rest) != _TIME_DIGITS + _UNIQUE_DIGITS + 1 or rest[0] != SCHEDULED_MARK:
        return None
    if not _HEX.issuperset(rest[1:]):
        return None
    return lane, int(rest[1 : 1 + _TIME_DIGITS], 16)


__all__ = [
    "HOLE_TIMEOUT_S",
    "POSITION_MARK",
    "SCHEDULED_MARK",
    "parse_position_id",
    "parse_scheduled_id",
    "position_id",
    "scheduled_id",
]
