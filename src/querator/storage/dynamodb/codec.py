"""Storage layer: items to and from DynamoDB attribute maps (low-level client format).

Times are stored as epoch microseconds (N), so conditions compare them as numbers. Empty strings and
absent optional values are not stored at all: every byte counts toward the billed item size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from querator.domain.model import Item, ItemState, timestamp_us, utc_from_timestamp_us
from querator.ports import IdempotencyRecord
from querator.storage.dynamodb import schema

if TYPE_CHECKING:
    from datetime import datetime

AttributeMap = dict[str, Any]


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
    for name, value in (
        (schema.REFERENCE, item.reference),
        (schema.ENCODING, item.encoding),
        (schema.KIND, item.kind),
        (schema.SOURCE_ID, item.source_id),
    ):
        if value:
            attrs[name] = {"S": value}
    if item.lease_deadline is not None:
        attrs[schema.LEASE_DEADLINE] = num(item.lease_deadline)
    if item.enqueue_at is not None:
        attrs[schema.ENQUEUE_AT] = num(item.enqueue_at)
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
    )


def decode_state(attrs: AttributeMap) -> ItemState:
    return ItemState(
        id=attrs[schema.SK]["S"],
        attempts=int(attrs.get(schema.ATTEMPTS, {"N": "0"})["N"]),
        lease_deadline=_time(attrs, schema.LEASE_DEADLINE),
        expire_deadline=_required_time(attrs, schema.EXPIRE_DEADLINE),
        created_at=_required_time(attrs, schema.CREATED_AT),
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
        # TTL works in epoch seconds.
        schema.TTL: {"N": str(int(expires_at.timestamp()))},
    }


def decode_idempotency(key: str, attrs: AttributeMap) -> IdempotencyRecord:
    return IdempotencyRecord(
        key=key,
        partition=int(attrs[schema.IDEM_PARTITION]["N"]),
        ids=[value["S"] for value in attrs[schema.IDEM_IDS]["L"]],
        done=bool(attrs[schema.IDEM_DONE]["BOOL"]),
        started_at=_required_time(attrs, schema.IDEM_STARTED),
        queue_created_at=_required_time(attrs, schema.IDEM_QUEUE_CREATED),
    )
