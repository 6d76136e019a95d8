"""Engine v3's claim log on DynamoDB, what only this store has (``storage/dynamodb/log/``): the
head's spill of lease records, packed rows, a dead writer's hole, contention of 16 consumers on a
moto server, and TTL on the rows. The port's behaviour on every store is ``tests/contract``'s.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import pytest
from moto import mock_aws

from benchmarks.meter import CostMeter, item_size
from querator.domain.model import Item
from querator.domain.positions import HOLE_TIMEOUT_S, parse_position_id
from querator.ports import Guard
from querator.ports.log import LogAges, LogKey, Settlement
from querator.storage.dynamodb import schema
from querator.storage.dynamodb.log import HEAD_RECORDS, DynamoDBClaimLog
from querator.testing import dynamodb_client

if TYPE_CHECKING:
    from collections.abc import Iterator

    from mypy_boto3_dynamodb import DynamoDBClient

TABLE = "log-items"
NOW = datetime(2026, 11, 27, 12, 0, tzinfo=timezone.utc)
KEY = LogKey("q", 0)
LEASE = timedelta(seconds=30)


def item(n: int, size: int = 100, *, expire: timedelta = timedelta(days=1)) -> Item:
    """An item whose payload starts with its number (to check what was delivered)."""
    tag = f"{n:08d}".encode()
    return Item(id="", payload=(tag + b"x" * size)[:size], expire_deadline=NOW + expire, created_at=NOW)


def number(stored: Item) -> int:
    return int(stored.payload[:8])


class Logged:
    """A claim log over moto in process, with a meter on its client and a raw client to peek."""

    def __init__(self, client: DynamoDBClient, raw: DynamoDBClient) -> None:
        self.raw = raw
        self.meter = CostMeter(raw)
        self.meter.attach(client)
        self.log = DynamoDBClaimLog(client, TABLE, concurrency=1)

    def rows(self, prefix: str, key: LogKey = KEY) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {
            "TableName": TABLE,
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :p)",
            "ExpressionAttributeValues": {
                # Packed rows under the log's rows key, the rest under its own (schema's docstring).
                ":pk": {
                    "S": (
                        schema.log_rows_key if prefix == schema.LOG_ROW_PREFIX else schema.log_partition_key
                    )(key.queue, key.partition, key.lane)
                },
                ":p": {"S": prefix},
            },
        }
        while True:
            reply = self.raw.query(**kwargs)
            found += reply.get("Items", [])
            if "LastEvaluatedKey" not in reply:
                return found
            kwargs["ExclusiveStartKey"] = reply["LastEvaluatedKey"]

    def head_size(self) -> int:
        (head,) = self.rows(schema.LOG_HEAD_SK)
        return item_size(head)


@pytest.fixture
def logged() -> Iterator[Logged]:
    with mock_aws():
        client, raw = dynamodb_client(), dynamodb_client()
        schema.create_tables(client, items_table=TABLE, catalog_table="log-catalog")
        yield Logged(client, raw)


# -- the spill ----------------------------------------------------------------------------------------


def test_forty_leases_in_flight_keep_the_head_small_and_spilled_records_work(logged: Logged) -> None:
    log = logged.log
    log.append(KEY, [item(n) for n in range(400)], now=NOW)
    claims = []
    claim_units = []
    for n in range(40):
        logged.meter.reset()
        claims.append(log.claim(KEY, count=10, deadline=NOW + LEASE + timedelta(seconds=n), now=NOW))
        claim_units.append(logged.meter.snapshot())
    assert all(len(c.items) == 10 for c in claims)
    # The head never holds more than HEAD_RECORDS records: the rest are P/L rows.
    assert logged.head_size() < 2048
    head = log.head(KEY)
    assert head.leases == 40
    assert head.leased == 400
    assert len(logged.rows(schema.LOG_RECORD_PREFIX)) >= 40 - HEAD_RECORDS
    assert len(logged.rows(schema.LOG_EXPIRY_PREFIX)) == len(logged.rows(schema.LOG_RECORD_PREFIX))
    # A claim costs the same with 5 leases in flight as with 39: the head does not grow with them
    # (claims that spill pay the spill's transaction, amortized over the 16 records it moves).
    # Each reads the head (under 4 KB: 1 unit) and the one or two rows of its run (16 KB read
    # eventually consistent: 2 units each), and writes the head (under 2 KB: 2 units at most).
    plain = [s for s in claim_units if "TransactWriteItems" not in s.requests_by_operation]
    assert len(plain) >= 40 - 2
    assert max(s.requests for s in plain) <= 4  # head, claim, one or two pages of rows
    assert max(s.read_units for s in plain) <= 1 + 2 * 2
    assert max(s.write_units for s in plain) <= 2
    late = [s for s in plain[HEAD_RECORDS:] if s.requests == 3]
    early = [s for s in plain[:HEAD_RECORDS] if s.requests == 3]
    assert max(s.read_units for s in late) <= max(s.read_units for s in early)

    oldest = claims[0]  # spilled: the oldest deadline goes first
    assert logged.rows(schema.LOG_RECORD_PREFIX + f"{parse_position_id(oldest.items[0].id)[1]:016x}")  # type: ignore[index]
    # Settle part of a spilled record, renew the rest, and let a second spilled one expire.
    done = log.settle(KEY, [Settlement(id=i.id) for i in oldest.items[:4]], guard=Guard.LEASE_VALID, now=NOW)
    assert len(done.applied) == 4
    again = log.settle(KEY, [Settlement(id=oldest.items[0].id)], guard=Guard.LEASE_VALID, now=NOW)
    assert again.rejected == [oldest.items[0].id]
    later = NOW + timedelta(minutes=10)
    renewed = log.renew(KEY, [i.id for i in oldest.items[4:]], deadline=later, now=NOW)
    assert len(renewed.applied) == 6
    expired = log.expired(KEY, now=NOW + LEASE + timedelta(seconds=1, microseconds=1), limit=10)
    # Claims 0 and 1 were due at +30 s and +31 s; claim 0 was renewed past that.
    assert [run.token for run in expired] == [claims[1].token]
    assert [i.id for i in expired[0].items] == [i.id for i in claims[1].items]
    moved = log.settle(
        KEY,
        [Settlement(id=i.id, to=KEY, item=i) for i in expired[0].items],
        guard=Guard.LEASE_EXPIRED,
        now=NOW + LEASE + timedelta(seconds=2),
    )
    assert len(moved.applied) == 10
    assert log.head(KEY).waiting == 10  # back at the tail
    # The renewed part of the spilled record is still held, and completes.
    rest = log.settle(KEY, [Settlement(id=i.id) for i in oldest.items[4:]], guard=Guard.LEASE_VALID, now=NOW)
    assert len(rest.applied) == 6
    assert log.head(KEY).leases == 38


# -- packing ------------------------------------------------------------------------------------------


def test_rows_live_under_a_key_of_their_own_so_the_head_takes_three_writes_a_call(logged: Logged) -> None:
    """The head's key takes the sequencer, the claim and the complete (1 unit each while the head is
    under 1 KB); the rows' key takes the rows' bytes. At calls of 10 items of 100 B the hottest key
    takes 0.3 write units an item: 3,333 items a second under DynamoDB's 1,000 a key."""
    log = logged.log
    for start in range(0, 100, 10):
        log.append(KEY, [item(n) for n in range(start, start + 10)], now=NOW)
        claim = log.claim(KEY, count=10, deadline=NOW + LEASE, now=NOW)
        log.settle(KEY, [Settlement(id=i.id) for i in claim.items], guard=Guard.LEASE_VALID, now=NOW)
    by_key = logged.meter.snapshot().write_units_by_key
    head_key = f"{TABLE}:{schema.log_partition_key(KEY.queue, KEY.partition, KEY.lane)}"
    rows_key = f"{TABLE}:{schema.log_rows_key(KEY.queue, KEY.partition, KEY.lane)}"
    assert set(by_key) == {head_key, rows_key}
    # Ten calls of take, claim and complete; items under REPLY_SIZE_THRESHOLD (as these 100 B ones)
    # leave the head's largest item size alone: a claim counts every item as at least that much.
    assert by_key[head_key] == 3 * 10
    assert by_key[rows_key] == 2 * 10  # ten rows of 10 items of 100 B, each over 1 KB
    assert logged.rows(schema.LOG_ROW_PREFIX) and not [
        r for r in logged.rows(schema.LOG_HEAD_SK) if r[schema.SK]["S"].startswith(schema.LOG_ROW_PREFIX)
    ]
    # Purging the log removes both keys.
    while log.purge(KEY, limit=5):
        pass
    assert logged.rows(schema.LOG_ROW_PREFIX) == [] and logged.rows(schema.LOG_HEAD_SK) == []


