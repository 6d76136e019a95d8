"""Storage layer: items to and from DynamoDB attribute maps (low-level client format).

Times are stored as epoch microseconds (N), so conditions compare them as numbers. Empty strings and
absent optional values are not stored at all: every byte counts toward the billed item size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from querator.domain.ids import join_ids, split_ids, time_key, visible_bound
from querator.domain.model import REPLY_SIZE_THRESHOLD, Item, ItemState, timestamp_us, utc_from_timestamp_us
from querator.domain.priority import BANDS, band_start
from querator.ports import GroupLedger, IdempotencyRecord, Lane, LeaseRecord, PartitionHead, Recount
from querator.storage.dynamodb import schema

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

AttributeMap = dict[str, Any]


# -- replies: what a DynamoDB-compatible store returns for "nothing" ---------------------------------
#
# AWS and moto leave a key out of a reply when there is nothing under it; other stores that speak
# DynamoDB's API send it empty instead: LocalStack's DynamoDB returns ``Attributes: {}`` for
# ``ReturnValues=ALL_OLD`` on a new item, and ``{}`` or ``[]`` spellings of ``Item``, ``Items``,
# ``Responses``, ``UnprocessedItems``, ``UnprocessedKeys`` and ``LastEvaluatedKey`` are as valid to
# botocore's parser. Every read of a reply goes through these, so each spelling means "nothing".
# A stored row always has its key attributes, so an empty map is never a row.


def returned(reply: Mapping[str, Any], key: str) -> AttributeMap | None:
    """The row a reply returned under ``key`` (``Attributes``, ``Item``); ``None``: no row."""
    return reply.get(key) or None


def rows(reply: Mapping[str, Any], key: str = "Items") -> list[AttributeMap]:
    """The rows of a Query or Scan reply (``Items``); absent or ``null`` is none."""
    return list(reply.get(key) or ())


def last_key(reply: Mapping[str, Any]) -> AttributeMap | None:
    """Where a Query or Scan stopped (``LastEvaluatedKey``); ``None`` (also for ``{}``): it read to
    the end. An empty key passed back as ``ExclusiveStartKey`` would be refused, or read forever."""
    return reply.get("LastEvaluatedKey") or None


def table_part(reply: Mapping[str, Any], key: str, table: str) -> list[Any]:
    """``reply[key][table]`` of a batch reply (``Responses``, ``UnprocessedItems``); none when the
    key or the table is absent, ``null`` or empty."""
    return list((reply.get(key) or {}).get(table) or ())


def unprocessed_keys(reply: Mapping[str, Any], table: str) -> list[AttributeMap]:
    """The keys of ``table`` a ``BatchGetItem`` left unread (``UnprocessedKeys``)."""
    return list(((reply.get("UnprocessedKeys") or {}).get(table) or {}).get("Keys") or ())


def num(value: datetime) -> dict[str, str]:
    return {"N": str(timestamp_us(value))}


def _time(attrs: AttributeMap, name: str) -> datetime | None:
    value = attrs.get(name)
    return None if value is None else utc_from_timestamp_us(int(value["N"]))


def _required_time(attrs: AttributeMap, name: str) -> datetime:
    value = _time(attrs, name)
    if value is None:
        raise ValueError(f"stored item lacks {name}")
    return value


def _str(attrs: AttributeMap, name: str) -> str:
    value = attrs.get(name)
    return "" if value is None else str(value["S"])


def item_key(queue: str, partition: int, item_id: str) -> AttributeMap:
    return {schema.PK: {"S": schema.partition_key(queue, partition)}, schema.SK: {"S": item_id}}


def encode_item(queue: str, partition: int, item: Item) -> AttributeMap:
    attrs: AttributeMap = item_key(queue, partition, item.id)
    attrs[schema.ATTEMPTS] = {"N": str(item.attempts)}
    attrs[schema.EXPIRE_DEADLINE] = num(item.expire_deadline)
    attrs[schema.CREATED_AT] = num(item.created_at)
    if item.payload:
        attrs[schema.PAYLOAD] = {"B": item.payload}
    size = item.reply_size()
    # Only larger items carry their size: the 100-byte items of most queues store nothing extra.
    if size >= REPLY_SIZE_THRESHOLD:
        attrs[schema.PAYLOAD_SIZE] = {"N": str(size)}
    for name, value in (
        (schema.REFERENCE, item.reference),
        (schema.ENCODING, item.encoding),
        (schema.KIND, item.kind),
        (schema.SOURCE_ID, item.source_id),
        (schema.SOURCE_QUEUE, item.source_queue),
        (schema.GROUP, item.group),
        (schema.LAST_REASON, item.last_reason),
    ):
        if value:
            attrs[name] = {"S": value}
    if item.failures:
        attrs[schema.FAILURES] = {"N": str(item.failures)}
    if item.lease_deadline is not None:
        attrs[schema.LEASE_DEADLINE] = num(item.lease_deadline)
    if item.enqueue_at is not None:
        attrs[schema.ENQUEUE_AT] = num(item.enqueue_at)
    if item.next_priority is not None:
        attrs[schema.NEXT_PRIORITY] = {"N": str(item.next_priority)}
    return attrs


def decode_item(attrs: AttributeMap) -> Item:
    payload = attrs.get(schema.PAYLOAD)
    return Item(
        id=attrs[schema.SK]["S"],
        payload=bytes(payload["B"]) if payload is not None else b"",
        reference=_str(attrs, schema.REFERENCE),
        encoding=_str(attrs, schema.ENCODING),
        kind=_str(attrs, schema.KIND),
        attempts=int(attrs.get(schema.ATTEMPTS, {"N": "0"})["N"]),
        lease_deadline=_time(attrs, schema.LEASE_DEADLINE),
        expire_deadline=_required_time(attrs, schema.EXPIRE_DEADLINE),
        created_at=_required_time(attrs, schema.CREATED_AT),
        enqueue_at=_time(attrs, schema.ENQUEUE_AT),
        source_id=_str(attrs, schema.SOURCE_ID),
        source_queue=_str(attrs, schema.SOURCE_QUEUE),
        next_priority=int(attrs[schema.NEXT_PRIORITY]["N"]) if schema.NEXT_PRIORITY in attrs else None,
        group=_str(attrs, schema.GROUP),
        last_reason=_str(attrs, schema.LAST_REASON),
        failures=_int(attrs, schema.FAILURES),
    )


def decode_state(attrs: AttributeMap) -> ItemState:
    return ItemState(
        id=attrs[schema.SK]["S"],
        attempts=int(attrs.get(schema.ATTEMPTS, {"N": "0"})["N"]),
        lease_deadline=_time(attrs, schema.LEASE_DEADLINE),
        expire_deadline=_required_time(attrs, schema.EXPIRE_DEADLINE),
        created_at=_required_time(attrs, schema.CREATED_AT),
        enqueue_at=_time(attrs, schema.ENQUEUE_AT),
        payload_size=int(attrs.get(schema.PAYLOAD_SIZE, {"N": "0"})["N"]),
    )


def _int(attrs: AttributeMap, name: str) -> int:
    value = attrs.get(name)
    return 0 if value is None else int(value["N"])


def decode_head(attrs: AttributeMap | None) -> PartitionHead:
    if not attrs:
        return PartitionHead()
    return PartitionHead(
        cursor=_str(attrs, schema.HEAD_CURSOR),
        sweep=_str(attrs, schema.HEAD_SWEEP),
        schedule_mark=_str(attrs, schema.HEAD_SCHEDULE_MARK),
        items=_int(attrs, schema.HEAD_ITEMS),
        leased=_int(attrs, schema.HEAD_LEASED),
        scheduled=_int(attrs, schema.HEAD_SCHEDULED),
        created_sum=_int(attrs, schema.HEAD_CREATED_SUM),
        leased_created_sum=_int(attrs, schema.HEAD_LEASED_CREATED_SUM),
        scheduled_created_sum=_int(attrs, schema.HEAD_SCHEDULED_CREATED_SUM),
        produced=_int(attrs, schema.HEAD_PRODUCED),
        completed=_int(attrs, schema.HEAD_COMPLETED),
        version=_int(attrs, schema.HEAD_VERSION),
        recount=decode_recount(attrs.get(schema.HEAD_RECOUNT)),
        recounted_at=_time(attrs, schema.HEAD_RECOUNTED_AT),
        band_cursors=_band_marks(attrs, schema.HEAD_CURSOR),
        band_sweeps=_band_marks(attrs, schema.HEAD_SWEEP),
        band_registered={
            band: _required_time(attrs, name)
            for band in BANDS
            if band and (name := schema.band_attribute(schema.HEAD_BAND_REGISTERED, band)) in attrs
        },
        has_lanes=_flag(attrs, schema.HEAD_HAS_LANES),
        rings={
            band: attrs[name]["S"]
            for band in BANDS
            if (name := schema.band_attribute(schema.HEAD_RING, band)) in attrs
        },
    )


def _flag(attrs: AttributeMap, name: str) -> bool:
    """A flag stored as a boolean (or as a number, 0 meaning unset)."""
    value = attrs.get(name)
    if value is None:
        return False
    if "BOOL" in value:
        return bool(value["BOOL"])
    return "N" in value and int(value["N"]) != 0


def _band_marks(attrs: AttributeMap, base: str) -> dict[str, str]:
    """The cursors (or sweep marks) of the bands other than priority 5's, by band."""
    found = {}
    for band in BANDS:
        name = schema.band_attribute(base, band)
        if band and name in attrs:
            found[band] = attrs[name]["S"]
    return found


