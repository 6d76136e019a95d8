"""Histories recorded from four concurrent consumers on every store are linearizable against the FIFO
lease queue (tests/linearizability/fifo.py): a lease never hands out a newer item while an older one
waits, under contention too (docs/api.md, docs/ordering.md: oldest first within a partition).

One partition, one producer, four consumers leasing one item (or up to three) at a time, with
retries to the tail and leases left to run out; the real clock. While a consumer that lost a claim
jumped to a random one of its candidates, these histories were rejected: memory 20 of 20 (leases of
one) and 19 of 20 (of up to three), SQLite the same, the moto server 4 of 4 each
(docs/adr/0050-engine-v2.md, Contention). On the embedded stores each call answers after a random
pause of up to 2 ms (``NetworkLike``), as over a network: without it the consumers of one process
rarely come between a lease's read and its claims, and the memory store passed 20 of 20 with the
jump.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest

from querator.clock import SystemClock
from querator.service import QueueService
from querator.storage.memory import InMemoryClaimLog, InMemoryItemStore, InMemoryQueueCatalog
from querator.storage.sqlite import SQLiteClaimLog, SQLiteDatabase, SQLiteItemStore, SQLiteQueueCatalog
from querator.testing import build_service, dynamodb_client
from tests.linearizability.fifo import check
from tests.linearizability.recorder import NetworkLike, make_queue, record

if TYPE_CHECKING:
    from pathlib import Path

ITEMS = 40
#: Histories per case on the embedded stores (about 1.5 s each, most of it an abandoned lease's
#: second); one on the moto server, where four consumers share one single-threaded server.
RUNS = 3


def embedded_service(store: str, directory: Path, seed: int, engine: int = 2) -> QueueService:
    """The store answering after network-like pauses (``NetworkLike``), so consumers race;
    ``engine=3``: FIFO queues in engine v3's claim log, which answers after such pauses too."""
    log: InMemoryClaimLog | SQLiteClaimLog
    if store == "memory":
        catalog, items, log = InMemoryQueueCatalog(), InMemoryItemStore(), InMemoryClaimLog()
    else:
        database = SQLiteDatabase(directory / "lin.db")
        catalog, items = SQLiteQueueCatalog(database), SQLiteItemStore(database)
        log = SQLiteClaimLog(database)
    return QueueService(
        catalog=catalog,
        store=NetworkLike(items, seed=seed),
        clock=SystemClock(),
        log=NetworkLike(log, seed=seed + 1) if engine == 3 else None,
    )


@pytest.mark.parametrize("engine", [2, 3], ids=["engine-v2", "engine-v3"])
@pytest.mark.parametrize("max_batch", [1, 3], ids=["leases-of-one", "leases-of-a-few"])
@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_concurrent_consumers_lease_oldest_first_on_embedded_stores(store, max_batch, engine, tmp_path):
    seed = random.randrange(1_000_000)
    kinds: list[str] = []
    for run in range(RUNS):
        # GIVEN a fresh queue with one partition
        (tmp_path / f"run-{run}").mkdir()
        service = embedded_service(store, tmp_path / f"run-{run}", seed + run, engine)
        make_queue(service, "lin")
        # WHEN one producer and four consumers run until every item is completed
        history = record(service, "lin", items=ITEMS, max_batch=max_batch, seed=seed + run)
        # THEN the history is linearizable against the FIFO model
        verdict = check(history)
        assert verdict.linearizable, f"seed {seed + run}: {verdict.explain()}"
        kinds += [op.kind for op in history]
    # The runs exercised what they are meant to: items back at the tail by retry and by expiry.
    assert kinds.count("retry") > 0
    assert kinds.count("expire") > 0


@pytest.mark.slow
@pytest.mark.server
@pytest.mark.parametrize("engine", [2, 3], ids=["engine-v2", "engine-v3"])
@pytest.mark.parametrize("max_batch", [1, 3], ids=["leases-of-one", "leases-of-a-few"])
def test_concurrent_consumers_lease_oldest_first_on_dynamodb(moto_server, max_batch, engine):
    # GIVEN the DynamoDB store on the moto server (conditional writes atomic, as on DynamoDB); a
    # lease call there takes about a second under four consumers, so leases last 5 s
    seed = random.randrange(1_000_000)
    service = build_service(dynamodb_client(moto_server, max_pool=16), clock=SystemClock(), engine=engine)
    queue = f"lin-{seed}-{max_batch}-{engine}"
    make_queue(service, queue, lease=timedelta(seconds=5))
    # WHEN one producer and four consumers run until every item is completed
    history = record(service, queue, items=30, max_batch=max_batch, seed=seed)
    # THEN the history is linearizable against the FIFO model
    verdict = check(history)
    assert verdict.linearizable, f"seed {seed}: {verdict.explain()}"