def test_a_log_whose_earlier_rows_sit_under_its_heads_key_is_read_whole(logged: Logged) -> None:
    """A log engine v3 wrote before its rows had a key of their own: those rows stay under the
    head's key, later ones go under the rows key, and listings, gets and claims read both."""
    log = logged.log
    log.append(KEY, [item(n) for n in range(20)], now=NOW)
    rows_key = schema.log_rows_key(KEY.queue, KEY.partition, KEY.lane)
    head_key = schema.log_partition_key(KEY.queue, KEY.partition, KEY.lane)
    for row in logged.rows(schema.LOG_ROW_PREFIX):  # where the earlier layout kept them
        logged.raw.put_item(TableName=TABLE, Item={**row, schema.PK: {"S": head_key}})
        logged.raw.delete_item(TableName=TABLE, Key={schema.PK: {"S": rows_key}, schema.SK: row[schema.SK]})
    log.append(KEY, [item(n) for n in range(20, 30)], now=NOW)

    listed = log.list_items(KEY, after="", limit=100, now=NOW)
    assert [i.payload for i in listed] == [item(n).payload for n in range(30)]
    assert len(log.get(KEY, [i.id for i in listed], now=NOW)) == 30
    claim = log.claim(KEY, count=25, deadline=NOW + LEASE, now=NOW)
    assert [i.payload for i in claim.items] == [item(n).payload for n in range(25)] and not claim.holes
    rest = log.claim(KEY, count=25, deadline=NOW + LEASE, now=NOW)
    assert [i.payload for i in rest.items] == [item(n).payload for n in range(25, 30)]


