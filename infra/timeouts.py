"""Every time limit of the stack, derived from one table so none can outgrow another.

API Gateway ends a REST integration after 29 s and answers 504, whatever the function does after.
So every function behind it is given at most that, and what a request may spend waiting (the lease
long-poll) is what is left once the work after the wait is budgeted. The per-request work is bounded
by the batch limit (``MAX_BATCH`` = 1,000 items or ids a request), one DynamoDB request per item at
worst (claims, conditional deletes, retries' read + move): ~5-10 ms each in-region, so a full batch
needs 10-20 s. The reaper is not behind the API: its limit is its schedule, and it leaves half the
period free so that a late EventBridge delivery can never start a run while the last one still runs.

In-handler budgets come from the same numbers: the lease waits ``min(wait cap, time left - 1 s)``
(``querator.api.gateway``); the reaper spends ``time left - REAPER_MARGIN_SECONDS`` and saves its
bookmark in the margin (``functions/reaper``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from infra.permissions import DISPATCHER, REAPER, STREAM
from querator.api.routes import Function

if TYPE_CHECKING:
    from infra.config import StageConfig

#: API Gateway's REST integration timeout (the default, and the most without a quota increase).
API_GATEWAY_SECONDS: Final = 29
#: After a lease's wait: claim up to 1,000 items one conditional write each, then answer.
LEASE_CLAIM_SECONDS: Final = 8
#: The longest wait a stage may configure: what the claim leaves of API Gateway's limit.
LEASE_WAIT_CAP_MAX: Final = API_GATEWAY_SECONDS - LEASE_CLAIM_SECONDS - 1
#: Time the reaper leaves itself to save its bookmark (``EnvVar.REAPER_MARGIN``).
REAPER_MARGIN_SECONDS: Final = 5
#: The smallest reaper timeout (a run must read at least one page).
REAPER_MIN_SECONDS: Final = 15
#: Lambda's longest timeout.
LAMBDA_MAX_SECONDS: Final = 900
#: API Gateway's WebSocket integration timeout (as REST's).
WEBSOCKET_SECONDS: Final = 29
#: A dispatcher run: a batch of stream records or a sweep, each subscriber a lease of up to 1,000
#: items and their pushes; a failed batch is retried by the event source mapping.
DISPATCHER_SECONDS: Final = 60


@dataclass(frozen=True, slots=True)
class Limit:
    """One function's memory (MB, which also buys CPU) and timeout, and why."""

    memory_mb: int
    timeout_seconds: int
    why: str


def limits(config: StageConfig) -> dict[str, Limit]:
    """The table: every function's limit for this stage (memory as ``memoryMb`` overrides it)."""
    table = _defaults(config)
    return {
        name: Limit(config.memory_mb.get(name, limit.memory_mb), limit.timeout_seconds, limit.why)
        for name, limit in table.items()
    }


def _defaults(config: StageConfig) -> dict[str, Limit]:
    api = API_GATEWAY_SECONDS
    return {
        Function.PRODUCE: Limit(1024, api, "1,000 items: 40 batch writes and their retries; 5 MB bodies"),
        # 256 MB by measurement (docs/adr/0012-lease-memory.md, benchmarks.idle): a waiting lease
        # bills its whole wait at this size, so an idle consumer costs half of 512 MB's, for ~70 ms
        # more CPU on a lease of 10 (139 ms against 70 ms at 512 MB).
        Function.LEASE: Limit(
            256, config.lease_wait_cap_seconds + LEASE_CLAIM_SECONDS, "the wait cap, then the claims"
        ),
        Function.ITEMS: Limit(512, api, "1,000 ids: a read and a move each for retry (~2,000 requests)"),
        Function.QUEUES: Limit(512, api, "queues.delete purges a queue's items within the request"),
        Function.ADMIN: Limit(1024, api, "stats and clear read a partition; import writes 1,000 items"),
        Function.META: Limit(256, 10, "a catalog read or a static document"),
        REAPER: Limit(
            512,
            min(LAMBDA_MAX_SECONDS, max(REAPER_MIN_SECONDS, config.reaper_rate_minutes * 60 // 2)),
            "half the schedule period: a late delivery never overlaps the previous run",
        ),
        STREAM: Limit(
            256, WEBSOCKET_SECONDS, "a message: a settle of up to 1,000 ids, then a push of the credit back"
        ),
        DISPATCHER: Limit(512, DISPATCHER_SECONDS, "a lease and its pushes per subscriber with credit"),
    }
