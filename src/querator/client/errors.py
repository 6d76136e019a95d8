"""Python client: typed errors, one class per status of the contract's error envelope.

Every error raised for a reply carries the envelope's ``code``, ``code_text`` and ``message``, the
stable class (the part of ``message`` before the first ``;``) and, for complete / retry / renew, the
ids the server named as not applied. The stable class also picks a narrower subclass where callers
branch on it (an unknown queue, a stale item id), so nobody has to match message text.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Mapping

#: The stable classes (docs/api.md) that a client branches on, as the server sends them before the
#: first ``;``. Copies of ``querator.domain.errors``' ``stable_class`` attributes (the client ships
#: without the server); tests/client checks that each one matches.
QUEUE_NOT_FOUND: Final = "Queue does not exist"
QUEUE_EXISTS: Final = "Queue already exists"
ITEM_NOT_LEASED: Final = "Item id is unknown, stale or not leased"
DUPLICATE_CLIENT: Final = "Client id already has a waiting lease on this queue"
IN_PROGRESS: Final = "A request with this idempotency key is still in progress"

#: ``'<id>' (<reason>)`` as the server lists the ids of a request that were not applied.
_FAILED_ID: Final = re.compile(r"'([^']*)' \(")


class QueratorClientError(Exception):
    """Base of every error this client raises."""


class ConnectionFailedError(QueratorClientError):
    """No reply: the server could not be reached, the connection dropped, or the read timed out.

    ``sent`` is False only when the request certainly never reached the server (the connection
    could not be opened), which is what makes a retry safe for calls that are not idempotent.
    ``timed_out`` is True when the server kept the connection but did not answer within the read
    timeout: a slow call (stats or delete of a large queue), for which a longer timeout is the fix.
    """

    def __init__(self, message: str, *, sent: bool, timed_out: bool = False) -> None:
        super().__init__(message)
        self.sent = sent
        self.timed_out = timed_out


class StreamClosedError(ConnectionFailedError):
    """The server closed the stream, or the connection under it ended: the server went away (it is
    stopping or restarting, or the network dropped), which is not a timeout (``timed_out`` is False).

    ``code`` and ``reason`` are those of the server's close frame (``querator serve`` sends 1001
    ``server stopping`` when it stops); 1006 and ``""`` when the connection ended without one (a
    crash, a cut network). A call whose reply the close cut off has ``sent`` True: it may have been
    applied. Opening a new stream is the remedy (the consumer worker does).
    """

    def __init__(self, message: str, *, sent: bool, code: int, reason: str = "") -> None:
        super().__init__(message, sent=sent)
        self.code = code
        self.reason = reason


class ApiError(QueratorClientError):
    """A reply with an error status and the contract's envelope ``{"code", "code_text", "message"}``."""

    #: The status this class stands for (``0``: any).
    status: int = 0

    def __init__(
        self,
        code: int,
        code_text: str,
        message: str,
        *,
        failed_ids: tuple[str, ...] = (),
        body: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{code} {code_text}: {message}")
        self.code = code
        self.code_text = code_text
        self.message = message
        stable, _, details = message.partition(";")
        #: What to match on: the message up to the first ``;``.
        self.stable_class = stable.strip()
        self.details = details.strip()
        #: Ids of a complete / retry / renew request that were NOT applied (the others were).
        self.failed_ids = failed_ids
        self.body: Mapping[str, Any] = MappingProxyType(dict(body or {}))


class BadRequestError(ApiError):
    """400: invalid request, unknown queue, unknown or stale item id, item not leased."""

    status = 400


class QueueNotFoundError(BadRequestError):
    """400 ``Queue does not exist``."""


class QueueExistsError(BadRequestError):
    """400 ``Queue already exists``."""


class ItemNotLeasedError(BadRequestError):
    """400 ``Item id is unknown, stale or not leased``: ``failed_ids`` names them; the rest were applied."""


class DuplicateClientError(BadRequestError):
    """400: this ``client_id`` already has a waiting lease on the queue."""


class AuthError(ApiError):
    """401 / 403: not authenticated, or not allowed (check SigV4 region and IAM policy)."""


class PayloadTooLargeError(ApiError):
    """413: the body is over the endpoint's size limit."""

    status = 413


class RequestFailedError(ApiError):
    """453: a valid request that cannot succeed now (queue being deleted, dead-letter queue missing)."""

    status = 453


class RequestInProgressError(RequestFailedError):
    """453: a produce with this idempotency key is still being stored; the retry may come later."""


class RetryError(ApiError):
    """454: try again (throttled by the store; for lease, nothing to lease, which ``lease`` hides)."""

    status = 454


class TooManyRequestsError(RetryError):
    """429: API Gateway throttled the request before it reached the service; try again."""

    status = 429


class UnsupportedContentError(ApiError):
    """455: the server did not understand the body or its content type (a client bug)."""

    status = 455


class ServerError(ApiError):
    """5xx: the server failed; ``message`` is generic, the details are in the server's log."""

    status = 500


class UnknownMethodError(ServerError):
    """501: the server has no such method (an older server than this client)."""

    status = 501


_BY_STATUS: Final[Mapping[int, type[ApiError]]] = MappingProxyType(
    {
        400: BadRequestError,
        401: AuthError,
        403: AuthError,
        413: PayloadTooLargeError,
        429: TooManyRequestsError,
        453: RequestFailedError,
        454: RetryError,
        455: UnsupportedContentError,
        501: UnknownMethodError,
    }
)
_BY_STABLE_CLASS: Final[Mapping[str, type[BadRequestError]]] = MappingProxyType(
    {
        QUEUE_NOT_FOUND: QueueNotFoundError,
        QUEUE_EXISTS: QueueExistsError,
        ITEM_NOT_LEASED: ItemNotLeasedError,
        DUPLICATE_CLIENT: DuplicateClientError,
    }
)


def parse_failed_ids(message: str) -> tuple[str, ...]:
    """The ids a ``"…; 2 id(s) not applied, the others were: 'a' (reason), 'b' (reason)"`` message names."""
    _, _, details = message.partition(";")
    return tuple(_FAILED_ID.findall(details))


def error_for(status: int, body: Mapping[str, Any] | None, *, fallback_text: str = "") -> ApiError:
    """The typed error for a reply with ``status`` and a decoded ``body`` (``None`` when not JSON).

    A body without the envelope (a proxy's HTML page, API Gateway's ``{"message": ...}``) still gives
    a typed error: the status decides the class and the text becomes the message.
    """
    body = body or {}
    raw_code = body.get("code")
    code = raw_code if isinstance(raw_code, int) and raw_code >= 400 else status
    code_text = str(body.get("code_text") or body.get("codeText") or _default_text(status))
    message = str(body.get("message") or body.get("Message") or fallback_text or code_text)
    klass: type[ApiError] = _BY_STATUS.get(status) or (ServerError if status >= 500 else ApiError)
    failed_ids: tuple[str, ...] = ()
    stable = message.partition(";")[0].strip()
    if klass is BadRequestError:
        klass = _BY_STABLE_CLASS.get(stable, BadRequestError)
        if klass is ItemNotLeasedError:
            failed_ids = parse_failed_ids(message)
    elif klass is RequestFailedError and stable == IN_PROGRESS:
        klass = RequestInProgressError
    return klass(code, code_text, message, failed_ids=failed_ids, body=body)


def _default_text(status: int) -> str:
    return {
        400: "Bad Request",
        401: "Unauthorized",
        403: "Forbidden",
        413: "Request Entity Too Large",
        429: "Too Many Requests",
        453: "Request Failed",
        454: "Retry Request",
        455: "Unsupported Content",
        500: "Internal Server Error",
        501: "Not Implemented",
        502: "Bad Gateway",
        503: "Service Unavailable",
        504: "Gateway Timeout",
    }.get(status, "Error")
