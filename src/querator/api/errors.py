"""HTTP wire layer: the one table from domain errors to HTTP status, and the contract's error envelope.

The domain knows no HTTP; this module is the only place that decides a status. Statuses are looked
up through the error's MRO, so a new subclass inherits its parent's status unless the table names it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from http import HTTPStatus
from types import MappingProxyType
from typing import Any, Final

from querator.api.wire import Integer, Message, Text, Timestamp, field
from querator.domain.errors import (
    ConflictError,
    InvalidRequestError,
    ItemNotLeasedError,
    LeaseRateLimitedError,
    PayloadTooLargeError,
    QueratorError,
    RetryLaterError,
    StoreUnavailableError,
)
from querator.domain.model import IdFailure

BAD_REQUEST: Final = 400
UNAUTHORIZED: Final = 401
FORBIDDEN: Final = 403
PAYLOAD_TOO_LARGE: Final = 413
REQUEST_FAILED: Final = 453
RETRY_REQUEST: Final = 454
UNSUPPORTED_CONTENT: Final = 455
INTERNAL_ERROR: Final = 500
NOT_IMPLEMENTED: Final = 501

#: Domain error class → HTTP status. Resolved through the MRO, so order does not matter here:
#: ``PayloadTooLargeError`` is an ``InvalidRequestError`` but finds its own row first.
STATUS_BY_ERROR: Final[Mapping[type[QueratorError], int]] = MappingProxyType(
    {
        InvalidRequestError: BAD_REQUEST,
        PayloadTooLargeError: PAYLOAD_TOO_LARGE,
        ConflictError: REQUEST_FAILED,
        RetryLaterError: RETRY_REQUEST,
        # Throttling is a RetryLaterError (454); this is the store failing after its own retries.
        StoreUnavailableError: INTERNAL_ERROR,
        QueratorError: INTERNAL_ERROR,
    }
)

#: ``code_text`` of the envelope. Fixed here rather than taken from ``http.HTTPStatus`` because
#: Python renamed some phrases (413) between versions and the nonstandard codes are Querator's.
CODE_TEXT: Final[Mapping[int, str]] = MappingProxyType(
    {
        BAD_REQUEST: "Bad Request",
        UNAUTHORIZED: "Unauthorized",
        FORBIDDEN: "Forbidden",
        PAYLOAD_TOO_LARGE: "Request Entity Too Large",
        REQUEST_FAILED: "Request Failed",
        RETRY_REQUEST: "Retry Request",
        UNSUPPORTED_CONTENT: "Unsupported Content",
        INTERNAL_ERROR: "Internal Server Error",
        NOT_IMPLEMENTED: "Not Implemented",
    }
)

#: What a 500 says; the details go to the log only, they may name tables or AWS internals.
GENERIC_INTERNAL_MESSAGE: Final = "Internal error"


class ErrorBody(Message):
    """The contract's error envelope; ``message`` is ``"<stable class>; <details>"``."""

    code: int = field(Integer())
    code_text: str = field(Text())
    message: str = field(Text())
    #: Only on a lease held back by a rate limit: when the limit has a lease again.
    next_lease_at: datetime | None = field(Timestamp(), default=None)


class WireError(Exception):
    """A request refused by the wire itself, before any domain code runs (455, 501, wrong method).

    Not a ``QueratorError``: these are HTTP facts (a path, a content type), not queue states.
    """

    def __init__(self, status: int, stable_class: str, details: str = "") -> None:
        super().__init__(compose_message(stable_class, details))
        self.status = status
        self.stable_class = stable_class
        self.details = details


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """A status and the JSON body to send with it."""

    status: int
    body: dict[str, Any]


def code_text(status: int) -> str:
    """The envelope's ``code_text`` for ``status``."""
    known = CODE_TEXT.get(status)
    if known is not None:
        return known
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def status_for(error: BaseException | type[BaseException]) -> int:
    """HTTP status of a domain error (class or instance), most specific class first; else 500."""
    error_type = error if isinstance(error, type) else type(error)
    if isinstance(error, WireError):
        return error.status
    for klass in error_type.__mro__:
        if issubclass(klass, QueratorError) and klass in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[klass]
    return INTERNAL_ERROR


def stable_class(error_type: type[BaseException]) -> str:
    """The phrase clients match on: a domain error's ``stable_class``; anything else is internal."""
    if issubclass(error_type, QueratorError):
        return error_type.stable_class
    return GENERIC_INTERNAL_MESSAGE


