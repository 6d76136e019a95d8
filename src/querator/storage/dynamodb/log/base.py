"""Storage layer, engine v3's claim log on DynamoDB, what its roles share: keys, rows and their
sizes, what the head and records say (``_Head``, ``_Record``), updates built by parts
(``_Change``), and the base of the role mixins (``DynamoDBLogBase``) with the requests and steps
several roles take: reading positions, filling holes, finding and changing records, appends
atomic with the rest, the records this instance claimed."""

from __future__ import annotations

import logging
import math
import random
import re
import secrets
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import ClientError

from querator.domain.errors import QueratorError, StoreThrottledError
from querator.domain.model import MAX_PAYLOAD_BYTES, REPLY_SIZE_THRESHOLD, timestamp_us
from querator.domain.positions import parse_position_id, parse_scheduled_id, position_id, scheduled_id
from querator.storage.dynamodb import codec, objects, schema
from querator.storage.dynamodb.base import BATCH_GET_LIMIT, CONDITION_FAILED, WRITE_CONCURRENCY, write_batches
from querator.storage.dynamodb.errors import error_code, translate, translating_no_reply

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence
    from datetime import datetime

    from mypy_boto3_dynamodb import DynamoDBClient

    from querator.domain.model import Item
    from querator.ports import BatchResult
    from querator.ports.log import ClaimLog, LogKey
    from querator.storage.dynamodb.objects import PayloadObjects


#: The log's records keep the name they have always had (its roles' modules log here).
log = logging.getLogger("querator.storage.dynamodb.log")


#: How often a write that lost to a concurrent one is read again and retried before the call fails.
_RETRIES = 8
#: Rows read per page when a run is read backwards from its end (the first page reads one row: the
#: row holding a run's end often holds its start too).
_ROW_PAGE = 16
_US = 1_000_000
_ROW_TTL = timedelta(days=1)
_UNIQUE = 16**10
#: Records one instance remembers having claimed (``_settle_mine``); the oldest are forgotten.
_REMEMBERED = 4096


T = TypeVar("T")
R = TypeVar("R")
#: A batch write's result (``settle``'s names the ids its moves got as well).
Result = TypeVar("Result", bound="BatchResult[str]")
AttributeMap = dict[str, Any]


# -- keys -----------------------------------------------------------------------------------------


def _pk(key: LogKey) -> dict[str, str]:
    return {"S": schema.log_partition_key(key.queue, key.partition, key.lane)}


def _key(key: LogKey, sort_key: str) -> AttributeMap:
    return {schema.PK: _pk(key), schema.SK: {"S": sort_key}}


def _rows_pk(key: LogKey) -> dict[str, str]:
    """The partition key of the log's packed rows (``schema.log_rows_key``)."""
    return {"S": schema.log_rows_key(key.queue, key.partition, key.lane)}


def _row_key(key: LogKey, position: int) -> AttributeMap:
    return {schema.PK: _rows_pk(key), schema.SK: {"S": _row_sk(position)}}


def _row_sk(position: int) -> str:
    return f"{schema.LOG_ROW_PREFIX}{position:016x}"


def _record_sk(start: int, token: str) -> str:
    return f"{schema.LOG_RECORD_PREFIX}{start:016x}{token}"


def _expiry_sk(deadline_us: int, start: int, token: str) -> str:
    return f"{schema.LOG_EXPIRY_PREFIX}{deadline_us:014x}{start:016x}{token}"


def _schedule_sk(item_id: str, lane: str) -> str:
    # The scheduled id without its lane and mark: due time and unique suffix, so rows sort by due.
    return f"{schema.LOG_SCHEDULE_PREFIX}{item_id[len(lane) + 1 :]}"


def _scheduled_id_for(lane: str, item: Item) -> str:
    """The id ``item`` waits under in ``lane``'s schedule: its own when the service minted it (a
    scheduled id of the lane due at its ``enqueue_at``: items due together keep their order)."""
    assert item.enqueue_at is not None  # noqa: S101 - only scheduled items come here
    due_us = timestamp_us(item.enqueue_at)
    if parse_scheduled_id(item.id) == (lane, due_us):
        return item.id
    return scheduled_id(lane, due_us, secrets.randbelow(_UNIQUE))


def _row_position(attrs: AttributeMap) -> int:
    return int(attrs[schema.SK]["S"][1:17], 16)


def _row_length(attrs: AttributeMap) -> int:
    """Positions a row covers: its items, or a filler's count (one unless it says)."""
    if schema.LOG_FILLER in attrs:
        return int(attrs.get(schema.LOG_COUNT, {"N": "1"})["N"])
    return len(attrs.get(schema.LOG_ITEMS, {}).get("L", [])) or 1


def _num(value: int) -> dict[str, str]:
    return {"N": str(value)}


def _numbers(values: Iterable[int]) -> dict[str, list[str]]:
    return {"NS": [str(v) for v in sorted(values)]}


def _decoded_numbers(attrs: AttributeMap | None) -> set[int]:
    if not attrs or "NS" not in attrs:
        return set()
    return {int(v) for v in attrs["NS"]}


# -- item sizes and rows -----------------------------------------------------------------------------


#: Item sizes are bounded in steps of 2 ** (1 / SIZE_STEPS), 19 %: a claim sized by a step's bound
#: counts an item at most that much larger than it is.
SIZE_STEPS = 4


def size_step(size: int) -> int | None:
    """The step of sizes an item of ``Item.reply_size`` ``size`` is in; ``None`` under
    ``REPLY_SIZE_THRESHOLD``, which every item counts as anyway (``reply_bytes_at_most``)."""
    if size < REPLY_SIZE_THRESHOLD:
        return None
    step = math.ceil(SIZE_STEPS * math.log2(size))
    while step_bound(step) < size:  # float rounding: the bound must cover the size
        step += 1
    return step


def step_bound(step: int) -> int:
    """The largest size of ``step``."""
    return math.ceil(2 ** (step / SIZE_STEPS))


