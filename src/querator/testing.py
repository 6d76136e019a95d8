"""Test kit shipped with the package (like ``procrastinate.testing``): a fake clock and store factories.

Nothing in the product imports this module; tests, benchmarks and the local server do.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config

from querator.clock import SystemClock
from querator.config import DEFAULT_ENGINE
from querator.service import QueueService
from querator.storage.dynamodb import schema
from querator.storage.dynamodb.base import WRITE_CONCURRENCY
from querator.storage.dynamodb.catalog import DynamoDBQueueCatalog
from querator.storage.dynamodb.log import DynamoDBClaimLog
from querator.storage.dynamodb.objects import PayloadObjects
from querator.storage.dynamodb.store import DynamoDBItemStore
from querator.storage.memory import InMemoryClaimLog, InMemoryItemStore, InMemoryQueueCatalog
from querator.storage.sqlite import SQLiteClaimLog, SQLiteDatabase, SQLiteItemStore, SQLiteQueueCatalog

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path
    from typing import IO

    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_s3 import S3Client
    from pyspark.sql import SparkSession

    from querator.domain.ids import IdFactory
    from querator.domain.model import Item

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)

__all__ = [
    "EPOCH",
    "FakeClock",
    "ServeChild",
    "SystemClock",
    "build_service",
    "dynamodb_client",
    "local_spark_session",
    "memory_service",
    "moto_server_process",
    "serve_child",
    "serve_process",
    "sqlite_service",
    "stored_items",
]

#: moto's fake credentials, never real ones.
FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class FakeClock:
    """A clock that moves only when told to; ``sleep`` advances it instead of waiting."""

    def __init__(self, start: datetime = EPOCH) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        self.advance(timedelta(seconds=seconds))

    def advance(self, delta: timedelta) -> datetime:
        with self._lock:
            self._now += delta
            return self._now


def dynamodb_client(endpoint_url: str | None = None, *, max_pool: int = 10) -> DynamoDBClient:
    """A DynamoDB client with fake credentials, for moto (in-process when ``endpoint_url`` is None)."""
    return boto3.client(
        "dynamodb",
        region_name="us-east-1",
        endpoint_url=endpoint_url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",  # noqa: S106 - moto's fake credentials
        config=Config(retries={"mode": "standard", "max_attempts": 3}, max_pool_connections=max_pool),
    )


def s3_client(endpoint_url: str | None = None) -> S3Client:
    """An S3 client with fake credentials, for moto (in-process when ``endpoint_url`` is None),
    addressing buckets by path as a local endpoint needs."""
    return boto3.client(
        "s3",
        region_name="us-east-1",
        endpoint_url=endpoint_url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",  # noqa: S106 - moto's fake credentials
        config=Config(s3={"addressing_style": "path"}, retries={"mode": "standard", "max_attempts": 3}),
    )


def payload_bucket(client: DynamoDBClient, name: str) -> PayloadObjects:
    """A new payload bucket ``name`` beside ``client``'s moto (the same server, or in-process)."""
    s3 = s3_client(client.meta.endpoint_url if _is_server(client) else None)
    s3.create_bucket(Bucket=name)
    return PayloadObjects(s3, name)


def bucket_keys(payloads: PayloadObjects) -> list[str]:
    """Every key in a payload bucket (tests: what is left after items ended)."""
    client = payloads._client
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=payloads.bucket):
        keys += [entry["Key"] for entry in page.get("Contents", []) if "Key" in entry]
    return keys


def build_service(
    client: DynamoDBClient,
    *,
    clock: Any,
    prefix: str | None = None,
    ids: IdFactory | None = None,
    concurrency: int | None = None,
    engine: int = DEFAULT_ENGINE,
    payloads: bool = True,
) -> QueueService:
    """Create fresh tables (named with ``prefix``) and a service over them.

    ``concurrency``: the store's writes in flight at once. By default 1 for moto in-process, whose
    backend is not safe for concurrent requests (docs/adr/0050-engine-v2.md), and the product's
    default against a server (a single-threaded moto server takes one request at a time).
    ``engine=3``: with engine v3's claim log on the same table (docs/adr/0100), and (``payloads``)
    a payload bucket ``<prefix>-payloads`` for payloads over a row's, as the stack has
    (``QueueService.log.payloads``).
    """
    if concurrency is None:
        concurrency = WRITE_CONCURRENCY if _is_server(client) else 1
    prefix = prefix or f"t{uuid.uuid4().hex[:8]}"
    items_table, catalog_table = f"{prefix}-items", f"{prefix}-queues"
    schema.create_tables(client, items_table=items_table, catalog_table=catalog_table)
    return QueueService(
        catalog=DynamoDBQueueCatalog(catalog_table, host=client.meta.endpoint_url, region="us-east-1"),
        store=DynamoDBItemStore(client, items_table, concurrency=concurrency),
        clock=clock,
        ids=ids,
        log=DynamoDBClaimLog(
            client,
            items_table,
            concurrency=concurrency,
            payloads=payload_bucket(client, f"{prefix}-payloads") if payloads else None,
        )
        if engine == 3
        else None,
    )


def memory_service(*, clock: Any, ids: IdFactory | None = None, engine: int = DEFAULT_ENGINE) -> QueueService:
    """A service over a fresh in-memory store and catalog: no moto, no sockets. ``engine=3``: with
    engine v3's claim log (docs/adr/0100)."""
    return QueueService(
        catalog=InMemoryQueueCatalog(),
        store=InMemoryItemStore(),
        clock=clock,
        ids=ids,
        log=InMemoryClaimLog() if engine == 3 else None,
    )


