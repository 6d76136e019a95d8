"""DynamoDB work per item of ``queue.redrive``, on dead-letter queues of growing size.

Run ``uv run python -m benchmarks.redrive`` (``--stored N ...`` for other sizes, ``--quick`` for a
smaller run).

Method: the real ``QueueService`` on DynamoDB (moto in process, a functional store only) with every
request metered by ``benchmarks.meter.CostMeter`` (AWS's unit rules; a transaction counts 2x).
Dead letters are written straight into the dead-letter queue (as the reaper's move leaves them:
``source_queue`` set), then:

* ``one call``: a single ``queue.redrive`` of 1,000 items, on a dead-letter queue of N items: what
  an operator's first call costs, whatever the queue holds;
* ``behind leases``: the same call with 1,000 of the oldest dead letters leased (an inspector
  holding them): the read passes them, the moves do not change;
* ``behind stranded``: the same with 1,000 of the oldest from a deleted queue (left in place);
* ``drain``: calls until ``remaining`` is 0 on the smallest size, per item moved.

Timings are not AWS's (moto), so none are printed.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from moto import mock_aws

from benchmarks.meter import CostMeter
from querator.domain import lifecycle
from querator.domain.ids import IdFactory
from querator.domain.model import Item, QueueInfo
from querator.testing import SystemClock, build_service, dynamodb_client

if TYPE_CHECKING:
    from querator.service import QueueService

#: Payload of every item (the contract's reference size).
PAYLOAD = b"x" * 100
LIMIT = 1000
PLACEHOLDER = datetime(2000, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Row:
    case: str
    stored: int
    calls: int
    moved: int
    requests: int
    write_units: float
    read_units: float

    def line(self) -> str:
        per = max(self.moved, 1)
        return (
            f"| {self.case} | {self.stored:,} | {self.calls} | {self.moved:,} | {self.requests / per:.2f} |"
            f" {self.write_units / per:.2f} | {self.read_units / per:.2f} |"
        )


def _queue(service: QueueService, name: str, **fields: object) -> None:
    service.create_queue(
        QueueInfo(
            name=name,
            lease_timeout=timedelta(minutes=5),
            expire_timeout=timedelta(days=7),
            created_at=PLACEHOLDER,
            updated_at=PLACEHOLDER,
            **fields,  # type: ignore[arg-type]
        )
    )


def _fill(service: QueueService, ids: IdFactory, count: int, source: str) -> None:
    now = datetime.now(timezone.utc)
    for start in range(0, count, 1000):
        batch = [
            Item(
                id=ids.new_id(now),
                payload=PAYLOAD,
                attempts=5,
                created_at=now,
                expire_deadline=lifecycle.expire_deadline(now, timedelta(days=7)),
                source_id="0" * 30,
                source_queue=source,
            )
            for _ in range(min(1000, count - start))
        ]
        service.store.put_new("dlq", 0, batch, now=now)


def measure(stored: int, case: str) -> Row:
    with mock_aws():
        client, raw = dynamodb_client(), dynamodb_client()
        ids = IdFactory()
        service = build_service(client, clock=SystemClock(), ids=ids)
        _queue(service, "dlq")
        _queue(service, "jobs", dead_queue="dlq")
        _queue(service, "gone", dead_queue="dlq")
        ahead = min(LIMIT, stored)
        if case == "behind stranded":
            _fill(service, ids, ahead, "gone")
            service.delete_queue("gone")
            _fill(service, ids, stored - ahead, "jobs")
        else:
            _fill(service, ids, stored, "jobs")
        if case == "behind leases":
            held = 0
            while held < ahead:  # a lease claims for a few seconds at most: moto may need several
                held += len(service.lease("dlq", batch_size=ahead - held, client_id="inspector").items)
        meter = CostMeter(raw)
        meter.attach(client)
        calls = moved = 0
        while True:
            reply = service.redrive("dlq", limit=LIMIT)
            calls, moved = calls + 1, moved + reply.moved
            if case != "drain" or not reply.remaining or not reply.moved:
                break
        snapshot = meter.snapshot()
        expected = stored if case == "drain" else min(LIMIT, stored - (ahead if "behind" in case else 0))
        if moved != expected:
            raise RuntimeError(f"{case}: moved {moved} of {expected}")
        return Row(case, stored, calls, moved, snapshot.requests, snapshot.write_units, snapshot.read_units)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stored", type=int, nargs="+", default=[2_000, 20_000, 100_000])
    parser.add_argument("--quick", action="store_true", help="1,000 and 5,000 stored")
    args = parser.parse_args(argv)
    sizes = [1_000, 5_000] if args.quick else args.stored
    print("Per item moved by queue.redrive (100 B items, limit 1,000 a call):\n")
    print("| case | dead letters stored | calls | moved | requests | write units | read units |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for stored in sizes:
        for case in ("one call", "behind leases", "behind stranded"):
            print(measure(stored, case).line(), flush=True)
    print(measure(min(sizes), "drain").line())
    print("\n(moto in process; units by benchmarks.meter, AWS's rules, transactions 2x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