def _waiting_largest(attrs: AttributeMap, cursor: int) -> int:
    """The largest item that may wait after ``cursor``: the bound of every size step whose mark
    (where the last append with an item of that step ended) is past it. An append writes its mark
    in the write that takes its positions, so the bound covers them from the take, holes
    included; once the cursor passes a mark, nothing of that size waits (a retry or an expiry
    that puts one back marks it again). A head written before the marks has ``lg``, the largest
    item it was ever given, which keeps bounding it."""
    largest = _int(attrs, schema.LOG_LARGEST)
    for name, value in attrs.items():
        step = schema.size_mark_step(name)
        if step is not None and int(value["N"]) > cursor:
            largest = max(largest, step_bound(step))
    return largest


def _value_size(value: AttributeMap) -> int:
    """Bytes of an attribute value by DynamoDB's published rules (approximate for numbers)."""
    ((kind, body),) = value.items()
    if kind == "S":
        return len(body.encode())
    if kind == "B":
        return len(body)
    if kind == "N":
        return (len(body) + 1) // 2 + 1
    if kind == "M":
        return 3 + sum(len(name) + _value_size(v) + 1 for name, v in body.items())
    if kind == "L":
        return 3 + sum(_value_size(v) + 1 for v in body)
    if kind in ("NS", "SS"):
        return sum(len(v) for v in body)
    return 1


def _entry(item: Item) -> AttributeMap:
    """An item as a packed row holds it: the codec's map without keys (the id is the position) and
    without a lease deadline (a stored item waits; a lease's deadline lives in its record). A
    payload in the bucket is its object's key (``DynamoDBLogBase._stored`` put it there)."""
    attrs = codec.encode_item("", 0, item)
    for name in (schema.PK, schema.SK, schema.LEASE_DEADLINE):
        attrs.pop(name, None)
    if item.payload_object:
        attrs.pop(schema.PAYLOAD, None)
        attrs[schema.PAYLOAD_OBJECT] = {"S": item.payload_object}
    elif len(item.payload) > objects.ROW_PAYLOAD_BYTES:
        raise ValueError(f"a payload of {len(item.payload)} bytes must be stored in the bucket first")
    if not item.attempts:
        # Most items are stored never leased: 0 is what a missing count decodes to.
        attrs.pop(schema.ATTEMPTS, None)
    return attrs


