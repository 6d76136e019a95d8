"""Storage layer: the queue catalog on PynamoDB.

Queues are few, read on every request and written rarely: a PynamoDB model with typed attributes is
the plainest way to keep them, and ``queues.list`` is one ordered Query on the ``queue`` hash key.
The model class is built per table by ``_model_for`` because PynamoDB fixes table and host on the
class ``Meta`` (PynamoDB issue #287): a module-level model would pin one table for the process.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from functools import cache
from typing import TYPE_CHECKING, NoReturn

from pynamodb.attributes import BooleanAttribute, NumberAttribute, UnicodeAttribute
from pynamodb.exceptions import DeleteError, DoesNotExist, GetError, PutError, QueryError, UpdateError
from pynamodb.models import Model

from querator.domain.errors import (
    ConflictError,
    QueueAlreadyExistsError,
    QueueNotFoundError,
    StoreThrottledError,
    StoreUnavailableError,
)
from querator.domain.model import FIFO, QueueInfo, timestamp_us, utc_from_timestamp_us
from querator.storage.dynamodb import schema
from querator.storage.dynamodb.errors import THROTTLING_CODES

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from datetime import datetime

    import botocore.session
    from pynamodb.exceptions import PynamoDBException

_BOOKMARK = "bookmark"
_STREAM_KEY = "stream"


class _CatalogRecord(Model):
    """Attributes shared by every catalog record; concrete models come from ``_model_for``."""

    kind = UnicodeAttribute(hash_key=True)
    name = UnicodeAttribute(range_key=True)
    lease_timeout_us = NumberAttribute(null=True)
    expire_timeout_us = NumberAttribute(null=True)
    max_attempts = NumberAttribute(null=True)
    dead_queue = UnicodeAttribute(null=True)
    reference = UnicodeAttribute(null=True)
    partitions = NumberAttribute(null=True)
    created_at_us = NumberAttribute(null=True)
    updated_at_us = NumberAttribute(null=True)
    deleting = BooleanAttribute(null=True)
    #: Absent on queues stored before fair delivery, and on FIFO queues: read as "fifo" and 0.
    delivery = UnicodeAttribute(null=True)
    max_leased_per_group = NumberAttribute(null=True)
    #: Lease rate limits (absent: none, as on queues stored before them).
    rate_limit = NumberAttribute(null=True)
    rate_limit_per_group = NumberAttribute(null=True)
    bookmark = UnicodeAttribute(null=True)
    #: Random, written by the create that made the record (an update drops it): a create retried by
    #: botocore after its reply was lost finds its own token and knows the queue is its own.
    create_token = UnicodeAttribute(null=True)
    #: The secret of a "secret" record (the stream tickets' key).
    secret = UnicodeAttribute(null=True)


@cache
def _model_for(table_name: str, host: str | None, region: str | None) -> type[_CatalogRecord]:
    meta = type(
        "Meta",
        (),
        {"table_name": table_name, "host": host, "region": region, "max_retry_attempts": 3},
    )
    return type("CatalogRecord", (_CatalogRecord,), {"Meta": meta})


def _us(value: timedelta) -> int:
    return (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds


def _cause_code(exc: PynamoDBException) -> str:
    """The DynamoDB error code behind a PynamoDB error; "" when there was no reply at all.

    Not ``exc.cause_response_code``: it raises AttributeError when the cause is a botocore error
    without a reply (a read timeout, a lost connection), which would hide the store failure.
    """
    response = getattr(exc.cause, "response", None)
    return str(response.get("Error", {}).get("Code") or "") if isinstance(response, dict) else ""


def _raise_store_error(exc: PynamoDBException, operation: str) -> NoReturn:
    code = _cause_code(exc)
    if code in THROTTLING_CODES:
        raise StoreThrottledError(f"the store is throttling {operation}; retry", store_code=code) from exc
    raise StoreUnavailableError(f"{operation} failed: {code or exc}", store_code=code) from exc


def _each_once(records: Iterable[_CatalogRecord]) -> Iterator[_CatalogRecord]:
    """The records of one catalog Query, each once.

    A Query returns names in ascending order. A DynamoDB-compatible store that ends its last page
    with ``LastEvaluatedKey: {}`` instead of leaving the key out makes PynamoDB query again from
    the start (an empty start key is no start key), so the reaper's walk would never end: a name
    that is not after the one before means the query came round again.
    """
    previous: str | None = None
    for record in records:
        if previous is not None and record.name <= previous:
            return
        previous = record.name
        yield record


class DynamoDBQueueCatalog:
    """``QueueCatalog`` on the catalog table; ``host`` is the DynamoDB endpoint (None: AWS)."""

    def __init__(self, table_name: str, *, host: str | None = None, region: str | None = None) -> None:
        self._model = _model_for(table_name, host, region)

    def share_loader(self, session: botocore.session.Session) -> None:
        """Let PynamoDB's session (this thread's) read service models through ``session``'s loader.

        Making a DynamoDB client loads and parses the service model and endpoint rules and lists
        every service directory botocore has; a botocore loader keeps what it read. The store's
        client and PynamoDB's are two clients from two sessions, so without this a cold start does
        that work twice (42 ms of a profiled first request, docs/adr/0013-cold-start.md). Call it
        before the first catalog request. ``_get_connection`` is PynamoDB's own accessor; a test
        pins that the loader is shared.
        """
        pynamodb_session = self._model._get_connection().connection.session
        pynamodb_session.register_component("data_loader", session.get_component("data_loader"))

    def _to_record(self, info: QueueInfo) -> _CatalogRecord:
        return self._model(
            schema.CATALOG_QUEUE_KIND,
            info.name,
            lease_timeout_us=_us(info.lease_timeout),
            expire_timeout_us=_us(info.expire_timeout),
            max_attempts=info.max_attempts,
            dead_queue=info.dead_queue or None,
            reference=info.reference or None,
            partitions=info.partitions,
            created_at_us=timestamp_us(info.created_at),
            updated_at_us=timestamp_us(info.updated_at),
            deleting=info.deleting,
            delivery=info.delivery if info.delivery != FIFO else None,
            max_leased_per_group=info.max_leased_per_group or None,
            rate_limit=info.rate_limit or None,
            rate_limit_per_group=info.rate_limit_per_group or None,
        )

    @staticmethod
    def _to_info(record: _CatalogRecord) -> QueueInfo:
        return QueueInfo(
            name=record.name,
            lease_timeout=timedelta(microseconds=int(record.lease_timeout_us or 0)),
            expire_timeout=timedelta(microseconds=int(record.expire_timeout_us or 0)),
            max_attempts=int(record.max_attempts or 0),
            dead_queue=record.dead_queue or "",
            reference=record.reference or "",
            partitions=int(record.partitions or 1),
            created_at=utc_from_timestamp_us(int(record.created_at_us or 0)),
            updated_at=utc_from_timestamp_us(int(record.updated_at_us or 0)),
            deleting=bool(record.deleting),
            delivery=record.delivery or FIFO,
            max_leased_per_group=int(record.max_leased_per_group or 0),
            rate_limit=float(record.rate_limit or 0),
            rate_limit_per_group=float(record.rate_limit_per_group or 0),
        )

    def create(self, info: QueueInfo) -> None:
        record = self._to_record(info)
        record.create_token = token = secrets.token_hex(8)
        try:
            # Two creates of one name race: the first write wins, the second is told the queue exists.
            record.save(condition=self._model.name.does_not_exist())
        except PutError as exc:
            if _cause_code(exc) == "ConditionalCheckFailedException":
                if self._created_by(info.name, token):
                    # botocore retried this create after its reply was lost: the queue is this call's.
                    return
                raise QueueAlreadyExistsError(f"queue '{info.name}' already exists") from exc
            _raise_store_error(exc, "queues.create")

    def _created_by(self, name: str, token: str) -> bool:
        record = self._read(schema.CATALOG_QUEUE_KIND, name, "queues.create")
        return record is not None and record.create_token == token

    def _read(self, kind: str, name: str, operation: str) -> _CatalogRecord | None:
        """One catalog record, strongly consistent; ``None`` when there is none."""
        try:
            return self._model.get(kind, name, consistent_read=True)
        except DoesNotExist:
            return None
        except GetError as exc:
            _raise_store_error(exc, operation)

    def get(self, name: str) -> QueueInfo:
        record = self._read(schema.CATALOG_QUEUE_KIND, name, "queues.info")
        if record is None:
            raise QueueNotFoundError(f"queue '{name}' does not exist", queue=name)
        return self._to_info(record)

    def list(self, *, pivot: str, limit: int) -> list[QueueInfo]:
        condition = self._model.name >= pivot if pivot else None
        try:
            return [
                self._to_info(record)
                for record in _each_once(
                    self._model.query(
                        schema.CATALOG_QUEUE_KIND,
                        range_key_condition=condition,
                        limit=limit,
                        consistent_read=True,
                    )
                )
            ]
        except QueryError as exc:
            _raise_store_error(exc, "queues.list")
        raise AssertionError("unreachable")  # pragma: no cover

    def iterate(self) -> Iterator[QueueInfo]:
        try:
            for record in _each_once(self._model.query(schema.CATALOG_QUEUE_KIND, consistent_read=True)):
                yield self._to_info(record)
        except QueryError as exc:
            _raise_store_error(exc, "queues.list")

    def replace(self, info: QueueInfo, *, expected_updated_at: datetime) -> None:
        record = self._to_record(info)
        try:
            # Optimistic concurrency: two updates read the same version; the second must not undo
            # the first, so it fails and the service retries on the fresh version.
            record.save(condition=self._model.updated_at_us == timestamp_us(expected_updated_at))
        except PutError as exc:
            if _cause_code(exc) == "ConditionalCheckFailedException":
                raise ConflictError(f"queue '{info.name}' changed or was deleted meanwhile") from exc
            _raise_store_error(exc, "queues.update")

    def mark_deleting(self, name: str) -> QueueInfo:
        record = self._model(schema.CATALOG_QUEUE_KIND, name)
        try:
            # Only an existing queue is marked; a missing one must not be recreated by the update.
            record.update(actions=[self._model.deleting.set(True)], condition=self._model.name.exists())
        except UpdateError as exc:
            if _cause_code(exc) == "ConditionalCheckFailedException":
                raise QueueNotFoundError(f"queue '{name}' does not exist", queue=name) from exc
            _raise_store_error(exc, "queues.delete")
        return self._to_info(record)

    def remove(self, name: str) -> None:
        try:
            self._model(schema.CATALOG_QUEUE_KIND, name).delete()
        except DeleteError as exc:
            _raise_store_error(exc, "queues.delete")

    def load_bookmark(self) -> str | None:
        record = self._read(schema.CATALOG_REAPER_KIND, _BOOKMARK, "reaper")
        return None if record is None else record.bookmark or None

    def save_bookmark(self, bookmark: str | None) -> None:
        record = self._model(schema.CATALOG_REAPER_KIND, _BOOKMARK, bookmark=bookmark)
        try:
            record.save()
        except PutError as exc:
            _raise_store_error(exc, "reaper")

    def stream_key(self, candidate: str | None) -> str | None:
        stored = self._read(schema.CATALOG_SECRET_KIND, _STREAM_KEY, "stream.ticket")
        if stored is not None and stored.secret:
            return str(stored.secret)
        if candidate is None:
            # The stream function checks tickets and holds no PutItem on the catalog.
            return None
        record = self._model(schema.CATALOG_SECRET_KIND, _STREAM_KEY, secret=candidate)
        try:
            # Two first uses race: the first write wins and both sign with its key.
            record.save(condition=self._model.name.does_not_exist())
        except PutError as exc:
            if _cause_code(exc) != "ConditionalCheckFailedException":
                _raise_store_error(exc, "stream.ticket")
            stored = self._read(schema.CATALOG_SECRET_KIND, _STREAM_KEY, "stream.ticket")
            if stored is None or not stored.secret:
                _raise_store_error(exc, "stream.ticket")
            return str(stored.secret)
        return candidate
