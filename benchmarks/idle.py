"""Idle consumers and the lease function's memory: what waiting costs and what a claim needs.

Run ``uv run python -m benchmarks.idle`` (``--rounds N``). Against a moto server in a child process:

1. **An idle long-poll**: one lease call that finds nothing for ``WAIT`` seconds, through the service
   on a fake clock (the service's own poll schedule, ``POLL_FIRST`` doubling to ``POLL_MAX``), on
   queues of 1 and 4 partitions: DynamoDB requests and read units (items table and catalog, units from
   ``benchmarks.meter``). Exact counts, not timings.
2. **CPU per call**: the deployed handlers (``functions.lease`` / ``functions.items``) invoked with
   API Gateway events, as ``tests/functions`` does: one lease of 10 items, the complete of those 10,
   and one idle poll iteration (a lease of ``request_timeout: 0s`` on an empty queue). CPU time of
   this process (``time.process_time``): the product's code, its wire layer, Powertools and botocore's
   serialization; moto's work runs in the child and is not counted, as DynamoDB's is not billed as
   the function's CPU. Median of ``--rounds`` calls.

Then arithmetic, printed with its inputs: Lambda gives CPU in proportion to memory (1,769 MB is one
vCPU, the Lambda developer guide), so the CPU part of a call at M MB takes ``cpu x 1769 / M`` (the
network round trips to DynamoDB come on top and do not depend on M); a long-poll bills its whole
wall time at ``M / 1024`` GB. Prices (us-east-1, on-demand, as published in November 2026): Lambda
arm64 $0.0000133334 per GB-s and $0.20 per million requests; API Gateway REST $3.50 per million
requests; DynamoDB $0.125 per million read units and $0.625 per million write units; SQS standard
$0.40 per million requests (the first million each month free; not subtracted here).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from benchmarks.cost import CaseResult, metered_service, run_case, use_fake_credentials
from querator.domain.errors import NothingToLeaseError
from querator.domain.model import QueueInfo
from querator.service.tuning import POLL_FIRST, POLL_MAX
from querator.testing import FakeClock, moto_server_process

if TYPE_CHECKING:
    from collections.abc import Callable

UTC = timezone.utc

#: The deployed long-poll: the lease function's wait cap (``leaseWaitCapSeconds``, default 20).
WAIT = 20.0
#: Seconds in a 30-day month.
MONTH = 30 * 24 * 3600
#: Lambda: one vCPU at this much memory (MB).
VCPU_MB = 1769
MEMORY_SIZES = (128, 256, 512, 1024, 1769)
PRICE_GB_SECOND = 0.0000133334
PRICE_LAMBDA_REQUEST = 0.20 / 1e6
PRICE_API_REQUEST = 3.50 / 1e6
PRICE_READ_UNIT = 0.125 / 1e6
PRICE_WRITE_UNIT = 0.625 / 1e6
PRICE_SQS_REQUEST = 0.40 / 1e6
#: SQS long-polls for at most 20 s a ReceiveMessage.
SQS_WAIT = 20.0
#: The Python client's consume defaults: each lease call waits 5 s; empty calls back off to 15 s.
CLIENT_WAIT = 5.0
CLIENT_BACKOFF_MAX = 15.0
#: The deployed memory sizes (``infra/timeouts.py``): the lease function's is the one this chooses.
CHOSEN_MB = 256
PRODUCE_MB = 1024
ITEMS_MB = 512
#: Assumed in-region DynamoDB round trip per request (a single-digit-millisecond service).
ROUND_TRIP = 0.005


@dataclass(frozen=True)
class IdlePoll:
    wait: float
    partitions: int
    requests: int
    read_units: float
    catalog_read_units: float


def idle_poll(endpoint: str, partitions: int, wait: float) -> IdlePoll:
    """One lease call that waits ``wait`` seconds on an empty queue, on a fake clock."""
    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    metered = metered_service(endpoint, clock=clock)
    name = f"idle-{partitions}-{wait:.0f}"
    stamp = clock.now()
    metered.service.create_queue(
        QueueInfo(
            name=name,
            lease_timeout=timedelta(minutes=1),
            expire_timeout=timedelta(hours=1),
            partitions=partitions,
            created_at=stamp,
            updated_at=stamp,
        )
    )
    # The first lookup fills the queue cache as a running function's would have long ago.
    metered.service.stats(name)
    metered.meter.reset()
    metered.catalog_meter.reset()
    try:
        metered.service.lease(name, batch_size=10, client_id="idle", timeout=timedelta(seconds=wait))
    except NothingToLeaseError:
        pass
    else:
        raise RuntimeError("an empty queue handed out an item")
    everything, catalog = metered.meter.snapshot(), metered.catalog_meter.snapshot()
    return IdlePoll(
        wait=wait,
        partitions=partitions,
        requests=everything.requests,
        read_units=everything.read_units,
        catalog_read_units=catalog.read_units,
    )


def _handlers(endpoint: str) -> Callable[[str, dict[str, Any]], dict[str, Any]]:
    """Calls the deployed handler of a path with an API Gateway event, as ``tests/functions`` does."""
    os.environ.update(
        {
            "QUERATOR_ITEMS_TABLE": "idle-items",
            "QUERATOR_CATALOG_TABLE": "idle-queues",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL_DYNAMODB": endpoint,
            "POWERTOOLS_METRICS_NAMESPACE": "QueratorBenchmark",
            "POWERTOOLS_LOG_LEVEL": "WARNING",
            "POWERTOOLS_METRICS_DISABLED": "true",
        }
    )
    from querator import bootstrap  # noqa: PLC0415 - after the environment is set
    from querator.api import routes  # noqa: PLC0415
    from querator.localserver import LocalContext, response_headers  # noqa: PLC0415
    from querator.storage.dynamodb import schema  # noqa: PLC0415
    from tests.functions.conftest import api_event  # noqa: PLC0415

    bootstrap.reset()
    schema.create_tables(bootstrap.get_client(), items_table="idle-items", catalog_table="idle-queues")

    def call(path: str, body: dict[str, Any]) -> dict[str, Any]:
        route = routes.by_path(path)
        function = route.function if route else routes.Function.META
        handler = importlib.import_module(f"functions.{function}.handler").lambda_handler
        result = handler(api_event(path, body), LocalContext(function_name=function, timeout_seconds=29))
        if response_headers(result).get("Content-Type") != "application/json":
            raise RuntimeError(f"{path}: {result['statusCode']}")
        reply: dict[str, Any] = json.loads(result["body"])
        reply["_status"] = result["statusCode"]
        return reply

    return call


def call_cpu(endpoint: str, rounds: int) -> dict[str, float]:
    """Median CPU ms of the handlers: produce, lease and complete of 10 and of 100, an idle poll."""
    call = _handlers(endpoint)
    call("/v1/queues.create", {"queue_name": "busy", "lease_timeout": "5m", "expire_timeout": "24h"})
    call("/v1/queues.create", {"queue_name": "empty", "lease_timeout": "5m", "expire_timeout": "24h"})
    samples: dict[str, list[float]] = {}

    def timed(name: str, path: str, body: dict[str, Any], measure: bool) -> dict[str, Any]:
        started = time.process_time()
        reply = call(path, body)
        if measure:
            samples.setdefault(name, []).append((time.process_time() - started) * 1000)
        return reply

    # Round 0 warms up: the first call of each function imports and builds what later calls reuse.
    for round_number in range(rounds + 1):
        measure = round_number > 0
        for batch in (10, 100) if round_number % 3 == 0 else (10,):
            items = [{"utf8": f"item {round_number}-{i:04d} " + "x" * 80} for i in range(batch)]
            timed(f"produce of {batch}", "/v1/queue.produce", {"queue_name": "busy", "items": items}, measure)
            lease = timed(
                f"lease of {batch}",
                "/v1/queue.lease",
                {"queue_name": "busy", "batch_size": batch, "client_id": "cpu"},
                measure,
            )
            ids = [item["id"] for item in lease["items"]]
            done = timed(
                f"complete of {batch}",
                "/v1/queue.complete",
                {"queue_name": "busy", "partition": lease["partition"], "ids": ids},
                measure,
            )
            if len(ids) != batch or done["_status"] != 200:
                raise RuntimeError(f"unexpected replies: {len(ids)} of {batch} leased, {done}")
        idle = timed(
            "idle poll iteration",
            "/v1/queue.lease",
            {"queue_name": "empty", "batch_size": 10, "client_id": "cpu", "request_timeout": "0s"},
            measure,
        )
        if idle["_status"] != 454:
            raise RuntimeError(f"an empty queue answered {idle}")
    return {name: statistics.median(values) for name, values in samples.items()}


def happy_path_units(endpoint: str) -> CaseResult:
    """Requests and units per delivered item, 100 B at batch 10 (``benchmarks.cost``'s case)."""
    return run_case(metered_service(endpoint), payload_bytes=100, batch=10, count=300)


def call_seconds(cpu_ms: float, requests: float, memory: int) -> float:
    """Billed seconds of one call at ``memory`` MB: its CPU scaled by Lambda's share of a vCPU, plus
    ``ROUND_TRIP`` per DynamoDB request (an in-region assumption, not measured here)."""
    return cpu_ms / 1000 * VCPU_MB / memory + requests * ROUND_TRIP


def lambda_cost(seconds: float, memory: int, invocations: float) -> float:
    return seconds * memory / 1024 * PRICE_GB_SECOND + invocations * PRICE_LAMBDA_REQUEST


def _idle_month(poll: IdlePoll, memory: int, duty: float) -> tuple[float, float, float, float]:
    """A month of an idle consumer: Lambda, API Gateway and DynamoDB dollars, and polls.

    ``duty`` is the share of the month a long-poll is open (1.0 without pauses between polls)."""
    polls = MONTH * duty / poll.wait
    return (
        lambda_cost(MONTH * duty, memory, polls),
        polls * PRICE_API_REQUEST,
        polls * poll.read_units * PRICE_READ_UNIT,
        polls,
    )


def backoff_duty(wait: float, backoff_max: float) -> float:
    """Share of the time a long-poll is open when each empty poll is followed by a full-jitter pause
    whose ceiling has reached ``backoff_max`` (mean pause ``backoff_max / 2``)."""
    return wait / (wait + backoff_max / 2)


def format_report(polls: list[IdlePoll], cpu: dict[str, float], case: CaseResult) -> str:
    lines = [
        "One idle long-poll (nothing to lease), the service's poll schedule"
        f" ({POLL_FIRST * 1000:.0f} ms doubling to {POLL_MAX * 1000:.0f} ms):",
        "",
    ]
    lines.append("| wait | partitions | requests | read units (items) | read units (catalog) |")
    lines.append("|---:|---:|---:|---:|---:|")
    for p in polls:
        items = p.read_units - p.catalog_read_units
        lines.append(
            f"| {p.wait:.0f} s | {p.partitions} | {p.requests} | {items:.1f} | {p.catalog_read_units:.1f} |"
        )
    lines += [
        "",
        "CPU per handler call in this process (median), scaled to Lambda memory sizes (x 1769 / MB):",
        "",
    ]
    header = "| call | CPU ms (1 vCPU) | " + " | ".join(f"{m} MB" for m in MEMORY_SIZES) + " |"
    lines += [header, "|---|---:|" + "---:|" * len(MEMORY_SIZES)]
    for name, ms in cpu.items():
        scaled = " | ".join(f"{ms * VCPU_MB / m:.0f} ms" for m in MEMORY_SIZES)
        lines.append(f"| {name} | {ms:.1f} | {scaled} |")

    deployed = next(p for p in polls if p.wait == WAIT and p.partitions == 1)
    lines += [
        "",
        f"One idle consumer for a month, back-to-back {WAIT:.0f} s long-polls on a 1-partition queue:",
        "",
        "| lease memory | Lambda $ | API Gateway $ | DynamoDB $ | total $ |",
        "|---:|---:|---:|---:|---:|",
    ]
    for memory in MEMORY_SIZES:
        lam, api, dyn, _ = _idle_month(deployed, memory, 1.0)
        lines.append(f"| {memory} MB | {lam:.2f} | {api:.2f} | {dyn:.2f} | {lam + api + dyn:.2f} |")
    sqs = MONTH / SQS_WAIT * PRICE_SQS_REQUEST
    lines.append(f"| SQS ({SQS_WAIT:.0f} s ReceiveMessage long-polls) | | | | {sqs:.2f} |")

    client = next(p for p in polls if p.wait == CLIENT_WAIT and p.partitions == 1)
    lines += [
        "",
        f"The Python client's consume loop on an idle queue ({CLIENT_WAIT:.0f} s lease calls), lease at "
        f"{CHOSEN_MB} MB:",
        "",
        "| consume | polls a month | Lambda $ | API Gateway $ | DynamoDB $ | total $ |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, duty in (
        ("no backoff (idle_backoff=0)", 1.0),
        (
            f"backoff to {CLIENT_BACKOFF_MAX:.0f} s, full jitter (the default)",
            backoff_duty(CLIENT_WAIT, CLIENT_BACKOFF_MAX),
        ),
    ):
        lam, api, dyn, count = _idle_month(client, CHOSEN_MB, duty)
        lines.append(
            f"| {label} | {count:,.0f} | {lam:.2f} | {api:.2f} | {dyn:.2f} | {lam + api + dyn:.2f} |"
        )

    # A million delivered items, 100 B, batch 10: produce, lease and complete calls of 10.
    calls = 1e6 / case.batch
    lines += [
        "",
        f"A million delivered items (100 B, batch {case.batch}: "
        f"{calls:,.0f} produce + lease + complete calls each):",
        "",
        "| part | how | $ |",
        "|---|---|---:|",
    ]
    total = 0.0
    for phase, memory in (("produce", PRODUCE_MB), ("lease", CHOSEN_MB), ("complete", ITEMS_MB)):
        requests = case.per_item("requests", phase) * case.batch
        seconds = call_seconds(cpu[f"{phase} of {case.batch}"], requests, memory)
        dollars = lambda_cost(seconds * calls, memory, calls)
        total += dollars
        lines.append(
            f"| Lambda, {phase} ({memory} MB) | {seconds * 1000:.0f} ms a call "
            f"({requests:.1f} DynamoDB requests x {ROUND_TRIP * 1000:.0f} ms + CPU) | {dollars:.2f} |"
        )
    api = 3 * calls * PRICE_API_REQUEST
    wcu, rcu = case.per_item("write_units") * 1e6, case.per_item("read_units") * 1e6
    dynamo = wcu * PRICE_WRITE_UNIT + rcu * PRICE_READ_UNIT
    total += api + dynamo
    lines.append(f"| API Gateway | {3 * calls:,.0f} requests | {api:.2f} |")
    units = f"{case.per_item('write_units'):.2f} write + {case.per_item('read_units'):.2f} read units"
    lines.append(f"| DynamoDB | {units} an item (measured) | {dynamo:.2f} |")
    lines.append(f"| **total** | | **{total:.2f}** |")
    sqs_million = 3 * calls * PRICE_SQS_REQUEST
    lines.append(
        f"| SQS | SendMessageBatch, ReceiveMessage and DeleteMessageBatch of 10 | {sqs_million:.2f} |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=30, help="calls per CPU figure (default 30)")
    args = parser.parse_args(argv)
    use_fake_credentials()
    with moto_server_process() as endpoint:
        polls = [idle_poll(endpoint, p, wait) for wait, p in ((WAIT, 1), (WAIT, 4), (CLIENT_WAIT, 1))]
        case = happy_path_units(endpoint)
        cpu = call_cpu(endpoint, args.rounds)
    print(format_report(polls, cpu, case))
    return 0


if __name__ == "__main__":
    sys.exit(main())
