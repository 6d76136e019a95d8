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
"""

from __future__ import annotations

import logging
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
from querator.domain.model import timestamp_us, utc_from_timestamp_us
from querator.domain.positions import (
    HOLE_TIMEOUT_S,
    POSITION_MARK,
    SCHEDULED_MARK,
    parse_position_id,
    parse_scheduled_id,
    position_id,
    scheduled_id,
)
from querator.ports import BatchResult, Guard
from querator.ports.log import (
    Claim,
    ClaimReadError,
    LeaseRun,
    LogAges,
    LogHead,
    LogKey,
    Settled,
    Settlement,
)
from querator.storage.dynamodb import codec, schema
from querator.storage.dynamodb.errors import error_code, translate, translating_no_reply
from querator.storage.dynamodb.store import (
    BATCH_GET_LIMIT,
    CONDITION_FAILED,
    WRITE_CONCURRENCY,
    write_batches,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence
    from datetime import datetime

    from mypy_boto3_dynamodb import DynamoDBClient

    from querator.domain.model import Item

log = logging.getLogger(__name__)

#: Records the head keeps; the claim that reaches this many moves the ``SPILL`` oldest out.
HEAD_RECORDS = 32
SPILL = 16
#: How often a write that lost to a concurrent one is read again and retried before the call fails.
_RETRIES = 8
#: DynamoDB's limits for one ``TransactWriteItems``: 100 items, 4 MB (kept well below).
_TRANSACTION_ITEMS = 100
_TRANSACTION_BYTES = 3_500_000
#: Rows read per page when a run is read backwards from its end (the first page reads one row: the
#: row holding a run's end often holds its start too).
_ROW_PAGE = 16
_US = 1_000_000
_HOLE_TIMEOUT_US = int(HOLE_TIMEOUT_S * _US)
_ROW_TTL = timedelta(days=1)
_UNIQUE = 16**10
#: Positions ``get`` reads with one read of the rows between them when they are this close (a row
#: of small items holds ~100 of them), else apart: so a read never spans what nobody asked for.
_GET_GAP = 64
#: Waiting positions one head write deletes (each a condition of it: DynamoDB takes 4 KB of them).
_TOMBSTONES_PER_WRITE = 40
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
    without a lease deadline (a stored item waits; a lease's deadline lives in its record)."""
    attrs = codec.encode_item("", 0, item)
    for name in (schema.PK, schema.SK, schema.LEASE_DEADLINE):
        attrs.pop(name, None)
    if not item.attempts:
        # Most items are stored never leased: 0 is what a missing count decodes to.
        attrs.pop(schema.ATTEMPTS, None)
    return attrs


def _leased(
    key: LogKey, rows: dict[int, dict[str, Any]], positions: Iterable[int], deadline: datetime
) -> list[Item]:
    """The items at ``positions`` (those read) as a claim hands them out: this lease's deadline,
    and its attempt counted (the row keeps the attempts before it)."""
    return [
        replace(
            _item(rows[p], position_id(key.lane, p)),
            attempts=int(rows[p].get(schema.ATTEMPTS, {"N": "0"})["N"]) + 1,
            lease_deadline=deadline,
        )
        for p in positions
        if p in rows
    ]


def _clusters(positions: Sequence[int], gap: int) -> list[list[int]]:
    """Sorted ``positions`` in runs whose neighbours are at most ``gap`` apart."""
    runs: list[list[int]] = []
    for position in positions:
        if runs and position - runs[-1][-1] <= gap:
            runs[-1].append(position)
        else:
            runs.append([position])
    return runs


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
    return codec.decode_item({**entry, schema.SK: {"S": item_id}})


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
        **_key(key, _row_sk(first)),
        schema.LOG_ITEMS: {"L": [{"M": entry} for entry in entries]},
        # DynamoDB's TTL deletes the row free (within ~48 h) a day after its last item expired.
        schema.TTL: _num(int((latest + _ROW_TTL).timestamp())),
    }


def _filler(key: LogKey, position: int, now: datetime, count: int = 1) -> AttributeMap:
    """A filler row. A lease fills one position per row (a late writer's row may start at any of
    them); only a writer giving up positions of its own fills several with one (``count``)."""
    attrs = {
        **_key(key, _row_sk(position)),
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
        largest=_int(attrs, schema.LOG_LARGEST),
        first=_int(attrs, schema.LOG_FIRST),
        produced=_int(attrs, schema.LOG_PRODUCED),
        completed=_int(attrs, schema.LOG_COMPLETED),
        waiting_created=_int(attrs, schema.LOG_WAITING_CREATED),
        leased_created=_int(attrs, schema.LOG_LEASED_CREATED),
    )


def _ordered(result: Result, asked: Sequence[str]) -> Result:
    """``result`` with its ids in the order they were asked for (records are written one at a time)."""
    order = {item_id: n for n, item_id in reversed(list(enumerate(asked)))}
    result.applied.sort(key=lambda i: order.get(i, len(order)))
    result.rejected.sort(key=lambda i: order.get(i, len(order)))
    return result


def _record_moves(
    moved: dict[str, str], settlements: Sequence[Settlement], assigned: dict[LogKey, list[str]]
) -> None:
    """Put in ``moved`` the id each moving settlement's item got (``assigned``: by target, in the
    order of the settlements moving there), once their step is committed."""
    by_target: dict[LogKey, list[str]] = {}
    for settlement in settlements:
        if settlement.to is not None and settlement.item is not None:
            by_target.setdefault(settlement.to, []).append(settlement.id)
    for target, ids in by_target.items():
        moved.update(zip(ids, assigned.get(target, []), strict=True))


def _admits(guard: Guard, record: _Record, now_us: int) -> bool:
    if guard is Guard.LEASE_VALID:
        return record.deadline > now_us
    if guard in (Guard.LEASE_EXPIRED, Guard.NOT_VALIDLY_LEASED):
        return record.deadline <= now_us
    return guard is Guard.ANY


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


