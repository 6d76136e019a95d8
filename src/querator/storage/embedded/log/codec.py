"""Storage layer, engine v3's claim log in the embedded stores: how items are encoded in a packed
row (a blob), and read back."""

from __future__ import annotations

import struct
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from querator.domain.model import Item, timestamp_us, utc_from_timestamp_us
from querator.domain.positions import POSITION_MARK

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence


#: Most bytes of encoded items in one packed row (an item larger than that gets a row of its own).
ROW_BYTES = 16 * 1024


# -- the encoding of items in a row -----------------------------------------------------------------
#
# A row's blob: the item count (u16), each item's end offset (u32, from the start of the items), then
# the items. An item: created, expire and enqueue time (i64 µs; enqueue ``_NONE`` when unset),
# attempts (u32), next priority (i8, -1: none), the byte lengths of reference, encoding, kind,
# source id, source queue and group (u16 each; all are under 2,000 bytes), those strings, and the
# payload (the rest). Its id is not stored: it is the position's. A lease deadline is not stored:
# it is the record's. 41 bytes beside the payload, so 100 items of 100 B make one row.
#
# An item that failed (``Item.failures``, ``Item.last_reason``) has ``_FAILED`` added to its next
# priority byte (31-41 then, never a priority) and, after its strings, its failure count (u32), the
# byte length of its reason (u16) and the reason: 6 bytes and the reason, only on items that failed,
# so the row of an item that never did is byte for byte what it was (and rows written before
# failures were kept read as they did).

_ITEM = struct.Struct("<qqqIb6H")
_FAILED = 32
_FAILURE = struct.Struct("<IH")
_ITEM_SIZE = _ITEM.size
_NO_LENGTHS = [0, 0, 0, 0, 0, 0]
_EPOCH = utc_from_timestamp_us(0)
_COUNT = struct.Struct("<H")
_NONE = -(2**63)


#: Recent times in µs: the items of one produce share their times (a dict hit costs a sixth of a
#: conversion; datetimes keep their hash).
_STAMPS: dict[datetime, int] = {}


def _stamp(value: datetime) -> int:
    us = _STAMPS.get(value)
    if us is None:
        if len(_STAMPS) > 256:
            _STAMPS.clear()
        us = _STAMPS[value] = timestamp_us(value)
    return us


def encode_item(item: Item) -> tuple[bytes, int]:
    """``item`` as stored in a row, and its ``reply_size`` (computed from the same bytes)."""
    enqueue = _NONE if item.enqueue_at is None else _stamp(item.enqueue_at)
    priority = -1 if item.next_priority is None else item.next_priority
    created, expire = _stamp(item.created_at), _stamp(item.expire_deadline)
    failed = item.failures or item.last_reason
    if not (
        item.reference
        or item.encoding
        or item.kind
        or item.source_id
        or item.source_queue
        or item.group
        or failed
    ):
        payload = item.payload
        return _ITEM.pack(created, expire, enqueue, item.attempts, priority, 0, 0, 0, 0, 0, 0) + payload, len(
            payload
        )
    parts = [
        s.encode() for s in (item.reference, item.encoding, item.kind, item.source_id, item.source_queue)
    ]
    group = item.group.encode()
    reason = item.last_reason.encode()
    header = _ITEM.pack(
        created,
        expire,
        enqueue,
        item.attempts,
        priority + _FAILED if failed else priority,
        *(len(p) for p in parts),
        len(group),
    )
    failure = _FAILURE.pack(item.failures, len(reason)) + reason if failed else b""
    reply = len(item.payload) + 2 * (len(parts[0]) + len(parts[1]) + len(parts[2]) + len(group) + len(reason))
    return b"".join((header, *parts, group, failure, item.payload)), reply


_ONE = struct.Struct("<HI")


