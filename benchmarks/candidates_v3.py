"""Engine v3 candidates: data models for a lease queue, metered side by side (issue 35, ADR 0100).

Run ``uv run python -m benchmarks.candidates_v3`` (``--quick`` for fewer items, ``--json PATH`` to
keep the figures). It prints one table: per candidate and per workload, DynamoDB requests, write
units and read units per delivered item, failed conditional writes per leased item, the derived
one-partition ceiling and the dollars per million delivered items; then an expired lease and, for
the log, a writer that died between taking its positions and writing them.

Workloads (issue 35's table, one partition): 100 B items produced, leased and completed in batches
of 100, 10 and 1; 1,000 B in batches of 100 and 1; 1,000 B with 4 consumers leasing 10, and 100 B
with 16 consumers leasing 10 (both produced in batches of 10 first, then drained by the consumers
in threads, each lease completed at once). Every figure covers the whole path, produce included.

Candidates (each on its own table of a single-threaded moto server on 127.0.0.1, written with the
low-level client, as ``benchmarks.candidates`` did for ADR 0001; only v2 is the product):

v2      the product as it is (``QueueService`` over the DynamoDB store, ADR 0050). Its catalog reads
        (one per service call, the same for any model) are left out, as in ``benchmarks.candidates``.
P<S>    packed rows with in-row lease state: the items of one produce call in rows of up to S KB; a
        lease claims items of a row with one UpdateItem conditional on the row's version (a lease
        map token -> deadline + indexes); complete adds the indexes to the row's done set (one write
        per row per call); the last complete deletes the row. Every write pays the whole row.
L-tx    an append-only log with a claim cursor (Kafka offsets, CORFU): a sequencer (``ADD tail``
        on a small head row) hands out positions, items sit in write-once rows of up to 16 KB at
        those positions; a lease claims a run [a, b) by one conditional update of the cursor
        (``cur = :a`` -> ``:b``) in a transaction with a small lease record ``L<deadline><token>``;
        complete deletes the record (or adds the completed positions to it); item rows go by TTL.
L-one   the same log with the lease records kept in the head row itself, so that a claim is one
        conditional UpdateItem; the head row grows by ~45 B per lease in flight.
L-add   L-one claiming by fetch-and-add (``SET la.#tok = cur, cur = cur + :k`` while the backlog
        holds a batch): consumers stop losing races on the cursor; the rows are read after the claim.
L-spill L-add with a bounded head: past 32 records a lease moves the oldest 16 to record rows as
        L-tx keeps them, in one transaction (ADR 0100's proposal).

An expired lease (P: its indexes are free again in place; L: its undone items are re-appended at
the tail, under the record's removal, in one transaction) and a dead writer (L: a hole in the
positions, filled after ``HOLE_TIMEOUT`` by a conditional filler; the late writer re-takes
positions) are run once each, with a clock the benchmark moves; then one lease of 10 behind 4,000
items held in valid leases (400 with ``--quick``), for v2 and the log's variants.

Units: ``benchmarks.meter.CostMeter`` (DynamoDB's published rules; moto's ConsumedCapacity ignored).
Prices: DynamoDB on demand $0.625 per million write units, $0.125 per million read units; API
Gateway REST $3.50 per million calls, three calls (produce, lease, complete) per batch. Lambda is
left out (docs/capacity.md prices it from measured CPU: $0.21 per million items at batch 10).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import secrets
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from botocore.exceptions import ClientError

from benchmarks.candidates import drain_in_threads, in_threads
from benchmarks.cost import metered_service, use_fake_credentials
from benchmarks.meter import CostMeter, CostSnapshot, item_size, read_units, write_units
from querator.domain.errors import NothingToLeaseError
from querator.domain.model import NewItem, QueueInfo
from querator.testing import FakeClock, dynamodb_client, moto_server_process

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from mypy_boto3_dynamodb import DynamoDBClient

    from benchmarks.cost import MeteredService

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

AttributeMap = dict[str, Any]

PK = "bench~0"
COUNT = 300
#: Items per case; a case always runs at least one full batch (100 items at batch 100).
QUICK_COUNT = 40
CONTENTION_COUNT = 400
QUICK_CONTENTION_COUNT = 100
LEASE_US = 60_000_000
EXPIRE_US = 3_600_000_000
#: A position nobody wrote for this long is a dead writer's: a lease fills it (L).
HOLE_TIMEOUT_US = 2_000_000
#: How often one lease call tries again after losing its claim (P: per row; L: the cursor).
MAX_TRIES = 32
#: Rows per page of a lease's Query (L): a lease reads a page at a time, so a small lease of a log
#: of large rows reads little beyond its run.
ROW_PAGE = 2
BATCH_WRITE_LIMIT = 25

#: DynamoDB on demand and API Gateway (REST; HTTP, the flavour of stage prod: ADR 0094), USD per
#: million (the issue; docs/capacity.md).
PRICE_WRITE_UNIT = 0.625
PRICE_READ_UNIT = 0.125
PRICE_REST_CALL = 3.50
PRICE_HTTP_CALL = 1.00
#: Produce, lease and complete: the API calls of one batch.
CALLS_PER_BATCH = 3
#: One partition key's throughput (AWS: 1,000 WCU and 3,000 RCU per partition; benchmarks.capacity).
PARTITION_WCU = 1000
PARTITION_RCU = 3000


# -- workloads and figures ----------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    payload: int
    batch: int
    consumers: int = 1

    @property
    def name(self) -> str:
        text = f"{self.payload:,} B x{self.batch}"
        return text if self.consumers == 1 else f"{text}, {self.consumers} consumers"


WORKLOADS = (
    Workload(100, 100),
    Workload(100, 10),
    Workload(100, 1),
    Workload(1000, 100),
    Workload(1000, 1),
    Workload(1000, 10, consumers=4),
    Workload(100, 10, consumers=16),
)


def dollars_per_million(
    write_units: float, read_units: float, batch: int, *, call_price: float = PRICE_REST_CALL
) -> float:
    """USD per million delivered items: DynamoDB units plus three API calls per batch (REST unless
    ``call_price`` says); Lambda left out (``all_services_per_million`` adds it)."""
    return (
        write_units * PRICE_WRITE_UNIT + read_units * PRICE_READ_UNIT + CALLS_PER_BATCH * call_price / batch
    )


def lambda_per_million(batch: int) -> float:
    """Lambda's USD per million delivered items at ``batch``, as docs/capacity.md prints it from
    ``benchmarks.flavour``'s measurement (engine v2's functions: v3's make fewer store round trips,
    so this is an upper bound for it); a batch between two measured ones takes the smaller one's."""
    from benchmarks.flavour import DOCUMENTS, generated_block, parse_inputs  # noqa: PLC0415

    measured = sorted(
        parse_inputs(generated_block(DOCUMENTS[0].read_text(encoding="utf-8"))), key=lambda r: r.batch
    )
    return [row for row in measured if row.batch <= batch][-1].lambda_per_million


def all_services_per_million(
    write_units: float, read_units: float, batch: int, *, call_price: float = PRICE_HTTP_CALL
) -> float:
    """USD per million delivered items on AWS, all services (issue 35's "$ per million ... all
    services"): DynamoDB, API Gateway (the HTTP API of stage prod unless ``call_price`` says) and
    Lambda."""
    return dollars_per_million(write_units, read_units, batch, call_price=call_price) + lambda_per_million(
        batch
    )


def partition_ceiling(write_units: float, read_units: float) -> float:
    """Items a second one partition key carries: the tighter of its write and read limits."""
    writes = PARTITION_WCU / write_units if write_units else math.inf
    reads = PARTITION_RCU / read_units if read_units else math.inf
    return min(writes, reads)


@dataclass(frozen=True)
class Figures:
    """What one candidate spent on one workload."""

    candidate: str
    workload: Workload
    produced: int
    #: Distinct items delivered (leased and completed).
    delivered: int
    #: Successful claims of an item (more than ``delivered`` when a lease ran out).
    leased: int
    duplicates: int
    missing: int
    requests: int
    write_units: float
    read_units: float
    failed_conditional_writes: int
    seconds: float = 0.0
    #: The write units of the partition key that took the most (``CostSnapshot``): what bounds one
    #: queue partition, as DynamoDB takes 1,000 a second on a key. ``None``: not metered by key.
    hottest_key_write_units: float | None = None

    def per_item(self, value: float) -> float:
        return value / self.delivered if self.delivered else float("nan")

    @property
    def write_units_per_item(self) -> float:
        return self.per_item(self.write_units)

    @property
    def read_units_per_item(self) -> float:
        return self.per_item(self.read_units)

    @property
    def requests_per_item(self) -> float:
        return self.per_item(self.requests)

    @property
    def failed_per_leased(self) -> float:
        return self.failed_conditional_writes / self.leased if self.leased else float("nan")

    @property
    def ceiling(self) -> float:
        """Items a second of one queue partition: bounded by the partition key that takes the most
        write units per item (a model whose partition spans one key: all of them)."""
        hottest = self.hottest_key_write_units
        wcu = self.write_units_per_item if hottest is None else self.per_item(hottest)
        return partition_ceiling(wcu, self.read_units_per_item)

    @property
    def dollars(self) -> float:
        """All services, on the HTTP API (stage prod)."""
        return all_services_per_million(
            self.write_units_per_item, self.read_units_per_item, self.workload.batch
        )

    @property
    def dollars_rest(self) -> float:
        """All services, on the REST API (stages dev, test, local)."""
        return all_services_per_million(
            self.write_units_per_item,
            self.read_units_per_item,
            self.workload.batch,
            call_price=PRICE_REST_CALL,
        )

    @property
    def exactly_once(self) -> bool:
        return self.produced == self.delivered and not self.duplicates and not self.missing