_RECOUNT_NUMBERS = (
    "version",
    "items",
    "leased",
    "scheduled",
    "created_sum",
    "leased_created_sum",
    "scheduled_created_sum",
)


def encode_recount(recount: Recount) -> AttributeMap:
    fields: AttributeMap = {name: {"N": str(getattr(recount, name))} for name in _RECOUNT_NUMBERS}
    fields["position"] = {"S": recount.position} if recount.position else {"NULL": True}
    return {"M": fields}


def decode_recount(value: AttributeMap | None) -> Recount | None:
    if not value or not value.get("M"):
        return None
    fields = value["M"]
    numbers = {name: int(fields[name]["N"]) for name in _RECOUNT_NUMBERS if name in fields}
    position = fields.get("position", {})
    return Recount(position=str(position.get("S", "")), **numbers)


def lease_record_key(deadline: datetime, unique: str) -> str:
    """``~L`` + the deadline as an id's time prefix (so records sort by deadline) + a unique suffix."""
    return f"{schema.LEASE_RECORD_PREFIX}{time_key(deadline)}{unique}"


def lease_records_due(now: datetime) -> str:
    """The first lease record key whose deadline is after ``now``."""
    return f"{schema.LEASE_RECORD_PREFIX}{visible_bound(now)}"


def encode_lease_record(
    queue: str, partition: int, key: str, ids: list[str], deadline: datetime
) -> AttributeMap:
    return {
        schema.PK: {"S": schema.partition_key(queue, partition)},
        schema.SK: {"S": key},
        schema.LEASE_RECORD_DEADLINE: num(deadline),
        # Ids are fixed-length, so one string holds them all at one byte a character (a list would
        # add bytes per element, and the record's size is what its write costs).
        schema.LEASE_RECORD_IDS: {"S": join_ids(ids)},
    }


