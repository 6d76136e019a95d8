"""Spark producer, pure part: a source row becomes a ``NewItem``; rows and chunks get deterministic keys.

Nothing here imports pyspark, so the whole mapping is unit-tested without a Spark session. A row is a
plain mapping of column name to Python value (what ``Row.asDict(recursive=True)`` gives). The keys
are what make a bulk load exactly-once (docs/adr/0020-spark-bulk-producer.md): the same rows under
the same job id always sort, chunk and hash the same way, so a retried produce call carries the
same idempotency key as the first one.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeVar

from querator.api.durations import format_timestamp, parse_timestamp
from querator.domain.errors import InvalidRequestError
from querator.domain.groups import validate_group
from querator.domain.model import MAX_BATCH, MAX_PAYLOAD_BYTES, MAX_REFERENCE_BYTES, NewItem
from querator.domain.priority import DEFAULT_PRIORITY, validate_priority

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

#: The contract's body limit for ``queue.produce`` is 5,000,000 bytes. Chunks are sized against an
#: estimate of the JSON body (``wire_size``) with a margin for the envelope and for clients that
#: escape more than the estimate assumes. Both write paths use the same limit, so a job may switch
#: between them on a re-run and still find its earlier chunks (docs/adr/0020).
MAX_CHUNK_WIRE_BYTES = 4_000_000
#: The contract's item limit for one produce call.
MAX_CHUNK_ITEMS = MAX_BATCH
#: Longest row description kept in a report: an invalid row may carry a 10 MB payload.
_DESCRIBE_CHARS = 200
#: JSON overhead of one item beyond its strings: keys, quotes, commas, the ``enqueue_at`` and
#: ``priority`` values.
_ITEM_OVERHEAD_BYTES = 120
#: ... and of the ``group`` key, counted only for an item that has a group (``wire_size``).
_GROUP_OVERHEAD_BYTES = len(', "group": ')
#: A priority given as text (CSV sources read every column as a string): decimal digits only.
_PRIORITY_TEXT = re.compile(r"[0-9]+")

T = TypeVar("T")


class InvalidRowError(InvalidRequestError):
    """Source row cannot become an item."""

    code = "invalid_row"


@dataclass(frozen=True, slots=True, kw_only=True)
class ColumnMap:
    """Which source columns make up an item.

    Parameters
    ----------
    payload
        One column: ``bytes`` (binary) are the payload as is, a string is stored as UTF-8, any other
        value as its JSON text. Several columns: a JSON object of those columns, in this order.
    key
        Optional column that identifies a row (e.g. a primary key). Without it a row is identified
        by its content and the job id; with it, two rows with the same key are still two items.
    reference, kind, encoding
        Optional string columns; a null value is the empty string (or the default below).
    enqueue_at
        Optional column: an aware datetime or an RFC 3339 string; null or empty means "now".
    priority
        Optional column: an integer 0-9, lower leases first (or its decimal text, as CSV gives it);
        null or empty means 5, the default priority.
    group
        Optional string column: the item's group, a tenant or customer (at most 128 bytes of UTF-8,
        no control characters or line separators); null or empty means none.
    default_kind, default_encoding
        Values used when there is no such column or the row's value is null.
    """

    payload: tuple[str, ...]
    key: str | None = None
    reference: str | None = None
    kind: str | None = None
    encoding: str | None = None
    enqueue_at: str | None = None
    priority: str | None = None
    group: str | None = None
    default_kind: str = ""
    default_encoding: str = ""

    def __post_init__(self) -> None:
        if not self.payload:
            raise ValueError("at least one payload column is required")
        if len(set(self.payload)) != len(self.payload):
            raise ValueError(f"payload columns repeat: {self.payload}")
        for name in self.source_columns:
            if not name:
                raise ValueError("column names may not be empty")
        for default in (self.default_kind, self.default_encoding):
            if len(default.encode()) > MAX_REFERENCE_BYTES:
                raise ValueError(f"a default is longer than {MAX_REFERENCE_BYTES} bytes")

    @property
    def source_columns(self) -> tuple[str, ...]:
        """Every column the mapping reads, each once, payload first."""
        named = (
            self.key,
            self.reference,
            self.kind,
            self.encoding,
            self.enqueue_at,
            self.priority,
            self.group,
        )
        return tuple(dict.fromkeys([*self.payload, *(n for n in named if n is not None)]))


@dataclass(frozen=True, slots=True, kw_only=True)
class RowError:
    """An invalid row, as reported back to the caller (never silently dropped)."""

    #: The key column's value, or the start of the row when there is no key column.
    row: str
    #: The column at fault, when one is.
    column: str
    reason: str


def row_to_item(
    row: Mapping[str, Any], columns: ColumnMap, *, payload_limit: int = MAX_PAYLOAD_BYTES
) -> NewItem:
    """Map one source row to a ``NewItem``.

    Raises
    ------
    InvalidRowError
        A column is missing, a payload is null or too large, a string is too long, a value has a
        type the column cannot hold, ``enqueue_at`` is not an aware timestamp, ``priority`` is
        not an integer 0-9, or ``group`` is not a group (``querator.domain.groups``). ``context``
        has ``column``.
    """
    payload = _payload(row, columns.payload)
    if len(payload) > payload_limit:
        column = ",".join(columns.payload)
        raise InvalidRowError(
            f"{column}: the payload is {len(payload)} bytes, more than {payload_limit}", column=column
        )
    reference = _text(row, columns.reference, "")
    kind = _text(row, columns.kind, columns.default_kind)
    encoding = _text(row, columns.encoding, columns.default_encoding)
    enqueue_at = _enqueue_at(row, columns.enqueue_at)
    priority = _priority(row, columns.priority)
    group = _group(row, columns.group)
    try:
        return NewItem(
            payload=payload,
            reference=reference,
            encoding=encoding,
            kind=kind,
            enqueue_at=enqueue_at,
            priority=priority,
            group=group,
        )
    except InvalidRequestError as exc:
        # The checks above name the column; this is the domain's last word on anything they miss.
        raise InvalidRowError(f"row: {exc}", column="row") from exc


def row_key(row: Mapping[str, Any], columns: ColumnMap, item: NewItem, *, job_id: str) -> str:
    """The row's identity within a job: from the key column when there is one, else the item's content.

    The job id is part of it, so two jobs over the same source are two loads, and a re-run of one
    job is the same load.

    Raises
    ------
    InvalidRowError
        The key column is missing or null.
    """
    if columns.key is None:
        return _sha256("row", job_id, "item", item_digest(item))
    value = _value(row, columns.key)
    if value is None:
        raise InvalidRowError(f"{columns.key}: the key column is null", column=columns.key)
    return _sha256("row", job_id, "key", _canonical_json(value, columns.key))


def item_digest(item: NewItem) -> str:
    """A digest of everything the item carries; orders rows that share a key.

    The priority is part of it only when it is not the default, and the group only when there is
    one, so an item of priority 5 without a group has the digest it had before either existed.
    """
    enqueue_at = "" if item.enqueue_at is None else format_timestamp(item.enqueue_at)
    fields = [item.reference, item.encoding, item.kind, enqueue_at]
    if item.priority != DEFAULT_PRIORITY:
        fields.append(f"priority={item.priority}")
    if item.group:
        fields.append(f"group={item.group}")
    return hashlib.sha256(_framed(*fields) + item.payload).hexdigest()


def chunk_key(job_id: str, queue: str, row_keys: Iterable[str]) -> str:
    """The idempotency key of one produce call: the job, the queue and exactly which rows it carries."""
    return "spark-" + _sha256("chunk", job_id, queue, *row_keys)


def bucket_of(row_key_hex: str) -> int:
    """A stable integer from a row key, for Spark's partitioner (no Python ``hash``, which is salted)."""
    return int(row_key_hex[:8], 16)


