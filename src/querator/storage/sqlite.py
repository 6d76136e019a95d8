"""Storage layer: the SQLite store and catalog, one file on this machine (stdlib ``sqlite3``).

For ``querator serve`` (its default store) and ``querator.embedded``. Adapter notes, where it differs
from the ``ItemStore`` port or the DynamoDB reference:

- The port's semantics are ``storage.engine``'s, over tables keyed like the reference's rows:
  items by ``(queue, partition, id)``, so a range read is an index range, O(log n + k)
  (``WITHOUT ROWID``: the primary key is the clustered index, no second lookup).
- Every port call is one transaction; writes start with ``BEGIN IMMEDIATE``, so a guarded write's
  check and write cannot interleave with another writer, in this process (threads, each transaction
  on a pooled connection of its own) or another one on the machine (the file lock).
  ``busy_timeout`` makes a writer wait for the lock instead of failing. WAL lets readers run beside
  the writer.
- Engine v3's claim log (``SQLiteClaimLog``: ``storage.log_engine`` over the ``log_*`` tables of
  schema 7, beside v2's in the same file). An append whose items are due now and fit one row is one
  ``INSERT`` in a transaction of its own: its positions start at the log's tail, the larger of the
  head's (which only reservations and larger appends move) and the end of its rows, so it writes no
  head row; ``LogHead.produced`` is derived the same way (the head's notes). A claim's
  fetch-and-add is one ``UPDATE ... RETURNING`` of the head.
- The write-ahead log is checkpointed every ``WAL_CHECKPOINT_PAGES`` pages rather than SQLite's
  1,000: a checkpoint's disk flushes were a fifth of a small write's cost.
- Durability is the store URL's choice (``sqlite:PATH?sync=full``): ``synchronous=NORMAL`` in WAL
  mode by default, where a committed write survives the process being killed but the last writes
  before an OS crash or a power cut may be lost; ``FULL`` flushes the log to disk at every commit,
  so an acknowledged write survives those too. On this project's machines FULL cost one disk flush
  (about 4 ms) per commit: a commit of one 100 B row went from 18,000-33,000 a second to 240-270,
  of 100 rows from 167,000 rows a second to 24,000 (docs/adr/0060-embedded-stores.md).
- The file is identified by ``PRAGMA application_id`` and carries its schema version in
  ``querator_meta``. ``SQLiteDatabase`` checks both on a read-only connection before writing
  anything, so a file that is not a Querator database, or one from a newer Querator, is refused and
  left as it was.
"""

from __future__ import annotations

import json
import sqlite3
import struct
import threading
from array import array
from contextlib import contextmanager
from dataclasses import asdict, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from querator.domain.errors import (
    ConflictError,
    QueueAlreadyExistsError,
    QueueNotFoundError,
    StoreThrottledError,
    StoreUnavailableError,
)
from querator.domain.ids import join_ids, split_ids
from querator.domain.model import (
    REPLY_SIZE_THRESHOLD,
    Item,
    ItemState,
    QueueInfo,
    timestamp_us,
    utc_from_timestamp_us,
)
from querator.domain.positions import POSITION_MARK
from querator.domain.priority import lane_of
from querator.ports import (
    BatchResult,
    GroupLedger,
    Guard,
    IdempotencyRecord,
    LeaseRecord,
    PartitionHead,
    Recount,
)
from querator.storage.counters import (
    CounterDeltas,
    scheduled_until_claimed,
    scheduled_when_written,
    still_scheduled,
)
from querator.storage.engine import SortedRowsStore, open_before
from querator.storage.log_engine import (
    ROW_BYTES,
    ClaimLogEngine,
    HeadRow,
    PackedRow,
    RunRecord,
    created_of,
    encode_item,
    pack_row,
    with_id,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from datetime import datetime

    from querator.ports.log import LogKey

#: "QRTR": what ``PRAGMA application_id`` holds in a Querator database.
APPLICATION_ID = 0x51525452
#: The schema this code writes. A file with a higher version was written by a newer Querator.
SCHEMA_VERSION = 9
#: Lease rate-limit buckets: a bucket's ``tat`` (``querator.domain.ratelimit``), one row per queue
#: and per group that leased under a limit, dropped with the queue.
_RATE_BUCKETS = (
    "CREATE TABLE rate_buckets ("
    " queue TEXT NOT NULL, bucket TEXT NOT NULL, tat_us INTEGER NOT NULL,"
    " PRIMARY KEY (queue, bucket)) WITHOUT ROWID"
)
#: Engine v3's claim logs (``storage.log_engine``; docs/adr/0100-engine-v3-candidates.md), beside
#: v2's tables, which they leave as they are. A log is ``(queue, part, lane)``: its head; its packed
#: rows by first position (``items`` NULL: a filler); its lease records by token (the run's first
#: position in 16 hex digits, then random: so by run) and by deadline; its schedule by scheduled id
#: (so by due time). Positions, times and records' ranges are integers and blobs, not JSON.
_CLAIM_LOGS = (
    "CREATE TABLE log_heads ("
    " queue TEXT NOT NULL, part INTEGER NOT NULL, lane TEXT NOT NULL,"
    " tail INTEGER NOT NULL, cursor INTEGER NOT NULL, leases INTEGER NOT NULL, leased INTEGER NOT NULL,"
    " scheduled INTEGER NOT NULL, largest INTEGER NOT NULL, tombstones BLOB,"
    # ``claimed``: where the last claim's run started, what its fetch-and-add returns (RETURNING
    # sees new values). ``LogHead.produced`` is the positions after ``origin`` (the log's first)
    # plus ``produced``: the items produced without a position of their own (scheduled, or written
    # at reserved ones) less the positions of moves and reservations. So a produce of one row need
    # not write the head.
    " claimed INTEGER NOT NULL, origin INTEGER NOT NULL, produced INTEGER NOT NULL,"
    " completed INTEGER NOT NULL,"
    " PRIMARY KEY (queue, part, lane)) WITHOUT ROWID",
    "CREATE TABLE log_rows ("
    " queue TEXT NOT NULL, part INTEGER NOT NULL, lane TEXT NOT NULL, first INTEGER NOT NULL,"
    " count INTEGER NOT NULL, largest INTEGER NOT NULL, items BLOB,"
    " PRIMARY KEY (queue, part, lane, first)) WITHOUT ROWID",
    "CREATE TABLE log_leases ("
    " queue TEXT NOT NULL, part INTEGER NOT NULL, lane TEXT NOT NULL, token TEXT NOT NULL,"
    " run_end INTEGER NOT NULL, deadline_us INTEGER NOT NULL, claimed_us INTEGER NOT NULL,"
    " pending BLOB NOT NULL, holes BLOB,"
    " PRIMARY KEY (queue, part, lane, token)) WITHOUT ROWID",
    "CREATE INDEX log_leases_deadline ON log_leases (queue, part, lane, deadline_us)",
    "CREATE TABLE log_schedule ("
    " queue TEXT NOT NULL, part INTEGER NOT NULL, lane TEXT NOT NULL, id TEXT NOT NULL, item BLOB NOT NULL,"
    " PRIMARY KEY (queue, part, lane, id)) WITHOUT ROWID",
)
#: The sums of ``created_at`` seconds a row's items and a record's pending items add (``LogAges``):
#: ``queue.stats`` sums the rows from the cursor on and the records, in SQL, without decoding them.
_CLAIM_LOG_AGES = (
    "ALTER TABLE log_rows ADD COLUMN created INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE log_leases ADD COLUMN created INTEGER NOT NULL DEFAULT 0",
)
#: A leased log item's coming priority (``ClaimLog.set_next_priority``, ``queue.reprioritize``):
#: ``(position, priority)`` pairs of a lease record, as int64s; NULL for none (most records).
_LEASE_PRIORITIES = ("ALTER TABLE log_leases ADD COLUMN priorities BLOB",)
#: Why an item last failed and how many failures it had (``Item.last_reason``, ``Item.failures``):
#: NULL on an item that never failed. The claim logs' rows carry them in their items' encoding
#: (``storage.log_engine``), which a Querator older than schema 9 would misread: hence the version.
_FAILURE_COLUMNS = (
    "ALTER TABLE items ADD COLUMN last_reason TEXT",
    "ALTER TABLE items ADD COLUMN failures INTEGER",
)
#: What each version adds to the one before, applied in order when a file of an older version opens.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    # 2: the queue a dead letter came from, for queue.redrive.
    2: ("ALTER TABLE items ADD COLUMN source_queue TEXT NOT NULL DEFAULT ''",),
    # 3: priorities: the bands in use and their cursors and sweep marks, as JSON.
    3: ("ALTER TABLE heads ADD COLUMN bands TEXT",),
    # 4: the priority a leased item goes back with (queue.reprioritize).
    4: ("ALTER TABLE items ADD COLUMN next_priority INTEGER",),
    # 5: the item's group ("group" is an SQL keyword), and the items produced and completed ever.
    5: (
        "ALTER TABLE items ADD COLUMN item_group TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE heads ADD COLUMN produced INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE heads ADD COLUMN completed INTEGER NOT NULL DEFAULT 0",
        # and the queue's delivery ("fifo" or "fair") and its cap on the leases of one group.
        "ALTER TABLE queues ADD COLUMN delivery TEXT NOT NULL DEFAULT 'fifo'",
        "ALTER TABLE queues ADD COLUMN max_leased_per_group INTEGER NOT NULL DEFAULT 0",
    ),
    # 6: lease rate limits: the queue's settings and the buckets (docs/adr/0081-lease-rate-limits.md).
    6: (
        "ALTER TABLE queues ADD COLUMN rate_limit REAL NOT NULL DEFAULT 0",
        "ALTER TABLE queues ADD COLUMN rate_limit_per_group REAL NOT NULL DEFAULT 0",
        _RATE_BUCKETS,
    ),
    # 7: engine v3's claim logs, new tables only: v2's items, heads and records stay as they were.
    7: _CLAIM_LOGS,
    # 8: the claim logs' sums of their items' creation times, for queue.stats' ages; and the
    # priority a leased log item goes back with, kept with its lease record.
    8: (*_CLAIM_LOG_AGES, *_LEASE_PRIORITIES),
    # 9: failure reasons: on v2's items as columns, in v3's rows as part of an item's encoding.
    9: _FAILURE_COLUMNS,
}
#: Pages the write-ahead log takes before a commit copies them back into the file (SQLite's default
#: is 1,000). A checkpoint flushes the log and the file to disk, the one flush ``synchronous=NORMAL``
#: does, and copies each page once however often the log holds it: a small write (a produce of one
#: item, one page) paid a checkpoint's share of 4-5 us at 1,000 pages (issue 35: the claim log's
#: produce b1 went from 0.9x to 1.3x persist-queue's with 10,000). The log then grows to ~40 MB
#: under load and is cut back to ``WAL_KEPT_BYTES`` after each checkpoint.
WAL_CHECKPOINT_PAGES = 10_000
WAL_KEPT_BYTES = 4 * 1024 * 1024
#: How long a writer waits for another's lock before the call fails (milliseconds).
BUSY_TIMEOUT_MS = 10_000
#: Connections kept open between transactions (more are opened under load and closed after).
_IDLE_CONNECTIONS = 8