class DynamoDBClaimLog:
    """Engine v3's claim logs in the items table, one partition key per log."""

    def __init__(
        self,
        client: DynamoDBClient,
        items_table: str,
        *,
        concurrency: int = WRITE_CONCURRENCY,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
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

    # -- plumbing -----------------------------------------------------------------------------------

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
        that starts at or before ``first``, in position order."""
        rows: list[AttributeMap] = []
        start_key: AttributeMap | None = None
        limit = 1
        while True:
            kwargs: dict[str, Any] = {
                "KeyConditionExpression": "#pk = :pk AND #sk BETWEEN :lo AND :hi",
                "ExpressionAttributeNames": {"#pk": schema.PK, "#sk": schema.SK},
                "ExpressionAttributeValues": {
                    ":pk": _pk(key),
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
                TableName=self._table, Key=_key(key, _row_sk(position)), ConsistentRead=True
            )
        except ClientError as exc:
            raise translate(exc, "fill") from exc
        return codec.returned(reply, "Item")

    # -- append -------------------------------------------------------------------------------------

    def append(self, key: LogKey, items: Sequence[Item], *, now: datetime) -> list[Item]:
        now_us = timestamp_us(now)
        later_at = [
            n for n, item in enumerate(items) if item.enqueue_at is not None and item.enqueue_at > now
        ]
        ready_at = [n for n in range(len(items)) if n not in set(later_at)]
        stored: list[Item | None] = [None] * len(items)
        if ready_at:
            ready = [items[n] for n in ready_at]
            ids = self._take(
                key, len(ready), now_us, max(i.reply_size() for i in ready), created=_seconds(ready)
            )
            for n, item in zip(ready_at, self.write_taken(key, ids, ready, now=now), strict=True):
                stored[n] = item
        if later_at:
            for n, item in zip(later_at, self._schedule(key, [items[n] for n in later_at], now), strict=True):
                stored[n] = item
        return [item for item in stored if item is not None]

    def take_positions(self, key: LogKey, count: int, *, now: datetime, created: int = 0) -> list[str]:
        return self._take(key, count, timestamp_us(now), 0, created=created)

    def _take(
        self, key: LogKey, count: int, now_us: int, largest: int, *, produced: bool = True, created: int = 0
    ) -> list[str]:
        """The sequencer write; it also counts the items as produced (``produced``: not for a late
        writer's second positions) and adds their ``created`` seconds to the waiting items' (a late
        writer's second positions add none: its first take did), so counting costs no write of its
        own."""
        change = _Change(_key(key, schema.LOG_HEAD_SK))
        tail, cur = change.name(schema.LOG_TAIL), change.name(schema.LOG_CURSOR)
        records, starts = change.name(schema.LOG_RECORDS), change.name(schema.LOG_STARTS)
        now_v, empty = change.value(_num(now_us)), change.value({"M": {}})
        # The sequencer: never fails. A new log starts at the microsecond clock (positions of a queue
        # created again under the same name start above its earlier life's).
        change.sets += [
            f"{tail} = if_not_exists({tail}, {now_v}) + {change.value(_num(count))}",
            f"{cur} = if_not_exists({cur}, {now_v})",
            f"{change.name(schema.LOG_FIRST)} = if_not_exists({change.name(schema.LOG_FIRST)}, {now_v})",
            f"{records} = if_not_exists({records}, {empty})",
            f"{starts} = if_not_exists({starts}, {empty})",
        ]
        if produced:
            change.adds.append(f"{change.name(schema.LOG_PRODUCED)} {change.value(_num(count))}")
        _add_created(change, waiting=created)
        head = _decode_head(self._update(change, "produce", returns="ALL_NEW"))
        if largest > head.largest:
            raise_largest = _Change(_key(key, schema.LOG_HEAD_SK))
            lg = raise_largest.name(schema.LOG_LARGEST)
            size = raise_largest.value(_num(largest))
            raise_largest.sets.append(f"{lg} = {size}")
            raise_largest.conditions.append(f"attribute_not_exists({lg}) OR {lg} < {size}")
            self._update(raise_largest, "produce")
        first = head.tail - count
        return [position_id(key.lane, first + n) for n in range(count)]

    def write_taken(
        self, key: LogKey, ids: Sequence[str], items: Sequence[Item], *, now: datetime
    ) -> list[Item]:
        positions = [self._position(key, item_id) for item_id in ids]
        entries = [_entry(item) for item in items]
        spans = _pack(entries)

        def put(span: range) -> bool:
            row = _row(key, positions[span.start], [entries[i] for i in span], [items[i] for i in span])
            if self._put_absent(row, "produce"):
                return True
            # Taken: by a filler (this writer was taken for dead), or by an earlier try of this
            # same write (an idempotent produce retried), which stays as it is.
            there = self._get_row(key, positions[span.start])
            return there is not None and schema.LOG_FILLER not in there

        if self._concurrency <= 1 or len(spans) <= 1:
            # One at a time, in order: the first row found filled stops the write, and it and every
            # row after it go to new positions (the port's order for a writer taken for dead).
            written: list[bool] = []
            for span in spans:
                # After a filled row: not written here, moved with it.
                written.append(put(span) if not written or written[-1] else False)
        else:
            # In parallel (a big append): a row found filled moves; rows after it that were written
            # stay where they are (delivered once all the same, ahead of the moved row).
            written = self._each(put, spans)
        stored = [
            replace(item, id=position_id(key.lane, positions[n]), lease_deadline=None)
            for n, item in enumerate(items)
        ]
        late = [i for span, ok in zip(spans, written, strict=True) if not ok for i in span]
        given_up = [span for n, span in enumerate(spans) if not written[n] and n and not written[n - 1]]
        for span in given_up:
            # A row after the filled one, never written: its positions are filled now, by this
            # writer (they are its own), so no claim waits HOLE_TIMEOUT for them.
            self._put_absent(_filler(key, positions[span.start], now, len(span)), "produce")
        if late:
            # A lease took this writer for dead and filled the row's first position: its items (and,
            # written one at a time, the rows after it) go to new positions at the tail.
            moved = [items[i] for i in late]
            again = self.write_taken(
                key, self._take(key, len(moved), timestamp_us(now), 0, produced=False), moved, now=now
            )
            for index, item in zip(late, again, strict=True):
                stored[index] = item
        return stored

    @staticmethod
    def _position(key: LogKey, item_id: str) -> int:
        parsed = parse_position_id(item_id)
        if parsed is None or parsed[0] != key.lane:
            raise ValueError(f"not a position of this log: {item_id!r}")
        return parsed[1]

    def _schedule(self, key: LogKey, items: Sequence[Item], now: datetime) -> list[Item]:
        stored = [replace(item, id=_scheduled_id_for(key.lane, item), lease_deadline=None) for item in items]
        self._each(
            lambda item: self._put_absent(
                {**_key(key, _schedule_sk(item.id, key.lane)), **_entry(item)}, "produce"
            ),
            stored,
        )
        earliest = min(timestamp_us(item.enqueue_at) for item in items if item.enqueue_at is not None)
        # Count them, and lower the head's next due time (a lower bound) when these are due sooner.
        for lower in (True, False):
            change = _Change(_key(key, schema.LOG_HEAD_SK))
            change.adds += [
                f"{change.name(schema.LOG_PRODUCED)} {change.value(_num(len(items)))}",
                f"{change.name(schema.LOG_SCHEDULED)} {change.value(_num(len(items)))}",
                f"{change.name(schema.LOG_SCHEDULE_VERSION)} {change.value(_num(1))}",
            ]
            if lower:
                nd, due = change.name(schema.LOG_NEXT_DUE), change.value(_num(earliest))
                change.sets.append(f"{nd} = {due}")
                change.conditions.append(f"attribute_not_exists({nd}) OR {nd} > {due}")
            if self._update(change, "produce") is not None:
                break
        return stored

    # -- head ---------------------------------------------------------------------------------------

    def ages(self, key: LogKey) -> LogAges:
        head = self._head(key, "stats")
        waiting = head.tail - head.cursor - len(head.tombstones)
        # A writer that took positions and died left its items' ages in the waiting sum: once
        # nothing waits (or is leased) the sum is zero, whatever it says. Said, and written back
        # when the log is idle, conditional on the head as read, so a take or claim since wins.
        stale = (waiting <= 0 and head.waiting_created != 0) or (
            head.leased <= 0 and not head.records and not head.spilled and head.leased_created != 0
        )
        ages = LogAges(
            waiting_created=head.waiting_created if waiting > 0 else 0,
            leased_created=head.leased_created if head.leased > 0 else 0,
        )
        if stale and head.exists:
            change = _Change(_key(key, schema.LOG_HEAD_SK))
            tail, cur = change.name(schema.LOG_TAIL), change.name(schema.LOG_CURSOR)
            change.conditions += [
                f"{tail} = {change.value(_num(head.tail))}",
                f"{cur} = {change.value(_num(head.cursor))}",
            ]
            if waiting <= 0:
                change.sets.append(f"{change.name(schema.LOG_WAITING_CREATED)} = {change.value(_num(0))}")
            if head.leased <= 0 and not head.records and not head.spilled:
                nl = change.name(schema.LOG_LEASED)
                change.sets.append(f"{change.name(schema.LOG_LEASED_CREATED)} = {change.value(_num(0))}")
                change.conditions.append(f"attribute_not_exists({nl}) OR {nl} <= {change.value(_num(0))}")
            self._update(change, "stats")
        return ages

    def head(self, key: LogKey) -> LogHead:
        head = self._head(key, "stats")
        expiries = [r.deadline for r in head.records.values()]
        if head.spilled and head.spilled_expiry is not None:
            expiries.append(head.spilled_expiry)
        return LogHead(
            tail=head.tail,
            cursor=head.cursor,
            skipped=sum(1 for p in head.tombstones if head.cursor <= p < head.tail),
            leases=len(head.records) + head.spilled,
            leased=head.leased,
            scheduled=head.scheduled,
            next_expiry=utc_from_timestamp_us(min(expiries)) if expiries else None,
            next_due=utc_from_timestamp_us(head.next_due)
            if head.scheduled and head.next_due is not None
            else None,
            largest=head.largest,
            produced=head.produced,
            completed=head.completed,
        )

    # -- claim --------------------------------------------------------------------------------------

    def claim(
        self,
        key: LogKey,
        *,
        count: int,
        deadline: datetime,
        now: datetime,
        max_leased: int | None = None,
    ) -> Claim:
        empty = Claim(token="", deadline=deadline)
        if count <= 0:
            return empty
        now_us, deadline_us = timestamp_us(now), timestamp_us(deadline)
        asked = count
        for attempt in range(_RETRIES * 4):
            head = self._head(key, "lease")
            waiting = head.tail - head.cursor
            count = asked if max_leased is None else min(asked, max_leased - head.leased)
            if not head.exists or waiting <= 0 or count <= 0:
                return empty
            token = secrets.token_hex(6)
            taken = min(count, waiting)
            # The rows this claim will take unless another claim comes first, read before it: their
            # ages go into the claim's own write (LogAges), so a claim that meets no competitor
            # writes once, and reads no more than after it would have.
            before, guess = self._guess(key, head, taken)
            record = _Record(
                token=token, start=0, count=taken, deadline=deadline_us, claimed_at=now_us, created=guess
            )
            change = _Change(_key(key, schema.LOG_HEAD_SK))
            _add_created(change, waiting=-guess, leased=guess)
            cur = change.name(schema.LOG_CURSOR)
            start_path = change.name(schema.LOG_STARTS, token)
            change.sets.append(
                f"{change.name(schema.LOG_RECORDS, token)} = {change.value({'M': record.fields()})}"
            )
            leased = change.name(schema.LOG_LEASED)
            change.adds.append(f"{leased} {change.value(_num(taken))}")
            if max_leased is not None:
                # The cap holds in the write itself: of two claims that both saw room, one fails.
                cap = change.value(_num(max_leased - taken))
                change.conditions.append(f"attribute_not_exists({leased}) OR {leased} <= {cap}")
            k = change.value(_num(taken))
            if taken == count:
                # Fetch-and-add: whoever moved the cursor since the read, this claim takes the next
                # ``count`` positions while the backlog holds them (the tail only grows).
                change.sets += [f"{start_path} = {cur}", f"{cur} = {cur} + {k}"]
                change.conditions.append(f"{cur} <= {change.value(_num(head.tail - count))}")
            else:
                # Fewer waiting than asked: exactly those, if nobody moved the cursor.
                change.sets += [
                    f"{start_path} = {change.value(_num(head.cursor))}",
                    f"{cur} = {change.value(_num(head.cursor + taken))}",
                ]
                change.conditions.append(f"{cur} = {change.value(_num(head.cursor))}")
            # A claim whose reply was lost and that botocore sent again must not move the cursor a
            # second time (the first run would belong to nobody): the retry fails on its own record.
            change.conditions.append(f"attribute_not_exists({change.name(schema.LOG_RECORDS, token)})")
            reply = self._update(change, "lease", returns="ALL_NEW")
            retried: _Record | None = None
            if reply is None:
                again = self._head(key, "lease")
                retried = again.records.get(token)
                if retried is None:
                    self._backoff(attempt)
                    continue
                # Its own first try applied: the run is the one its record names.
                after, start = again, retried.start
            else:
                after = _decode_head(reply)
                # The run's start from the cursor this write left, not from ``la``: the record's
                # start was written as ``la.#tok = cur`` in the same SET as ``cur = cur + :k``, and
                # DynamoDB documents no order among one SET's actions (moto reads the item as it
                # was before). Should the stored start differ, it is written again before anyone
                # learns the token.
                start = after.cursor - taken
            record = replace(record, start=start)
            try:
                mine = after.records.get(token)
                if retried is None and (mine is None or mine.start != start):
                    fix = _Change(_key(key, schema.LOG_HEAD_SK))
                    fix.sets.append(f"{fix.name(schema.LOG_STARTS, token)} = {fix.value(_num(start))}")
                    self._update(fix, "lease")
                self._spill(key, after, now_us, keep=token)
                claim = self._finish_claim(
                    key,
                    record,
                    after.tombstones,
                    deadline,
                    now,
                    read=before if start == head.cursor else None,
                )
            except QueratorError as exc:
                # The run is this caller's now: say which, so it can be given back at once rather
                # than wait for its deadline (a failed lease holds nothing it did not return).
                ids = [position_id(key.lane, p) for p in record.positions()]
                raise ClaimReadError(token, ids, exc) from exc
            if claim is not None:
                self._remember(key, record)
                return claim
        return empty

    def _guess(self, key: LogKey, head: _Head, taken: int) -> tuple[_Found, int]:
        """The rows of the ``taken`` positions after the cursor ``head`` read, and their items'
        ``created`` seconds (tombstoned ones already left the waiting sum)."""
        found = self._read_positions(key, range(head.cursor, head.cursor + taken), "lease", consistent=False)
        return found, _entry_seconds(v for p, v in found.items.items() if p not in head.tombstones)

    def _finish_claim(
        self,
        key: LogKey,
        record: _Record,
        tombstones: set[int],
        deadline: datetime,
        now: datetime,
        *,
        read: _Found | None = None,
    ) -> Claim | None:
        """Read the run's rows (``read``: read before the claim, when its run is the one guessed);
        skip what was filled or deleted while waiting (settled in the record with one more write,
        only then); ``None`` when nothing of it was left to hand out."""
        positions = record.positions()
        # Rows are written once: an eventually consistent read (half the units) is right unless it
        # misses a row written a moment ago, so a run that seems to have a hole is read again, strongly.
        found = read if read is not None else self._read_positions(key, positions, "lease", consistent=False)
        if any(p not in found.items and p not in found.filled for p in positions):
            found = self._read_positions(key, positions, "lease")
        done = found.filled | (tombstones & set(positions))
        for position in done:
            found.items.pop(position, None)
        holes = {p for p in positions if p not in found.items and p not in done}
        # The claim's write moved the ages of the items it guessed from the waiting sum to the record
        # and the leased sum; another claim in between (or a row written since the guess) makes the
        # run's own differ: the difference goes in the write that settles what it skipped when there
        # is one, else in one of its own (a stats figure: its failure fails nothing).
        guessed, record.created = record.created, _entry_seconds(found.items.values())
        if done or holes:
            record.settled |= done
            record.holes = holes
            self._rewrite_claimed(key, record, len(done), done & tombstones, guessed=guessed)
        elif record.created != guessed:
            self._note_claimed(key, record, guessed=guessed)
        if not found.items and not holes:
            return None
        items = _leased(key, found.items, positions, deadline)
        return Claim(
            token=record.token,
            deadline=deadline,
            items=items,
            holes=[position_id(key.lane, p) for p in sorted(holes)],
        )

    def _note_claimed(self, key: LogKey, record: _Record, *, guessed: int) -> None:
        change = _Change(_key(key, schema.LOG_HEAD_SK))
        path = change.name(schema.LOG_RECORDS, record.token)
        change.sets.append(
            f"{change.name(schema.LOG_RECORDS, record.token, schema.LOG_RECORD_CREATED)}"
            f" = {change.value(_num(record.created))}"
        )
        change.conditions.append(f"attribute_exists({path})")
        delta = record.created - guessed
        _add_created(change, waiting=-delta, leased=delta)
        if self._update(change, "lease") is None:
            self._left_waiting(key, record, guessed=guessed)

    def _left_waiting(self, key: LogKey, record: _Record, *, guessed: int) -> None:
        """A claim's record that moved out of the head before its ages were corrected in it
        (spilled by a concurrent claim, which is rare): the waiting sum is corrected; the record
        keeps the guess the leased sum holds for it."""
        claimed, record.created = record.created, guessed
        if claimed != guessed:
            left = _Change(_key(key, schema.LOG_HEAD_SK))
            _add_created(left, waiting=guessed - claimed)
            self._update(left, "lease")

    def _rewrite_claimed(
        self, key: LogKey, record: _Record, settled: int, tombstones: set[int], *, guessed: int
    ) -> None:
        change = _Change(_key(key, schema.LOG_HEAD_SK))
        path = change.name(schema.LOG_RECORDS, record.token)
        if record.open():
            change.sets.append(f"{path} = {change.value({'M': record.fields()})}")
        else:
            change.removes += [path, change.name(schema.LOG_STARTS, record.token)]
        change.conditions.append(f"attribute_exists({path})")
        if settled:
            change.adds.append(f"{change.name(schema.LOG_LEASED)} {change.value(_num(-settled))}")
        if tombstones:
            change.deletes.append(
                f"{change.name(schema.LOG_TOMBSTONES)} {change.value(_numbers(tombstones))}"
            )
        delta = record.created - guessed
        _add_created(change, waiting=-delta, leased=delta)
        if self._update(change, "lease") is None:
            # Spilled in between (only the oldest are, so this is rare): the next settle or expiry
            # reads the rows again and finds the same.
            log.info("claim %s of %s moved out of the head before its rows were read", record.token, key)
            self._left_waiting(key, record, guessed=guessed)

    def _spill(self, key: LogKey, head: _Head, now_us: int, *, keep: str) -> None:
        """At ``HEAD_RECORDS`` records, move the ``SPILL`` oldest to ``P``/``L`` rows in one transaction,
        conditional on each being as read (a concurrent settle cancels it: a later claim retries)."""
        if len(head.records) < HEAD_RECORDS:
            return
        candidates = [r for r in head.records.values() if r.token != keep and not r.holes]
        oldest = sorted(candidates, key=lambda r: (r.deadline, r.token))[:SPILL]
        if not oldest:
            return
        change = _Change(_key(key, schema.LOG_HEAD_SK))
        actions: list[AttributeMap] = []
        for record in oldest:
            path = change.name(schema.LOG_RECORDS, record.token)
            change.removes += [path, change.name(schema.LOG_STARTS, record.token)]
            version = change.name(schema.LOG_RECORDS, record.token, schema.LOG_VERSION)
            change.conditions.append(f"{version} = {change.value(_num(record.version))}")
            sk = _record_sk(record.start, record.token)
            actions.append({"Put": {"TableName": self._table, "Item": self._spilled_row(key, record, sk)}})
            actions.append({"Put": {"TableName": self._table, "Item": self._expiry_row(key, record, sk)}})
        change.adds.append(f"{change.name(schema.LOG_SPILLED)} {change.value(_num(len(oldest)))}")
        lowest = min(r.deadline for r in oldest)
        if head.spilled and head.spilled_expiry is not None:
            lowest = min(lowest, head.spilled_expiry)
        change.sets.append(f"{change.name(schema.LOG_SPILLED_EXPIRY)} = {change.value(_num(lowest))}")
        # One spill at a time: the spilled deadlines' lower bound is computed from this read.
        sp = change.name(schema.LOG_SPILLED)
        if head.spilled:
            change.conditions.append(f"{sp} = {change.value(_num(head.spilled))}")
        else:
            change.conditions.append(f"attribute_not_exists({sp}) OR {sp} = {change.value(_num(0))}")
        try:
            self._transact([{"Update": change.kwargs(self._table)}, *actions], "lease")
        except _ConflictError:
            log.debug("spill of %s lost to a concurrent write; a later claim moves them", key)

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

    # -- finding records ---------------------------------------------------------------------------

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

    def _spilled_by_token(self, key: LogKey, token: str) -> _Record | None:
        """A spilled record by its token alone: reads every spilled record (only ``collect`` of a
        record spilled before its holes were known comes here)."""
        return next((r for r in self._every_spilled(key, "collect") if r.token == token), None)

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

    # -- writes to one record ----------------------------------------------------------------------

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
        for target, items in targets.items():
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
                largest = max(i.reply_size() for i in ready)
                if largest > state.largest:
                    change.sets.append(f"{change.name(schema.LOG_LARGEST)} = {change.value(_num(largest))}")
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

    # -- settle, renew ------------------------------------------------------------------------------

    def settle(
        self,
        key: LogKey,
        settlements: Sequence[Settlement],
        *,
        guard: Guard,
        now: datetime,
        completed: bool = False,
    ) -> Settled:
        result = Settled()
        pending: dict[int, Settlement] = {}
        scheduled: dict[str, Settlement] = {}
        # ANY and NOT_VALIDLY_LEASED also take waiting and scheduled items (a move, a redrive).
        broad = guard in (Guard.ANY, Guard.NOT_VALIDLY_LEASED)
        for settlement in settlements:
            parsed = parse_position_id(settlement.id)
            due = parse_scheduled_id(settlement.id)
            if broad and due is not None and due[0] == key.lane and settlement.id not in scheduled:
                scheduled[settlement.id] = settlement
                continue
            if parsed is None or parsed[0] != key.lane or parsed[1] in pending or guard is Guard.NEVER_LEASED:
                result.rejected.append(settlement.id)
                continue
            pending[parsed[1]] = settlement
        now_us = timestamp_us(now)
        if guard is Guard.LEASE_VALID and all(s.to is None for s in pending.values()):
            self._settle_mine(key, pending, result, now_us, completed=completed)
        # A waiting or scheduled item is settled one a turn: the turns are the retries after a
        # lost race plus one per settlement, so a clear or redrive of many is not cut at _RETRIES.
        for attempt in range(_RETRIES + 1 + len(pending) + len(scheduled)):
            if not pending and not scheduled:
                return _ordered(result, [s.id for s in settlements])
            head = self._head(key, "settle")
            if scheduled:
                item_id, settlement = next(iter(scheduled.items()))
                try:
                    applied = self._settle_scheduled(key, head, settlement, now, result.moved)
                except _ConflictError:
                    self._backoff(attempt)
                    continue
                (result.applied if applied else result.rejected).append(scheduled.pop(item_id).id)
                continue
            waiting = [p for p in sorted(pending) if p >= head.cursor]
            if waiting:
                if not broad:
                    for position in waiting:
                        result.rejected.append(pending.pop(position).id)
                    continue
                position = waiting[0]
                try:
                    applied = self._settle_waiting(
                        key, head, position, pending[position], now, completed, result.moved
                    )
                except _ConflictError:
                    self._backoff(attempt)
                    continue
                (result.applied if applied else result.rejected).append(pending.pop(position).id)
                continue
            located = self._locate(key, head, sorted(pending), "settle")
            by_record: dict[str, tuple[_Record, list[int]]] = {}
            for position in sorted(pending):
                record = located.get(position)
                if record is None or not _admits(guard, record, now_us):
                    result.rejected.append(pending.pop(position).id)
                    continue
                by_record.setdefault(record.token, (record, []))[1].append(position)
            for record, positions in by_record.values():
                chunk = self._fitting(positions, pending)
                try:
                    moved_tail = self._settle_record(
                        key, head, record, [pending[p] for p in chunk], now, result.moved, completed=completed
                    )
                except _ConflictError:
                    self._backoff(attempt)
                    break  # read again
                for position in chunk:
                    result.applied.append(pending.pop(position).id)
                if moved_tail or len(chunk) < len(positions):
                    break  # the head's tail (or this record) moved on: read again
        if pending or scheduled:
            raise StoreThrottledError(f"settle kept losing to concurrent writes ({len(pending)} left); retry")
        return _ordered(result, [s.id for s in settlements])

    def _settle_waiting(
        self,
        key: LogKey,
        head: _Head,
        position: int,
        settlement: Settlement,
        now: datetime,
        completed: bool,
        moved: dict[str, str],
    ) -> bool:
        """A waiting position settled (and its item moved) in one step: a tombstone, which every
        later claim skips, written only while the position still waits. False: nothing stored there."""
        if position >= head.tail or position in head.tombstones:
            return False
        there = self._read_positions(key, [position], "settle").items.get(position)
        if there is None:
            return False
        change = _Change(_key(key, schema.LOG_HEAD_SK))
        tb, p = change.name(schema.LOG_TOMBSTONES), change.value(_numbers([position]))
        change.adds.append(f"{tb} {p}")
        _add_created(change, waiting=-_entry_seconds([there]))
        single = change.value(_num(position))
        change.conditions.append(f"{change.name(schema.LOG_CURSOR)} <= {single}")
        change.conditions.append(f"NOT contains({tb}, {single})")
        actions: list[AttributeMap] = []
        targets = (
            {settlement.to: [replace(settlement.item, lease_deadline=None)]}
            if settlement.to and settlement.item
            else {}
        )
        if completed and not targets:
            change.adds.append(f"{change.name(schema.LOG_COMPLETED)} {change.value(_num(1))}")
        assigned: dict[LogKey, list[str]] = {}
        others = self._appends(key, head, change, targets, now, actions, assigned)
        self._commit([change, *others], actions, "settle")
        _record_moves(moved, [settlement], assigned)
        return True

    def _settle_scheduled(
        self, key: LogKey, head: _Head, settlement: Settlement, now: datetime, moved: dict[str, str]
    ) -> bool:
        """A scheduled item leaves the schedule (and moves) in one step. False: no such item."""
        sort_key = _schedule_sk(settlement.id, key.lane)
        try:
            reply = self._client.get_item(TableName=self._table, Key=_key(key, sort_key), ConsistentRead=True)
        except ClientError as exc:
            raise translate(exc, "settle") from exc
        if codec.returned(reply, "Item") is None:
            return False
        change = _Change(_key(key, schema.LOG_HEAD_SK))
        change.adds.append(f"{change.name(schema.LOG_SCHEDULED)} {change.value(_num(-1))}")
        actions: list[AttributeMap] = [
            {
                "Delete": {
                    "TableName": self._table,
                    "Key": _key(key, sort_key),
                    "ConditionExpression": "attribute_exists(#sk)",
                    "ExpressionAttributeNames": {"#sk": schema.SK},
                }
            }
        ]
        targets = (
            {settlement.to: [replace(settlement.item, lease_deadline=None)]}
            if settlement.to and settlement.item
            else {}
        )
        assigned: dict[LogKey, list[str]] = {}
        others = self._appends(key, head, change, targets, now, actions, assigned)
        self._commit([change, *others], actions, "settle")
        _record_moves(moved, [settlement], assigned)
        return True

    # -- the records this instance claimed ------------------------------------------------------------

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

    def _settle_mine(
        self,
        key: LogKey,
        pending: dict[int, Settlement],
        result: BatchResult[str],
        now_us: int,
        *,
        completed: bool,
    ) -> None:
        """Complete positions of records this instance claimed with one conditional write each,
        unread: the record's version in the condition makes a stale memory fail (then the caller
        reads the head as usual)."""
        with self._pool_lock:
            tokens = {self._mine_at.get((key, p)) for p in pending}
            if None in tokens:
                return
            records = [self._mine.get((key, t)) for t in tokens if t is not None]
        for record in records:
            if record is None or record.deadline <= now_us:
                continue
            positions = {p for p in pending if record.holds(p)}
            if not positions <= set(record.open()):
                continue
            change = _Change(_key(key, schema.LOG_HEAD_SK))
            dropped = self._record_change(key, record, change, [], settled=positions)
            if completed:
                change.adds.append(
                    f"{change.name(schema.LOG_COMPLETED)} {change.value(_num(len(positions)))}"
                )
            try:
                self._commit([change], [], "settle")
            except _ConflictError:
                self._forget(key, record)  # read below
                continue
            updated = replace(
                record,
                settled=record.settled | positions,
                version=record.version + 1,
                created=record.created - dropped,
            )
            self._forget(key, record)
            if updated.open():
                self._remember(key, updated)
            for position in sorted(positions):
                result.applied.append(pending.pop(position).id)

    @staticmethod
    def _fitting(positions: list[int], pending: dict[int, Settlement]) -> list[int]:
        """The leading settlements of one record that fit one transaction (rows, bytes)."""
        chunk: list[int] = []
        items, size = 4, 0
        for position in positions:
            item = pending[position].item
            extra = 0 if item is None else _value_size({"M": _entry(item)}) + 64
            if chunk and (items + 2 > _TRANSACTION_ITEMS or size + extra > _TRANSACTION_BYTES):
                break
            chunk.append(position)
            items += 0 if item is None else 2
            size += extra
        return chunk

    def _settle_record(
        self,
        key: LogKey,
        head: _Head,
        record: _Record,
        settlements: Sequence[Settlement],
        now: datetime,
        moved: dict[str, str],
        *,
        completed: bool = False,
    ) -> bool:
        """One atomic step for ``settlements`` of ``record``; True when it moved this log's tail.
        ``moved`` takes the ids the moved items got."""
        head_change = _Change(_key(key, schema.LOG_HEAD_SK))
        actions: list[AttributeMap] = []
        positions = {self._position(key, s.id) for s in settlements}
        self._record_change(key, record, head_change, actions, settled=positions)
        targets: dict[LogKey, list[Item]] = {}
        for settlement in settlements:
            if settlement.to is not None and settlement.item is not None:
                targets.setdefault(settlement.to, []).append(replace(settlement.item, lease_deadline=None))
        done = sum(1 for s in settlements if s.to is None or s.item is None)
        if completed and done:
            head_change.adds.append(
                f"{head_change.name(schema.LOG_COMPLETED)} {head_change.value(_num(done))}"
            )
        assigned: dict[LogKey, list[str]] = {}
        others = self._appends(key, head, head_change, targets, now, actions, assigned)
        self._commit([head_change, *others], actions, "settle")
        self._forget(key, record)
        _record_moves(moved, settlements, assigned)
        return key in targets

    def renew(
        self, key: LogKey, ids: Sequence[str], *, deadline: datetime, now: datetime
    ) -> BatchResult[str]:
        deadline_us = timestamp_us(deadline)
        return self._per_valid_record(
            key,
            ids,
            now,
            "renew",
            lambda record, positions: self._renew_record(key, record, set(positions), deadline_us),
            holes=True,
            repeats_rejected=True,
        )

    def set_next_priority(
        self, key: LogKey, ids: Sequence[str], *, priority: int, now: datetime
    ) -> BatchResult[str]:
        # A hole is not the holder's yet (``get`` does not return it): nothing to give; a repeated
        # id is given its priority once.
        return self._per_valid_record(
            key,
            ids,
            now,
            "reprioritize",
            lambda record, positions: self._prioritize_record(key, record, positions, priority),
            holes=False,
            repeats_rejected=False,
        )

    def _per_valid_record(
        self,
        key: LogKey,
        ids: Sequence[str],
        now: datetime,
        operation: str,
        apply: Callable[[_Record, list[int]], None],
        *,
        holes: bool,
        repeats_rejected: bool,
    ) -> BatchResult[str]:
        """``apply`` to the validly leased positions of ``ids``, one call per lease record holding
        them (a write that lost to a concurrent one reads the head again; ``_RETRIES`` times).
        ``holes``: a hole of a record counts as held; ``repeats_rejected``: a repeated id is
        rejected, else it counts once."""
        result: BatchResult[str] = BatchResult()
        pending: dict[int, str] = {}
        for item_id in ids if repeats_rejected else dict.fromkeys(ids):
            parsed = parse_position_id(item_id)
            if parsed is None or parsed[0] != key.lane or parsed[1] in pending:
                result.rejected.append(item_id)
                continue
            pending[parsed[1]] = item_id
        now_us = timestamp_us(now)
        for attempt in range(_RETRIES + 1):
            if not pending:
                return _ordered(result, ids)
            head = self._head(key, operation)
            located = self._locate(key, head, sorted(pending), operation)
            groups: dict[str, tuple[_Record, list[int]]] = {}
            for position in sorted(pending):
                record = located.get(position)
                if (
                    record is None
                    or not _admits(Guard.LEASE_VALID, record, now_us)
                    or (not holes and position in record.holes)
                ):
                    result.rejected.append(pending.pop(position))
                    continue
                groups.setdefault(record.token, (record, []))[1].append(position)
            for record, positions in groups.values():
                try:
                    apply(record, positions)
                except _ConflictError:
                    self._backoff(attempt)
                    break  # read again
                for position in positions:
                    result.applied.append(pending.pop(position))
        if pending:
            raise StoreThrottledError(
                f"{operation} kept losing to concurrent writes ({len(pending)} left); retry"
            )
        return _ordered(result, ids)

    def _prioritize_record(self, key: LogKey, record: _Record, positions: list[int], priority: int) -> None:
        """One write of ``record`` with ``positions``' coming priority, conditional on its version:
        the head row's record (one ``UpdateItem``), or the spilled ``P`` row (one ``PutItem``)."""
        given = replace(record, priorities={**record.priorities, **dict.fromkeys(positions, priority)})
        head_change = _Change(_key(key, schema.LOG_HEAD_SK))
        actions: list[AttributeMap] = []
        self._record_change(key, given, head_change, actions, settled=set())
        self._commit([head_change], actions, "reprioritize")
        self._forget(key, record)

    def _renew_record(self, key: LogKey, record: _Record, positions: set[int], deadline_us: int) -> None:
        head_change = _Change(_key(key, schema.LOG_HEAD_SK))
        actions: list[AttributeMap] = []
        if positions >= set(record.open()):
            self._record_change(key, record, head_change, actions, settled=set(), deadline=deadline_us)
        else:
            # Part of a run: those positions move to a record of their own (in the head), the rest
            # keep their deadline. Moved is not settled: the leased count stays.
            moved = self._record_change(key, record, head_change, actions, settled=positions, count=False)
            split = _Record(
                token=secrets.token_hex(6),
                start=min(positions),
                count=len(positions),
                deadline=deadline_us,
                claimed_at=record.claimed_at,
                explicit=set(positions),
                holes=record.holes & positions,
                created=moved,
                priorities={p: n for p, n in record.priorities.items() if p in positions},
            )
            split_path = head_change.name(schema.LOG_RECORDS, split.token)
            split_start = head_change.name(schema.LOG_STARTS, split.token)
            head_change.sets += [
                f"{split_path} = {head_change.value({'M': split.fields()})}",
                f"{split_start} = {head_change.value(_num(split.start))}",
            ]
        self._commit([head_change], actions, "renew")
        self._forget(key, record)

    # -- collect, expired ---------------------------------------------------------------------------

    def collect(self, key: LogKey, token: str, *, now: datetime) -> Claim:
        now_us = timestamp_us(now)
        for attempt in range(_RETRIES + 1):
            head = self._head(key, "collect")
            record = head.records.get(token) or self._spilled_by_token(key, token)
            if record is None or not record.holes:
                deadline = utc_from_timestamp_us(record.deadline) if record else now
                return Claim(token=token, deadline=deadline)
            deadline = utc_from_timestamp_us(record.deadline)
            holes = sorted(record.holes - record.settled)
            found = self._read_positions(key, holes, "collect")
            still = [p for p in holes if p not in found.items and p not in found.filled]
            if still and now_us - record.claimed_at >= _HOLE_TIMEOUT_US:
                filled = self._fill(key, still, now, first=head.first)
                found.items.update(filled.items)
                found.filled |= filled.filled
                still = [p for p in still if p not in found.items and p not in found.filled]
            if len(still) == len(holes):
                return Claim(token=token, deadline=deadline, holes=[position_id(key.lane, p) for p in still])
            head_change = _Change(_key(key, schema.LOG_HEAD_SK))
            actions: list[AttributeMap] = []
            # Filled positions are done; the written ones are delivered now and leave the holes, and
            # their ages the waiting sum for the record's and the leased one.
            arrived = _entry_seconds(found.items.values())
            updated = replace(record, holes=set(still), created=record.created + arrived)
            _add_created(head_change, waiting=-arrived, leased=arrived)
            self._record_change(key, updated, head_change, actions, settled=set(found.filled))
            self._forget(key, record)
            try:
                self._commit([head_change], actions, "collect")
            except _ConflictError:
                self._backoff(attempt)
                continue
            items = _leased(key, found.items, holes, deadline)
            return Claim(
                token=token, deadline=deadline, items=items, holes=[position_id(key.lane, p) for p in still]
            )
        raise StoreThrottledError("collect kept losing to concurrent writes; retry")

    def expired(self, key: LogKey, *, now: datetime, limit: int) -> list[LeaseRun]:
        now_us = timestamp_us(now)
        head = self._head(key, "expiry")
        due = [r for r in head.records.values() if r.deadline <= now_us]
        if head.spilled and limit > 0:
            rows, _ = self._query(
                "expiry",
                KeyConditionExpression="#pk = :pk AND #sk BETWEEN :lo AND :hi",
                ExpressionAttributeNames={"#pk": schema.PK, "#sk": schema.SK},
                ExpressionAttributeValues={
                    ":pk": _pk(key),
                    ":lo": {"S": schema.LOG_EXPIRY_PREFIX},
                    ":hi": {"S": f"{schema.LOG_EXPIRY_PREFIX}{now_us:014x}~"},
                },
                Limit=limit,
            )
            refs = [_key(key, row[schema.LOG_RECORD_REF]["S"]) for row in rows]
            due += [_decode_spilled(attrs) for attrs in self._batch_get(refs, "expiry")]
        due = sorted(due, key=lambda r: (r.deadline, r.token))[: max(limit, 0)]
        runs = []
        for record in due:
            open_positions = record.open()
            found = self._read_positions(key, open_positions, "expiry")
            holes = [p for p in open_positions if p not in found.items and p not in found.filled]
            if holes:
                # Its writer is long dead: fill on the way.
                filled = self._fill(key, holes, now, first=head.first)
                found.items.update(filled.items)
                found.filled |= filled.filled
            if found.filled or not found.items:
                head_change = _Change(_key(key, schema.LOG_HEAD_SK))
                actions: list[AttributeMap] = []
                settled = set(found.filled) | {p for p in open_positions if p not in found.items}
                self._record_change(key, record, head_change, actions, settled=settled)
                self._forget(key, record)
                try:
                    self._commit([head_change], actions, "expiry")
                except _ConflictError:
                    continue  # settled or renewed meanwhile: a later pass sees it as it is
            if not found.items:
                continue
            deadline = utc_from_timestamp_us(record.deadline)
            items = [
                replace(
                    record.coming(_item(found.items[p], position_id(key.lane, p)), p),
                    attempts=int(found.items[p].get(schema.ATTEMPTS, {"N": "0"})["N"]) + 1,
                    lease_deadline=deadline,
                )
                for p in open_positions
                if p in found.items
            ]
            runs.append(LeaseRun(token=record.token, deadline=deadline, items=items))
        return runs

    # -- promote ------------------------------------------------------------------------------------

    def promote(self, key: LogKey, *, now: datetime, limit: int) -> int:
        now_us = timestamp_us(now)
        moved = 0
        for attempt in range(_RETRIES + 1):
            if moved >= limit:
                break
            head = self._head(key, "promote")
            if not head.scheduled:
                break
            rows, _ = self._query(
                "promote",
                KeyConditionExpression="#pk = :pk AND #sk BETWEEN :lo AND :hi",
                ExpressionAttributeNames={"#pk": schema.PK, "#sk": schema.SK},
                ExpressionAttributeValues={
                    ":pk": _pk(key),
                    ":lo": {"S": schema.LOG_SCHEDULE_PREFIX},
                    ":hi": {"S": f"{schema.LOG_SCHEDULE_PREFIX}{now_us:014x}~"},
                },
                Limit=min(limit - moved, 40),
            )
            if not rows:
                self._lower_next_due(key, head)
                break
            change = _Change(_key(key, schema.LOG_HEAD_SK))
            actions: list[AttributeMap] = [
                {
                    "Delete": {
                        "TableName": self._table,
                        "Key": _key(key, row[schema.SK]["S"]),
                        "ConditionExpression": "attribute_exists(#sk)",
                        "ExpressionAttributeNames": {"#sk": schema.SK},
                    }
                }
                for row in rows
            ]
            change.adds.append(f"{change.name(schema.LOG_SCHEDULED)} {change.value(_num(-len(rows)))}")
            items = [
                _item({k: v for k, v in row.items() if k not in (schema.PK, schema.SK)}, "") for row in rows
            ]
            # Due: appended at the tail (``enqueue_at`` kept: when it was scheduled for).
            self._appends(key, head, change, {key: items}, now, actions)
            try:
                self._commit([change], actions, "promote")
            except _ConflictError:
                self._backoff(attempt)
                continue
            moved += len(rows)
        return moved

    def _lower_next_due(self, key: LogKey, head: _Head) -> None:
        """Move the head's next due time up to the schedule's first row, if nothing was scheduled
        since ``head`` was read (the schedule version): it stays a lower bound."""
        rows, _ = self._query(
            "promote",
            KeyConditionExpression="#pk = :pk AND begins_with(#sk, :s)",
            ExpressionAttributeNames={"#pk": schema.PK, "#sk": schema.SK},
            ExpressionAttributeValues={":pk": _pk(key), ":s": {"S": schema.LOG_SCHEDULE_PREFIX}},
            Limit=1,
        )
        change = _Change(_key(key, schema.LOG_HEAD_SK))
        nd, sv = change.name(schema.LOG_NEXT_DUE), change.name(schema.LOG_SCHEDULE_VERSION)
        if rows:
            change.sets.append(f"{nd} = {change.value(_num(int(rows[0][schema.SK]['S'][1:15], 16)))}")
        else:
            change.removes.append(nd)
        change.conditions.append(f"{sv} = {change.value(_num(head.schedule_version))}")
        self._update(change, "promote")

    # -- delete, get, list, purge ------------------------------------------------------------------

    def delete(self, key: LogKey, ids: Sequence[str], *, now: datetime) -> BatchResult[str]:
        result: BatchResult[str] = BatchResult()
        positions: dict[int, str] = {}
        for item_id in ids:
            parsed = parse_position_id(item_id)
            if parsed is not None and parsed[0] == key.lane and parsed[1] not in positions:
                positions[parsed[1]] = item_id
            elif (due := parse_scheduled_id(item_id)) is not None and due[0] == key.lane:
                if self._delete_scheduled(key, item_id):
                    result.applied.append(item_id)
                else:
                    result.rejected.append(item_id)
            else:
                result.rejected.append(item_id)
        for attempt in range(_RETRIES + 1):
            if not positions:
                return _ordered(result, ids)
            head = self._head(key, "delete")
            waiting = sorted(
                p for p in positions if head.cursor <= p < head.tail and p not in head.tombstones
            )
            leased = [p for p in positions if p < head.cursor]
            for p in [p for p in positions if p >= head.tail or p in head.tombstones]:
                result.rejected.append(positions.pop(p))
            if leased:
                settled = self.settle(
                    key, [Settlement(id=positions[p]) for p in leased], guard=Guard.ANY, now=now
                )
                result.applied.extend(settled.applied)
                result.rejected.extend(settled.rejected)
                for p in leased:
                    positions.pop(p)
            if not waiting:
                continue
            found = self._read_positions(key, waiting, "delete")
            for p in [p for p in waiting if p not in found.items]:
                result.rejected.append(positions.pop(p))
            waiting = [p for p in waiting if p in found.items]
            if not waiting:
                continue
            for at in range(0, len(waiting), _TOMBSTONES_PER_WRITE):
                chunk = waiting[at : at + _TOMBSTONES_PER_WRITE]
                change = _Change(_key(key, schema.LOG_HEAD_SK))
                tb = change.name(schema.LOG_TOMBSTONES)
                change.adds.append(f"{tb} {change.value(_numbers(chunk))}")
                # Still waiting: a claim that took them meanwhile makes this a settle of leased ones;
                # and not deleted by another call meanwhile, whose tombstone took their ages already.
                cursor_bound = change.value(_num(chunk[0]))
                change.conditions.append(f"{change.name(schema.LOG_CURSOR)} <= {cursor_bound}")
                change.conditions += [f"NOT contains({tb}, {change.value(_num(p))})" for p in chunk]
                _add_created(change, waiting=-_entry_seconds(found.items[p] for p in chunk))
                if self._update(change, "delete") is None:
                    self._backoff(attempt)
                    break  # read the head again for the rest
                for p in chunk:
                    result.applied.append(positions.pop(p))
        if positions:
            raise StoreThrottledError("delete kept losing to concurrent claims; retry")
        return _ordered(result, ids)

    def _delete_scheduled(self, key: LogKey, item_id: str) -> bool:
        try:
            reply = self._client.delete_item(
                TableName=self._table, Key=_key(key, _schedule_sk(item_id, key.lane)), ReturnValues="ALL_OLD"
            )
        except ClientError as exc:
            raise translate(exc, "delete") from exc
        if codec.returned(reply, "Attributes") is None:
            return False
        change = _Change(_key(key, schema.LOG_HEAD_SK))
        change.adds.append(f"{change.name(schema.LOG_SCHEDULED)} {change.value(_num(-1))}")
        self._update(change, "delete")
        return True

    def get(self, key: LogKey, ids: Sequence[str], *, now: datetime) -> dict[str, Item]:
        found: dict[str, Item] = {}
        positions: dict[int, str] = {}
        scheduled: list[str] = []
        for item_id in dict.fromkeys(ids):
            parsed = parse_position_id(item_id)
            if parsed is not None and parsed[0] == key.lane:
                positions[parsed[1]] = item_id
            elif (sched := parse_scheduled_id(item_id)) is not None and sched[0] == key.lane:
                scheduled.append(item_id)
        if positions:
            head = self._head(key, "get")
            records = self._locate(key, head, sorted(positions), "get")
            wanted = [
                p
                for p in positions
                if p in records or (head.cursor <= p < head.tail and p not in head.tombstones)
            ]
            # One read of the rows under each cluster of nearby positions (a retry of a whole lease
            # reads its run's rows once), not one per id: O(rows holding them).
            read: dict[int, AttributeMap] = {}
            for cluster in _clusters(sorted(wanted), _GET_GAP):
                read.update(self._read_positions(key, cluster, "get").items)
            for p in wanted:
                if p not in read:
                    continue
                item = _item(read[p], positions[p])
                record = records.get(p)
                if record is not None:
                    item = replace(
                        record.coming(item, p),
                        attempts=item.attempts + 1,
                        lease_deadline=utc_from_timestamp_us(record.deadline),
                    )
                found[positions[p]] = item
        if scheduled:
            keys = [_key(key, _schedule_sk(item_id, key.lane)) for item_id in scheduled]
            for attrs in self._batch_get(keys, "get"):
                item_id = f"{key.lane}{SCHEDULED_MARK}{attrs[schema.SK]['S'][1:]}"
                found[item_id] = _item(
                    {k: v for k, v in attrs.items() if k not in (schema.PK, schema.SK)}, item_id
                )
        return {item_id: found[item_id] for item_id in ids if item_id in found}

    def list_items(self, key: LogKey, *, after: str, limit: int, now: datetime) -> list[Item]:
        if limit <= 0:
            return []
        listed: list[Item] = []
        position_floor = f"{key.lane}{POSITION_MARK}"
        schedule_floor = f"{key.lane}{SCHEDULED_MARK}"
        if after < schedule_floor:
            head = self._head(key, "list")
            records = list(head.records.values())
            if head.spilled:
                records += self._every_spilled(key, "list")
            held = {p: r for r in records for p in r.open()}
            parsed = parse_position_id(after) if after >= position_floor else None
            first = parsed[1] + 1 if parsed is not None and parsed[0] == key.lane else 0
            lowest = min([*held, head.cursor])
            position = max(first, lowest)
            while position < head.tail and len(listed) < limit:
                rows = self._rows_forward(key, position, limit)
                if not rows:
                    break
                for row in rows:
                    at = _row_position(row)
                    if schema.LOG_FILLER in row:
                        continue
                    for offset, entry in enumerate(row.get(schema.LOG_ITEMS, {}).get("L", [])):
                        p = at + offset
                        if p < position or len(listed) >= limit:
                            continue
                        item = _item(entry["M"], position_id(key.lane, p))
                        if p in held:
                            # As the claim handed it out: this lease's attempt counted (the row
                            # keeps the attempts before it), as ``get`` shows it.
                            listed.append(
                                replace(
                                    held[p].coming(item, p),
                                    attempts=item.attempts + 1,
                                    lease_deadline=utc_from_timestamp_us(held[p].deadline),
                                )
                            )
                        elif head.cursor <= p < head.tail and p not in head.tombstones:
                            listed.append(item)
                last = rows[-1]
                length = _row_length(last)
                position = _row_position(last) + length
        if len(listed) < limit:
            start = _schedule_sk(after, key.lane) if after > schedule_floor else schema.LOG_SCHEDULE_PREFIX
            rows, _ = self._query(
                "list",
                KeyConditionExpression="#pk = :pk AND #sk BETWEEN :lo AND :hi",
                ExpressionAttributeNames={"#pk": schema.PK, "#sk": schema.SK},
                ExpressionAttributeValues={
                    ":pk": _pk(key),
                    ":lo": {"S": start},
                    ":hi": {"S": f"{schema.LOG_SCHEDULE_PREFIX}~"},
                },
                Limit=limit - len(listed) + 1,
            )
            for attrs in rows:
                item_id = f"{key.lane}{SCHEDULED_MARK}{attrs[schema.SK]['S'][1:]}"
                if item_id > after:
                    listed.append(
                        _item({k: v for k, v in attrs.items() if k not in (schema.PK, schema.SK)}, item_id)
                    )
        return listed[:limit]

    def _rows_forward(self, key: LogKey, position: int, limit: int) -> list[AttributeMap]:
        """Rows from the one holding ``position`` on, up to a page."""
        back = self._rows_back(key, position, position, "list")
        first = back[0] if back else None
        rows, _ = self._query(
            "list",
            KeyConditionExpression="#pk = :pk AND #sk BETWEEN :lo AND :hi",
            ExpressionAttributeNames={"#pk": schema.PK, "#sk": schema.SK},
            ExpressionAttributeValues={
                ":pk": _pk(key),
                ":lo": {"S": _row_sk(position + 1)},
                ":hi": {"S": f"{schema.LOG_ROW_PREFIX}~"},
            },
            Limit=max(1, min(limit, _ROW_PAGE)),
        )
        if first is not None:
            at = _row_position(first)
            length = _row_length(first)
            if at + length > position:
                rows = [first, *rows]
        return rows

    def skip_waiting(self, key: LogKey, *, now: datetime) -> int:
        for attempt in range(_RETRIES + 1):
            head = self._head(key, "clear")
            if not head.exists or head.cursor >= head.tail:
                return 0
            dropped = [p for p in head.tombstones if head.cursor <= p < head.tail]
            change = _Change(_key(key, schema.LOG_HEAD_SK))
            cur = change.name(schema.LOG_CURSOR)
            change.sets.append(f"{cur} = {change.value(_num(head.tail))}")
            change.conditions.append(f"{cur} = {change.value(_num(head.cursor))}")
            # The waiting items' ages go with them; a take since the read added its own, which stay
            # (its positions are at or after the tail read, so they still wait).
            _add_created(change, waiting=-head.waiting_created)
            if dropped:
                change.deletes.append(
                    f"{change.name(schema.LOG_TOMBSTONES)} {change.value(_numbers(dropped))}"
                )
            if self._update(change, "clear") is None:
                self._backoff(attempt)
                continue
            return head.tail - head.cursor - len(dropped)
        raise StoreThrottledError("clear kept losing to concurrent claims; retry")

    def purge(self, key: LogKey, *, limit: int) -> int:
        if limit <= 0:
            return 0
        rows, _ = self._query(
            "purge",
            KeyConditionExpression="#pk = :pk",
            ExpressionAttributeNames={"#pk": schema.PK, "#sk": schema.SK},
            ExpressionAttributeValues={":pk": _pk(key)},
            ProjectionExpression="#pk, #sk",
            Limit=limit + 1,
        )
        if len(rows) <= limit:
            # The last page: everything left goes, the head with it.
            chosen = rows
        else:
            # The head goes last: other rows first.
            chosen = [r for r in rows if r[schema.SK]["S"] != schema.LOG_HEAD_SK][:limit]
        keys = [{schema.PK: r[schema.PK], schema.SK: r[schema.SK]} for r in chosen]
        self._batch_delete(keys, "purge")
        return len(keys)


__all__ = ["HEAD_RECORDS", "SPILL", "DynamoDBClaimLog"]
