"""Composition root: settings → boto3 client → storage adapters → ``QueueService``.

The only module that knows which adapters are in use. ``get_service`` is cached so a warm Lambda
reuses its client and its connections; nothing here runs at import time, so tests start moto (or
set ``AWS_ENDPOINT_URL_DYNAMODB``) first and call ``get_service.cache_clear()`` between cases.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config

from querator.clock import SystemClock
from querator.config import load_settings
from querator.service import QueueService
from querator.storage.dynamodb.catalog import DynamoDBQueueCatalog
from querator.storage.dynamodb.store import DynamoDBItemStore

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

#: Standard retry mode backs off on throttling; a Lambda serves one request at a time, but the local
#: server runs requests on threads that share this client, hence the larger pool.
_CLIENT_CONFIG = Config(
    retries={"mode": "standard", "max_attempts": 4},
    connect_timeout=2,
    read_timeout=5,
    max_pool_connections=32,
)


@functools.cache
def get_client() -> DynamoDBClient:
    """The process's DynamoDB client (endpoint from ``AWS_ENDPOINT_URL_DYNAMODB`` when set)."""
    settings = load_settings()
    return boto3.client("dynamodb", region_name=settings.region, config=_CLIENT_CONFIG)


@functools.cache
def get_service() -> QueueService:
    """The process's queue service, built on first use."""
    settings = load_settings()
    client = get_client()
    return QueueService(
        catalog=DynamoDBQueueCatalog(
            settings.catalog_table, host=client.meta.endpoint_url, region=client.meta.region_name
        ),
        store=DynamoDBItemStore(client, settings.items_table),
        clock=SystemClock(),
        queue_cache_ttl=settings.queue_cache,
    )


def reset() -> None:
    """Forget the cached settings, client and service (tests; the local server after a restart)."""
    get_service.cache_clear()
    get_client.cache_clear()
    load_settings.cache_clear()