_SCHEMA = (
    """
CREATE TABLE querator_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE items (
    queue TEXT NOT NULL, part INTEGER NOT NULL, id TEXT NOT NULL,
    attempts INTEGER NOT NULL, lease_us INTEGER, expire_us INTEGER NOT NULL,
    created_us INTEGER NOT NULL, enqueue_us INTEGER, size INTEGER NOT NULL,
    payload BLOB NOT NULL, reference TEXT NOT NULL, encoding TEXT NOT NULL, kind TEXT NOT NULL,
    source_id TEXT NOT NULL, source_queue TEXT NOT NULL DEFAULT '', next_priority INTEGER,
    item_group TEXT NOT NULL DEFAULT '', last_reason TEXT, failures INTEGER,
    PRIMARY KEY (queue, part, id)
) WITHOUT ROWID;
CREATE TABLE heads (
    queue TEXT NOT NULL, part INTEGER NOT NULL,
    cursor TEXT NOT NULL, sweep TEXT NOT NULL, schedule_mark TEXT NOT NULL,
    items INTEGER NOT NULL, leased INTEGER NOT NULL, scheduled INTEGER NOT NULL,
    created_sum INTEGER NOT NULL, leased_created_sum INTEGER NOT NULL,
    scheduled_created_sum INTEGER NOT NULL,
    version INTEGER NOT NULL DEFAULT 0, recount TEXT, recounted_us INTEGER, bands TEXT,
    produced INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, part)
) WITHOUT ROWID;
CREATE TABLE lease_records (
    queue TEXT NOT NULL, part INTEGER NOT NULL, key TEXT NOT NULL,
    deadline_us INTEGER NOT NULL, ids TEXT NOT NULL,
    PRIMARY KEY (queue, part, key)
) WITHOUT ROWID;
CREATE TABLE idempotency (
    queue TEXT NOT NULL, key TEXT NOT NULL, part INTEGER NOT NULL, ids TEXT NOT NULL,
    done INTEGER NOT NULL, started_us INTEGER NOT NULL, queue_created_us INTEGER NOT NULL,
    expires_s INTEGER NOT NULL,
    PRIMARY KEY (queue, key)
) WITHOUT ROWID;
CREATE INDEX idempotency_expiry ON idempotency (expires_s);
CREATE TABLE queues (
    name TEXT PRIMARY KEY, lease_us INTEGER NOT NULL, expire_us INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL, dead_queue TEXT NOT NULL, reference TEXT NOT NULL,
    partitions INTEGER NOT NULL, created_us INTEGER NOT NULL, updated_us INTEGER NOT NULL,
    deleting INTEGER NOT NULL, delivery TEXT NOT NULL DEFAULT 'fifo',
    max_leased_per_group INTEGER NOT NULL DEFAULT 0,
    rate_limit REAL NOT NULL DEFAULT 0, rate_limit_per_group REAL NOT NULL DEFAULT 0
) WITHOUT ROWID;
"""
    + _RATE_BUCKETS
    + ";\n"
)

_SELECT_QUEUE = (
    "SELECT name, lease_us, expire_us, max_attempts, dead_queue, reference, partitions, created_us,"
    " updated_us, deleting, delivery, max_leased_per_group, rate_limit, rate_limit_per_group"
    " FROM queues WHERE name = ?"
)
# Statements below are built from these constant column lists (never from values: those are bound),
# hence the S608 waivers.
_STATE_COLUMNS = "id, attempts, lease_us, expire_us, created_us, enqueue_us, size"
_ITEM_COLUMNS = (
    f"{_STATE_COLUMNS}, payload, reference, encoding, kind, source_id, source_queue, next_priority,"
    " item_group, last_reason, failures"
)
_HEAD_COLUMNS = (
    "cursor, sweep, schedule_mark, items, leased, scheduled, created_sum, leased_created_sum,"
    " scheduled_created_sum, version, recount, recounted_us, bands, produced, completed"
)


def _encode_bands(head: PartitionHead) -> str | None:
    """The head's bands other than priority 5's and group lanes, rings and ledgers of fair
    delivery, as JSON (``None`` when there are none)."""
    if not (head.band_registered or head.band_cursors or head.band_sweeps or head.has_lanes):
        return None
    data: dict[str, Any] = {
        "cursors": dict(head.band_cursors),
        "sweeps": dict(head.band_sweeps),
        "registered_us": {band: timestamp_us(at) for band, at in head.band_registered.items()},
    }
    if head.has_lanes:
        data["lanes"] = True
        data["rings"] = dict(head.rings)
        data["ledgers"] = {
            group: {"v": ledger.version, "l": {i: timestamp_us(d) for i, d in ledger.leases.items()}}
            for group, ledger in head.group_ledgers.items()
        }
    return json.dumps(data)


def _decode_bands(value: str | None) -> dict[str, Any]:
    if value is None:
        return {}
    data = json.loads(value)
    return {
        "band_cursors": data["cursors"],
        "band_sweeps": data["sweeps"],
        "band_registered": {
            band: utc_from_timestamp_us(us) for band, us in data.get("registered_us", {}).items()
        },
        "has_lanes": data.get("lanes", False),
        "rings": data.get("rings", {}),
        "group_ledgers": {
            group: GroupLedger(
                version=ledger["v"], leases={i: utc_from_timestamp_us(us) for i, us in ledger["l"].items()}
            )
            for group, ledger in data.get("ledgers", {}).items()
        },
    }


class DatabaseFileError(Exception):
    """The file cannot be used as a Querator database; nothing was written to it."""


def _us(value: datetime | None) -> int | None:
    return None if value is None else timestamp_us(value)


# Rows become items and states on every lease (a page of 50 or more): the conversions are inlined,
# from one epoch made once, rather than a call or two per column (docs/adr/0060-embedded-stores.md).
_EPOCH = utc_from_timestamp_us(0)


def _state(row: Any) -> ItemState:
    lease_us, enqueue_us = row[2], row[5]
    return ItemState(
        id=row[0],
        attempts=row[1],
        lease_deadline=None if lease_us is None else _EPOCH + timedelta(microseconds=lease_us),
        expire_deadline=_EPOCH + timedelta(microseconds=row[3]),
        created_at=_EPOCH + timedelta(microseconds=row[4]),
        enqueue_at=None if enqueue_us is None else _EPOCH + timedelta(microseconds=enqueue_us),
        payload_size=row[6],
    )


