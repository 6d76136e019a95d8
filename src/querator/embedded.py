"""The queue inside your own program: ``Embedded(store_url)`` is a ``querator.client.Client`` without
a server.

It has every method of the HTTP client with the same arguments, result types and errors (it *is* a
``Client``, whose requests go to the API layer in this process instead of over a socket: the same
request validation, service and error mapping as ``querator serve``), and it runs the reaper in a
background thread. Producer and consumer code switch between the two by changing one line
(docs/embedded.md)::

    from querator.embedded import Embedded

    with Embedded("sqlite:jobs.db") as queue:  # or: Client("http://127.0.0.1:2319")
        queue.create_queue("jobs", lease_timeout="30s", expire_timeout="1h")
        queue.produce("jobs", [b"hello"])
        lease = queue.lease("jobs", 10)
        queue.complete("jobs", lease.items)

Store URLs are those of ``querator serve --store``: ``sqlite:PATH`` (several programs and servers on
one machine may share the file), ``memory`` (this object only) or ``dynamodb`` (the tables named by
the environment).
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from querator.api import paths, routes, schemas
from querator.api.endpoints import ENDPOINTS, Call, idempotency_key, undone_on_failure
from querator.api.errors import WireError, error_response, unknown_path
from querator.bootstrap import open_stores
from querator.client.client import Client
from querator.client.transport import Reply, Transport
from querator.clock import SystemClock
from querator.config import DEFAULT_LEASE_WAIT_CAP
from querator.domain.errors import QueratorError
from querator.observability import flush, quiet_metrics
from querator.service import QueueService

if TYPE_CHECKING:
    from collections.abc import Mapping

#: ``datetime.UTC`` is Python 3.11+; the package supports 3.10 (docs/adr/0021-python-and-spark-versions.md).
UTC = timezone.utc

__all__ = ["Embedded"]

log = logging.getLogger(__name__)

#: How long one reaper run may take before it leaves the rest to the next (it resumes from a bookmark).
_REAPER_BUDGET = timedelta(seconds=5)


class _InProcessTransport(Transport):
    """A ``Transport`` that hands each request to the API layer in this process.

    Domain errors become the API's error replies, so the client raises what it raises over HTTP; any
    other exception (a bug, not a refusal) is raised as it is rather than hidden behind a 500.
    """

    def __init__(self, service: QueueService, lease_wait_cap: timedelta, *, metrics: bool = False) -> None:
        self.base_url = "embedded:"  # no pool: no socket
        self._service = service
        self._wait_cap = lease_wait_cap
        self._metrics = metrics

    def send(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        *,
        read_timeout: float,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        matched = routes.match(path)
        reply_headers: dict[str, str] = {}
        try:
            if matched is None:
                raise unknown_path(method, path)
            route, segment = matched
            request = None
            # A scoped path's queue, decoded as the server would: the body may not name another.
            queue = None if segment is None else paths.check_addressable(unquote(segment))
            if route.request_model is not None:
                request = schemas.parse_request(
                    route.request_model,
                    body,
                    content_type="application/json",
                    limit=route.body_limit,
                    queue_name=queue,
                )
            call = Call(
                now=datetime.now(UTC),
                wait_limit=self._wait_cap,
                idempotency_key=idempotency_key(headers) if route.base is routes.PRODUCE else None,
                scoped_queue=queue,
            )
            # A lease whose reply cannot be built (or whose call is interrupted) gives its items
            # back, as behind the functions' gateway: a lease holds nothing it did not return.
            with undone_on_failure(call, path):
                if self._metrics:
                    try:
                        wire = ENDPOINTS[route.name](self._service, request, call).to_wire()
                    finally:
                        flush()  # as a function does at the end of each invocation
                else:
                    with quiet_metrics():
                        wire = ENDPOINTS[route.name](self._service, request, call).to_wire()
                body = json.dumps(wire).encode()
            status, reply_headers = 200, {k.lower(): v for k, v in call.reply_headers.items()}
        except (QueratorError, WireError) as exc:
            error = error_response(exc)
            status, body = error.status, json.dumps(error.body).encode()
        return Reply(status=status, body=body, headers=reply_headers)

    def close(self) -> None:
        """Nothing to close: there is no connection."""


class Embedded(Client):
    """A ``Client`` over a store in this process, with the reaper in a background thread.

    Parameters
    ----------
    store
        ``sqlite:PATH``, ``memory`` or ``dynamodb``.
    reaper_interval
        Seconds between reaper runs (dead-lettering, expired leases of idle queues, queue deletes).
    lease_wait_cap
        Longest a ``lease`` waits for items, whatever ``request_timeout`` asks.
    metrics
        Write the API's CloudWatch metrics (EMF JSON, one line per call that counted something) to
        stdout, as a Lambda function does; off by default, so the host program's stdout stays its own.
    engine
        The storage engine (``querator.config.ENGINES``); default: ``QUERATOR_ENGINE``, else
        ``querator.config.DEFAULT_ENGINE``.
    client_options
        Passed to ``Client`` (``max_retries``, ``client_id`` ...).

    Raises
    ------
    querator.config.ConfigurationError
        The store URL is not one, or its file cannot be a Querator database (left untouched).
    """

    def __init__(
        self,
        store: str = "memory",
        *,
        reaper_interval: float = 1.0,
        lease_wait_cap: timedelta = DEFAULT_LEASE_WAIT_CAP,
        metrics: bool = False,
        engine: int | None = None,
        **client_options: Any,
    ) -> None:
        # First: a bad store URL or file raises before anything else is made.
        self._stores = open_stores(store, engine=engine)
        super().__init__(f"embedded:{store}", **client_options)
        self.service = QueueService(
            catalog=self._stores.catalog, store=self._stores.store, clock=SystemClock(), log=self._stores.log
        )
        self._transport.close()
        self._transport = _InProcessTransport(self.service, lease_wait_cap, metrics=metrics)
        self._stopping = threading.Event()
        self._reaper = threading.Thread(
            target=self._reap_forever, args=(reaper_interval,), name="querator-reaper", daemon=True
        )
        self._reaper.start()

    def _reap_forever(self, interval: float) -> None:
        while not self._stopping.wait(interval):
            try:
                self.service.reap(datetime.now(UTC), _REAPER_BUDGET)
            except QueratorError:
                # The next run tries again; a busy or failing store must not end the thread.
                log.warning("reaper run failed", exc_info=True)

    def close(self) -> None:
        """Stop the reaper and close the store (the file); the object is unusable afterwards."""
        if not self._stopping.is_set():
            self._stopping.set()
            self._reaper.join(timeout=30)
            self._stores.close()
