"""What engine v3's embedded claim logs (``storage.embedded.log`` over memory and SQLite) promise beyond
the port's contract (``tests/contract``): one model, atomic calls, packed rows, bounded reads, and a
SQLite file that keeps all of it and v2's items beside it."""

from __future__ import annotations

import contextlib
import random
import sqlite3
import struct
import threading
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from querator.domain.model import Item, NewItem, QueueInfo, RetryRequest, timestamp_us
from querator.domain.positions import HOLE_TIMEOUT_S, parse_scheduled_id
from querator.ports import Guard
from querator.ports.log import Claim, LeaseRun, LogAges, LogKey, Settlement
from querator.storage.embedded.log.codec import ROW_BYTES, decode_items, encode_item, pack_row
from querator.storage.memory import InMemoryClaimLog
from querator.storage.memory.log import store as memory_log_store
from querator.storage.sqlite import SCHEMA_VERSION, SQLiteClaimLog, SQLiteDatabase
from querator.storage.sqlite.log import store as sqlite_log_store
from querator.testing import EPOCH, FakeClock, sqlite_service

if TYPE_CHECKING:
    from collections.abc import Iterator
    from datetime import datetime
    from pathlib import Path

    from querator.storage.embedded.log.base import PackedRow
    from querator.storage.embedded.log.store import ClaimLogEngine

pytestmark = pytest.mark.disable_socket

NOW = EPOCH + timedelta(days=1)
KEY = LogKey("jobs", 0)
DEAD = LogKey("jobs-dead", 0)
OTHER = LogKey("other", 0)


def item(n: int, *, size: int = 0, at: datetime = NOW, **fields: Any) -> Item:
    payload = f"{n}|".encode().ljust(size, b"p")
    return Item(id="", payload=payload, created_at=at, expire_deadline=at + timedelta(days=1), **fields)


def sqlite_log(path: Path) -> tuple[SQLiteClaimLog, SQLiteDatabase]:
    database = SQLiteDatabase(path)
    return SQLiteClaimLog(database), database


@pytest.fixture(params=["memory", "sqlite"])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ClaimLogEngine]:
    if request.param == "memory":
        yield InMemoryClaimLog()
        return
    store, database = sqlite_log(tmp_path / "q.db")
    yield store
    database.close()


def stored_rows(log: ClaimLogEngine, key: LogKey = KEY) -> list[PackedRow]:
    head = log.head(key)
    with log._read() as rows:
        return [row for row in rows.rows(key, head.cursor, head.tail, 10_000) if row.end > head.cursor]


# -- one model: memory and SQLite answer alike ---------------------------------------------------------