def pack_row(encoded: Sequence[bytes]) -> bytes:
    """One row's blob from its items' encodings."""
    if len(encoded) == 1:
        data = encoded[0]
        return _ONE.pack(1, len(data)) + data
    ends, end = [], 0
    for data in encoded:
        end += len(data)
        ends.append(end)
    return b"".join((_COUNT.pack(len(encoded)), struct.pack(f"<{len(ends)}I", *ends), *encoded))


_END = struct.Struct("<I")


_ENDS = struct.Struct("<II")


def decode_items(
    blob: bytes, first: int, positions: Iterable[int], lane: str, *, deadline: datetime | None, bump: int
) -> list[Item]:
    """The items at ``positions`` of the row starting at ``first``, under their ids, with
    ``deadline`` and attempts + ``bump``. Reads only those items' bytes (a claim of one item from a
    row of a hundred decodes one)."""
    base = 2 + 4 * _COUNT.unpack_from(blob)[0]
    # The items of one row mostly share their times: each converted once.
    times: dict[int, datetime] = {}
    found = []
    for position in positions:
        index = position - first
        if index:
            start, end = _ENDS.unpack_from(blob, 4 * index - 2)
        else:
            start, end = 0, _END.unpack_from(blob, 2)[0]
        start += base
        created, expire, enqueue, attempts, priority, *lengths = _ITEM.unpack_from(blob, start)
        at = start + _ITEM_SIZE
        if lengths == _NO_LENGTHS:
            reference = encoding = kind = source_id = source_queue = group = ""
        else:
            strings = []
            for length in lengths:
                strings.append(blob[at : at + length].decode())
                at += length
            reference, encoding, kind, source_id, source_queue, group = strings
        last_reason, failures = "", 0
        if priority >= _FAILED - 1:
            priority -= _FAILED
            failures, length = _FAILURE.unpack_from(blob, at)
            at += _FAILURE.size
            last_reason = blob[at : at + length].decode()
            at += length
        created_at = times.get(created)
        if created_at is None:
            created_at = times[created] = _EPOCH + timedelta(microseconds=created)
        expire_at = times.get(expire)
        if expire_at is None:
            expire_at = times[expire] = _EPOCH + timedelta(microseconds=expire)
        found.append(
            Item(
                id=f"{lane}{POSITION_MARK}{position:016x}",
                payload=blob[at : base + end],
                reference=reference,
                encoding=encoding,
                kind=kind,
                source_id=source_id,
                source_queue=source_queue,
                group=group,
                last_reason=last_reason,
                failures=failures,
                attempts=attempts + bump,
                lease_deadline=deadline,
                expire_deadline=expire_at,
                created_at=created_at,
                enqueue_at=None if enqueue == _NONE else _EPOCH + timedelta(microseconds=enqueue),
                next_priority=None if priority < 0 else priority,
            )
        )
    return found


def decode_scheduled(blob: bytes, item_id: str) -> Item:
    """A schedule row's item (a row of one) under its scheduled id."""
    item = decode_items(blob, 0, [0], "", deadline=None, bump=0)[0]
    return with_id(item, item_id)


def created_of(data: bytes) -> int:
    """An encoded item's ``created_at`` in whole seconds (the first field of ``encode_item``'s)."""
    created: int = _CREATED.unpack_from(data)[0]
    return created // 1_000_000


_CREATED = struct.Struct("<q")


def with_id(item: Item, item_id: str) -> Item:
    """``item`` as a log stores it under ``item_id`` (a lease deadline is a record's, not an item's)."""
    # ``dataclasses.replace`` reads the fields by name first: this is half its time.
    return Item(
        id=item_id,
        payload=item.payload,
        reference=item.reference,
        encoding=item.encoding,
        kind=item.kind,
        attempts=item.attempts,
        lease_deadline=None,
        expire_deadline=item.expire_deadline,
        created_at=item.created_at,
        enqueue_at=item.enqueue_at,
        source_id=item.source_id,
        source_queue=item.source_queue,
        next_priority=item.next_priority,
        group=item.group,
        last_reason=item.last_reason,
        failures=item.failures,
    )