def sqlite_service(
    path: str | Path, *, clock: Any, ids: IdFactory | None = None, engine: int = DEFAULT_ENGINE
) -> QueueService:
    """A service over the SQLite database at ``path`` (created when missing); ``engine=3``: with
    engine v3's claim log in the same file."""
    database = SQLiteDatabase(path)
    return QueueService(
        catalog=SQLiteQueueCatalog(database),
        store=SQLiteItemStore(database),
        clock=clock,
        ids=ids,
        log=SQLiteClaimLog(database) if engine == 3 else None,
    )


def stored_items(service: QueueService, queue: str, *, page: int = 1000) -> list[Item]:
    """Every item ``queue`` holds, as the service lists it: waiting, leased and scheduled, in every
    partition and in both engines' storage (v2's rows and v3's logs), page by page. What a test
    compares with what it produced; not a store's own iteration, which sees one engine only."""
    found: list[Item] = []
    for partition in range(service.get_queue(queue).partitions):
        for listing in (service.list_items, service.list_scheduled):
            pivot = ""
            while True:
                # The pivot is inclusive: a page after the first starts with the last item seen.
                items = listing(queue, partition, pivot=pivot, limit=page)
                fresh = items[1:] if pivot and items and items[0].id == pivot else items
                found += fresh
                if not fresh:
                    break
                pivot = items[-1].id
    return found


def _is_server(client: DynamoDBClient) -> bool:
    """True when ``client`` talks to a server on this machine, not to moto's in-process mock."""
    return str(client.meta.endpoint_url).startswith("http://127.0.0.1")


@contextmanager
def moto_server_process() -> Iterator[str]:
    """A single-threaded moto server in a child process; yields its endpoint URL.

    A separate process keeps its state apart from any in-process ``mock_aws`` of the tests.
    """
    child = subprocess.Popen(
        [sys.executable, "-m", "querator.localstore", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None  # noqa: S101
        endpoint = child.stdout.readline().strip()
        if not endpoint.startswith("http://127.0.0.1:"):
            raise RuntimeError(f"moto server did not start: {endpoint!r}")
        yield endpoint
    finally:
        child.terminate()
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()


@dataclass(frozen=True)
class ServeChild:
    """A running ``querator serve`` child: its URL and its PID (to read ``/proc/<pid>``)."""

    url: str
    pid: int


@contextmanager
def serve_process(
    *args: str, env: dict[str, str] | None = None, stderr: IO[bytes] | None = None
) -> Iterator[str]:
    """``querator serve --port 0`` in a child process, exactly as a user starts it; yields its URL.

    The child gets its own store (the default, a SQLite file, in a data directory of its own, deleted
    afterwards) unless ``args`` name a ``--store`` or ``env`` sets ``AWS_ENDPOINT_URL_DYNAMODB``
    (``env`` may also name its ``XDG_DATA_HOME``). Its stderr goes to ``stderr`` (default: this
    process's). It is stopped with SIGTERM (by its PID) and must exit by itself.
    """
    with serve_child(*args, env=env, stderr=stderr) as child:
        yield child.url


@contextmanager
def serve_child(
    *args: str, env: dict[str, str] | None = None, stderr: IO[bytes] | None = None
) -> Iterator[ServeChild]:
    """``serve_process``, yielding the child's PID with its URL: a load test reads the server's
    threads, memory and CPU from ``/proc/<pid>`` (``benchmarks.connections``)."""
    with tempfile.TemporaryDirectory(prefix="querator-serve-") as data:
        yield from _serve_child(
            args,
            {"XDG_DATA_HOME": data, **(env or {})},
            endpoint=bool(env and "AWS_ENDPOINT_URL_DYNAMODB" in env),
            stderr=stderr,
        )


def _serve_child(
    args: tuple[str, ...], env: dict[str, str], *, endpoint: bool, stderr: IO[bytes] | None
) -> Iterator[ServeChild]:
    child_env = {**os.environ, **env}
    if not endpoint:
        child_env.pop("AWS_ENDPOINT_URL_DYNAMODB", None)
    child = subprocess.Popen(  # noqa: S603 - our own module, fixed arguments
        [sys.executable, "-m", "querator.cli", "serve", "--port", "0", "--quiet", *args],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=child_env,
    )
    try:
        assert child.stdout is not None  # noqa: S101
        line = child.stdout.readline().strip()
        prefix = "Querator listening on "
        if not line.startswith(prefix):
            raise RuntimeError(f"querator serve did not start: {line!r}")
        yield ServeChild(url=line.removeprefix(prefix), pid=child.pid)
    finally:
        child.terminate()
        try:
            child.wait(timeout=15)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            if child.stdout is not None:
                child.stdout.close()


def local_spark_session(*, master: str, app: str, config: dict[str, str] | None = None) -> SparkSession:
    """A Spark session on this machine only, for the Spark tests and benchmark (needs the ``spark`` extra).

    The executors' Python workers inherit the JVM's environment, which is this process's when the JVM
    starts: fake credentials and loopback-only networking are put in place before that.
    """
    for name, value in FAKE_AWS_ENV.items():
        os.environ.setdefault(name, value)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession  # noqa: PLC0415 - the JVM starts only when asked

    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
    )
    for key, value in {
        **{f"spark.executorEnv.{k}": v for k, v in FAKE_AWS_ENV.items()},
        **(config or {}),
    }.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
