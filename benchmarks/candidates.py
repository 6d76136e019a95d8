"""Measured cost of candidate DynamoDB data models for the lease queue, side by side.

Run ``uv run python -m benchmarks.candidates`` (``--json PATH`` to keep the figures). The ADR on
the data model (docs/adr/) quotes these figures.

The workload is the happy path of ``benchmarks.cost``: produce ``N`` items (100-byte payload) in
requests of ``batch``, then lease ``batch`` at a time and complete each lease at once, in one
queue partition (one partition key). Every model stores the same attributes as the product (keys,
payload, attempts, expire and created times) plus what its lease needs.

A  "visible-at sort key, moved on lease": ``sk = <visible_at_us hex>#<unique>``. A lease Queries
   ``sk < now`` (a key condition, no filter) and moves each candidate with a ``TransactWriteItems``
   {Delete old (``attribute_exists``), Put new at ``<deadline hex>#<unique>`` with a lease token},
   so an expired lease simply sorts as due. Complete: ``DeleteItem`` on the token.
A-nontx  the same, but the move is a conditional ``DeleteItem`` then a ``PutItem`` with no
   transaction: cheaper, but a crash between the two loses the item.
B  "immutable FIFO id, lease in place": what the product does, run through ``QueueService``
   (``benchmarks.cost.run_case``). Its catalog reads (one per service call) are left out here so
   that only the data model is compared; ``benchmarks.cost`` reports them.
C  "sparse GSI of available items": ``sk`` = the FIFO id; a KEYS_ONLY GSI on (``pk``, ``avail``)
   where ``avail`` is set on produce and REMOVEd by the lease's conditional ``UpdateItem``.
   Complete: ``DeleteItem`` on the token.

Units come from ``benchmarks.meter.CostMeter`` (AWS's published rules; moto, single-threaded on
127.0.0.1, is only the functional store and its ``ConsumedCapacity`` is ignored). The meter does not
charge index writes, so model C adds them here by AWS's rules for global secondary indexes: a base
write that puts or deletes an index entry costs one write per started KB of the index entry
(its key attributes and projection), one that changes the index key costs a delete and a put (2);
a base write that leaves the item out of the index before and after costs nothing there.

The contention experiment leases with 4 threads, batch 10, from one 200-item partition, and
reports failed conditional writes (lost claims, which are charged too) per leased item. Its counts
depend on thread scheduling, so they vary a little from run to run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import secrets
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from botocore.exceptions import ClientError

from benchmarks.cost import metered_service, payload_of, run_case, use_fake_credentials
from benchmarks.meter import CostMeter, item_size, write_units
from querator.domain.errors import NothingToLeaseError
from querator.domain.model import NewItem, QueueInfo
from querator.testing import dynamodb_client, moto_server_process

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from mypy_boto3_dynamodb import DynamoDBClient

    from benchmarks.cost import MeteredService
    from querator.service import QueueService

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

PAYLOAD = 100
BATCHES = (10, 100)
COUNT = 200
THREADS = 4
CONTENTION_BATCH = 10
CONTENTION_ROUNDS = 3
LEASE_US = 60_000_000
EXPIRE_US = 3_600_000_000
BATCH_WRITE_LIMIT = 25
PK = "bench~0"
INDEX = "available"

AttributeMap = dict[str, Any]


def page_limit(batch: int) -> int:
    """The Query page size of a lease: the product's rule (``QueueService._lease_partition``)."""
    return min(1000, max(50, 2 * batch))


def now_us() -> int:
    return time.time_ns() // 1000


# -- results ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelRun:
    """The cost of the happy path of one model at one batch size."""

    model: str
    batch: int
    produced: int
    delivered: int
    duplicates: int
    missing: int
    stored_item_bytes: int
    base_write_units: float
    #: Model C only: the GSI's write units, computed here (the meter charges the table alone).
    index_write_units: float
    read_units: float
    requests: int
    transactions: int
    failed_conditional_writes: int

    def per_item(self, attr: str) -> float:
        return float(getattr(self, attr)) / self.delivered if self.delivered else float("nan")

    @property
    def write_units_per_item(self) -> float:
        return self.per_item("base_write_units") + self.per_item("index_write_units")


