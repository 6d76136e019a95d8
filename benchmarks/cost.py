"""DynamoDB cost per delivered item of the product's happy path: produce -> lease -> complete.

Run ``uv run python -m benchmarks.cost`` (``--quick`` for a smaller run, ``--json PATH`` to keep the
figures).

Method
------
* The workload runs through the real ``QueueService`` (DynamoDB item store + PynamoDB catalog)
  against a single-threaded moto server on 127.0.0.1 (``querator.testing.moto_server_process``).
  moto is used only as a functional store: it answers the requests, nothing more.
* Every request of the service's boto3 client and of the catalog's PynamoDB client is counted by
  ``benchmarks.meter.CostMeter``, which computes the write and read units AWS would charge from
  the published rules (one write unit per started KB of the larger of the item before and after a
  write, failed conditional writes included, 2x for transactions; one read unit per started 4 KB,
  half for eventually consistent reads, Query charged on every item it evaluated before any
  filter). moto's own ``ConsumedCapacity`` figures are ignored: they do not follow those rules.
* Each case uses a fresh queue with one partition: ``count`` items are produced in requests of
  ``batch`` items, then the items are leased ``batch`` at a time and each lease's ids completed at
  once, until every item was delivered. The meter is snapshot and reset around every service call,
  so each phase (produce, lease, complete) is charged separately. Catalog reads (every service
  call reads its queue) are included in the figures.
* The figures are deterministic (same requests, same sizes) apart from elapsed time, which is shown
  but means nothing on moto (DESIGN.md: never judge speed on moto).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.meter import CostMeter, CostSnapshot, item_size, write_units
from querator.config import DEFAULT_ENGINE
from querator.domain.errors import NothingToLeaseError
from querator.domain.model import NewItem, QueueInfo
from querator.domain.positions import parse_position_id
from querator.storage.dynamodb import codec, schema
from querator.storage.dynamodb.catalog import DynamoDBQueueCatalog
from querator.storage.dynamodb.store import DynamoDBItemStore
from querator.testing import SystemClock, build_service, dynamodb_client, moto_server_process

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from mypy_boto3_dynamodb import DynamoDBClient

    from querator.ports import Clock
    from querator.service import QueueService

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

PHASES = ("produce", "lease", "complete")
PAYLOADS = (100, 1000, 1024)
BATCHES = (1, 10, 100)
COUNT = 300
QUICK_COUNT = 100
#: DESIGN.md, data model point 5: at most this many write units per delivered item ...
TARGET_WRITE_UNITS = 4
#: ... when the stored item is smaller than this.
TARGET_ITEM_BYTES = 1024
LEASE_TIMEOUT = timedelta(seconds=60)
EXPIRE_TIMEOUT = timedelta(hours=1)


@dataclass(frozen=True)
class PhaseCost:
    """What one phase of a case cost, summed over its requests."""

    requests: int = 0
    write_units: float = 0.0
    read_units: float = 0.0
    failed_conditional_writes: int = 0
    requests_by_operation: dict[str, int] = field(default_factory=dict)
    #: The share of the catalog table (PynamoDB) in ``requests`` and ``read_units``.
    catalog_requests: int = 0
    catalog_read_units: float = 0.0
    #: Write units by partition key (``CostSnapshot.write_units_by_key``).
    write_units_by_key: dict[str, float] = field(default_factory=dict)

    def plus(self, snap: CostSnapshot, catalog: CostSnapshot) -> PhaseCost:
        ops = Counter(self.requests_by_operation)
        ops.update(snap.requests_by_operation)
        by_key = dict(self.write_units_by_key)
        for key, units in snap.write_units_by_key.items():
            by_key[key] = by_key.get(key, 0.0) + units
        return PhaseCost(
            requests=self.requests + snap.requests,
            write_units=self.write_units + snap.write_units,
            read_units=self.read_units + snap.read_units,
            failed_conditional_writes=self.failed_conditional_writes + snap.failed_conditional_writes,
            requests_by_operation=dict(sorted(ops.items())),
            catalog_requests=self.catalog_requests + catalog.requests,
            catalog_read_units=self.catalog_read_units + catalog.read_units,
            write_units_by_key=by_key,
        )


@dataclass(frozen=True)
class CaseResult:
    """The figures of one case (payload size x batch size)."""

    payload_bytes: int
    batch: int
    produced: int
    #: Distinct items delivered (leased and completed).
    delivered: int
    #: Items leased more than once, and produced items never delivered: both must be 0.
    duplicates: int
    missing: int
    #: ``item_size`` of one stored item as produced (before its lease).
    stored_item_bytes: int
    phases: dict[str, PhaseCost]
    seconds: float

    @property
    def name(self) -> str:
        return f"{self.payload_bytes}B x{self.batch}"

    @property
    def floor_write_units(self) -> int:
        """Three writes (produce, lease, complete) of the stored item: no design does less."""
        return 3 * write_units(self.stored_item_bytes)

    def _total(self, attr: str) -> float:
        return float(sum(getattr(p, attr) for p in self.phases.values()))

    def per_item(self, attr: str, phase: str | None = None) -> float:
        value = self._total(attr) if phase is None else float(getattr(self.phases[phase], attr))
        return value / self.delivered if self.delivered else float("nan")

    @property
    def failed_conditional_writes(self) -> int:
        return int(self._total("failed_conditional_writes"))

    def hottest_key_write_units_per_item(self) -> float:
        """Write units per item of the partition key that took the most: DynamoDB takes 1,000 a
        second on one key, so this bounds a queue partition (engine v3 spreads a log over two keys,
        its head's and its rows'; engine v2 writes a partition under one)."""
        by_key: dict[str, float] = {}
        for phase in self.phases.values():
            for key, units in phase.write_units_by_key.items():
                by_key[key] = by_key.get(key, 0.0) + units
        hottest = max(by_key.values(), default=0.0)
        return hottest / self.delivered if self.delivered else float("nan")

    def summary(self) -> dict[str, Any]:
        """Every figure, the derived ones included, for ``--json``."""
        return {
            **asdict(self),
            "case": self.name,
            "floor_write_units": self.floor_write_units,
            "requests_per_item": self.per_item("requests"),
            "requests_per_item_by_phase": {p: self.per_item("requests", p) for p in PHASES},
            "write_units_per_item": self.per_item("write_units"),
            "write_units_per_item_by_phase": {p: self.per_item("write_units", p) for p in PHASES},
            "read_units_per_item": self.per_item("read_units"),
        }


@dataclass(frozen=True)
class CostReport:
    cases: list[CaseResult]

    def case(self, payload_bytes: int, batch: int) -> CaseResult:
        return next(c for c in self.cases if (c.payload_bytes, c.batch) == (payload_bytes, batch))

    def target_met(self) -> bool | None:
        """The happy path at the largest batch meets "<= 4 units per item" for items under 1 KB
        (None when no measured case has such an item)."""
        small = [c for c in self.cases if c.stored_item_bytes < TARGET_ITEM_BYTES]
        if not small:
            return None
        batch = max(c.batch for c in small)
        return all(c.per_item("write_units") <= TARGET_WRITE_UNITS for c in small if c.batch == batch)


@dataclass(frozen=True)
class MeteredService:
    """A service, a meter on both of its clients, a meter on the catalog's client alone, and an
    un-metered client on the same endpoint."""

    service: QueueService
    meter: CostMeter
    catalog_meter: CostMeter
    raw: DynamoDBClient


class PhaseMeter:
    """Charges each service call to a phase: reset before the call, snapshot after it."""

    def __init__(self, metered: MeteredService) -> None:
        self._meters = (metered.meter, metered.catalog_meter)
        self.totals: dict[str, PhaseCost] = {p: PhaseCost() for p in PHASES}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        for meter in self._meters:
            meter.reset()
        try:
            yield
        finally:
            everything, catalog = (meter.snapshot() for meter in self._meters)
            self.totals[name] = self.totals.get(name, PhaseCost()).plus(everything, catalog)


def metered_service(
    endpoint: str, *, clock: Clock | None = None, engine: int = DEFAULT_ENGINE
) -> MeteredService:
    """A service on fresh tables at ``endpoint`` with its clients metered (system clock by default);
    ``engine``: 3, the product's, items in engine v3's claim logs (docs/adr/0100); 2, engine v2's
    row per item alone (docs/adr/0050)."""
    client = dynamodb_client(endpoint)
    raw = dynamodb_client(endpoint)
    service = build_service(client, clock=clock or SystemClock(), engine=engine)
    catalog = service.catalog
    if not isinstance(catalog, DynamoDBQueueCatalog):
        raise TypeError(f"expected the DynamoDB catalog, got {type(catalog).__name__}")
    # The catalog is a PynamoDB model; its connection makes one botocore client (meter docstring).
    catalog_client = catalog._model._get_connection().connection.client
    meter, catalog_meter = CostMeter(raw), CostMeter(raw)
    meter.attach(client)
    meter.attach(catalog_client)
    catalog_meter.attach(catalog_client)
    return MeteredService(service=service, meter=meter, catalog_meter=catalog_meter, raw=raw)


def payload_of(size: int) -> bytes:
    return bytes(i % 251 for i in range(size))


def run_case(
    metered: MeteredService,
    *,
    payload_bytes: int,
    batch: int,
    count: int,
    queue_name: str | None = None,
    priority_of: Callable[[int], int] | None = None,
    group_of: Callable[[int], str] | None = None,
    delivery: str = "fifo",
    max_leased_per_group: int = 0,
) -> CaseResult:
    """Produce ``count`` items in requests of ``batch``, then lease and complete them all;
    ``priority_of(n)`` / ``group_of(n)`` give the ``n``-th item's priority and group (default: 5
    and none for all)."""
    service = metered.service
    # Fixed width: the queue name is part of every key, so it must not make one case's items larger.
    name = queue_name or f"cost-{payload_bytes:05d}-{batch:04d}"
    placeholder = datetime(2000, 1, 1, tzinfo=UTC)  # the service stamps its own times
    service.create_queue(
        QueueInfo(
            name=name,
            lease_timeout=LEASE_TIMEOUT,
            expire_timeout=EXPIRE_TIMEOUT,
            created_at=placeholder,
            updated_at=placeholder,
            delivery=delivery,
            max_leased_per_group=max_leased_per_group,
        )
    )
    phases = PhaseMeter(metered)
    payload = payload_of(payload_bytes)
    started = time.perf_counter()
    produced: list[str] = []
    partition = 0
    for start in range(0, count, batch):
        chunk = [
            NewItem(
                payload=payload,
                priority=priority_of(start + i) if priority_of else 5,
                group=group_of(start + i) if group_of else "",
            )
            for i in range(min(batch, count - start))
        ]
        with phases.phase("produce"):
            receipt = service.produce(name, chunk)
        produced.extend(receipt.ids)
        partition = receipt.partition
    stored_bytes = _stored_size(service, metered.raw, name, partition, produced[0])

    delivered: Counter[str] = Counter()
    # Every lease must return at least one item; a bounded loop cannot hang on a bug.
    for _ in range(count):
        if len(delivered) >= count:
            break
        try:
            with phases.phase("lease"):
                lease = service.lease(name, batch_size=batch, client_id="cost-benchmark")
        except NothingToLeaseError:
            break
        ids = [item.id for item in lease.items]
        with phases.phase("complete"):
            outcome = service.complete(name, lease.partition, ids)
        if outcome.failed:
            raise RuntimeError(f"complete failed on the happy path: {outcome.failed[:3]}")
        delivered.update(ids)
    seconds = time.perf_counter() - started
    return CaseResult(
        payload_bytes=payload_bytes,
        batch=batch,
        produced=len(produced),
        delivered=len(delivered),
        duplicates=sum(n - 1 for n in delivered.values()),
        missing=len(set(produced) - set(delivered)),
        stored_item_bytes=stored_bytes,
        phases=phases.totals,
        seconds=seconds,
    )


def _stored_size(service: QueueService, raw: DynamoDBClient, queue: str, partition: int, item_id: str) -> int:
    """``item_size`` of one stored item, read with the un-metered client."""
    store = service.store
    if not isinstance(store, DynamoDBItemStore):
        raise TypeError(f"expected the DynamoDB item store, got {type(store).__name__}")
    table = store._table
    position = parse_position_id(item_id)
    if position is not None:
        # Engine v3: the packed row holding the item, shared by its items (bytes per item).
        lane, at = position
        reply_rows = raw.query(
            TableName=table,
            KeyConditionExpression="pk = :pk AND sk <= :sk",
            ExpressionAttributeValues={
                ":pk": {"S": schema.log_rows_key(queue, partition, lane)},
                ":sk": {"S": f"{schema.LOG_ROW_PREFIX}{at:016x}"},
            },
            ScanIndexForward=False,
            Limit=1,
            ConsistentRead=True,
        )
        row = reply_rows["Items"][0]
        return item_size(row) // max(len(row[schema.LOG_ITEMS]["L"]), 1)
    reply = raw.get_item(TableName=table, Key=codec.item_key(queue, partition, item_id), ConsistentRead=True)
    return item_size(reply["Item"])


def measure(
    endpoint: str,
    *,
    payloads: Sequence[int] = PAYLOADS,
    batches: Sequence[int] = BATCHES,
    count: int = COUNT,
    engine: int = DEFAULT_ENGINE,
) -> CostReport:
    """Run every payload x batch case against the DynamoDB endpoint, one fresh queue per case."""
    metered = metered_service(endpoint, engine=engine)
    cases = [run_case(metered, payload_bytes=p, batch=b, count=count) for p in payloads for b in batches]
    return CostReport(cases=cases)


# -- command line -------------------------------------------------------------------------------


def format_report(report: CostReport, count: int) -> str:
    header = (
        f"{'case':<11} {'item B':>6} | {'req/item':>8} {'produce':>7} {'lease':>6} {'complete':>8}"
        f" {'catalog':>7} | {'WCU/item':>8} {'floor':>5} | {'RCU/item':>8} {'catalog':>7} |"
        f" {'failed':>6} {'dup/miss':>8} | {'s*':>5}"
    )
    lines = [
        f"DynamoDB cost per delivered item, product happy path (N={count} per case, 1 partition)",
        header,
        "-" * len(header),
    ]
    for c in report.cases:
        lines.append(
            f"{c.name:<11} {c.stored_item_bytes:>6} |"
            f" {c.per_item('requests'):>8.2f} {c.per_item('requests', 'produce'):>7.2f}"
            f" {c.per_item('requests', 'lease'):>6.2f} {c.per_item('requests', 'complete'):>8.2f}"
            f" {c.per_item('catalog_requests'):>7.2f} |"
            f" {c.per_item('write_units'):>8.2f} {c.floor_write_units:>5} |"
            f" {c.per_item('read_units'):>8.2f} {c.per_item('catalog_read_units'):>7.2f} |"
            f" {c.failed_conditional_writes:>6} {f'{c.duplicates}/{c.missing}':>8} | {c.seconds:>5.1f}"
        )
    lines += [
        "",
        "Columns: req/item = requests per delivered item, in total and by phase; 'catalog' = the part of",
        "the requests / read units spent reading the queue from the catalog table (once per service call).",
        "WCU = write units, RCU = read units per delivered item; failed = failed conditional writes;",
        "dup/miss = items delivered twice / never delivered (both must be 0).",
        "",
        "Write units per delivered item by phase (produce / lease / complete):",
    ]
    for c in report.cases:
        parts = " / ".join(f"{c.per_item('write_units', p):.2f}" for p in PHASES)
        lines.append(f"  {c.name:<11} {parts}")
    lines.append("")
    for payload in dict.fromkeys(c.payload_bytes for c in report.cases):
        sizes = sorted({c.stored_item_bytes for c in report.cases if c.payload_bytes == payload})
        shown = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
        units = write_units(sizes[-1])
        lines.append(
            f"Stored item with a {payload} B payload (as produced): {shown} B -> {units} write unit(s) per"
            f" write; floor {3 * units} per delivered item (produce + lease + complete)"
        )
    met = report.target_met()
    if met is not None:
        small = [c for c in report.cases if c.stored_item_bytes < TARGET_ITEM_BYTES]
        batch = max(c.batch for c in small)
        figures = ", ".join(f"{c.name}: {c.per_item('write_units'):.2f}" for c in small if c.batch == batch)
        lines.append(
            f"Target <= {TARGET_WRITE_UNITS} write units per delivered item, stored item under"
            f" {TARGET_ITEM_BYTES} B, batch {batch}: {'MET' if met else 'NOT MET'} ({figures})"
        )
    lines += [
        "",
        "Units: computed by benchmarks.meter from AWS's published rules (moto's ConsumedCapacity ignored).",
        "* seconds on a single-threaded moto server, with the meter's extra reads: not a speed measurement.",
    ]
    return "\n".join(lines)


def use_fake_credentials() -> None:
    """moto's fake keys, so nothing in this process can sign a request for a real account."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        os.environ[name] = "testing"
    os.environ["AWS_DEFAULT_REGION"] = "us-east-1"
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB"):
        os.environ.pop(name, None)