def _item(row: Any) -> Item:
    lease_us, enqueue_us = row[2], row[5]
    return Item(
        id=row[0],
        attempts=row[1],
        lease_deadline=None if lease_us is None else _EPOCH + timedelta(microseconds=lease_us),
        expire_deadline=_EPOCH + timedelta(microseconds=row[3]),
        created_at=_EPOCH + timedelta(microseconds=row[4]),
        enqueue_at=None if enqueue_us is None else _EPOCH + timedelta(microseconds=enqueue_us),
        payload=bytes(row[7]),
        reference=row[8],
        encoding=row[9],
        kind=row[10],
        source_id=row[11],
        source_queue=row[12],
        next_priority=row[13],
        group=row[14],
        last_reason=row[15] or "",
        failures=row[16] or 0,
    )


def _store_error(exc: sqlite3.Error, operation: str) -> Exception:
    """A driver error as the domain's store error; a lock held too long is a throttle (retry)."""
    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
        return StoreThrottledError(f"the database was busy too long for {operation}; retry")
    return StoreUnavailableError(f"{operation} failed: {exc}")


class SQLiteDatabase:
    """One Querator database file: checked on open, a connection per thread.

    Raises ``DatabaseFileError`` when the path cannot hold a database, the file is not a Querator
    database, or its schema is newer than this code's; the file is then left untouched.
    """

    def __init__(self, path: str | Path, *, sync: str = "normal") -> None:
        self.path = Path(path).expanduser()
        if sync not in ("normal", "full"):
            raise ValueError(f"sync must be 'normal' or 'full', not {sync!r}")
        #: ``PRAGMA synchronous`` of every connection: NORMAL or FULL (the module's docstring).
        self.synchronous = sync.upper()
        self._lock = threading.Lock()
        #: Connections not in a transaction. A pool rather than one per thread: the local server runs
        #: each HTTP connection on a new thread, and per-thread connections would pile up.
        self._idle: list[sqlite3.Connection] = []
        self._check_and_create()

    # -- opening -----------------------------------------------------------------------------------

    def _check_and_create(self) -> None:
        path = self.path
        if path.is_dir():
            raise DatabaseFileError(f"{path} is a directory, not a database file")
        if path.exists() and path.stat().st_size > 0:
            self._check_existing()
        else:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise DatabaseFileError(f"cannot create {path.parent}: {exc.strerror or exc}") from exc
        try:
            connection = self._connect()
        except sqlite3.Error as exc:
            raise DatabaseFileError(f"cannot open {path}: {exc}") from exc
        try:
            connection.execute("BEGIN IMMEDIATE")
            version = connection.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        connection.execute(statement)
                for statement in (*_CLAIM_LOGS, *_CLAIM_LOG_AGES, *_LEASE_PRIORITIES):
                    connection.execute(statement)
                connection.execute(
                    "INSERT INTO querator_meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
                connection.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            elif version < SCHEMA_VERSION:
                for step in range(version + 1, SCHEMA_VERSION + 1):
                    for statement in _MIGRATIONS[step]:
                        connection.execute(statement)
                connection.execute(
                    "UPDATE querator_meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),)
                )
                connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            connection.execute("COMMIT")
            connection.execute("PRAGMA journal_mode = WAL")
        except sqlite3.Error as exc:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            connection.close()
            raise DatabaseFileError(f"cannot write {path}: {exc}") from exc
        self._idle.append(connection)

    def _check_existing(self) -> None:
        """Read the file's identity and version without writing anything, not even beside it."""
        path = self.path
        try:
            with path.open("rb") as file:
                header = file.read(100)
        except OSError as exc:
            raise DatabaseFileError(f"cannot read {path}: {exc.strerror or exc}") from exc
        if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
            raise DatabaseFileError(
                f"{path} is not a Querator database (not a SQLite file); refusing to touch it"
            )
        # Without a write-ahead log beside it the file is whole, and "immutable" reads it without
        # creating the -shm / -wal files a read-only connection would otherwise leave behind.
        whole = not path.with_name(f"{path.name}-wal").exists()
        uri = f"{path.resolve().as_uri()}?mode=ro{'&immutable=1' if whole else ''}"
        try:
            probe = sqlite3.connect(uri, uri=True)
        except sqlite3.Error as exc:
            raise DatabaseFileError(f"cannot open {path}: {exc}") from exc
        try:
            application_id = probe.execute("PRAGMA application_id").fetchone()[0]
            tables = probe.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            version = 0
            if application_id == APPLICATION_ID:
                row = probe.execute("SELECT value FROM querator_meta WHERE key = 'schema_version'").fetchone()
                version = int(row[0]) if row else 0
        except sqlite3.DatabaseError as exc:
            raise DatabaseFileError(f"{path} is not a Querator database ({exc})") from exc
        finally:
            probe.close()
        if application_id != APPLICATION_ID and (application_id != 0 or tables):
            raise DatabaseFileError(f"{path} is not a Querator database; refusing to touch it")
        if version > SCHEMA_VERSION:
            raise DatabaseFileError(
                f"{path} has schema version {version}, newer than this Querator's ({SCHEMA_VERSION});"
                " upgrade Querator to open it"
            )

    def _connect(self) -> sqlite3.Connection:
        # Autocommit mode: this module opens and ends every transaction itself. A connection serves
        # one transaction at a time, in whichever thread took it from the pool.
        connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        connection.execute(f"PRAGMA synchronous = {self.synchronous}")
        connection.execute(f"PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES}")
        connection.execute(f"PRAGMA journal_size_limit = {WAL_KEPT_BYTES}")
        return connection

    def _checkout(self) -> sqlite3.Connection:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._connect()

    def _checkin(self, connection: sqlite3.Connection) -> None:
        with self._lock:
            if len(self._idle) < _IDLE_CONNECTIONS:
                self._idle.append(connection)
                return
        connection.close()

    # -- transactions ------------------------------------------------------------------------------

    @contextmanager
    def transaction(self, *, write: bool, operation: str = "store") -> Iterator[sqlite3.Connection]:
        """One transaction; ``write`` takes the write lock first (``BEGIN IMMEDIATE``)."""
        try:
            connection = self._checkout()
        except sqlite3.Error as exc:
            raise _store_error(exc, operation) from exc
        try:
            connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            yield connection
            connection.execute("COMMIT")
        except sqlite3.Error as exc:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise _store_error(exc, operation) from exc
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        finally:
            self._checkin(connection)

    def close(self) -> None:
        """Close the idle connections (the last one to close folds the write-ahead log back into the
        file); call once nothing uses the database any more."""
        with self._lock:
            connections, self._idle = self._idle, []
        for connection in connections:
            connection.close()


#: Converted rows kept by a store (``_SQLiteRows.states``): a few pages of many partitions, a few MB.
_KNOWN_STATES = 20_000

#: ``RETURNING`` (SQLite 3.35, 2021) lets a claim or a delete check, write and read its row in one
#: statement; an older library takes the engine's read-then-write (the same result, two statements).
_RETURNING = sqlite3.sqlite_version_info >= (3, 35)
_CLAIM_ITEM = (
    "UPDATE items SET lease_us = ?, attempts = attempts + 1"  # noqa: S608
    " WHERE queue = ? AND part = ? AND id = ? AND lease_us IS NULL AND expire_us > ?"
    f" RETURNING {_ITEM_COLUMNS}"
)
#: ``engine._guard_holds`` as a condition on the row; each statement binds the time (maybe unused).
_GUARD_CONDITIONS = {
    Guard.ANY: "? IS NOT NULL",
    Guard.NEVER_LEASED: "lease_us IS NULL AND ? IS NOT NULL",
    Guard.LEASE_VALID: "lease_us > ?",
    Guard.LEASE_EXPIRED: "lease_us <= ?",
    Guard.NOT_VALIDLY_LEASED: "(lease_us IS NULL OR lease_us <= ?)",
}
_REMOVE_GUARDED = {
    guard: f"DELETE FROM items WHERE queue = ? AND part = ? AND id = ? AND {condition}"  # noqa: S608
    f" RETURNING {_STATE_COLUMNS}"
    for guard, condition in _GUARD_CONDITIONS.items()
}

_COUNT_PRODUCED = (
    "UPDATE heads SET items = items + ?, leased = leased + ?, scheduled = scheduled + ?,"
    " created_sum = created_sum + ?, leased_created_sum = leased_created_sum + ?,"
    " scheduled_created_sum = scheduled_created_sum + ?, produced = produced + ?, version = version + 1"
    " WHERE queue = ? AND part = ? AND schedule_mark != '' AND recounted_us IS NOT NULL AND cursor <= ?"
)

_PUT_ITEM = (
    f"INSERT OR REPLACE INTO items (queue, part, {_ITEM_COLUMNS})"  # noqa: S608
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)


def _item_row(queue: str, partition: int, item: Item) -> tuple[Any, ...]:
    size = item.reply_size()
    return (
        queue,
        partition,
        item.id,
        item.attempts,
        _us(item.lease_deadline),
        timestamp_us(item.expire_deadline),
        timestamp_us(item.created_at),
        _us(item.enqueue_at),
        size if size >= REPLY_SIZE_THRESHOLD else 0,
        item.payload,
        item.reference,
        item.encoding,
        item.kind,
        item.source_id,
        item.source_queue,
        item.next_priority,
        item.group,
        # NULL (one byte of the row's header each) unless the item failed.
        item.last_reason or None,
        item.failures or None,
    )


class _SQLiteRows:
    """``engine.Rows`` on one connection inside a transaction."""

    def __init__(self, connection: sqlite3.Connection, states: dict[tuple[Any, ...], ItemState]) -> None:
        self._c = connection
        #: Rows of the items table as read -> their state (``states``), shared by the store's calls.
        self._states = states
        #: The head rows this transaction read or wrote: a call that reads its head twice (a
        #: delete: its schedule mark first, its counters last) reads and decodes it once.
        self._heads: dict[tuple[str, int], PartitionHead] = {}

    def head(self, queue: str, partition: int) -> PartitionHead:
        known = self._heads.get((queue, partition))
        if known is None:
            known = self._heads[(queue, partition)] = self._read_head(queue, partition)
        return known

    def _read_head(self, queue: str, partition: int) -> PartitionHead:
        row = self._c.execute(
            f"SELECT {_HEAD_COLUMNS} FROM heads WHERE queue = ? AND part = ?",  # noqa: S608
            (queue, partition),
        ).fetchone()
        if row is None:
            return PartitionHead()
        return PartitionHead(
            cursor=row[0],
            sweep=row[1],
            schedule_mark=row[2],
            items=row[3],
            leased=row[4],
            scheduled=row[5],
            created_sum=row[6],
            leased_created_sum=row[7],
            scheduled_created_sum=row[8],
            version=row[9],
            recount=None if row[10] is None else Recount(**json.loads(row[10])),
            recounted_at=None if row[11] is None else utc_from_timestamp_us(row[11]),
            **_decode_bands(row[12]),
            produced=row[13],
            completed=row[14],
        )

    def write_head(self, queue: str, partition: int, head: PartitionHead) -> None:
        self._heads[(queue, partition)] = head
        self._c.execute(
            f"INSERT OR REPLACE INTO heads (queue, part, {_HEAD_COLUMNS})"  # noqa: S608
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                queue,
                partition,
                head.cursor,
                head.sweep,
                head.schedule_mark,
                head.items,
                head.leased,
                head.scheduled,
                head.created_sum,
                head.leased_created_sum,
                head.scheduled_created_sum,
                head.version,
                None if head.recount is None else json.dumps(asdict(head.recount)),
                None if head.recounted_at is None else timestamp_us(head.recounted_at),
                _encode_bands(head),
                head.produced,
                head.completed,
            ),
        )

    def item(self, queue: str, partition: int, item_id: str) -> Item | None:
        row = self._c.execute(
            f"SELECT {_ITEM_COLUMNS} FROM items WHERE queue = ? AND part = ? AND id = ?",  # noqa: S608
            (queue, partition, item_id),
        ).fetchone()
        return None if row is None else _item(row)

    def put(self, queue: str, partition: int, item: Item) -> None:
        self._c.execute(_PUT_ITEM, _item_row(queue, partition, item))

    def put_all(self, queue: str, partition: int, items: Sequence[Item]) -> None:
        """``put`` of every item, in one statement run over them (a produce of 100 is one call
        into SQLite, not 100)."""
        self._c.executemany(_PUT_ITEM, [_item_row(queue, partition, item) for item in items])

    def count_produced(self, queue: str, partition: int, items: Sequence[Item], now: datetime) -> bool:
        """``engine``'s counting of new items as one ``UPDATE`` of the head's counters, for the usual
        produce: the head has its schedule mark and recount clock, every item is in priority 5's band
        without a group lane, and none lands below the cursor, so there is nothing to register or
        pull back and only counters change. ``False``, nothing written, otherwise (the engine's way)."""
        if not items or any(lane_of(item.id) for item in items):
            return False
        counts = CounterDeltas()
        for item in items:
            counts.add(
                item.created_at,
                sign=1,
                leased=item.lease_deadline is not None,
                scheduled=scheduled_when_written(item, now),
            )
        changed = self._c.execute(
            _COUNT_PRODUCED,
            (
                counts.items,
                counts.leased,
                counts.scheduled,
                counts.created,
                counts.leased_created,
                counts.scheduled_created,
                counts.items,  # every write of new items is production, as in the engine
                queue,
                partition,
                min(item.id for item in items),
            ),
        ).rowcount
        self._heads.pop((queue, partition), None)
        return changed > 0

    def cursor_and_mark(self, queue: str, partition: int) -> tuple[str, str] | None:
        """The head's cursor (priority 5's) and schedule mark, read alone; ``None``: no head row."""
        known = self._heads.get((queue, partition))
        if known is not None:
            return known.cursor, known.schedule_mark
        row = self._c.execute(
            "SELECT cursor, schedule_mark FROM heads WHERE queue = ? AND part = ?", (queue, partition)
        ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    def note_claims(self, queue: str, partition: int, counts: CounterDeltas, cursor: str | None) -> None:
        """Add a lease's counters and set priority 5's cursor (``None``: it stays) in one ``UPDATE``
        of a head row that exists."""
        self._c.execute(
            "UPDATE heads SET leased = leased + ?, leased_created_sum = leased_created_sum + ?,"
            " scheduled = scheduled + ?, scheduled_created_sum = scheduled_created_sum + ?,"
            " version = version + ?, cursor = coalesce(?, cursor) WHERE queue = ? AND part = ?",
            (
                counts.leased,
                counts.leased_created,
                counts.scheduled,
                counts.scheduled_created,
                1 if counts.changed() else 0,
                cursor,
                queue,
                partition,
            ),
        )
        self._heads.pop((queue, partition), None)

    def schedule_mark(self, queue: str, partition: int) -> str:
        """The head's schedule mark, read alone (a delete needs no more of the head before it counts)."""
        known = self._heads.get((queue, partition))
        if known is not None:
            return known.schedule_mark
        row = self._c.execute(
            "SELECT schedule_mark FROM heads WHERE queue = ? AND part = ?", (queue, partition)
        ).fetchone()
        return "" if row is None else str(row[0])

    def add_counts(self, queue: str, partition: int, counts: CounterDeltas) -> bool:
        """``counts.applied`` to the head row in place, one ``UPDATE``; ``False`` (nothing written)
        when the partition has no head row yet."""
        changed = self._c.execute(
            "UPDATE heads SET items = items + ?, leased = leased + ?, scheduled = scheduled + ?,"
            " created_sum = created_sum + ?, leased_created_sum = leased_created_sum + ?,"
            " scheduled_created_sum = scheduled_created_sum + ?, produced = produced + ?,"
            " completed = completed + ?, version = version + ? WHERE queue = ? AND part = ?",
            (
                counts.items,
                counts.leased,
                counts.scheduled,
                counts.created,
                counts.leased_created,
                counts.scheduled_created,
                counts.produced,
                counts.completed,
                1 if counts.changed() else 0,
                queue,
                partition,
            ),
        ).rowcount
        self._heads.pop((queue, partition), None)
        return changed > 0

    def claim_row(self, queue: str, partition: int, item_id: str, deadline_us: int, now_us: int) -> Any:
        """The item's row after leasing it until ``deadline_us``, if it was never leased and has not
        expired by ``now_us`` (``engine``'s claim condition, checked and written in one statement);
        ``None`` otherwise."""
        return self._c.execute(_CLAIM_ITEM, (deadline_us, queue, partition, item_id, now_us)).fetchone()

    def remove_guarded(self, queue: str, partition: int, item_id: str, guard: Guard, now_us: int) -> Any:
        """Delete the item if ``guard`` holds: its state row (``_STATE_COLUMNS``) as it was, or
        ``None`` (it is not there, or the guard does not hold)."""
        return self._c.execute(_REMOVE_GUARDED[guard], (queue, partition, item_id, now_us)).fetchone()

    def remove(self, queue: str, partition: int, item_id: str) -> None:
        self._c.execute(
            "DELETE FROM items WHERE queue = ? AND part = ? AND id = ?", (queue, partition, item_id)
        )

    def items(self, queue: str, partition: int, start: str, end: str, limit: int) -> list[Item]:
        rows = self._c.execute(
            f"SELECT {_ITEM_COLUMNS} FROM items WHERE queue = ? AND part = ? AND id >= ? AND id < ?"  # noqa: S608
            " ORDER BY id LIMIT ?",
            (queue, partition, start, end, limit),
        )
        return [_item(row) for row in rows]

    def states(self, queue: str, partition: int, start: str, end: str, limit: int) -> list[ItemState]:
        rows = self._c.execute(
            f"SELECT {_STATE_COLUMNS} FROM items WHERE queue = ? AND part = ? AND id >= ? AND id < ?"  # noqa: S608
            " ORDER BY id LIMIT ?",
            (queue, partition, start, end, limit),
        )
        # A lease of one reads a page of 50 or more from its lane's cursor, so consecutive leases
        # read the same waiting rows again: a row read before (the same values) gives the same
        # state, an immutable value, without building it again.
        known = self._states
        found = []
        for row in rows:
            state = known.get(row)
            if state is None:
                state = known[row] = _state(row)
            found.append(state)
        if len(known) > _KNOWN_STATES:
            known.clear()
        return found

    def records_due(self, queue: str, partition: int, below: str, limit: int) -> list[LeaseRecord]:
        rows = self._c.execute(
            "SELECT key, deadline_us, ids FROM lease_records WHERE queue = ? AND part = ? AND key < ?"
            " ORDER BY key LIMIT ?",
            (queue, partition, below, limit),
        )
        return [
            LeaseRecord(
                key=key,
                deadline=utc_from_timestamp_us(deadline),
                ids=split_ids(ids),
            )
            for key, deadline, ids in rows
        ]

    def put_record(self, queue: str, partition: int, record: LeaseRecord) -> None:
        self._c.execute(
            "INSERT OR REPLACE INTO lease_records VALUES (?, ?, ?, ?, ?)",
            (queue, partition, record.key, timestamp_us(record.deadline), join_ids(record.ids)),
        )

    def drop_record(self, queue: str, partition: int, key: str) -> None:
        self._c.execute(
            "DELETE FROM lease_records WHERE queue = ? AND part = ? AND key = ?", (queue, partition, key)
        )

    def purge(self, queue: str, partition: int, limit: int) -> int:
        self._heads.pop((queue, partition), None)
        removed = 0
        for table, column in (("items", "id"), ("lease_records", "key")):
            keys = [
                row[0]
                for row in self._c.execute(
                    f"SELECT {column} FROM {table} WHERE queue = ? AND part = ? ORDER BY {column} LIMIT ?",  # noqa: S608
                    (queue, partition, limit - removed),
                )
            ]
            if keys:
                self._c.execute(
                    f"DELETE FROM {table} WHERE queue = ? AND part = ? AND {column} <= ?",  # noqa: S608
                    (queue, partition, keys[-1]),
                )
                removed += len(keys)
            if removed >= limit:
                return removed
        removed += self._c.execute(
            "DELETE FROM heads WHERE queue = ? AND part = ?", (queue, partition)
        ).rowcount
        if partition == 0 and removed < limit:
            # Idempotency records have no partition; the queue's go with its first partition, and so
            # do its rate-limit buckets.
            self._c.execute("DELETE FROM idempotency WHERE queue = ?", (queue,))
            self._c.execute("DELETE FROM rate_buckets WHERE queue = ?", (queue,))
        return removed

    def bucket(self, queue: str, key: str) -> int | None:
        row = self._c.execute(
            "SELECT tat_us FROM rate_buckets WHERE queue = ? AND bucket = ?", (queue, key)
        ).fetchone()
        return None if row is None else int(row[0])

    def put_bucket(self, queue: str, key: str, tat_us: int) -> None:
        self._c.execute("INSERT OR REPLACE INTO rate_buckets VALUES (?, ?, ?)", (queue, key, tat_us))

    def idempotency(self, queue: str, key: str) -> tuple[IdempotencyRecord, int] | None:
        row = self._c.execute(
            "SELECT part, ids, done, started_us, queue_created_us, expires_s FROM idempotency"
            " WHERE queue = ? AND key = ?",
            (queue, key),
        ).fetchone()
        if row is None:
            return None
        part, ids, done, started, created, expires = row
        record = IdempotencyRecord(
            key=key,
            partition=part,
            ids=split_ids(ids),
            done=bool(done),
            started_at=utc_from_timestamp_us(started),
            queue_created_at=utc_from_timestamp_us(created),
        )
        return record, expires

    def drop_expired_idempotency(self, now_s: int, limit: int) -> None:
        self._c.execute(
            "DELETE FROM idempotency WHERE (queue, key) IN"
            " (SELECT queue, key FROM idempotency WHERE expires_s < ? ORDER BY expires_s LIMIT ?)",
            (now_s, limit),
        )

    def put_idempotency(self, queue: str, record: IdempotencyRecord, expires_s: int) -> None:
        self._c.execute(
            "INSERT OR REPLACE INTO idempotency VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                queue,
                record.key,
                record.partition,
                join_ids(record.ids),
                int(record.done),
                timestamp_us(record.started_at),
                timestamp_us(record.queue_created_at),
                expires_s,
            ),
        )


