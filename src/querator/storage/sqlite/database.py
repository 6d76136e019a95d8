"""Storage layer, the SQLite store's file: its schema and migrations, checked on open, a pool of
connections, and transactions (``SQLiteDatabase``)."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from querator.domain.errors import StoreThrottledError, StoreUnavailableError

if TYPE_CHECKING:
    from collections.abc import Iterator


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
#: Engine v3's claim logs (``storage.embedded.log``; docs/adr/0100-engine-v3-candidates.md), beside
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
#: (``storage.embedded.log.codec``), which a Querator older than schema 9 would misread: hence the version.
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


class DatabaseFileError(Exception):
    """The file cannot be used as a Querator database; nothing was written to it."""


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