def wire_size(item: NewItem) -> int:
    """An upper estimate of the item's size in a JSON produce body (payload as base64)."""
    base64_bytes = 4 * ((len(item.payload) + 2) // 3)
    strings = sum(len(json.dumps(text)) for text in (item.reference, item.kind, item.encoding))
    # The group only when there is one (the client leaves it out when empty): an item without one
    # keeps the size it had before items had groups, so a re-run cuts a job's chunks the same.
    group = len(json.dumps(item.group)) + _GROUP_OVERHEAD_BYTES if item.group else 0
    return base64_bytes + strings + group + _ITEM_OVERHEAD_BYTES


def chunks_of(
    records: Iterable[T],
    *,
    size_of: Callable[[T], int],
    max_items: int = MAX_CHUNK_ITEMS,
    max_bytes: int = MAX_CHUNK_WIRE_BYTES,
) -> Iterator[list[T]]:
    """Cut a stream into consecutive chunks of at most ``max_items`` and at most ``max_bytes``.

    Deterministic: the same stream always gives the same chunks. A single record larger than
    ``max_bytes`` gets a chunk of its own (``NewItem`` already bounds an item far below the limit).
    """
    chunk: list[T] = []
    size = 0
    for record in records:
        record_size = size_of(record)
        if chunk and (len(chunk) >= max_items or size + record_size > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(record)
        size += record_size
    if chunk:
        yield chunk


def describe_row(row: Mapping[str, Any], columns: ColumnMap) -> str:
    """A short, printable reference to a row for reports: its key, or the start of its values."""
    if columns.key is not None and row.get(columns.key) is not None:
        text = f"{columns.key}={row[columns.key]!r}"
    else:
        text = ", ".join(f"{name}={row.get(name)!r}" for name in columns.source_columns)
    return text if len(text) <= _DESCRIBE_CHARS else text[: _DESCRIBE_CHARS - 1] + "…"


# -- helpers -------------------------------------------------------------------------------------


def _value(row: Mapping[str, Any], column: str) -> Any:
    if column not in row:
        raise InvalidRowError(f"{column}: no such column in the row", column=column)
    return row[column]


def _payload(row: Mapping[str, Any], names: Sequence[str]) -> bytes:
    if len(names) == 1:
        name = names[0]
        value = _value(row, name)
        if value is None:
            raise InvalidRowError(f"{name}: the payload column is null", column=name)
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
        if isinstance(value, str):
            return value.encode()
        return _canonical_json(value, name).encode()
    document = {name: _value(row, name) for name in names}
    return _canonical_json(document, ",".join(names)).encode()


def _text(row: Mapping[str, Any], column: str | None, default: str) -> str:
    if column is None:
        return default
    value = _value(row, column)
    if value is None:
        return default
    if not isinstance(value, str):
        raise InvalidRowError(f"{column}: expected a string, got {type(value).__name__}", column=column)
    if len(value.encode()) > MAX_REFERENCE_BYTES:
        raise InvalidRowError(f"{column}: longer than {MAX_REFERENCE_BYTES} bytes", column=column)
    return value


def _enqueue_at(row: Mapping[str, Any], column: str | None) -> dt.datetime | None:
    if column is None:
        return None
    value = _value(row, column)
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            return parse_timestamp(value.strip())
        except InvalidRequestError as exc:
            raise InvalidRowError(f"{column}: {exc}", column=column) from exc
    if isinstance(value, dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            # A naive time would be read in whatever zone the executor runs in.
            raise InvalidRowError(f"{column}: the timestamp has no time zone", column=column)
        return value.astimezone(dt.timezone.utc)
    raise InvalidRowError(
        f"{column}: expected a timestamp or an RFC 3339 string, got {type(value).__name__}", column=column
    )


def _priority(row: Mapping[str, Any], column: str | None) -> int:
    if column is None:
        return DEFAULT_PRIORITY
    value = _value(row, column)
    if value is None or (isinstance(value, str) and not value.strip()):
        return DEFAULT_PRIORITY
    number: object = value
    if isinstance(value, str) and _PRIORITY_TEXT.fullmatch(value.strip()):
        number = int(value.strip())
    elif isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value():
        number = int(value)  # a DECIMAL(p, 0) column (a database's NUMBER)
    try:
        return validate_priority(number, column)
    except InvalidRequestError as exc:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:39] + "…"
        raise InvalidRowError(
            f"{column}: the priority must be an integer between 0 and 9, got {shown}", column=column
        ) from exc


def _group(row: Mapping[str, Any], column: str | None) -> str:
    if column is None:
        return ""
    value = _value(row, column)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidRowError(f"{column}: expected a string, got {type(value).__name__}", column=column)
    try:
        return validate_group(value, "the group")
    except InvalidRequestError as exc:
        raise InvalidRowError(f"{column}: {exc}", column=column) from exc


def _canonical_json(value: Any, column: str) -> str:
    try:
        return json.dumps(
            value, default=_json_default, ensure_ascii=False, allow_nan=False, separators=(",", ":")
        )
    except (TypeError, ValueError) as exc:
        raise InvalidRowError(f"{column}: cannot be written as JSON: {exc}", column=column) from exc


def _json_default(value: object) -> object:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            return value.isoformat()
        return format_timestamp(value)
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, Decimal):
        # As a string: a float would lose digits the source had.
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if hasattr(value, "asDict"):  # a nested pyspark Row that was not converted recursively
        return value.asDict(recursive=True)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _framed(*parts: str) -> bytes:
    """Length-prefixed parts, so ("ab", "c") and ("a", "bc") hash differently."""
    return b"".join(len(encoded).to_bytes(4, "big") + encoded for encoded in (p.encode() for p in parts))


def _sha256(*parts: str) -> str:
    return hashlib.sha256(_framed("querator-spark", *parts)).hexdigest()


__all__ = [
    "MAX_CHUNK_ITEMS",
    "MAX_CHUNK_WIRE_BYTES",
    "ColumnMap",
    "InvalidRowError",
    "RowError",
    "bucket_of",
    "chunk_key",
    "chunks_of",
    "describe_row",
    "item_digest",
    "row_key",
    "row_to_item",
    "wire_size",
]
