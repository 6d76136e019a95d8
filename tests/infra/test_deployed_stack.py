"""Every stage of ``cdk.json``, deployed onto moto's CloudFormation and driven through its own API.

The template is the one the CDK app synthesizes for the stage, with the real function folders and the
layer ``layers/core/build.py`` builds (for this machine's architecture: the functions run here). Each
function runs from its deployed asset with the layer's contents on its path, the environment the stack
gave it and its own role's credentials (``deployment.py``); requests reach it through the API's
deployed resources, methods, integrations and Lambda permissions, the reaper through the schedule.

Every AWS call the functions make is recorded at the (moto) server and checked against the caller's
deployed policy, both ways: a call its policy does not allow fails, and so does a grant that no call
needed (least privilege is measured, not written down). The audit is printed (``-s``) and, when
``QUERATOR_POLICY_AUDIT`` names a file, written there. S3 calls to the payload bucket are recorded
and audited the same way (``deployment.s3_call``, ``iam_audit.s3_requests``): 1 MiB payloads go
through every function that handles items (``drive_payloads``, the stream's big queue), and the
bucket is listed afterwards to show that every object of an item that ended is gone.

Per-queue grants: beside the stage's template each stage deploys two roles (``grant_test_roles``),
granted produce and consume by the service's own ``grant_*`` on one queue and on a prefix. Requests
signed as them pass the harness's emulation of API Gateway's IAM authorization (the role's deployed
policies against the method ARN of the request's path, before any function runs); the tests at the
end show each role working on its queues and refused (403, no invocation) everywhere else, and the
stack's two example policies doing what they say once attached to a role. They add two roles per
stage, 18 requests per stage (every scoped route once, for the wiring, and a stream ticket) and
0.2-0.7 s per test. On 2026-11-27, with four sessions sharing two cores (load average 10-14), the
module took 105-149 s of pytest in three runs (96-99 tests), against 43-57 s on a quiet machine
before (below); under that load a lease's 2 s sometimes ran out before its complete or renew
(stage local, one run in two), a step this change does not touch.

Where its time goes:
This module synthesizes the three stages one after the other (jsii is single-threaded); each stage
is then deployed, its nine functions started from their deployed assets and its lifecycle driven on
a thread of its own while the next stage synthesizes, so the deploys and the lifecycles' waits
(leases running out, the queue cache's second) overlap the synths. Each function's first request
waits for its own cold start, as in Lambda. The deploys talk to a second moto server over the same
backends: a ``CreateStack`` is one request of 1-3 s, and on the functions' server it held up the
other stages' requests (and their 1-2 s leases) that long. The module takes 43-57 s of pytest here
(eight runs on 2026-11-27, 84 tests; 50-64 s of wall clock around ``uv run pytest``, which adds
start-up and collection), against 62-75 s the same morning before these changes and stage local's
single asset (ADR 0011, amendment of 2026-11-27). ``-s`` prints where the time goes; one run: synths
7.0, 2.8 and 2.1 s (dev starts jsii), create_stack 3.9-6.4 s per stage, the workers' start 0.6-3.3
s, the lifecycles 14.6-18.3 s, the last one ending 21.6 s after the last synth. The functions'
slowest moto answer fell from 0.8-1.0 s to 0.2-0.5 s. In a clean-clone CI run the same day (``./run
test``'s slow pass prints its slowest setups), the fixture's setup, the session's layer build and
runtime SDK included, took 53.6 s. What remains is the synths and two cores shared by three
lifecycles, 27 workers and moto.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
import uuid
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pytest
from aws_cdk import CfnOutput
from aws_cdk import aws_iam as iam

from infra.permissions import FUNCTION_NAMES, Caller, caller_routes, iam_path
from infra.timeouts import API_GATEWAY_SECONDS
from querator.api import paths
from querator.api.routes import ROUTES, SCOPED_ROUTES, Function
from querator.config import DEFAULT_ENGINE
from querator.storage.dynamodb.catalog import DynamoDBQueueCatalog
from tests.infra import iam_audit
from tests.infra.conftest import host_architecture
from tests.infra.deployment import (
    ACCOUNT,
    EVENTS,
    PLACEHOLDER_TYPES,
    REGION,
    STOOD_IN_ANYWAY,
    Deployment,
    RecordingMoto,
    deploy,
    start_functions,
    wait_ready,
)
from tests.infra.synth import ROOT, cdk_context, synthesize

if TYPE_CHECKING:
    from collections.abc import Iterator

    from infra.stack import QueratorStack
    from tests.infra.deployment import Reply

pytestmark = [pytest.mark.infra, pytest.mark.slow]

STAGES = sorted(cdk_context()["stages"])
#: Stages deployed on an engine other than the product's: one runs engine v2 (a stack that has not
#: moved to v3, or was rolled back to it), so its calls measure the grants v2's code needs, which v3's
#: code needs too while it serves what v2 stored in an upgraded table.
ENGINES = {"local": 2}
#: The work queue's lease: long enough for the requests that follow a lease on a busy machine (three
#: stages share two cores), short enough to wait out twice.
LEASE = 2.0
#: The expire_timeout of the queues the reaper cleans up.
SHORT = 0.5
#: Roles the per-queue tests sign as, each granted produce and consume by the service's own
#: ``grant_produce`` / ``grant_consume`` in the deployed template: one on a single queue, one on a
#: prefix. (Their only difference from the stage's template: two roles, their policies and outputs.)
GRANTED: Final = {"OneQueue": ("granted",), "Prefix": ("tenant-a-*",)}
#: Queues each role may use, and queues next to them it may not (a longer name, a shorter prefix).
MINE: Final = {"OneQueue": ("granted",), "Prefix": ("tenant-a-1", "tenant-a-2")}
OTHERS: Final = {"OneQueue": ("granted-2", "grante"), "Prefix": ("tenant-a", "tenant-b-1")}


def grant_test_roles(stack: QueratorStack) -> None:
    for name, queues in GRANTED.items():
        role = iam.Role(stack, f"Test{name}", assumed_by=iam.AccountRootPrincipal())
        stack.service.grant_produce(role, queues=queues)
        stack.service.grant_consume(role, queues=queues)
        CfnOutput(stack, f"Test{name}RoleArn", value=role.role_arn)


@pytest.fixture(scope="module")
def moto() -> Iterator[RecordingMoto]:
    with pytest.MonkeyPatch.context() as env:
        # The test's own principal, for the few calls it makes as itself (PynamoDB reads these).
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        server = RecordingMoto()
        yield server
        server.stop()


@pytest.fixture(scope="module")
def stages(
    moto: RecordingMoto,
    host_layer: Path,
    lambda_runtime: tuple[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, tuple[Deployment, dict[str, Any]]]]:
    """Every stage synthesized one after the other (jsii is single-threaded), on this thread; each
    stage is then deployed, its functions started (their cold starts) and its lifecycle driven on a
    thread of its own, while the next stage synthesizes: the deploys and the lifecycles' waits
    (leases running out, the queue cache's second) overlap the synths instead of following them."""
    deployments: dict[str, Deployment] = {}
    lifecycles: dict[str, Future[dict[str, Any]]] = {}
    layers = tmp_path_factory.getbasetemp() / "layers"
    python, sdk = lambda_runtime

    def deploy_and_drive(stage: str, cdk_out: Path, stack_name: str, lambda_root: Path) -> dict[str, Any]:
        began = time.monotonic()
        deployments[stage] = deployment = deploy(moto, cdk_out, stack_name, stage)
        deployed = time.monotonic()
        start_functions(deployment, python, sdk, lambda_root, layers)
        workers = time.monotonic()
        # Each function's first request waits for its own cold start, as in Lambda.
        replies = drive(deployment)
        wait_ready(deployment)  # a function the lifecycle never called would fail its tests below
        imports = [fn.import_seconds or 0.0 for fn in deployment.functions.values()]
        print(
            f"\nstage {stage}: create_stack {deployed - began:.1f} s,"
            f" {len(deployment.functions)} workers started {workers - deployed:.1f} s"
            f" (handler imports {min(imports):.1f}-{max(imports):.1f} s side by side),"
            f" lifecycle {time.monotonic() - workers:.1f} s"
        )
        return replies

    pool = ThreadPoolExecutor(max_workers=len(STAGES), thread_name_prefix="lifecycle")
    try:
        started = time.monotonic()
        for stage in STAGES:
            root = tmp_path_factory.mktemp(f"deploy-{stage}")
            context = cdk_context(
                stage=stage,
                layerAssetPath=str(host_layer),
                functionsAssetRoot=str(ROOT / "functions"),
                # The functions run on this machine; arm64 and x86_64 layers differ only in the
                # wheels' platform.
                architecture=host_architecture(),
                # cdk.json's prod holds a placeholder: a stage that retains data must name where alarms go.
                alarmTopicArn=f"arn:aws:sns:{REGION}:{ACCOUNT}:querator-alarms",
                # moto's CloudFormation does not model API Gateway v2, so prod's HTTP API (ADR 0094)
                # could carry no request here: every stage is deployed behind the REST API. The HTTP
                # flavour is checked on its template (test_cdk_http_api.py) and its events through the
                # handlers (tests/functions/test_http_api_events.py).
                apiFlavour="rest",
                engine=ENGINES.get(stage, DEFAULT_ENGINE),
            )
            began = time.monotonic()
            synth = synthesize(root / "cdk.out", context, extend=grant_test_roles)
            assert synth.validation_error is None, synth.validation_error
            print(f"\nstage {stage}: synth {time.monotonic() - began:.1f} s")
            lambda_root = tmp_path_factory.mktemp(f"lambda-{stage}")
            lifecycles[stage] = pool.submit(
                deploy_and_drive, stage, root / "cdk.out", synth.stack.stack_name, lambda_root
            )
        last = time.monotonic()
        replies = {stage: lifecycle.result() for stage, lifecycle in lifecycles.items()}
        print(
            f"the lifecycles done {time.monotonic() - last:.1f} s after the last stage's synth;"
            f" {time.monotonic() - started:.1f} s since the first synth"
        )
        # Non-zero when moto answered a transaction after the caller's read timeout (see _Recorder).
        print(
            "transactions retried by botocore and answered from the token:",
            moto.recorder.replayed_transactions,
        )
        port = int(moto.endpoint.rpartition(":")[2])
        slowest = sorted(
            ((round(d, 2), op) for d, op, p in moto.recorder.durations if p == port), reverse=True
        )
        print(f"moto's slowest answers to the functions (s, operation): {slowest[:3]}")
        print("conditional writes sent more than once (botocore's retries):", repeated_writes(moto))
        yield {stage: (deployments[stage], replies[stage]) for stage in deployments}
    finally:
        # Also when a lifecycle failed: the functions' workers (and their pipes) end with the module.
        # Their inputs close first, so a lifecycle still waiting on a worker ends before the pool.
        for deployment in list(deployments.values()):
            deployment.close_inputs()
        pool.shutdown(cancel_futures=True)
        for deployment in deployments.values():
            deployment.close_inputs()  # again: one deployed while the others were closing
            deployment.stop()


@pytest.fixture(scope="module", params=STAGES)
def deployed(
    request: pytest.FixtureRequest, stages: dict[str, tuple[Deployment, dict[str, Any]]]
) -> Deployment:
    return stages[request.param][0]


@pytest.fixture(scope="module")
def lifecycle(deployed: Deployment, stages: dict[str, tuple[Deployment, dict[str, Any]]]) -> dict[str, Any]:
    return stages[deployed.stage][1]


def repeated_writes(moto: RecordingMoto) -> int:
    """Conditional writes to an items table that reached moto more than once with the same body
    from the same role: botocore sending a request again after the read timeout (a claim carries a
    random token, a delete or move names one item once). With the workers' long timeout there should
    be none. (The stream's credit takes on the connections table repeat by design.)"""
    sent = Counter(
        json.dumps([call.access_key, call.operation, call.body], sort_keys=True)
        for call in moto.recorder.calls
        if call.operation in ("PutItem", "UpdateItem", "DeleteItem")
        and "ConditionExpression" in call.body
        and "Items" in call.body.get("TableName", "")
    )
    return sum(n - 1 for n in sent.values())


def drive(d: Deployment) -> dict[str, Any]:
    """create → produce → lease → complete → renew → retry → dead-letter → stats → priorities →
    reprioritize → clear → redrive →
    delete, and a reaper run, through the deployed API; returns every reply by step name."""
    r: dict[str, Any] = {}
    tag = uuid.uuid4().hex[:6]
    dead, work, expiring, doomed, gone, scheduled = (
        f"{n}-{tag}" for n in ("dead", "work", "expiring", "doomed", "gone", "scheduled")
    )

    def post(step: str, path: str, body: dict[str, Any], **headers: str) -> Reply:
        r[step] = reply = d.request("POST", path, body, headers)
        return reply

    def lease(step: str, queue: str, batch: int = 10) -> Reply:
        body = {"queue_name": queue, "batch_size": batch, "client_id": "deployed", "request_timeout": "0s"}
        return post(step, "/v1/queue.lease", body)

    r["health"] = d.request("GET", "/health")
    r["openapi"] = d.request("GET", "/openapi.json")
    r["docs"] = d.request("GET", "/docs")
    r["wrong_method"] = d.request("GET", "/v1/queue.produce")
    r["unknown_path"] = d.request("POST", "/v1/queue.nope", {})
    # Every scoped route through its own resource, method, integration and permission: on a queue
    # that does not exist, so each function answers 400 and changes nothing. First, so that every
    # API function's cold start is behind it before the leases below start running out.
    nowhere = f"nowhere-{tag}"
    for route in SCOPED_ROUTES:
        post(f"scoped_{route.name}", paths.queue_path(route.name, nowhere), {})
    post(
        "create_dead",
        "/v1/queues.create",
        {"queue_name": dead, "lease_timeout": "1m", "expire_timeout": "24h"},
    )
    post("create_work", "/v1/queues.create",
         {"queue_name": work, "lease_timeout": f"{int(LEASE * 1000)}ms", "expire_timeout": "1h",
          "max_attempts": 2, "dead_queue": dead})  # fmt: skip
    for name, dead_queue in ((expiring, dead), (doomed, "")):
        post(f"create_{name.split('-')[0]}", "/v1/queues.create",
             {"queue_name": name, "lease_timeout": f"{int(SHORT * 1000)}ms",
              "expire_timeout": f"{int(SHORT * 1000)}ms", "dead_queue": dead_queue})  # fmt: skip
    post(
        "create_gone",
        "/v1/queues.create",
        {"queue_name": gone, "lease_timeout": "1m", "expire_timeout": "1h"},
    )
    post("create_scheduled", "/v1/queues.create",
         {"queue_name": scheduled, "lease_timeout": "1m", "expire_timeout": "1h"})  # fmt: skip
    soon = (datetime.now(UTC) + timedelta(seconds=LEASE)).isoformat().replace("+00:00", "Z")
    post("produce_scheduled", "/v1/queue.produce",
         {"queue_name": scheduled, "items": [{"utf8": "s", "enqueue_at": soon}]})  # fmt: skip
    post("update", "/v1/queues.update", {"queue_name": work, "reference": "deployed"})
    post("info", "/v1/queues.info", {"queue_name": work})
    # the stream's ticket: the first one makes the service's key (a conditional put in the catalog)
    post("ticket", "/v1/stream.ticket", {"queue_name": work})
    post("list", "/v1/queues.list", {"pivot": f"dead-{tag}", "limit": 2})

    # produce: a batch, then a keyed request and its retry
    post(
        "produce",
        "/v1/queue.produce",
        {"queue_name": work, "items": [{"utf8": "a"}, {"utf8": "b"}, {"utf8": "c"}]},
    )
    post("produce_keyed", "/v1/queue.produce", {"queue_name": work, "items": [{"utf8": "d"}]},
         **{"Idempotency-Key": f"key-{tag}"})  # fmt: skip
    post("produce_replayed", "/v1/queue.produce", {"queue_name": work, "items": [{"utf8": "d"}]},
         **{"Idempotency-Key": f"key-{tag}"})  # fmt: skip

    # lease two, complete one, renew and then retry the other (back at the tail under a new id)
    first, second = (i["id"] for i in lease("lease", work, batch=2).body["items"])
    partition = r["lease"].body.get("partition", 0)
    post("complete", "/v1/queue.complete", {"queue_name": work, "partition": partition, "ids": [first]})
    post("renew", "/v1/queue.renew",
         {"queue_name": work, "partition": partition, "ids": [second], "lease_timeout": "30s"})  # fmt: skip
    post("retry", "/v1/queue.retry", {"queue_name": work, "partition": partition, "items": [{"id": second}]})

    # lease the rest; send one to the dead-letter queue, let the other leases run out twice
    held = lease("lease_rest", work).body["items"]
    requeued_b = [i["id"] for i in held if i["bytes"] == "Yg=="]
    dead_b = {"queue_name": work, "partition": partition, "items": [{"id": requeued_b[0], "dead": True}]}
    post("retry_dead", "/v1/queue.retry", dead_b)
    time.sleep(LEASE + 0.2)
    lease("lease_again", work)  # the expired leases go back to the tail, and are leased again
    time.sleep(LEASE + 0.2)
    lease("lease_exhausted", work)  # out of attempts: dead-lettered by the lease, nothing left: 454
    post("stats_dead", "/v1/queue.stats", {"queue_name": dead})
    # a scheduled item completed once due: the complete reads the partition's schedule mark
    found = lease("lease_scheduled", scheduled)
    # The fixture fails here, before any test: say what the function answered and logged.
    assert found.status == 200, (
        f"the due item was not leased: {found.status} {found.body}\n{found.stdout[-3000:]}"
    )
    due = [i["id"] for i in found.body["items"]]
    post("complete_scheduled", "/v1/queue.complete", {"queue_name": scheduled, "partition": 0, "ids": due})

    # storage inspection and maintenance
    post("items_list", "/v1/storage/items.list", {"queue_name": dead, "partition": 0})
    post("scheduled_list", "/v1/storage/scheduled.list", {"queue_name": work, "partition": 0})
    source = {"source_id": f"src-{tag}", "payload": "eA=="}
    post("import", "/v1/storage/items.import", {"queue_name": work, "partition": 0, "items": [source]})
    post("import_again", "/v1/storage/items.import", {"queue_name": work, "partition": 0, "items": [source]})
    imported = [i["id"] for i in r["import"].body["items"]]
    # an imported lease gets its lease record, so it comes back when it runs out like any other
    until = (datetime.now(UTC) + timedelta(minutes=5)).isoformat().replace("+00:00", "Z")
    leased_import = {"payload": "eQ==", "lease_deadline": until, "attempts": 1}
    post(
        "import_leased",
        "/v1/storage/items.import",
        {"queue_name": work, "partition": 0, "items": [leased_import]},
    )
    post("items_delete", "/v1/storage/items.delete", {"queue_name": work, "partition": 0, "ids": imported})
    post("produce_more", "/v1/queue.produce", {"queue_name": work, "items": [{"utf8": "e"}, {"utf8": "f"}]})
    # priorities: the urgent item is leased first; the other is moved to another priority
    urgent_and_low = [{"utf8": "u", "priority": 0}, {"utf8": "v", "priority": 7}]
    post("produce_priorities", "/v1/queue.produce", {"queue_name": work, "items": urgent_and_low})
    post("list_priorities", "/v1/storage/items.list", {"queue_name": work, "partition": 0})
    low = [i["id"] for i in r["list_priorities"].body["items"] if i["payload"] == "dg=="]
    post("reprioritize", "/v1/queue.reprioritize",
         {"queue_name": work, "partition": 0, "ids": low, "priority": 1})  # fmt: skip
    lease("lease_one", work, batch=1)
    post("clear", "/v1/queue.clear", {"queue_name": work, "queue": True})
    post("clear_destructive", "/v1/queue.clear", {"queue_name": work, "queue": True, "destructive": True})
    post("stats_work", "/v1/queue.stats", {"queue_name": work})

    # the reaper: items that outlived expire_timeout while nobody leased, and a delete cut short
    post("produce_expiring", "/v1/queue.produce", {"queue_name": expiring, "items": [{"utf8": "x"}]})
    post("produce_doomed", "/v1/queue.produce", {"queue_name": doomed, "items": [{"utf8": "y"}]})
    post("produce_gone", "/v1/queue.produce", {"queue_name": gone, "items": [{"utf8": "z"}]})
    interrupt_delete(d, gone)
    time.sleep(SHORT + 0.1)
    r["reaper"] = d.run_schedule()
    post("stats_dead_after_reaper", "/v1/queue.stats", {"queue_name": dead})
    # redrive: every dead letter back to the queue it came from (work and expiring)
    post("redrive", "/v1/queue.redrive", {"queue_name": dead})
    post("stats_dead_after_redrive", "/v1/queue.stats", {"queue_name": dead})
    post("stats_doomed", "/v1/queue.stats", {"queue_name": doomed})
    post("info_gone", "/v1/queues.info", {"queue_name": gone})

    # delete: a dead-letter queue in use is refused; a queue goes with its items (each delete waits
    # out the queue cache's second, so the other queues stay)
    post("delete_dead_refused", "/v1/queues.delete", {"queue_name": dead})
    post("produce_last", "/v1/queue.produce", {"queue_name": work, "items": [{"utf8": "g"}]})
    post("delete_work", "/v1/queues.delete", {"queue_name": work})
    post("info_deleted", "/v1/queues.info", {"queue_name": work})
    drive_payloads(d, r, tag)
    drive_stream(d, r, tag)
    r["stream"]["objects_left"] = payload_objects(d)
    return r


#: The largest payload (``querator.domain.model.MAX_PAYLOAD_BYTES``): past the 64 KiB a row keeps,
#: stored in the payload bucket under engine v3.
MIB = 1_048_576


def big(letter: str) -> dict[str, str]:
    """An item of 1 MiB, every byte ``letter``."""
    return {"utf8": letter * MIB}


def payload_objects(d: Deployment) -> list[str]:
    """Every object in the stage's payload bucket, listed as the test's own principal."""
    s3 = d.moto.client("s3")
    listed = s3.list_objects_v2(Bucket=d.outputs["PayloadBucketName"]).get("Contents", [])
    return [o["Key"] for o in listed]


def drive_payloads(d: Deployment, r: dict[str, Any], tag: str) -> None:
    """1 MiB payloads through every function that handles items: produce; lease; storage items.list;
    retry into the dead-letter queue; its listing; redrive; a lease that runs out and is
    dead-lettered by the next lease; redrive again, lease and complete; a storage items.delete; the
    reaper dead-lettering and dropping expired ones. Under engine v2 a produce of one is refused."""
    work, dead, brief, expiring, doomed = (
        f"{n}-{tag}" for n in ("bigwork", "bigdead", "bigbrief", "bigexp", "bigdoom")
    )
    # The replies by step, apart from the lifecycle's (and "stdout", as the metrics test reads it).
    seen: dict[str, Any] = {"stdout": ""}
    r["payloads"] = seen

    def post(step: str, path: str, body: dict[str, Any]) -> Reply:
        seen[step] = reply = d.request("POST", path, body)
        seen["stdout"] += reply.stdout
        return reply

    def lease(step: str, queue: str = work) -> Reply:
        body = {"queue_name": queue, "batch_size": 1, "client_id": "big", "request_timeout": "0s"}
        return post(step, "/v1/queue.lease", body)

    post(
        "create_dead",
        "/v1/queues.create",
        {"queue_name": dead, "lease_timeout": "1m", "expire_timeout": "24h"},
    )
    # work's leases outlast the steps between a lease and its settle on a loaded machine; brief's
    # run out (LEASE) while the test waits
    for name, lease_timeout in ((work, "1m"), (brief, f"{int(LEASE * 1000)}ms")):
        post(f"create_{name.split('-')[0]}", "/v1/queues.create",
             {"queue_name": name, "lease_timeout": lease_timeout, "expire_timeout": "1h",
              "max_attempts": 1, "dead_queue": dead})  # fmt: skip
    for name, dead_queue in ((expiring, dead), (doomed, "")):
        short = f"{int(SHORT * 1000)}ms"
        post(f"create_{name.split('-')[0]}", "/v1/queues.create",
             {"queue_name": name, "lease_timeout": short, "expire_timeout": short,
              "dead_queue": dead_queue})  # fmt: skip
    if post("produce_a", "/v1/queue.produce", {"queue_name": work, "items": [big("a")]}).status != 200:
        return  # engine v2: a row's limit (the test asserts the refusal)
    post("produce_b", "/v1/queue.produce", {"queue_name": work, "items": [big("b")]})
    (a,) = lease("lease_a").body["items"]
    (b,) = lease("lease_b").body["items"]
    post("list", "/v1/storage/items.list", {"queue_name": work, "partition": 0})
    partition = seen["lease_a"].body.get("partition", 0)
    post("retry_dead", "/v1/queue.retry",
         {"queue_name": work, "partition": partition, "items": [{"id": a["id"], "dead": True}]})  # fmt: skip
    post("complete_b", "/v1/queue.complete", {"queue_name": work, "partition": partition, "ids": [b["id"]]})
    post("list_dead", "/v1/storage/items.list", {"queue_name": dead, "partition": 0})
    post("redrive", "/v1/queue.redrive", {"queue_name": dead})
    post("list_dead_after_redrive", "/v1/storage/items.list", {"queue_name": dead, "partition": 0})
    (again,) = lease("lease_again").body["items"]
    post("complete_a", "/v1/queue.complete",
         {"queue_name": work, "partition": partition, "ids": [again["id"]]})  # fmt: skip
    # one attempt that runs out: the next lease dead-letters it (a copy of its object, by the lease);
    # redriven, leased and completed
    post("produce_j", "/v1/queue.produce", {"queue_name": brief, "items": [big("j")]})
    lease("lease_runs_out", brief)
    time.sleep(LEASE + 0.2)
    lease("lease_exhausted", brief)
    post("redrive_again", "/v1/queue.redrive", {"queue_name": dead})
    (last,) = lease("lease_redriven", brief).body["items"]
    post("complete_j", "/v1/queue.complete",
         {"queue_name": brief, "partition": partition, "ids": [last["id"]]})  # fmt: skip
    # another large item, and one imported (storage items.import uploads it), deleted by items.delete
    post("produce_c", "/v1/queue.produce", {"queue_name": work, "items": [big("c")]})
    imported = {"payload": base64.b64encode(("i" * MIB).encode()).decode()}
    post("import_i", "/v1/storage/items.import", {"queue_name": work, "partition": 0, "items": [imported]})
    # a page holds what fits a reply: listed and deleted page by page
    seen["listed_c"] = []
    for page in range(4):
        listed = post(f"list_c{page}", "/v1/storage/items.list", {"queue_name": work, "partition": 0})
        if not listed.body["items"]:
            break
        seen["listed_c"] += [i["payload"] for i in listed.body["items"]]
        ids = [i["id"] for i in listed.body["items"]]
        post(f"delete_c{page}", "/v1/storage/items.delete", {"queue_name": work, "partition": 0, "ids": ids})
    seen["objects_left"] = payload_objects(d)
    # the reaper: one expired item dead-lettered (its object copied), one dropped (no dead-letter queue)
    post("produce_expiring", "/v1/queue.produce", {"queue_name": expiring, "items": [big("d")]})
    post("produce_doomed", "/v1/queue.produce", {"queue_name": doomed, "items": [big("e")]})
    time.sleep(SHORT + 0.1)
    seen["reaper"] = d.run_schedule()
    reaped = post("list_reaped", "/v1/storage/items.list", {"queue_name": dead, "partition": 0}).body["items"]
    post("delete_reaped", "/v1/storage/items.delete",
         {"queue_name": dead, "partition": 0, "ids": [i["id"] for i in reaped]})  # fmt: skip
    seen["objects_left_after_reaper"] = payload_objects(d)


def drive_stream(d: Deployment, r: dict[str, Any], tag: str) -> None:
    """The stream: recorded WebSocket events into the stream function, the items table's inserts (as
    DynamoDB Streams records) and the sweep schedule into the dispatcher; pushes land in moto's
    ``apigatewaymanagementapi``. ``r["stream"]`` holds what the consumers saw."""
    live, doomed = f"stream-{tag}", f"stream-doomed-{tag}"
    for name in (live, doomed):
        d.request(
            "POST", "/v1/queues.create", {"queue_name": name, "lease_timeout": "1s", "expire_timeout": "1h"}
        )
    consumer, other = f"c{tag}A", f"c{tag}B"
    seen: dict[str, Any] = {"stdout": ""}

    def ws(connection: str, route: str, body: Any = None) -> dict[str, Any]:
        event = json.loads((EVENTS / "apigw_websocket_message.json").read_text(encoding="utf-8"))
        event["requestContext"].update(routeKey=route, connectionId=connection)
        event["body"] = None if body is None else json.dumps(body)
        answer = d.invoke("stream", event)
        seen["stdout"] += answer.get("stdout", "")
        return answer

    def dispatch(event: dict[str, Any] | None = None) -> dict[str, Any]:
        answer = d.invoke("dispatcher", event) if event else d.run_schedule("dispatcher")
        seen["stdout"] += answer.get("stdout", "")
        return dict(answer["result"])

    def inserts(queues: tuple[str, ...] = (live, doomed)) -> dict[str, Any]:
        """Every item row of ``queues`` as a recorded INSERT record (moto's dynamodbstreams does not
        serve this botocore; the dispatcher reads only the keys)."""
        recorded = json.loads((EVENTS / "dynamodb_stream_insert.json").read_text(encoding="utf-8"))
        template = recorded["Records"][0]
        rows = d.moto.client("dynamodb").scan(TableName=d.outputs["ItemsTableName"])["Items"]
        return {
            "Records": [
                {**template, "dynamodb": {**template["dynamodb"], "Keys": {"pk": row["pk"], "sk": row["sk"]}}}
                for row in rows
                if row["pk"]["S"].startswith(tuple(f"{queue}~" for queue in queues))
                and not row["sk"]["S"].startswith("~")
            ]
        }

    def ticket(queue: str) -> str:
        """A ``stream.ticket`` of ``queue``: every subscribe shows one (``streamTicketsRequired``)."""
        return str(d.request("POST", paths.queue_path("stream.ticket", queue), {}).body["ticket"])

    # A subscribe without a ticket, or with another queue's, is refused and subscribes nothing.
    refused = f"c{tag}C"
    ws(refused, "$connect")
    ws(refused, "$default", {"type": "subscribe", "queue_name": live, "credit": 2})
    ws(refused, "$default", {"type": "subscribe", "queue_name": live, "credit": 2, "ticket": ticket(doomed)})
    seen["refused_frames"] = stream_frames(d, refused)
    ws(refused, "$disconnect")
    ws(consumer, "$connect")
    ws(consumer, "$default", {"type": "subscribe", "queue_name": live, "credit": 2, "ticket": ticket(live)})
    ws(other, "$connect")
    ws(other, "$default", {"type": "subscribe", "queue_name": doomed, "credit": 1, "ticket": ticket(doomed)})
    d.request(
        "POST",
        "/v1/queue.produce",
        {"queue_name": live, "items": [{"utf8": "p"}, {"utf8": "q"}, {"utf8": "r"}]},
    )
    seen["dispatch"] = dispatch(inserts())
    frames = stream_frames(d, consumer)
    leased = [item for frame in frames if frame["type"] == "lease" for item in frame["items"]]
    seen["pushed"] = [item["bytes"] for item in leased]
    first, second = leased[0]["id"], leased[1]["id"]
    # Renewed for longer than the queue's 1 s, so the retry below still holds the lease on a loaded machine.
    renew = {"type": "renew", "request_id": "n1", "partition": 0, "ids": [second], "lease_timeout": "30s"}
    ws(consumer, "$default", renew)
    ws(consumer, "$default", {"type": "complete", "request_id": "c1", "partition": 0, "ids": [first]})
    ws(consumer, "$default", {"type": "retry", "request_id": "r1", "partition": 0, "items": [{"id": second}]})
    big_stream = f"bigstream-{tag}"
    big_dead = f"bigsdead-{tag}"
    big_consumer = f"c{tag}D"
    logged = d.functions["produce"].environment.get("QUERATOR_ENGINE") == "3"
    if logged:
        # 1 MiB items pushed (the dispatcher reads their objects), one retried into the dead-letter
        # queue and one completed over the connection (the stream function copies and deletes), one
        # left to run out of its one attempt (dead-lettered by the dispatcher's sweep below). The
        # dead-letter queue keeps items a day, longer than the queue's hour, so every dead letter's
        # object is copied to a later key whatever the timing (the stream's PutObject grant).
        d.request("POST", "/v1/queues.create",
                  {"queue_name": big_dead, "lease_timeout": "1m", "expire_timeout": "24h"})  # fmt: skip
        d.request("POST", "/v1/queues.create",
                  {"queue_name": big_stream, "lease_timeout": "1s", "expire_timeout": "1h", "max_attempts": 1,
                   "dead_queue": big_dead})  # fmt: skip
        ws(big_consumer, "$connect")
        subscribe = {"type": "subscribe", "queue_name": big_stream, "credit": 1, "ticket": ticket(big_stream)}
        ws(big_consumer, "$default", subscribe)
        big_pushed = []
        big_frames: list[dict[str, Any]] = []
        for letter in "fgh":
            d.request("POST", "/v1/queue.produce", {"queue_name": big_stream, "items": [big(letter)]})
            seen[f"big_dispatch_{letter}"] = dispatch(inserts((big_stream,)))
            frames_big = stream_frames(d, big_consumer)
            big_frames += frames_big
            (pushed,) = [item for frame in frames_big if frame["type"] == "lease" for item in frame["items"]]
            # Over API Gateway's 128 KB a message: the payload follows in ``part`` frames, in order.
            parts = sorted((f["index"], f["bytes"]) for f in frames_big if f["type"] == "part")
            seen[f"big_parts_{letter}"] = (pushed.get("parts"), len(parts))
            big_pushed.append({**pushed, "bytes": pushed["bytes"] + "".join(chunk for _, chunk in parts)})
            if letter == "f":
                settle = {"type": "retry", "request_id": "bf", "partition": 0,
                          "items": [{"id": pushed["id"], "dead": True}]}  # fmt: skip
                ws(big_consumer, "$default", settle)
            elif letter == "g":
                settle = {"type": "complete", "request_id": "bg", "partition": 0, "ids": [pushed["id"]]}
                ws(big_consumer, "$default", settle)
        seen["big_pushed"] = [base64.b64decode(item["bytes"]) == (letter * MIB).encode()
                              for item, letter in zip(big_pushed, "fgh", strict=True)]  # fmt: skip
        big_frames += stream_frames(d, big_consumer)
        seen["big_answers"] = {f["request_id"]: f["type"] for f in big_frames if f.get("request_id")}
    # The doomed queue goes: its subscriber's next push is refused and the subscription forgotten.
    d.request("POST", "/v1/queues.delete", {"queue_name": doomed})
    time.sleep(1.2)  # the queue cache's second, and the consumer's 1 s leases run out
    seen["sweep"] = dispatch()  # expired leases: credit back, the items leased and pushed again
    if logged:
        # the big stream's dead letters (f, retried; h, out of attempts), deleted with their objects
        listed = d.request("POST", "/v1/storage/items.list", {"queue_name": big_dead, "partition": 0})
        seen["big_dead"] = [i["payload"][:4] for i in listed.body["items"]]
        ids = [i["id"] for i in listed.body["items"]]
        d.request("POST", "/v1/storage/items.delete", {"queue_name": big_dead, "partition": 0, "ids": ids})
        seen["big_frames_after_sweep"] = stream_frames(d, big_consumer)
        ws(big_consumer, "$disconnect")
    # Kept apart, so a sweep that pushed nothing shows what the consumer was sent instead.
    seen["sweep_frames"] = stream_frames(d, consumer)
    seen["sweep_stats"] = d.request("POST", "/v1/queue.stats", {"queue_name": live}).body
    d.request("POST", "/v1/queue.produce", {"queue_name": live, "items": [{"utf8": "s"}]})
    ws(consumer, "$default", {"type": "credit", "credit": 1})
    seen["dispatch_again"] = dispatch(inserts())
    seen["frames"] = frames + seen["sweep_frames"] + stream_frames(d, consumer)
    seen["other_frames"] = stream_frames(d, other)
    ws(consumer, "$disconnect")
    r["stream"] = seen


def stream_frames(d: Deployment, connection: str) -> list[dict[str, Any]]:
    """Frames posted to ``connection`` so far (moto keeps them as one byte string per connection)."""
    from moto.apigatewaymanagementapi.models import apigatewaymanagementapi_backends  # noqa: PLC0415

    data = apigatewaymanagementapi_backends[ACCOUNT][REGION].connections[connection].data.decode()
    decoder, frames, position = json.JSONDecoder(), [], 0
    while position < len(data):
        frame, position = decoder.raw_decode(data, position)
        frames.append(frame)
    apigatewaymanagementapi_backends[ACCOUNT][REGION].connections[connection].data = b""
    return frames


def interrupt_delete(d: Deployment, queue: str) -> None:
    """A ``queues.delete`` that stopped after marking the queue: the reaper finishes it. Done with the
    product's own catalog adapter, as the test's (not a function's) principal."""
    catalog = DynamoDBQueueCatalog(d.outputs["CatalogTableName"], host=d.moto.endpoint, region=REGION)
    catalog.mark_deleting(queue)


def _total(reply: Reply) -> int:
    return sum(p.get("total", 0) for q in reply.body["logicalQueues"] for p in q["partitions"])


# -- the deployment -------------------------------------------------------------------------------


def test_the_stack_comes_up_with_only_unmodelled_observability_stood_in_for(deployed: Deployment) -> None:
    assert deployed.replaced <= PLACEHOLDER_TYPES | STOOD_IN_ANYWAY
    assert set(deployed.functions) == set(FUNCTION_NAMES)
    assert deployed.outputs["ApiUrl"].endswith(f"/{deployed.stage}/")
    tables = {deployed.outputs["ItemsTableName"], deployed.outputs["CatalogTableName"]}
    assert tables <= set(deployed.moto.client("dynamodb").list_tables()["TableNames"])
    for fn in deployed.functions.values():
        assert fn.environment["QUERATOR_ITEMS_TABLE"] == deployed.outputs["ItemsTableName"]
        assert fn.environment["QUERATOR_CATALOG_TABLE"] == deployed.outputs["CatalogTableName"]


def test_deployed_time_limits_fit_api_gateway_and_the_reapers_schedule(deployed: Deployment) -> None:
    behind_api = {route.function for route in ROUTES}
    for fn in deployed.functions.values():
        if fn.name in behind_api:
            assert fn.configuration["Timeout"] <= API_GATEWAY_SECONDS, fn.name
    events = deployed.moto.client("events")
    rule = events.describe_rule(Name=deployed.rule_of("reaper")["Name"])
    minutes = int(re.fullmatch(r"rate\((\d+) minutes?\)", rule["ScheduleExpression"]).group(1))  # type: ignore[union-attr]
    # Half the period stays free: a late delivery never starts a run over the previous one.
    assert deployed.functions["reaper"].configuration["Timeout"] * 2 <= minutes * 60


def test_a_bundling_stage_ships_the_layer_inside_one_shared_asset_and_the_others_attach_it(
    deployed: Deployment,
) -> None:
    bundles = bool(cdk_context()["stages"][deployed.stage].get("bundleLayer"))
    for fn in deployed.functions.values():
        assert fn.task_root is not None
        # LocalStack Community accepts layers but never mounts them (stage local).
        assert (fn.task_root / "querator" / "__init__.py").is_file() == bundles, fn.name
        assert len(fn.properties.get("Layers", [])) == (0 if bundles else 1), fn.name
        module = fn.configuration["Handler"].rpartition(".")[0]
        assert (fn.task_root / (module.replace(".", "/") + ".py")).is_file(), fn.configuration["Handler"]
    # Bundled, the nine functions deploy one code object (the layer's 27 MB uploaded once); otherwise
    # each function deploys its own folder.
    code_objects = {fn.properties["Code"]["S3Key"] for fn in deployed.functions.values()}
    assert len(code_objects) == (1 if bundles else len(deployed.functions))


# -- the lifecycle --------------------------------------------------------------------------------


def test_the_deployed_functions_serve_the_whole_lifecycle(lifecycle: dict[str, Any]) -> None:
    r = lifecycle
    failed = {
        step: (reply.status, reply.body)
        for step, reply in r.items()
        if step not in ("reaper", "stream", "payloads")
        and reply.status != 200
        and step not in EXPECTED_ERRORS
        and not step.startswith("scoped_")
    }
    # A scoped route on a queue that does not exist: its function's 400, not API Gateway's 403.
    scoped = {step: r[step] for step in r if step.startswith("scoped_")}
    assert len(scoped) == len(SCOPED_ROUTES)
    assert {step: (reply.status, reply.function) for step, reply in scoped.items()} == {
        f"scoped_{route.name}": (400, route.function) for route in SCOPED_ROUTES
    }
    assert failed == {}
    for step, status in EXPECTED_ERRORS.items():
        assert r[step].status == status, (step, r[step].body)
    assert r["health"].function == "meta"
    assert r["produce_replayed"].headers.get("Idempotency-Replayed") == "true"
    assert r["produce_keyed"].headers.get("Idempotency-Replayed") == "false"
    assert r["complete"].body.get("failed") in (None, [])
    # (it reads the partition's schedule mark: the items function's only Query, which the IAM audit
    # expects to see used)
    assert r["complete_scheduled"].body.get("failed") in (None, []), r["complete_scheduled"].body
    assert len(r["lease_rest"].body["items"]) == 3  # c, d and the retried b
    assert len(r["lease_again"].body["items"]) == 2  # c and d, requeued by the lease itself
    # b by retry(dead=true); c and d once out of attempts
    assert _total(r["stats_dead"]) == 3, (r["lease_again"], r["lease_exhausted"], r["stats_dead"])
    assert [i["bytes"] for i in r["lease_scheduled"].body["items"]] == ["cw=="]  # "s", once due
    assert r["import_again"].body["items"] == []
    listed = [i["priority"] for i in r["list_priorities"].body["items"]]
    assert listed == sorted(listed) and (listed[0], listed[-1]) == (0, 7)  # in lease order
    (moved,) = r["reprioritize"].body["items"]
    assert moved["new_id"].startswith(".1") and moved["new_id"] != moved["id"]
    assert [(i["bytes"], i["priority"]) for i in r["lease_one"].body["items"]] == [("dQ==", 0)]
    assert _total(r["stats_work"]) == 0
    reaped = r["reaper"]["result"]
    assert reaped["dead_lettered"] == 1  # the expiring queue's item, into the dead-letter queue
    assert reaped["deleted"] == 1  # the doomed queue's item: no dead-letter queue
    assert reaped["queues_deleted"] == 1
    assert reaped["finished"] is True
    assert _total(r["stats_dead_after_reaper"]) == 4
    assert r["redrive"].body == {"moved": 4, "remaining": 0, "stranded": 0}
    assert _total(r["stats_dead_after_redrive"]) == 0
    assert _total(r["stats_doomed"]) == 0


def test_the_deployed_stream_pushes_within_credit_settles_over_the_connection_and_forgets_the_gone(
    lifecycle: dict[str, Any],
) -> None:
    seen = lifecycle["stream"]
    # Without a ticket of its queue a subscribe is refused (403), and nothing was pushed to it.
    assert [(f["type"], f.get("code")) for f in seen["refused_frames"]] == [("error", 403), ("error", 403)]
    # Three items for a consumer with credit 2: the dispatcher pushed two, from the inserts alone.
    assert seen["dispatch"] == {"queues": 1, "pushed": 2}
    assert seen["pushed"] == ["cA==", "cQ=="]  # "p", "q"
    answers = {f["request_id"]: f["type"] for f in seen["frames"] if f.get("request_id")}
    assert answers == {"n1": "ok", "c1": "ok", "r1": "ok"}, seen["frames"]
    # The expired leases came back by the sweep and were pushed again (credit 2: r and the retried q).
    assert seen["sweep"]["pushed"] == 2, (seen["sweep_frames"], seen["sweep_stats"], seen["stdout"][-4000:])
    # The doomed queue's subscriber was told, and its subscription is gone.
    assert [f["type"] for f in seen["other_frames"]] == ["subscribed", "error"]
    assert seen["other_frames"][1]["code"] == 400


#: Steps whose contract answer is an error.
EXPECTED_ERRORS = {
    "wrong_method": 400,
    "unknown_path": 501,
    "lease_exhausted": 454,
    "info_gone": 400,
    "delete_dead_refused": 400,
    "info_deleted": 400,
}


def test_every_metric_the_functions_publish_carries_their_stage(
    deployed: Deployment, lifecycle: dict[str, Any]
) -> None:
    printed = "".join(r.stdout if hasattr(r, "stdout") else r["stdout"] for r in lifecycle.values())
    emf = [json.loads(line) for line in printed.splitlines() if line.startswith('{"_aws"')]
    names = set()
    for blob in emf:
        for directive in blob["_aws"]["CloudWatchMetrics"]:
            assert directive["Namespace"] == "Querator"
            # One dimension set, in any order: CloudWatch identifies a metric by the set.
            assert [sorted(d) for d in directive["Dimensions"]] == [["service", "stage"]], directive
            names |= {m["Name"] for m in directive["Metrics"]}
        assert (blob["service"], blob["stage"]) == ("querator", deployed.stage)
    # The lifecycle publishes these at least; the alarms select on the same two dimensions.
    assert {"ItemsProduced", "ItemsLeased", "ItemsCompleted", "LeaseEmpty", "OldestItemAgeSeconds"} <= names


def test_every_route_and_the_schedule_reached_their_function_through_the_deployed_wiring(
    deployed: Deployment, lifecycle: dict[str, Any]
) -> None:
    routed = set(deployed.routed)
    # The scoped twins through their own resources ({queue}) too: the lifecycle's "scoped_*" steps.
    for route in ROUTES:
        assert (route.function, f"{route.method} {route.path}") in routed
    assert ("reaper", "schedule") in routed
    assert {("stream", "$connect"), ("stream", "$default"), ("stream", "$disconnect")} <= routed
    assert {("dispatcher", "records"), ("dispatcher", "schedule")} <= routed


# -- least privilege, both ways -------------------------------------------------------------------


@pytest.fixture(scope="module")
def audits(deployed: Deployment, lifecycle: dict[str, Any]) -> dict[str, iam_audit.Audit]:
    found = {name: iam_audit.audit(deployed, fn) for name, fn in deployed.functions.items()}
    text = iam_audit.report(deployed.stage, list(found.values()))
    print("\n" + text)
    if target := os.environ.get("QUERATOR_POLICY_AUDIT"):
        with Path(target).open("a", encoding="utf-8") as out:
            out.write(f"{datetime.now(UTC):%Y-%m-%d %H:%M} {text}\n")
    return found


@pytest.mark.parametrize("name", FUNCTION_NAMES)
def test_every_call_a_function_makes_is_allowed_by_its_deployed_policy(
    audits: dict[str, iam_audit.Audit], name: str
) -> None:
    assert audits[name].used, f"{name} made no AWS call at all: the scenario misses it"
    assert audits[name].denied == []


@pytest.fixture(scope="module")
def unused_on_every_stage(stages: dict[str, tuple[Deployment, dict[str, Any]]]) -> dict[str, set[str]]:
    """Per function, the grants no call of any stage needed, as ``action resource-role``: every
    stage has the same grants, and the stages run both engines (``ENGINES``)."""
    unused: dict[str, set[str]] = {}
    for deployment, _ in stages.values():
        for name, fn in deployment.functions.items():
            audit = iam_audit.audit(deployment, fn)
            found = {f"{g.action} {iam_audit.short(g.resource)}" for g in audit.unused}
            unused[name] = unused[name] & found if name in unused else found
    return unused


@pytest.mark.parametrize("name", FUNCTION_NAMES)
def test_every_grant_of_a_function_is_used_by_its_code_on_one_engine_or_the_other(
    unused_on_every_stage: dict[str, set[str]], name: str
) -> None:
    assert unused_on_every_stage[name] == set()


@pytest.mark.parametrize("caller", list(Caller))
def test_each_deployed_caller_policy_allows_its_routes_and_nothing_else(
    deployed: Deployment, caller: Caller
) -> None:
    iam = deployed.moto.client("iam")
    arn = deployed.outputs[f"{caller.value.capitalize()}PolicyArn"]
    version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
    document = iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"]
    statements = (json.loads(document) if isinstance(document, str) else document)["Statement"]
    prefix = f"arn:aws:execute-api:{REGION}:{ACCOUNT}:{deployed.api_id}/{deployed.stage}"
    for route in ROUTES:
        path = iam_path(route, "orders")
        request = iam_audit.Request("execute-api:Invoke", f"{prefix}/{route.method}{path}")
        assert iam_audit.allowed(statements, request) == (route in caller_routes(caller)), route
    # The catch-alls that answer 400 / 501 are in no caller's policy.
    for other in ("GET/v1/queue.produce", "POST/v1/queue.nope"):
        assert not iam_audit.allowed(statements, iam_audit.Request("execute-api:Invoke", f"{prefix}/{other}"))


# -- per-queue grants, enforced by API Gateway's IAM authorization -----------------------------------


def _invocations(d: Deployment) -> int:
    return sum(fn.invocations for fn in d.functions.values())


def _scoped(route_name: str, queue: str) -> str:
    return paths.queue_path(route_name, queue)


@pytest.mark.parametrize("role", list(GRANTED))
def test_a_role_granted_queues_produces_leases_and_completes_there(deployed: Deployment, role: str) -> None:
    signer = deployed.outputs[f"Test{role}RoleArn"]
    for queue in MINE[role]:
        # GIVEN the queue, created by an administrator
        created = deployed.request(
            "POST", "/v1/queues.create", {"queue_name": queue, "lease_timeout": "1m", "expire_timeout": "1h"}
        )
        assert created.status == 200, created.body

        # WHEN the role produces, reads the settings, leases and completes through the scoped routes
        def call(name: str, body: dict[str, Any], queue: str = queue) -> Reply:
            return deployed.request("POST", _scoped(name, queue), body, signer=signer)

        produced = call("queue.produce", {"items": [{"utf8": "hello"}]})
        info = call("queues.info", {})
        leased = call("queue.lease", {"batch_size": 5, "client_id": "scoped", "request_timeout": "0s"})
        # THEN each call is answered by its function
        assert (produced.status, produced.function) == (200, "produce"), produced.body
        assert (info.status, info.body["queue_name"]) == (200, queue), info.body
        assert leased.status == 200, leased.body
        (item,) = leased.body["items"]
        assert item["bytes"] == "aGVsbG8="
        partition = leased.body.get("partition", 0)
        completed = call("queue.complete", {"partition": partition, "ids": [item["id"]]})
        assert completed.status == 200 and completed.body.get("failed") in (None, []), completed.body
        assert deployed.request("GET", "/health", signer=signer).status == 200
    assert not [refused for refused in deployed.refused if refused[0] == signer and "/health" in refused[1]]


@pytest.mark.parametrize("role", list(GRANTED))
def test_every_call_on_another_queue_and_every_admin_call_is_refused_before_any_function(
    deployed: Deployment, role: str
) -> None:
    signer = deployed.outputs[f"Test{role}RoleArn"]
    (mine, *_) = MINE[role]
    admin_twins = [r for r in SCOPED_ROUTES if r.function in (Function.QUEUES, Function.ADMIN)]
    asked = [
        # every scoped route on the queues next to the grant
        *((_scoped(r.name, other), {}) for r in SCOPED_ROUTES for other in OTHERS[role]),
        # every admin route on the role's own queue, but reading its settings
        *((_scoped(r.name, mine), {}) for r in admin_twins if r.name != "queues.info"),
        # every plain route, its body naming the role's own queue: IAM cannot see the body
        *((r.path, {"queue_name": mine}) for r in ROUTES if not r.scoped and r.function != Function.META),
    ]
    refused, invoked = len(deployed.refused), _invocations(deployed)
    # WHEN the role signs each
    replies = {path: deployed.request("POST", path, body, signer=signer) for path, body in asked}
    # THEN API Gateway's authorization refuses every one, and no function ran
    assert {path: reply.status for path, reply in replies.items()} == {path: 403 for path, _ in asked}
    assert all(reply.function == "" for reply in replies.values())
    assert _invocations(deployed) == invoked
    assert len(deployed.refused) - refused == len(asked)
    assert "/v1/queues.list" in replies and "/v1/queues.delete" in replies


def test_the_stacks_example_policies_grant_what_they_say_once_attached(deployed: Deployment) -> None:
    # GIVEN a role of the account with both examples the stack outputs attached (as docs/deploy.md shows)
    iam_client = deployed.moto.client("iam")
    name = f"example-{deployed.stage}"
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
             "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"}}]}  # fmt: skip
    role = iam_client.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
    for output in ("ExampleOrdersProducerPolicyArn", "ExampleEmailsWorkerPolicyArn"):
        iam_client.attach_role_policy(RoleName=name, PolicyArn=deployed.outputs[output])
    for queue in ("orders-eu", "emails"):
        body = {"queue_name": queue, "lease_timeout": "1m", "expire_timeout": "1h"}
        assert deployed.request("POST", "/v1/queues.create", body).status == 200
    produce = {"items": [{"utf8": "x"}]}
    lease = {"batch_size": 1, "client_id": "example", "request_timeout": "0s"}
    # WHEN it signs calls: produce to orders-*, lease emails; and the other way round
    asked = {
        ("queue.produce", "orders-eu"): produce,
        ("queue.lease", "emails"): lease,
        ("queue.produce", "emails"): produce,
        ("queue.lease", "orders-eu"): lease,
        ("queue.stats", "emails"): {},
    }
    replies = {
        call: deployed.request("POST", _scoped(*call), body, signer=role) for call, body in asked.items()
    }
    # THEN the first two reach their functions, the rest are refused before any
    assert {call: reply.status for call, reply in replies.items()} == {
        ("queue.produce", "orders-eu"): 200,
        ("queue.lease", "emails"): 454,  # nothing to lease: the lease function's answer
        ("queue.produce", "emails"): 403,
        ("queue.lease", "orders-eu"): 403,
        ("queue.stats", "emails"): 403,
    }
    assert replies["queue.lease", "emails"].function == "lease"


