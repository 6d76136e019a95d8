"""The stack deployed onto LocalStack with ``cdklocal``, as localstack/README.md tells users, on the host.

LocalStack 4.10 (``localstack-core``, ``scripts/localstack_env.sh``) runs as a host process on
127.0.0.1 and a free port, without Docker: its DynamoDB (and the streams) served by the moto it
bundles and its Lambda by host processes of the runtime's Python, the two plugins in
``tests/infra/localstack_plugins`` (test code; users with Docker run stock LocalStack). Then
``localstack/deploy.sh`` bootstraps and deploys stage ``local`` exactly as a user runs it, the
lifecycle goes through LocalStack's API Gateway signed with SigV4 (the project's client), the reaper
runs when LocalStack's EventBridge rule fires it, and stopping LocalStack tears the whole deployment
down (it keeps no state) with every process it started.

Timing on this machine (2 cores shared with three other sessions, load 12, 2026-11-27): LocalStack
ready in 3-5 s; ``deploy.sh`` 110-120 s (bootstrap 14 s, the app's synthesis 31 s, the deployment of
187 resources 61 s); the lifecycle 7-11 s; the reaper 13-51 s after the lease (its schedule is one
minute); stopping 7-9 s: 2 min 24 s in all. ``.venv-localstack`` builds in 56 s from uv's warm
cache and 75 s from an empty one (about 110 packages from PyPI); once built, 0.3 s.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.credentials import Credentials

from querator.client import Client
from querator.config import Metric
from tests.infra.conftest import LAMBDA_RUNTIME

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = [pytest.mark.infra, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = Path(__file__).resolve().parent / "localstack_plugins"
ENV_DIR = ROOT / ".venv-localstack"
#: What LocalStack needs to start: well under this on this machine (about 8 s).
START_SECONDS = 90.0
#: The reaper's schedule is ``rate(1 minute)``; two periods and a margin for a loaded machine.
REAPER_SECONDS = 150.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _group_members(group: int) -> list[int]:
    """PIDs of the processes in a process group (LocalStack and the function processes it started)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def _until(condition: Callable[[], bool], seconds: float, what: str) -> float:
    """Polls ``condition`` until it holds; returns how long it took, fails after ``seconds``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > seconds:
            pytest.fail(f"{what}: not within {seconds:.0f} s")
        time.sleep(1)
    return time.monotonic() - started


class LocalStack:
    def __init__(self, url: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.process = process
        self.log = log

    def healthy(self) -> bool:
        if self.process.poll() is not None:
            pytest.fail(f"LocalStack exited with {self.process.returncode}:\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"{self.url}/_localstack/health", timeout=5) as reply:  # noqa: S310
                return reply.status == 200
        except OSError:
            return False

    def tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


@pytest.fixture(scope="module")
def localstack(
    lambda_runtime: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    """LocalStack 4.10 on the host with the two plugins; stopped, and its process group ended, after."""
    subprocess.run([ROOT / "scripts/localstack_env.sh"], cwd=ROOT, check=True, timeout=1200)  # noqa: S603
    python, sdk = lambda_runtime
    root = tmp_path_factory.mktemp("localstack")
    port = _free_port()
    version = LAMBDA_RUNTIME.removeprefix("python").replace(".", "_")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(root)),
        "TMPDIR": str(root),  # where LocalStack unzips the functions' code
        "PYTHONPATH": str(PLUGINS),  # its entry_points.txt registers the plugins
        "GATEWAY_LISTEN": f"127.0.0.1:{port}",
        "GATEWAY_SERVER": "hypercorn",
        "FILESYSTEM_ROOT": str(root / "filesystem"),
        "DNS_ADDRESS": "0",  # no DNS server of its own (it would want port 53)
        "DISABLE_EVENTS": "1",  # no analytics
        "SKIP_SSL_CERT_DOWNLOAD": "1",
        "PROVIDER_OVERRIDE_DYNAMODB": "moto",
        "PROVIDER_OVERRIDE_DYNAMODBSTREAMS": "moto",
        "LAMBDA_RUNTIME_EXECUTOR": "host",
        f"QUERATOR_LAMBDA_PYTHON_{version}": python,
        f"QUERATOR_LAMBDA_SDK_{version}": str(sdk),
    }
    log = root / "localstack.log"
    with log.open("wb") as out:
        process = subprocess.Popen(  # noqa: S603 - LocalStack's venv, fixed arguments
            [str(ENV_DIR / "bin/python"), "-m", "localstack.runtime.main"],
            cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    ls = LocalStack(f"http://127.0.0.1:{port}", process, log)
    try:
        took = _until(ls.healthy, START_SECONDS, "LocalStack answering on its health endpoint")
        print(f"LocalStack 4.10 ready in {took:.1f} s on 127.0.0.1:{port}")
        yield ls
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to LocalStack (it stops its execution environments), then whatever of its process group
    is left is killed, by PID."""
    group = process.pid
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)
    for pid in _group_members(group):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while _group_members(group) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _group_members(group), "processes LocalStack started outlived it"