def test_a_hundred_small_items_are_one_row(logged: Logged) -> None:
    logged.log.append(KEY, [item(n, 100) for n in range(100)], now=NOW)
    rows = logged.rows(schema.LOG_ROW_PREFIX)
    assert [len(r[schema.LOG_ITEMS]["L"]) for r in rows] == [100]


def test_seventeen_kilobytes_of_items_are_two_rows(logged: Logged) -> None:
    logged.log.append(KEY, [item(n, 1000) for n in range(17)], now=NOW)
    rows = logged.rows(schema.LOG_ROW_PREFIX)
    assert len(rows) == 2
    assert sum(len(r[schema.LOG_ITEMS]["L"]) for r in rows) == 17
    assert all(item_size(r) < schema.LOG_ROW_BYTES + 512 for r in rows)


def test_a_large_item_gets_a_row_of_its_own(logged: Logged) -> None:
    stored = logged.log.append(KEY, [item(0), item(1, 300_000), item(2)], now=NOW)
    rows = logged.rows(schema.LOG_ROW_PREFIX)
    assert [len(r[schema.LOG_ITEMS]["L"]) for r in rows] == [1, 1, 1]
    claim = logged.log.claim(KEY, count=3, deadline=NOW + LEASE, now=NOW)
    assert [i.id for i in claim.items] == [s.id for s in stored]
    assert len(claim.items[1].payload) == 300_000