@dataclass(frozen=True)
class ContentionRun:
    """Several threads leasing from one partition at once, summed over rounds."""

    model: str
    threads: int
    batch: int
    rounds: int
    produced: int
    #: Successful claims; equals ``delivered`` while no lease runs out.
    leased: int
    delivered: int
    duplicates: int
    missing: int
    failed_conditional_writes: int
    write_units: float
    requests: int

    @property
    def failed_per_leased(self) -> float:
        return self.failed_conditional_writes / self.leased if self.leased else float("nan")


# -- the raw models -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """A leased item as its holder knows it."""

    key: AttributeMap
    token: str
    #: A stable identity across moves, to check exactly-once delivery.
    identity: str


class RawModel:
    """A candidate model on its own table, written with the low-level client."""

    name: ClassVar[str]
    crash: ClassVar[str]
    expiry: ClassVar[str]

    def __init__(self, client: DynamoDBClient, table: str) -> None:
        self.client = client
        self.table = table
        self._seq = itertools.count(secrets.randbelow(16**8))
        self._node = secrets.randbelow(16**6)
        self._lock = threading.Lock()
        self.index_write_units = 0.0

    # -- table and items -------------------------------------------------------------------------

    def table_definition(self) -> dict[str, Any]:
        return {
            "TableName": self.table,
            "AttributeDefinitions": [
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "sk", "AttributeType": "S"},
            ],
            "KeySchema": [
                {"AttributeName": "pk", "KeyType": "HASH"},
                {"AttributeName": "sk", "KeyType": "RANGE"},
            ],
            "BillingMode": "PAY_PER_REQUEST",
        }

    def create_table(self) -> None:
        self.client.create_table(**self.table_definition())
        self.client.get_waiter("table_exists").wait(
            TableName=self.table, WaiterConfig={"Delay": 1, "MaxAttempts": 30}
        )

    def unique(self) -> str:
        with self._lock:
            seq = next(self._seq)
        return f"{seq:010x}{self._node:06x}"

    def new_item(self, payload: bytes, now: int) -> AttributeMap:
        """The product's attributes (``codec.encode_item``) under this model's keys."""
        return {
            "pk": {"S": PK},
            "sk": {"S": self.sort_key(now, self.unique())},
            "attempts": {"N": "0"},
            "expire": {"N": str(now + EXPIRE_US)},
            "created": {"N": str(now)},
            "payload": {"B": payload},
        }

    def sort_key(self, visible_at: int, unique: str) -> str:
        return f"{visible_at:014x}{unique}"

    def identity(self, item: AttributeMap) -> str:
        return str(item["sk"]["S"])

    def charge_index(self, units: float) -> None:
        with self._lock:
            self.index_write_units += units

    # -- the three operations ---------------------------------------------------------------------

    def produce(self, payloads: Sequence[bytes]) -> list[str]:
        now = now_us()
        items = [self.new_item(p, now) for p in payloads]
        for start in range(0, len(items), BATCH_WRITE_LIMIT):
            pending: list[Any] = [
                {"PutRequest": {"Item": i}} for i in items[start : start + BATCH_WRITE_LIMIT]
            ]
            while pending:
                reply = self.client.batch_write_item(RequestItems={self.table: pending})
                pending = list(reply.get("UnprocessedItems", {}).get(self.table, []))
        self.after_produce(items)
        return [self.identity(i) for i in items]

    def after_produce(self, items: Sequence[AttributeMap]) -> None:
        """Hook for index accounting."""

    def query_due(self, now: int, limit: int, start: AttributeMap | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "pk = :pk AND sk < :bound",
            "ExpressionAttributeValues": {":pk": {"S": PK}, ":bound": {"S": f"{now + 1:014x}"}},
            "Limit": limit,
        }
        if start is not None:
            kwargs["ExclusiveStartKey"] = start
        return dict(self.client.query(**kwargs))

    def lease(self, batch: int) -> list[Claim]:
        """Claim up to ``batch`` due items, oldest first, paging on while claims are lost."""
        now = now_us()
        claimed: list[Claim] = []
        start: AttributeMap | None = None
        while len(claimed) < batch:
            page = self.query_due(now, page_limit(batch), start)
            for item in page.get("Items", []):
                if len(claimed) >= batch:
                    break
                claim = self.claim(item, now)
                if claim is not None:
                    claimed.append(claim)
            start = page.get("LastEvaluatedKey")
            if start is None:
                break
        return claimed

    def claim(self, item: AttributeMap, now: int) -> Claim | None:
        raise NotImplementedError

    def complete(self, claims: Sequence[Claim]) -> int:
        """Delete the leased items; returns how many were no longer held."""
        failed = 0
        for claim in claims:
            try:
                # Fencing: only the holder of this lease's token may complete the item.
                self.client.delete_item(
                    TableName=self.table,
                    Key=claim.key,
                    ConditionExpression="#tok = :tok",
                    ExpressionAttributeNames={"#tok": "tok"},
                    ExpressionAttributeValues={":tok": {"S": claim.token}},
                )
            except ClientError as exc:
                if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                    raise
                failed += 1
        return failed


