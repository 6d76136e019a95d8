"""What a large payload costs: DynamoDB and S3 requests per item of 1,000 B, 64 KiB (the largest kept
in its row), 380,000 B and 1 MiB, priced beside SQS (docs/adr/0102-large-payloads.md).

Run ``uv run python -m benchmarks.payloads`` (``--count N`` items a case, ``--json PATH`` to keep
the figures).

Method
------
* Engine v3's claim log on DynamoDB with its payload bucket, the real ``QueueService`` over a
  single-threaded moto server (``querator.testing.moto_server_process``), as ``benchmarks.cost``
  runs it: ``metered_service`` builds the service with ``build_service(..., payloads=True)``, so a
  bucket ``<prefix>-payloads`` stands beside the tables on the same server. A payload over
  ``OBJECT_PAYLOAD_BYTES`` (64 KiB) is an S3 object; one up to that stays in its row.
* DynamoDB requests, read and write units: ``benchmarks.meter.CostMeter`` (AWS's published unit
  rules, catalog reads included), charged to phases by ``benchmarks.cost.PhaseMeter``. S3 requests:
  a ``before-call.s3`` hook on the bucket's boto3 client counts each call by operation (PutObject,
  GetObject, CopyObject, DeleteObjects, ListObjectsV2), reset and read around each phase the same way.
* Each case (payload size x batch size) gets fresh tables and a fresh bucket. ``count`` items are
  produced ``batch`` to a request, leased ``batch`` at a time and completed (the happy path). Then
  the dead-letter round: ``count`` more items are produced (not metered: the produce above), leased
  and retried ``dead`` into a dead-letter queue whose expire_timeout (7 days) is longer than the
  queue's (1 hour), so the object is copied to a key kept as long; redriven back; leased and
  completed. Last, one reaper run (its S3 listing: the sweep of objects past their time). The bucket
  is then listed with a separate, uncounted client: every object must be gone (exit 1 otherwise).
* Prices, USD: DynamoDB on demand $0.625 per million write units and $0.125 per million read units
  (``benchmarks.candidates_v3``); S3 Standard $0.005 per 1,000 PUT, COPY and LIST, $0.0004 per
  1,000 GET, DELETE free (DeleteObjects counted as DELETE). The S3 storage of an object for its
  item's time in flight is ignored (a 1 MiB object for a minute: $0.023 per GB-month is $0.0005
  per million item-minutes), and so are API Gateway and Lambda: the figures are the store's.
* SQS bills each 64 KB (65,536 B) chunk of a request's payload as one request, $0.40 per million
  (standard): a 1 MiB message is 16 requests to send and 16 to receive, plus 1 to delete. A batch
  of ``b`` messages is billed on its total size (a send or receive carries at most 1 MiB), its
  delete once. The SQS Extended Client keeps the payload in S3 instead: an S3 PUT, GET and DELETE
  plus 3 SQS requests of a small pointer message.
* Elapsed seconds are shown but mean nothing on moto (DESIGN.md: never judge speed on moto).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.candidates_v3 import PRICE_READ_UNIT, PRICE_WRITE_UNIT
from benchmarks.cost import PhaseCost, PhaseMeter, metered_service, payload_of, use_fake_credentials
from benchmarks.cost import _stored_size as stored_size
from querator.domain.errors import NothingToLeaseError
from querator.domain.model import MAX_PAYLOAD_BYTES, ROW_PAYLOAD_BYTES, NewItem, QueueInfo, RetryRequest
from querator.storage.dynamodb.objects import OBJECT_PAYLOAD_BYTES, PayloadObjects
from querator.testing import bucket_keys, moto_server_process, s3_client

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from botocore.client import BaseClient

    from benchmarks.cost import MeteredService
    from querator.domain.model import Item
    from querator.service import QueueService

UTC = timezone.utc

SIZES = (1_000, OBJECT_PAYLOAD_BYTES, ROW_PAYLOAD_BYTES, MAX_PAYLOAD_BYTES)
BATCHES = (1, 3)
COUNT = 12
#: The happy path, then the dead-letter round (lease, retry dead, redrive, lease, complete).
HAPPY = ("produce", "lease", "complete")
ROUND = ("dl:lease", "dl:dead", "dl:redrive", "dl:lease2", "dl:complete")
PHASES = (*HAPPY, *ROUND)
S3_OPERATIONS = ("PutObject", "GetObject", "CopyObject", "DeleteObjects", "ListObjectsV2")
LEASE_TIMEOUT = timedelta(minutes=5)
EXPIRE_TIMEOUT = timedelta(hours=1)
DEAD_EXPIRE_TIMEOUT = timedelta(days=7)

#: USD per million requests.
PRICE_S3_PUT = 5.0  # PUT, COPY, POST, LIST: $0.005 per 1,000
PRICE_S3_GET = 0.4  # GET: $0.0004 per 1,000
PRICE_S3 = {
    "PutObject": PRICE_S3_PUT,
    "GetObject": PRICE_S3_GET,
    "CopyObject": PRICE_S3_PUT,
    "DeleteObjects": 0.0,  # DELETE is free
    "ListObjectsV2": PRICE_S3_PUT,
}
PRICE_SQS = 0.40
#: SQS: one request per started chunk of this many bytes; a send or receive carries at most 1 MiB.
SQS_CHUNK = 65_536
SQS_REQUEST_BYTES = 1_048_576


class S3Counter:
    """Counts the S3 calls of a client by operation (thread-safe: a lease reads objects in threads)."""

    def __init__(self, client: BaseClient) -> None:
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        client.meta.events.register("before-call.s3", self._count, unique_id=f"payloads-s3-{id(self)}")

    def _count(self, model: Any, **_: Any) -> None:
        with self._lock:
            self._calls[model.name] += 1

    def reset(self) -> None:
        with self._lock:
            self._calls = Counter()

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._calls)


@dataclass
class Phases:
    """``PhaseMeter`` for DynamoDB and an ``S3Counter``, charged together around each call."""

    dynamodb: PhaseMeter
    s3: S3Counter
    s3_totals: dict[str, Counter[str]] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.s3.reset()
        try:
            with self.dynamodb.phase(name):
                yield
        finally:
            self.s3_totals.setdefault(name, Counter()).update(self.s3.snapshot())


@dataclass(frozen=True)
class Case:
    """The figures of one case, per item (``count`` items a phase)."""

    payload_bytes: int
    batch: int
    count: int
    #: Bytes of one item's share of its DynamoDB row as produced (``benchmarks.cost._stored_size``).
    row_bytes: int
    #: Per item, by phase: DynamoDB requests, write units, read units; S3 requests by operation.
    requests: dict[str, float]
    write_units: dict[str, float]
    read_units: dict[str, float]
    s3: dict[str, dict[str, float]]
    #: S3 requests of one reaper run (its sweep), not per item.
    reaper_s3: dict[str, int]
    objects_left: int
    seconds: float

    @property
    def name(self) -> str:
        return f"{self.payload_bytes}B x{self.batch}"

    def s3_of(self, phases: Sequence[str], op: str) -> float:
        return sum(self.s3[p].get(op, 0.0) for p in phases)

    def dollars(self, phases: Sequence[str] = HAPPY) -> dict[str, float]:
        """USD per million items over ``phases``: DynamoDB, S3 and their sum."""
        dynamodb = sum(
            self.write_units[p] * PRICE_WRITE_UNIT + self.read_units[p] * PRICE_READ_UNIT for p in phases
        )
        s3 = sum(self.s3_of(phases, op) * price for op, price in PRICE_S3.items())
        return {"dynamodb": dynamodb, "s3": s3, "total": dynamodb + s3}


def sqs_requests(payload_bytes: int, batch: int = 1) -> dict[str, float]:
    """SQS requests billed per message: send, receive (64 KB chunks of what each request carries,
    at most 1 MiB a request) and delete (one a batch)."""
    per_request = max(1, SQS_REQUEST_BYTES // payload_bytes)
    chunks = 0
    left = batch
    while left:
        carried = min(left, per_request, 10)
        chunks += math.ceil(carried * payload_bytes / SQS_CHUNK)
        left -= carried
    return {"send": chunks / batch, "receive": chunks / batch, "delete": 1 / batch}


def sqs_dollars(payload_bytes: int, batch: int = 1) -> float:
    """USD per million messages sent, received and deleted on SQS standard."""
    return sum(sqs_requests(payload_bytes, batch).values()) * PRICE_SQS


def extended_client_dollars(batch: int = 1) -> dict[str, float]:
    """USD per million messages of the SQS Extended Client: an S3 PUT, GET and DELETE each, plus
    3 SQS requests of a small pointer message (batched ``batch`` to a request)."""
    s3 = PRICE_S3_PUT + PRICE_S3_GET
    sqs = sum(sqs_requests(1_000, batch).values()) * PRICE_SQS
    return {"s3": s3, "sqs": sqs, "total": s3 + sqs}


def _queue(service: QueueService, name: str, *, expire: timedelta, dead_queue: str = "") -> None:
    placeholder = datetime(2000, 1, 1, tzinfo=UTC)  # the service stamps its own times
    service.create_queue(
        QueueInfo(
            name=name,
            lease_timeout=LEASE_TIMEOUT,
            expire_timeout=expire,
            dead_queue=dead_queue,
            created_at=placeholder,
            updated_at=placeholder,
        )
    )


def _produce(
    service: QueueService, queue: str, payload: bytes, count: int, batch: int
) -> tuple[list[str], int]:
    ids: list[str] = []
    partition = 0
    for start in range(0, count, batch):
        receipt = service.produce(queue, [NewItem(payload=payload) for _ in range(min(batch, count - start))])
        ids += receipt.ids
        partition = receipt.partition
    return ids, partition


def _lease_all(
    service: QueueService, phases: Phases, phase: str, queue: str, count: int, batch: int, size: int
) -> Iterator[tuple[int, list[Item]]]:
    """Lease ``count`` items ``batch`` at a time, charging each lease to ``phase``; yields each
    lease's partition and items (their payloads checked: an object read back whole)."""
    leased = 0
    for _ in range(2 * count):  # bounded: every lease of a full queue returns an item
        if leased >= count:
            return
        try:
            with phases.phase(phase):
                lease = service.lease(queue, batch_size=batch, client_id="payloads")
        except NothingToLeaseError:
            break
        for item in lease.items:
            if len(item.payload) != size:
                raise RuntimeError(f"{queue}: leased a payload of {len(item.payload)} B, not {size}")
        leased += len(lease.items)
        yield lease.partition, lease.items
    if leased < count:
        raise RuntimeError(f"{queue}: leased {leased} of {count}")


