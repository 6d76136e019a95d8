"""The contract suite runs every behaviour against each store the tests can reach."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from moto import mock_aws

from benchmarks.meter import CostMeter
from querator.config import DEFAULT_ENGINE
from querator.storage.dynamodb import schema
from querator.storage.dynamodb.log import DynamoDBClaimLog
from querator.storage.memory import InMemoryClaimLog
from querator.storage.sqlite import SQLiteClaimLog, SQLiteDatabase
from querator.testing import build_service, dynamodb_client, memory_service, sqlite_service

if TYPE_CHECKING:
    from collections.abc import Iterator

    from mypy_boto3_dynamodb import DynamoDBClient

    from querator.ports.log import ClaimLog
    from querator.service import QueueService
    from querator.testing import FakeClock


#: Every store the suite runs on; ``metered`` tests (DynamoDB's units) run on the DynamoDB ones only.
STORES = ["memory", "sqlite", "moto", "moto_server"]
#: The engine the suite runs on (every store): the product's; QUERATOR_TEST_ENGINE=2 runs it on engine v2.
ENGINE = int(os.environ.get("QUERATOR_TEST_ENGINE", str(DEFAULT_ENGINE)))


def _pinned_engine(request: pytest.FixtureRequest) -> int | None:
    """The engine a test is pinned to with ``@pytest.mark.engine(n)`` (a promise of that engine's
    internals, or its form of a promise both keep), else ``None``."""
    marker = request.node.get_closest_marker("engine")
    return None if marker is None else int(marker.args[0])


@pytest.fixture(params=STORES)
def service(request: pytest.FixtureRequest, clock: FakeClock) -> Iterator[QueueService]:
    pinned = _pinned_engine(request)
    engine = ENGINE if pinned is None else pinned
    if request.param == "memory":
        yield memory_service(clock=clock, engine=engine)
    elif request.param == "sqlite":
        yield sqlite_service(request.getfixturevalue("tmp_path") / "querator.db", clock=clock, engine=engine)
    elif request.param == "moto":
        with mock_aws():
            yield build_service(dynamodb_client(), clock=clock, engine=engine)
    else:
        endpoint = request.getfixturevalue("moto_server")
        yield build_service(dynamodb_client(endpoint), clock=clock, engine=engine)


#: The stores that keep items in sorted rows in this process (``storage.embedded``): for behaviours
#: only they promise, and for many-case suites that would be slow over moto.
EMBEDDED_STORES = ["memory", "sqlite"]


@pytest.fixture(params=EMBEDDED_STORES)
def embedded(request: pytest.FixtureRequest, clock: FakeClock) -> QueueService:
    if request.param == "memory":
        return memory_service(clock=clock)
    return sqlite_service(request.getfixturevalue("tmp_path") / "querator.db", clock=clock)


@dataclass
class Metered:
    """A service whose DynamoDB calls a ``CostMeter`` counts, and the client under it."""

    service: QueueService
    meter: CostMeter
    client: DynamoDBClient


#: A metered test counts the requests botocore sends and the units they cost, which are the same
#: whether moto runs in process or as a server; the server's run (the HTTP path and the store's
#: parallel requests on a real connection pool) is slow, so it runs where the slow suites do (CI).
METERED_STORES = ["moto", pytest.param("moto_server", marks=pytest.mark.slow)]


@pytest.fixture(params=METERED_STORES)
def metered(request: pytest.FixtureRequest, clock: FakeClock) -> Iterator[Metered]:
    """Like ``service``, with every store request metered (requests and DynamoDB's units)."""
    pinned = _pinned_engine(request)
    engine = ENGINE if pinned is None else pinned
    if request.param == "moto":
        with mock_aws():
            client, raw = dynamodb_client(), dynamodb_client()
            meter = CostMeter(raw)
            meter.attach(client)
            yield Metered(build_service(client, clock=clock, engine=engine), meter, client)
    else:
        endpoint = request.getfixturevalue("moto_server")
        client, raw = dynamodb_client(endpoint, max_pool=32), dynamodb_client(endpoint)
        meter = CostMeter(raw)
        meter.attach(client)
        yield Metered(build_service(client, clock=clock, engine=engine), meter, client)


@pytest.fixture(params=STORES)
def claim_log(request: pytest.FixtureRequest) -> Iterator[ClaimLog]:
    """Engine v3's claim log (``querator.ports.log``) on each store, over fresh tables or a fresh file.

    A test plays a writer that dies between taking its positions and writing them with the two
    halves of ``append``, ``take_positions`` and ``write_taken``.
    """
    if request.param == "memory":
        yield InMemoryClaimLog()
        return
    if request.param == "sqlite":
        yield SQLiteClaimLog(SQLiteDatabase(request.getfixturevalue("tmp_path") / "querator.db"))
        return
    if request.param == "moto":
        with mock_aws():
            client = dynamodb_client()
            schema.create_tables(client, items_table="log-items", catalog_table="log-queues")
            yield DynamoDBClaimLog(client, "log-items", concurrency=1)
    else:
        client = dynamodb_client(request.getfixturevalue("moto_server"), max_pool=32)
        table = f"t{uuid.uuid4().hex[:8]}-items"
        schema.create_tables(client, items_table=table, catalog_table=f"{table}-queues")
        yield DynamoDBClaimLog(client, table)