# -- payloads over a row's, in the payload bucket ---------------------------------------------------


def _b64(letter: str) -> str:
    return base64.b64encode((letter * MIB).encode()).decode()


def _engine(deployed: Deployment) -> int:
    return int(deployed.functions["produce"].environment["QUERATOR_ENGINE"])


def _s3_calls(deployed: Deployment) -> dict[str, Counter[str]]:
    """Per function, its S3 calls by operation."""
    return {
        name: Counter(c.operation for c in deployed.calls_of(name) if c.service == "s3")
        for name in deployed.functions
    }


def test_a_1_mib_payload_is_produced_leased_listed_dead_lettered_redriven_and_completed(
    deployed: Deployment, lifecycle: dict[str, Any]
) -> None:
    seen = lifecycle["payloads"]
    if _engine(deployed) == 2:
        # Engine v2 keeps payloads in rows: a payload over a row's is refused, and no function
        # touched the bucket although its name is in their environment.
        assert seen["produce_a"].status == 400, seen["produce_a"].body
        assert "larger than 380000 bytes" in json.dumps(seen["produce_a"].body)
        assert {name: dict(calls) for name, calls in _s3_calls(deployed).items() if calls} == {}
        return
    summary = {step: reply.status for step, reply in seen.items() if hasattr(reply, "status")}
    assert {s: status for s, status in summary.items() if status != 200} == {"lease_exhausted": 454}, summary
    # Leased whole, each payload read from its object.
    assert seen["lease_a"].body["items"][0]["bytes"] == _b64("a")
    assert seen["lease_b"].body["items"][0]["bytes"] == _b64("b")
    # Listed whole (storage items.list reads the objects too), while leased.
    listed = seen["list"].body["items"]
    assert listed and {i["payload"] for i in listed} <= {_b64("a"), _b64("b")}
    assert seen["retry_dead"].body.get("failed") in (None, []), seen["retry_dead"].body
    assert seen["complete_b"].body.get("failed") in (None, []), seen["complete_b"].body
    # The dead letter's payload is whole in the dead-letter queue's listing (an export of it).
    assert [i["payload"] for i in seen["list_dead"].body["items"]] == [_b64("a")]
    assert seen["redrive"].body == {"moved": 1, "remaining": 0, "stranded": 0}
    assert seen["list_dead_after_redrive"].body["items"] == []
    assert seen["lease_again"].body["items"][0]["bytes"] == _b64("a")
    assert seen["complete_a"].body.get("failed") in (None, []), seen["complete_a"].body
    # Its one attempt ran out: the next lease dead-lettered it (and had nothing else to lease).
    assert seen["lease_runs_out"].body["items"][0]["bytes"] == _b64("j")
    assert seen["redrive_again"].body == {"moved": 1, "remaining": 0, "stranded": 0}
    assert seen["lease_redriven"].body["items"][0]["bytes"] == _b64("j")
    assert seen["complete_j"].body.get("failed") in (None, []), seen["complete_j"].body
    assert sorted(seen["listed_c"]) == sorted([_b64("c"), _b64("i")])
    # Completed, and deleted by storage items.delete: no object is left in the deployed bucket.
    assert seen["objects_left"] == []
    reaped = seen["reaper"]["result"]
    assert reaped["dead_lettered"] >= 1 and reaped["deleted"] >= 1, reaped
    assert [i["payload"] for i in seen["list_reaped"].body["items"]] == [_b64("d")]
    assert seen["objects_left_after_reaper"] == []