class _Transaction:
    """``SQLiteDatabase.transaction`` written as a class (subclasses give the store's rows): a lease
    and its complete run six transactions, and two nested generator context managers a transaction
    cost about as much as one of its statements. The same steps and errors as ``transaction``."""

    __slots__ = ("_connection", "_db", "_write")

    def __init__(self, database: SQLiteDatabase, *, write: bool) -> None:
        self._db = database
        self._write = write

    def _begin(self) -> sqlite3.Connection:
        try:
            connection = self._db._checkout()
        except sqlite3.Error as exc:
            raise _store_error(exc, "store") from exc
        self._connection = connection
        try:
            connection.execute("BEGIN IMMEDIATE" if self._write else "BEGIN")
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return connection

    def __exit__(self, kind: object, exc: BaseException | None, traceback: object) -> None:
        connection = self._connection
        try:
            if exc is None:
                try:
                    connection.execute("COMMIT")
                except sqlite3.Error as error:
                    if connection.in_transaction:
                        connection.execute("ROLLBACK")
                    raise _store_error(error, "store") from error
                return
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise _store_error(exc, "store") from exc
        finally:
            self._db._checkin(connection)


class _RowsTransaction(_Transaction):
    """A transaction over ``_SQLiteRows`` (engine v2's)."""

    __slots__ = ("_states",)

    def __init__(
        self, database: SQLiteDatabase, *, write: bool, states: dict[tuple[Any, ...], ItemState]
    ) -> None:
        super().__init__(database, write=write)
        self._states = states

    def __enter__(self) -> _SQLiteRows:
        return _SQLiteRows(self._begin(), self._states)


