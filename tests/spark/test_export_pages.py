"""The export's read of a partition, without Spark: every item, however its listing pages end."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from querator.domain.model import NewItem, QueueInfo
from querator.service.tuning import MAX_REPLY_BYTES
from querator.spark.export import PAGE_SIZE, iter_partition
from querator.testing import FakeClock, memory_service

#: ``datetime.UTC`` is Python 3.11+; the Spark suite runs on 3.10 too (docs/adr/0021).
UTC = timezone.utc
START = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_partition_of_items_larger_than_a_page_of_replies_is_read_whole() -> None:
    # GIVEN items whose payloads fill a listing's reply cap long before its 1,000-item limit
    service = memory_service(clock=FakeClock(START))
    service.create_queue(
        QueueInfo(
            name="big",
            lease_timeout=timedelta(minutes=1),
            expire_timeout=timedelta(days=1),
            created_at=START,
            updated_at=START,
        )
    )
    size = 200_000
    count = 2 * MAX_REPLY_BYTES // size + 3
    assert count < PAGE_SIZE
    for n in range(count):
        service.produce("big", [NewItem(payload=n.to_bytes(4, "big") * (size // 4))])
    assert len(service.list_items("big", 0)) < count  # one page does not hold them

    # WHEN the export reads the partition
    read = [item for item, scheduled in iter_partition(service, "big", 0) if not scheduled]

    # THEN it has every item once, in order
    assert [int.from_bytes(item.payload[:4], "big") for item in read] == list(range(count))
