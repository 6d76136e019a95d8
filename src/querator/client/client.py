"""Python client: ``Client``, one typed method per endpoint of the HTTP API (docs/api.md).

Each method builds the JSON body, sends it through the pooled transport, retries when that is safe
for *this* call (docs/adr/0031-client-retries.md), and decodes the reply into ``models`` values or a
typed error of ``errors``. Nothing here imports the server: only the pure duration helpers.
"""

from __future__ import annotations

import enum
import json
import os
import random
import socket
import threading
import time
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final, TypeVar

from querator.api.durations import parse_timestamp
from querator.api.paths import is_addressable, queue_path
from querator.client.errors import (
    ApiError,
    ConnectionFailedError,
    QueueNotFoundError,
    RequestInProgressError,
    RetryError,
    ServerError,
    TooManyRequestsError,
    UnknownMethodError,
    UnsupportedContentError,
    error_for,
)
from querator.client.models import (
    DEFAULT_PRIORITY,
    Duration,
    ImportedItems,
    Lease,
    LeasedItem,
    NewItem,
    Produced,
    QueueInfo,
    QueueStats,
    Redriven,
    Renewal,
    RetryItem,
    StoredItem,
    Timestamp,
    as_new_item,
    check_priority,
    check_reason,
    duration_seconds,
    duration_to_wire,
    when_to_wire,
)
from querator.client.transport import RequestSigner, SigV4Signer, Transport

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping
    from datetime import datetime, timedelta

    from botocore.credentials import Credentials

    from querator.client.worker import WorkerReport

T = TypeVar("T")

DEFAULT_URL: Final = "http://127.0.0.1:2319"
#: Read timeout of calls that send no ``request_timeout``; above API Gateway's 29 s integration cap.
DEFAULT_TIMEOUT: Final = 30.0
#: How much longer than the ``request_timeout`` it sends the client waits for the reply: the server
#: answers at ``request_timeout`` and the answer still has to travel (Lambda, API Gateway, network).
REQUEST_TIMEOUT_MARGIN: Final = 5.0
DEFAULT_MAX_RETRIES: Final = 4
#: Page size of the ``iter_*`` helpers (the API's maximum).
PAGE_SIZE: Final = 1000
#: ``queue.clear`` calls one ``clear`` makes at most (each removes ~20 s worth of items).
_CLEAR_ROUNDS: Final = 100

# The paths of the API (docs/api.md). Spelled out rather than read from ``querator.api.routes``, which
# imports the server's wire messages and the domain; tests/client checks that both tables agree.
PATHS: Final[Mapping[str, str]] = {
    "queues.create": "/v1/queues.create",
    "queues.update": "/v1/queues.update",
    "queues.info": "/v1/queues.info",
    "queues.list": "/v1/queues.list",
    "queues.delete": "/v1/queues.delete",
    "queue.produce": "/v1/queue.produce",
    "queue.lease": "/v1/queue.lease",
    "queue.complete": "/v1/queue.complete",
    "queue.retry": "/v1/queue.retry",
    "queue.renew": "/v1/queue.renew",
    "queue.reprioritize": "/v1/queue.reprioritize",
    "queue.stats": "/v1/queue.stats",
    "queue.clear": "/v1/queue.clear",
    "queue.redrive": "/v1/queue.redrive",
    "stream.ticket": "/v1/stream.ticket",
    "storage/items.list": "/v1/storage/items.list",
    "storage/scheduled.list": "/v1/storage/scheduled.list",
    "storage/items.import": "/v1/storage/items.import",
    "storage/items.delete": "/v1/storage/items.delete",
    "health": "/health",
}
#: Calls that span queues or name none: always their plain path (``queues.list`` needs a whole-API
#: grant; docs/api.md, "Access per queue").
UNSCOPED: Final = frozenset({"queues.list", "health"})


def path_for(name: str, body: Mapping[str, Any] | None, *, scoped: bool = True) -> str:
    """The path of call ``name``: its scoped twin ``/v1/queues/<queue>/<name>`` when the body names
    one queue whose name a path can carry (``querator.api.paths``), so a role granted that queue
    alone may call it; else the plain path, where the body names the queue."""
    queue_name = None if body is None else body.get("queue_name")
    if not scoped or name in UNSCOPED or not isinstance(queue_name, str) or not is_addressable(queue_name):
        return PATHS[name]
    return PATHS[name] if _reaches_beyond(name, queue_name, body or {}) else queue_path(name, queue_name)