class SQLiteItemStore(SortedRowsStore):
    """``ItemStore`` in a ``SQLiteDatabase``; safe across threads and processes on one machine."""

    def __init__(self, database: SQLiteDatabase) -> None:
        self._db = database
        #: ``_SQLiteRows.states``'s rows already converted; emptied when over ``_KNOWN_STATES``.
        self._states: dict[tuple[Any, ...], ItemState] = {}

    def _read(self) -> _RowsTransaction:
        return _RowsTransaction(self._db, write=False, states=self._states)

    def _write(self) -> _RowsTransaction:
        return _RowsTransaction(self._db, write=True, states=self._states)

    def put_new(self, queue: str, partition: int, items: Sequence[Item], *, now: datetime) -> None:
        # The engine's, with the rows written by one statement (executemany) rather than one each.
        with self._write() as rows:
            rows.put_all(queue, partition, items)
            # Most produces change only counters: one UPDATE, not a read, decode and rewrite of the head.
            if not rows.count_produced(queue, partition, items, now):
                self._count_added(rows, queue, partition, items, now)

    def note_leased(
        self,
        queue: str,
        partition: int,
        items: Sequence[Item],
        *,
        cursor: str | None,
        ring: tuple[str, str] | None = None,
    ) -> None:
        # The engine's, reading of the head only the cursor and schedule mark and writing only the
        # counters and the cursor, for a lease in priority 5's band outside fair lanes (the usual
        # one); the engine's read and rewrite of the whole head for the others.
        if ring is not None or (cursor is not None and lane_of(cursor)):
            super().note_leased(queue, partition, items, cursor=cursor, ring=ring)
            return
        if not items and cursor is None:
            return
        with self._write() as rows:
            found = rows.cursor_and_mark(queue, partition)
            if found is None:
                self._note_leased_in(rows, queue, partition, items, cursor=cursor, ring=None)
                return
            old_cursor, mark = found
            counts = CounterDeltas()
            for item in items:
                # By the mark in this transaction: a schedule pass counts only items never leased.
                counts.lease(item.created_at, was_scheduled=scheduled_until_claimed(item, mark))
            if cursor is not None:
                cursor = open_before(rows, queue, partition, PartitionHead(cursor=old_cursor), cursor)
            rows.note_claims(queue, partition, counts, cursor)

    def claim(
        self, queue: str, partition: int, ids: Sequence[str], *, lease_deadline: datetime, now: datetime
    ) -> BatchResult[Item]:
        # The engine's, with each id's check and write one UPDATE ... RETURNING (not a read of the
        # whole row, a copy and a write of it back).
        if not _RETURNING:
            return super().claim(queue, partition, ids, lease_deadline=lease_deadline, now=now)
        result: BatchResult[Item] = BatchResult()
        deadline_us, now_us = timestamp_us(lease_deadline), timestamp_us(now)
        with self._write() as rows:
            for item_id in ids:
                row = rows.claim_row(queue, partition, item_id, deadline_us, now_us)
                if row is None:
                    result.rejected.append(item_id)
                else:
                    result.applied.append(_item(row))
        return result

    def delete(
        self,
        queue: str,
        partition: int,
        ids: Sequence[str],
        *,
        guard: Guard,
        now: datetime,
        completed: bool = False,
    ) -> BatchResult[str]:
        # The engine's, with each id's guard and delete one DELETE ... RETURNING what the counters
        # need (not a read of the whole row first).
        if not _RETURNING:
            return super().delete(queue, partition, ids, guard=guard, now=now, completed=completed)
        result: BatchResult[str] = BatchResult()
        counts = CounterDeltas()
        now_us = timestamp_us(now)
        with self._write() as rows:
            mark = rows.schedule_mark(queue, partition)
            for item_id in dict.fromkeys(ids):
                row = rows.remove_guarded(queue, partition, item_id, guard, now_us)
                if row is None:
                    # Not there (fine for Guard.ANY: gone already), or the guard does not hold.
                    (result.applied if guard is Guard.ANY else result.rejected).append(item_id)
                    continue
                result.applied.append(item_id)
                state = _state(row)
                counts.add(
                    state.created_at,
                    sign=-1,
                    leased=state.lease_deadline is not None,
                    scheduled=still_scheduled(state, mark),
                )
            if completed:
                counts.completed = -counts.items
            # Only counters change: added in place, unless there is no head row to add them to.
            if counts.items and not rows.add_counts(queue, partition, counts):
                rows.write_head(queue, partition, counts.applied(rows.head(queue, partition)))
        return result


