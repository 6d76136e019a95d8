"""Count DynamoDB requests and the capacity units AWS would charge for them.

The units follow DynamoDB's published on-demand/provisioned rules, computed from the stored item
sizes; moto's ``ConsumedCapacity`` figures are not used because they do not follow those rules.
The meter hooks botocore events: ``before-parameter-build`` records the request and the size of
every item a write will replace, ``after-call`` charges the call. To learn sizes it peeks at the
table through an un-metered ``raw_client`` (strongly consistent ``GetItem``, ``DescribeTable`` for
key schemas, and a filter-less copy of each ``Query``/``Scan``).

Approximations, all documented where they apply:

* item sizes follow the published per-type rules (numbers and nested documents are approximate);
* the after-image of an ``UpdateItem`` is read after the call, so a concurrent write to the same
  item in between can be measured instead;
* reads of missing items and empty queries are charged one unit (0.5 if eventually consistent);
* a cancelled ``TransactWriteItems`` is charged 2 x the units of each target's current size;
* write units are also kept per partition key (``CostSnapshot.write_units_by_key``): DynamoDB
  takes at most 1,000 a second on one key, so the hottest key bounds what a queue partition carries;
* only the table's own units are counted: writes that secondary indexes replicate (and LSI
  fetches of unprojected attributes) are not, so add them separately for a model with indexes.

PynamoDB: its ``Connection`` creates one botocore client, lazily, from a per-thread
``Connection.session``; ``attach_session(Model._get_connection().connection.session)`` therefore
meters the model's calls when it runs in the thread that later creates the client (or use
``attach(Model._get_connection().connection.client)``). PynamoDB calls ``client._make_api_call``,
which emits the same events as the public methods.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError, ParamValidationError

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from botocore.client import BaseClient
    from botocore.model import OperationModel
    from botocore.session import Session
    from mypy_boto3_dynamodb import DynamoDBClient

#: A low-level DynamoDB attribute map, e.g. ``{"pk": {"S": "q#1"}}``.
AttributeMap = dict[str, Any]

_SINGLE_WRITES = ("PutItem", "UpdateItem", "DeleteItem")
# Everything that narrows what a Query/Scan returns but not what it reads (and is charged for).
_UNCHARGED_NARROWING = frozenset(
    {
        "FilterExpression",
        "ProjectionExpression",
        "Select",
        "AttributesToGet",
        "QueryFilter",
        "ScanFilter",
        "ConditionalOperator",
        "ReturnConsumedCapacity",
    }
)


def number_size(text: str) -> int:
    """Bytes of an ``N`` value: ceil(significant digits / 2) + 1.

    AWS: "The size of a number is approximately (1 byte per two significant digits) + (1 byte)";
    "leading and trailing zeroes are trimmed". Approximate: DynamoDB pairs digits around the
    decimal point, so the real size can be one byte more; zero counts as one digit.
    """
    mantissa = re.split("[eE]", text.strip())[0]
    digits = "".join(c for c in mantissa if c.isdigit()).strip("0")
    return (max(len(digits), 1) + 1) // 2 + 1


def binary_size(payload: bytes | bytearray | str) -> int:
    """Bytes of a ``B`` value: its raw length (botocore UTF-8 encodes a ``str`` before base64)."""
    return len(payload.encode() if isinstance(payload, str) else payload)


def value_size(value: Mapping[str, Any]) -> int:
    """Bytes of one attribute value under AWS's published "Item sizes and formats" rules.

    S: UTF-8 bytes; B: raw bytes; N: see ``number_size``; BOOL and NULL: 1; SS/NS/BS: the sum of the
    elements; L and M: 3 bytes + 1 byte per element + the elements (for M also the key names).
    """
    ((kind, payload),) = value.items()
    if kind == "S":
        return len(payload.encode())
    if kind == "N":
        return number_size(payload)
    if kind == "B":
        return binary_size(payload)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(s.encode()) for s in payload)
    if kind == "NS":
        return sum(number_size(n) for n in payload)
    if kind == "BS":
        return sum(binary_size(b) for b in payload)
    if kind == "L":
        return 3 + sum(value_size(v) + 1 for v in payload)
    if kind == "M":
        return 3 + sum(len(k.encode()) + value_size(v) + 1 for k, v in payload.items())
    raise ValueError(f"unknown DynamoDB attribute type {kind!r}")


def item_size(item: Mapping[str, Any]) -> int:
    """Bytes of an item: the sum over attributes of the UTF-8 name length plus the value size."""
    return sum(len(name.encode()) + value_size(value) for name, value in item.items())


def write_units(size: int) -> int:
    """Write units of one write: one per started KB of the item, at least 1.

    AWS: a write is charged on the larger of the item before and after it; a delete on the deleted
    item; a failed conditional write on "the size of the existing item (or a minimum of 1)".
    Transactional writes cost twice this.
    """
    return max(1, math.ceil(size / 1024))


def read_units(size: int, consistent: bool) -> float:
    """Read units of one read of ``size`` bytes: one per started 4 KB, at least one.

    AWS: a strongly consistent read costs 1 unit per 4 KB, an eventually consistent one half; a
    read of a missing item still costs 1 (0.5). Query and Scan sum the sizes of all the items they
    evaluated before rounding. Transactional reads cost twice the consistent rate.
    """
    return max(1, math.ceil(size / 4096)) * (1.0 if consistent else 0.5)


def unfiltered_request(params: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a Query/Scan request that returns every item the original evaluated.

    DynamoDB charges for the items read before ``FilterExpression`` and regardless of
    ``ProjectionExpression``, so both go (with ``Select``), and so do the placeholders only they
    used, because DynamoDB rejects unused ``ExpressionAttributeNames``/``Values``.
    """
    request = {k: v for k, v in params.items() if k not in _UNCHARGED_NARROWING}
    kept_expression = str(request.get("KeyConditionExpression", ""))
    for attr, pattern in (("ExpressionAttributeNames", r"#\w+"), ("ExpressionAttributeValues", r":\w+")):
        used = set(re.findall(pattern, kept_expression))
        kept = {k: v for k, v in request.pop(attr, {}).items() if k in used}
        if kept:
            request[attr] = kept
    return request