def test_rows_carry_a_ttl_a_day_after_their_last_item_expires(logged: Logged) -> None:
    logged.log.append(KEY, [item(0, expire=timedelta(hours=1)), item(1, expire=timedelta(hours=5))], now=NOW)
    (row,) = logged.rows(schema.LOG_ROW_PREFIX)
    assert int(row[schema.TTL]["N"]) == int((NOW + timedelta(hours=5, days=1)).timestamp())
    ttl = logged.raw.describe_time_to_live(TableName=TABLE)["TimeToLiveDescription"]
    assert ttl["AttributeName"] == schema.TTL


# -- the dead writer ----------------------------------------------------------------------------------


def test_a_dead_writers_hole_is_filled_and_the_late_write_lands_at_new_positions(logged: Logged) -> None:
    log = logged.log
    log.append(KEY, [item(n) for n in range(3)], now=NOW)
    taken = log.take_positions(KEY, 4, now=NOW)  # a writer that stops here
    log.append(KEY, [item(n) for n in range(7, 10)], now=NOW)
    claim = log.claim(KEY, count=10, deadline=NOW + LEASE, now=NOW)
    assert [number(i) for i in claim.items] == [0, 1, 2, 7, 8, 9]
    assert claim.holes == taken
    # Before HOLE_TIMEOUT the hole waits for its writer.
    early = log.collect(KEY, claim.token, now=NOW + timedelta(seconds=HOLE_TIMEOUT_S / 2))
    assert early.items == []
    assert early.holes == taken
    # After it, the hole is filled: done, never delivered.
    late = NOW + timedelta(seconds=HOLE_TIMEOUT_S)
    filled = log.collect(KEY, claim.token, now=late)
    assert filled.items == []
    assert filled.holes == []
    assert len(logged.rows(schema.LOG_ROW_PREFIX)) == 2 + 4  # two packed rows and four fillers
    # The writer was only late: its items go to new positions at the tail.
    written = log.write_taken(KEY, taken, [item(n) for n in range(3, 7)], now=late)
    assert [w.id for w in written] != taken
    assert all(w.id > claim.items[-1].id for w in written)
    settled = log.settle(KEY, [Settlement(id=i.id) for i in claim.items], guard=Guard.LEASE_VALID, now=late)
    assert len(settled.applied) == 6
    assert log.head(KEY).leases == 0  # the filled positions were settled with the fill
    rest = log.claim(KEY, count=10, deadline=late + LEASE, now=late)
    assert [number(i) for i in rest.items] == [3, 4, 5, 6]
    assert [i.id for i in rest.items] == [w.id for w in written]


def test_a_hole_in_another_claims_run_is_filled_from_where_it_begins(logged: Logged) -> None:
    log = logged.log
    log.append(KEY, [item(0)], now=NOW)
    taken = log.take_positions(KEY, 6, now=NOW)
    first = log.claim(KEY, count=3, deadline=NOW + LEASE, now=NOW)  # item 0 and two holes
    second = log.claim(KEY, count=4, deadline=NOW + LEASE, now=NOW)  # the last four holes
    assert second.holes == taken[2:]
    late = NOW + timedelta(seconds=HOLE_TIMEOUT_S)
    assert log.collect(KEY, second.token, now=late).holes == []
    # The writer's row starts in the first claim's run: its first position was filled too, so the
    # whole row goes to new positions, and the first claim finds its holes filled.
    written = log.write_taken(KEY, taken, [item(n) for n in range(1, 7)], now=late)
    assert all(parse_position_id(w.id)[1] > parse_position_id(taken[-1])[1] for w in written)  # type: ignore[index]
    assert log.collect(KEY, first.token, now=late).holes == []
    rest = log.claim(KEY, count=10, deadline=late + LEASE, now=late)
    assert sorted(number(i) for i in rest.items) == [1, 2, 3, 4, 5, 6]


def test_a_write_in_time_is_collected(logged: Logged) -> None:
    log = logged.log
    taken = log.take_positions(KEY, 2, now=NOW)
    claim = log.claim(KEY, count=2, deadline=NOW + LEASE, now=NOW)
    assert claim.holes == taken
    log.write_taken(KEY, taken, [item(0), item(1)], now=NOW)
    collected = log.collect(KEY, claim.token, now=NOW + timedelta(seconds=0.5))
    assert [i.id for i in collected.items] == taken
    assert [i.attempts for i in collected.items] == [1, 1]
    assert collected.holes == []


