"""Domain layer: an item's group (a tenant, a customer, a webhook endpoint).

A group is 1-128 bytes of printable UTF-8; an item without one has the empty group (``""`` on the
wire). Items keep their group wherever they go: requeue, retry, dead-lettering, redrive, import.
Fair delivery across groups is the next step (docs/adr/0080-priority-fair-redrive.md).
"""

from __future__ import annotations

import hashlib

from querator.domain.errors import InvalidRequestError
from querator.domain.text import check_printable

MAX_GROUP_BYTES = 128


def validate_group(value: object, what: str = "group") -> str:
    """``value`` as a group, or ``InvalidRequestError`` naming ``what``."""
    if not isinstance(value, str):
        raise InvalidRequestError(f"{what} must be a string", field=what)
    # Shown in logs, listings and the console on one line, as queue names are.
    check_printable(value, what)
    if len(value.encode()) > MAX_GROUP_BYTES:
        raise InvalidRequestError(f"{what} is longer than {MAX_GROUP_BYTES} bytes", field=what)
    return value


def group_lane(group: str) -> str:
    """The key prefix of ``group`` inside a priority's band in a fair queue: ``g`` and 16 hex digits
    of its SHA-256 (``""``, items without a group, has one too). Ids stay short and URL-safe
    whatever the group holds; two groups sharing 64 bits of hash would share a turn."""
    return "g" + hashlib.sha256(group.encode()).hexdigest()[:16]


__all__ = ["MAX_GROUP_BYTES", "group_lane", "validate_group"]