# -- engine v3: the claim log ---------------------------------------------------------------------

_LOG_KEY = "queue = ? AND part = ? AND lane = ?"
#: Where the rows end: an append of one row takes its positions from there in the statement that
#: writes it, so the head's ``tail`` is the sequencer's value for reservations (``take_positions``)
#: and larger appends only, and the log's tail is the larger of the two.
_ROWS_END = (
    "coalesce((SELECT r.first + r.count FROM log_rows r WHERE r.queue = ?1 AND r.part = ?2"
    " AND r.lane = ?3 ORDER BY r.first DESC LIMIT 1), 0)"
)
_LOG_HEAD = (
    f"SELECT max(tail, {_ROWS_END}), cursor, leases, leased, scheduled, largest, tombstones,"  # noqa: S608
    " produced - origin, completed"
    " FROM log_heads WHERE queue = ?1 AND part = ?2 AND lane = ?3"
)
#: The sequencer: one statement makes the head or adds to its tail, and says where the run starts.
_LOG_TAKE = (
    "INSERT INTO log_heads VALUES (?1, ?2, ?3, ?4 + ?5, ?4, 0, 0, ?6, ?7, NULL, ?4, ?4, ?8, 0)"  # noqa: S608
    f" ON CONFLICT (queue, part, lane) DO UPDATE SET tail = max(tail, {_ROWS_END}) + ?5,"
    " scheduled = scheduled + ?6, largest = max(largest, ?7), produced = produced + ?8 RETURNING tail"
)
#: The head's tail for an append of one row whose largest item (?5) the head's ``largest`` covers;
#: NULL otherwise (no head, or a larger item: the engine's path, which raises it).
_HEAD_TAIL = (
    "(SELECT CASE WHEN ?5 <= largest THEN tail END FROM log_heads"
    " WHERE queue = ?1 AND part = ?2 AND lane = ?3)"
)
#: An append of one row in one statement: at the log's tail (the larger of the head's and the rows'
#: end); where the head has no tail for it (``_HEAD_TAIL``) the position is NULL, and the insert fails
#: with nothing written.
_LOG_APPEND_ROW = (
    f"INSERT INTO log_rows VALUES (?1, ?2, ?3, max({_HEAD_TAIL}, {_ROWS_END}), ?4, ?5, ?6, ?7)"  # noqa: S608
    " RETURNING first"
)
#: The same at the position the caller expects the tail at (?6), NULL when the tail is elsewhere.
#: Without RETURNING it costs a third less.
_LOG_APPEND_AT = (
    f"INSERT INTO log_rows VALUES (?1, ?2, ?3, CASE WHEN ?6 = max({_HEAD_TAIL}, {_ROWS_END})"  # noqa: S608
    " THEN ?6 END, ?4, ?5, ?7, ?8)"
)
#: A claim's fetch-and-add on the cursor, up to the tail, counting the run as one lease of it all.
_LOG_TAIL = f"max(tail, {_ROWS_END})"
_LOG_ADVANCE = (
    f"UPDATE log_heads SET claimed = cursor, cursor = min(cursor + ?4, cursor + ?5 - leased, {_LOG_TAIL}),"  # noqa: S608
    f" leases = leases + 1, leased = leased + min(?4, ?5 - leased, {_LOG_TAIL} - cursor)"
    f" WHERE queue = ?1 AND part = ?2 AND lane = ?3 AND cursor < {_LOG_TAIL} AND leased < ?5"
    " RETURNING claimed, cursor, tombstones"
)
_LOG_TOMBSTONES = f"UPDATE log_heads SET tombstones = ? WHERE {_LOG_KEY}"  # noqa: S608
_LOG_COUNTS = (
    "UPDATE log_heads SET leases = leases + ?, leased = leased + ?, scheduled = scheduled + ?,"  # noqa: S608
    f" completed = completed + ? WHERE {_LOG_KEY}"
)
_LOG_SKIP = f"UPDATE log_heads SET cursor = ?, tombstones = NULL WHERE {_LOG_KEY}"  # noqa: S608
#: No cap on a claim (``max_leased``).
_UNCAPPED = 2**62
_LOG_TIMES = (
    f"SELECT (SELECT min(deadline_us) FROM log_leases WHERE {_LOG_KEY}),"  # noqa: S608
    f" (SELECT min(id) FROM log_schedule WHERE {_LOG_KEY})"
)
#: The row holding ``start`` (the last one starting at or before it) and the ones starting before ``end``.
_LOG_ROWS = (
    f"SELECT first, count, items FROM log_rows WHERE {_LOG_KEY} AND first >= coalesce("  # noqa: S608
    f"(SELECT first FROM log_rows WHERE {_LOG_KEY} AND first <= ? ORDER BY first DESC LIMIT 1), ?)"
    " AND first < ? ORDER BY first LIMIT ?"
)
#: The same for a range of at most ``limit`` positions (so of at most ``limit`` rows), read backwards
#: from ``end`` down to the row holding ``start``: no subquery (a claim of one reads one row).
_LOG_ROWS_BACK = (
    f"SELECT first, count, items FROM log_rows WHERE {_LOG_KEY} AND first < ?"  # noqa: S608
    " ORDER BY first DESC LIMIT ?"
)
_LOG_PUT_ROW = "INSERT INTO log_rows VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
_LEASE_COLUMNS = "token, run_end, deadline_us, claimed_us, pending, holes, created, priorities"
_LOG_RECORD = f"SELECT {_LEASE_COLUMNS} FROM log_leases WHERE {_LOG_KEY} AND token = ?"  # noqa: S608
#: The records of runs that started at or before a position, latest first (tokens sort by run): the
#: caller reads them while they belong to the first one's run.
_LOG_RECORDS_BACK = (
    f"SELECT {_LEASE_COLUMNS} FROM log_leases WHERE {_LOG_KEY} AND token < ?"  # noqa: S608
    " ORDER BY token DESC"
)
_LOG_RECORDS_AFTER = (
    f"SELECT {_LEASE_COLUMNS} FROM log_leases WHERE {_LOG_KEY} AND token > ? ORDER BY token LIMIT ?"  # noqa: S608
)
_LOG_RECORDS_DUE = (
    f"SELECT {_LEASE_COLUMNS} FROM log_leases WHERE {_LOG_KEY} AND deadline_us <= ?"  # noqa: S608
    " ORDER BY deadline_us LIMIT ?"
)
_LOG_PUT_RECORD = "INSERT OR REPLACE INTO log_leases VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_LOG_CREATED_SUMS = (
    f"SELECT (SELECT coalesce(sum(created), 0) FROM log_rows WHERE {_LOG_KEY} AND first >= ?),"  # noqa: S608
    f" (SELECT coalesce(sum(created), 0) FROM log_leases WHERE {_LOG_KEY})"
)
_LOG_DROP_RECORD = f"DELETE FROM log_leases WHERE {_LOG_KEY} AND token = ?"  # noqa: S608
_LOG_SCHEDULED = (
    f"SELECT id, item FROM log_schedule WHERE {_LOG_KEY} AND id > ? AND id <= ? ORDER BY id LIMIT ?"  # noqa: S608
)
_LOG_PUT_SCHEDULED = "INSERT INTO log_schedule VALUES (?, ?, ?, ?, ?)"
_LOG_DROP_SCHEDULED = f"DELETE FROM log_schedule WHERE {_LOG_KEY} AND id = ?"  # noqa: S608