@pytest.fixture(scope="module")
def deployed(localstack: LocalStack) -> dict[str, str]:
    """``localstack/deploy.sh`` against the host LocalStack; the stack's outputs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CDK_"))}
    env["QUERATOR_LOCALSTACK_URL"] = localstack.url
    started = time.monotonic()
    result = subprocess.run(  # noqa: S603 - the project's deploy script, as users run it
        [str(ROOT / "localstack/deploy.sh")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}\n{localstack.tail()}"
    # The CLI's own figures (synthesis, deployment), so a log shows where the deploy spends.
    phases = [
        line.strip() for line in result.stdout.splitlines() + result.stderr.splitlines() if " time: " in line
    ]
    print(f"localstack/deploy.sh (bootstrap and deploy) took {time.monotonic() - started:.0f} s: {phases}")
    outputs: dict[str, str] = json.loads(
        (ROOT / "cdk.out/localstack-outputs.json").read_text(encoding="utf-8")
    )["querator-local"]
    assert f"QUERATOR_E2E_URL={outputs['ApiUrl']}" in result.stdout
    return outputs


@pytest.fixture(scope="module")
def client(localstack: LocalStack, deployed: dict[str, str]) -> Client:
    """The project's client, SigV4-signing, through LocalStack's API Gateway: the ``ApiUrl`` output
    names ``<api id>.execute-api.localhost.localstack.cloud``, a host this machine may not resolve,
    so it goes by LocalStack's path form of the same API and stage."""
    api = urlsplit(deployed["ApiUrl"])
    api_id, stage = api.hostname.split(".")[0] if api.hostname else "", api.path.strip("/")
    return Client(
        f"{localstack.url}/_aws/execute-api/{api_id}/{stage}",
        sigv4_region="us-east-1",
        credentials=Credentials("test", "test"),
        timeout=60,
        max_retries=0,
    )


def test_the_deployed_stack_serves_the_lifecycle_through_api_gateway_signed(
    client: Client, localstack: LocalStack
) -> None:
    queue = f"work-{uuid.uuid4().hex[:6]}"
    client.create_queue(queue, lease_timeout="1m", expire_timeout="1h", max_attempts=3)
    client.produce(queue, [b"a", b"b", b"c"])
    leased = client.lease(queue, batch_size=2, request_timeout="0s")
    assert [item.payload for item in leased.items] == [b"a", b"b"]
    first, second = leased.items
    client.complete(queue, [first])
    client.retry(queue, [second])  # back at the tail, leasable again
    stats = client.stats(queue)
    assert (stats.total, stats.total_leased) == (2, 0), localstack.tail()
    again = client.lease(queue, batch_size=10, request_timeout="0s")
    assert sorted(item.payload for item in again.items) == [b"b", b"c"]
    assert {item.payload: item.attempts for item in again.items}[b"b"] == 2
    client.complete(queue, list(again.items))
    assert client.stats(queue).total == 0


def test_the_schedule_fires_the_reaper_which_puts_back_an_expired_lease(
    client: Client, localstack: LocalStack
) -> None:
    # Nothing leases from this queue after the first lease: only the reaper can put the item back.
    queue = f"expiring-{uuid.uuid4().hex[:6]}"
    client.create_queue(queue, lease_timeout="2s", expire_timeout="1h")
    client.produce(queue, [b"x"])
    assert len(client.lease(queue, request_timeout="0s")) == 1
    assert client.stats(queue).total_leased == 1

    def released() -> bool:
        stats = client.stats(queue)
        return (stats.total, stats.total_leased) == (1, 0)

    took = _until(released, REAPER_SECONDS, "the expired lease put back by the scheduled reaper")
    print(f"the scheduled reaper put the expired lease back {took:.0f} s after the lease")
    # Nothing but the rule invokes the reaper: its log group (what the function printed, its metrics)
    # shows the schedule's invocations reached it through LocalStack's Lambda.
    session = boto3.session.Session(
        aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
    )
    functions = session.client("lambda", endpoint_url=localstack.url).list_functions()["Functions"]
    (reaper,) = [f["FunctionName"] for f in functions if "ReaperFunction" in f["FunctionName"]]
    logs = session.client("logs", endpoint_url=localstack.url)

    def logged() -> bool:
        events = logs.filter_log_events(logGroupName=f"/aws/lambda/{reaper}")["events"]
        return any(Metric.REAPER_SCANNED in event["message"] for event in events)

    # LocalStack writes an invocation's logs after it has answered.
    _until(logged, 30, f"the reaper's metrics in its log group\n{localstack.tail()}")
