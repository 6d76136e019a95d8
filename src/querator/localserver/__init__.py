"""Local development: the whole service on 127.0.0.1, running the real Lambda handlers.

- ``server``: ``LocalServer``: an asyncio event loop for every connection (keep-alive, long-polls,
  WebSocket streams), the handlers on worker threads, the reaper on a thread of its own; the store
  is a store URL (``querator.config.parse_store``) handed to the handlers' composition root through
  ``QUERATOR_STORE``: ``sqlite:PATH`` or ``memory``; for ``dynamodb``, ``AWS_ENDPOINT_URL_DYNAMODB``
  when set, otherwise an embedded single-threaded moto server (``querator.localstore``).
- ``events``: the proxy events and Lambda context the handlers receive, as API Gateway and Lambda
  build them.
- ``http1``: HTTP/1.1 framing (strict: ``Content-Length`` only).
- ``waiting``: waiting long-polls and streams with credit, parked in the loop and woken by produce.
"""

from __future__ import annotations

from querator.localserver.events import (
    LocalContext,
    load_handler,
    proxy_event,
    response_headers,
    scheduled_event,
)
from querator.localserver.server import (
    BODY_READ_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_PORT,
    REQUEST_LOGGER,
    STOP_GRACE,
    LocalServer,
)

__all__ = [
    "BODY_READ_TIMEOUT",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_PORT",
    "REQUEST_LOGGER",
    "STOP_GRACE",
    "LocalContext",
    "LocalServer",
    "load_handler",
    "proxy_event",
    "response_headers",
    "scheduled_event",
]