def _seconds(items: Iterable[Item]) -> int:
    """The sum of ``items``' ``created_at`` in whole seconds (``LogAges``)."""
    return sum(timestamp_us(item.created_at) // _US for item in items)


def _entry_seconds(entries: Iterable[AttributeMap]) -> int:
    """``_seconds`` of items as rows hold them (``_entry``), without decoding them."""
    return sum(int(entry[schema.CREATED_AT]["N"]) // _US for entry in entries)


def _add_created(change: _Change, *, waiting: int = 0, leased: int = 0) -> None:
    """Add to a head's sums of creation times (``LogAges``) in ``change``."""
    if waiting:
        change.adds.append(f"{change.name(schema.LOG_WAITING_CREATED)} {change.value(_num(waiting))}")
    if leased:
        change.adds.append(f"{change.name(schema.LOG_LEASED_CREATED)} {change.value(_num(leased))}")


def _item(entry: AttributeMap, item_id: str) -> Item:
    """The item a row entry holds; one whose payload is in the bucket comes without it (its
    ``payload_object`` set): ``DynamoDBLogBase._with_payloads`` reads it."""
    item = codec.decode_item({**entry, schema.SK: {"S": item_id}})
    if schema.PAYLOAD_OBJECT in entry:
        return replace(item, payload_object=entry[schema.PAYLOAD_OBJECT]["S"])
    return item


def _entry_object(entry: AttributeMap) -> str | None:
    """The key of the object holding an entry's payload, if it has one."""
    value = entry.get(schema.PAYLOAD_OBJECT)
    return None if value is None else str(value["S"])


def _entry_payload_bytes(entry: AttributeMap) -> int:
    """An entry's payload size without reading its object (its reply size bounds it)."""
    payload = entry.get(schema.PAYLOAD)
    if payload is not None:
        return len(payload["B"])
    return int(entry.get(schema.PAYLOAD_SIZE, {"N": "0"})["N"])


def _objects_end(attrs: AttributeMap) -> int:
    """Where the last append holding an item that may have a payload object ended (its size
    step's mark, written with the positions it took): no position from there on holds an object,
    so what settles only those reads no row to find one. 0: the log never held one."""
    end = 0
    for name, value in attrs.items():
        step = schema.size_mark_step(name)
        if step is not None and step_bound(step) > objects.OBJECT_PAYLOAD_BYTES:
            end = max(end, int(value["N"]))
    return end


def _pack(entries: Sequence[AttributeMap]) -> list[range]:
    """Consecutive entries into rows of up to ``LOG_ROW_BYTES`` of encoded items, in order; an entry
    larger than that gets a row of its own."""
    rows: list[range] = []
    start, used = 0, 0
    for index, entry in enumerate(entries):
        size = _value_size({"M": entry}) + 1
        if index > start and used + size > schema.LOG_ROW_BYTES:
            rows.append(range(start, index))
            start, used = index, 0
        used += size
    if start < len(entries):
        rows.append(range(start, len(entries)))
    return rows


def _row(key: LogKey, first: int, entries: Sequence[AttributeMap], items: Sequence[Item]) -> AttributeMap:
    latest = max(item.expire_deadline for item in items)
    return {
        **_row_key(key, first),
        schema.LOG_ITEMS: {"L": [{"M": entry} for entry in entries]},
        # DynamoDB's TTL deletes the row free (within ~48 h) a day after its last item expired.
        schema.TTL: _num(int((latest + _ROW_TTL).timestamp())),
    }


def _filler(key: LogKey, position: int, now: datetime, count: int = 1) -> AttributeMap:
    """A filler row. A lease fills one position per row (a late writer's row may start at any of
    them); only a writer giving up positions of its own fills several with one (``count``)."""
    attrs = {
        **_row_key(key, position),
        schema.LOG_FILLER: {"BOOL": True},
        schema.TTL: _num(int((now + _ROW_TTL).timestamp())),
    }
    if count > 1:
        attrs[schema.LOG_COUNT] = _num(count)
    return attrs


# -- what the head and records say ----------------------------------------------------------------


@dataclass
class _Record:
    token: str
    start: int
    count: int
    deadline: int
    claimed_at: int
    version: int = 0
    settled: set[int] = field(default_factory=set)
    #: A split-off record's positions (else the run [start, start + count)).
    explicit: set[int] | None = None
    #: Positions that were holes when claimed and are not collected yet.
    holes: set[int] = field(default_factory=set)
    #: The ``P`` row's sort key of a spilled record; ``""``: in the head.
    spilled: str = ""
    #: The sum of its unsettled items' ``created_at`` seconds (``LogAges``), written once the claim
    #: has read them.
    created: int = 0
    #: Open positions given the priority they go back with (``set_next_priority``): position ->
    #: priority. Written for open positions only, so settled and split-off ones drop out.
    priorities: dict[int, int] = field(default_factory=dict)

    def positions(self) -> list[int]:
        if self.explicit is not None:
            return sorted(self.explicit)
        return list(range(self.start, self.start + self.count))

    def holds(self, position: int) -> bool:
        if self.explicit is not None:
            return position in self.explicit
        return self.start <= position < self.start + self.count

    def open(self) -> list[int]:
        return [p for p in self.positions() if p not in self.settled]

    def fields(self) -> AttributeMap:
        attrs: AttributeMap = {
            schema.LOG_COUNT: _num(self.count),
            schema.LOG_DEADLINE: _num(self.deadline),
            schema.LOG_VERSION: _num(self.version),
        }
        if self.holes:
            # Only a record with holes needs its claim time (HOLE_TIMEOUT runs from it): every
            # byte of a record is paid by each write of the head.
            attrs[schema.LOG_CLAIMED_AT] = _num(self.claimed_at)
        if self.settled:
            attrs[schema.LOG_SETTLED] = _numbers(self.settled)
        if self.explicit is not None:
            attrs[schema.LOG_POSITIONS] = _numbers(self.explicit)
        if self.holes:
            attrs[schema.LOG_HOLES] = _numbers(self.holes)
        if self.created:
            attrs[schema.LOG_RECORD_CREATED] = _num(self.created)
        if self.priorities:
            given = {p: n for p, n in self.priorities.items() if self.holds(p) and p not in self.settled}
            if given:
                attrs[schema.LOG_PRIORITIES] = {"M": {str(p): _num(n) for p, n in sorted(given.items())}}
        return attrs

    def coming(self, item: Item, position: int) -> Item:
        """``item`` at ``position`` of this record with the priority it goes back with, if given."""
        priority = self.priorities.get(position)
        return item if priority is None else replace(item, next_priority=priority)


def _decode_record(token: str, start: int, attrs: AttributeMap, spilled: str = "") -> _Record:
    explicit = attrs.get(schema.LOG_POSITIONS)
    return _Record(
        token=token,
        start=start,
        count=int(attrs[schema.LOG_COUNT]["N"]),
        deadline=int(attrs[schema.LOG_DEADLINE]["N"]),
        claimed_at=int(attrs.get(schema.LOG_CLAIMED_AT, {"N": "0"})["N"]),
        version=int(attrs.get(schema.LOG_VERSION, {"N": "0"})["N"]),
        settled=_decoded_numbers(attrs.get(schema.LOG_SETTLED)),
        explicit=_decoded_numbers(explicit) if explicit else None,
        holes=_decoded_numbers(attrs.get(schema.LOG_HOLES)),
        spilled=spilled,
        created=_int(attrs, schema.LOG_RECORD_CREATED),
        priorities={
            int(p): int(n["N"]) for p, n in attrs.get(schema.LOG_PRIORITIES, {}).get("M", {}).items()
        },
    )


def _decode_spilled(attrs: AttributeMap) -> _Record:
    return _decode_record(
        attrs[schema.LOG_TOKEN]["S"], int(attrs[schema.LOG_START]["N"]), attrs, attrs[schema.SK]["S"]
    )


@dataclass
class _Head:
    exists: bool = False
    tail: int = 0
    cursor: int = 0
    records: dict[str, _Record] = field(default_factory=dict)
    tombstones: set[int] = field(default_factory=set)
    leased: int = 0
    spilled: int = 0
    spilled_expiry: int | None = None
    scheduled: int = 0
    next_due: int | None = None
    schedule_version: int = 0
    largest: int = 0
    first: int = 0
    produced: int = 0
    completed: int = 0
    waiting_created: int = 0
    leased_created: int = 0
    #: ``_objects_end``: positions before it may hold a payload object.
    objects_end: int = 0

    def find(self, position: int) -> _Record | None:
        for record in self.records.values():
            if record.holds(position) and position not in record.settled:
                return record
        return None


def _int(attrs: AttributeMap, name: str) -> int:
    value = attrs.get(name)
    return 0 if value is None else int(value["N"])


def _decode_head(attrs: AttributeMap | None) -> _Head:
    if not attrs:
        return _Head()
    starts = attrs.get(schema.LOG_STARTS, {}).get("M", {})
    records = {
        token: _decode_record(token, int(starts[token]["N"]), value["M"])
        for token, value in attrs.get(schema.LOG_RECORDS, {}).get("M", {}).items()
        if token in starts
    }
    return _Head(
        exists=schema.LOG_TAIL in attrs,
        tail=_int(attrs, schema.LOG_TAIL),
        cursor=_int(attrs, schema.LOG_CURSOR),
        records=records,
        tombstones=_decoded_numbers(attrs.get(schema.LOG_TOMBSTONES)),
        leased=_int(attrs, schema.LOG_LEASED),
        spilled=_int(attrs, schema.LOG_SPILLED),
        spilled_expiry=_int(attrs, schema.LOG_SPILLED_EXPIRY) if schema.LOG_SPILLED_EXPIRY in attrs else None,
        scheduled=_int(attrs, schema.LOG_SCHEDULED),
        next_due=_int(attrs, schema.LOG_NEXT_DUE) if schema.LOG_NEXT_DUE in attrs else None,
        schedule_version=_int(attrs, schema.LOG_SCHEDULE_VERSION),
        largest=_waiting_largest(attrs, _int(attrs, schema.LOG_CURSOR)),
        first=_int(attrs, schema.LOG_FIRST),
        produced=_int(attrs, schema.LOG_PRODUCED),
        completed=_int(attrs, schema.LOG_COMPLETED),
        waiting_created=_int(attrs, schema.LOG_WAITING_CREATED),
        leased_created=_int(attrs, schema.LOG_LEASED_CREATED),
        objects_end=_objects_end(attrs),
    )


def _ordered(result: Result, asked: Sequence[str]) -> Result:
    """``result`` with its ids in the order they were asked for (records are written one at a time)."""
    order = {item_id: n for n, item_id in reversed(list(enumerate(asked)))}
    result.applied.sort(key=lambda i: order.get(i, len(order)))
    result.rejected.sort(key=lambda i: order.get(i, len(order)))
    return result


# -- one item's change, built up by parts (two parts of one transaction may touch one item) ----------


class _Change:
    """An ``UpdateItem`` on one row, assembled from parts with unique placeholders."""

    def __init__(self, key: AttributeMap) -> None:
        self.key = key
        self.sets: list[str] = []
        self.removes: list[str] = []
        self.adds: list[str] = []
        self.deletes: list[str] = []
        self.conditions: list[str] = []
        self.names: dict[str, str] = {}
        self.values: dict[str, Any] = {}

    def name(self, *parts: str) -> str:
        """A document path of ``parts`` (``ls``, a token, ``x``) in placeholders."""
        aliases = []
        for part in parts:
            alias = next((a for a, n in self.names.items() if n == part), None)
            if alias is None:
                alias = f"#n{len(self.names)}"
                self.names[alias] = part
            aliases.append(alias)
        return ".".join(aliases)

    def value(self, value: Any) -> str:
        alias = f":v{len(self.values)}"
        self.values[alias] = value
        return alias

    def kwargs(self, table: str) -> dict[str, Any]:
        clauses = []
        for word, parts in (
            ("SET", self.sets),
            ("REMOVE", self.removes),
            ("ADD", self.adds),
            ("DELETE", self.deletes),
        ):
            if parts:
                clauses.append(f"{word} {', '.join(parts)}")
        request: dict[str, Any] = {"TableName": table, "Key": self.key, "UpdateExpression": " ".join(clauses)}
        if self.conditions:
            request["ConditionExpression"] = " AND ".join(f"({c})" for c in self.conditions)
        # Only the placeholders used: DynamoDB refuses unused ones (a part may name one and not use it).
        used = set(
            re.findall(r"[#:][nv]\d+", " ".join(v for k, v in request.items() if k.endswith("Expression")))
        )
        if names := {a: n for a, n in self.names.items() if a in used}:
            request["ExpressionAttributeNames"] = names
        if values := {a: v for a, v in self.values.items() if a in used}:
            request["ExpressionAttributeValues"] = values
        return request


class _ConflictError(Exception):
    """A conditional write lost to a concurrent one: read again and retry."""


@dataclass
class _Found:
    """What the rows of some positions say: items written, positions filled, and the rest (holes)."""

    items: dict[int, AttributeMap] = field(default_factory=dict)
    filled: set[int] = field(default_factory=set)


if TYPE_CHECKING:
    # The role mixins call one another's methods (a delete settles what is leased): typed as the port.
    _Port = ClaimLog
else:
    _Port = object


class DynamoDBLogBase(_Port):
    """What the role mixins share: the client, the table, the thread pool, the records this instance
    claimed; and the requests and steps several roles take."""

    def __init__(
        self,
        client: DynamoDBClient,
        items_table: str,
        *,
        concurrency: int = WRITE_CONCURRENCY,
        sleep: Callable[[float], None] = time.sleep,
        payloads: PayloadObjects | None = None,
    ) -> None:
        #: The bucket for payloads over ``OBJECT_PAYLOAD_BYTES`` (``objects``); ``None``: none, so
        #: payloads stay in their rows, up to a row's.
        self._objects = payloads
        self._client = translating_no_reply(client)
        self._table = items_table
        self._concurrency = concurrency
        self._sleep = sleep
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        #: Records this instance claimed, as it last wrote them, and their positions: a complete by
        #: the consumer that leased (the usual case) writes without reading the head first.
        self._mine: OrderedDict[tuple[LogKey, str], _Record] = OrderedDict()
        self._mine_at: dict[tuple[LogKey, int], str] = {}

    @property
    def payloads(self) -> PayloadObjects | None:
        """The payload bucket, if the log has one."""
        return self._objects

    @property
    def payload_limit(self) -> int:
        """The largest payload this log stores: 1 MiB with a payload bucket, a row's without."""
        return MAX_PAYLOAD_BYTES if self._objects is not None else objects.ROW_PAYLOAD_BYTES

    def _stored(self, items: Sequence[Item]) -> tuple[list[Item], list[str], list[str]]:
        """``items`` ready for rows: a payload over ``OBJECT_PAYLOAD_BYTES`` put in the bucket (kept until its
        item's row goes), an object whose time ends before its item's now does (a dead letter, a
        redrive) copied to a later one. Returns the items, the objects made and those replaced
        (released once the write holding the copies is done)."""
        made: list[str] = []
        replaced: list[str] = []
        out: list[Item] = []
        try:
            for given in items:
                item = given
                until = item.expire_deadline + _ROW_TTL
                if item.payload_object:
                    if objects.keep_until(item.payload_object) < until.timestamp():
                        assert self._objects is not None  # noqa: S101 - only a bucket makes objects
                        copy = self._objects.copy(item.payload_object, until)
                        made.append(copy)
                        replaced.append(item.payload_object)
                        item = replace(item, payload_object=copy)
                elif self._objects is not None and len(item.payload) > objects.OBJECT_PAYLOAD_BYTES:
                    # Without a bucket a payload stays in its row (``_entry`` refuses one over a
                    # row's; the service checks ``payload_limit`` first).
                    key = self._objects.put(item.payload, until)
                    made.append(key)
                    item = replace(item, payload_object=key)
                out.append(item)
        except QueratorError:
            # Nothing names what this call made yet: delete it now rather than leave it to the sweep.
            self._release(made, "upload")
            raise
        return out, made, replaced

    def _with_payloads(self, items: list[Item]) -> list[Item]:
        """``items`` with the payloads of those in the bucket read (several at once). An object
        already swept (its item a day past its expiry, not yet dead-lettered) reads as empty."""
        keys = [item.payload_object for item in items if item.payload_object and not item.payload]
        if not keys:
            return items
        if self._objects is None:
            raise ValueError("rows name payload objects, but this store has no payload bucket")
        got = self._objects.get_many(keys)
        out: list[Item] = []
        for item in items:
            if not item.payload_object or item.payload:
                out.append(item)
            elif (payload := got.get(item.payload_object)) is None:
                log.error("payload object missing", extra={"item_id": item.id})
                out.append(replace(item, payload_object=""))
            else:
                out.append(replace(item, payload=payload))
        return out

    def _release(self, keys: Iterable[str], operation: str) -> None:
        """Delete the objects of items that ended (``PayloadObjects.release``)."""
        if self._objects is not None:
            self._objects.release(keys, operation)

    def _release_positions(self, key: LogKey, head: _Head, positions: Iterable[int], operation: str) -> None:
        """Delete the objects of the items at ``positions``, which ended (completed, deleted,
        dropped): their rows are read only when positions before the head's ``objects_end`` are
        among them. The rows are write-once, so they still say what the items held."""
        if self._objects is None:
            return
        wanted = sorted(p for p in positions if p < head.objects_end)
        if not wanted:
            return
        found = self._read_positions(key, wanted, operation, consistent=False)
        self._release((k for e in found.items.values() if (k := _entry_object(e)) is not None), operation)

    def _each(self, function: Callable[[T], R], values: Sequence[T]) -> list[R]:
        """``function`` over ``values`` with up to ``concurrency`` in flight (results in order); the
        first error is raised once every call has ended."""
        if len(values) <= 1 or self._concurrency <= 1:
            return [function(v) for v in values]
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._concurrency, thread_name_prefix="querator-log")
            pool = self._pool
        futures = [pool.submit(function, v) for v in values]
        results: list[R] = []
        error: BaseException | None = None
        for future in futures:
            try:
                results.append(future.result())
            except BaseException as exc:  # raised below, once every call has ended
                error = error or exc
        if error is not None:
            raise error
        return results

    def _update(self, change: _Change, operation: str, *, returns: str = "NONE") -> AttributeMap | None:
        """Apply ``change``; ``None`` when its condition failed, else the returned attributes."""
        try:
            reply = self._client.update_item(**change.kwargs(self._table), ReturnValues=returns)  # type: ignore[arg-type]
        except ClientError as exc:
            if error_code(exc) == CONDITION_FAILED:
                return None
            raise translate(exc, operation) from exc
        return codec.returned(reply, "Attributes") or {}

    def _put_absent(self, attrs: AttributeMap, operation: str) -> bool:
        try:
            self._client.put_item(
                TableName=self._table,
                Item=attrs,
                ConditionExpression="attribute_not_exists(#sk)",
                ExpressionAttributeNames={"#sk": schema.SK},
            )
        except ClientError as exc:
            if error_code(exc) == CONDITION_FAILED:
                return False
            raise translate(exc, operation) from exc
        return True

    def _transact(self, actions: list[AttributeMap], operation: str) -> None:
        """One transaction; ``_ConflictError`` when a condition failed or it lost to another one."""
        if len(actions) == 1 and ("Update" in actions[0] or "Put" in actions[0]):
            # One item needs no transaction (which costs twice the units).
            try:
                if "Update" in actions[0]:
                    self._client.update_item(**actions[0]["Update"])
                else:
                    self._client.put_item(**actions[0]["Put"])
            except ClientError as exc:
                if error_code(exc) == CONDITION_FAILED:
                    raise _ConflictError from exc
                raise translate(exc, operation) from exc
            return
        try:
            transaction: Any = actions
            self._client.transact_write_items(TransactItems=transaction)
        except ClientError as exc:
            reasons = [r.get("Code", "") for r in exc.response.get("CancellationReasons", [])]
            if error_code(exc) == "TransactionCanceledException" and (
                "ConditionalCheckFailed" in reasons or "TransactionConflict" in reasons
            ):
                raise _ConflictError from exc
            raise translate(exc, operation) from exc

    def _commit(self, changes: Sequence[_Change], actions: list[AttributeMap], operation: str) -> None:
        """``changes`` (those with anything to do) and ``actions`` as one atomic step."""
        updates = [
            {"Update": c.kwargs(self._table)} for c in changes if c.sets or c.removes or c.adds or c.deletes
        ]
        self._transact([*updates, *actions], operation)

    def _backoff(self, attempt: int) -> None:
        self._sleep(random.uniform(0, min(0.2, 0.005 * 2**attempt)))  # noqa: S311

    def _read_head_attrs(self, key: LogKey, operation: str) -> AttributeMap | None:
        try:
            reply = self._client.get_item(
                TableName=self._table, Key=_key(key, schema.LOG_HEAD_SK), ConsistentRead=True
            )
        except ClientError as exc:
            raise translate(exc, operation) from exc
        return codec.returned(reply, "Item")

    def _head(self, key: LogKey, operation: str) -> _Head:
        return _decode_head(self._read_head_attrs(key, operation))

    def _query(
        self, operation: str, *, consistent: bool = True, **kwargs: Any
    ) -> tuple[list[AttributeMap], AttributeMap | None]:
        try:
            reply = self._client.query(TableName=self._table, ConsistentRead=consistent, **kwargs)
        except ClientError as exc:
            raise translate(exc, operation) from exc
        return codec.rows(reply), codec.last_key(reply)

    def _batch_get(self, keys: list[AttributeMap], operation: str) -> list[AttributeMap]:
        found: list[AttributeMap] = []
        for start in range(0, len(keys), BATCH_GET_LIMIT):
            pending: list[Any] = keys[start : start + BATCH_GET_LIMIT]
            for attempt in range(_RETRIES + 1):
                try:
                    reply: Any = self._client.batch_get_item(
                        RequestItems={self._table: {"Keys": pending, "ConsistentRead": True}}
                    )
                except ClientError as exc:
                    raise translate(exc, operation) from exc
                found.extend(codec.table_part(reply, "Responses", self._table))
                pending = codec.unprocessed_keys(reply, self._table)
                if not pending:
                    break
                if attempt == _RETRIES:
                    raise StoreThrottledError(
                        f"the store left {len(pending)} reads of {operation} unprocessed"
                    )
                self._backoff(attempt)
        return found

    def _batch_delete(self, keys: list[AttributeMap], operation: str) -> None:
        write_batches(
            self._client,
            self._table,
            [{"DeleteRequest": {"Key": k}} for k in keys],
            operation,
            sleep=self._sleep,
        )

    def _rows_back(
        self, key: LogKey, first: int, last: int, operation: str, *, consistent: bool = True
    ) -> list[AttributeMap]:
        """The rows holding positions ``first`` .. ``last``, read backwards from ``last`` to the row
        that starts at or before ``first``, in position order.

        Rows live under the log's rows key. A log written before they had a key of their own keeps
        its earlier rows under the head's: when the rows key has none at or before ``first``, the
        rest is read there (one more Query, only then: a hole at a run's start pays it too)."""
        rows = self._rows_back_in(_rows_pk(key), first, last, operation, consistent=consistent)
        if rows and _row_position(rows[0]) <= first:
            return rows
        below = _row_position(rows[0]) - 1 if rows else last
        earlier = self._rows_back_in(_pk(key), first, below, operation, consistent=consistent)
        return earlier + rows

    def _rows_back_in(
        self, pk: dict[str, str], first: int, last: int, operation: str, *, consistent: bool
    ) -> list[AttributeMap]:
        """``_rows_back`` under one partition key."""
        rows: list[AttributeMap] = []
        start_key: AttributeMap | None = None
        limit = 1
        while True:
            kwargs: dict[str, Any] = {
                "KeyConditionExpression": "#pk = :pk AND #sk BETWEEN :lo AND :hi",
                "ExpressionAttributeNames": {"#pk": schema.PK, "#sk": schema.SK},
                "ExpressionAttributeValues": {
                    ":pk": pk,
                    ":lo": {"S": schema.LOG_ROW_PREFIX},
                    ":hi": {"S": _row_sk(last)},
                },
                "ScanIndexForward": False,
                # A Query pays for every row up to its limit: the first page reads one row (it
                # often holds the whole run), the next ones as many as rows of that size would
                # take to reach ``first``.
                "Limit": limit,
            }
            if start_key is not None:
                kwargs["ExclusiveStartKey"] = start_key
            page, start_key = self._query(operation, consistent=consistent, **kwargs)
            for row in page:
                rows.append(row)
                if _row_position(row) <= first:
                    return rows[::-1]
            if start_key is None or not rows:
                return rows[::-1]
            short = _row_position(rows[-1]) - first
            limit = max(1, min(_ROW_PAGE, -(-short // _row_length(rows[-1]))))

    def _rows_forward(self, key: LogKey, position: int, limit: int) -> list[AttributeMap]:
        """Rows from the one holding ``position`` on, up to a page."""
        back = self._rows_back(key, position, position, "list")
        first = back[0] if back else None
        # Rows under the log's rows key; a log written before they had a key of their own keeps
        # its earlier ones under the head's, so a listing that starts among those reads both.
        keys = [_rows_pk(key)]
        if first is not None and first[schema.PK] == _pk(key):
            keys.insert(0, _pk(key))
        rows = []
        for pk in keys:
            page, _ = self._query(
                "list",
                KeyConditionExpression="#pk = :pk AND #sk BETWEEN :lo AND :hi",
                ExpressionAttributeNames={"#pk": schema.PK, "#sk": schema.SK},
                ExpressionAttributeValues={
                    ":pk": pk,
                    ":lo": {"S": _row_sk(position + 1)},
                    ":hi": {"S": f"{schema.LOG_ROW_PREFIX}~"},
                },
                Limit=max(1, min(limit, _ROW_PAGE)),
            )
            rows += page
        rows = sorted(rows, key=_row_position)[: max(1, min(limit, _ROW_PAGE))]
        if first is not None:
            at = _row_position(first)
            length = _row_length(first)
            if at + length > position:
                rows = [first, *rows]
        return rows

    @staticmethod
    def _read(rows: Iterable[AttributeMap], wanted: Iterable[int]) -> _Found:
        """What ``rows`` say of the ``wanted`` positions (absent from both maps: a hole)."""
        want = set(wanted)
        found = _Found()
        for row in rows:
            at = _row_position(row)
            if schema.LOG_FILLER in row:
                found.filled.update(p for p in range(at, at + _row_length(row)) if p in want)
                continue
            for offset, entry in enumerate(row.get(schema.LOG_ITEMS, {}).get("L", [])):
                if at + offset in want:
                    found.items[at + offset] = entry["M"]
        return found

    def _read_positions(
        self, key: LogKey, positions: Sequence[int], operation: str, *, consistent: bool = True
    ) -> _Found:
        if not positions:
            return _Found()
        rows = self._rows_back(key, min(positions), max(positions), operation, consistent=consistent)
        return self._read(rows, positions)

    def _fill(self, key: LogKey, holes: Sequence[int], now: datetime, *, first: int) -> _Found:
        """Fill ``holes`` (positions nobody wrote) with a filler row each, ascending from where the
        hole begins (after the last row below it; ``first``, the log's first position, if none):
        what each of them is now, filled or written (a writer got in first).

        Not from the lowest hole alone: a late writer whose row starts below it (in another
        claim's run) would find its first position free and land over a filled one.
        """
        if not holes:
            return _Found()
        lowest, highest = min(holes), max(holes)
        rows = self._rows_back(key, lowest, highest, "fill")
        covered: set[int] = set()
        begin = first
        for row in rows:
            at, length = _row_position(row), _row_length(row)
            covered.update(range(at, at + length))
            if at <= lowest:
                begin = at + length
        begin = min(begin, lowest)
        mine: set[int] = set()
        position = begin
        while position <= highest:
            if position in covered:
                position += 1
                continue
            if self._put_absent(_filler(key, position, now), "fill"):
                mine.add(position)
                position += 1
                continue
            # A writer got there first: its row covers what follows its first position.
            written = self._get_row(key, position)
            if written is not None:
                rows.append(written)
                covered.update(range(position, position + _row_length(written)))
            position += 1
        rows.sort(key=_row_position)
        found = self._read(rows, holes)
        found.filled |= mine & set(holes)
        return found

    def _get_row(self, key: LogKey, position: int) -> AttributeMap | None:
        try:
            reply = self._client.get_item(
                TableName=self._table, Key=_row_key(key, position), ConsistentRead=True
            )
        except ClientError as exc:
            raise translate(exc, "fill") from exc
        return codec.returned(reply, "Item")

    @staticmethod
    def _position(key: LogKey, item_id: str) -> int:
        parsed = parse_position_id(item_id)
        if parsed is None or parsed[0] != key.lane:
            raise ValueError(f"not a position of this log: {item_id!r}")
        return parsed[1]

    def _spilled_row(self, key: LogKey, record: _Record, sk: str) -> AttributeMap:
        return {
            **_key(key, sk),
            **record.fields(),
            schema.LOG_TOKEN: {"S": record.token},
            schema.LOG_START: _num(record.start),
        }

    def _expiry_row(self, key: LogKey, record: _Record, sk: str) -> AttributeMap:
        return {
            **_key(key, _expiry_sk(record.deadline, record.start, record.token)),
            schema.LOG_RECORD_REF: {"S": sk},
        }

    def _spilled_holding(self, key: LogKey, position: int, operation: str) -> _Record | None:
        """The spilled record holding ``position`` unsettled: one Query on ``P`` up to it, descending
        (a split-off record's explicit positions can interleave with its origin's: page on)."""
        start_key: AttributeMap | None = None
        for _ in range(_RETRIES):
            kwargs: dict[str, Any] = {
                "KeyConditionExpression": "#pk = :pk AND #sk BETWEEN :lo AND :hi",
                "ExpressionAttributeNames": {"#pk": schema.PK, "#sk": schema.SK},
                "ExpressionAttributeValues": {
                    ":pk": _pk(key),
                    ":lo": {"S": schema.LOG_RECORD_PREFIX},
                    ":hi": {"S": f"{schema.LOG_RECORD_PREFIX}{position:016x}~"},
                },
                "ScanIndexForward": False,
                "Limit": 1 if start_key is None else 4,
            }
            if start_key is not None:
                kwargs["ExclusiveStartKey"] = start_key
            rows, start_key = self._query(operation, **kwargs)
            for row in rows:
                record = _decode_spilled(row)
                if record.holds(position) and position not in record.settled:
                    return record
                if record.explicit is None and record.start + record.count <= position:
                    return None  # runs do not overlap: no earlier record holds it
            if start_key is None:
                return None
        return None

    def _every_spilled(self, key: LogKey, operation: str) -> Iterator[_Record]:
        """Every spilled record of the log, a page of ``P`` rows at a time: O(leases spilled), for
        the rare calls that cannot name the one they need."""
        start_key: AttributeMap | None = None
        while True:
            kwargs: dict[str, Any] = {
                "KeyConditionExpression": "#pk = :pk AND begins_with(#sk, :p)",
                "ExpressionAttributeNames": {"#pk": schema.PK, "#sk": schema.SK},
                "ExpressionAttributeValues": {":pk": _pk(key), ":p": {"S": schema.LOG_RECORD_PREFIX}},
            }
            if start_key is not None:
                kwargs["ExclusiveStartKey"] = start_key
            rows, start_key = self._query(operation, **kwargs)
            yield from (_decode_spilled(row) for row in rows)
            if start_key is None:
                return

    def _locate(
        self, key: LogKey, head: _Head, positions: Iterable[int], operation: str
    ) -> dict[int, _Record]:
        found: dict[int, _Record] = {}
        spilled: list[_Record] = []
        for position in positions:
            record = head.find(position) if position < head.cursor else None
            if record is None and position < head.cursor and head.spilled:
                record = next((r for r in spilled if r.holds(position) and position not in r.settled), None)
                if record is None:
                    record = self._spilled_holding(key, position, operation)
                    if record is not None:
                        spilled.append(record)
            if record is not None:
                found[position] = record
        return found

    def _record_change(
        self,
        key: LogKey,
        record: _Record,
        head_change: _Change,
        actions: list[AttributeMap],
        *,
        settled: set[int],
        deadline: int | None = None,
        count: bool = True,
    ) -> int:
        """The parts that settle ``settled`` of ``record`` (or move its deadline), conditional on its
        version: in ``head_change`` for a record in the head, else as actions on its rows. Returns
        the ``created`` seconds that left the record with ``settled`` (``count``: the leased sum's
        too; else they move to another record, a renew's split)."""
        leased = head_change.name(schema.LOG_LEASED)
        updated = replace(
            record, settled=record.settled | settled, holes=record.holes - settled, version=record.version + 1
        )
        if deadline is not None:
            updated.deadline = deadline
        gone = not updated.open()
        # What their items' ages added: all of the record's when nothing is left of it, else read
        # from their rows (holes have no item yet).
        written = settled - record.holes
        dropped = record.created if gone else (self._created_at(key, written) if written else 0)
        # Never more than the record holds (one whose claim could not note its sum holds none).
        dropped = min(dropped, record.created)
        updated.created = record.created - dropped
        if settled and count:
            head_change.adds.append(f"{leased} {head_change.value(_num(-len(settled)))}")
            _add_created(head_change, leased=-dropped)
        if not record.spilled:
            path = head_change.name(schema.LOG_RECORDS, record.token)
            version = head_change.name(schema.LOG_RECORDS, record.token, schema.LOG_VERSION)
            head_change.conditions.append(f"{version} = {head_change.value(_num(record.version))}")
            if gone:
                head_change.removes += [path, head_change.name(schema.LOG_STARTS, record.token)]
            else:
                head_change.sets.append(f"{path} = {head_change.value({'M': updated.fields()})}")
            return dropped
        version_condition = {
            "ConditionExpression": "#v = :v",
            "ExpressionAttributeNames": {"#v": schema.LOG_VERSION},
            "ExpressionAttributeValues": {":v": _num(record.version)},
        }
        old_expiry = _key(key, _expiry_sk(record.deadline, record.start, record.token))
        if gone:
            actions.append(
                {"Delete": {"TableName": self._table, "Key": _key(key, record.spilled), **version_condition}}
            )
            actions.append({"Delete": {"TableName": self._table, "Key": old_expiry}})
            head_change.adds.append(f"{head_change.name(schema.LOG_SPILLED)} {head_change.value(_num(-1))}")
            return dropped
        row = {**self._spilled_row(key, updated, record.spilled)}
        actions.append({"Put": {"TableName": self._table, "Item": row, **version_condition}})
        if updated.deadline != record.deadline:
            actions.append({"Delete": {"TableName": self._table, "Key": old_expiry}})
            actions.append(
                {"Put": {"TableName": self._table, "Item": self._expiry_row(key, updated, record.spilled)}}
            )
        return dropped

    def _created_at(self, key: LogKey, positions: Iterable[int]) -> int:
        """The ``created`` seconds of the items at ``positions`` (rows are written once: an
        eventually consistent read)."""
        found = self._read_positions(key, sorted(positions), "settle", consistent=False)
        return _entry_seconds(found.items.values())

    def _appends(
        self,
        key: LogKey,
        head: _Head,
        head_change: _Change,
        targets: dict[LogKey, list[Item]],
        now: datetime,
        actions: list[AttributeMap],
        assigned: dict[LogKey, list[str]] | None = None,
    ) -> list[_Change]:
        """The parts that append ``targets`` (items by log) atomically with the rest: each target
        head's tail moved ``:t -> :t + n`` conditionally, rows put at those positions, scheduled
        items put in the schedule. Returns the other logs' head changes (``head_change`` takes this
        log's parts: one transaction may not touch an item twice). ``assigned`` takes each
        target's ids, in the order of its items (theirs once the parts are committed)."""
        now_us = timestamp_us(now)
        others: list[_Change] = []
        for target, given in targets.items():
            # The settle stored its items already; promote's keep their objects.
            items, _, _ = self._stored(given)
            change = head_change if target == key else _Change(_key(target, schema.LOG_HEAD_SK))
            state = head if target == key else self._head(target, "move")
            ready = [i for i in items if i.enqueue_at is None or i.enqueue_at <= now]
            later = [i for i in items if i.enqueue_at is not None and i.enqueue_at > now]
            tail = change.name(schema.LOG_TAIL)
            ready_ids: list[str] = []
            later_ids: list[str] = []
            if ready:
                first = state.tail if state.exists else now_us
                ready_ids = [position_id(target.lane, first + n) for n in range(len(ready))]
                if state.exists:
                    change.conditions.append(f"{tail} = {change.value(_num(first))}")
                else:
                    change.conditions.append(f"attribute_not_exists({tail})")
                    empty = change.value({"M": {}})
                    change.sets += [
                        f"{change.name(schema.LOG_CURSOR)} = {change.value(_num(first))}",
                        f"{change.name(schema.LOG_FIRST)} = {change.value(_num(first))}",
                        f"{change.name(schema.LOG_RECORDS)} = {empty}",
                        f"{change.name(schema.LOG_STARTS)} = {empty}",
                    ]
                change.sets.append(f"{tail} = {change.value(_num(first + len(ready)))}")
                _add_created(change, waiting=_seconds(ready))
                entries = [_entry(i) for i in ready]
                for span in _pack(entries):
                    row = _row(
                        target, first + span.start, [entries[i] for i in span], [ready[i] for i in span]
                    )
                    actions.append(
                        {
                            "Put": {
                                "TableName": self._table,
                                "Item": row,
                                "ConditionExpression": "attribute_not_exists(#sk)",
                                "ExpressionAttributeNames": {"#sk": schema.SK},
                            }
                        }
                    )
                step = size_step(max(i.reply_size() for i in ready))
                if step is not None:
                    # Where the step's items end, in the same step as the tail (which it is
                    # conditional on, so the mark only grows).
                    end = change.value(_num(first + len(ready)))
                    change.sets.append(f"{change.name(schema.log_size_mark(step))} = {end}")
            if later:
                for item in later:
                    item_id = _scheduled_id_for(target.lane, item)
                    later_ids.append(item_id)
                    actions.append(
                        {
                            "Put": {
                                "TableName": self._table,
                                "Item": {**_key(target, _schedule_sk(item_id, target.lane)), **_entry(item)},
                            }
                        }
                    )
                change.adds += [
                    f"{change.name(schema.LOG_SCHEDULED)} {change.value(_num(len(later)))}",
                    f"{change.name(schema.LOG_SCHEDULE_VERSION)} {change.value(_num(1))}",
                ]
                earliest = min(timestamp_us(i.enqueue_at) for i in later if i.enqueue_at is not None)
                if state.next_due is None or state.scheduled == 0 or state.next_due > earliest:
                    # Lowered only from the schedule version read, so a bound is never raised.
                    sv = change.name(schema.LOG_SCHEDULE_VERSION)
                    change.sets.append(f"{change.name(schema.LOG_NEXT_DUE)} = {change.value(_num(earliest))}")
                    if state.schedule_version:
                        change.conditions.append(f"{sv} = {change.value(_num(state.schedule_version))}")
                    else:
                        change.conditions.append(f"attribute_not_exists({sv})")
            if change is not head_change:
                others.append(change)
            if assigned is not None:
                now_ids, later_ones = iter(ready_ids), iter(later_ids)
                assigned[target] = [
                    next(later_ones) if i.enqueue_at is not None and i.enqueue_at > now else next(now_ids)
                    for i in items
                ]
        return others

    def _remember(self, key: LogKey, record: _Record) -> None:
        with self._pool_lock:
            self._mine[key, record.token] = record
            for position in record.open():
                self._mine_at[key, position] = record.token
            while len(self._mine) > _REMEMBERED:
                (old_key, _), old = self._mine.popitem(last=False)
                for position in old.positions():
                    self._mine_at.pop((old_key, position), None)

    def _forget(self, key: LogKey, record: _Record) -> None:
        with self._pool_lock:
            self._mine.pop((key, record.token), None)
            for position in record.positions():
                self._mine_at.pop((key, position), None)