class ModelA(RawModel):
    name = "A"
    crash = "safe: the move is one transaction, the item is at the old or the new key"
    expiry = "the lease moves sk to the deadline: an expired lease is due, same key-range Query, no filter"

    def sort_key(self, visible_at: int, unique: str) -> str:
        return f"{visible_at:014x}#{unique}"

    def identity(self, item: AttributeMap) -> str:
        return str(item["sk"]["S"]).split("#", 1)[1]

    def leased_copy(self, item: AttributeMap, now: int) -> tuple[AttributeMap, str]:
        token = secrets.token_hex(8)
        moved = dict(item)
        moved["sk"] = {"S": self.sort_key(now + LEASE_US, self.identity(item))}
        moved["attempts"] = {"N": str(int(item["attempts"]["N"]) + 1)}
        moved["tok"] = {"S": token}
        return moved, token

    def claim(self, item: AttributeMap, now: int) -> Claim | None:
        moved, token = self.leased_copy(item, now)
        old_key = {"pk": item["pk"], "sk": item["sk"]}
        try:
            self.client.transact_write_items(
                TransactItems=[
                    # Racing consumers: only the first to move the item away from its due key wins.
                    {
                        "Delete": {
                            "TableName": self.table,
                            "Key": old_key,
                            "ConditionExpression": "attribute_exists(sk)",
                        }
                    },
                    {
                        "Put": {
                            "TableName": self.table,
                            "Item": moved,
                            "ConditionExpression": "attribute_not_exists(sk)",
                        }
                    },
                ]
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "TransactionCanceledException":
                raise
            return None
        return Claim(key={"pk": moved["pk"], "sk": moved["sk"]}, token=token, identity=self.identity(item))


class ModelANonTx(ModelA):
    name = "A-nontx"
    crash = "LOSES THE ITEM if the process dies between the Delete and the Put"

    def claim(self, item: AttributeMap, now: int) -> Claim | None:
        moved, token = self.leased_copy(item, now)
        try:
            # Racing consumers: the conditional delete decides the winner.
            self.client.delete_item(
                TableName=self.table,
                Key={"pk": item["pk"], "sk": item["sk"]},
                ConditionExpression="attribute_exists(sk)",
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            return None
        self.client.put_item(TableName=self.table, Item=moved)
        return Claim(key={"pk": moved["pk"], "sk": moved["sk"]}, token=token, identity=self.identity(item))


class ModelC(RawModel):
    name = "C"
    crash = "safe: one conditional write per step (the GSI follows asynchronously)"
    expiry = (
        "a leased item leaves the index: only a base-table scan (the reaper) finds an expired lease;"
        " SET avail=deadline instead would keep it findable at 2 index writes per lease"
    )

    def table_definition(self) -> dict[str, Any]:
        definition = super().table_definition()
        definition["AttributeDefinitions"].append({"AttributeName": "avail", "AttributeType": "S"})
        definition["GlobalSecondaryIndexes"] = [
            {
                "IndexName": INDEX,
                "KeySchema": [
                    {"AttributeName": "pk", "KeyType": "HASH"},
                    {"AttributeName": "avail", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ]
        return definition

    def new_item(self, payload: bytes, now: int) -> AttributeMap:
        item = super().new_item(payload, now)
        item["avail"] = item["sk"]
        return item

    @staticmethod
    def index_entry_units(item: AttributeMap) -> int:
        """Write units of one write of this item's KEYS_ONLY index entry (table and index keys)."""
        return write_units(item_size({k: item[k] for k in ("pk", "sk", "avail")}))

    def after_produce(self, items: Sequence[AttributeMap]) -> None:
        # Each new item with ``avail`` puts one index entry.
        self.charge_index(sum(self.index_entry_units(i) for i in items))

    def query_due(self, now: int, limit: int, start: AttributeMap | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": INDEX,
            "KeyConditionExpression": "pk = :pk AND avail < :bound",
            "ExpressionAttributeValues": {":pk": {"S": PK}, ":bound": {"S": f"{now + 1:014x}"}},
            "Limit": limit,
        }
        if start is not None:
            kwargs["ExclusiveStartKey"] = start
        return dict(self.client.query(**kwargs))

    def claim(self, item: AttributeMap, now: int) -> Claim | None:
        token = secrets.token_hex(8)
        key = {"pk": item["pk"], "sk": item["sk"]}
        try:
            self.client.update_item(
                TableName=self.table,
                Key=key,
                UpdateExpression="REMOVE avail SET #lease = :deadline, #tok = :tok ADD attempts :one",
                # Racing consumers (and a stale GSI read): only an item still available is claimed.
                ConditionExpression="attribute_exists(avail)",
                ExpressionAttributeNames={"#lease": "lease", "#tok": "tok"},
                ExpressionAttributeValues={
                    ":deadline": {"N": str(now + LEASE_US)},
                    ":tok": {"S": token},
                    ":one": {"N": "1"},
                },
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            return None  # failed: nothing was written, so the index was not touched either
        # REMOVE avail deletes the index entry: one index write.
        self.charge_index(self.index_entry_units(item))
        return Claim(key=key, token=token, identity=self.identity(item))


MODELS: tuple[type[RawModel], ...] = (ModelA, ModelANonTx, ModelC)
MODEL_B_CRASH = "safe: one conditional write per step, the id never changes while leased"
MODEL_B_EXPIRY = (
    "same Query: leased items stay in the key range and a filter drops them (read, and charged);"
    " an expired one is requeued under a new id by a 2-item transaction"
)


# -- running ------------------------------------------------------------------------------------


def build_model(kind: type[RawModel], endpoint: str, meter_raw: DynamoDBClient) -> tuple[RawModel, CostMeter]:
    client = dynamodb_client(endpoint)
    model = kind(client, f"cand-{kind.name.lower()}-{secrets.token_hex(4)}")
    model.create_table()
    meter = CostMeter(meter_raw)
    meter.attach(client)
    return model, meter


def run_raw(kind: type[RawModel], endpoint: str, *, batch: int, count: int, payload: int) -> ModelRun:
    raw = dynamodb_client(endpoint)
    model, meter = build_model(kind, endpoint, raw)
    produced: list[str] = []
    for start in range(0, count, batch):
        produced += model.produce([payload_of(payload)] * min(batch, count - start))
    first = raw.query(
        TableName=model.table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": PK}},
        Limit=1,
    )["Items"][0]
    delivered: Counter[str] = Counter()
    # Stops once everything is delivered, as ``benchmarks.cost.run_case`` does (no final empty lease).
    for _ in range(count):
        if len(delivered) >= count:
            break
        claims = model.lease(batch)
        if not claims:
            break
        if model.complete(claims):
            raise RuntimeError(f"model {kind.name}: complete failed on the happy path")
        delivered.update(c.identity for c in claims)
    snap = meter.snapshot()
    return ModelRun(
        model=kind.name,
        batch=batch,
        produced=len(produced),
        delivered=len(delivered),
        duplicates=sum(n - 1 for n in delivered.values()),
        missing=len(set(produced) - set(delivered)),
        stored_item_bytes=item_size(first),
        base_write_units=snap.write_units,
        index_write_units=model.index_write_units,
        read_units=snap.read_units,
        requests=snap.requests,
        transactions=snap.requests_by_operation.get("TransactWriteItems", 0),
        failed_conditional_writes=snap.failed_conditional_writes,
    )


def run_product(metered: MeteredService, *, batch: int, count: int, payload: int) -> ModelRun:
    case = run_case(
        metered, payload_bytes=payload, batch=batch, count=count, queue_name=f"cand-b-{batch:04d}"
    )
    phases = case.phases.values()
    return ModelRun(
        model="B",
        batch=batch,
        produced=case.produced,
        delivered=case.delivered,
        duplicates=case.duplicates,
        missing=case.missing,
        stored_item_bytes=case.stored_item_bytes,
        base_write_units=sum(p.write_units for p in phases),
        index_write_units=0.0,
        # The catalog's reads are the product's, not the data model's: left out (see the docstring).
        read_units=sum(p.read_units - p.catalog_read_units for p in phases),
        requests=sum(p.requests - p.catalog_requests for p in phases),
        transactions=sum(p.requests_by_operation.get("TransactWriteItems", 0) for p in phases),
        failed_conditional_writes=case.failed_conditional_writes,
    )


def in_threads(threads: int, work: Callable[[int], list[str]]) -> Counter[str]:
    """Run ``work(i)`` in ``threads`` threads; the identities they delivered, counted."""
    results: list[list[str]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def target(i: int) -> None:
        try:
            results[i] = work(i)
        except BaseException as exc:  # re-raised in the caller's thread below
            errors.append(exc)

    workers = [threading.Thread(target=target, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    return Counter(itertools.chain.from_iterable(results))


def drain_in_threads(service: QueueService, queue: str, *, consumers: int, batch: int) -> Counter[str]:
    """``consumers`` threads lease ``batch`` items at a time and complete each lease at once until
    ``queue`` is empty; the ids they delivered, counted."""

    def work(i: int) -> list[str]:
        done: list[str] = []
        while True:
            try:
                lease = service.lease(queue, batch_size=batch, client_id=f"consumer-{i}")
            except NothingToLeaseError:
                return done
            ids = [item.id for item in lease.items]
            if service.complete(queue, lease.partition, ids).failed:
                raise RuntimeError("complete failed on a freshly leased item")
            done += ids

    return in_threads(consumers, work)


def contend_raw(
    kind: type[RawModel], endpoint: str, *, threads: int, batch: int, count: int
) -> ContentionRun:
    raw = dynamodb_client(endpoint)
    model, meter = build_model(kind, endpoint, raw)
    produced = model.produce([payload_of(PAYLOAD)] * count)
    meter.reset()

    def work(_: int) -> list[str]:
        done: list[str] = []
        while claims := model.lease(batch):
            if model.complete(claims):
                raise RuntimeError(f"model {kind.name}: complete failed")
            done += [c.identity for c in claims]
        return done

    delivered = in_threads(threads, work)
    return _contention_run(
        kind.name, threads=threads, batch=batch, produced=produced, delivered=delivered, meter=meter
    )


def contend_product(metered: MeteredService, *, threads: int, batch: int, count: int) -> ContentionRun:
    service = metered.service
    name = f"contend-b-{secrets.token_hex(4)}"
    placeholder = datetime(2000, 1, 1, tzinfo=UTC)  # the service stamps its own times
    info = QueueInfo(
        name=name,
        lease_timeout=timedelta(microseconds=LEASE_US),
        expire_timeout=timedelta(microseconds=EXPIRE_US),
        created_at=placeholder,
        updated_at=placeholder,
    )
    service.create_queue(info)
    produced: list[str] = []
    for start in range(0, count, 100):
        chunk = [NewItem(payload=payload_of(PAYLOAD)) for _ in range(min(100, count - start))]
        produced += service.produce(name, chunk).ids
    metered.meter.reset()
    metered.catalog_meter.reset()

    delivered = drain_in_threads(service, name, consumers=threads, batch=batch)
    return _contention_run(
        "B",
        threads=threads,
        batch=batch,
        produced=produced,
        delivered=delivered,
        meter=metered.meter,
        catalog=metered.catalog_meter,
    )


def _contention_run(
    model: str,
    *,
    threads: int,
    batch: int,
    produced: Sequence[str],
    delivered: Counter[str],
    meter: CostMeter,
    catalog: CostMeter | None = None,
) -> ContentionRun:
    snap = meter.snapshot()
    # The product's catalog reads are not the data model's: left out, as in the happy-path table.
    catalog_requests = 0 if catalog is None else catalog.snapshot().requests
    return ContentionRun(
        model=model,
        threads=threads,
        batch=batch,
        rounds=1,
        produced=len(produced),
        leased=sum(delivered.values()),
        delivered=len(delivered),
        duplicates=sum(n - 1 for n in delivered.values()),
        missing=len(set(produced) - set(delivered)),
        failed_conditional_writes=snap.failed_conditional_writes,
        write_units=snap.write_units,
        requests=snap.requests - catalog_requests,
    )


def combine(runs: Sequence[ContentionRun]) -> ContentionRun:
    """The sum of several rounds of one model's contention run."""
    first = runs[0]
    return replace(
        first,
        rounds=len(runs),
        **{
            name: sum(getattr(r, name) for r in runs)
            for name in (
                "produced",
                "leased",
                "delivered",
                "duplicates",
                "missing",
                "failed_conditional_writes",
                "write_units",
                "requests",
            )
        },
    )


@dataclass(frozen=True)
class CandidatesReport:
    runs: list[ModelRun]
    contention: list[ContentionRun]


def measure(
    endpoint: str,
    *,
    batches: Sequence[int] = BATCHES,
    count: int = COUNT,
    payload: int = PAYLOAD,
    threads: int = THREADS,
    contention_batch: int = CONTENTION_BATCH,
    rounds: int = CONTENTION_ROUNDS,
) -> CandidatesReport:
    """Every model at every batch size, then the contention experiment (A, A-nontx and B)."""
    metered = metered_service(endpoint, engine=2)
    runs: list[ModelRun] = []
    for batch in batches:
        runs.append(run_raw(ModelA, endpoint, batch=batch, count=count, payload=payload))
        runs.append(run_raw(ModelANonTx, endpoint, batch=batch, count=count, payload=payload))
        runs.append(run_product(metered, batch=batch, count=count, payload=payload))
        runs.append(run_raw(ModelC, endpoint, batch=batch, count=count, payload=payload))
    contention = [
        combine(
            [
                contend_raw(kind, endpoint, threads=threads, batch=contention_batch, count=count)
                for _ in range(rounds)
            ]
        )
        for kind in (ModelA, ModelANonTx)
    ]
    contention.append(
        combine(
            [
                contend_product(metered, threads=threads, batch=contention_batch, count=count)
                for _ in range(rounds)
            ]
        )
    )
    return CandidatesReport(runs=runs, contention=contention)


# -- command line -------------------------------------------------------------------------------

NOTES = {
    "A": (ModelA.crash, ModelA.expiry),
    "A-nontx": (ModelANonTx.crash, ModelANonTx.expiry),
    "B": (MODEL_B_CRASH, MODEL_B_EXPIRY),
    "C": (ModelC.crash, ModelC.expiry),
}


def format_report(report: CandidatesReport, *, count: int, payload: int) -> str:
    header = (
        f"{'model':<8} {'batch':>5} {'item B':>6} | {'WCU/item':>8} {'base':>5}"
        f" {'index WCU (computed)':>20} | {'RCU/item':>8} {'req/item':>8} {'tx/item':>7} |"
        f" {'failed':>6} {'dup/miss':>8}"
    )
    lines = [
        f"Candidate data models, happy path: produce -> lease -> complete, {payload} B payload, N={count},"
        " 1 partition",
        header,
        "-" * len(header),
    ]
    for r in report.runs:
        lines.append(
            f"{r.model:<8} {r.batch:>5} {r.stored_item_bytes:>6} | {r.write_units_per_item:>8.2f}"
            f" {r.per_item('base_write_units'):>5.2f} {r.per_item('index_write_units'):>20.2f} |"
            f" {r.per_item('read_units'):>8.2f} {r.per_item('requests'):>8.2f}"
            f" {r.per_item('transactions'):>7.2f} |"
            f" {r.failed_conditional_writes:>6} {f'{r.duplicates}/{r.missing}':>8}"
        )
    lines += [
        "",
        "WCU/item = base + index write units per delivered item; tx/item = TransactWriteItems per item;",
        "model B's requests and read units leave out the product's catalog reads (see benchmarks.cost).",
        "",
        "Crash mid-operation, and how an expired lease is found:",
    ]
    for model, (crash, expiry) in NOTES.items():
        lines.append(f"  {model:<8} crash:  {crash}")
        lines.append(f"  {'':<8} expiry: {expiry}")
    if report.contention:
        c0 = report.contention[0]
        lines += [
            "",
            f"Contention: {c0.threads} threads leasing batch {c0.batch} (and completing) from one"
            f" {c0.produced // c0.rounds}-item partition; sums over {c0.rounds} round(s)",
        ]
        header = (
            f"{'model':<8} | {'leased':>6} {'failed cond.':>12} {'failed/leased':>13} |"
            f" {'WCU/item':>8} {'req/item':>8} | {'dup/miss':>8}"
        )
        lines += [header, "-" * len(header)]
        for c in report.contention:
            lines.append(
                f"{c.model:<8} | {c.leased:>6} {c.failed_conditional_writes:>12}"
                f" {c.failed_per_leased:>13.2f} |"
                f" {c.write_units / c.delivered:>8.2f} {c.requests / c.delivered:>8.2f} |"
                f" {f'{c.duplicates}/{c.missing}':>8}"
            )
        lines += [
            "(lease + complete only: WCU/item includes the lost claims, which are charged; B's catalog",
            " reads left out. Counts depend on thread scheduling, so they vary a little between runs.)",
        ]
    lines += [
        "",
        "Units: benchmarks.meter, AWS's published rules (moto's ConsumedCapacity ignored); index units of C",
        "computed here by AWS's GSI rules (entry put or delete: 1 per started KB of the index entry).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures to PATH")
    args = parser.parse_args(argv)
    use_fake_credentials()
    with moto_server_process() as endpoint:
        report = measure(endpoint)
    print(format_report(report, count=COUNT, payload=PAYLOAD))
    if args.json is not None:
        document = {
            "benchmark": "candidates",
            "count": COUNT,
            "payload_bytes": PAYLOAD,
            "runs": [
                {
                    **asdict(r),
                    "write_units_per_item": r.write_units_per_item,
                    "crash": NOTES[r.model][0],
                    "expiry": NOTES[r.model][1],
                }
                for r in report.runs
            ],
            "contention": [
                {**asdict(c), "failed_per_leased": c.failed_per_leased} for c in report.contention
            ],
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    broken = [f"{r.model} x{r.batch}" for r in report.runs if r.duplicates or r.missing]
    broken += [f"{c.model} (contention)" for c in report.contention if c.duplicates or c.missing]
    if broken:
        print(f"delivery broken in: {', '.join(broken)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