def run_case(metered: MeteredService, endpoint: str, *, payload_bytes: int, batch: int, count: int) -> Case:
    service = metered.service
    bucket = getattr(service.log, "payloads", None)
    if not isinstance(bucket, PayloadObjects):
        raise TypeError("expected engine v3's claim log with a payload bucket (build_service(payloads=True))")
    counter = S3Counter(bucket._client)
    phases = Phases(PhaseMeter(metered), counter)
    phases.dynamodb.totals = {p: PhaseCost() for p in PHASES}
    # Fixed width, as benchmarks.cost's: the queue name is in every key.
    name = f"big-{payload_bytes:07d}-{batch}"
    dead = f"{name}-d"
    _queue(service, dead, expire=DEAD_EXPIRE_TIMEOUT)
    _queue(service, name, expire=EXPIRE_TIMEOUT, dead_queue=dead)
    payload = payload_of(payload_bytes)
    started = time.perf_counter()

    # The happy path: produce, lease, complete.
    produced: list[str] = []
    partition = 0
    for start in range(0, count, batch):
        chunk = [NewItem(payload=payload) for _ in range(min(batch, count - start))]
        with phases.phase("produce"):
            receipt = service.produce(name, chunk)
        produced += receipt.ids
        partition = receipt.partition
    row_bytes = stored_size(service, metered.raw, name, partition, produced[0])
    for at, items in _lease_all(service, phases, "lease", name, count, batch, payload_bytes):
        with phases.phase("complete"):
            outcome = service.complete(name, at, [i.id for i in items])
        if outcome.failed:
            raise RuntimeError(f"complete failed: {outcome.failed[:3]}")

    # The dead-letter round: lease, retry dead, redrive, lease, complete.
    _produce(service, name, payload, count, batch)
    for at, items in _lease_all(service, phases, "dl:lease", name, count, batch, payload_bytes):
        with phases.phase("dl:dead"):
            outcome = service.retry(name, at, [RetryRequest(id=i.id, dead=True) for i in items])
        if outcome.failed:
            raise RuntimeError(f"retry dead failed: {outcome.failed[:3]}")
    moved = 0
    for _ in range(count):
        with phases.phase("dl:redrive"):
            reply = service.redrive(dead, limit=1000)
        moved += reply.moved
        if not reply.remaining or not reply.moved:
            break
    if moved != count:
        raise RuntimeError(f"redrive moved {moved} of {count}")
    for at, items in _lease_all(service, phases, "dl:lease2", name, count, batch, payload_bytes):
        with phases.phase("dl:complete"):
            outcome = service.complete(name, at, [i.id for i in items])
        if outcome.failed:
            raise RuntimeError(f"complete after redrive failed: {outcome.failed[:3]}")

    # One reaper run: its sweep lists the bucket.
    with phases.phase("reaper"):
        service.reap(datetime.now(UTC), timedelta(seconds=30))
    seconds = time.perf_counter() - started
    left = len(bucket_keys(PayloadObjects(s3_client(endpoint), bucket.bucket)))

    totals = phases.dynamodb.totals
    per = float(count)
    return Case(
        payload_bytes=payload_bytes,
        batch=batch,
        count=count,
        row_bytes=row_bytes,
        requests={p: totals[p].requests / per for p in PHASES},
        write_units={p: totals[p].write_units / per for p in PHASES},
        read_units={p: totals[p].read_units / per for p in PHASES},
        s3={p: {op: phases.s3_totals.get(p, Counter())[op] / per for op in S3_OPERATIONS} for p in PHASES},
        reaper_s3={op: phases.s3_totals["reaper"][op] for op in S3_OPERATIONS},
        objects_left=left,
        seconds=seconds,
    )