# -- contention -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_sixteen_consumers_waste_under_a_tenth_of_a_write_per_leased_item(moto_server: str) -> None:
    client, raw = dynamodb_client(moto_server, max_pool=32), dynamodb_client(moto_server)
    table = f"log-contention-{threading.get_ident()}"
    schema.create_tables(client, items_table=table, catalog_table=f"{table}-catalog")
    log = DynamoDBClaimLog(client, table)
    meter = CostMeter(raw)
    meter.attach(client)
    key = LogKey("contended", 0)
    for start in range(0, 800, 100):
        log.append(key, [item(n) for n in range(start, start + 100)], now=NOW)
    meter.reset()
    delivered: Counter[int] = Counter()
    lock = threading.Lock()

    def consume() -> None:
        for _ in range(200):  # bounded: 800 items, 16 consumers, leases of 10
            claim = log.claim(key, count=10, deadline=NOW + LEASE, now=NOW)
            if not claim.token:
                return
            with lock:
                delivered.update(number(i) for i in claim.items)
            log.settle(key, [Settlement(id=i.id) for i in claim.items], guard=Guard.LEASE_VALID, now=NOW)

    threads = [threading.Thread(target=consume) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert delivered == Counter(range(800))
    spent = meter.snapshot()
    assert spent.failed_conditional_writes / 800 < 0.1


def test_a_late_writer_moves_the_filled_row_and_every_row_after_it(logged: Logged) -> None:
    log = logged.log
    taken = log.take_positions(KEY, 20, now=NOW)
    claim = log.claim(KEY, count=1, deadline=NOW + LEASE, now=NOW)  # the first position only
    late = NOW + timedelta(seconds=HOLE_TIMEOUT_S)
    assert log.collect(KEY, claim.token, now=late).holes == []
    # Two rows of 10 KB items: the first starts at the filled position, the second does not.
    written = log.write_taken(KEY, taken, [item(n, 10_000) for n in range(20)], now=late)
    assert all(w.id not in taken for w in written)
    rest = log.claim(KEY, count=40, deadline=late + LEASE, now=late)
    # The positions it gave up were filled by the writer itself: no hole for a claim to wait on.
    assert rest.holes == []
    assert [number(i) for i in rest.items] == list(range(20))


def test_a_listing_shows_the_items_of_spilled_records_as_leased(logged: Logged) -> None:
    log = logged.log
    log.append(KEY, [item(n) for n in range(400)], now=NOW)
    claims = [log.claim(KEY, count=10, deadline=NOW + LEASE, now=NOW) for _ in range(40)]
    assert len(logged.rows(schema.LOG_RECORD_PREFIX)) >= 40 - HEAD_RECORDS  # some are spilled

    first = log.list_items(KEY, after="", limit=25, now=NOW)
    rest = log.list_items(KEY, after=first[-1].id, limit=1000, now=NOW)

    leased = [i.id for c in claims for i in c.items]
    assert [i.id for i in first + rest] == sorted(leased)
    assert all(i.lease_deadline == NOW + LEASE for i in first + rest)


def test_a_claim_writes_its_items_ages_in_its_own_write_and_corrects_a_guess_another_claim_beat(
    logged: Logged,
) -> None:
    """A claim reads the rows it expects before its write and notes their ages in it; when another
    claim took those rows in between, the ages of the run it got are corrected after it."""
    early, late = NOW - timedelta(seconds=60), NOW - timedelta(seconds=5)
    log = logged.log
    log.append(KEY, [replace(item(n), created_at=early) for n in range(2)], now=NOW)
    log.append(KEY, [replace(item(n), created_at=late) for n in range(2, 4)], now=NOW)
    seconds = {t: int(t.timestamp()) for t in (early, late)}

    logged.meter.reset()
    first = log.claim(KEY, count=1, deadline=NOW + LEASE, now=NOW)
    by_operation = logged.meter.snapshot().requests_by_operation
    writes = sum(by_operation.get(op, 0) for op in ("UpdateItem", "PutItem", "TransactWriteItems"))
    assert [number(i) for i in first.items] == [0] and writes == 1  # the claim alone
    assert log.ages(KEY) == LogAges(
        waiting_created=seconds[early] + 2 * seconds[late], leased_created=seconds[early]
    )

    class Overtaken(DynamoDBClaimLog):
        """Another consumer claims the expected run between this one's read and its write."""

        def _guess(self, key: LogKey, head: Any, taken: int) -> Any:
            guess = super()._guess(key, head, taken)
            log.claim(KEY, count=1, deadline=NOW + LEASE, now=NOW)
            return guess

    overtaken = Overtaken(logged.log._client, TABLE, concurrency=1)
    second = overtaken.claim(KEY, count=2, deadline=NOW + LEASE, now=NOW)
    assert [number(i) for i in second.items] == [2, 3]
    assert log.ages(KEY) == LogAges(leased_created=2 * seconds[early] + 2 * seconds[late])
    # The corrected record gives back what its items added: completing them leaves the others'.
    assert log.settle(
        KEY, [Settlement(id=i.id) for i in second.items], guard=Guard.LEASE_VALID, now=NOW
    ).applied
    assert log.ages(KEY) == LogAges(leased_created=2 * seconds[early])


# -- a leased item's coming priority ------------------------------------------------------------------


@pytest.mark.slow  # 33 claims to make one spill: ~14 s on moto in process
def test_a_coming_priority_is_one_write_of_its_record_in_the_head_or_spilled(logged: Logged) -> None:
    log = logged.log
    log.append(KEY, [item(n) for n in range(6 * (HEAD_RECORDS + 1))], now=NOW)
    claims = [
        log.claim(KEY, count=6, deadline=NOW + LEASE + timedelta(seconds=n), now=NOW)
        for n in range(HEAD_RECORDS + 1)
    ]
    spilled, in_head = claims[0], claims[-1]  # the oldest deadline went out first
    start = parse_position_id(spilled.items[0].id)[1]  # type: ignore[index]
    assert logged.rows(schema.LOG_RECORD_PREFIX + f"{start:016x}")
    costs = []
    for claim in (in_head, spilled):
        logged.meter.reset()
        given = log.set_next_priority(KEY, [i.id for i in claim.items[2:5]], priority=1, now=NOW)
        costs.append(logged.meter.snapshot())
        assert len(given.applied) == 3

    # The head's record: one UpdateItem of the head (under 2 KB). A spilled one: one PutItem of its
    # P row (its L row keeps the same deadline), no transaction. Reads: the head, and for a spilled
    # record the one Query that finds it.
    head_cost, spilled_cost = costs
    assert head_cost.requests_by_operation == {"GetItem": 1, "UpdateItem": 1}
    assert head_cost.write_units <= 2
    assert spilled_cost.requests_by_operation == {"GetItem": 1, "Query": 1, "PutItem": 1}
    assert spilled_cost.write_units == 1
    (row,) = logged.rows(schema.LOG_RECORD_PREFIX + f"{start:016x}")
    assert set(row[schema.LOG_PRIORITIES]["M"]) == {str(start + n) for n in range(2, 5)}
    # Both are read back with the lease, and the spilled one expires with it.
    found = log.get(KEY, [in_head.items[2].id, spilled.items[4].id, spilled.items[5].id], now=NOW)
    assert [i.next_priority for i in found.values()] == [1, 1, None]
    (run,) = log.expired(KEY, now=NOW + LEASE, limit=1)
    assert [i.next_priority for i in run.items] == [None, None, 1, 1, 1, None]
    # Settled positions leave the record's priorities.
    log.settle(KEY, [Settlement(id=i.id) for i in spilled.items[:3]], guard=Guard.LEASE_VALID, now=NOW)
    (row,) = logged.rows(schema.LOG_RECORD_PREFIX + f"{start:016x}")
    assert set(row[schema.LOG_PRIORITIES]["M"]) == {str(start + n) for n in range(3, 5)}