def add_engine_argument(parser: argparse.ArgumentParser) -> None:
    """``--engine N``: measure the service on engine N (``metered_service``; the product's by default)."""
    parser.add_argument(
        "--engine",
        type=int,
        choices=(2, 3),
        default=DEFAULT_ENGINE,
        help=f"3: engine v3's claim logs (docs/adr/0100); 2: engine v2 alone (docs/adr/0050);"
        f" default {DEFAULT_ENGINE}, the product's",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_COUNT} items per case instead of {COUNT}"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures to PATH")
    add_engine_argument(parser)
    args = parser.parse_args(argv)
    count = QUICK_COUNT if args.quick else COUNT
    use_fake_credentials()
    with moto_server_process() as endpoint:
        report = measure(endpoint, count=count, engine=args.engine)
    print(
        "engine v3: items in the claim logs (QueueService(log=...))"
        if args.engine == 3
        else "engine v2: a row per item (QueueService without a claim log)"
    )
    print(format_report(report, count))
    if args.json is not None:
        document = {
            "benchmark": "cost",
            "count": count,
            "target_met": report.target_met(),
            "cases": [c.summary() for c in report.cases],
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    broken = [c.name for c in report.cases if c.duplicates or c.missing]
    if broken:
        print(f"delivery broken in: {', '.join(broken)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