def compose_message(stable: str, details: str = "") -> str:
    """``"<stable>; <details>"``, or just ``stable`` when the details add nothing."""
    details = details.strip()
    if not details or details.rstrip(".") == stable:
        return stable
    return f"{stable}; {details}"


def envelope(status: int, message: str, *, next_lease_at: datetime | None = None) -> dict[str, Any]:
    """The error body for ``status``: ``{"code", "code_text", "message"}`` (and ``next_lease_at``
    for a lease held back by a rate limit)."""
    return ErrorBody(
        code=status, code_text=code_text(status), message=message, next_lease_at=next_lease_at
    ).to_wire()


def error_response(error: BaseException, *, request_id: str | None = None) -> ErrorResponse:
    """Status and envelope for any exception.

    A domain error gets its table status and ``"<stable class>; <message>"``. A 500, and any exception
    outside the domain tree, gets a generic message (with ``request_id`` when given, so a user can
    quote it) and never the details: log the exception at the edge before calling this.
    """
    if isinstance(error, WireError):
        return ErrorResponse(error.status, envelope(error.status, str(error)))
    status = status_for(error) if isinstance(error, QueratorError) else INTERNAL_ERROR
    if status == INTERNAL_ERROR:
        details = f"request id {request_id}" if request_id else ""
        return ErrorResponse(status, envelope(status, compose_message(GENERIC_INTERNAL_MESSAGE, details)))
    next_lease_at = error.context.get("next_lease_at") if isinstance(error, LeaseRateLimitedError) else None
    message = compose_message(stable_class(type(error)), str(error))
    return ErrorResponse(
        status,
        envelope(
            status, message, next_lease_at=next_lease_at if isinstance(next_lease_at, datetime) else None
        ),
    )


def unsupported_content(details: str) -> WireError:
    """455: the body is not JSON, has a key the message does not define, or is not ``application/json``."""
    return WireError(UNSUPPORTED_CONTENT, "Unsupported content", details)


def unknown_path(method: str, path: str) -> WireError:
    """501: no route has this path; with the nearest one when a path was likely misspelt
    (``/v1/queue.list`` → ``did you mean /v1/queues.list``)."""
    from querator.api import routes  # noqa: PLC0415 - routes imports this module; only misses pay

    details = f"no such method: {method} {path}"
    nearest = did_you_mean(path, [route.path for route in routes.ROUTES])
    return WireError(NOT_IMPLEMENTED, "Not implemented", f"{details}; {nearest}" if nearest else details)


def did_you_mean(wrong: str, known: Sequence[str]) -> str:
    """``"did you mean 'x'"`` for the nearest of ``known`` to ``wrong``, or ``""`` when none is near."""
    import difflib  # noqa: PLC0415 - only a refused request needs it; cold starts do not

    nearest = difflib.get_close_matches(wrong, known, n=1, cutoff=0.75)
    return f"did you mean {nearest[0]}" if nearest else ""


def wrong_method(method: str, path: str, allowed: str) -> WireError:
    """400: the path exists but takes another method (the contract's status, not 405)."""
    return WireError(BAD_REQUEST, stable_class(InvalidRequestError), f"{path} takes {allowed}, not {method}")


def body_too_large(size: int, limit: int) -> PayloadTooLargeError:
    """413 (through the table): the body is over the endpoint's limit."""
    return PayloadTooLargeError(f"body is {size} bytes; this endpoint takes at most {limit}", limit=limit)


def failed_ids_error(failed: Sequence[IdFailure], *, applied: int) -> ItemNotLeasedError:
    """400 naming every id of a complete / retry / renew / reprioritize request that failed.

    ``applied`` ids of the request were applied already: the message says how many, after the
    failed ones, so a client does not resend them and nobody reads the list as the applied ids
    (it once said "N id(s) not applied, the others were: <the failed ids>"). The Python client
    reads the ids back from the ``'<id>' (<reason>)`` pairs.
    """
    listed = ", ".join(f"'{f.id}' ({f.reason})" for f in failed)
    return ItemNotLeasedError(
        f"{len(failed)} of {len(failed) + applied} id(s) failed and were not applied: {listed}; "
        f"{applied_text(applied)}",
        ids=[f.id for f in failed],
    )


def applied_text(applied: int) -> str:
    """How many ids of a request with failed ids were applied, as the failure message ends."""
    return f"the other {applied} were applied" if applied else "none was applied"