# -- row packing (P and L) ----------------------------------------------------------------------

#: Bytes a packed row spends besides its items' payloads: keys, counts, times, version, lease map
#: (measured with ``item_size`` on an empty row, rounded up, plus room for a few lease entries).
ROW_OVERHEAD = 200
#: Bytes an item adds to a row besides its payload: the list element (1) and its attempt count (3).
ITEM_OVERHEAD = 4


def pack_rows(sizes: Sequence[int], row_bytes: int) -> list[range]:
    """Split consecutive items of ``sizes`` bytes into rows of at most ``row_bytes``, in order.

    A row takes items while the next one still fits (an item larger than a row gets a row alone),
    so a produce call of k items writes ceil(total / row) rows, each paying one write per started KB.
    """
    rows: list[range] = []
    start, used = 0, ROW_OVERHEAD
    for index, size in enumerate(sizes):
        cost = size + ITEM_OVERHEAD
        if index > start and used + cost > row_bytes:
            rows.append(range(start, index))
            start, used = index, ROW_OVERHEAD
        used += cost
    if start < len(sizes):
        rows.append(range(start, len(sizes)))
    return rows


# -- a clock the benchmark can move ------------------------------------------------------------


class Clock:
    """Microseconds of wall time plus an offset that ``advance`` moves (to expire a lease now)."""

    def __init__(self) -> None:
        self._offset = 0
        self._lock = threading.Lock()

    def now(self) -> int:
        with self._lock:
            return time.time_ns() // 1000 + self._offset

    def advance(self, microseconds: int) -> None:
        with self._lock:
            self._offset += microseconds


_identities = itertools.count(secrets.randbelow(16**8))
_identity_lock = threading.Lock()


def tagged_payload(size: int) -> bytes:
    """A payload of ``size`` bytes whose first 16 carry a unique identity, to check exactly-once
    delivery across moves (a re-appended item keeps its payload)."""
    with _identity_lock:
        tag = f"{next(_identities):016x}".encode()
    return (tag + bytes(i % 251 for i in range(size)))[: max(size, 16)]


def identity(payload: bytes) -> str:
    return payload[:16].decode()


# -- raw candidates -----------------------------------------------------------------------------


class StaleLeaseError(Exception):
    """A complete by a holder whose lease is no longer valid (the fence held)."""


@dataclass
class Lease:
    token: str
    #: The identities of the items handed out, in order.
    identities: list[str]
    #: Candidate-specific: what complete needs (P: row key -> indexes; L: the run and its record).
    detail: Any = None


def conditional_failure(exc: ClientError) -> bool:
    return exc.response["Error"]["Code"] in (
        "ConditionalCheckFailedException",
        "TransactionCanceledException",
    )


class Candidate:
    """A data model on its own table, written with the low-level client."""

    name: ClassVar[str]

    def __init__(self, client: DynamoDBClient, table: str, clock: Clock) -> None:
        self.client = client
        self.table = table
        self.clock = clock
        #: How long a lease holds (the depth case holds its leases longer than it takes to fill).
        self.lease_us = LEASE_US
        self._lock = threading.Lock()
        self._seq = itertools.count(secrets.randbelow(16**6))

    def create_table(self) -> None:
        self.client.create_table(
            TableName=self.table,
            AttributeDefinitions=[
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "sk", "AttributeType": "S"},
            ],
            KeySchema=[
                {"AttributeName": "pk", "KeyType": "HASH"},
                {"AttributeName": "sk", "KeyType": "RANGE"},
            ],
            BillingMode="PAY_PER_REQUEST",
        )
        self.client.get_waiter("table_exists").wait(
            TableName=self.table, WaiterConfig={"Delay": 1, "MaxAttempts": 30}
        )
        self.setup()

    def setup(self) -> None:
        """Rows a queue partition has before its first item (not metered: queue creation)."""

    def unique(self) -> str:
        with self._lock:
            return f"{next(self._seq):08x}"

    def key(self, sk: str) -> AttributeMap:
        return {"pk": {"S": PK}, "sk": {"S": sk}}

    def put_rows(self, rows: Sequence[AttributeMap]) -> None:
        for start in range(0, len(rows), BATCH_WRITE_LIMIT):
            pending: list[Any] = [
                {"PutRequest": {"Item": r}} for r in rows[start : start + BATCH_WRITE_LIMIT]
            ]
            while pending:
                reply = self.client.batch_write_item(RequestItems={self.table: pending})
                pending = list(reply.get("UnprocessedItems", {}).get(self.table, []))

    def produce(self, payloads: Sequence[bytes]) -> None:
        raise NotImplementedError

    def lease(self, batch: int) -> Lease | None:
        raise NotImplementedError

    def complete(self, lease: Lease, identities: Sequence[str] | None = None) -> None:
        """Complete ``identities`` of ``lease`` (all of it by default); StaleLeaseError if fenced."""
        raise NotImplementedError


def row_payloads(row: AttributeMap) -> list[bytes]:
    return [bytes(v["B"]) for v in row.get("it", {}).get("L", [])]


class PackedRows(Candidate):
    """P: packed rows with in-row lease state, claimed per row with a version condition."""

    name = "P"
    row_kb = 4

    @classmethod
    def sized(cls, row_kb: int) -> type[PackedRows]:
        return type(f"PackedRows{row_kb}", (cls,), {"name": f"P{row_kb}", "row_kb": row_kb})

    def produce(self, payloads: Sequence[bytes]) -> None:
        now = self.clock.now()
        rows = []
        for span in pack_rows([len(p) for p in payloads], self.row_kb * 1024):
            rows.append(
                {
                    **self.key(f"R{now:014x}{self.unique()}"),
                    "it": {"L": [{"B": payloads[i]} for i in span]},
                    "a": {"L": [{"N": "0"} for _ in span]},
                    "n": {"N": str(len(span))},
                    "v": {"N": "0"},
                    "ls": {"M": {}},
                    "c": {"N": str(now)},
                    "x": {"N": str(now + EXPIRE_US)},
                }
            )
        self.put_rows(rows)

    @staticmethod
    def available(row: AttributeMap, now: int) -> tuple[list[int], list[str]]:
        """Indexes of ``row`` nobody holds, in order, and the tokens whose lease ran out."""
        done = {int(n) for n in row.get("dn", {}).get("NS", [])}
        held: set[int] = set()
        expired: list[str] = []
        for token, entry in row["ls"]["M"].items():
            indexes = {int(n) for n in entry["M"].get("i", {}).get("NS", [])}
            if int(entry["M"]["d"]["N"]) <= now:
                expired.append(token)
            else:
                held |= indexes
        count = int(row["n"]["N"])
        return [i for i in range(count) if i not in done and i not in held], expired

    def lease(self, batch: int) -> Lease | None:
        now = self.clock.now()
        token = secrets.token_hex(6)
        lease = Lease(token, [], detail={})
        start: AttributeMap | None = None
        while len(lease.identities) < batch:
            kwargs: dict[str, Any] = {
                "TableName": self.table,
                "KeyConditionExpression": "pk = :pk AND begins_with(sk, :r)",
                "ExpressionAttributeValues": {":pk": {"S": PK}, ":r": {"S": "R"}},
                "ConsistentRead": True,
                "Limit": ROW_PAGE,
            }
            if start is not None:
                kwargs["ExclusiveStartKey"] = start
            page = self.client.query(**kwargs)
            for row in page.get("Items", []):
                if len(lease.identities) < batch:
                    self.claim_row(row, lease, batch, now)
            start = page.get("LastEvaluatedKey")
            if start is None:
                break
        return lease if lease.identities else None

    def claim_row(self, row: AttributeMap, lease: Lease, batch: int, now: int) -> None:
        for _ in range(MAX_TRIES):
            free, expired = self.available(row, now)
            take = free[: batch - len(lease.identities)]
            if not take:
                return
            values: dict[str, Any] = {
                ":v": row["v"],
                ":one": {"N": "1"},
                ":entry": {"M": {"d": {"N": str(now + self.lease_us)}, "i": {"NS": [str(i) for i in take]}}},
            }
            names = {"#tok": lease.token}
            sets = ["ls.#tok = :entry", "v = v + :one"]
            attempts = row["a"]["L"]
            for i in take:
                values[f":a{i}"] = {"N": str(int(attempts[i]["N"]) + 1)}
                sets.append(f"a[{i}] = :a{i}")
            removes = []
            for n, old in enumerate(expired):
                names[f"#x{n}"] = old
                removes.append(f"ls.#x{n}")
            expression = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
            try:
                # The version condition: the claim was computed from the row as it still is.
                self.client.update_item(
                    TableName=self.table,
                    Key={"pk": row["pk"], "sk": row["sk"]},
                    UpdateExpression=expression,
                    ConditionExpression="v = :v",
                    ExpressionAttributeNames=names,
                    ExpressionAttributeValues=values,
                )
            except ClientError as exc:
                if not conditional_failure(exc):
                    raise
                fresh = self.client.get_item(
                    TableName=self.table, Key={"pk": row["pk"], "sk": row["sk"]}, ConsistentRead=True
                ).get("Item")
                if fresh is None:
                    return
                row = fresh
                continue
            payloads = row_payloads(row)
            lease.identities += [identity(payloads[i]) for i in take]
            lease.detail[row["sk"]["S"]] = (take, int(row["n"]["N"]), payloads)
            return

    def complete(self, lease: Lease, identities: Sequence[str] | None = None) -> None:
        wanted = None if identities is None else set(identities)
        now = self.clock.now()
        for sk, (indexes, count, payloads) in lease.detail.items():
            mine = [i for i in indexes if wanted is None or identity(payloads[i]) in wanted]
            if not mine:
                continue
            whole = len(mine) == len(indexes)
            # All of the lease's indexes in this row: the entry goes; some: they leave its set.
            expression = "ADD dn :ids " + ("REMOVE ls.#tok" if whole else "DELETE ls.#tok.i :ids")
            try:
                reply = self.client.update_item(
                    TableName=self.table,
                    Key=self.key(sk),
                    UpdateExpression=expression,
                    # The fence: the lease is still this row's and has not run out.
                    ConditionExpression="ls.#tok.d > :now",
                    ExpressionAttributeNames={"#tok": lease.token},
                    ExpressionAttributeValues={
                        ":ids": {"NS": [str(i) for i in mine]},
                        ":now": {"N": str(now)},
                    },
                    ReturnValues="UPDATED_NEW",
                )
            except ClientError as exc:
                if not conditional_failure(exc):
                    raise
                raise StaleLeaseError(sk) from exc
            if len(reply["Attributes"]["dn"]["NS"]) == count:
                self.client.delete_item(TableName=self.table, Key=self.key(sk))


