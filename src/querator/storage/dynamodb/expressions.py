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
# A claim on its own (not in a transaction) also writes its claim token (schema.CLAIM_TOKEN).
CLAIM_OWNED_UPDATE = "SET #lease = :deadline, #claim = :claim ADD #attempts :one"
CLAIM_OWNED_NAMES = {**CLAIM_NAMES, "#claim": schema.CLAIM_TOKEN}

RENEW_UPDATE = "SET #lease = :deadline"
NEXT_PRIORITY_UPDATE = "SET #np = :priority"

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

# A range read returns only the items a consumer may act on: never leased, or leased with a deadline
# in the past (requeue or dead-letter). The lease cursor keeps valid leases out of the range it
# reads, so the filter drops only the few claimed since the cursor last moved.
AVAILABLE_FILTER = "attribute_not_exists(#lease) OR #lease <= :now"
AVAILABLE_FILTER_NAMES = {"#lease": schema.LEASE_DEADLINE}
# The sweep behind the cursor looks for items nobody ever leased: a write that landed below the
# cursor after a lease read past its place (a straggler).
NEVER_LEASED_FILTER = "attribute_not_exists(#lease)"
NEVER_LEASED_FILTER_NAMES = {"#lease": schema.LEASE_DEADLINE}
# The schedule pass counts the scheduled items that came due since the last pass.
SCHEDULED_FILTER = "attribute_exists(#enqueue)"
SCHEDULED_FILTER_NAMES = {"#enqueue": schema.ENQUEUE_AT}

STATE_PROJECTION = "#sk, #lease, #expire, #attempts, #created, #enqueue, #size"
STATE_PROJECTION_NAMES = {
    "#sk": schema.SK,
    "#lease": schema.LEASE_DEADLINE,
    "#expire": schema.EXPIRE_DEADLINE,
    "#attempts": schema.ATTEMPTS,
    "#created": schema.CREATED_AT,
    "#enqueue": schema.ENQUEUE_AT,
    "#size": schema.PAYLOAD_SIZE,
}

# Counters of the head row: every write that adds, leases, settles or removes items adds its deltas
# in one UpdateItem after the items' write (ADD creates the row and the attributes on first use).
# Nothing conditions it: two writers' deltas add up in any order.
HEAD_COUNT_UPDATE_NAMES = {
    "#ver": schema.HEAD_VERSION,
    "#n": schema.HEAD_ITEMS,
    "#nl": schema.HEAD_LEASED,
    "#ns": schema.HEAD_SCHEDULED,
    "#ca": schema.HEAD_CREATED_SUM,
    "#cl": schema.HEAD_LEASED_CREATED_SUM,
    "#cs": schema.HEAD_SCHEDULED_CREATED_SUM,
}
# The cumulative counts, added by the same update; a recount never sets them (it cannot know history).
HEAD_TOTAL_NAMES = {"#tp": schema.HEAD_PRODUCED, "#tc": schema.HEAD_COMPLETED}
# A new partition's schedule mark starts at its first write, so the schedule pass never reads from
# the beginning of time, and its first recount comes a recount period later, not on the next run.
# (The sweep mark starts empty: its first pass reads what is below the cursor once, a straggler of
# the very first write included.)
HEAD_MARKS_INIT = "#sm = if_not_exists(#sm, :mark), #rct = if_not_exists(#rct, :now)"
HEAD_MARKS_NAMES = {"#sm": schema.HEAD_SCHEDULE_MARK, "#rct": schema.HEAD_RECOUNTED_AT}

# The schedule pass moves the mark and takes what came due off the scheduled count once: of two
# reapers that counted the same range, the second finds the mark moved and changes nothing.
SCHEDULE_PASS_CONDITION = "#sm = :old"  # noqa: S105 - an expression, not a secret

# A recount replaces the counters only if no counter moved since it began (a missing version is 0).
RECOUNT_CONDITION = "#ver = :ver"
RECOUNT_FROM_ZERO_CONDITION = "attribute_not_exists(#ver) OR #ver = :ver"

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

# Fair delivery: group lane rows (``~R<lane>``) and group ledger rows (``~S<g>``).
#
# A write of items into a group lane first registers it (an upsert: the row exists from then on).
LANE_REGISTER_UPDATE = "SET #t = :now"
LANE_NAMES = {"#t": schema.LANE_REGISTERED}
# A lease's cursor or the sweep's mark lands on the lane row only while it exists: the reaper may
# have dropped the (empty, idle) lane since the read, and an upsert would bring back a row with no
# registration time. A lane registered again starts from its beginning, as a new one does.
LANE_EXISTS_CONDITION = "attribute_exists(#t)"
# The reaper drops an idle lane only if no write registered it since it looked (see ``drop_band``).
LANE_DROP_CONDITION = "#t < :before"
# A capped claim enters its lease in the group's ledger only at the version the caller counted the
# ledger's leases at: of two leases that both saw a free slot, only the first takes it.
LEDGER_NEW_CONDITION = "attribute_not_exists(#v)"
LEDGER_VERSION_CONDITION = "#v = :version"
# Removing ended leases never creates a ledger row (an update would upsert one with no version).
LEDGER_EXISTS_CONDITION = "attribute_exists(#v)"
LEDGER_NAMES = {"#v": schema.LEDGER_VERSION}
