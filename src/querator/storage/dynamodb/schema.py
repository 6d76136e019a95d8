"""Storage layer: the DynamoDB tables, defined once.

The CDK app, the test fixtures and the embedded local store all build their tables from this module,
so key names cannot drift. See docs/adr/0001-data-model.md for why the keys look like this.

Items table (docs/adr/0050-engine-v2.md)
    ``pk`` (S, hash)  ``<queue>~<partition>``: one queue partition is one DynamoDB partition key.
    ``sk`` (S, range) under one ``pk``, three kinds of rows, told apart by their first character:

    - ``0``-``f``: items; ``sk`` is the item id, which sorts in visible-at (FIFO) order
      (``querator.domain.ids``).
    - ``~A``: the partition's head row: the lease cursor (every item below it is leased or gone),
      the sweep and schedule marks, and the counters ``queue.stats`` reads.
    - ``~L<deadline><unique>``: a lease record, written by each lease call before it claims: the
      ids it may lease, sorted by lease deadline, so expired leases are one key range away.
    - ``~R<lane>``: a group lane of a fair queue (``querator.domain.priority.lane_of``): when it was
      last registered, its cursor and its sweep mark. A band's lanes are one key range.
    - ``~S<g>``: the ledger of a capped fair queue's group ``g`` (the lane without its band): a
      version and an ``e<item id>`` attribute per lease with its deadline.

    The head row and the lease records due are read by one Query from ``~A`` to ``~L<now>``, so
    every other kind of row sorts after ``~L``.

    Because ``~`` sorts after every hex digit, item ranges never touch the other rows. Idempotency
    records of produce live under ``<queue>~idem~<key digest>`` with ``sk`` = ``~`` and expire
    through TTL on ``ttl``; so do lease rate-limit buckets (``<queue>~rate~<bucket>``, ``""`` the
    queue's, ``g<16 hex>`` a group's; a partition key each, so no bucket's writes crowd another's),
    a day after they were last full.

Claim logs (engine v3, docs/adr/0100-engine-v3-candidates.md; ``querator.ports.log``)
    One log (``LogKey``: a lane of a partition) is two partition keys of the items table, apart from
    engine v2's keys: its rows under ``<queue>~<partition>~v<lane>~r`` (``log_rows_key``), the rest
    under ``<queue>~<partition>~v<lane>`` (``log_partition_key``). The two take DynamoDB's 1,000
    write units a second each: the head's three small writes a call (take, claim, complete) on one,
    the rows' bytes on the other, so a partition carries 3,333 items a second in calls of 10, where
    one key for both carried 2,000 (docs/adr/0100-engine-v3-candidates.md, the ceiling).

    Under the rows' key:

    - ``D<16 hex position>``: a packed row, written once, holding the items (codec maps without
      ids) at consecutive positions from the one in its key; ``ttl`` is its items' latest expire
      deadline plus a day (DynamoDB deletes it free). A filler row (``f``, no items) marks one
      position of a filled hole: one per position, so a late writer whose row starts anywhere in
      a filled range finds its first position taken.

    Under the log's key, told apart by their first character:

    - ``H``: the head: the sequencer ``tail``, the claim cursor ``cur``, lease records in ``ls``
      (token -> count, deadline, claimed at, settled positions, version, explicit positions of a
      split-off record, the coming priorities of positions reprioritized while leased) with each
      record's first position in ``la`` (token -> start), tombstones ``tb`` (positions deleted
      while waiting), counters (``nl`` positions leased, ``sp`` records spilled, ``ns`` scheduled,
      ``tp``/``tc`` produced and completed), size marks ``z<step>`` (where the last append with an
      item of that size step ended: what may wait bounds a claim's run, for the reply cap; ``lg``,
      the largest item ever, on heads written before them), the first position ``fs``,
      and lower bounds (``se`` of the spilled records' deadlines, ``nd`` of the schedule's due
      times, moved with the schedule version ``sv``).
    - ``P<16 hex start><token>``: a lease record spilled out of the head (at 32 records the claim
      that adds one moves the 16 oldest out in one transaction); a settle finds the record of a
      position with one Query on ``P`` up to ``P<position>~``, descending.
    - ``L<14 hex deadline us><16 hex start><token>``: a spilled record's deadline index, pointing at
      its ``P`` row (``r``): ``expired`` is one Query from ``L`` to ``L<now>~``.
    - ``S<14 hex due us><10 hex>``: a scheduled item, one row each, moved to the tail when due.

Catalog table
    ``kind`` (S, hash) ``queue`` for queues (so ``queues.list`` is one ordered Query),
    ``reaper`` for the reaper's bookmark. ``name`` (S, range) the queue name.
"""