#: An append of more items than this cannot fill one row (41 bytes each at least): the engine's path.
_ONE_ROW_ITEMS = ROW_BYTES // 41


def _int_blob(values: Sequence[int]) -> bytes | None:
    return array("q", values).tobytes() if values else None


def _ints(blob: bytes | None) -> tuple[int, ...]:
    return tuple(array("q", blob)) if blob else ()


_RANGE = struct.Struct("<qq")


def _run_record(row: Any) -> RunRecord:
    token, run_end, deadline_us, claimed_us, pending, holes, created, priorities = row
    if len(pending) == _RANGE.size:  # one range: most records
        ranges: tuple[tuple[int, int], ...] = (_RANGE.unpack(pending),)
    else:
        flat = array("q", pending)
        ranges = tuple(zip(flat[::2], flat[1::2], strict=True))
    given: tuple[tuple[int, int], ...] = ()
    if priorities:
        flat = array("q", priorities)
        given = tuple(zip(flat[::2], flat[1::2], strict=True))
    return RunRecord(
        token, int(token[:16], 16), run_end, deadline_us, claimed_us, ranges, _ints(holes), created, given
    )


def _pending_blob(record: RunRecord) -> bytes:
    if len(record.pending) == 1:
        return _RANGE.pack(*record.pending[0])
    return array("q", [p for pair in record.pending for p in pair]).tobytes()


class _SQLiteLogRows:
    """``log_engine.LogRows`` on one connection inside a transaction: one statement per method."""

    __slots__ = ("_c",)

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._c = connection

    def head(self, key: LogKey) -> HeadRow | None:
        row = self._c.execute(_LOG_HEAD, (key.queue, key.partition, key.lane)).fetchone()
        if row is None:
            return None
        # ``produced - origin`` read, the positions after the origin added: ``LogHead.produced``.
        return HeadRow(row[0], row[1], row[2], row[3], row[4], row[5], _ints(row[6]), row[0] + row[7], row[8])

    def advance(
        self, key: LogKey, count: int, max_leased: int | None = None
    ) -> tuple[int, int, tuple[int, ...]] | None:
        values = (key.queue, key.partition, key.lane, count, _UNCAPPED if max_leased is None else max_leased)
        if _RETURNING:
            row = self._c.execute(_LOG_ADVANCE, values).fetchone()
            return None if row is None else (row[0], row[1], _ints(row[2]))
        head = self.head(key)
        if head is None:
            return None
        self._c.execute(_LOG_ADVANCE.removesuffix(" RETURNING claimed, cursor, tombstones"), values)
        after = self.head(key)
        if after is None or after.cursor == head.cursor:
            return None
        return head.cursor, after.cursor, head.tombstones

    def skip(self, key: LogKey) -> tuple[int, int, tuple[int, ...]] | None:
        head = self.head(key)
        if head is not None:
            self._c.execute(_LOG_SKIP, (head.tail, key.queue, key.partition, key.lane))
            return head.cursor, head.tail, head.tombstones
        return None

    def set_tombstones(self, key: LogKey, tombstones: tuple[int, ...]) -> None:
        self._c.execute(_LOG_TOMBSTONES, (_int_blob(tombstones), key.queue, key.partition, key.lane))

    def take(
        self,
        key: LogKey,
        count: int,
        *,
        start: int,
        produce: bool,
        scheduled: int = 0,
        largest: int = 0,
        produced: int = 0,
    ) -> int:
        # Positions that are not a produce's are taken out of ``produced`` (the schema's note).
        adjust = produced if produce else produced - count
        values = (key.queue, key.partition, key.lane, start, count, scheduled, largest, adjust)
        if _RETURNING:
            tail = self._c.execute(_LOG_TAKE, values).fetchone()[0]
        else:
            self._c.execute(_LOG_TAKE.removesuffix(" RETURNING tail"), values)
            tail = self._c.execute(
                "SELECT tail FROM log_heads WHERE queue = ? AND part = ? AND lane = ?", values[:3]
            ).fetchone()[0]
        return int(tail) - count

    def add_counts(
        self, key: LogKey, *, leases: int = 0, leased: int = 0, scheduled: int = 0, completed: int = 0
    ) -> None:
        self._c.execute(
            _LOG_COUNTS, (leases, leased, scheduled, completed, key.queue, key.partition, key.lane)
        )

    def next_times(self, key: LogKey) -> tuple[int | None, str | None]:
        log = (key.queue, key.partition, key.lane)
        expiry, due = self._c.execute(_LOG_TIMES, log + log).fetchone()
        return expiry, due

    def rows(self, key: LogKey, start: int, end: int, limit: int) -> list[PackedRow]:
        log = (key.queue, key.partition, key.lane)
        if end - start > limit:
            return [
                PackedRow(first, count, blob)
                for first, count, blob in self._c.execute(_LOG_ROWS, (*log, *log, start, start, end, limit))
            ]
        found = []
        for first, count, blob in self._c.execute(_LOG_ROWS_BACK, (*log, end, end - start)):
            found.append(PackedRow(first, count, blob))
            if first <= start:
                break
        found.reverse()
        return found

    def put_rows(self, key: LogKey, rows: Sequence[PackedRow]) -> None:
        log = (key.queue, key.partition, key.lane)
        if len(rows) == 1:
            row = rows[0]
            self._c.execute(_LOG_PUT_ROW, (*log, row.first, row.count, row.largest, row.blob, row.created))
            return
        self._c.executemany(
            _LOG_PUT_ROW, [(*log, row.first, row.count, row.largest, row.blob, row.created) for row in rows]
        )

    def record(self, key: LogKey, token: str) -> RunRecord | None:
        row = self._c.execute(_LOG_RECORD, (key.queue, key.partition, key.lane, token)).fetchone()
        return None if row is None else _run_record(row)

    def records_of_run(self, key: LogKey, position: int) -> list[RunRecord]:
        found: list[RunRecord] = []
        run = None
        query = (key.queue, key.partition, key.lane, f"{position + 1:016x}")
        for row in self._c.execute(_LOG_RECORDS_BACK, query):
            if run is None:
                run = row[0][:16]
            elif row[0][:16] != run:
                break
            found.append(_run_record(row))
        found.reverse()
        return found

    def records_after(self, key: LogKey, token: str, limit: int) -> list[RunRecord]:
        rows = self._c.execute(_LOG_RECORDS_AFTER, (key.queue, key.partition, key.lane, token, limit))
        return [_run_record(row) for row in rows]

    def records_due(self, key: LogKey, deadline_us: int, limit: int) -> list[RunRecord]:
        rows = self._c.execute(_LOG_RECORDS_DUE, (key.queue, key.partition, key.lane, deadline_us, limit))
        return [_run_record(row) for row in rows]

    def put_record(self, key: LogKey, record: RunRecord) -> None:
        self._c.execute(
            _LOG_PUT_RECORD,
            (
                key.queue,
                key.partition,
                key.lane,
                record.token,
                record.run_end,
                record.deadline_us,
                record.claimed_us,
                _pending_blob(record),
                _int_blob(record.holes),
                record.created,
                _int_blob([n for pair in record.priorities for n in pair]),
            ),
        )

    def drop_record(self, key: LogKey, token: str) -> None:
        self._c.execute(_LOG_DROP_RECORD, (key.queue, key.partition, key.lane, token))

    def scheduled(self, key: LogKey, after: str, until: str, limit: int) -> list[tuple[str, bytes]]:
        rows = self._c.execute(_LOG_SCHEDULED, (key.queue, key.partition, key.lane, after, until, limit))
        return [(item_id, blob) for item_id, blob in rows]

    def put_scheduled(self, key: LogKey, item_id: str, blob: bytes) -> None:
        self._c.execute(_LOG_PUT_SCHEDULED, (key.queue, key.partition, key.lane, item_id, blob))

    def drop_scheduled(self, key: LogKey, item_id: str) -> bool:
        return bool(
            self._c.execute(_LOG_DROP_SCHEDULED, (key.queue, key.partition, key.lane, item_id)).rowcount
        )

    def created_sums(self, key: LogKey, start: int) -> tuple[int, int]:
        log = (key.queue, key.partition, key.lane)
        waiting, leased = self._c.execute(_LOG_CREATED_SUMS, (*log, start, *log)).fetchone()
        return int(waiting), int(leased)

    def purge(self, key: LogKey, limit: int) -> int:
        log = (key.queue, key.partition, key.lane)
        removed = 0
        for table, column in (("log_rows", "first"), ("log_leases", "token"), ("log_schedule", "id")):
            found = self._c.execute(
                f"SELECT {column} FROM {table} WHERE {_LOG_KEY} ORDER BY {column} LIMIT ?",  # noqa: S608
                (*log, limit - removed),
            ).fetchall()
            if found:
                self._c.execute(
                    f"DELETE FROM {table} WHERE {_LOG_KEY} AND {column} <= ?",  # noqa: S608
                    (*log, found[-1][0]),
                )
                removed += len(found)
            if removed >= limit:
                return removed
        return removed + self._c.execute(f"DELETE FROM log_heads WHERE {_LOG_KEY}", log).rowcount  # noqa: S608