def measure(
    endpoint: str,
    *,
    sizes: Sequence[int] = SIZES,
    batches: Sequence[int] = BATCHES,
    count: int = COUNT,
) -> list[Case]:
    """Every size x batch case on fresh tables and a fresh bucket at the moto server ``endpoint``."""
    return [
        run_case(metered_service(endpoint, engine=3), endpoint, payload_bytes=size, batch=batch, count=count)
        for size in sizes
        for batch in batches
    ]


# -- command line -------------------------------------------------------------------------------

_SHORT = {
    "PutObject": "put",
    "GetObject": "get",
    "CopyObject": "copy",
    "DeleteObjects": "del",
    "ListObjectsV2": "list",
}


def format_report(cases: Sequence[Case]) -> str:
    count = cases[0].count if cases else 0
    s3_header = " ".join(f"{_SHORT[op]:>5}" for op in S3_OPERATIONS)
    header = f"{'case':<13} {'phase':<11} | {'DDB req':>7} {'RCU':>7} {'WCU':>7} | S3 {s3_header}"
    lines = [
        f"Engine v3 on DynamoDB + payload bucket: per item (N={count} a case, 1 partition, moto server)",
        header,
        "-" * len(header),
    ]
    for c in cases:
        for p in PHASES:
            s3 = " ".join(f"{c.s3[p][op]:>5.2f}" for op in S3_OPERATIONS)
            lines.append(
                f"{c.name:<13} {p:<11} | {c.requests[p]:>7.2f} {c.read_units[p]:>7.2f}"
                f" {c.write_units[p]:>7.2f} |    {s3}"
            )
        happy = " ".join(f"{c.s3_of(HAPPY, op):>5.2f}" for op in S3_OPERATIONS)
        lines.append(
            f"{c.name:<13} {'happy path':<11} | {sum(c.requests[p] for p in HAPPY):>7.2f}"
            f" {sum(c.read_units[p] for p in HAPPY):>7.2f} {sum(c.write_units[p] for p in HAPPY):>7.2f}"
            f" |    {happy}"
        )
        reaper = ", ".join(f"{_SHORT[op]} {n}" for op, n in c.reaper_s3.items() if n) or "none"
        lines.append(
            f"{c.name:<13} row {c.row_bytes:,} B/item; one reaper run's S3 requests: {reaper};"
            f" objects left: {c.objects_left}; {c.seconds:.1f} s*"
        )
        lines.append("")
    lines += [
        "phases: produce / lease / complete = the happy path; dl:* = the dead-letter round (lease, retry",
        "dead into a DLQ expiring in 7 days against the queue's 1 hour, redrive back, lease, complete).",
        "DDB req / RCU / WCU = DynamoDB requests, read and write units per item (benchmarks.meter, catalog",
        "reads included); S3 = S3 requests per item by operation: put = PutObject, get = GetObject,",
        "copy = CopyObject, del = DeleteObjects, list = ListObjectsV2.",
        "",
        "USD per million delivered items, happy path (DynamoDB on demand + S3 Standard requests; S3 storage",
        "in flight, API Gateway and Lambda left out) against SQS standard ($0.40 per million requests, a",
        "request per 64 KB chunk):",
    ]
    header2 = (
        f"{'case':<13} | {'DynamoDB':>8} {'S3':>6} {'querator':>8} | {'SQS req':>7} {'SQS':>6} |"
        f" {'ratio':>6} | {'dead-letter round':>17}"
    )
    lines += [header2, "-" * len(header2)]
    for c in cases:
        price = c.dollars()
        sqs_req = sum(sqs_requests(c.payload_bytes, c.batch).values())
        sqs = sqs_dollars(c.payload_bytes, c.batch)
        lines.append(
            f"{c.name:<13} | {price['dynamodb']:>8.2f} {price['s3']:>6.2f} {price['total']:>8.2f} |"
            f" {sqs_req:>7.2f} {sqs:>6.2f} | {price['total'] / sqs:>5.1f}x |"
            f" {c.dollars(ROUND)['total']:>17.2f}"
        )
    for batch in sorted({c.batch for c in cases}):
        ext = extended_client_dollars(batch)
        big = [c for c in cases if c.batch == batch and c.payload_bytes > OBJECT_PAYLOAD_BYTES]
        versus = "; ".join(f"querator {c.name} {c.dollars()['total'] / ext['total']:.2f}x" for c in big)
        lines.append(
            f"SQS Extended Client, batch {batch} (S3 PUT + GET + DELETE, 3 SQS requests): ${ext['total']:.2f}"
            f" per million (S3 ${ext['s3']:.2f} + SQS ${ext['sqs']:.2f})" + (f"; {versus}" if versus else "")
        )
    lines += [
        "",
        "ratio = querator / SQS; dead-letter round = the same prices over the dl:* phases, per item.",
        "* seconds on a single-threaded moto server, with the meter's extra reads: not a speed measurement.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=COUNT, help=f"items per case (default {COUNT})")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures to PATH")
    args = parser.parse_args(argv)
    use_fake_credentials()
    with moto_server_process() as endpoint:
        cases = measure(endpoint, count=args.count)
    print(format_report(cases))
    if args.json is not None:
        document = {
            "benchmark": "payloads",
            "count": args.count,
            "cases": [
                {
                    **asdict(c),
                    "case": c.name,
                    "usd_per_million_happy": c.dollars(),
                    "usd_per_million_dead_letter_round": c.dollars(ROUND),
                    "sqs_requests": sqs_requests(c.payload_bytes, c.batch),
                    "sqs_usd_per_million": sqs_dollars(c.payload_bytes, c.batch),
                }
                for c in cases
            ],
            "sqs_extended_client_usd_per_million": {b: extended_client_dollars(b) for b in BATCHES},
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    left = [f"{c.name}: {c.objects_left}" for c in cases if c.objects_left]
    if left:
        print(f"payload objects left in the bucket: {', '.join(left)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