@dataclass
class Run:
    """A lease of the log: the run [start, end) it claimed and where its record lives."""

    start: int
    end: int
    #: Positions of the items handed out (fillers hold none) and the lease record's key.
    positions: list[int] = field(default_factory=list)
    record: str = ""


class ClaimLog(Candidate):
    """L: write-once rows at sequencer positions, a claim cursor, lease records beside it."""

    name = "L"
    row_kb = 16
    hole_timeout_us = HOLE_TIMEOUT_US
    HEAD = "H"

    def setup(self) -> None:
        self.client.put_item(
            TableName=self.table,
            Item={
                **self.key(self.HEAD),
                "tail": {"N": "0"},
                "cur": {"N": "0"},
                "crow": {"N": "0"},
                "ls": {"M": {}},
            },
        )

    def take_positions(self, count: int) -> int:
        """The sequencer: ``count`` positions from the tail, the first returned (no condition)."""
        reply = self.client.update_item(
            TableName=self.table,
            Key=self.key(self.HEAD),
            UpdateExpression="ADD tail :k",
            ExpressionAttributeValues={":k": {"N": str(count)}},
            ReturnValues="UPDATED_NEW",
        )
        return int(reply["Attributes"]["tail"]["N"]) - count

    def rows_at(
        self, first: int, payloads: Sequence[bytes], now: int, attempts: Sequence[int] | None = None
    ) -> list[AttributeMap]:
        rows = []
        for span in pack_rows([len(p) for p in payloads], self.row_kb * 1024):
            row: AttributeMap = {
                **self.key(f"D{first + span.start:012x}"),
                "it": {"L": [{"B": payloads[i]} for i in span]},
                "c": {"N": str(now)},
                # DynamoDB's TTL deletes the row, free, within ~48 h of this time (seconds).
                "ttl": {"N": str((now + EXPIRE_US) // 1_000_000)},
            }
            if attempts is not None:
                row["a"] = {"L": [{"N": str(attempts[i])} for i in span]}
            rows.append(row)
        return rows

    def write_rows(self, rows: Sequence[AttributeMap]) -> list[AttributeMap]:
        """Write-once puts; the rows whose position was filled meanwhile (this writer was late)."""
        late = []
        for row in rows:
            try:
                self.client.put_item(
                    TableName=self.table, Item=row, ConditionExpression="attribute_not_exists(sk)"
                )
            except ClientError as exc:
                if not conditional_failure(exc):
                    raise
                late.append(row)
        return late

    def produce(self, payloads: Sequence[bytes]) -> None:
        now = self.clock.now()
        pending = list(payloads)
        for _ in range(MAX_TRIES):
            first = self.take_positions(len(pending))
            # A writer slower than HOLE_TIMEOUT finds its positions filled: it takes new ones and
            # writes those rows again (later in the order; nothing is delivered twice or lost).
            late = self.write_rows(self.rows_at(first, pending, now))
            if not late:
                return
            pending = [p for row in late for p in row_payloads(row)]
        raise RuntimeError("produce: positions kept being filled")

    # -- head and records (the two variants differ here) ------------------------------------------

    def read_head(self, now: int) -> tuple[AttributeMap, list[tuple[str, AttributeMap]]]:
        """The head row and the lease records that are due: (record key, record)."""
        raise NotImplementedError

    def claim(self, run: Run, crow: int, token: str, now: int) -> bool:
        """Move the cursor from ``run.start`` to ``run.end`` and write the lease record."""
        raise NotImplementedError

    def settle(self, run: Run, token: str, done: Sequence[int], whole: bool, now: int) -> None:
        raise NotImplementedError

    # -- lease ----------------------------------------------------------------------------------

    def lease(self, batch: int) -> Lease | None:
        token = secrets.token_hex(6)
        for _ in range(MAX_TRIES):
            now = self.clock.now()
            head, due = self.read_head(now)
            if due:
                self.reappend(head, due[0][0], due[0][1], now)
                continue
            cur, crow, tail = (int(head[k]["N"]) for k in ("cur", "crow", "tail"))
            if cur >= tail:
                return None
            found = self.read_run(cur, crow, tail, batch)
            if found.run.end == found.run.start:
                if found.hole is None or not self.hole_is_dead(head, found.hole, now):
                    return None
                self.fill(found.hole, found.after_hole, now)
                continue
            run = found.run
            run.record = f"L{now + self.lease_us:014x}{token}"
            if not self.claim(run, found.crow, token, now):
                continue
            if not found.payloads:  # only fillers up to the tail: passed, settled at once
                self.settle(run, token, [], whole=True, now=now)
                continue
            return Lease(token, [identity(p) for p in found.payloads], detail=run)
        return None

    def read_run(self, cur: int, crow: int, tail: int, batch: int) -> Found:
        """The run a lease of ``batch`` would claim from the cursor, read from the row holding it.

        Rows are contiguous (each starts where the previous ends), so a missing start is a hole: a
        position taken and not (yet) written. The run stops before it; nothing passes a hole.
        """
        found = Found(Run(cur, cur), crow)
        expected = crow
        while expected < tail and len(found.run.positions) < batch:
            rows = self.client.query(
                TableName=self.table,
                KeyConditionExpression="pk = :pk AND sk BETWEEN :lo AND :hi",
                ExpressionAttributeValues={
                    ":pk": {"S": PK},
                    ":lo": {"S": f"D{expected:012x}"},
                    ":hi": {"S": f"D{tail - 1:012x}"},
                },
                Limit=ROW_PAGE,
            ).get("Items", [])
            for row in rows:
                at = int(row["sk"]["S"][1:], 16)
                if at != expected:
                    found.hole, found.after_hole = expected, at
                    return found
                items = row_payloads(row)
                length = int(row["k"]["N"]) if "k" in row else len(items)
                found.crow = at
                for offset in range(max(0, cur - at), length):
                    if len(found.run.positions) >= batch:
                        break
                    found.run.end = at + offset + 1
                    if items:  # a filler holds positions, no items
                        found.run.positions.append(at + offset)
                        found.payloads.append(items[offset])
                expected = at + length
                if found.run.end == expected:
                    found.crow = expected  # the run ends with this row: the next one holds the cursor
                if len(found.run.positions) >= batch:
                    return found
            if not rows and expected < tail:
                found.hole, found.after_hole = expected, tail
                return found
        return found

    def hole_is_dead(self, head: AttributeMap, position: int, now: int) -> bool:
        """True once the hole at ``position`` was first seen HOLE_TIMEOUT ago. The first sighting is
        marked in the head row (one small write, only when a lease meets a hole)."""
        if int(head.get("hole", {}).get("N", "-1")) == position:
            return now - int(head["hs"]["N"]) >= self.hole_timeout_us
        self.client.update_item(
            TableName=self.table,
            Key=self.key(self.HEAD),
            UpdateExpression="SET hole = :p, hs = :now",
            ExpressionAttributeValues={":p": {"N": str(position)}, ":now": {"N": str(now)}},
        )
        return False

    def fill(self, position: int, end: int, now: int) -> None:
        """Fill a dead writer's hole up to the next written row: its late put will fail and it will
        take new positions. A writer that lands first wins, and the filler's put fails instead."""
        filler = {
            **self.key(f"D{position:012x}"),
            "k": {"N": str(end - position)},
            "ttl": {"N": str((now + EXPIRE_US) // 1_000_000)},
        }
        self.write_rows([filler])

    def complete(self, lease: Lease, identities: Sequence[str] | None = None) -> None:
        run: Run = lease.detail
        by_identity = dict(zip(lease.identities, run.positions, strict=True))
        done = run.positions if identities is None else [by_identity[i] for i in identities]
        self.settle(run, lease.token, done, whole=set(done) == set(run.positions), now=self.clock.now())

    # -- an expired lease -------------------------------------------------------------------------

    def reappend(self, head: AttributeMap, record_key: str, record: AttributeMap, now: int) -> None:
        """Put a due record's undone items at the tail and remove the record in one transaction, so
        two consumers never both re-append it and a crash between the two loses nothing."""
        start, end = int(record["a"]["N"]), int(record["b"]["N"])
        done = {int(n) for n in record.get("dn", {}).get("NS", [])}
        holder = self.client.query(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND sk BETWEEN :d AND :at",
            ExpressionAttributeValues={":pk": {"S": PK}, ":d": {"S": "D"}, ":at": {"S": f"D{start:012x}"}},
            ScanIndexForward=False,
            Limit=1,
        ).get("Items", [])
        first = int(holder[0]["sk"]["S"][1:], 16) if holder else start
        rows = self.client.query(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND sk BETWEEN :lo AND :hi",
            ExpressionAttributeValues={
                ":pk": {"S": PK},
                ":lo": {"S": f"D{first:012x}"},
                ":hi": {"S": f"D{end - 1:012x}"},
            },
        ).get("Items", [])
        undone: list[bytes] = []
        attempts: list[int] = []
        for row in rows:
            at = int(row["sk"]["S"][1:], 16)
            previous = [int(n["N"]) for n in row.get("a", {}).get("L", [])]
            for offset, payload in enumerate(row_payloads(row)):
                if start <= at + offset < end and at + offset not in done:
                    undone.append(payload)
                    attempts.append((previous[offset] if previous else 0) + 1)
        tail = int(head["tail"]["N"])
        # The positions are taken inside the transaction (tail = :t -> :t + k, not ADD before it), so
        # a cancelled transaction leaves no hole. Max attempts would divert rows to the dead letters.
        actions = self.reappend_actions(record_key, tail, len(undone))
        actions += [
            {"Put": {"TableName": self.table, "Item": r}} for r in self.rows_at(tail, undone, now, attempts)
        ]
        try:
            self.client.transact_write_items(TransactItems=actions)
        except ClientError as exc:
            if not conditional_failure(exc):
                raise

    def reappend_actions(self, record_key: str, tail: int, count: int) -> list[Any]:
        """The transaction items that remove a due record (if it is still there) and move the tail."""
        raise NotImplementedError

    def tail_values(self, tail: int, count: int) -> dict[str, Any]:
        return {":t": {"N": str(tail)}, ":t2": {"N": str(tail + count)}}

    def settle_record_row(self, run: Run, done: Sequence[int], whole: bool, now: int) -> None:
        """Complete against a lease record row ``L<deadline><token>`` (L-tx, and L-spill's spilled ones)."""
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "Key": self.key(run.record),
            # The fence: the record exists (not re-appended) and its deadline has not passed.
            "ConditionExpression": "d > :now",
        }
        try:
            if whole:
                self.client.delete_item(**kwargs, ExpressionAttributeValues={":now": {"N": str(now)}})
            else:
                self.client.update_item(
                    **kwargs,
                    UpdateExpression="ADD dn :p",
                    ExpressionAttributeValues={":now": {"N": str(now)}, ":p": {"NS": [str(p) for p in done]}},
                )
        except ClientError as exc:
            if not conditional_failure(exc):
                raise
            raise StaleLeaseError(run.record) from exc

    def record_row_actions(self, record_key: str, tail: int, count: int) -> list[Any]:
        """Re-append actions for a record row: delete it (if still there), move the tail."""
        actions: list[Any] = [
            {
                "Delete": {
                    "TableName": self.table,
                    "Key": self.key(record_key),
                    "ConditionExpression": "attribute_exists(sk)",
                }
            }
        ]
        if count:
            actions.append(
                {
                    "Update": {
                        "TableName": self.table,
                        "Key": self.key(self.HEAD),
                        "UpdateExpression": "SET tail = :t2",
                        "ConditionExpression": "tail = :t",
                        "ExpressionAttributeValues": self.tail_values(tail, count),
                    }
                }
            )
        return actions


@dataclass
class Found:
    """What a lease read from the cursor: the run, the row holding its end, and any hole."""

    run: Run
    crow: int
    payloads: list[bytes] = field(default_factory=list)
    hole: int | None = None
    after_hole: int = 0


class ClaimLogTx(ClaimLog):
    """L-tx: the cursor move and a separate lease record row in one TransactWriteItems."""

    name = "L-tx"

    def read_head(self, now: int) -> tuple[AttributeMap, list[tuple[str, AttributeMap]]]:
        # The head row ``H`` and the records ``L<deadline>`` sort next to each other: one Query reads
        # the head and the records already due.
        items = self.client.query(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND sk BETWEEN :h AND :due",
            ExpressionAttributeValues={
                ":pk": {"S": PK},
                ":h": {"S": self.HEAD},
                ":due": {"S": f"L{now:014x}~"},
            },
            ConsistentRead=True,
        ).get("Items", [])
        head = next(i for i in items if i["sk"]["S"] == self.HEAD)
        return head, [(i["sk"]["S"], i) for i in items if i["sk"]["S"] != self.HEAD]

    def claim(self, run: Run, crow: int, token: str, now: int) -> bool:
        try:
            self.client.transact_write_items(
                TransactItems=[
                    {
                        "Update": {
                            "TableName": self.table,
                            "Key": self.key(self.HEAD),
                            "UpdateExpression": "SET cur = :b, crow = :r",
                            # The claim: nobody moved the cursor since this lease read it.
                            "ConditionExpression": "cur = :a",
                            "ExpressionAttributeValues": {
                                ":a": {"N": str(run.start)},
                                ":b": {"N": str(run.end)},
                                ":r": {"N": str(crow)},
                            },
                        }
                    },
                    {
                        "Put": {
                            "TableName": self.table,
                            "Item": {
                                **self.key(run.record),
                                "a": {"N": str(run.start)},
                                "b": {"N": str(run.end)},
                                "d": {"N": str(now + self.lease_us)},
                            },
                        }
                    },
                ]
            )
        except ClientError as exc:
            if not conditional_failure(exc):
                raise
            return False
        return True

    def settle(self, run: Run, token: str, done: Sequence[int], whole: bool, now: int) -> None:
        self.settle_record_row(run, done, whole, now)

    def reappend_actions(self, record_key: str, tail: int, count: int) -> list[Any]:
        return self.record_row_actions(record_key, tail, count)


class ClaimLogOne(ClaimLog):
    """L-one: the lease records live in the head row, so a claim is one conditional UpdateItem."""

    name = "L-one"

    def read_head(self, now: int) -> tuple[AttributeMap, list[tuple[str, AttributeMap]]]:
        head = self.client.get_item(TableName=self.table, Key=self.key(self.HEAD), ConsistentRead=True)[
            "Item"
        ]
        due = [
            (token, entry["M"])
            for token, entry in head["ls"]["M"].items()
            if int(entry["M"]["d"]["N"]) <= now
        ]
        return head, due

    def claim(self, run: Run, crow: int, token: str, now: int) -> bool:
        try:
            self.client.update_item(
                TableName=self.table,
                Key=self.key(self.HEAD),
                UpdateExpression="SET cur = :b, crow = :r, ls.#tok = :rec",
                ConditionExpression="cur = :a",
                ExpressionAttributeNames={"#tok": token},
                ExpressionAttributeValues={
                    ":a": {"N": str(run.start)},
                    ":b": {"N": str(run.end)},
                    ":r": {"N": str(crow)},
                    ":rec": {
                        "M": {
                            "a": {"N": str(run.start)},
                            "b": {"N": str(run.end)},
                            "d": {"N": str(now + self.lease_us)},
                        }
                    },
                },
            )
        except ClientError as exc:
            if not conditional_failure(exc):
                raise
            return False
        return True

    #: What a complete of the whole run removes from the head row: its lease record.
    SETTLE_REMOVES = "REMOVE ls.#tok"

    def settle(self, run: Run, token: str, done: Sequence[int], whole: bool, now: int) -> None:
        try:
            self.client.update_item(
                TableName=self.table,
                Key=self.key(self.HEAD),
                UpdateExpression=self.SETTLE_REMOVES if whole else "ADD ls.#tok.dn :p",
                ConditionExpression="ls.#tok.d > :now",
                ExpressionAttributeNames={"#tok": token},
                ExpressionAttributeValues={":now": {"N": str(now)}}
                | ({} if whole else {":p": {"NS": [str(p) for p in done]}}),
            )
        except ClientError as exc:
            if not conditional_failure(exc):
                raise
            raise StaleLeaseError(token) from exc

    def reappend_actions(self, record_key: str, tail: int, count: int) -> list[Any]:
        update: dict[str, Any] = {
            "TableName": self.table,
            "Key": self.key(self.HEAD),
            "UpdateExpression": "REMOVE ls.#old",
            "ConditionExpression": "attribute_exists(ls.#old)",
            "ExpressionAttributeNames": {"#old": record_key},
        }
        if count:
            # One item, one action: the record's removal and the tail's move in one update.
            update["UpdateExpression"] = "SET tail = :t2 REMOVE ls.#old"
            update["ConditionExpression"] += " AND tail = :t"
            update["ExpressionAttributeValues"] = self.tail_values(tail, count)
        return [{"Update": update}]


class ClaimLogAdd(ClaimLogOne):
    """L-add: L-one whose claim is a fetch-and-add of the cursor while the backlog holds a batch.

    ``SET la.#tok = cur, cur = cur + :k`` conditional on ``cur <= :lim`` (the tail the lease read,
    minus the batch; the tail only grows) succeeds whoever moved the cursor meanwhile, so consumers
    stop losing races; the run is [old cur, old cur + k), learnt from ``UPDATED_OLD``, and its start
    is stored in ``la`` by the same write (DynamoDB computes every SET operand from the item before
    the update). The rows are read after the claim. A shorter backlog is claimed as in L-one.
    """

    name = "L-add"

    def setup(self) -> None:
        super().setup()
        self.client.update_item(
            TableName=self.table,
            Key=self.key(self.HEAD),
            UpdateExpression="SET la = :empty",
            ExpressionAttributeValues={":empty": {"M": {}}},
        )

    def read_head(self, now: int) -> tuple[AttributeMap, list[tuple[str, AttributeMap]]]:
        head = self.client.get_item(TableName=self.table, Key=self.key(self.HEAD), ConsistentRead=True)[
            "Item"
        ]
        due = []
        for token, entry in head["ls"]["M"].items():
            if int(entry["M"]["d"]["N"]) <= now:
                start = int(head["la"]["M"][token]["N"])
                record = dict(entry["M"])
                record["a"] = {"N": str(start)}
                record["b"] = {"N": str(start + int(entry["M"]["k"]["N"]))}
                due.append((token, record))
        return head, due

    def lease(self, batch: int) -> Lease | None:
        token = secrets.token_hex(6)
        for _ in range(MAX_TRIES):
            now = self.clock.now()
            head, due = self.read_head(now)
            if due:
                self.reappend(head, due[0][0], due[0][1], now)
                continue
            cur, tail = int(head["cur"]["N"]), int(head["tail"]["N"])
            if cur >= tail:
                return None
            if tail - cur < batch:
                found = self.assemble(cur, tail, self.rows_for(cur, tail))
                if found.run.end == found.run.start:
                    return None  # a hole at the cursor: L's path waits for it and fills it
                if not self.claim(found.run, found.crow, token, now):
                    continue
            else:
                start = self.add_claim(token, batch, tail - batch, now)
                if start is None:
                    continue
                found = self.read_claimed(start, start + batch)
                if not found.payloads:  # a run of fillers only: settled at once, claim again
                    self.settle(found.run, token, [], whole=True, now=now)
                    continue
            found.run.record = f"L{now + self.lease_us:014x}{token}"
            self.after_claim(head, now)
            return Lease(token, [identity(p) for p in found.payloads], detail=found.run)
        return None

    def after_claim(self, head: AttributeMap, now: int) -> None:
        """Hook: what a claim does to the head row besides the claim (L-spill bounds it)."""

    def add_claim(self, token: str, count: int, limit: int, now: int) -> int | None:
        try:
            reply = self.client.update_item(
                TableName=self.table,
                Key=self.key(self.HEAD),
                UpdateExpression="SET la.#tok = cur, cur = cur + :k, ls.#tok = :rec",
                ConditionExpression="cur <= :lim",
                ExpressionAttributeNames={"#tok": token},
                ExpressionAttributeValues={
                    ":k": {"N": str(count)},
                    ":lim": {"N": str(limit)},
                    ":rec": {"M": {"k": {"N": str(count)}, "d": {"N": str(now + self.lease_us)}}},
                },
                ReturnValues="UPDATED_OLD",
            )
        except ClientError as exc:
            if not conditional_failure(exc):
                raise
            return None
        return int(reply["Attributes"]["cur"]["N"])

    def read_claimed(self, start: int, end: int) -> Found:
        """The rows of a claimed run. A position not yet written belongs to the run already: wait
        for its writer up to HOLE_TIMEOUT, then fill it (the writer takes new positions)."""
        deadline = self.clock.now() + self.hole_timeout_us
        while True:
            found = self.assemble(start, end, self.rows_for(start, end))
            if found.run.end == end:
                return found
            if self.clock.now() >= deadline:
                self.fill(found.run.end, found.after_hole, self.clock.now())
                continue
            time.sleep(0.05)

    def rows_for(self, start: int, end: int) -> list[AttributeMap]:
        """The rows holding positions [start, end), read backwards from ``end`` to the row that
        holds ``start`` (a page at a time, so a small run of a log of large rows reads little)."""
        rows: list[AttributeMap] = []
        page_start: AttributeMap | None = None
        while True:
            kwargs: dict[str, Any] = {
                "TableName": self.table,
                "KeyConditionExpression": "pk = :pk AND sk BETWEEN :lo AND :hi",
                "ExpressionAttributeValues": {
                    ":pk": {"S": PK},
                    ":lo": {"S": "D"},
                    ":hi": {"S": f"D{end - 1:012x}"},
                },
                "ScanIndexForward": False,
                # The row holding the run's end often holds its start too: read it alone first.
                "Limit": 1 if page_start is None else ROW_PAGE,
            }
            if page_start is not None:
                kwargs["ExclusiveStartKey"] = page_start
            reply = self.client.query(**kwargs)
            for row in reply.get("Items", []):
                rows.append(row)
                if int(row["sk"]["S"][1:], 16) <= start:
                    return rows[::-1]
            page_start = reply.get("LastEvaluatedKey")
            if page_start is None:
                return rows[::-1]

    def assemble(self, start: int, end: int, rows: Sequence[AttributeMap]) -> Found:
        """The run from ``start`` towards ``end`` that ``rows`` cover without a hole."""
        found = Found(Run(start, start), start)
        expected: int | None = None
        for row in rows:
            at = int(row["sk"]["S"][1:], 16)
            items = row_payloads(row)
            length = int(row["k"]["N"]) if "k" in row else len(items)
            if (expected is None and at > start) or (expected is not None and at != expected):
                break
            for offset in range(max(0, start - at), length):
                if at + offset >= end:
                    break
                found.run.end = at + offset + 1
                if items:
                    found.run.positions.append(at + offset)
                    found.payloads.append(items[offset])
            expected = at + length
            found.crow = at if found.run.end < expected else expected
        if found.run.end < end:
            later = [int(r["sk"]["S"][1:], 16) for r in rows if int(r["sk"]["S"][1:], 16) > found.run.end]
            found.hole, found.after_hole = found.run.end, min([*later, end])
        return found

    def claim(self, run: Run, crow: int, token: str, now: int) -> bool:
        try:
            self.client.update_item(
                TableName=self.table,
                Key=self.key(self.HEAD),
                UpdateExpression="SET cur = :b, la.#tok = :a, ls.#tok = :rec",
                ConditionExpression="cur = :a",
                ExpressionAttributeNames={"#tok": token},
                ExpressionAttributeValues={
                    ":a": {"N": str(run.start)},
                    ":b": {"N": str(run.end)},
                    ":rec": {
                        "M": {"k": {"N": str(run.end - run.start)}, "d": {"N": str(now + self.lease_us)}}
                    },
                },
            )
        except ClientError as exc:
            if not conditional_failure(exc):
                raise
            return False
        return True

    #: ... and its claim's start (``la``), which L-add keeps beside it.
    SETTLE_REMOVES = "REMOVE ls.#tok, la.#tok"

    def reappend_actions(self, record_key: str, tail: int, count: int) -> list[Any]:
        (action,) = super().reappend_actions(record_key, tail, count)
        action["Update"]["UpdateExpression"] = action["Update"]["UpdateExpression"].replace(
            "REMOVE ls.#old", "REMOVE ls.#old, la.#old"
        )
        return [action]


class ClaimLogSpill(ClaimLogAdd):
    """L-spill: L-add with a bounded head row. Past ``HEAD_BOUND`` records a lease moves the oldest
    ``SPILL`` of them to ``L<deadline><token>`` rows in one transaction (as L-tx keeps them); one
    Query then reads the head and the spilled records already due. Complete tries the head first and
    the spilled row after (a lease does not know whether its record moved)."""

    name = "L-spill"
    HEAD_BOUND = 32
    SPILL = 16

    def read_head(self, now: int) -> tuple[AttributeMap, list[tuple[str, AttributeMap]]]:
        items = self.client.query(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND sk BETWEEN :h AND :due",
            ExpressionAttributeValues={
                ":pk": {"S": PK},
                ":h": {"S": self.HEAD},
                ":due": {"S": f"L{now:014x}~"},
            },
            ConsistentRead=True,
        ).get("Items", [])
        head = next(i for i in items if i["sk"]["S"] == self.HEAD)
        due = [(i["sk"]["S"], i) for i in items if i["sk"]["S"] != self.HEAD]
        for token, entry in head["ls"]["M"].items():
            if int(entry["M"]["d"]["N"]) <= now:
                due.append((token, self.in_head_record(head, token)))
        return head, due

    @staticmethod
    def in_head_record(head: AttributeMap, token: str) -> AttributeMap:
        entry = head["ls"]["M"][token]["M"]
        start = int(head["la"]["M"][token]["N"])
        return {**entry, "a": {"N": str(start)}, "b": {"N": str(start + int(entry["k"]["N"]))}}

    def after_claim(self, head: AttributeMap, now: int) -> None:
        records = head["ls"]["M"]
        if len(records) + 1 < self.HEAD_BOUND:
            return
        oldest = sorted(records, key=lambda t: int(records[t]["M"]["d"]["N"]))[: self.SPILL]
        names = {f"#s{n}": token for n, token in enumerate(oldest)}
        actions: list[Any] = [
            {
                "Update": {
                    "TableName": self.table,
                    "Key": self.key(self.HEAD),
                    "UpdateExpression": "REMOVE " + ", ".join(f"ls.{n}, la.{n}" for n in names),
                    # Each record still there: a record completed or re-appended meanwhile cancels
                    # the move (the next lease tries again).
                    "ConditionExpression": " AND ".join(f"attribute_exists(ls.{n})" for n in names),
                    "ExpressionAttributeNames": names,
                }
            }
        ]
        for token in oldest:
            record = self.in_head_record(head, token)
            deadline = int(record["d"]["N"])
            row = {
                **self.key(f"L{deadline:014x}{token}"),
                "a": record["a"],
                "b": record["b"],
                "d": record["d"],
            }
            if "dn" in record:
                row["dn"] = record["dn"]
            actions.append({"Put": {"TableName": self.table, "Item": row}})
        try:
            self.client.transact_write_items(TransactItems=actions)
        except ClientError as exc:
            if not conditional_failure(exc):
                raise

    def settle(self, run: Run, token: str, done: Sequence[int], whole: bool, now: int) -> None:
        try:
            super().settle(run, token, done, whole, now)
        except StaleLeaseError:
            self.settle_record_row(run, done, whole, now)

    def reappend_actions(self, record_key: str, tail: int, count: int) -> list[Any]:
        if record_key.startswith("L"):
            return self.record_row_actions(record_key, tail, count)
        return super().reappend_actions(record_key, tail, count)


P_SIZES = (1, 4, 16)
CANDIDATES: tuple[type[Candidate], ...] = (
    *(PackedRows.sized(kb) for kb in P_SIZES),
    ClaimLogTx,
    ClaimLogOne,
    ClaimLogAdd,
    ClaimLogSpill,
)


C = TypeVar("C", bound=Candidate)


# -- running ------------------------------------------------------------------------------------


def build(kind: type[C], endpoint: str, clock: Clock) -> tuple[C, CostMeter]:
    client = dynamodb_client(endpoint, max_pool=32)
    model = kind(client, f"v3-{kind.name.lower()}-{secrets.token_hex(4)}", clock)
    model.create_table()
    meter = CostMeter(dynamodb_client(endpoint, max_pool=32))
    meter.attach(client)
    return model, meter


def drain(model: Candidate, *, consumers: int, batch: int, limit: int) -> Counter[str]:
    """``consumers`` threads lease ``batch`` and complete each lease at once until nothing is
    leasable (three empty answers in a row: a lease that lost every try also answers nothing)."""

    def work(_: int) -> list[str]:
        done: list[str] = []
        empty = 0
        for _ in range(limit):  # bounded: every productive lease delivers at least one item
            lease = model.lease(batch)
            if lease is None:
                empty += 1
                if empty == 3:
                    break
                continue
            empty = 0
            model.complete(lease)
            done += lease.identities
        return done

    return in_threads(consumers, work)


def figures_of(
    name: str,
    workload: Workload,
    produced: Sequence[str],
    delivered: Counter[str],
    snap: CostSnapshot,
    seconds: float,
    *,
    catalog: CostSnapshot | None = None,
) -> Figures:
    # The product's catalog reads (one per service call) are the same for any model: left out.
    return Figures(
        candidate=name,
        workload=workload,
        produced=len(produced),
        delivered=len(set(delivered) & set(produced)),
        leased=sum(delivered.values()),
        duplicates=sum(n - 1 for n in delivered.values()),
        missing=len(set(produced) - set(delivered)),
        requests=snap.requests - (catalog.requests if catalog else 0),
        write_units=snap.write_units,
        read_units=snap.read_units - (catalog.read_units if catalog else 0.0),
        failed_conditional_writes=snap.failed_conditional_writes,
        seconds=seconds,
        hottest_key_write_units=snap.hottest_key_write_units(),
    )


def run_raw(kind: type[Candidate], endpoint: str, workload: Workload, count: int) -> Figures:
    model, meter = build(kind, endpoint, Clock())
    started = time.perf_counter()
    produced: list[str] = []
    for start in range(0, count, workload.batch):
        payloads = [tagged_payload(workload.payload) for _ in range(min(workload.batch, count - start))]
        model.produce(payloads)
        produced += [identity(p) for p in payloads]
    delivered = drain(model, consumers=workload.consumers, batch=workload.batch, limit=count)
    return figures_of(
        kind.name, workload, produced, delivered, meter.snapshot(), time.perf_counter() - started
    )


def v2_queue(metered: MeteredService, name: str, lease_timeout: timedelta = timedelta(minutes=5)) -> None:
    placeholder = datetime(2000, 1, 1, tzinfo=UTC)  # the service stamps its own times
    metered.service.create_queue(
        QueueInfo(
            name=name,
            lease_timeout=lease_timeout,
            expire_timeout=timedelta(hours=1),
            created_at=placeholder,
            updated_at=placeholder,
        )
    )
    metered.meter.reset()
    metered.catalog_meter.reset()


def run_v2(metered: MeteredService, workload: Workload, count: int) -> Figures:
    """v2 through ``QueueService``: produce in batches, then ``consumers`` threads drain."""
    name = f"v3-v2-{secrets.token_hex(4)}"
    v2_queue(metered, name)
    started = time.perf_counter()
    produced: list[str] = []
    for start in range(0, count, workload.batch):
        chunk = [
            NewItem(payload=tagged_payload(workload.payload))
            for _ in range(min(workload.batch, count - start))
        ]
        produced += metered.service.produce(name, chunk).ids
    delivered = drain_in_threads(metered.service, name, consumers=workload.consumers, batch=workload.batch)
    return figures_of(
        "v2",
        workload,
        produced,
        delivered,
        metered.meter.snapshot(),
        time.perf_counter() - started,
        catalog=metered.catalog_meter.snapshot(),
    )


# -- an expired lease and a dead writer ---------------------------------------------------------

EXPIRY = Workload(100, 10)
EXPIRY_COUNT = 20


@dataclass(frozen=True)
class Episode:
    """One scripted case (an expired lease, a dead writer) against the same script without it."""

    candidate: str
    case: str
    figures: Figures
    baseline: Figures
    #: The items the case is about (expired, or written late), for the extra cost per item.
    affected: int

    def extra_per_item(self, attr: str) -> float:
        return (float(getattr(self.figures, attr)) - float(getattr(self.baseline, attr))) / self.affected


def expiry_raw(kind: type[Candidate], endpoint: str, *, expire: bool) -> Figures:
    """20 items in batches of 10; a first lease of 10 is abandoned and runs out; then a drain."""
    clock = Clock()
    model, meter = build(kind, endpoint, clock)
    produced: list[str] = []
    for _ in range(EXPIRY_COUNT // EXPIRY.batch):
        payloads = [tagged_payload(EXPIRY.payload) for _ in range(EXPIRY.batch)]
        model.produce(payloads)
        produced += [identity(p) for p in payloads]
    delivered: Counter[str] = Counter()
    abandoned = model.lease(EXPIRY.batch)
    if abandoned is None:
        raise RuntimeError(f"{kind.name}: nothing to lease")
    if expire:
        clock.advance(LEASE_US + 1_000_000)
        try:
            model.complete(abandoned)
        except StaleLeaseError:
            pass  # the fence: a holder whose lease ran out cannot complete
        else:
            raise RuntimeError(f"{kind.name}: a stale holder completed its items")
    else:
        model.complete(abandoned)
        delivered.update(abandoned.identities)
    delivered += drain(model, consumers=1, batch=EXPIRY.batch, limit=4 * EXPIRY_COUNT)
    return figures_of(kind.name, EXPIRY, produced, delivered, meter.snapshot(), 0.0)


def expiry_v2(endpoint: str, *, expire: bool) -> Figures:
    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    metered = metered_service(endpoint, clock=clock, engine=2)
    name = f"v3-exp-{secrets.token_hex(4)}"
    v2_queue(metered, name, lease_timeout=timedelta(microseconds=LEASE_US))
    service = metered.service
    produced: list[str] = []
    for _ in range(EXPIRY_COUNT // EXPIRY.batch):
        chunk = [NewItem(payload=tagged_payload(EXPIRY.payload)) for _ in range(EXPIRY.batch)]
        produced += service.produce(name, chunk).ids
    clock.advance(timedelta(seconds=2))  # past the cursor's one-second margin for late writes
    first = service.lease(name, batch_size=EXPIRY.batch, client_id="abandons")
    delivered: Counter[str] = Counter()
    if expire:
        clock.advance(timedelta(microseconds=LEASE_US + 1_000_000))
    else:
        service.complete(name, first.partition, [i.id for i in first.items])
        delivered.update(i.id for i in first.items)
    # A requeued item gets a new id; count deliveries by payload identity.
    by_payload = {identity(i.payload): i.id for i in first.items}
    for _ in range(4 * EXPIRY_COUNT):
        try:
            lease = service.lease(name, batch_size=EXPIRY.batch, client_id="drains")
        except NothingToLeaseError:
            break
        ids = [i.id for i in lease.items]
        service.complete(name, lease.partition, ids)
        delivered.update(by_payload.get(identity(i.payload), i.id) for i in lease.items)
    return figures_of(
        "v2",
        EXPIRY,
        produced,
        delivered,
        metered.meter.snapshot(),
        0.0,
        catalog=metered.catalog_meter.snapshot(),
    )


def dead_writer(kind: type[ClaimLog], endpoint: str, *, dies: bool) -> Figures:
    """A writer takes positions for 10 items and stalls; 20 items are produced behind it. Leases
    stop at the hole, fill it after HOLE_TIMEOUT and go on; the writer then writes late, finds its
    positions filled, takes new ones. Everything is delivered once."""
    clock = Clock()
    model, meter = build(kind, endpoint, clock)
    stalled = [tagged_payload(EXPIRY.payload) for _ in range(EXPIRY.batch)]
    first = model.take_positions(len(stalled)) if dies else None
    if not dies:
        model.produce(stalled)
    produced = [identity(p) for p in stalled]
    for _ in range(EXPIRY_COUNT // EXPIRY.batch):
        payloads = [tagged_payload(EXPIRY.payload) for _ in range(EXPIRY.batch)]
        model.produce(payloads)
        produced += [identity(p) for p in payloads]
    delivered: Counter[str] = Counter()
    if first is not None:
        # L-tx and L-one stop at the hole and answer nothing; L-add waits it out and fills it.
        early = model.lease(EXPIRY.batch)
        if early is not None:
            model.complete(early)
            delivered.update(early.identities)
        clock.advance(HOLE_TIMEOUT_US)
        delivered += drain(model, consumers=1, batch=EXPIRY.batch, limit=4 * EXPIRY_COUNT)
        # The late writer: its conditional puts fail on the filler, it takes new positions.
        late = model.write_rows(model.rows_at(first, stalled, clock.now()))
        if len(late) != 1:
            raise RuntimeError(f"{kind.name}: the late write was not refused")
        model.produce(row_payloads(late[0]))
    delivered += drain(model, consumers=1, batch=EXPIRY.batch, limit=4 * EXPIRY_COUNT)
    return figures_of(kind.name, EXPIRY, produced, delivered, meter.snapshot(), 0.0)


# -- a lease behind many valid leases -----------------------------------------------------------

#: Items held in valid leases of 10 before the measured lease (issue 35: "a lease of 10 right after
#: 4,000 items were produced and leased", v2 13-104 read units).
DEPTH = 4000
QUICK_DEPTH = 400
#: The held leases must stay valid while the case fills (minutes on moto), or they come back.
DEPTH_LEASE_US = 30 * 60 * 1_000_000
DEPTH_CANDIDATES: tuple[type[Candidate], ...] = (ClaimLogTx, ClaimLogAdd, ClaimLogSpill)


@dataclass(frozen=True)
class DepthRun:
    """One lease of 10 and its complete, with ``held`` items in valid leases ahead of it."""

    candidate: str
    held: int
    read_units: float
    write_units: float
    requests: int
    delivered: int


def depth_raw(kind: type[Candidate], endpoint: str, held: int) -> DepthRun:
    model, meter = build(kind, endpoint, Clock())
    model.lease_us = DEPTH_LEASE_US
    for _ in range(0, held + 10, 100):
        model.produce([tagged_payload(100) for _ in range(100)])
    for _ in range(held // 10):
        if model.lease(10) is None:
            raise RuntimeError(f"{kind.name}: nothing to lease while filling")
    meter.reset()
    lease = model.lease(10)
    if lease is None:
        raise RuntimeError(f"{kind.name}: nothing to lease behind {held} held items")
    model.complete(lease)
    snap = meter.snapshot()
    return DepthRun(kind.name, held, snap.read_units, snap.write_units, snap.requests, len(lease.identities))


def depth_v2(endpoint: str, held: int) -> DepthRun:
    metered = metered_service(endpoint, engine=2)
    name = f"v3-depth-{secrets.token_hex(4)}"
    v2_queue(metered, name, lease_timeout=timedelta(microseconds=DEPTH_LEASE_US))
    service = metered.service
    for _ in range(0, held + 10, 100):
        service.produce(name, [NewItem(payload=tagged_payload(100)) for _ in range(100)])
    for _ in range(held // 10):
        service.lease(name, batch_size=10, client_id="holds")
    metered.meter.reset()
    metered.catalog_meter.reset()
    lease = service.lease(name, batch_size=10, client_id="measured")
    service.complete(name, lease.partition, [i.id for i in lease.items])
    snap, catalog = metered.meter.snapshot(), metered.catalog_meter.snapshot()
    return DepthRun(
        "v2",
        held,
        snap.read_units - catalog.read_units,
        snap.write_units,
        snap.requests - catalog.requests,
        len(lease.items),
    )


# -- the whole measurement -----------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    figures: list[Figures]
    episodes: list[Episode]
    count: int
    contention_count: int
    depth: list[DepthRun] = field(default_factory=list)

    def get(self, candidate: str, workload: Workload) -> Figures:
        return next(f for f in self.figures if f.candidate == candidate and f.workload == workload)

    @property
    def candidates(self) -> list[str]:
        return list(dict.fromkeys(f.candidate for f in self.figures))


def measure(
    endpoint: str,
    *,
    count: int = COUNT,
    contention_count: int = CONTENTION_COUNT,
    workloads: Sequence[Workload] = WORKLOADS,
    candidates: Sequence[type[Candidate]] = CANDIDATES,
    episodes: bool = True,
    depth: int = DEPTH,
) -> Report:
    metered = metered_service(endpoint, engine=2)
    figures: list[Figures] = []
    for workload in workloads:
        n = max(workload.batch, count if workload.consumers == 1 else contention_count)
        figures.append(run_v2(metered, workload, n))
        figures += [run_raw(kind, endpoint, workload, n) for kind in candidates]
    found: list[Episode] = []
    if episodes:
        found.append(
            Episode(
                "v2",
                "expired lease",
                expiry_v2(endpoint, expire=True),
                expiry_v2(endpoint, expire=False),
                EXPIRY.batch,
            )
        )
        for kind in candidates:
            found.append(
                Episode(
                    kind.name,
                    "expired lease",
                    expiry_raw(kind, endpoint, expire=True),
                    expiry_raw(kind, endpoint, expire=False),
                    EXPIRY.batch,
                )
            )
        for kind in candidates:
            if issubclass(kind, ClaimLog):
                found.append(
                    Episode(
                        kind.name,
                        "dead writer",
                        dead_writer(kind, endpoint, dies=True),
                        dead_writer(kind, endpoint, dies=False),
                        EXPIRY.batch,
                    )
                )
    runs: list[DepthRun] = []
    if depth:
        runs.append(depth_v2(endpoint, depth))
        runs += [depth_raw(kind, endpoint, depth) for kind in DEPTH_CANDIDATES if kind in candidates]
    return Report(figures=figures, episodes=found, count=count, contention_count=contention_count, depth=runs)


#: Leases in flight at which the head row of L-one / L-add is sized (issue 35: O(work) at 100,000).
IN_FLIGHT = (16, 400, 4000)


def head_with_leases(in_flight: int, now: int = 1_800_000_000_000_000) -> AttributeMap:
    """L-add's head row with ``in_flight`` lease records in it (12-hex-digit tokens, as leased)."""
    tokens = [f"{n:012x}" for n in range(in_flight)]
    position = 10**9
    return {
        "pk": {"S": PK},
        "sk": {"S": ClaimLog.HEAD},
        "tail": {"N": str(position + 10 * in_flight)},
        "cur": {"N": str(position + 10 * in_flight)},
        "crow": {"N": str(position)},
        "ls": {"M": {t: {"M": {"k": {"N": "10"}, "d": {"N": str(now + LEASE_US)}}} for t in tokens}},
        "la": {"M": {t: {"N": str(position + 10 * n)} for n, t in enumerate(tokens)}},
    }


def head_growth() -> list[tuple[int, int]]:
    """(leases in flight, head row bytes) for L-one / L-add: every claim and complete writes the
    head (1 unit per started KB) and every lease reads it (1 unit per started 4 KB)."""
    return [(n, item_size(head_with_leases(n))) for n in IN_FLIGHT]


# -- issue 35's targets ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    label: str
    check: Callable[[Report, str], tuple[float, bool]]


def _units(
    workload: Workload, bound: float, attr: str = "write_units_per_item"
) -> Callable[[Report, str], tuple[float, bool]]:
    def check(report: Report, candidate: str) -> tuple[float, bool]:
        value = float(getattr(report.get(candidate, workload), attr))
        return value, value <= bound

    return check


def _reads_no_higher(report: Report, candidate: str) -> tuple[float, bool]:
    """The worst ratio of this candidate's read units to v2's over the other rows."""
    ratios = [
        report.get(candidate, w).read_units_per_item / report.get("v2", w).read_units_per_item
        for w in WORKLOADS
        if w != Workload(1000, 1)
    ]
    worst = max(ratios)
    return worst, worst <= 1.0


def _ceiling(report: Report, candidate: str) -> tuple[float, bool]:
    value = report.get(candidate, Workload(100, 10)).ceiling
    return value, value >= 3000


def _contention(report: Report, candidate: str) -> tuple[float, bool]:
    value = report.get(candidate, Workload(100, 10, consumers=16)).failed_per_leased
    return value, value < 0.1


TARGETS = (
    Target("WCU/item 100 B x100 <= 0.5", _units(Workload(100, 100), 0.5)),
    Target("WCU/item 100 B x10 <= 1.0", _units(Workload(100, 10), 1.0)),
    Target("WCU/item 1,000 B x100 <= 1.6", _units(Workload(1000, 100), 1.6)),
    Target("WCU/item 1,000 B x1 <= 6", _units(Workload(1000, 1), 6.0)),
    Target("WCU/item 1,000 B, 4 consumers <= 2.0", _units(Workload(1000, 10, consumers=4), 2.0)),
    Target("RCU/item 1,000 B x1 <= 4", _units(Workload(1000, 1), 4.0, "read_units_per_item")),
    Target("RCU/item other rows <= v2's (worst ratio)", _reads_no_higher),
    Target("ceiling 100 B x10 >= 3,000 items/s", _ceiling),
    Target("$/M all services, HTTP API, 100 B x100 <= 0.5", _units(Workload(100, 100), 0.5, "dollars")),
    Target("$/M all services, HTTP API, 100 B x10 <= 1.0", _units(Workload(100, 10), 1.0, "dollars")),
    Target("failed CW/leased, 16 consumers < 0.1", _contention),
)


# -- command line -------------------------------------------------------------------------------


def figures_table(report: Report, *, title: str, column: str, width: int) -> list[str]:
    """The per-workload table of ``report`` (one line per candidate, workloads apart) and its
    legend; ``column`` names the candidate column, ``width`` wide (``benchmarks.cost_v3`` prints
    stores)."""
    header = (
        f"{'workload':<26} {column:<{width}} | {'req/item':>8} {'WCU/item':>8} {'RCU/item':>8}"
        f" {'failed/leased':>13} | {'ceiling/s':>9} {'$/M HTTP':>8} {'REST':>5} | {'once':>4}"
    )
    lines = [
        f"{title}, one partition: produce -> lease -> complete per delivered item"
        f" (N={report.count}; {report.contention_count} with several consumers)",
        header,
        "-" * len(header),
    ]
    previous = None
    for f in report.figures:
        if previous is not None and f.workload != previous:
            lines.append("")
        previous = f.workload
        lines.append(
            f"{f.workload.name:<26} {f.candidate:<{width}} | {f.requests_per_item:>8.2f}"
            f" {f.write_units_per_item:>8.2f} {f.read_units_per_item:>8.2f} {f.failed_per_leased:>13.3f} |"
            f" {f.ceiling:>9,.0f} {f.dollars:>8.2f} {f.dollars_rest:>5.2f} |"
            f" {'yes' if f.exactly_once else 'NO':>4}"
        )
    return [
        *lines,
        "",
        "req, WCU, RCU per delivered item, produce included; failed/leased = failed conditional writes",
        "(charged) per leased item; ceiling = items/s of one queue partition, min(1,000 WCU/s / WCU of",
        "its hottest partition key, 3,000 RCU/s / RCU); $/M = USD per million delivered items, all",
        "services: WCU x $0.625 + RCU x $0.125 + 3 API calls per batch (HTTP API of stage prod $1.00,",
        "REST $3.50 per million) + Lambda as docs/capacity.md measured it; once = every item delivered",
        "exactly once.",
    ]


def format_report(report: Report) -> str:
    lines = figures_table(report, title="Engine v3 candidates", column="candidate", width=6)
    lines.append("v2 leaves out its catalog reads (one per service call, any model pays them).")
    if report.episodes:
        header = (
            f"{'case':<14} {'candidate':<6} | {'WCU':>6} {'RCU':>6} {'requests':>8} {'failed':>6} |"
            f" {'extra WCU/item':>14} {'extra RCU/item':>14} | {'once':>4}"
        )
        lines += [
            "",
            f"Episodes: {EXPIRY_COUNT} items of 100 B in batches of 10. expired lease: the first lease of",
            "10 is abandoned and runs out; dead writer (the log): positions for 10 items are taken and",
            f"not written for {HOLE_TIMEOUT_US / 1e6:.0f} s. Totals, and the extra per affected item against",
            "the same script without it.",
            header,
            "-" * len(header),
        ]
        for e in report.episodes:
            f = e.figures
            lines.append(
                f"{e.case:<14} {e.candidate:<6} | {f.write_units:>6.0f} {f.read_units:>6.1f} {f.requests:>8}"
                f" {f.failed_conditional_writes:>6} | {e.extra_per_item('write_units'):>14.2f}"
                f" {e.extra_per_item('read_units'):>14.2f} | {'yes' if f.exactly_once else 'NO':>4}"
            )
    if report.depth:
        lines += [
            "",
            f"One lease of 10 (and its complete) right after {report.depth[0].held:,} items of 100 B were"
            " leased in leases of 10, still valid:",
            f"{'candidate':<9} | {'RCU':>6} {'WCU':>6} {'requests':>8} | {'leased':>6}",
        ]
        for d in report.depth:
            lines.append(
                f"{d.candidate:<9} | {d.read_units:>6.1f} {d.write_units:>6.0f} {d.requests:>8} |"
                f" {d.delivered:>6}"
            )
    lines += [
        "",
        "L-one / L-add keep their lease records in the head row, which every claim and complete writes:",
    ]
    for in_flight, size in head_growth():
        lines.append(
            f"  {in_flight:>5,} leases in flight: head row {size:>7,} B -> {write_units(size):>3} WCU per"
            f" claim or complete, {read_units(size, True):>3.0f} RCU per lease"
            + ("  (over DynamoDB's 400 KB item limit)" if size > 400 * 1024 else "")
        )
    candidates = report.candidates
    width = max(len(t.label) for t in TARGETS)
    lines += ["", "Issue 35's targets (value, + met / - not met):"]
    lines.append(f"{'target':<{width}} | " + " | ".join(f"{c:>10}" for c in candidates))
    for target in TARGETS:
        cells = []
        for c in candidates:
            try:
                value, met = target.check(report, c)
            except StopIteration:
                cells.append(f"{'n/a':>10}")
                continue
            cells.append(f"{value:>8.2f} {'+' if met else '-'}")
        lines.append(f"{target.label:<{width}} | " + " | ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_COUNT} items per case, at least a batch ({QUICK_CONTENTION_COUNT} with consumers)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures to PATH")
    args = parser.parse_args(argv)
    use_fake_credentials()
    count = QUICK_COUNT if args.quick else COUNT
    contention = QUICK_CONTENTION_COUNT if args.quick else CONTENTION_COUNT
    with moto_server_process() as endpoint:
        report = measure(
            endpoint, count=count, contention_count=contention, depth=QUICK_DEPTH if args.quick else DEPTH
        )
    print(format_report(report))
    if args.json is not None:
        document = {
            "benchmark": "candidates_v3",
            "count": count,
            "contention_count": contention,
            "figures": [
                {
                    **asdict(f),
                    "write_units_per_item": f.write_units_per_item,
                    "read_units_per_item": f.read_units_per_item,
                    "requests_per_item": f.requests_per_item,
                    "failed_per_leased": f.failed_per_leased,
                    "ceiling": f.ceiling,
                    "dollars_per_million": f.dollars,
                    "dollars_per_million_rest": f.dollars_rest,
                }
                for f in report.figures
            ],
            "episodes": [asdict(e) for e in report.episodes],
            "depth": [asdict(d) for d in report.depth],
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    broken = [f"{f.candidate} {f.workload.name}" for f in report.figures if not f.exactly_once]
    broken += [f"{e.candidate} {e.case}" for e in report.episodes if not e.figures.exactly_once]
    if broken:
        print(f"delivery broken in: {', '.join(broken)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