class _LogTransaction(_Transaction):
    """A transaction over ``_SQLiteLogRows``."""

    __slots__ = ()

    def __enter__(self) -> _SQLiteLogRows:
        return _SQLiteLogRows(self._begin())


class SQLiteClaimLog(ClaimLogEngine):
    """``ClaimLog`` in a ``SQLiteDatabase`` (the ``log_*`` tables, beside v2's in the same file);
    safe across threads and processes on one machine: every call is one transaction."""

    def __init__(self, database: SQLiteDatabase) -> None:
        self._db = database
        #: Where each log's tail was after this object's last append of one row: the next one writes
        #: there if it still is (``_LOG_APPEND_AT``, no RETURNING), else asks where it is.
        #: Keyed by the log key's fields (a dataclass hashes in Python, a tuple in C).
        self._tails: dict[tuple[str, int, str], int] = {}

    def _read(self) -> _LogTransaction:
        return _LogTransaction(self._db, write=False)

    def _write(self) -> _LogTransaction:
        return _LogTransaction(self._db, write=True)

    def append(self, key: LogKey, items: Sequence[Item], *, now: datetime) -> list[Item]:
        # The engine's, as one statement in a transaction of its own when the items are due now and
        # fill one row (a produce of up to ~100 small items): no BEGIN, no COMMIT, no head write (the
        # head's ``largest`` covers them, else the engine's path raises it).
        if not items or len(items) > _ONE_ROW_ITEMS:
            return super().append(key, items, now=now)
        encoded = []
        size = largest = created = 0
        for item in items:
            if item.enqueue_at is not None and item.enqueue_at > now:
                return super().append(key, items, now=now)
            data, reply = encode_item(item)
            encoded.append(data)
            size += len(data)
            largest = max(largest, reply)
            created += created_of(data)
        if size > ROW_BYTES:
            return super().append(key, items, now=now)
        blob = pack_row(encoded)
        log = (key.queue, key.partition, key.lane)
        expected = self._tails.get(log)
        try:
            connection = self._db._checkout()
        except sqlite3.Error as exc:
            raise _store_error(exc, "store") from exc
        try:
            first = None
            if expected is not None:
                try:
                    connection.execute(
                        _LOG_APPEND_AT,
                        (*log, len(items), largest, expected, blob, created),
                    )
                    first = expected
                except sqlite3.IntegrityError:
                    pass  # another writer moved the tail since: where it is now
            if first is None:
                first = connection.execute(
                    _LOG_APPEND_ROW, (*log, len(items), largest, blob, created)
                ).fetchone()[0]
        except sqlite3.IntegrityError:
            # No tail for it (NOT NULL failed; nothing written): the log's first write, or an item
            # larger than any before, which the head must learn of.
            return super().append(key, items, now=now)
        except sqlite3.Error as exc:
            raise _store_error(exc, "store") from exc
        finally:
            self._db._checkin(connection)
        self._tails[log] = first + len(items)
        lane = key.lane
        return [with_id(item, f"{lane}{POSITION_MARK}{p:016x}") for p, item in enumerate(items, first)]


_QUEUE_COLUMNS = (
    "name, lease_us, expire_us, max_attempts, dead_queue, reference, partitions, created_us, updated_us,"
    " deleting, delivery, max_leased_per_group, rate_limit, rate_limit_per_group"
)


def _queue_row(info: QueueInfo) -> tuple[Any, ...]:
    return (
        info.name,
        info.lease_timeout // timedelta(microseconds=1),
        info.expire_timeout // timedelta(microseconds=1),
        info.max_attempts,
        info.dead_queue,
        info.reference,
        info.partitions,
        timestamp_us(info.created_at),
        timestamp_us(info.updated_at),
        int(info.deleting),
        info.delivery,
        info.max_leased_per_group,
        info.rate_limit,
        info.rate_limit_per_group,
    )


def _queue_info(row: Any) -> QueueInfo:
    return QueueInfo(
        name=row[0],
        lease_timeout=timedelta(microseconds=row[1]),
        expire_timeout=timedelta(microseconds=row[2]),
        max_attempts=row[3],
        dead_queue=row[4],
        reference=row[5],
        partitions=row[6],
        created_at=utc_from_timestamp_us(row[7]),
        updated_at=utc_from_timestamp_us(row[8]),
        deleting=bool(row[9]),
        delivery=row[10],
        max_leased_per_group=row[11],
        rate_limit=row[12],
        rate_limit_per_group=row[13],
    )


class SQLiteQueueCatalog:
    """``QueueCatalog`` in a ``SQLiteDatabase`` (the ``queues`` table; the bookmark in the meta table)."""

    def __init__(self, database: SQLiteDatabase) -> None:
        self._db = database

    def create(self, info: QueueInfo) -> None:
        with self._db.transaction(write=True, operation="queues.create") as c:
            # Two creates of one name race: the write lock orders them, the second finds the first.
            if c.execute("SELECT 1 FROM queues WHERE name = ?", (info.name,)).fetchone():
                raise QueueAlreadyExistsError(f"queue '{info.name}' already exists")
            c.execute(
                f"INSERT INTO queues ({_QUEUE_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",  # noqa: S608
                _queue_row(info),
            )

    def get(self, name: str) -> QueueInfo:
        with self._db.transaction(write=False, operation="queues.info") as c:
            row = c.execute(_SELECT_QUEUE, (name,)).fetchone()
        if row is None:
            raise QueueNotFoundError(f"queue '{name}' does not exist", queue=name)
        return _queue_info(row)

    def list(self, *, pivot: str, limit: int) -> list[QueueInfo]:
        with self._db.transaction(write=False, operation="queues.list") as c:
            rows = c.execute(
                f"SELECT {_QUEUE_COLUMNS} FROM queues WHERE name >= ? ORDER BY name LIMIT ?",  # noqa: S608
                (pivot, limit),
            ).fetchall()
        return [_queue_info(row) for row in rows]

    def iterate(self) -> Iterator[QueueInfo]:
        pivot = ""
        while True:
            page = self.list(pivot=pivot, limit=101)
            yield from page[:100]
            if len(page) <= 100:
                return
            pivot = page[100].name

    def replace(self, info: QueueInfo, *, expected_updated_at: datetime) -> None:
        with self._db.transaction(write=True, operation="queues.update") as c:
            # Optimistic concurrency: the second of two updates that read the same version fails.
            changed = c.execute(
                f"UPDATE queues SET ({_QUEUE_COLUMNS}) = (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"  # noqa: S608
                " WHERE name = ? AND updated_us = ?",
                (*_queue_row(info), info.name, timestamp_us(expected_updated_at)),
            ).rowcount
        if not changed:
            raise ConflictError(f"queue '{info.name}' changed or was deleted meanwhile")

    def mark_deleting(self, name: str) -> QueueInfo:
        with self._db.transaction(write=True, operation="queues.delete") as c:
            row = c.execute(_SELECT_QUEUE, (name,)).fetchone()
            if row is None:
                raise QueueNotFoundError(f"queue '{name}' does not exist", queue=name)
            c.execute("UPDATE queues SET deleting = 1 WHERE name = ?", (name,))
        return replace(_queue_info(row), deleting=True)

    def remove(self, name: str) -> None:
        with self._db.transaction(write=True, operation="queues.delete") as c:
            c.execute("DELETE FROM queues WHERE name = ?", (name,))

    def load_bookmark(self) -> str | None:
        with self._db.transaction(write=False, operation="reaper") as c:
            row = c.execute("SELECT value FROM querator_meta WHERE key = 'reaper_bookmark'").fetchone()
        return row[0] if row and row[0] else None

    def save_bookmark(self, bookmark: str | None) -> None:
        with self._db.transaction(write=True, operation="reaper") as c:
            c.execute("INSERT OR REPLACE INTO querator_meta VALUES ('reaper_bookmark', ?)", (bookmark or "",))

    def stream_key(self, candidate: str | None) -> str | None:
        with self._db.transaction(write=False, operation="stream.ticket") as c:
            row = c.execute("SELECT value FROM querator_meta WHERE key = 'stream_key'").fetchone()
        if row:
            return str(row[0])
        if candidate is None:
            return None
        with self._db.transaction(write=True, operation="stream.ticket") as c:
            # The write lock orders racing first uses: the second keeps the first's key.
            c.execute("INSERT OR IGNORE INTO querator_meta VALUES ('stream_key', ?)", (candidate,))
            row = c.execute("SELECT value FROM querator_meta WHERE key = 'stream_key'").fetchone()
        return str(row[0])