@dataclass(frozen=True)
class CostSnapshot:
    """Totals since the meter was created or last reset."""

    requests: int
    requests_by_operation: dict[str, int]
    write_units: float
    read_units: float
    failed_conditional_writes: int
    #: Write units by the partition key (its value) of the items written.
    write_units_by_key: dict[str, float]

    def hottest_key_write_units(self) -> float:
        """The write units of the partition key that took the most (0 without writes)."""
        return max(self.write_units_by_key.values(), default=0.0)


@dataclass(frozen=True)
class _Write:
    kind: str  # Put, Update, Delete or ConditionCheck
    table: str
    key: AttributeMap
    item: AttributeMap | None  # the new item of a Put


@dataclass(frozen=True)
class _Call:
    """What the before-hook learnt about a call, handed to the after-hook in botocore's context."""

    op: str
    params: dict[str, Any]
    writes: list[_Write]
    old_sizes: list[int]


@dataclass(frozen=True)
class _Charge:
    write_units: float = 0.0
    read_units: float = 0.0
    failed_conditional_writes: int = 0
    by_key: tuple[tuple[str, float], ...] = ()


class CostMeter:
    """Meters the DynamoDB calls of the clients attached to it."""

    def __init__(self, raw_client: DynamoDBClient) -> None:
        self._raw = raw_client
        self._lock = threading.Lock()
        # Set while the meter peeks, so its own calls are never metered even if raw_client shares
        # an attached session.
        self._local = threading.local()
        # Written without the lock: a race only costs a duplicate DescribeTable.
        self._key_names: dict[str, list[str]] = {}
        self._tag = f"querator-cost-meter-{id(self)}"
        self.reset()

    def attach(self, client: BaseClient) -> None:
        """Meter every later call of ``client``."""
        self._register(client.meta.events)

    def attach_session(self, session: Session) -> None:
        """Meter every client created from ``session`` from now on (clients copy its emitter)."""
        self._register(session.get_component("event_emitter"))

    def _register(self, events: Any) -> None:
        # Last, so that parameter rewrites by other handlers (e.g. boto3's resource layer) are seen;
        # the unique ids make attaching twice (client and its session) harmless.
        events.register_last("before-parameter-build.dynamodb", self._before, unique_id=f"{self._tag}-b")
        events.register("after-call.dynamodb", self._after, unique_id=f"{self._tag}-a")

    def reset(self) -> None:
        with self._lock:
            self._requests: Counter[str] = Counter()
            self._write_units = 0.0
            self._read_units = 0.0
            self._failed = 0
            self._by_key: dict[str, float] = {}

    def snapshot(self) -> CostSnapshot:
        with self._lock:
            return CostSnapshot(
                requests=sum(self._requests.values()),
                requests_by_operation=dict(self._requests),
                write_units=self._write_units,
                read_units=self._read_units,
                failed_conditional_writes=self._failed,
                write_units_by_key=dict(self._by_key),
            )

    # -- event handlers -------------------------------------------------------------------------

    def _before(
        self, params: dict[str, Any], model: OperationModel, context: dict[str, Any], **_: Any
    ) -> None:
        if getattr(self._local, "busy", False):
            return
        with self._peeking():
            try:
                writes = self._writes(model.name, params)
            except (KeyError, TypeError, AttributeError):
                # Malformed parameters: botocore's validation (or DynamoDB) rejects the call; leave
                # that error to the caller rather than raising a different one from this hook.
                writes = []
            old_sizes = [self._peek(w.table, w.key) for w in writes]
        context[self._tag] = _Call(model.name, params, writes, old_sizes)

    def _after(
        self,
        http_response: Any,
        parsed: dict[str, Any],
        model: OperationModel,
        context: dict[str, Any],
        **_: Any,
    ) -> None:
        if getattr(self._local, "busy", False) or self._tag not in context:
            return
        call: _Call = context[self._tag]
        error = parsed.get("Error", {}).get("Code") if http_response.status_code >= 300 else None
        with self._peeking():
            charge = self._charge(call, parsed, error)
        with self._lock:
            self._requests[call.op] += 1
            self._write_units += charge.write_units
            self._read_units += charge.read_units
            self._failed += charge.failed_conditional_writes
            for key, units in charge.by_key:
                self._by_key[key] = self._by_key.get(key, 0.0) + units

    # -- charging -------------------------------------------------------------------------------

    def _charge(self, call: _Call, parsed: dict[str, Any], error: str | None) -> _Charge:
        op, params, writes, old_sizes = call.op, call.params, call.writes, call.old_sizes
        if error == "ConditionalCheckFailedException" and op in _SINGLE_WRITES:
            units = write_units(old_sizes[0])
            return _Charge(
                write_units=units, failed_conditional_writes=1, by_key=((self._hash_of(writes[0]), units),)
            )
        if error == "TransactionCanceledException" and op == "TransactWriteItems":
            # Nothing was written, so each target is charged on its current size, at the
            # transactional rate; a condition among the reasons makes it a failed conditional write.
            reasons = parsed.get("CancellationReasons", [])
            failed = any(r.get("Code") == "ConditionalCheckFailed" for r in reasons)
            by_key = tuple(
                (self._hash_of(w), 2.0 * write_units(s)) for w, s in zip(writes, old_sizes, strict=True)
            )
            return _Charge(
                write_units=sum(units for _, units in by_key),
                failed_conditional_writes=int(failed),
                by_key=by_key,
            )
        if error is not None:
            return _Charge()
        if writes:
            by_key = self._write_charge(op, writes, old_sizes, parsed)
            return _Charge(write_units=sum(units for _, units in by_key), by_key=by_key)
        return _Charge(read_units=self._read_charge(op, params, parsed))

    def _read_charge(self, op: str, params: dict[str, Any], parsed: dict[str, Any]) -> float:
        if op == "GetItem":
            size = self._peek(params["TableName"], params["Key"])
            return read_units(size, bool(params.get("ConsistentRead")))
        if op == "BatchGetItem":
            unprocessed = parsed.get("UnprocessedKeys", {})
            units = 0.0
            for table, spec in params["RequestItems"].items():
                skipped = unprocessed.get(table, {}).get("Keys", [])
                for key in (k for k in spec["Keys"] if k not in skipped):
                    units += read_units(self._peek(table, key), bool(spec.get("ConsistentRead")))
            return units
        if op == "TransactGetItems":
            gets = [action["Get"] for action in params["TransactItems"]]
            # Transactional reads are strongly consistent and cost twice as much.
            return sum(2 * read_units(self._peek(g["TableName"], g["Key"]), True) for g in gets)
        if op in ("Query", "Scan"):
            request = unfiltered_request(params)
            try:
                response: Any = self._raw.query(**request) if op == "Query" else self._raw.scan(**request)
            except ClientError:  # the original failed the same way or the data changed under us
                return 0.0
            size = sum(item_size(i) for i in response.get("Items", []))
            return read_units(size, bool(params.get("ConsistentRead")))
        return 0.0

    def _write_charge(
        self, op: str, writes: list[_Write], old_sizes: list[int], parsed: dict[str, Any]
    ) -> tuple[tuple[str, float], ...]:
        """The units of each item written, with its partition key."""
        # BatchWriteItem does not charge the items it hands back as unprocessed.
        unprocessed = self._writes("BatchWriteItem", {"RequestItems": parsed.get("UnprocessedItems", {})})
        skipped = [(w.table, w.key) for w in unprocessed]
        factor = 2 if op == "TransactWriteItems" else 1
        charged: list[tuple[str, float]] = []
        for write, old in zip(writes, old_sizes, strict=True):
            if (write.table, write.key) in skipped:
                continue
            if write.item is not None:
                new = item_size(write.item)
            elif write.kind == "Update":
                new = self._peek(write.table, write.key)
            else:
                new = 0
            charged.append((self._hash_of(write), float(factor * write_units(max(old, new)))))
        return tuple(charged)

    def _hash_of(self, write: _Write) -> str:
        """The partition key value of the item ``write`` targets (its table's hash key)."""
        names = self._key_names.get(write.table) or list(write.key)
        value = write.key.get(names[0], {}) if names else {}
        return f"{write.table}:{next(iter(value.values()), '')}" if value else write.table

    # -- peeking --------------------------------------------------------------------------------

    def _writes(self, op: str, params: Mapping[str, Any]) -> list[_Write]:
        """The items a write request targets, in request order; [] for other requests."""
        if op in _SINGLE_WRITES:
            return [self._write(op.removesuffix("Item"), params)]
        if op == "BatchWriteItem":
            return [
                self._write(
                    "Put" if "PutRequest" in r else "Delete",
                    {"TableName": table, **(r.get("PutRequest") or r["DeleteRequest"])},
                )
                for table, requests in params["RequestItems"].items()
                for r in requests
            ]
        if op == "TransactWriteItems":
            return [
                self._write(kind, body) for action in params["TransactItems"] for kind, body in action.items()
            ]
        return []

    def _write(self, kind: str, body: Mapping[str, Any]) -> _Write:
        item = body.get("Item")
        key = body["Key"] if item is None else self._key_of(body["TableName"], item)
        return _Write(kind, body["TableName"], key, item)

    def _key_of(self, table: str, item: Mapping[str, Any]) -> AttributeMap:
        names = self._key_names.get(table)
        if names is None:
            try:
                schema = self._raw.describe_table(TableName=table)["Table"].get("KeySchema", [])
            except ClientError:  # no such table: the write itself will fail and be charged nothing
                return {}
            names = self._key_names[table] = [k["AttributeName"] for k in schema]
        return {name: item[name] for name in names if name in item}

    def _peek(self, table: str, key: AttributeMap) -> int:
        """The stored size of the item at ``key``, 0 if there is none (or it cannot be read)."""
        try:
            item = self._raw.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")
        except (ClientError, ParamValidationError):
            return 0
        return item_size(item) if item else 0

    @contextmanager
    def _peeking(self) -> Iterator[None]:
        self._local.busy = True
        try:
            yield
        finally:
            self._local.busy = False