def decode_lease_record(attrs: AttributeMap) -> LeaseRecord:
    return LeaseRecord(
        key=attrs[schema.SK]["S"],
        deadline=_required_time(attrs, schema.LEASE_RECORD_DEADLINE),
        ids=split_ids(_str(attrs, schema.LEASE_RECORD_IDS)),
    )


def encode_idempotency(queue: str, record: IdempotencyRecord, expires_at: datetime) -> AttributeMap:
    return {
        schema.PK: {"S": schema.idempotency_key(queue, record.key)},
        schema.SK: {"S": schema.IDEM_SK},
        schema.IDEM_PARTITION: {"N": str(record.partition)},
        # A list, not a string set: sets are unordered and the reply must repeat the ids in order.
        schema.IDEM_IDS: {"L": [{"S": item_id} for item_id in record.ids]},
        schema.IDEM_DONE: {"BOOL": record.done},
        schema.IDEM_STARTED: num(record.started_at),
        schema.IDEM_QUEUE_CREATED: num(record.queue_created_at),
        schema.IDEM_OWNER: {"S": record.owner},
        # TTL works in epoch seconds.
        schema.TTL: {"N": str(int(expires_at.timestamp()))},
    }


def decode_idempotency(key: str, attrs: AttributeMap | None) -> IdempotencyRecord | None:
    """The idempotency record stored for ``key``; ``None`` for no row (``None`` or ``{}``)."""
    if not attrs:
        return None
    return IdempotencyRecord(
        key=key,
        partition=int(attrs[schema.IDEM_PARTITION]["N"]),
        ids=[value["S"] for value in attrs[schema.IDEM_IDS]["L"]],
        done=bool(attrs[schema.IDEM_DONE]["BOOL"]),
        started_at=_required_time(attrs, schema.IDEM_STARTED),
        queue_created_at=_required_time(attrs, schema.IDEM_QUEUE_CREATED),
        owner=_str(attrs, schema.IDEM_OWNER),
    )


def head_key(queue: str, partition: int) -> AttributeMap:
    return {schema.PK: {"S": schema.partition_key(queue, partition)}, schema.SK: {"S": schema.HEAD_SK}}


# -- fair delivery: group lanes and group ledgers ---------------------------------------------------


def lane_key(queue: str, partition: int, lane: str) -> AttributeMap:
    return {
        schema.PK: {"S": schema.partition_key(queue, partition)},
        schema.SK: {"S": schema.lane_sort_key(lane)},
    }


def ledger_key(queue: str, partition: int, group: str) -> AttributeMap:
    return {
        schema.PK: {"S": schema.partition_key(queue, partition)},
        schema.SK: {"S": schema.ledger_sort_key(group)},
    }


def decode_lane(attrs: AttributeMap) -> Lane:
    """A lane row as a ``Lane``; its cursor is never below the lane's start. A row without a
    registration time (never written by this code) reads as registered at the epoch: idle."""
    lane = attrs[schema.SK]["S"][len(schema.LANE_PREFIX) :]
    registered = _time(attrs, schema.LANE_REGISTERED) or utc_from_timestamp_us(0)
    return Lane(
        lane=lane, cursor=max(_str(attrs, schema.LANE_CURSOR), band_start(lane)), registered=registered
    )


def decode_ledger(attrs: AttributeMap | None) -> GroupLedger:
    if not attrs:
        return GroupLedger()
    prefix = schema.LEDGER_ENTRY_PREFIX
    return GroupLedger(
        version=_int(attrs, schema.LEDGER_VERSION),
        leases={
            name[len(prefix) :]: utc_from_timestamp_us(int(value["N"]))
            for name, value in attrs.items()
            if name.startswith(prefix) and name not in (schema.PK, schema.SK)
        },
    )
