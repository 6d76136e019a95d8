"""Contention: failed conditional writes per leased item as concurrent consumers grow.

Run ``uv run python -m benchmarks.contention`` (``--quick`` for a smaller run). Each case produces
``COUNT`` items (100-byte payloads) into a fresh queue with the given number of partitions, then
``consumers`` threads lease ``batch`` at a time and complete each lease at once until the queue is
empty. It prints, per case: failed conditional writes (lost claims; DynamoDB charges them) per leased
item, write units per delivered item, requests per delivered item, and whether every item was delivered
exactly once. The store is a single-threaded moto server on 127.0.0.1, so the figures show how often
consumers collide, not how fast DynamoDB is; thread scheduling makes them vary a little run to run.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from benchmarks.candidates import drain_in_threads
from benchmarks.cost import add_engine_argument, metered_service, payload_of, use_fake_credentials
from querator.config import DEFAULT_ENGINE
from querator.domain.model import NewItem, QueueInfo
from querator.testing import moto_server_process

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

COUNT = 400
QUICK_COUNT = 100
BATCH = 10
CONSUMERS = (1, 4, 8, 16)
PARTITIONS = (1, 4)


@dataclass(frozen=True)
class ContentionCase:
    consumers: int
    partitions: int
    batch: int
    leased: int
    delivered: int
    produced: int
    failed_conditional_writes: int
    write_units: float
    requests: int

    @property
    def exactly_once(self) -> bool:
        return self.leased == self.delivered == self.produced

    def per_item(self, value: float) -> float:
        return value / self.delivered if self.delivered else 0.0


def run(
    endpoint: str, *, consumers: int, partitions: int, batch: int, count: int, engine: int = DEFAULT_ENGINE
) -> ContentionCase:
    metered = metered_service(endpoint, engine=engine)
    service = metered.service
    name = f"contend-{secrets.token_hex(4)}"
    placeholder = datetime(2000, 1, 1, tzinfo=UTC)  # the service stamps its own times
    service.create_queue(
        QueueInfo(
            name=name,
            partitions=partitions,
            lease_timeout=timedelta(minutes=5),
            expire_timeout=timedelta(hours=1),
            created_at=placeholder,
            updated_at=placeholder,
        )
    )
    produced: list[str] = []
    for start in range(0, count, 100):
        chunk = [NewItem(payload=payload_of(100)) for _ in range(min(100, count - start))]
        produced += service.produce(name, chunk).ids
    metered.meter.reset()
    metered.catalog_meter.reset()

    delivered = drain_in_threads(service, name, consumers=consumers, batch=batch)
    snap = metered.meter.snapshot()
    catalog = metered.catalog_meter.snapshot()
    return ContentionCase(
        consumers=consumers,
        partitions=partitions,
        batch=batch,
        leased=sum(delivered.values()),
        delivered=len(set(delivered) & set(produced)),
        produced=len(produced),
        failed_conditional_writes=snap.failed_conditional_writes,
        write_units=snap.write_units,
        # Catalog reads (one per service call) are the same for any data model; left out as elsewhere.
        requests=snap.requests - catalog.requests,
    )


def format_table(cases: list[ContentionCase]) -> str:
    lines = [
        f"{'consumers':>9} {'partitions':>10} {'batch':>5} {'failed CW/leased':>16} "
        f"{'WCU/item':>8} {'req/item':>8} {'exactly once':>12}",
    ]
    for c in cases:
        lines.append(
            f"{c.consumers:>9} {c.partitions:>10} {c.batch:>5} "
            f"{c.per_item(c.failed_conditional_writes):>16.2f} {c.per_item(c.write_units):>8.2f} "
            f"{c.per_item(c.requests):>8.2f} {'yes' if c.exactly_once else 'NO':>12}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_COUNT} items per case")
    parser.add_argument("--consumers", type=int, nargs="*", default=list(CONSUMERS))
    parser.add_argument("--partitions", type=int, nargs="*", default=list(PARTITIONS))
    add_engine_argument(parser)
    args = parser.parse_args(argv)
    use_fake_credentials()
    count = QUICK_COUNT if args.quick else COUNT
    cases = []
    with moto_server_process() as endpoint:
        for partitions in args.partitions:
            for consumers in args.consumers:
                cases.append(
                    run(
                        endpoint,
                        consumers=consumers,
                        partitions=partitions,
                        batch=BATCH,
                        count=count,
                        engine=args.engine,
                    )
                )
    engine = " (engine v3: the claim log)" if args.engine == 3 else " (engine v2: a row per item)"
    print(f"contention{engine}: {count} items of 100 B per case, lease batch {BATCH}, lease then complete")
    print(format_table(cases))
    return 0 if all(c.exactly_once for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
