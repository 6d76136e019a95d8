"""The SQLite database file: refused when it is not ours or newer, never changed then; shared safely.

The port's behaviour on SQLite is the contract suite's (``tests/contract``, param ``sqlite``); these
are what only a file has: identity, schema version, reopening, and several processes at once.
"""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta

import pytest

from querator.domain.errors import StoreThrottledError
from querator.domain.ids import IdFactory, key_after
from querator.domain.model import Item, NewItem, QueueInfo, QueueUpdate, RetryRequest
from querator.ports import Guard
from querator.storage.embedded.store import SortedRowsStore
from querator.storage.sqlite import SCHEMA_VERSION, DatabaseFileError, SQLiteDatabase, SQLiteItemStore
from querator.storage.sqlite import database as sqlite_database
from querator.storage.sqlite import store as sqlite_store
from querator.testing import FakeClock, sqlite_service

pytestmark = pytest.mark.disable_socket

PLACEHOLDER = datetime(2000, 1, 1, tzinfo=UTC)


def make_queue(service, name="jobs", lease=timedelta(minutes=5)):
    return service.create_queue(
        QueueInfo(
            name=name,
            lease_timeout=lease,
            expire_timeout=timedelta(hours=1),
            created_at=PLACEHOLDER,
            updated_at=PLACEHOLDER,
        )
    )


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_file_that_is_not_a_database_is_refused_and_left_as_it_was(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("my notes, not a database\n" * 100)
    before = digest(path)
    with pytest.raises(DatabaseFileError, match="not a Querator database"):
        SQLiteDatabase(path)
    assert digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_another_applications_sqlite_database_is_refused_and_left_as_it_was(tmp_path):
    path = tmp_path / "other.db"
    other = sqlite3.connect(path)
    other.execute("CREATE TABLE items (x)")
    other.execute("INSERT INTO items VALUES (1)")
    other.commit()
    other.close()
    before = digest(path)
    with pytest.raises(DatabaseFileError, match="not a Querator database"):
        SQLiteDatabase(path)
    assert digest(path) == before


def test_a_database_of_schema_1_is_upgraded_in_place_and_keeps_its_items(tmp_path):
    path = tmp_path / "querator.db"
    service = sqlite_service(path, clock=FakeClock(), engine=2)
    make_queue(service)
    service.produce("jobs", [NewItem(payload=b"kept")])
    service.store._db.close()  # type: ignore[attr-defined]
    # Schema 1 as released: items without source_queue, next_priority or group, heads without bands,
    # queues without delivery.
    old = sqlite3.connect(path)
    old.execute("ALTER TABLE items DROP COLUMN source_queue")
    old.execute("ALTER TABLE items DROP COLUMN next_priority")
    old.execute("ALTER TABLE items DROP COLUMN item_group")
    old.execute("ALTER TABLE items DROP COLUMN last_reason")
    old.execute("ALTER TABLE items DROP COLUMN failures")
    old.execute("ALTER TABLE heads DROP COLUMN bands")
    old.execute("ALTER TABLE heads DROP COLUMN produced")
    old.execute("ALTER TABLE heads DROP COLUMN completed")
    old.execute("ALTER TABLE queues DROP COLUMN delivery")
    old.execute("ALTER TABLE queues DROP COLUMN max_leased_per_group")
    old.execute("ALTER TABLE queues DROP COLUMN rate_limit")
    old.execute("ALTER TABLE queues DROP COLUMN rate_limit_per_group")
    old.execute("DROP TABLE rate_buckets")
    for table in ("log_heads", "log_rows", "log_leases", "log_schedule"):  # schema 7's claim logs
        old.execute(f"DROP TABLE {table}")
    old.execute("UPDATE querator_meta SET value = '1' WHERE key = 'schema_version'")
    old.execute("PRAGMA user_version = 1")
    old.commit()
    old.close()

    upgraded = sqlite_service(path, clock=FakeClock())

    queue = upgraded.get_queue("jobs")
    assert (queue.delivery, queue.max_leased_per_group, queue.rate_limit) == ("fifo", 0, 0)
    [item] = upgraded.list_items("jobs", 0)
    assert (item.payload, item.source_queue, item.priority, item.next_priority, item.group) == (
        b"kept",
        "",
        5,
        None,
        "",
    )
    # The upgraded file takes items of other priorities (the head row's bands) and leases them first.
    upgraded.produce("jobs", [NewItem(payload=b"urgent", priority=0, group="acme")])
    leased = upgraded.lease("jobs", batch_size=10, client_id="c", timeout=timedelta(0)).items
    assert [(i.payload, i.group) for i in leased] == [(b"urgent", "acme"), (b"kept", "")]
    # Counted from the upgrade on: the item produced before it is not in ``produced``.
    upgraded.complete("jobs", 0, [i.id for i in leased])
    [stats] = upgraded.stats("jobs")
    assert (stats.produced, stats.completed) == (1, 2)
    # And rate limits (schema 6): the setting and its bucket.
    upgraded.update_queue(QueueUpdate(name="jobs", rate_limit=1))
    upgraded.produce("jobs", [NewItem(payload=b"a"), NewItem(payload=b"b")])
    assert len(upgraded.lease("jobs", batch_size=10, client_id="c", timeout=timedelta(0)).items) == 1
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 9
    assert check.execute("SELECT value FROM querator_meta WHERE key = 'schema_version'").fetchone()[0] == "9"
    check.close()


def test_v2_items_store_their_failure_columns_only_when_they_failed(tmp_path):
    path = tmp_path / "querator.db"
    service = sqlite_service(path, clock=FakeClock(), engine=2)
    make_queue(service)
    service.produce("jobs", [NewItem(payload=b"fine"), NewItem(payload=b"failing")])
    leased = service.lease("jobs", batch_size=2, client_id="c", timeout=timedelta(0)).items
    service.retry("jobs", 0, [RetryRequest(id=leased[1].id, reason="ValueError: no")])

    check = sqlite3.connect(path)
    rows = check.execute("SELECT payload, last_reason, failures FROM items ORDER BY payload").fetchall()
    check.close()

    # NULL, one byte of the record's header each, on the item that never failed.
    assert rows == [(b"failing", "ValueError: no", 1), (b"fine", None, None)]


def test_a_database_of_a_newer_schema_is_refused_and_left_as_it_was(tmp_path):
    path = tmp_path / "querator.db"
    SQLiteDatabase(path).close()
    newer = sqlite3.connect(path)
    newer.execute(
        "UPDATE querator_meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),)
    )
    newer.commit()
    newer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    newer.close()
    before = digest(path)
    with pytest.raises(DatabaseFileError, match=f"schema version {SCHEMA_VERSION + 1}, newer"):
        SQLiteDatabase(path)
    assert digest(path) == before


@pytest.mark.parametrize("where", ["a directory", "under a file"])
def test_a_path_that_cannot_hold_a_database_is_refused(tmp_path, where):
    (tmp_path / "plain").write_text("x")
    path = tmp_path if where == "a directory" else tmp_path / "plain" / "querator.db"
    with pytest.raises(DatabaseFileError):
        SQLiteDatabase(path)


def test_an_empty_file_becomes_a_database_and_reopening_keeps_queues_items_and_leases(tmp_path):
    path = tmp_path / "querator.db"
    path.touch()
    clock = FakeClock()
    first = sqlite_service(path, clock=clock)
    make_queue(first)
    first.produce("jobs", [NewItem(payload=b"a"), NewItem(payload=b"b")])
    leased = first.lease("jobs", batch_size=1, client_id="c").items

    again = sqlite_service(path, clock=clock)
    assert again.get_queue("jobs").name == "jobs"
    assert [i.payload for i in again.list_items("jobs", 0)] == [b"a", b"b"]
    # The lease taken through the first opening is still valid through the second.
    assert again.complete("jobs", 0, [leased[0].id]).applied == [leased[0].id]


_WORKER = textwrap.dedent(
    """
    import sys, threading
    from querator.clock import SystemClock
    from querator.domain.errors import NothingToLeaseError
    from querator.testing import sqlite_service

    service = sqlite_service(sys.argv[1], clock=SystemClock())
    won, lock = [], threading.Lock()

    def work():
        while True:
            try:
                lease = service.lease("jobs", batch_size=3, client_id=threading.current_thread().name)
            except NothingToLeaseError:
                return
            with lock:
                won.extend(item.payload.decode() for item in lease.items)

    threads = [threading.Thread(target=work, name=f"t{n}") for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("\\n".join(won))
    """
)


def test_processes_and_threads_sharing_one_file_never_lease_an_item_twice(tmp_path):
    path = tmp_path / "querator.db"
    service = sqlite_service(path, clock=FakeClock(datetime.now(UTC) - timedelta(seconds=5)))
    make_queue(service)
    expected = {f"item-{n}" for n in range(150)}
    service.produce("jobs", [NewItem(payload=p.encode()) for p in sorted(expected)])
    workers = [
        subprocess.Popen(  # noqa: S603 - our own script
            [sys.executable, "-c", _WORKER, str(path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [w.communicate(timeout=120)[0] for w in workers]
    assert all(w.returncode == 0 for w in workers)
    won = [line for out in outputs for line in out.splitlines() if line]
    assert len(won) == len(set(won)), "an item was leased twice"
    assert set(won) == expected


@pytest.mark.parametrize(
    ("url", "pragma"), [("sqlite:{}", 1), ("sqlite:{}?sync=full", 2)], ids=["default", "full"]
)
def test_the_store_url_chooses_how_every_commit_is_synced(tmp_path, url, pragma):
    """``synchronous`` is 1 (NORMAL: survives a killed process) by default and 2 (FULL: also an OS
    crash or a power cut) with ``?sync=full``, on every connection the store opens."""
    from querator.bootstrap import open_stores  # noqa: PLC0415 - the URL's way in, as serve uses it

    path = tmp_path / "q.db"
    stores = open_stores(url.format(path))
    try:
        database = stores.store._db  # type: ignore[attr-defined]
        with database.transaction(write=False) as first, database.transaction(write=False) as second:
            assert first is not second
            assert [c.execute("PRAGMA synchronous").fetchone()[0] for c in (first, second)] == [
                pragma,
                pragma,
            ]
        assert path.exists() and not (tmp_path / "q.db?sync=full").exists()
    finally:
        stores.close()


def _item(item_id: str, now: datetime) -> Item:
    return Item(id=item_id, payload=b"x", created_at=now, expire_deadline=now + timedelta(hours=1))


def test_a_store_call_that_fails_midway_writes_nothing_and_its_connection_serves_the_next(tmp_path):
    """The store's own transactions (not ``SQLiteDatabase.transaction``): rolled back on any error,
    the connection back in the pool with no transaction left open."""
    database = SQLiteDatabase(tmp_path / "q.db")
    store = SQLiteItemStore(database)
    now = datetime.now(UTC)
    with pytest.raises(RuntimeError, match="midway"), store._write() as rows:
        rows.put("jobs", 0, _item("a" * 32, now))
        raise RuntimeError("midway")
    assert store.get("jobs", 0, "a" * 32) is None
    (connection,) = database._idle
    assert not connection.in_transaction

    store.put_new("jobs", 0, [_item("b" * 32, now)], now=now)
    assert store.get("jobs", 0, "b" * 32) is not None
    database.close()


def test_a_store_write_behind_a_held_lock_is_a_throttle_and_holds_nothing_after(tmp_path, monkeypatch):
    """Another writer holds the file's lock past ``busy_timeout``: the call fails as a throttle (the
    client retries), and once the lock is free the next call writes."""
    monkeypatch.setattr(sqlite_database, "BUSY_TIMEOUT_MS", 50)
    path = tmp_path / "q.db"
    database = SQLiteDatabase(path)
    store = SQLiteItemStore(database)
    now = datetime.now(UTC)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreThrottledError):
            store.put_new("jobs", 0, [_item("a" * 32, now)], now=now)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert all(not c.in_transaction for c in database._idle)

    store.put_new("jobs", 0, [_item("a" * 32, now)], now=now)
    assert store.get("jobs", 0, "a" * 32) is not None
    database.close()


def test_counters_and_cursor_written_in_place_leave_the_head_the_engine_would(tmp_path, monkeypatch):
    """``put_new``'s, ``note_leased``'s and ``delete``'s UPDATEs in place against the engine's
    read-and-rewrite of the head, over the same writes: a first produce (no head yet), plain ones, a
    scheduled one, another priority's (a band to register), one below the cursor (pulled back), a
    lease of two (one still scheduled) whose cursor move stops at the late one, a complete and a
    delete of a leased item: every head field equal after each."""
    start = datetime.now(UTC).replace(microsecond=0)

    def writes(store: SQLiteItemStore) -> list[object]:
        ids = IdFactory(node=1, seed=0)
        heads = []

        def produce(now: datetime, *, priority: int = 5, enqueue: timedelta | None = None) -> str:
            visible = now + enqueue if enqueue else now
            item_id = ids.new_id(visible, priority)
            item = Item(
                id=item_id,
                payload=b"x",
                created_at=now,
                enqueue_at=visible if enqueue else None,
                expire_deadline=visible + timedelta(hours=1),
            )
            store.put_new("jobs", 0, [item], now=now)
            heads.append(store.heads("jobs", [0])[0])
            return item_id

        early = ids.new_id(start)  # minted first, written last: below the cursor by then
        first = produce(start)
        produce(start + timedelta(seconds=1))
        scheduled = produce(start + timedelta(seconds=2), enqueue=timedelta(hours=1))
        produce(start + timedelta(seconds=3), priority=3)
        store.note_leased("jobs", 0, [], cursor=key_after(first))
        store.put_new("jobs", 0, [_item(early, start)], now=start)
        heads.append(store.heads("jobs", [0])[0])
        now = start + timedelta(seconds=4)
        leased = store.claim(
            "jobs", 0, [first, scheduled], lease_deadline=now + timedelta(minutes=5), now=now
        ).applied
        store.note_leased("jobs", 0, leased, cursor=key_after(scheduled))  # the early one stops it
        heads.append(store.heads("jobs", [0])[0])
        store.delete("jobs", 0, [first], guard=Guard.LEASE_VALID, now=now, completed=True)
        heads.append(store.heads("jobs", [0])[0])
        store.delete("jobs", 0, [scheduled, "gone"], guard=Guard.ANY, now=now)
        heads.append(store.heads("jobs", [0])[0])
        return heads

    store = SQLiteItemStore(SQLiteDatabase(tmp_path / "fast.db"))
    fast = writes(store)
    with store._read() as rows:  # the one column a delete reads, against the whole head's
        assert rows.schedule_mark("jobs", 0) == rows._read_head("jobs", 0).schedule_mark != ""
        assert rows.schedule_mark("jobs", 1) == "" == rows.head("jobs", 1).schedule_mark
    monkeypatch.setattr(sqlite_store._SQLiteRows, "count_produced", lambda *_args: False)
    monkeypatch.setattr(sqlite_store._SQLiteRows, "add_counts", lambda *_args: False)
    monkeypatch.setattr(SQLiteItemStore, "note_leased", SortedRowsStore.note_leased)
    engine = writes(SQLiteItemStore(SQLiteDatabase(tmp_path / "engine.db")))

    assert fast == engine
    assert [(h.items, h.leased, h.scheduled, h.completed) for h in fast[-4:]] == [
        (5, 0, 1, 0),
        (5, 2, 0, 0),
        (4, 1, 0, 1),
        (3, 0, 0, 1),
    ]
    # The produce below the cursor pulled it back to itself; the lease could not pass it.
    assert fast[-4].cursor == fast[-3].cursor != ""
