"""Configuration: one settings record, read once from the environment.

The environment variable *names* are constants here so that the CDK app (which sets them on every
function), the local server and the tests cannot disagree with the code that reads them. Resource
names have no defaults: a function started without its table names fails at cold start with a
readable error instead of writing somewhere unexpected. Endpoints are never configured here; boto3
and PynamoDB honour ``AWS_ENDPOINT_URL_DYNAMODB`` themselves.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Mapping


class EnvVar:
    """Names of the environment variables the product reads."""

    #: Where items and queues live: ``dynamodb`` (the default: the tables below), ``sqlite:PATH``
    #: (one file on this machine) or ``memory`` (this process only); see ``parse_store``.
    STORE: Final = "QUERATOR_STORE"
    #: The items table (``querator.storage.dynamodb.schema``).
    ITEMS_TABLE: Final = "QUERATOR_ITEMS_TABLE"
    #: The queue catalog table.
    CATALOG_TABLE: Final = "QUERATOR_CATALOG_TABLE"
    #: Longest a lease request waits for items, in seconds. API Gateway's integration timeout is
    #: 29 s, so the deployed default stays well below it.
    LEASE_WAIT_CAP: Final = "QUERATOR_LEASE_WAIT_CAP_SECONDS"
    #: Time the reaper leaves unused of its Lambda's remaining time, in seconds, to save its bookmark.
    REAPER_MARGIN: Final = "QUERATOR_REAPER_MARGIN_SECONDS"
    #: How long a process trusts a queue's catalog record on the hot path, in seconds (0: never).
    QUEUE_CACHE: Final = "QUERATOR_QUEUE_CACHE_SECONDS"
    #: How long the DynamoDB client waits for a reply before botocore sends the request again, in
    #: seconds. DynamoDB answers in milliseconds, so the default (5) only fires on a lost reply; a
    #: DynamoDB-compatible store that is slow to answer (moto, LocalStack on a loaded machine) needs
    #: more, or requests it applied are sent again (docs/adr/0040-reliability-suites.md).
    STORE_READ_TIMEOUT: Final = "QUERATOR_STORE_READ_TIMEOUT_SECONDS"
    #: The storage engine: ``3`` (claim logs, docs/adr/0100-engine-v3-candidates.md), which writes
    #: new items to logs and still serves what engine v2 wrote, or ``2`` (one row per item,
    #: docs/adr/0050-engine-v2.md) alone, which does not see items in logs.
    ENGINE: Final = "QUERATOR_ENGINE"
    #: The deployed stage (``dev``, ``prod`` ...): a dimension of every metric, so one stage's
    #: datapoints never feed another's alarms. Unset locally.
    STAGE: Final = "QUERATOR_STAGE"
    #: The stream's connections table (``querator.storage.dynamodb.connections``); stream functions only.
    CONNECTIONS_TABLE: Final = "QUERATOR_CONNECTIONS_TABLE"
    #: Where the stream functions post to connections: the WebSocket stage's callback URL.
    STREAM_ENDPOINT: Final = "QUERATOR_STREAM_ENDPOINT"
    #: ``required``: the stream function refuses a subscribe without a ticket of its queue
    #: (``stream.ticket``; per-queue access). Otherwise a ticket is checked only when one is sent.
    STREAM_TICKETS: Final = "QUERATOR_STREAM_TICKETS"
    #: The S3 bucket that holds large payloads (over 64 KiB, up to 1 MiB:
    #: ``querator.storage.dynamodb.objects``). Unset: the DynamoDB store keeps payloads in rows and
    #: refuses one over 380,000 bytes.
    PAYLOAD_BUCKET: Final = "QUERATOR_PAYLOAD_BUCKET"
    #: The region, which Lambda sets; the local server sets it too.
    REGION: Final = "AWS_REGION"
    # Powertools reads its own variables; named here so the CDK app sets them from one place.
    POWERTOOLS_SERVICE_NAME: Final = "POWERTOOLS_SERVICE_NAME"
    POWERTOOLS_METRICS_NAMESPACE: Final = "POWERTOOLS_METRICS_NAMESPACE"
    POWERTOOLS_LOG_LEVEL: Final = "POWERTOOLS_LOG_LEVEL"
    POWERTOOLS_METRICS_DISABLED: Final = "POWERTOOLS_METRICS_DISABLED"
    POWERTOOLS_TRACE_DISABLED: Final = "POWERTOOLS_TRACE_DISABLED"


def in_lambda(environ: Mapping[str, str] = os.environ) -> bool:
    """True in a Lambda execution environment (``LAMBDA_TASK_ROOT``), not in SAM's or Chalice's
    local emulators, which set it too (Powertools' own rule)."""
    emulated = environ.get("AWS_SAM_LOCAL") or environ.get("AWS_CHALICE_CLI_MODE")
    return bool(environ.get("LAMBDA_TASK_ROOT")) and not emulated


#: Powertools service name and metrics namespace of every function. Powertools adds the dimension
#: ``service=<SERVICE_NAME>`` to every metric, and the functions add ``stage=<EnvVar.STAGE>``, so
#: alarms select on exactly those two.
SERVICE_NAME: Final = "querator"
METRICS_NAMESPACE: Final = "Querator"


class Metric:
    """Names of the custom metrics (EMF) the functions publish; the CDK alarms import them."""

    #: Items stored by ``queue.produce`` (Count).
    ITEMS_PRODUCED: Final = "ItemsProduced"
    #: Items handed out by ``queue.lease`` (Count).
    ITEMS_LEASED: Final = "ItemsLeased"
    #: Items deleted by ``queue.complete`` (Count).
    ITEMS_COMPLETED: Final = "ItemsCompleted"
    #: Lease requests that waited and found nothing (Count): 454 answers.
    LEASE_EMPTY: Final = "LeaseEmpty"
    #: Items ``queue.redrive`` moved out of a dead-letter queue (Count).
    ITEMS_REDRIVEN: Final = "ItemsRedriven"
    #: Items the reaper moved to a dead-letter queue (Count).
    DEAD_LETTERED: Final = "ItemsDeadLettered"
    #: Items the reaper deleted because their queue has no dead-letter queue (Count).
    EXPIRED_DELETED: Final = "ItemsExpiredDeleted"
    #: Items the reaper read (Count).
    REAPER_SCANNED: Final = "ReaperItemsScanned"
    #: 1 when a reaper run ran out of its time budget before finishing (Count): it is falling behind.
    REAPER_UNFINISHED: Final = "ReaperUnfinishedRuns"
    #: Age of the oldest un-leased, due item over every queue the reaper read (Seconds).
    OLDEST_ITEM_AGE: Final = "OldestItemAgeSeconds"
    #: Items held in queues that serve as another queue's dead-letter queue (Count).
    DEAD_LETTER_DEPTH: Final = "DeadLetterDepth"


DEFAULT_LEASE_WAIT_CAP: Final = timedelta(seconds=20)
DEFAULT_REAPER_MARGIN: Final = timedelta(seconds=5)
DEFAULT_QUEUE_CACHE: Final = timedelta(seconds=1)
DEFAULT_STORE_READ_TIMEOUT: Final = timedelta(seconds=5)
#: The storage engines: 2, one row per item (docs/adr/0050-engine-v2.md), and 3, claim logs of
#: packed rows (docs/adr/0100-engine-v3-candidates.md).
ENGINES: Final = (2, 3)
#: The engine new items go to unless told (``EnvVar.ENGINE``; the Spark bulk producer's ``--engine``).
DEFAULT_ENGINE: Final = 3
#: Lambda's longest timeout bounds it: a wait past the function's end is never used.
MAX_STORE_READ_TIMEOUT: Final = timedelta(minutes=15)


class ConfigurationError(RuntimeError):
    """The environment does not configure the product; raised at cold start."""


class StoreKind:
    """The kinds of store a store URL names (``parse_store``)."""

    #: The items and catalog tables (AWS, or ``AWS_ENDPOINT_URL_DYNAMODB``).
    DYNAMODB: Final = "dynamodb"
    #: One SQLite file on this machine: ``sqlite:PATH``.
    SQLITE: Final = "sqlite"
    #: This process's memory.
    MEMORY: Final = "memory"


def parse_store(url: str) -> tuple[str, str]:
    """``(kind, path)`` of a store URL: ``dynamodb``, ``memory`` or ``sqlite:PATH`` (path "" otherwise).

    Raises
    ------
    ConfigurationError
        Any other URL; the message says which ones exist.
    """
    if url in (StoreKind.DYNAMODB, StoreKind.MEMORY):
        return url, ""
    if url.startswith(f"{StoreKind.SQLITE}:"):
        path, _ = _sqlite_parts(url)
        if path.strip():
            return StoreKind.SQLITE, path
    raise ConfigurationError(
        f"unsupported store {url!r}: use sqlite:PATH (or sqlite:PATH?sync=full), memory or dynamodb"
    )


#: How a SQLite store commits (``sqlite:PATH?sync=MODE``): ``normal`` (the default) survives the
#: process being killed; ``full`` also an OS crash or a power cut, at one disk flush per commit.
SQLITE_SYNC_MODES: Final = ("normal", "full")


def sqlite_sync(url: str) -> str:
    """The commit mode a ``sqlite:`` store URL asks for (``normal`` unless ``?sync=full``)."""
    return _sqlite_parts(url)[1]


def _sqlite_parts(url: str) -> tuple[str, str]:
    rest = url.removeprefix(f"{StoreKind.SQLITE}:")
    path, marker, mode = rest.rpartition("?sync=")
    if not marker:
        return rest, SQLITE_SYNC_MODES[0]
    if mode not in SQLITE_SYNC_MODES:
        raise ConfigurationError(f"unsupported sync={mode!r} in store {url!r}: use sync=normal or sync=full")
    return path, mode


#: The longest table name DynamoDB takes.
MAX_TABLE_NAME: Final = 255
MAX_QUEUE_CACHE: Final = timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a function needs from its environment; ``settings_from`` checks the values."""

    #: A store URL (``parse_store``); the deployed functions use DynamoDB.
    store: str = StoreKind.DYNAMODB
    #: Required for the DynamoDB store only.
    items_table: str = ""
    catalog_table: str = ""
    #: The stream functions' (empty elsewhere).
    connections_table: str = ""
    #: ``EnvVar.PAYLOAD_BUCKET`` (empty: no bucket; the DynamoDB store keeps payloads in rows only).
    payload_bucket: str = ""
    stream_endpoint: str = ""
    #: Every subscribe must show a ticket of its queue (``EnvVar.STREAM_TICKETS``).
    stream_tickets_required: bool = False
    region: str | None = None
    #: Above zero.
    lease_wait_cap: timedelta = DEFAULT_LEASE_WAIT_CAP
    #: Zero or more.
    reaper_margin: timedelta = DEFAULT_REAPER_MARGIN
    #: Zero to ``MAX_QUEUE_CACHE``.
    queue_cache: timedelta = DEFAULT_QUEUE_CACHE
    #: Above zero, at most ``MAX_STORE_READ_TIMEOUT``.
    store_read_timeout: timedelta = DEFAULT_STORE_READ_TIMEOUT
    #: One of ``ENGINES``.
    engine: int = DEFAULT_ENGINE


#: Each duration setting: its field, its variable, whether zero is allowed, and its upper bound.
_DURATIONS: Final = (
    ("lease_wait_cap", EnvVar.LEASE_WAIT_CAP, False, None),
    ("reaper_margin", EnvVar.REAPER_MARGIN, True, None),
    ("queue_cache", EnvVar.QUEUE_CACHE, True, MAX_QUEUE_CACHE),
    ("store_read_timeout", EnvVar.STORE_READ_TIMEOUT, False, MAX_STORE_READ_TIMEOUT),
)


def settings_from(environ: Mapping[str, str]) -> Settings:
    """Build ``Settings`` from a mapping of environment variables.

    Raises
    ------
    ConfigurationError
        A table name is missing, or a value does not parse; the message names the variable.
    """
    store = environ.get(EnvVar.STORE) or StoreKind.DYNAMODB
    kind, _ = parse_store(store)
    missing = [name for name in (EnvVar.ITEMS_TABLE, EnvVar.CATALOG_TABLE) if not environ.get(name)]
    if missing and kind == StoreKind.DYNAMODB:
        raise ConfigurationError(f"missing environment variable(s): {', '.join(missing)}")
    for name in (EnvVar.ITEMS_TABLE, EnvVar.CATALOG_TABLE):
        if kind == StoreKind.DYNAMODB and len(environ[name]) < 3:
            raise ConfigurationError(f"{name}={environ[name]!r} is not a table name (3 characters or more)")
    for name in (EnvVar.ITEMS_TABLE, EnvVar.CATALOG_TABLE, EnvVar.CONNECTIONS_TABLE):
        if len(environ.get(name, "")) > MAX_TABLE_NAME:
            raise ConfigurationError(f"{name} is longer than {MAX_TABLE_NAME} characters")
    durations: dict[str, timedelta] = {}
    for field, name, zero_allowed, most in _DURATIONS:
        if not (raw := environ.get(name)):
            continue
        try:
            value = timedelta(seconds=float(raw))
        except (ValueError, OverflowError) as exc:
            raise ConfigurationError(f"{name}={raw!r} is not a number of seconds") from exc
        if value < timedelta(0) or (value == timedelta(0) and not zero_allowed):
            raise ConfigurationError(f"{name}={raw!r} must be {'0 or more' if zero_allowed else 'above 0'}")
        if most is not None and value > most:
            raise ConfigurationError(f"{name}={raw!r} must be at most {most.total_seconds():g}")
        durations[field] = value
    return Settings(
        engine=engine_from(environ.get(EnvVar.ENGINE, "")),
        store=store,
        items_table=environ.get(EnvVar.ITEMS_TABLE, ""),
        catalog_table=environ.get(EnvVar.CATALOG_TABLE, ""),
        connections_table=environ.get(EnvVar.CONNECTIONS_TABLE, ""),
        payload_bucket=environ.get(EnvVar.PAYLOAD_BUCKET, ""),
        stream_endpoint=environ.get(EnvVar.STREAM_ENDPOINT, ""),
        stream_tickets_required=environ.get(EnvVar.STREAM_TICKETS, "").strip().lower() == "required",
        region=environ.get(EnvVar.REGION) or None,
        **durations,
    )


def engine_from(raw: str) -> int:
    """The engine ``raw`` names (``EnvVar.ENGINE``; empty: ``DEFAULT_ENGINE``).

    Raises
    ------
    ConfigurationError
        Anything but one of ``ENGINES``.
    """
    if not raw.strip():
        return DEFAULT_ENGINE
    if raw.strip() not in {str(engine) for engine in ENGINES}:
        raise ConfigurationError(f"{EnvVar.ENGINE}={raw!r} must be one of {', '.join(map(str, ENGINES))}")
    return int(raw)


def engine_setting() -> int:
    """The engine this process's environment names (``EnvVar.ENGINE``)."""
    return engine_from(os.environ.get(EnvVar.ENGINE, ""))


@functools.cache
def load_settings() -> Settings:
    """The process's settings, read once (tests call ``load_settings.cache_clear()``)."""
    return settings_from(os.environ)