class _Names:
    """Gives the random parts of one store's answers (tokens, scheduled ids) names in the order they
    first appear, so two stores' answers compare; positions are the same in both."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.ids: list[str] = []  # every item id seen, in order: the steps pick from it by index

    def name(self, value: str, kind: str) -> str:
        if not value:
            return value
        if value not in self.names:
            self.names[value] = f"{kind}{len(self.names)}"
        return self.names[value]

    def item_id(self, item_id: str) -> str:
        if item_id not in self.ids:
            self.ids.append(item_id)
        return self.name(item_id, "s") if parse_scheduled_id(item_id) is not None else item_id

    def item(self, found: Item) -> tuple[Any, ...]:
        return (
            self.item_id(found.id),
            found.payload,
            found.attempts,
            found.lease_deadline,
            found.enqueue_at,
            found.reference,
            found.group,
            found.source_id,
        )

    def answer(self, value: Any) -> Any:
        if isinstance(value, Item):
            return self.item(value)
        if isinstance(value, Claim):
            items = [self.item(i) for i in value.items]
            return ("claim", self.name(value.token, "t"), value.deadline, items, value.holes)
        if isinstance(value, LeaseRun):
            return ("run", self.name(value.token, "t"), value.deadline, [self.item(i) for i in value.items])
        if isinstance(value, list):
            return [self.answer(v) for v in value]
        if isinstance(value, dict):
            return sorted((self.item_id(k), self.answer(v)) for k, v in value.items())
        if hasattr(value, "applied"):
            return ([self.item_id(i) for i in value.applied], [self.item_id(i) for i in value.rejected])
        return value


def _random_calls(seed: int, steps: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """A seeded sequence of port calls, with ids given as indexes into the ids seen so far."""
    rng = random.Random(seed)
    clock = NOW
    # ``unique``: every deadline and due time distinct (equal ones may come in either store's order).
    for unique in range(1, steps + 1):
        clock += timedelta(milliseconds=rng.randrange(0, 1500))
        op = rng.choice(
            ["append"] * 4
            + ["claim"] * 4
            + ["settle"] * 3
            + ["renew", "delete", "expire", "promote"]
            + ["take", "collect", "get", "list", "skip"]
        )
        args: dict[str, Any] = {"now": clock}
        if op == "append":
            items = []
            for n in range(rng.randrange(1, 6)):
                fields: dict[str, Any] = {}
                if rng.random() < 0.2:
                    fields["enqueue_at"] = clock + timedelta(
                        seconds=rng.randrange(1, 4), microseconds=unique * 10 + n
                    )
                if rng.random() < 0.2:
                    fields.update(reference="ref", group="acme", attempts=rng.randrange(3))
                items.append(item(unique * 10 + n, size=rng.choice([0, 100, 3000]), at=clock, **fields))
            args["items"] = items
        elif op == "claim":
            args["max_leased"] = rng.choice([None, None, 3])
            args.update(
                count=rng.randrange(1, 5),
                deadline=clock + timedelta(seconds=rng.randrange(1, 5), microseconds=unique),
            )
        elif op in ("settle", "renew", "delete", "get"):
            args["picks"] = [rng.randrange(1_000_000) for _ in range(rng.randrange(1, 4))]
            args["to_tail"] = [rng.random() < 0.4 for _ in args["picks"]]
            args["guard"] = rng.choice(
                [
                    Guard.LEASE_VALID,
                    Guard.LEASE_VALID,
                    Guard.LEASE_EXPIRED,
                    Guard.ANY,
                    Guard.NOT_VALIDLY_LEASED,
                ]
            )
            args["completed"] = rng.random() < 0.5
            args["deadline"] = clock + timedelta(seconds=rng.randrange(1, 5), microseconds=unique)
        elif op == "take":
            args["count"] = rng.randrange(1, 3)
            args["write"] = rng.random() < 0.5  # else the writer died
        elif op == "collect":
            clock += timedelta(seconds=rng.choice([0, HOLE_TIMEOUT_S]))
            args["now"] = clock
        yield op, args


def _play(log: ClaimLogEngine, names: _Names, op: str, args: dict[str, Any], state: dict[str, Any]) -> Any:
    now = args["now"]
    if "picks" in args and not names.ids:
        return None
    pick = [names.ids[p % len(names.ids)] for p in args.get("picks", [])]
    if op == "append":
        return log.append(KEY, args["items"], now=now)
    if op == "claim":
        claim = log.claim(
            KEY, count=args["count"], deadline=args["deadline"], now=now, max_leased=args["max_leased"]
        )
        if claim.token:
            state["tokens"].append(claim.token)
        return [claim, log.head(KEY)]
    if op == "settle":
        held = log.get(KEY, pick, now=now)
        settlements = [
            Settlement(id=i, to=KEY, item=held[i]) if tail and i in held else Settlement(id=i)
            for i, tail in zip(pick, args["to_tail"], strict=True)
        ]
        settled = log.settle(KEY, settlements, guard=args["guard"], now=now, completed=args["completed"])
        return [settled, log.head(KEY)]
    if op == "renew":
        return [log.renew(KEY, pick, deadline=args["deadline"], now=now), log.head(KEY)]
    if op == "delete":
        return [log.delete(KEY, pick, now=now), log.head(KEY)]
    if op == "get":
        return log.get(KEY, pick, now=now)
    if op == "expire":
        runs = log.expired(KEY, now=now, limit=3)
        # As the service does: each expired run's items back to the tail, under LEASE_EXPIRED.
        moved = [
            log.settle(
                KEY,
                [Settlement(id=i.id, to=KEY, item=i) for i in run.items],
                guard=Guard.LEASE_EXPIRED,
                now=now,
            )
            for run in runs
        ]
        return [runs, moved, log.head(KEY)]
    if op == "promote":
        return [log.promote(KEY, now=now, limit=3), log.head(KEY)]
    if op == "take":
        taken = log.take_positions(KEY, args["count"], now=now)
        written = log.write_taken(KEY, taken, [item(9) for _ in taken], now=now) if args["write"] else []
        return [taken, written]
    if op == "skip":
        return [log.skip_waiting(KEY, now=now), log.head(KEY)]
    if op == "collect":
        return [log.collect(KEY, token, now=now) for token in state["tokens"][-3:]] + [log.head(KEY)]
    return log.list_items(KEY, after="", limit=50, now=now)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_memory_and_sqlite_give_the_same_answers_to_the_same_calls(seed, tmp_path):
    on_sqlite, database = sqlite_log(tmp_path / "q.db")
    stores = {"memory": InMemoryClaimLog(), "sqlite": on_sqlite}
    names = {name: _Names() for name in stores}
    states: dict[str, dict[str, Any]] = {name: {"tokens": []} for name in stores}
    for step, (op, args) in enumerate(_random_calls(seed, 400)):
        answers = {
            name: names[name].answer(_play(log, names[name], op, args, states[name]))
            for name, log in stores.items()
        }
        assert answers["memory"] == answers["sqlite"], f"step {step}: {op}"
        listed = {
            name: names[name].answer(log.list_items(KEY, after="", limit=1000, now=args["now"]))
            for name, log in stores.items()
        }
        assert listed["memory"] == listed["sqlite"], f"step {step}: {op}, then list_items"
    # The sequence did reach every kind of answer (else the comparison proved little).
    last = stores["memory"].head(KEY)
    assert last.tail - last.cursor >= 0 and len(names["memory"].ids) > 100
    database.close()


# -- SQLite keeps everything ------------------------------------------------------------------------


def test_sqlite_keeps_every_part_of_a_log_across_closing_and_reopening_the_file(tmp_path):
    path = tmp_path / "q.db"
    log, database = sqlite_log(path)
    stored = log.append(
        KEY, [item(n, size=100) for n in range(5)] + [item(9, enqueue_at=NOW + timedelta(minutes=1))], now=NOW
    )
    claim = log.claim(KEY, count=3, deadline=NOW + timedelta(minutes=5), now=NOW)
    log.renew(KEY, [claim.items[0].id], deadline=NOW + timedelta(minutes=9), now=NOW)  # a split record
    log.settle(KEY, [Settlement(id=claim.items[1].id)], guard=Guard.LEASE_VALID, now=NOW)
    log.delete(KEY, [stored[4].id], now=NOW)  # a tombstone
    [taken] = log.take_positions(KEY, 1, now=NOW)  # a writer that has not written yet
    head = log.head(KEY)
    listed = log.list_items(KEY, after="", limit=100, now=NOW)
    database.close()

    log, database = sqlite_log(path)
    assert log.head(KEY) == head
    assert log.list_items(KEY, after="", limit=100, now=NOW) == listed
    assert [i.id for i in listed] == [claim.items[0].id, claim.items[2].id, stored[3].id, stored[5].id]
    # And it goes on where it was: the tombstone skipped, the hole met, the leases still held.
    later = log.claim(KEY, count=5, deadline=NOW + timedelta(minutes=5), now=NOW)
    assert [i.id for i in later.items] == [stored[3].id] and later.holes == [taken]
    assert log.write_taken(KEY, [taken], [item(7)], now=NOW)[0].id == taken
    result = log.settle(
        KEY,
        [Settlement(id=claim.items[0].id), Settlement(id=claim.items[2].id)],
        guard=Guard.LEASE_VALID,
        now=NOW,
    )
    assert result.applied == [claim.items[0].id, claim.items[2].id]
    assert log.promote(KEY, now=NOW + timedelta(minutes=2), limit=10) == 1
    database.close()


def test_the_migration_from_schema_7_keeps_leases_in_flight_and_gives_them_coming_priorities(tmp_path):
    path = tmp_path / "q.db"
    log, database = sqlite_log(path)
    log.append(KEY, [item(n) for n in range(3)], now=NOW)
    claim = log.claim(KEY, count=3, deadline=NOW + timedelta(minutes=1), now=NOW)
    database.close()
    # The file as schema 7 left it: lease records without their coming priorities, and rows and
    # records without the sums of their items' creation times.
    old = sqlite3.connect(path)
    old.execute("ALTER TABLE items DROP COLUMN last_reason")  # schema 9's
    old.execute("ALTER TABLE items DROP COLUMN failures")
    old.execute("ALTER TABLE log_leases DROP COLUMN priorities")
    old.execute("ALTER TABLE log_leases DROP COLUMN created")
    old.execute("ALTER TABLE log_rows DROP COLUMN created")
    old.execute("UPDATE querator_meta SET value = '7' WHERE key = 'schema_version'")
    old.execute("PRAGMA user_version = 7")
    old.commit()
    old.close()

    log, database = sqlite_log(path)

    with contextlib.closing(sqlite3.connect(path)) as check:
        assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 9
    ids = [i.id for i in claim.items]
    assert [i.next_priority for i in log.get(KEY, ids, now=NOW).values()] == [None] * 3
    assert log.set_next_priority(KEY, ids[1:], priority=0, now=NOW).applied == ids[1:]
    assert [i.next_priority for i in log.get(KEY, ids, now=NOW).values()] == [None, 0, 0]
    assert log.settle(KEY, [Settlement(id=ids[0])], guard=Guard.LEASE_VALID, now=NOW).applied == ids[:1]
    (run,) = log.expired(KEY, now=NOW + timedelta(minutes=1), limit=10)
    assert [(i.id, i.next_priority) for i in run.items] == [(ids[1], 0), (ids[2], 0)]
    # What schema 7 stored counts no age (it kept none); what is written from now on does.
    assert log.ages(KEY) == LogAges()
    log.append(KEY, [item(9)], now=NOW)
    assert log.ages(KEY) == LogAges(waiting_created=int(NOW.timestamp()))
    database.close()


def test_the_migration_from_schema_6_leaves_v2s_items_leasable_on_the_default_engine(tmp_path):
    path = tmp_path / "q.db"
    clock = FakeClock(NOW)
    service = sqlite_service(path, clock=clock, engine=2)
    service.create_queue(
        QueueInfo(
            name="jobs",
            lease_timeout=timedelta(minutes=1),
            expire_timeout=timedelta(days=1),
            created_at=NOW,
            updated_at=NOW,
        )
    )
    service.produce(
        "jobs", [NewItem(payload=b"first"), NewItem(payload=b"second"), NewItem(payload=b"third")]
    )
    [held] = service.lease("jobs", batch_size=1, client_id="c", timeout=timedelta(0)).items
    service.store._db.close()  # type: ignore[attr-defined]
    # The file as schema 6 left it: no claim log tables (the trigger goes with its table).
    old = sqlite3.connect(path)
    for table in ("log_heads", "log_rows", "log_leases", "log_schedule"):
        old.execute(f"DROP TABLE {table}")
    old.execute("ALTER TABLE items DROP COLUMN last_reason")  # schema 9's
    old.execute("ALTER TABLE items DROP COLUMN failures")
    old.execute("UPDATE querator_meta SET value = '6' WHERE key = 'schema_version'")
    old.execute("PRAGMA user_version = 6")
    old.commit()
    v2_rows = old.execute("SELECT * FROM items ORDER BY id").fetchall()
    v2_heads = old.execute("SELECT * FROM heads").fetchall()
    old.close()

    upgraded = sqlite_service(path, clock=clock)
    with contextlib.closing(sqlite3.connect(path)) as check:
        assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 9
        columns = {row[1] for row in check.execute("PRAGMA table_info(log_rows)")}
        assert "created" in columns  # schema 8: the rows' sums of creation times
        # Schema 9 adds the items' failure columns, empty on every item that was there.
        assert check.execute("SELECT * FROM items ORDER BY id").fetchall() == [
            (*row, None, None) for row in v2_rows
        ]
        assert check.execute("SELECT * FROM heads").fetchall() == v2_heads
    # v2 goes on: its lease honoured, its waiting items leased in order.
    assert upgraded.complete("jobs", 0, [held.id]).failed == []
    leased = upgraded.lease("jobs", batch_size=10, client_id="c", timeout=timedelta(0)).items
    assert [i.payload for i in leased] == [b"second", b"third"]
    assert upgraded.complete("jobs", 0, [i.id for i in leased]).failed == []
    # And the claim log lives in the same file beside it.
    log = SQLiteClaimLog(upgraded.store._db)  # type: ignore[attr-defined]
    log.append(KEY, [item(1)], now=NOW)
    claim = log.claim(KEY, count=5, deadline=NOW + timedelta(minutes=1), now=NOW)
    assert [i.payload for i in claim.items] == [b"1|"]


def test_the_migration_from_schema_8_keeps_every_item_and_then_records_failures_on_both_engines(tmp_path):
    path = tmp_path / "q.db"
    clock = FakeClock(NOW)
    service = sqlite_service(path, clock=clock, engine=2)
    service.create_queue(
        QueueInfo(
            name="jobs",
            lease_timeout=timedelta(minutes=1),
            expire_timeout=timedelta(days=1),
            created_at=NOW,
            updated_at=NOW,
        )
    )
    service.produce("jobs", [NewItem(payload=b"v2-held"), NewItem(payload=b"v2-waiting")])
    [held] = service.lease("jobs", batch_size=1, client_id="c", timeout=timedelta(0)).items
    log = SQLiteClaimLog(service.store._db)  # type: ignore[attr-defined]
    [logged] = log.append(OTHER, [item(1)], now=NOW)
    service.store._db.close()  # type: ignore[attr-defined]
    # The file as schema 8 left it: items without their failure columns.
    old = sqlite3.connect(path)
    old.execute("ALTER TABLE items DROP COLUMN last_reason")
    old.execute("ALTER TABLE items DROP COLUMN failures")
    old.execute("UPDATE querator_meta SET value = '8' WHERE key = 'schema_version'")
    old.execute("PRAGMA user_version = 8")
    old.commit()
    v2_rows = old.execute("SELECT * FROM items ORDER BY id").fetchall()
    v3_rows = old.execute("SELECT * FROM log_rows").fetchall()
    old.close()

    upgraded = sqlite_service(path, clock=clock, engine=3)

    with contextlib.closing(sqlite3.connect(path)) as check:
        assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 9
        assert check.execute("SELECT value FROM querator_meta WHERE key = 'schema_version'").fetchone() == (
            "9",
        )
        assert check.execute("SELECT * FROM items ORDER BY id").fetchall() == [
            (*r, None, None) for r in v2_rows
        ]
        assert check.execute("SELECT * FROM log_rows").fetchall() == v3_rows
    assert [(i.payload, i.last_reason, i.failures) for i in upgraded.list_items("jobs", 0)] == [
        (b"v2-held", "", 0),
        (b"v2-waiting", "", 0),
    ]
    # The item leased before the upgrade is retried within v2's rows, its reason kept there.
    assert upgraded.retry("jobs", 0, [RetryRequest(id=held.id, reason="db down")]).failed == []
    listed = {i.payload: i for i in upgraded.list_items("jobs", 0)}
    assert (listed[b"v2-held"].last_reason, listed[b"v2-held"].failures) == ("db down", 1)
    assert not listed[b"v2-held"].id.count("l")  # still a v2 id
    log = SQLiteClaimLog(upgraded.store._db)  # type: ignore[attr-defined]
    [read] = log.get(OTHER, [logged.id], now=NOW).values()
    assert (read.payload, read.last_reason, read.failures) == (logged.payload, "", 0)


# -- atomic calls -----------------------------------------------------------------------------------


def _rows_class(log: ClaimLogEngine) -> type:
    if isinstance(log, InMemoryClaimLog):
        return memory_log_store._MemoryLogRows
    return sqlite_log_store._SQLiteLogRows


@pytest.mark.parametrize("failing", ["take", "put_rows"])
@pytest.mark.parametrize("target", [KEY, DEAD], ids=["to-the-tail", "to-a-dead-letter-log"])
def test_an_error_in_the_middle_of_a_settle_that_moves_items_leaves_nothing_half_applied(
    log, monkeypatch, failing, target
):
    log.append(KEY, [item(n) for n in range(3)], now=NOW)
    log.append(DEAD, [item(9)], now=NOW)
    claim = log.claim(KEY, count=3, deadline=NOW + timedelta(minutes=1), now=NOW)
    before = {key: (log.head(key), log.list_items(key, after="", limit=100, now=NOW)) for key in (KEY, DEAD)}
    real = getattr(_rows_class(log), failing)
    calls = []

    def fail_on_the_move(self: Any, key: LogKey, *args: Any, **kwargs: Any) -> Any:
        calls.append(key)
        if key == target:  # the append the settle carries, after it marked its positions done
            raise sqlite3.OperationalError("disk I/O error (injected)")
        return real(self, key, *args, **kwargs)

    monkeypatch.setattr(_rows_class(log), failing, fail_on_the_move)
    settlements = [Settlement(id=i.id, to=target, item=i) for i in claim.items[:2]] + [
        Settlement(id=claim.items[2].id)
    ]
    with pytest.raises(Exception, match="injected"):
        log.settle(KEY, settlements, guard=Guard.LEASE_VALID, now=NOW)
    assert calls  # the failure did come in the middle
    monkeypatch.undo()

    assert {
        key: (log.head(key), log.list_items(key, after="", limit=100, now=NOW)) for key in (KEY, DEAD)
    } == before
    # The lease still holds all three, and settles them now.
    again = log.settle(KEY, settlements, guard=Guard.LEASE_VALID, now=NOW)
    assert again.applied == [i.id for i in claim.items]
    assert log.head(KEY).leases == 0
    assert [i.payload for i in log.list_items(target, after="", limit=100, now=NOW)][-2:] == [b"0|", b"1|"]


# -- packed rows ------------------------------------------------------------------------------------


def test_items_produced_together_are_packed_into_rows_of_up_to_16_kb(log):
    log.append(KEY, [item(n, size=100) for n in range(100)], now=NOW)
    assert len(stored_rows(log)) == 1  # 100 items of 100 B: one row
    log.claim(KEY, count=100, deadline=NOW + timedelta(minutes=1), now=NOW)

    stored = log.append(KEY, [item(n, size=100) for n in range(170)], now=NOW)  # 17 KB
    rows = stored_rows(log)
    assert [row.count for row in rows] == [116, 54]  # 116 items of 141 B fill 16,356 of 16,384
    assert all(row.blob is not None and len(row.blob) <= ROW_BYTES + 2 + 4 * row.count for row in rows)
    claim = log.claim(KEY, count=200, deadline=NOW + timedelta(minutes=1), now=NOW)
    assert [i.id for i in claim.items] == [i.id for i in stored]  # across the two rows, in order
    assert [i.payload for i in claim.items] == [i.payload for i in stored]

    # An item larger than a row gets one of its own; the ones around it share theirs.
    log.append(KEY, [item(1, size=10), item(2, size=20_000), item(3, size=10), item(4, size=10)], now=NOW)
    assert [row.count for row in stored_rows(log)] == [1, 1, 2]


def test_a_claim_of_part_of_a_packed_row_reads_that_row_and_takes_only_its_run(log):
    stored = log.append(KEY, [item(n, size=100) for n in range(100)], now=NOW)
    first = log.claim(KEY, count=3, deadline=NOW + timedelta(minutes=1), now=NOW)
    second = log.claim(KEY, count=2, deadline=NOW + timedelta(minutes=1), now=NOW)
    assert [i.id for i in first.items + second.items] == [i.id for i in stored[:5]]
    assert log.head(KEY).leased == 5


def test_an_item_that_never_failed_is_encoded_byte_for_byte_as_before_failures_were_kept():
    # The layout before failure reasons: times, attempts, next priority, six string lengths, payload.
    before = struct.Struct("<qqqIb6H")
    plain = item(1, size=100)
    created, expire = timestamp_us(plain.created_at), timestamp_us(plain.expire_deadline)

    data, reply = encode_item(plain)

    assert data == before.pack(created, expire, -(2**63), 0, -1, 0, 0, 0, 0, 0, 0) + plain.payload
    assert len(data) == 41 + 100 and reply == 100
    strings = item(2, reference="r", group="g", attempts=2, next_priority=3)
    data, _ = encode_item(strings)
    assert data == before.pack(created, expire, -(2**63), 2, 3, 1, 0, 0, 0, 0, 1) + b"rg" + strings.payload


def test_a_failed_item_carries_its_reason_and_count_and_rows_of_the_old_layout_still_read():
    failed = item(1, last_reason="ValueError: café", failures=3, next_priority=0, group="g")
    never = item(2, next_priority=9)
    old_row = pack_row([encode_item(never)[0]])  # what a file written before failures holds

    data, reply = encode_item(failed)

    assert len(data) == len(encode_item(replace(failed, last_reason="", failures=0))[0]) + 6 + 17
    assert reply == failed.reply_size()
    [back] = decode_items(pack_row([data]), 0, [0], "", deadline=None, bump=0)
    assert (back.last_reason, back.failures, back.next_priority, back.group) == (
        "ValueError: café",
        3,
        0,
        "g",
    )
    assert back.payload == failed.payload
    [old] = decode_items(old_row, 0, [0], "", deadline=None, bump=0)
    assert (old.last_reason, old.failures, old.next_priority) == ("", 0, 9)
    # A count without a reason (an import) and a reason of the most bytes keep too.
    for given in (item(3, failures=1), item(4, last_reason="x" * 1024, failures=65_000)):
        [again] = decode_items(pack_row([encode_item(given)[0]]), 0, [0], "", deadline=None, bump=0)
        assert (again.last_reason, again.failures, again.payload) == (
            given.last_reason,
            given.failures,
            given.payload,
        )


def test_a_failed_item_keeps_its_reason_through_a_claim_a_move_and_a_listing(log):
    [stored] = log.append(KEY, [item(1, last_reason="boom", failures=1)], now=NOW)
    claim = log.claim(KEY, count=1, deadline=NOW + timedelta(minutes=1), now=NOW)
    assert [(i.last_reason, i.failures) for i in claim.items] == [("boom", 1)]

    moved = replace(claim.items[0], last_reason="again", failures=2)
    settled = log.settle(
        KEY, [Settlement(id=stored.id, to=DEAD, item=moved)], guard=Guard.LEASE_VALID, now=NOW
    )

    assert settled.applied == [stored.id]
    [listed] = log.list_items(DEAD, after="", limit=10, now=NOW)
    assert (listed.last_reason, listed.failures) == ("again", 2)
    assert [(i.last_reason, i.failures) for i in log.get(DEAD, [listed.id], now=NOW).values()] == [
        ("again", 2)
    ]
    # The schedule keeps them too.
    later = replace(moved, enqueue_at=NOW + timedelta(minutes=1))
    [scheduled] = log.append(KEY, [later], now=NOW)
    assert log.promote(KEY, now=NOW + timedelta(minutes=1), limit=10) == 1
    claim = log.claim(KEY, count=5, deadline=NOW + timedelta(minutes=5), now=NOW + timedelta(minutes=1))
    assert [(i.last_reason, i.failures) for i in claim.items] == [("again", 2)] and scheduled.id


# -- reads O(returned) ------------------------------------------------------------------------------


class _Counting:
    """A rows protocol that counts its calls and the rows and records they return."""

    def __init__(self, rows: Any, tally: dict[str, int]) -> None:
        self._rows = rows
        self._tally = tally

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._rows, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._tally["calls"] += 1
            found = method(*args, **kwargs)
            if isinstance(found, list):
                self._tally["returned"] += len(found)
            return found

        return counted


@pytest.mark.slow
def test_with_10000_records_in_flight_a_call_touches_a_bounded_number_of_rows(log, monkeypatch):
    for n in range(100):
        log.append(KEY, [item(n * 100 + i, size=100) for i in range(100)], now=NOW)
    claims = [
        log.claim(KEY, count=1, deadline=NOW + timedelta(minutes=1, microseconds=n), now=NOW)
        for n in range(10_000)
    ]
    log.append(KEY, [item(n, size=100) for n in range(10)], now=NOW)
    assert log.head(KEY).leases == 10_000
    tally = {"calls": 0, "returned": 0}
    read, write = log._read, log._write

    @contextlib.contextmanager
    def counting(opened: Any) -> Iterator[_Counting]:
        with opened() as rows:
            yield _Counting(rows, tally)

    monkeypatch.setattr(log, "_read", lambda: counting(read))
    monkeypatch.setattr(log, "_write", lambda: counting(write))

    def cost(call: Any) -> tuple[int, int]:
        tally.update(calls=0, returned=0)
        call()
        return tally["calls"], tally["returned"]

    claim_cost = cost(lambda: log.claim(KEY, count=5, deadline=NOW + timedelta(minutes=2), now=NOW))
    assert claim_cost[0] <= 4 and claim_cost[1] <= 2  # head, its run's one row, the record, the head
    settle = [Settlement(id=claims[5_000].items[0].id)]
    assert cost(lambda: log.settle(KEY, settle, guard=Guard.LEASE_VALID, now=NOW)) <= (4, 1)
    assert cost(
        lambda: log.renew(KEY, [claims[7_000].items[0].id], deadline=NOW + timedelta(hours=1), now=NOW)
    ) <= (3, 1)
    assert cost(lambda: log.get(KEY, [claims[9_000].items[0].id], now=NOW)) <= (3, 2)
    assert cost(lambda: log.expired(KEY, now=NOW, limit=10)) == (1, 0)  # none due: none read
    runs = log.expired(KEY, now=NOW + timedelta(minutes=1, microseconds=2), limit=10)
    assert len(runs) == 3
    assert (
        cost(lambda: log.expired(KEY, now=NOW + timedelta(minutes=1, microseconds=2), limit=10))[1] <= 3 + 3
    )
    assert (
        cost(lambda: log.list_items(KEY, after=claims[3_000].items[0].id, limit=3, now=NOW))[1] <= 3 + 3 + 3
    )
    assert cost(lambda: log.head(KEY)) == (2, 0)


# -- claims never race ------------------------------------------------------------------------------


@pytest.mark.parametrize("writers", ["one-store", "two-databases"])
def test_concurrent_appends_and_claims_deliver_every_item_once_in_order(tmp_path, writers):
    # Two SQLiteDatabase objects on one file stand for two processes (their own connections).
    first, database = sqlite_log(tmp_path / "q.db")
    second, other = sqlite_log(tmp_path / "q.db") if writers == "two-databases" else (first, database)
    produced: list[str] = []
    delivered: list[list[str]] = []
    lock = threading.Lock()

    def produce(log: SQLiteClaimLog, n: int) -> None:
        for batch in range(40):
            stored = log.append(KEY, [item(n * 1000 + batch * 10 + i) for i in range(1 + batch % 3)], now=NOW)
            with lock:
                produced.extend(i.id for i in stored)

    def consume(log: SQLiteClaimLog) -> None:
        for _ in range(400):  # bounded: more than enough rounds for what the producers write
            claim = log.claim(KEY, count=3, deadline=NOW + timedelta(minutes=1), now=NOW)
            if claim.items:
                log.settle(KEY, [Settlement(id=i.id) for i in claim.items], guard=Guard.LEASE_VALID, now=NOW)
                with lock:
                    delivered.append([i.id for i in claim.items])

    threads = [threading.Thread(target=produce, args=(log, n)) for n, log in enumerate([first, second] * 2)]
    threads += [threading.Thread(target=consume, args=(log,)) for log in [first, second] * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    # What the consumers left (they may have run ahead of the producers).
    while claim := first.claim(KEY, count=100, deadline=NOW + timedelta(minutes=1), now=NOW).items:
        delivered.append([i.id for i in claim])
    flat = [i for run in delivered for i in run]
    assert sorted(flat) == sorted(produced) and len(set(flat)) == len(flat)  # every item once
    assert all(run == sorted(run) for run in delivered)  # each claim a run, oldest first
    database.close()
    other.close()


def test_a_writer_whose_positions_were_skipped_writes_at_the_tail(log):
    # A writer took positions and was slow; the queue was cleared meanwhile (skip_waiting): its
    # positions are behind the cursor, held by no lease, so its items go to the tail, not lost.
    log.append(KEY, [item(1)], now=NOW)
    taken = log.take_positions(KEY, 2, now=NOW)
    assert log.skip_waiting(KEY, now=NOW) == 3  # the item and the two holes
    written = log.write_taken(KEY, taken, [item(2), item(3)], now=NOW)
    assert [i.id for i in written] != taken
    assert [i.payload for i in _claim_all(log)] == [b"2|", b"3|"]
    assert log.head(KEY).produced == 3


def test_a_retried_write_of_taken_positions_leaves_what_the_first_try_wrote(log):
    taken = log.take_positions(KEY, 3, now=NOW)
    first = log.write_taken(KEY, taken, [item(n) for n in range(3)], now=NOW)
    again = log.write_taken(KEY, taken, [item(n) for n in range(3)], now=NOW)
    assert [i.id for i in first] == [i.id for i in again] == taken
    assert [i.payload for i in _claim_all(log)] == [b"0|", b"1|", b"2|"]
    assert log.head(KEY).produced == 3


def _claim_all(log: ClaimLogEngine) -> list[Item]:
    return log.claim(KEY, count=100, deadline=NOW + timedelta(minutes=1), now=NOW).items