def test_1_mib_payloads_are_pushed_whole_over_the_stream_and_leave_no_object_behind(
    deployed: Deployment, lifecycle: dict[str, Any]
) -> None:
    seen = lifecycle["stream"]
    if _engine(deployed) == 2:
        assert "big_pushed" not in seen
        return
    # Each too large for one message: its lease frame, then its payload in parts.
    assert [seen[f"big_parts_{letter}"][0] for letter in "fgh"] == [seen[f"big_parts_{x}"][1] for x in "fgh"]
    assert all(seen[f"big_parts_{letter}"][1] > 1 for letter in "fgh")
    assert seen["big_pushed"] == [True, True, True]
    assert seen["big_answers"] == {"bf": "ok", "bg": "ok"}
    # f retried into the dead-letter queue over the connection, h out of its one attempt (the sweep).
    assert sorted(seen["big_dead"]) == sorted([_b64("f")[:4], _b64("h")[:4]])
    assert not [f for f in seen["big_frames_after_sweep"] if f["type"] == "lease"]
    assert seen["objects_left"] == []


def test_the_s3_calls_each_function_made(deployed: Deployment, lifecycle: dict[str, Any]) -> None:
    """Printed for the record (``-s``): which operation each function called how often."""
    calls = {name: dict(sorted(c.items())) for name, c in _s3_calls(deployed).items() if c}
    print(f"\nS3 calls, stage {deployed.stage}: {json.dumps(calls, sort_keys=True)}")
    assert not calls.get("meta") and not calls.get("queues")
