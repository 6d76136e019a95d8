"""The service's numbers in one place: page sizes, budgets, lags and caps (each says why)."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

NOT_LEASED: Final = "item is unknown, stale or not leased"
#: Why an id of ``queue.reprioritize`` was not applied: no item has it (any more).
UNKNOWN_ITEM: Final = "item is unknown or gone (completed, moved to a new id, or never produced)"
#: A pending idempotency record older than this belongs to a request that died while writing.
IDEMPOTENCY_STALE_AFTER: Final = timedelta(minutes=15)
#: How long a produce with an idempotency key is remembered.
IDEMPOTENCY_TTL: Final = timedelta(hours=24)
FIRST_PAGE_MIN: Final = 50
PAGE_MAX: Final = 1000
#: The reaper's first read of a partition's waiting items: the oldest one's age, and whether any expired.
REAPER_FIRST_PAGE: Final = 10
#: Lost claims in a row, with nothing won, after which a lease reads its page again.
LOSSES_BEFORE_RESCAN: Final = 3
#: Re-reads of a page lost to other consumers before a lease moves on to the next partition.
MAX_RESCANS: Final = 3
#: Tries, at once, of a lease call whose every partition with items was lost to other consumers
#: (each try up to ``MAX_RESCANS`` reads), before it waits like a lease that found nothing: an
#: empty reply says nothing was leasable, so it is not given while items wait if it can be helped.
OUTRACED_RETRIES: Final = 3
#: Claims of one lease in flight at once, reached by doubling from one while nothing is lost:
#: one more in flight per this many candidates (a lease of 10 claims one at a time, of 128 or more
#: 16 at a time).
WAVE_MAX: Final = 16
ITEMS_PER_CONCURRENT_CLAIM: Final = 8
#: Candidates a lease claims from, oldest first, without reading again after lost races: at least
#: this many, or twice its batch (its lease record lists them all, and putting an expired lease
#: back reads each of them once).
MIN_POOL: Final = 8
#: Lease records a lease call (or the reaper, per read) puts back at most.
RECORDS_PER_CALL: Final = 25
#: The cursor never passes ids younger than this: a write minted that recently may still be on its
#: way (write latency, retries, clock skew between processes); docs/adr/0050-engine-v2.md.
CURSOR_LAG: Final = timedelta(seconds=1)
#: The sweep reads ids this long after they became visible: longer than any write may take to land
#: (function timeouts are 30 s at most), so a straggler it misses cannot exist.
SWEEP_DELAY: Final = timedelta(minutes=2)
#: A lease or listing reply stays under this: Lambda answers at most 6 MB (6,291,456 bytes).
MAX_REPLY_BYTES: Final = 5_000_000
#: Payload bytes a listing page holds at most: their base64 (4 bytes for 3) is ``MAX_REPLY_BYTES``,
#: so a page of large items stays within Lambda's reply (three 1 MiB items, nine of 380,000 bytes).
LISTING_PAYLOAD_BYTES: Final = MAX_REPLY_BYTES * 3 // 4
#: Defaults for how long one call may keep writing: a lease claiming after its wait, a clear, the
#: purge inside ``queues.delete`` (the reaper finishes a delete that needs longer).
DEFAULT_CLAIM_BUDGET: Final = timedelta(seconds=5)
DEFAULT_CLEAR_BUDGET: Final = timedelta(seconds=20)
DEFAULT_PURGE_BUDGET: Final = timedelta(seconds=10)
#: How often the reaper recounts each partition's items to heal counter drift (O(stored) each time).
DEFAULT_RECOUNT_PERIOD: Final = timedelta(hours=24)
#: A waiting lease polls the store first after this many seconds, doubling up to ``POLL_MAX``.
#: On AWS nothing wakes a waiting lease, so these set how long an item produced into an idle queue
#: waits and what waiting reads (``benchmarks.longpoll_aws``, docs/adr/0092-long-poll-wakeups.md:
#: one consumer, a 1-partition queue, 5 ms a request, 60 items at random at 1 and 5 a second).
#: Against 20 ms doubling to 500 ms: p95 from produce to lease 465 -> 261 ms at 1 item/s and
#: 391 -> 220 ms at 5/s, the same read units per delivered item (10.8 -> 10.9 at 1/s, 5.6 -> 5.2 at
#: 5/s), an idle wait 5.4 -> 9.0 read units a second (+$0.0016 an idle consumer-hour, beside $0.0120
#: of Lambda time that no schedule changes). Of the shapes to 250 ms, a 20 ms first sleep read ~2 units
#: an item more at 1/s (12.7) for a lower median but no lower p95 at 5/s (94 and 266 ms); 100 ms
#: measured within noise of 50 ms; a flat 250 ms read least but held items at 5/s longest (median
#: 202 ms).
POLL_FIRST: Final = 0.05
POLL_MAX: Final = 0.25
#: Tries of a queue update that lost a race with another update.
UPDATE_RETRIES: Final = 3
#: Long enough to take the catalog read off most hot-path calls, short enough that a queue update
#: reaches every process within about a second (docs/adr/0008-queue-cache.md).
DEFAULT_QUEUE_CACHE_TTL: Final = timedelta(seconds=1)

#: A band of keys (a priority other than 5) that is empty and was not registered for this long is
#: dropped from its partition's head row by the reaper, so leases stop reading it. Longer than any
#: writer takes from registering a band to writing its items (a Lambda call lasts at most 15
#: minutes), so an item written under an older registration is in place when the reaper re-checks.
BAND_IDLE: Final = timedelta(hours=1)

#: Payload bytes one page of dead letters a redrive reads may hold in memory (a page is read whole
#: and moved before the next, and items are up to 1 MiB each).
REDRIVE_PAGE_BYTES: Final = 4_000_000

#: Fair delivery: group lanes read per Query of a band's lanes, and the most lanes one lease call
#: visits (a Query each) looking for items before it answers with what it has.
LANES_PAGE: Final = 100
MAX_LANES_PER_LEASE: Final = 100
#: Lanes read (a Query each, one after the other) before a fair lease claims from them: enough for
#: a batch of 10 from ten groups, few enough that a batch of 100 starts claiming within its budget.
LANES_PER_TURN: Final = 16

#: Payload objects a reaper run deletes past their time at most (one ``DeleteObjects`` call): left
#: only by writers that died between their upload and their rows, or deletes that failed.
PAYLOAD_SWEEP = 1000
