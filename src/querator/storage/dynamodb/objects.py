"""Storage layer: large payloads kept as S3 objects (docs/adr/0102-large-payloads.md).

A DynamoDB item holds at most 400 KB (a payload of ``ROW_PAYLOAD_BYTES``), and every write of a row
costs a write unit per kilobyte of it, so with a payload bucket a payload over
``OBJECT_PAYLOAD_BYTES`` (64 KiB) goes to the bucket and the row keeps the object's key in its
place (``schema.PAYLOAD_OBJECT``). Measured (docs/benchmarks.md, section 20), a 380,000-byte item
in its row costs $240 per million delivered, in the bucket about $9. The row entry
is what every move copies (retry, expiry, dead letter, redrive, reprioritize), so the key travels
with the item and the object is never copied for a move within its lifetime.

An object's key says how long it may be needed: ``o/<keep until, unix seconds, 12 digits>/<32
hex>``, where *keep until* is its item's expire deadline plus the row margin, the moment the row
holding the item is deleted by DynamoDB's TTL too. A move that gives the item a later deadline (a
dead letter, a redrive) copies the object to a key with the later time first. So:

- the store deletes an object when its item is completed, deleted, cleared or dropped (eagerly,
  after the write that ended the item: the object of an item that ended is never read again);
- the reaper's ``sweep`` deletes what is left past its time (a writer that died between its upload
  and its rows, a delete that failed): the listing is in key order, so a sweep reads only objects
  whose time has passed, plus one page. An object is never deleted while a row can still hold its
  item, and never outlives the row's margin.
"""

from __future__ import annotations

import logging
import re
import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from querator.domain.errors import QueratorError, StoreThrottledError, StoreUnavailableError
from querator.domain.model import ROW_PAYLOAD_BYTES

__all__ = ["OBJECT_PAYLOAD_BYTES", "ROW_PAYLOAD_BYTES", "PayloadObjects", "keep_until", "object_key"]

#: A payload over this goes to the bucket when there is one. By price alone the bucket wins from
#: about 8 KB (a row's write unit per KB against a PUT's $5 per million); from 64 KiB it is 5x
#: cheaper or more, and the S3 round trips (a PUT to produce, a GET to lease) stay off the small
#: items most queues carry.
OBJECT_PAYLOAD_BYTES = 65_536

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from datetime import datetime

    from mypy_boto3_s3 import S3Client

log = logging.getLogger("querator.storage.dynamodb.objects")

#: Every object's key starts with this (the reaper's grant to list is for it alone).
PREFIX = "o/"
_KEY = re.compile(r"^o/(\d{12})/[0-9a-f]{32}$")
#: DeleteObjects takes at most 1000 keys.
_DELETE_BATCH = 1000
_THROTTLED = frozenset({"SlowDown", "503", "RequestLimitExceeded", "ThrottlingException"})


def keep_until(key: str) -> int:
    """The unix second after which no row holds the item of object ``key`` (its key's own field)."""
    match = _KEY.match(key)
    if match is None:
        raise ValueError(f"not a payload object key: {key!r}")
    return int(match.group(1))


def object_key(until: datetime) -> str:
    """A new object's key for an item no row holds after ``until``."""
    return f"{PREFIX}{max(int(until.timestamp()) + 1, 0):012d}/{secrets.token_hex(16)}"


def _store_error(exc: Exception, operation: str) -> QueratorError:
    """A bucket's failure as the store's: throttled (retry later), unreachable, or failed."""
    if not isinstance(exc, ClientError):
        return StoreUnavailableError(f"payload bucket: {operation} got no answer ({type(exc).__name__})")
    code = str(exc.response.get("Error", {}).get("Code", ""))
    if code in _THROTTLED:
        return StoreThrottledError(f"the payload bucket is throttling {operation}; retry", store_code=code)
    if code in ("InternalError", "ServiceUnavailable", "NoSuchBucket"):
        return StoreUnavailableError(f"payload bucket: {operation} failed: {code}", store_code=code)
    return QueratorError(f"payload bucket: {operation} failed: {code}", store_code=code)