def _reaches_beyond(name: str, queue_name: str, body: Mapping[str, Any]) -> bool:
    """Whether the call reaches a queue its scoped path would not allow: a dead-letter queue outside
    the queue's namespace, or a redrive to a named queue. Those take the plain path, which a
    whole-API grant allows (the scoped path would refuse them: docs/api.md, "Access per queue")."""
    if name in ("queues.create", "queues.update"):
        dead_queue = body.get("dead_queue")
        return isinstance(dead_queue, str) and bool(dead_queue) and not dead_queue.startswith(queue_name)
    return name == "queue.redrive" and body.get("to") is not None


class Safety(enum.Enum):
    """When a call may be sent again after a failure (docs/adr/0031-client-retries.md)."""

    #: Repeating it changes nothing more: retried on 454 / 429, 5xx and any connection error.
    IDEMPOTENT = "idempotent"
    #: Repeating it after the server acted would do it twice: retried only when the server certainly
    #: did not act (454 / 429, or the connection never opened).
    UNSAFE = "unsafe"
    #: ``queue.lease``: like UNSAFE, and 454 is an answer ("nothing to lease"), not a failure.
    LEASE = "lease"


class Client:
    """A client of the queue's HTTP API; thread-safe, one connection pool shared by all threads.

    Parameters
    ----------
    base_url
        ``http://127.0.0.1:2319`` for ``querator serve``, the stage URL for API Gateway.
    sigv4_region
        Sign requests with SigV4 (service ``execute-api``) for this region; ``None``: no signing.
    credentials
        botocore credentials for signing; default: botocore's chain (env, profile, role).
    timeout
        Read timeout, in seconds, of calls that send no ``request_timeout``.
    max_retries
        How many times a call that failed in a retryable way is sent again (0: never).
    request_timeout_margin
        Seconds the client waits beyond a ``request_timeout`` it sends before giving up on the reply.
    stream_url
        Where ``consume(mode="stream")`` / ``stream`` connect: a deployed stack's ``StreamUrl``
        (``wss://…/<stage>``); by default ``<base_url>/v1/stream`` (``querator serve``).
    scoped_paths
        Send each call on one queue to its scoped path, ``/v1/queues/<queue>/<route>``, which a
        per-queue IAM grant allows (docs/api.md, "Access per queue"); ``False`` for a server that
        predates them. A queue whose name a path cannot carry always uses the plain path.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        sigv4_region: str | None = None,
        credentials: Credentials | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = 5.0,
        max_retries: int = DEFAULT_MAX_RETRIES,
        backoff_base: float = 0.1,
        backoff_cap: float = 5.0,
        max_connections: int = 10,
        client_id: str | None = None,
        signer: RequestSigner | None = None,
        request_timeout_margin: float = REQUEST_TIMEOUT_MARGIN,
        stream_url: str | None = None,
        scoped_paths: bool = True,
    ) -> None:
        if signer is None and sigv4_region:
            signer = SigV4Signer(sigv4_region, credentials)
        self.base_url = base_url.rstrip("/")
        #: The stream's WebSocket URL: a deployed stack's ``StreamUrl`` output; ``None``: the
        #: server's own ``/v1/stream`` (``querator serve``).
        self.stream_url = stream_url
        #: Call each queue on its scoped path (``/v1/queues/<queue>/...``); ``False``: the plain
        #: paths only, for a server deployed before scoped routes.
        self.scoped_paths = scoped_paths
        #: Signs the stream's handshake as it signs requests (SigV4 for a deployed stack).
        self.signer = signer
        self.timeout = timeout
        self.request_timeout_margin = request_timeout_margin
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        #: Prefix of the lease ``client_id``s; each thread adds its own suffix, because the server
        #: refuses a second waiting lease from one client id on one queue.
        self.client_id = client_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._transport = Transport(
            self.base_url, signer=signer, connect_timeout=connect_timeout, max_connections=max_connections
        )
        self._sleep: Callable[[float], None] = time.sleep

    # -- plumbing -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the pooled connections."""
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based): exponential, capped, jittered.

        Half fixed, half random ("equal jitter"): clients that failed together spread out, and none
        retries at once.
        """
        ceiling = min(self.backoff_cap, self.backoff_base * 2.0**attempt)
        return ceiling / 2 + random.uniform(0, ceiling / 2)  # noqa: S311 - jitter, not security

    def _read_timeout(self, request_timeout: Duration | None) -> float:
        if request_timeout is None:
            return self.timeout
        try:
            return duration_seconds(request_timeout) + self.request_timeout_margin
        except ValueError:
            # The server will answer 400 for it at once; wait the default meanwhile.
            return self.timeout

    def _call(
        self,
        name: str,
        body: Mapping[str, Any] | None,
        *,
        safety: Safety,
        read_timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        done_if_retry_fails_with: type[ApiError] | None = None,
        reply_headers: dict[str, str] | None = None,
    ) -> dict[str, Any] | None:
        """Send one call, retrying as ``safety`` allows; the decoded reply, or for a lease 454 ``None``
        (or ``{"next_lease_at": ...}`` when a rate limit held it back).

        ``reply_headers``, when given, receives the headers of the successful reply (lower-case names).
        """
        path = path_for(name, body, scoped=self.scoped_paths)
        method = "GET" if body is None else "POST"
        data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode("utf-8")
        timeout = self.timeout if read_timeout is None else read_timeout
        attempt = 0
        while True:
            try:
                reply = self._transport.send(method, path, data, read_timeout=timeout, headers=headers)
            except ConnectionFailedError as exc:
                # Not after a read timeout: the server held the call for the whole timeout, so it is
                # slow rather than gone, and the same wait again would only multiply the silence
                # (docs/adr/0031-client-retries.md); the caller may give a longer timeout instead.
                if (
                    attempt < self.max_retries
                    and not exc.timed_out
                    and (safety is Safety.IDEMPOTENT or not exc.sent)
                ):
                    self._sleep(self.backoff(attempt))
                    attempt += 1
                    continue
                raise
            decoded = _decode(reply.body)
            if 200 <= reply.status < 300:
                if reply_headers is not None:
                    reply_headers.update(reply.headers)
                return decoded if isinstance(decoded, dict) else {}
            error = error_for(
                reply.status,
                decoded if isinstance(decoded, dict) else None,
                fallback_text=reply.body[:200].decode("utf-8", "replace"),
            )
            if safety is Safety.LEASE and reply.status == RetryError.status:
                # A rate limit says when to come back; any other 454 is "nothing leased".
                back_at = decoded.get("next_lease_at") if isinstance(decoded, dict) else None
                return {"next_lease_at": back_at} if isinstance(back_at, str) else None
            if (
                done_if_retry_fails_with is not None
                and attempt > 0
                and isinstance(error, done_if_retry_fails_with)
            ):
                # An earlier attempt whose reply was lost did the job (e.g. the queue is gone).
                return {}
            if attempt < self.max_retries and _retryable(error, safety):
                self._sleep(self.backoff(attempt))
                attempt += 1
                continue
            raise error

    # -- queues ---------------------------------------------------------------------------------------

    def create_queue(
        self,
        queue_name: str,
        *,
        lease_timeout: Duration,
        expire_timeout: Duration,
        max_attempts: int = 0,
        dead_queue: str = "",
        reference: str = "",
        requested_partitions: int = 1,
        delivery: str | None = None,
        max_leased_per_group: int | None = None,
        rate_limit: float | None = None,
        rate_limit_per_group: float | None = None,
    ) -> None:
        """``queues.create``. Raises ``QueueExistsError`` when the name is taken, ``BadRequestError``
        for a bad field (a bad duration, a missing ``dead_queue``, a ``delivery`` other than
        ``"fifo"`` or ``"fair"``). ``delivery``, ``max_leased_per_group``, ``rate_limit`` and
        ``rate_limit_per_group`` (leases a second) are sent when given (the server's defaults:
        ``"fifo"`` and 0, no limit)."""
        body: dict[str, Any] = {
            "queue_name": queue_name,
            "lease_timeout": duration_to_wire(lease_timeout),
            "expire_timeout": duration_to_wire(expire_timeout),
            "requested_partitions": requested_partitions,
        }
        if max_attempts:
            body["max_attempts"] = max_attempts
        if dead_queue:
            body["dead_queue"] = dead_queue
        if reference:
            body["reference"] = reference
        if delivery is not None:
            body["delivery"] = delivery
        if max_leased_per_group is not None:
            body["max_leased_per_group"] = max_leased_per_group
        if rate_limit is not None:
            body["rate_limit"] = rate_limit
        if rate_limit_per_group is not None:
            body["rate_limit_per_group"] = rate_limit_per_group
        self._call("queues.create", body, safety=Safety.UNSAFE)

    def update_queue(
        self,
        queue_name: str,
        *,
        lease_timeout: Duration | None = None,
        expire_timeout: Duration | None = None,
        max_attempts: int | None = None,
        dead_queue: str | None = None,
        reference: str | None = None,
        requested_partitions: int | None = None,
        delivery: str | None = None,
        max_leased_per_group: int | None = None,
        rate_limit: float | None = None,
        rate_limit_per_group: float | None = None,
    ) -> None:
        """``queues.update``: only the arguments given (not ``None``) change (``rate_limit=0``:
        no limit). ``delivery`` can change
        only while the queue holds no items."""
        body: dict[str, Any] = {"queue_name": queue_name}
        if lease_timeout is not None:
            body["lease_timeout"] = duration_to_wire(lease_timeout)
        if expire_timeout is not None:
            body["expire_timeout"] = duration_to_wire(expire_timeout)
        for key, value in (
            ("max_attempts", max_attempts),
            ("dead_queue", dead_queue),
            ("reference", reference),
            ("requested_partitions", requested_partitions),
            ("delivery", delivery),
            ("max_leased_per_group", max_leased_per_group),
            ("rate_limit", rate_limit),
            ("rate_limit_per_group", rate_limit_per_group),
        ):
            if value is not None:
                body[key] = value
        self._call("queues.update", body, safety=Safety.IDEMPOTENT)

    def queue_info(self, queue_name: str) -> QueueInfo:
        """``queues.info``. Raises ``QueueNotFoundError``."""
        reply = self._call("queues.info", {"queue_name": queue_name}, safety=Safety.IDEMPOTENT)
        return QueueInfo.from_wire(reply or {})

    def list_queues(self, *, pivot: str = "", limit: int = 100) -> list[QueueInfo]:
        """``queues.list``: up to ``limit`` queues in name order from ``pivot`` (inclusive)."""
        body: dict[str, Any] = {"limit": limit}
        if pivot:
            body["pivot"] = pivot
        reply = self._call("queues.list", body, safety=Safety.IDEMPOTENT) or {}
        return [QueueInfo.from_wire(q) for q in reply.get("items") or ()]

    def iter_queues(self, *, pivot: str = "", page_size: int = 100) -> Iterator[QueueInfo]:
        """Every queue from ``pivot`` on, page by page."""
        return _pages(lambda p: self.list_queues(pivot=p, limit=page_size), pivot, lambda q: q.queue_name)

    def delete_queue(self, queue_name: str) -> None:
        """``queues.delete``: the queue and its items. Raises ``QueueNotFoundError``, except when an
        earlier attempt of this same call (whose reply was lost) deleted it; ``RequestFailedError``
        (453 ``Queue is being deleted``) when the queue was too big to empty within the call: it is
        deleted, and the reaper removes the rest of its items."""
        self._call(
            "queues.delete",
            {"queue_name": queue_name},
            safety=Safety.IDEMPOTENT,
            done_if_retry_fails_with=QueueNotFoundError,
        )

    # -- items ----------------------------------------------------------------------------------------

    def produce(
        self,
        queue_name: str,
        items: Iterable[NewItem | bytes | str],
        *,
        idempotency_key: str | None = None,
        request_timeout: Duration | None = None,
        enqueue_in: Duration | None = None,
    ) -> Produced:
        """``queue.produce``: 1-1000 items, stored together; returns once all are durably stored.

        ``enqueue_in`` (a ``timedelta``, seconds or ``"5m"``) schedules the items given as bare
        payloads that long after the server's clock; a ``NewItem`` carries its own time.

        With an ``idempotency_key`` the call is retried like an idempotent one (the server replays
        its first reply, and ``Produced.replayed`` says whether this call stored nothing because an
        earlier one with the key had); without one only when the server certainly stored nothing.
        """
        body: dict[str, Any] = {
            "queue_name": queue_name,
            "items": [_scheduled(as_new_item(item), item, enqueue_in).to_wire() for item in items],
        }
        if request_timeout is not None:
            body["request_timeout"] = duration_to_wire(request_timeout)
        reply_headers: dict[str, str] = {}
        self._call(
            "queue.produce",
            body,
            safety=Safety.IDEMPOTENT if idempotency_key else Safety.UNSAFE,
            read_timeout=self._read_timeout(request_timeout),
            headers={"Idempotency-Key": idempotency_key} if idempotency_key else None,
            reply_headers=reply_headers,
        )
        said = reply_headers.get("idempotency-replayed")
        return Produced(replayed=None if said is None else said == "true")

    def lease(
        self,
        queue_name: str,
        batch_size: int = 1,
        *,
        client_id: str | None = None,
        request_timeout: Duration | None = None,
    ) -> Lease:
        """``queue.lease``: up to ``batch_size`` items of one partition, oldest first.

        Waits up to ``request_timeout`` (server default when ``None``) for an item; with nothing to
        lease returns an empty ``Lease`` (the server's 454). Under a queue's rate limit a ``Lease``
        may hold fewer items than asked, and ``next_lease_at`` says when the limit has a lease
        again. Never resent once the request may have reached the server: a lost reply would leave
        its items leased to nobody until the lease ends.
        """
        body: dict[str, Any] = {
            "queue_name": queue_name,
            "batch_size": batch_size,
            "client_id": client_id or f"{self.client_id}-{threading.get_ident()}",
        }
        if request_timeout is not None:
            body["request_timeout"] = duration_to_wire(request_timeout)
        reply = self._call(
            "queue.lease", body, safety=Safety.LEASE, read_timeout=self._read_timeout(request_timeout)
        )
        if reply is None or "items" not in reply:
            return Lease.from_wire({"queue_name": queue_name, **(reply or {})})
        return Lease.from_wire(reply)

    def complete(
        self,
        queue_name: str,
        items: Iterable[str | LeasedItem],
        *,
        partition: int | None = None,
        request_timeout: Duration | None = None,
    ) -> None:
        """``queue.complete``: delete leased items (ids, or the ``LeasedItem``s, of one partition).

        Raises ``ItemNotLeasedError`` naming the ids that were unknown, stale or not leased in
        ``failed_ids``; the other ids were completed.
        """
        ids, partition = _ids_and_partition(items, partition)
        body: dict[str, Any] = {"queue_name": queue_name, "partition": partition, "ids": ids}
        if request_timeout is not None:
            body["request_timeout"] = duration_to_wire(request_timeout)
        self._call(
            "queue.complete", body, safety=Safety.UNSAFE, read_timeout=self._read_timeout(request_timeout)
        )

    def retry(
        self,
        queue_name: str,
        items: Iterable[RetryItem | LeasedItem | str],
        *,
        partition: int | None = None,
        retry_at: Timestamp | timedelta | None = None,
        retry_in: Duration | None = None,
        dead: bool = False,
        priority: int | None = None,
        reason: str = "",
    ) -> None:
        """``queue.retry``: put leased items back now, at ``retry_at``, after ``retry_in`` (a delay
        from the server's clock: ``timedelta(seconds=30)``, ``30`` or ``"30s"``), or (``dead``) into
        the dead-letter queue; with ``priority`` (0-9) instead of their own. ``retry_at`` takes a
        delay too (sent as ``retry_in``). ``reason`` says why (at most 1,024 bytes of UTF-8 on one
        line; ``reason_text`` makes one of any text): the server keeps it as each item's
        ``last_reason`` and counts a failure (``""``: records nothing). ``retry_at`` / ``retry_in`` /
        ``dead`` / ``priority`` / ``reason`` apply to the items not given as ``RetryItem``.

        Raises ``ItemNotLeasedError`` naming the ids that were not applied; the others were. A bad
        ``priority`` or ``reason``, a negative delay or both times raise ``ValueError`` before
        anything is sent.
        """
        if priority is not None:
            check_priority(priority)
        check_reason(reason)
        when_to_wire({}, retry_at, retry_in, "retry_at", "retry_in")
        retry_items: list[RetryItem] = []
        partitions: set[int] = set()
        for item in items:
            if isinstance(item, RetryItem):
                retry_items.append(item)
                continue
            if isinstance(item, LeasedItem):
                partitions.add(item.partition)
            item_id = item.id if isinstance(item, LeasedItem) else item
            retry_items.append(
                RetryItem(
                    id=item_id,
                    retry_at=retry_at,
                    retry_in=retry_in,
                    dead=dead,
                    priority=priority,
                    reason=reason,
                )
            )
        body = {
            "queue_name": queue_name,
            "partition": _one_partition(partitions, partition),
            "items": [item.to_wire() for item in retry_items],
        }
        self._call("queue.retry", body, safety=Safety.UNSAFE)

    def renew(
        self,
        queue_name: str,
        items: Iterable[str | LeasedItem],
        *,
        partition: int | None = None,
        lease_timeout: Duration | None = None,
    ) -> Renewal:
        """``queue.renew``: set leases to end at now + ``lease_timeout`` (default: the queue's); counted
        from now, so a short ``lease_timeout`` shortens a lease.

        Safe to repeat, so retried like a read. Raises ``ItemNotLeasedError`` naming the ids whose
        lease is lost; the others were renewed.
        """
        ids, partition = _ids_and_partition(items, partition)
        body: dict[str, Any] = {"queue_name": queue_name, "partition": partition, "ids": ids}
        if lease_timeout is not None:
            body["lease_timeout"] = duration_to_wire(lease_timeout)
        reply = self._call("queue.renew", body, safety=Safety.IDEMPOTENT)
        return Renewal.from_wire(reply or {})

    def reprioritize(
        self,
        queue_name: str,
        items: Iterable[str | LeasedItem | StoredItem],
        priority: int,
        *,
        partition: int | None = None,
    ) -> dict[str, str]:
        """``queue.reprioritize``: give items of one partition ``priority`` (0-9); returns each id
        with the id the item has now. A waiting or scheduled item moves under a new id; a leased one
        keeps its id and lease and goes back with ``priority``; one that has it already keeps its id.

        Not resent once the request may have reached the server (the old ids would be gone). Raises
        ``ItemNotLeasedError`` naming the ids that were unknown or gone; the others were applied. A
        bad ``priority`` raises ``ValueError`` before anything is sent.
        """
        check_priority(priority)
        ids, partition = _ids_and_partition(
            [item.id if isinstance(item, StoredItem) else item for item in items], partition
        )
        body = {"queue_name": queue_name, "partition": partition, "ids": ids, "priority": priority}
        reply = self._call("queue.reprioritize", body, safety=Safety.UNSAFE) or {}
        return {str(i.get("id", "")): str(i.get("new_id", "")) for i in reply.get("items") or ()}

    def stream_ticket(self, queue_name: str) -> tuple[str, datetime]:
        """``stream.ticket``: (ticket, expires_at), what a stream's ``subscribe`` shows to be let onto
        ``queue_name`` under a per-queue grant (docs/api.md, "Streaming")."""
        reply = self._call("stream.ticket", {"queue_name": queue_name}, safety=Safety.IDEMPOTENT) or {}
        return str(reply.get("ticket", "")), parse_timestamp(str(reply.get("expires_at", "")))

    def stats(self, queue_name: str) -> QueueStats:
        """``queue.stats``: counts and ages per partition, from the counters kept beside the items."""
        reply = self._call("queue.stats", {"queue_name": queue_name}, safety=Safety.IDEMPOTENT)
        return QueueStats.from_wire(reply or {})

    def clear(
        self, queue_name: str, *, queue: bool = False, scheduled: bool = False, destructive: bool = False
    ) -> None:
        """``queue.clear``: ``queue`` removes un-leased items (``destructive``: leased ones too),
        ``scheduled`` the scheduled ones; one of ``queue`` / ``scheduled`` is required."""
        body = {"queue_name": queue_name, "queue": queue, "scheduled": scheduled, "destructive": destructive}
        # A clear with more work than one call may do answers 454 after removing what it could:
        # calling again continues. Bounded, so a store that keeps throttling ends in the error.
        for _ in range(_CLEAR_ROUNDS - 1):
            try:
                self._call("queue.clear", body, safety=Safety.IDEMPOTENT)
            except RetryError:
                continue
            return
        self._call("queue.clear", body, safety=Safety.IDEMPOTENT)

    def redrive(self, queue_name: str, *, to: str | None = None, limit: int = PAGE_SIZE) -> Redriven:
        """``queue.redrive``: move up to ``limit`` dead letters of ``queue_name`` back to the queues
        they came from (or to ``to``), as new items with ``attempts`` 0. Call again until
        ``remaining`` is 0 (``redrive_all`` does); a retried call never stores an item twice."""
        body: dict[str, Any] = {"queue_name": queue_name, "limit": limit}
        if to is not None:
            body["to"] = to
        return Redriven.from_wire(self._call("queue.redrive", body, safety=Safety.IDEMPOTENT) or {})

    def redrive_all(
        self,
        queue_name: str,
        *,
        to: str | None = None,
        rate: float | None = None,
        limit: int | None = None,
    ) -> Iterator[Redriven]:
        """``redrive`` until nothing remains, yielding each call's reply (for progress).

        ``rate`` (items per second) paces the calls, so the queue's consumers are not flooded at
        once; ``limit`` stops after that many items. Stops early, rather than spin, when a call
        moves nothing while items remain (they are leased in the dead-letter queue: run it again
        once their leases end).
        """
        moved = 0
        while limit is None or moved < limit:
            batch = PAGE_SIZE if limit is None else min(PAGE_SIZE, limit - moved)
            if rate is not None:
                batch = max(1, min(batch, int(rate)))
            started = time.monotonic()
            reply = self.redrive(queue_name, to=to, limit=batch)
            moved += reply.moved
            yield reply
            if reply.remaining == 0 or reply.moved == 0:
                return
            if rate is not None:
                # One call's worth of items per 1/rate seconds each: the next call waits its turn.
                time.sleep(max(0.0, reply.moved / rate - (time.monotonic() - started)))

    # -- storage inspection ---------------------------------------------------------------------------

    def list_items(
        self, queue_name: str, *, partition: int = 0, pivot: str = "", limit: int = PAGE_SIZE
    ) -> list[StoredItem]:
        """``storage/items.list``: one partition in FIFO order from ``pivot`` (an id, inclusive)."""
        return self._list("storage/items.list", queue_name, partition, pivot, limit)

    def list_scheduled(
        self, queue_name: str, *, partition: int = 0, pivot: str = "", limit: int = PAGE_SIZE
    ) -> list[StoredItem]:
        """``storage/scheduled.list``: the scheduled items of one partition."""
        return self._list("storage/scheduled.list", queue_name, partition, pivot, limit)

    def iter_items(
        self, queue_name: str, *, partition: int = 0, scheduled: bool = False, page_size: int = PAGE_SIZE
    ) -> Iterator[StoredItem]:
        """Every item of one partition (or its scheduled items), page by page."""
        name = "storage/scheduled.list" if scheduled else "storage/items.list"
        return _pages(
            lambda p: self._list(name, queue_name, partition, p, page_size), "", lambda item: item.id
        )

    def _list(self, name: str, queue_name: str, partition: int, pivot: str, limit: int) -> list[StoredItem]:
        body: dict[str, Any] = {"queue_name": queue_name, "partition": partition, "limit": limit}
        if pivot:
            body["pivot"] = pivot
        reply = self._call(name, body, safety=Safety.IDEMPOTENT) or {}
        return [StoredItem.from_wire(i) for i in reply.get("items") or ()]

    def import_items(
        self, queue_name: str, items: Iterable[StoredItem | Mapping[str, Any]], *, partition: int = 0
    ) -> ImportedItems:
        """``storage/items.import``: write items verbatim under new ids; an item whose ``source_id``
        is already in the partition is skipped (so only items with a ``source_id`` are safe to resend,
        and the call is resent only when the server certainly did nothing)."""
        wire = [_import_wire(item) if isinstance(item, StoredItem) else dict(item) for item in items]
        body = {"queue_name": queue_name, "partition": partition, "items": wire}
        reply = self._call("storage/items.import", body, safety=Safety.UNSAFE) or {}
        return ImportedItems(ids=tuple(str(i.get("id", "")) for i in reply.get("items") or ()))

    def delete_items(self, queue_name: str, ids: Iterable[str], *, partition: int = 0) -> None:
        """``storage/items.delete``: delete items in any state; deleting twice succeeds."""
        body = {"queue_name": queue_name, "partition": partition, "ids": list(ids)}
        self._call("storage/items.delete", body, safety=Safety.IDEMPOTENT)

    def health(self) -> str:
        """``GET /health``: the server's status (``"pass"``)."""
        reply = self._call("health", None, safety=Safety.IDEMPOTENT) or {}
        return str(reply.get("status", ""))

    # -- consumer -------------------------------------------------------------------------------------

    def consume(
        self, queue_name: str, handler: Callable[[LeasedItem], object], **options: Any
    ) -> WorkerReport:
        """Run a consumer worker on ``queue_name`` until stopped; see ``querator.client.worker.consume``."""
        from querator.client.worker import consume  # noqa: PLC0415 - the worker imports this module

        return consume(self, queue_name, handler, **options)

    def stream(
        self, queue_name: str, handler: Callable[[LeasedItem], object], *, credit: int = 10, **options: Any
    ) -> WorkerReport:
        """Run a consumer worker whose items are pushed over the endpoint's stream: ``consume`` with
        ``mode="stream"`` and ``concurrency=credit`` (the worker holds at most ``credit`` items, one
        handler thread each). Long-polls where the endpoint has no stream."""
        from querator.client.worker import consume  # noqa: PLC0415 - the worker imports this module

        return consume(self, queue_name, handler, mode="stream", concurrency=credit, **options)


# -- helpers ------------------------------------------------------------------------------------------


def _decode(raw: bytes) -> object:
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _scheduled(new: NewItem, given: object, enqueue_in: Duration | None) -> NewItem:
    """``new`` with ``enqueue_in`` when it was given as a bare payload (a ``NewItem`` keeps its own)."""
    if enqueue_in is None or isinstance(given, NewItem):
        return new
    return replace(new, enqueue_in=enqueue_in)


def _import_wire(item: StoredItem) -> dict[str, Any]:
    body = item.to_wire()
    # Left out at the default, so a server from before priorities (which refuses unknown keys) takes it.
    if item.priority == DEFAULT_PRIORITY:
        del body["priority"]
    if not item.group:
        del body["group"]
    return body


def _retryable(error: ApiError, safety: Safety) -> bool:
    if isinstance(error, RetryError | TooManyRequestsError | RequestInProgressError):
        # The server (or the gateway in front of it) did nothing this time: safe for every call.
        return True
    if isinstance(error, UnknownMethodError | UnsupportedContentError):
        return False
    return isinstance(error, ServerError) and safety is Safety.IDEMPOTENT


def _one_partition(seen: set[int], given: int | None) -> int:
    if given is not None:
        return given
    if len(seen) > 1:
        raise ValueError(f"items of partitions {sorted(seen)} in one call; send one call per partition")
    return next(iter(seen), 0)


def _ids_and_partition(items: Iterable[str | LeasedItem], partition: int | None) -> tuple[list[str], int]:
    ids: list[str] = []
    seen: set[int] = set()
    for item in items:
        if isinstance(item, LeasedItem):
            seen.add(item.partition)
            ids.append(item.id)
        else:
            ids.append(item)
    return ids, _one_partition(seen, partition)


def _pages(fetch: Callable[[str], list[T]], pivot: str, key: Callable[[T], str]) -> Iterator[T]:
    """Follow an inclusive pivot: each page after the first starts with the last item of the one before."""
    last: str | None = None
    while True:
        page = fetch(pivot)
        fresh = page[1:] if last is not None and page and key(page[0]) == last else page
        if not fresh:
            return
        yield from fresh
        last = key(fresh[-1])
        pivot = last
