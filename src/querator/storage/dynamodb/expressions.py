"""Storage layer: every condition and update expression of the item store, named.

Each condition says which race it closes. Values are bound by the store: ``:now`` is the caller's
``now`` in epoch microseconds, like every time attribute of the items table.
"""

from __future__ import annotations

from querator.ports import Guard
from querator.storage.dynamodb import schema

NAMES = {
    "#sk": schema.SK,
    "#lease": schema.LEASE_DEADLINE,
    "#expire": schema.EXPIRE_DEADLINE,
    "#attempts": schema.ATTEMPTS,
}

# Claim (lease) an item. ``attribute_not_exists(#lease)``: an id is leased at most once, so of two
# consumers that read the same candidate only the first write wins and the other moves on (an item
# whose lease runs out is requeued under a new id, never leased again under this one).
# ``attribute_exists(#sk)``: the item was not completed, requeued or dead-lettered since the scan.
# ``#expire > :now``: an item past its expire deadline is the reaper's, not a consumer's.
CLAIM_CONDITION = "attribute_exists(#sk) AND attribute_not_exists(#lease) AND #expire > :now"
CLAIM_UPDATE = "SET #lease = :deadline ADD #attempts :one"
CLAIM_NAMES = {k: NAMES[k] for k in ("#sk", "#lease", "#expire", "#attempts")}

RENEW_UPDATE = "SET #lease = :deadline"

# The guards of ``querator.ports.Guard`` as conditions, with the names each one uses.
GUARD_CONDITIONS: dict[Guard, tuple[str, dict[str, str]]] = {
    # Racing consumers: see CLAIM_CONDITION. Used when a scanned, never-leased item is moved.
    Guard.NEVER_LEASED: (
        "attribute_exists(#sk) AND attribute_not_exists(#lease)",
        {"#sk": schema.SK, "#lease": schema.LEASE_DEADLINE},
    ),
    # Complete / retry / renew: the caller's lease must still be running. Once it has run out the
    # item belongs to the queue again, so a slow consumer cannot complete an item someone else may
    # be about to lease (a missing item compares false, so a stale id fails too).
    Guard.LEASE_VALID: ("#lease > :now", {"#lease": schema.LEASE_DEADLINE}),
    # Requeue or dead-letter after a lease ran out: a renew that got in first (lease valid again)
    # or a competitor that already moved the item (item gone) makes this write fail, so it happens once.
    Guard.LEASE_EXPIRED: ("#lease <= :now", {"#lease": schema.LEASE_DEADLINE}),
    # Reaper, non-destructive clear, expiry at lease time: never take an item from a valid lease;
    # a consumer that claims it first wins.
    Guard.NOT_VALIDLY_LEASED: (
        "attribute_exists(#sk) AND (attribute_not_exists(#lease) OR #lease <= :now)",
        {"#sk": schema.SK, "#lease": schema.LEASE_DEADLINE},
    ),
}

# A freshly minted id is unique, but a put must never replace a live item: on import, on the
# recovery of an idempotent produce, and as the replacement of a move.
PUT_ABSENT_CONDITION = "attribute_not_exists(#sk)"
PUT_ABSENT_NAMES = {"#sk": schema.SK}

# The lease scan reads every item of the visible range but only returns those a consumer may act on:
# never leased, or leased with a deadline in the past (requeue or dead-letter).
AVAILABLE_FILTER = "attribute_not_exists(#lease) OR #lease <= :now"
AVAILABLE_FILTER_NAMES = {"#lease": schema.LEASE_DEADLINE}

STATE_PROJECTION = "#sk, #lease, #expire, #attempts, #created"
STATE_PROJECTION_NAMES = {
    "#sk": schema.SK,
    "#lease": schema.LEASE_DEADLINE,
    "#expire": schema.EXPIRE_DEADLINE,
    "#attempts": schema.ATTEMPTS,
    "#created": schema.CREATED_AT,
}

# Start an idempotent produce: the first request with a key writes the record. A retry finds it,
# unless the record belongs to an earlier queue of the same name, or its writer died ("pending" for
# longer than a request can run), or TTL has not yet removed an expired record.
IDEM_BEGIN_CONDITION = (
    "attribute_not_exists(#pk) OR #qcreated <> :qcreated OR #ttl < :now_s"
    " OR (#done = :false AND #started < :stale)"
)
IDEM_BEGIN_NAMES = {
    "#pk": schema.PK,
    "#qcreated": schema.IDEM_QUEUE_CREATED,
    "#ttl": schema.TTL,
    "#done": schema.IDEM_DONE,
    "#started": schema.IDEM_STARTED,
}