from __future__ import annotations

from typing import Any

SEPARATOR = "~"

# Items table attribute names. Short, because names count toward every item's billed size.
PK = "pk"
SK = "sk"
PAYLOAD = "payload"
REFERENCE = "ref"
ENCODING = "enc"
KIND = "kind"
ATTEMPTS = "attempts"
LEASE_DEADLINE = "lease"
EXPIRE_DEADLINE = "expire"
CREATED_AT = "created"
ENQUEUE_AT = "enqueue"
SOURCE_ID = "src"
SOURCE_QUEUE = "sq"
NEXT_PRIORITY = "np"
#: The item's group (absent: none).
GROUP = "grp"
#: Why the item last failed and how many failures it had (absent: it never failed), so an item that
#: never fails stores not a byte more.
LAST_REASON = "why"
FAILURES = "nf"
#: What the item may add to a lease reply (``codec.reply_size``), stored only from 1 KB on, so a lease
#: keeps its reply under the Lambda response limit from the scan alone (smaller items count as 1 KB).
PAYLOAD_SIZE = "sz"
#: In place of ``PAYLOAD``: the key of the S3 object holding a payload too large for a row
#: (``querator.storage.dynamodb.objects``); ``PAYLOAD_SIZE`` still says its size.
PAYLOAD_OBJECT = "po"
#: 8 random bytes a lease's claim writes with the lease deadline: when botocore retries a claim whose
#: reply was lost, the retry fails its condition on the claim's own write, and finding its own token
#: tells it the item is its own (a claim in a group is a transaction, idempotent by its token).
CLAIM_TOKEN = "ct"  # noqa: S105 - an attribute name, not a secret
TTL = "ttl"

# The rows that are not items, and what each holds.
HEAD_SK = f"{SEPARATOR}A"
LEASE_RECORD_PREFIX = f"{SEPARATOR}L"
LEASE_RECORD_IDS = "ids"
LEASE_RECORD_DEADLINE = "dl"
# Head row attributes.
HEAD_CURSOR = "cur"
HEAD_SWEEP = "swp"
#: A band other than priority 5's is in use while ``bt<band>`` says when it was last registered
#: (``bt.3``, ``btp7``; the reaper removes it once the band is empty and idle); its cursor and sweep
#: mark are ``cur<band>`` and ``swp<band>``.
HEAD_BAND_REGISTERED = "bt"
HEAD_SCHEDULE_MARK = "sm"
HEAD_ITEMS = "n"
HEAD_LEASED = "nl"
HEAD_SCHEDULED = "ns"
HEAD_CREATED_SUM = "ca"
HEAD_LEASED_CREATED_SUM = "cl"
HEAD_SCHEDULED_CREATED_SUM = "cs"
#: Items produced and completed, ever (never recounted).
HEAD_PRODUCED = "tp"
HEAD_COMPLETED = "tc"
HEAD_VERSION = "ver"
#: The recount under way: a map of the ``ports.Recount`` fields (absent: none).
HEAD_RECOUNT = "rc"
HEAD_RECOUNTED_AT = "rct"
#: Group lanes were registered in the partition (fair delivery; never unset).
HEAD_HAS_LANES = "gl"
#: ``rg<band>``: the lane of ``band`` a fair lease served last.
HEAD_RING = "rg"

# Group lane rows (fair queues): ``~R`` + the lane (``querator.domain.priority.lane_of``).
LANE_PREFIX = f"{SEPARATOR}R"
#: When a write of items into the lane last registered it (the reaper drops idle lanes by it).
LANE_REGISTERED = "t"
#: The lane's lease cursor and sweep mark (absent: the lane's start).
LANE_CURSOR = HEAD_CURSOR
LANE_SWEEP = HEAD_SWEEP