class PayloadObjects:
    """The payload bucket: put, get, copy and delete objects; sweep those past their time."""

    def __init__(self, client: S3Client, bucket: str, *, concurrency: int = 8) -> None:
        self._client = client
        self.bucket = bucket
        self._concurrency = max(concurrency, 1)

    def create_bucket(self) -> None:
        """Create the bucket when it is missing: for an embedded store (``querator serve --store
        dynamodb``, the tests); a stack's bucket is the CDK app's."""
        try:
            self._client.create_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in (
                "BucketAlreadyOwnedByYou",
                "BucketAlreadyExists",
            ):
                raise _store_error(exc, "create_bucket") from exc

    def put(self, payload: bytes, until: datetime) -> str:
        """Store ``payload``; returns its new key. Raises ``QueratorError`` (nothing was stored)."""
        key = object_key(until)
        try:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=payload)
        except (ClientError, BotoCoreError) as exc:
            raise _store_error(exc, "put") from exc
        return key

    def get(self, key: str) -> bytes | None:
        """The payload of ``key``; ``None`` when the object is gone (swept past its time)."""
        try:
            reply = self._client.get_object(Bucket=self.bucket, Key=key)
            return reply["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise _store_error(exc, "get") from exc
        except BotoCoreError as exc:
            raise _store_error(exc, "get") from exc

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes | None]:
        """``get`` of each key, several in flight (a lease of large items waits for one round trip)."""
        unique = list(dict.fromkeys(keys))
        if len(unique) <= 1:
            return {key: self.get(key) for key in unique}
        with ThreadPoolExecutor(max_workers=min(self._concurrency, len(unique))) as pool:
            return dict(zip(unique, pool.map(self.get, unique), strict=True))

    def copy(self, key: str, until: datetime) -> str:
        """A copy of ``key`` under a key kept until ``until`` (a move that extends its item's life)."""
        target = object_key(until)
        try:
            self._client.copy_object(
                Bucket=self.bucket, Key=target, CopySource={"Bucket": self.bucket, "Key": key}
            )
        except (ClientError, BotoCoreError) as exc:
            raise _store_error(exc, "copy") from exc
        return target

    def delete(self, keys: Iterable[str]) -> int:
        """Delete ``keys`` (gone ones count as deleted); returns how many were asked. Raises
        ``QueratorError`` when the bucket refuses: the caller decides whether that fails its call."""
        unique = sorted(set(keys))
        for at in range(0, len(unique), _DELETE_BATCH):
            chunk = unique[at : at + _DELETE_BATCH]
            try:
                reply = self._client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": key} for key in chunk], "Quiet": True},
                )
            except (ClientError, BotoCoreError) as exc:
                raise _store_error(exc, "delete") from exc
            errors = reply.get("Errors") or []
            if errors:
                code = str(errors[0].get("Code", ""))
                raise QueratorError(f"payload bucket: delete failed for {len(errors)} object(s): {code}")
        return len(unique)

    def release(self, keys: Iterable[str], operation: str) -> None:
        """Delete the objects of items that ended: a failure is logged, not raised, because the
        write that ended them succeeded (the sweep deletes them past their time)."""
        unique = set(keys)
        if not unique:
            return
        try:
            self.delete(unique)
        except QueratorError as exc:
            log.warning(
                "payload objects left for the sweep",
                extra={"operation": operation, "objects": len(unique), "error": str(exc)},
            )

    def sweep(self, now: datetime, *, limit: int = _DELETE_BATCH) -> int:
        """Delete up to ``limit`` objects whose time has passed; returns how many. Keys list in
        time order, so one listing page past the last one due is all it reads."""
        due: list[str] = []
        now_s = int(now.timestamp())
        token: str | None = None
        while len(due) < limit:
            try:
                if token is None:
                    reply = self._client.list_objects_v2(Bucket=self.bucket, Prefix=PREFIX, MaxKeys=1000)
                else:
                    reply = self._client.list_objects_v2(
                        Bucket=self.bucket, Prefix=PREFIX, MaxKeys=1000, ContinuationToken=token
                    )
            except (ClientError, BotoCoreError) as exc:
                raise _store_error(exc, "sweep") from exc
            contents = reply.get("Contents") or []
            for entry in contents:
                key = entry.get("Key", "")
                if not _KEY.match(key):
                    continue  # not ours: never deleted by the sweep
                if keep_until(key) >= now_s:
                    return self.delete(due) if due else 0
                due.append(key)
                if len(due) >= limit:
                    break
            token = reply.get("NextContinuationToken")
            if not reply.get("IsTruncated") or token is None:
                break
        return self.delete(due) if due else 0
