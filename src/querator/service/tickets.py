"""Stream tickets: what lets a WebSocket subscribe to one queue under a per-queue grant.

The WebSocket API authorizes only ``$connect``, which names no queue, so IAM cannot say which queues
a stream may carry. A consumer granted a queue asks its scoped REST path for a ticket
(``POST /v1/queues/<queue>/stream.ticket``, authorized by IAM like a lease of that queue) and shows
the ticket when it subscribes; the stream refuses a subscribe to a queue its ticket does not name.

A ticket is ``<expiry (Unix seconds)>.<queue, base64url>.<HMAC-SHA256, base64url>``, signed with a
random key kept in the catalog, made on first use (``QueueCatalog.stream_key``): nothing in the
repository or the stack's template can forge one. It is short-lived: it only has to reach the
subscribe that follows it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Final

from querator.domain.errors import InvalidRequestError

if TYPE_CHECKING:
    from querator.ports import QueueCatalog

#: How long a ticket is good for: time enough to open a connection and subscribe.
TICKET_TTL: Final = timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class StreamTicket:
    ticket: str
    expires_at: datetime


class TicketSigner:
    """Issues and checks stream tickets with the catalog's key (read once per process)."""

    def __init__(self, catalog: QueueCatalog) -> None:
        self._catalog = catalog
        self._key: bytes | None = None

    def _signing_key(self, *, create: bool) -> bytes | None:
        """The catalog's key; ``create``: make it if no ticket was ever issued (only ``issue`` may:
        the stream function, which checks, cannot write the catalog)."""
        if self._key is None:
            key = self._catalog.stream_key(secrets.token_urlsafe(32) if create else None)
            self._key = key.encode() if key is not None else None
        return self._key

    @staticmethod
    def _signature(key: bytes, expiry: int, queue_name: str) -> str:
        digest = hmac.new(key, f"{expiry}\n{queue_name}".encode(), hashlib.sha256).digest()
        return _b64(digest)

    def issue(self, queue_name: str, now: datetime) -> StreamTicket:
        expires_at = (now + TICKET_TTL).astimezone(timezone.utc).replace(microsecond=0)
        expiry = int(expires_at.timestamp())
        key = self._signing_key(create=True)
        if key is None:  # a catalog given a candidate always answers a key
            raise RuntimeError("the catalog gave no stream ticket key")
        ticket = f"{expiry}.{_b64(queue_name.encode())}.{self._signature(key, expiry, queue_name)}"
        return StreamTicket(ticket=ticket, expires_at=expires_at)

    def check(self, ticket: str, queue_name: str, now: datetime) -> None:
        """Raises ``InvalidRequestError`` unless ``ticket`` is a valid, unexpired ticket of ``queue_name``."""
        expiry_text, _, rest = ticket.partition(".")
        named, _, signature = rest.partition(".")
        try:
            expiry = int(expiry_text)
            ticket_queue = base64.urlsafe_b64decode(named + "=" * (-len(named) % 4)).decode()
        except ValueError:
            raise InvalidRequestError("the stream ticket is not one", field="ticket") from None
        key = self._signing_key(create=False)
        # No key yet: no ticket was ever issued, so none can be good.
        if key is None or not hmac.compare_digest(signature, self._signature(key, expiry, ticket_queue)):
            raise InvalidRequestError("the stream ticket is not one this service issued", field="ticket")
        if ticket_queue != queue_name:
            raise InvalidRequestError(
                f"the stream ticket is for queue '{ticket_queue}', not '{queue_name}'", field="ticket"
            )
        if now.timestamp() >= expiry:
            raise InvalidRequestError(
                "the stream ticket has expired; ask stream.ticket again", field="ticket"
            )


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")