# Group ledger rows (capped fair queues): ``~S`` + the group lane without its band, so a group's
# leases of every priority count against one cap. Not ``~K``: that would sort between the head row
# and the lease records, which the lease's first Query reads as one range.
LEDGER_PREFIX = f"{SEPARATOR}S"
#: Moves on with every claim into the ledger (absent: 0, the row was never written).
LEDGER_VERSION = "v"
#: ``e<item id>``: the lease deadline of a lease the ledger holds. Top-level attributes, not a map:
#: an update cannot create a map and set a key of it in one expression.
LEDGER_ENTRY_PREFIX = "e"

# Idempotency record attributes (same table).
IDEM_SK = SEPARATOR
IDEM_PARTITION = "part"
IDEM_IDS = "ids"
IDEM_DONE = "done"
IDEM_STARTED = "started"
IDEM_QUEUE_CREATED = "qcreated"
IDEM_OWNER = "own"

# Lease rate-limit bucket attributes (same table): GCRA's theoretical arrival time, in microseconds.
BUCKET_TAT = "tat"


def bucket_key(queue: str, bucket: str) -> dict[str, dict[str, str]]:
    """The key of a lease rate-limit bucket's row (``bucket``: ``""`` the queue's, else a group's)."""
    return {PK: {"S": f"{queue}{SEPARATOR}rate{SEPARATOR}{bucket}"}, SK: {"S": IDEM_SK}}


# Claim logs (engine v3): row kinds and attributes (see the docstring). Short: every name is billed.
LOG_MARK = "v"
#: After a log's partition key and the separator: the key of its packed rows.
LOG_ROWS_MARK = "r"
LOG_HEAD_SK = "H"
LOG_ROW_PREFIX = "D"
LOG_RECORD_PREFIX = "P"
LOG_EXPIRY_PREFIX = "L"
LOG_SCHEDULE_PREFIX = "S"
#: Bytes of encoded items a packed row takes at most (an item larger than that gets a row alone).
LOG_ROW_BYTES = 16 * 1024
LOG_TAIL = "tail"
LOG_CURSOR = "cur"
LOG_RECORDS = "ls"
LOG_STARTS = "la"
LOG_TOMBSTONES = "tb"
LOG_LEASED = "nl"
LOG_SPILLED = "sp"
LOG_SPILLED_EXPIRY = "se"
LOG_SCHEDULED = "ns"
LOG_NEXT_DUE = "nd"
LOG_SCHEDULE_VERSION = "sv"
LOG_LARGEST = "lg"
#: Set once a row with a payload object was written to the log: what it settles may end an
#: object, so it reads the rows of what it ended (a log that never held one reads nothing more).
LOG_HAS_OBJECTS = "po"
#: ``z<step>``: where the last append with an item of that size step ended (``log.base.size_step``).
LOG_SIZE_MARK_PREFIX = "z"
#: The log's first position (the clock when it was first written): where a hole at its very start begins.
LOG_FIRST = "fs"
#: Items produced and positions completed, ever (``LogHead.produced``, ``completed``).
LOG_PRODUCED = "tp"
LOG_COMPLETED = "tc"
#: Sums of ``created_at`` seconds (``ports.log.LogAges``): of the waiting items (added by the take,
#: so a writer that died between its two steps leaves its items' until the log is next empty), of
#: the leased ones; and a record's, of its unsettled items.
LOG_WAITING_CREATED = "wc"
LOG_LEASED_CREATED = "lc"
LOG_RECORD_CREATED = "cs"
# A packed row: its items; a filler's flag.
LOG_ITEMS = "it"
LOG_FILLER = "f"
# A lease record (a map in ``ls``, or a ``P`` row): count from its start, deadline and claim time
# (us), settled (or moved, filled, deleted) positions, version, explicit positions, token, start.
LOG_COUNT = "k"
LOG_DEADLINE = "d"
LOG_CLAIMED_AT = "c"
LOG_SETTLED = "x"
LOG_VERSION = "v"
LOG_POSITIONS = "p"
LOG_HOLES = "h"
LOG_TOKEN = "t"  # noqa: S105 - an attribute name, not a secret
#: A record's positions given the priority they go back with: position -> priority (a map).
LOG_PRIORITIES = "n"
LOG_START = "s"
#: An ``L`` row's ``P`` row.
LOG_RECORD_REF = "r"


