"""Composition root: settings → storage adapters → ``QueueService``.

The only module that knows which adapters are in use: DynamoDB in AWS (``QUERATOR_STORE`` unset),
SQLite or memory for ``querator serve`` and ``querator.embedded`` (``open_stores``). ``get_service``
is cached so a warm Lambda reuses its client and its connections; nothing here runs at import time,
so tests start moto (or set ``AWS_ENDPOINT_URL_DYNAMODB``) first and call ``reset()`` between cases.
In Lambda the handlers call it at init (``observability.lambda_entry(prepare=...)``).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import botocore.session
from botocore.config import Config

from querator.clock import SystemClock
from querator.config import (
    ConfigurationError,
    StoreKind,
    engine_setting,
    load_settings,
    parse_store,
    sqlite_sync,
)
from querator.service import QueueService
from querator.storage.dynamodb.catalog import DynamoDBQueueCatalog
from querator.storage.dynamodb.log import DynamoDBClaimLog
from querator.storage.dynamodb.store import DynamoDBItemStore

if TYPE_CHECKING:
    from collections.abc import Callable

    from botocore.client import BaseClient
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_s3 import S3Client

    from querator.config import Settings
    from querator.ports import ItemStore, QueueCatalog
    from querator.ports.log import ClaimLog
    from querator.storage.dynamodb.objects import PayloadObjects

#: The engine whose stores include a claim log (``querator.config.ENGINES``).
ENGINE_V3 = 3

#: Standard retry mode backs off on throttling; a Lambda serves one request at a time, but the local
#: server runs requests on threads that share this client, hence the larger pool.
_CLIENT_CONFIG = Config(
    retries={"mode": "standard", "max_attempts": 4},
    connect_timeout=2,
    max_pool_connections=32,
)


def make_client(service: str, **options: Any) -> BaseClient:
    """A client made by botocore's own session, which is what ``boto3.client`` does underneath.

    The functions call this instead of ``boto3.client``: importing boto3 also imports s3transfer and
    boto3's resource machinery, and its client creation adds boto3's own event handlers, none of
    which a DynamoDB or management-API call uses. Measured (docs/adr/0013-cold-start.md): 14 ms off
    the import and 35 ms off making the first client. Credentials, region and endpoint settings
    (``AWS_ENDPOINT_URL_DYNAMODB`` and the like) are botocore's and behave the same.
    """
    return botocore_session().create_client(service, **options)


@functools.cache
def botocore_session() -> botocore.session.Session:
    """The process's botocore session: its clients share one loader of service models."""
    return botocore.session.get_session()


@functools.cache
def get_client() -> DynamoDBClient:
    """The process's DynamoDB client (endpoint from ``AWS_ENDPOINT_URL_DYNAMODB`` when set)."""
    settings = load_settings()
    config = _CLIENT_CONFIG.merge(Config(read_timeout=settings.store_read_timeout.total_seconds()))
    client = make_client("dynamodb", region_name=settings.region, config=config)
    return cast("DynamoDBClient", client)


def payload_objects(settings: Settings) -> PayloadObjects | None:
    """The payload bucket ``settings`` name (``QUERATOR_PAYLOAD_BUCKET``), or ``None`` without one.
    An endpoint of its own (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``: moto, LocalStack) is
    addressed by path, as such endpoints need."""
    if not settings.payload_bucket:
        return None
    from querator.storage.dynamodb.objects import PayloadObjects  # noqa: PLC0415 - only with a bucket

    local = bool(os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))
    config = _CLIENT_CONFIG.merge(Config(s3={"addressing_style": "path" if local else "auto"}))
    client = cast("S3Client", make_client("s3", region_name=settings.region, config=config))
    return PayloadObjects(client, settings.payload_bucket)


#: How to close the stores ``get_service`` opened (files); ``reset`` does.
_opened: list[Callable[[], None]] = []


@dataclass(frozen=True)
class Stores:
    """A catalog and an item store over one backing store, and how to close it (files)."""

    catalog: QueueCatalog
    store: ItemStore
    close: Callable[[], None] = lambda: None
    #: Engine v3's claim log over the same backing store (``None``: engine v2 alone).
    log: ClaimLog | None = None


def open_stores(url: str, settings: Settings | None = None, *, engine: int | None = None) -> Stores:
    """The catalog, item store and (engine v3) claim log a store URL names
    (``querator.config.parse_store``); ``engine``: ``settings.engine`` when not given.

    ``memory`` is new and empty on every call; ``sqlite:PATH`` opens (or creates) the file;
    ``dynamodb`` uses the tables of ``settings`` (default: the environment's).

    Raises
    ------
    ConfigurationError
        An unknown URL, or a file that cannot be a Querator database (not one, a newer schema, not
        writable); the message is one line and the file was not changed.
    """
    kind, path = parse_store(url)
    if engine is None:
        # Not ``load_settings()``: a local store needs no table names, which it would ask for.
        engine = settings.engine if settings is not None else engine_setting()
    logged = engine == ENGINE_V3
    if kind == StoreKind.MEMORY:
        from querator.storage.memory import (  # noqa: PLC0415
            InMemoryClaimLog,
            InMemoryItemStore,
            InMemoryQueueCatalog,
        )

        return Stores(InMemoryQueueCatalog(), InMemoryItemStore(), log=InMemoryClaimLog() if logged else None)
    if kind == StoreKind.SQLITE:
        from querator.storage.sqlite import (  # noqa: PLC0415 - only the local server and embedded use it
            DatabaseFileError,
            SQLiteClaimLog,
            SQLiteDatabase,
            SQLiteItemStore,
            SQLiteQueueCatalog,
        )

        try:
            database = SQLiteDatabase(path, sync=sqlite_sync(url))
        except DatabaseFileError as exc:
            raise ConfigurationError(str(exc)) from exc
        return Stores(
            SQLiteQueueCatalog(database),
            SQLiteItemStore(database),
            database.close,
            log=SQLiteClaimLog(database) if logged else None,
        )
    settings = settings or load_settings()
    client = get_client()
    catalog = DynamoDBQueueCatalog(
        settings.catalog_table, host=client.meta.endpoint_url, region=client.meta.region_name
    )
    catalog.share_loader(botocore_session())
    return Stores(
        catalog,
        DynamoDBItemStore(client, settings.items_table),
        log=DynamoDBClaimLog(client, settings.items_table, payloads=payload_objects(settings))
        if logged
        else None,
    )


@functools.cache
def get_service() -> QueueService:
    """The process's queue service, built on first use."""
    settings = load_settings()
    stores = open_stores(settings.store, settings)
    _opened.append(stores.close)
    return QueueService(
        catalog=stores.catalog,
        store=stores.store,
        clock=SystemClock(),
        queue_cache_ttl=settings.queue_cache,
        log=stores.log,
    )


def reset() -> None:
    """Forget the cached settings, client and service and close the files they opened (tests; the
    local server when it starts and stops)."""
    while _opened:
        _opened.pop()()
    get_service.cache_clear()
    get_client.cache_clear()
    botocore_session.cache_clear()
    load_settings.cache_clear()
