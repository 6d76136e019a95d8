"""A write that lands late (its ids minted before it waited for the store) is leasable at once.

Ids are minted when a call starts; the write may then wait (another writer of the same SQLite file
holds the lock) while leases move the cursor on. Where the store can check it in the write's own
transaction (memory, SQLite), the item is the next one leased, in FIFO order, not two minutes
later by the straggler sweep. DynamoDB keeps its one-second cursor lag and the sweep
(docs/adr/0050-engine-v2.md), so these run on the embedded stores.
"""

from __future__ import annotations

import sqlite3
import threading
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest

from querator.domain.errors import NothingToLeaseError
from querator.testing import FakeClock, sqlite_service
from tests.contract.helpers import beside, items, make_queue

if TYPE_CHECKING:
    from pathlib import Path

    from querator.service import QueueService


def _drain(service: QueueService) -> list[bytes]:
    leased: list[bytes] = []
    for _ in range(20):
        try:
            lease = service.lease("jobs", batch_size=10, client_id="drain")
        except NothingToLeaseError:
            break
        leased += [item.payload for item in lease.items]
    return leased


@pytest.mark.parametrize("group", ["", "tenant"], ids=["band", "group-lane"])
def test_items_written_below_the_cursor_are_leased_next_in_fifo_order(
    embedded: QueueService, clock: FakeClock, group: str
) -> None:
    make_queue(embedded, **({"delivery": "fair"} if group else {}))
    # A producer whose ids were minted 3 s ago (it waited that long for the lock) writes after the
    # lease below moved the cursor past them.
    late_clock = FakeClock(clock.now())
    late = beside(embedded, late_clock)
    clock.advance(timedelta(seconds=3))
    embedded.produce("jobs", items("a", "b", group=group))
    assert [i.payload for i in embedded.lease("jobs", batch_size=5, client_id="w").items] == [b"a", b"b"]
    clock.advance(timedelta(seconds=3))  # past the cursor's one-second lag: it moves past "a" and "b"
    embedded.produce("jobs", items("c", group=group))
    assert [i.payload for i in embedded.lease("jobs", batch_size=5, client_id="w").items] == [b"c"]

    late.produce("jobs", items("late-1", "late-2", group=group))
    embedded.produce("jobs", items("d", group=group))

    assert _drain(embedded) == [b"late-1", b"late-2", b"d"]


def test_a_produce_that_waited_for_the_sqlite_write_lock_is_leasable_at_once_in_order(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The issue's case: another writer of the file holds its lock for a while (3 s here, real time)
    during a produce; leases go on meanwhile. Every acknowledged item is leasable as soon as the
    lock is released, oldest first."""
    path = tmp_path / "querator.db"
    service = sqlite_service(path, clock=clock)
    make_queue(service)
    service.produce("jobs", items("early"))
    clock.advance(timedelta(seconds=3))

    other_writer = sqlite3.connect(path, isolation_level=None)
    other_writer.execute("BEGIN IMMEDIATE")  # the second writer takes the file's write lock
    acknowledged = threading.Event()
    failures: list[BaseException] = []

    def produce_late() -> None:
        try:
            service.produce("jobs", items("waited"))  # ids minted now, then it waits for the lock
            acknowledged.set()
        except BaseException as exc:  # reported by the test below
            failures.append(exc)

    producer = threading.Thread(target=produce_late)
    producer.start()
    try:
        assert not acknowledged.wait(3.0), "the produce did not wait for the lock"
        clock.advance(timedelta(seconds=3))
    finally:
        other_writer.execute("COMMIT")
        other_writer.close()
    # Right after the release a lease (at the later time) usually takes the lock before the waiting
    # produce, whose busy handler polls every 100 ms by now, and moves the cursor past its ids.
    first = service.lease("jobs", batch_size=10, client_id="w")
    producer.join(timeout=15)
    assert not producer.is_alive() and not failures and acknowledged.is_set()
    service.produce("jobs", items("after"))

    leased = [i.payload for i in first.items] + _drain(service)
    assert leased == [b"early", b"waited", b"after"]