def log_partition_key(queue: str, partition: int, lane: str) -> str:
    """The partition key of a claim log: a lane of a queue partition (``querator.ports.log``)."""
    return f"{queue}{SEPARATOR}{partition}{SEPARATOR}{LOG_MARK}{lane}"


def log_rows_key(queue: str, partition: int, lane: str) -> str:
    """The partition key of a claim log's packed rows (``D…``): apart from its head's, so the two
    do not share one key's write units."""
    return f"{log_partition_key(queue, partition, lane)}{SEPARATOR}{LOG_ROWS_MARK}"


# Catalog table.
CATALOG_HASH = "kind"
CATALOG_RANGE = "name"
CATALOG_QUEUE_KIND = "queue"
CATALOG_REAPER_KIND = "reaper"
#: The stream tickets' signing key (one record, name "stream"): made on first use, never in the repo.
CATALOG_SECRET_KIND = "secret"  # noqa: S105 - the record kind, not a secret


def partition_key(queue: str, partition: int) -> str:
    return f"{queue}{SEPARATOR}{partition}"


def idempotency_key(queue: str, digest: str) -> str:
    return f"{queue}{SEPARATOR}idem{SEPARATOR}{digest}"


def items_table_definition(table_name: str) -> dict[str, Any]:
    """``CreateTable`` arguments for the items table (on-demand)."""
    return {
        "TableName": table_name,
        "AttributeDefinitions": [
            {"AttributeName": PK, "AttributeType": "S"},
            {"AttributeName": SK, "AttributeType": "S"},
        ],
        "KeySchema": [
            {"AttributeName": PK, "KeyType": "HASH"},
            {"AttributeName": SK, "KeyType": "RANGE"},
        ],
        "BillingMode": "PAY_PER_REQUEST",
    }


def catalog_table_definition(table_name: str) -> dict[str, Any]:
    """``CreateTable`` arguments for the catalog table (on-demand)."""
    return {
        "TableName": table_name,
        "AttributeDefinitions": [
            {"AttributeName": CATALOG_HASH, "AttributeType": "S"},
            {"AttributeName": CATALOG_RANGE, "AttributeType": "S"},
        ],
        "KeySchema": [
            {"AttributeName": CATALOG_HASH, "KeyType": "HASH"},
            {"AttributeName": CATALOG_RANGE, "KeyType": "RANGE"},
        ],
        "BillingMode": "PAY_PER_REQUEST",
    }


def create_tables(client: Any, *, items_table: str, catalog_table: str) -> None:
    """Create both tables (idempotently) and wait until they are active; for local stores and tests."""
    existing = set(client.list_tables().get("TableNames", []))
    for definition in (items_table_definition(items_table), catalog_table_definition(catalog_table)):
        name = definition["TableName"]
        if name in existing:
            continue
        client.create_table(**definition)
        client.get_waiter("table_exists").wait(
            TableName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100}
        )
        if name == items_table:
            # Idempotency records, rate-limit buckets and claim log rows carry ``ttl``; engine
            # v2's items leave by completion or the reaper.
            client.update_time_to_live(
                TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL}
            )


def band_attribute(base: str, band: str) -> str:
    """The head row attribute of ``band``'s cursor, sweep mark, registration or ring (``base``:
    ``HEAD_CURSOR``, ``HEAD_SWEEP``, ``HEAD_BAND_REGISTERED`` or ``HEAD_RING``)."""
    return f"{base}{band}"


def lane_sort_key(lane: str) -> str:
    """The sort key of a group lane's row."""
    return f"{LANE_PREFIX}{lane}"


def ledger_sort_key(group: str) -> str:
    """The sort key of a group's ledger row (``group``: the lane without its band)."""
    return f"{LEDGER_PREFIX}{group}"


def ledger_entry(item_id: str) -> str:
    """The ledger row attribute of an item's lease."""
    return f"{LEDGER_ENTRY_PREFIX}{item_id}"


def log_size_mark(step: int) -> str:
    """The head attribute marking where the last append with an item of size ``step`` ended."""
    return f"{LOG_SIZE_MARK_PREFIX}{step}"


def size_mark_step(name: str) -> int | None:
    """The size step a head attribute ``name`` marks, if it is a size mark."""
    rest = name[len(LOG_SIZE_MARK_PREFIX) :]
    return int(rest) if name.startswith(LOG_SIZE_MARK_PREFIX) and rest.isdigit() else None
