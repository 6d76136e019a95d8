"""HTTP wire layer: the queue in a scoped route's path (``/v1/queues/{queue}/<route>``).

A scoped route carries the queue in its path so that the IAM resource of a call names it
(``arn:aws:execute-api:…/POST/v1/queues/orders/queue.produce``) and a policy can grant one queue or a
prefix (``orders-*``). That only holds for names that mean the same in a URL path and in an IAM
resource pattern, so a queue is addressable in a path when its name is made of ASCII letters, digits,
``.``, ``_`` and ``-``, and is not ``.`` or ``..``: characters a URL never encodes (what IAM sees and
what the function reads are the same text), no ``/`` (which would be another path segment), no ``*``
or ``?`` (IAM's wildcards, which would make a grant of that name a pattern), no ``%`` (so decoding
twice cannot turn one name into another). Any other name keeps working through the plain routes
(``/v1/queue.produce``, the body names the queue), which a whole-API policy allows.

Standard library only: the client imports it to build the same paths the server serves.
"""

from __future__ import annotations

import re
from typing import Final

from querator.domain.errors import InvalidRequestError

#: Prefix of every scoped route; the next path segment is the queue.
SCOPED_PREFIX: Final = "/v1/queues/"
#: The path parameter's name (API Gateway's ``pathParameters`` key).
QUEUE_PARAMETER: Final = "queue"
_ADDRESSABLE: Final = re.compile(r"[A-Za-z0-9._-]{1,512}")


def is_addressable(queue_name: str) -> bool:
    """Whether ``queue_name`` can be the queue of a scoped path (see the module's rule)."""
    return _ADDRESSABLE.fullmatch(queue_name) is not None and queue_name not in {".", ".."}


def check_addressable(queue_name: str) -> str:
    """``queue_name`` when it is addressable in a path; else a 400 that says what to use instead."""
    if not is_addressable(queue_name):
        shown = queue_name if len(queue_name) <= 80 else queue_name[:80] + "…"
        raise InvalidRequestError(
            f"the queue in the path, {shown!r}, is not a name a scoped route serves: only ASCII letters, "
            "digits, '.', '_' and '-' (not '.' or '..'); call the plain route (/v1/<route>) with "
            "queue_name in the body",
            field="queue",
        )
    return queue_name


def scoped_template(route_name: str) -> str:
    """The path template of ``route_name``'s scoped twin: ``/v1/queues/{queue}/queue.produce``."""
    return f"{SCOPED_PREFIX}{{{QUEUE_PARAMETER}}}/{route_name}"


def queue_path(route_name: str, queue_name: str) -> str:
    """The scoped path of one call: ``/v1/queues/orders/queue.produce``; 400 for a name that is not
    addressable (use the plain path for it)."""
    return f"{SCOPED_PREFIX}{check_addressable(queue_name)}/{route_name}"


def split_scoped(path: str) -> tuple[str, str] | None:
    """(queue segment as sent, route name) of a path under ``/v1/queues/``; ``None`` for any other.
    The segment is not decoded here: who received the request knows whether it still is encoded."""
    if not path.startswith(SCOPED_PREFIX):
        return None
    segment, slash, route_name = path[len(SCOPED_PREFIX) :].partition("/")
    if not slash or not segment or not route_name:
        return None
    return segment, route_name
