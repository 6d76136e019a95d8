"""Cold start: import time of each Lambda handler module against ``import boto3``.

Run ``uv run python -m benchmarks.coldstart`` (``--repeat N``); ``python -m benchmarks`` runs it with
everything else. Each figure is the median over ``repeat`` fresh interpreters of the cumulative
import time CPython reports with ``-X importtime`` for the top module (``functions.<name>.handler``,
or ``boto3``), with warm bytecode caches: only the import, not interpreter start-up. A handler
imports botocore (not boto3: ``querator.bootstrap.make_client``), which is most of ``import boto3``;
what is above it is ours (Powertools, PynamoDB, the route table, the wire messages). Outside
Lambda (no ``LAMBDA_TASK_ROOT``, as here) the import makes no client: this is the import share of a
cold start. In Lambda the handlers also make their clients at init (``--layer`` measures that).

``--layer`` measures what Lambda runs instead: each handler imported from its function folder and the
layer ``layers/core/build.py`` builds (for this machine's architecture), on the runtime's CPython with
``-S`` and no bytecode writes (``/opt`` is read-only), next to the runtime's boto3 (installed at the
locked version, compiled as the runtime ships it). Three columns: the layer without bytecode (what
the build shipped before it compiled), with bytecode, and with bytecode in an untraced stage (no
X-Ray SDK import); each against ``import boto3`` in the same setting. In this setting (Lambda's
``LAMBDA_TASK_ROOT`` set) each handler's import also makes its clients and builds its wire models,
as in Lambda's init phase; the row ``boto3+client`` is the like-for-like baseline: ``import boto3``
and one DynamoDB client.

``--steps`` says where the lease handler's import goes: one fresh interpreter per sample imports
botocore, the domain, the wire messages, PynamoDB, Powertools' logger, ... in turn, timing each
import by the wall clock (no ``-X importtime``), so each figure is what that step adds to the ones
before it, beside ``import boto3`` alone (docs/adr/0013-cold-start.md, 2026-11-26 amendment).

``--first-request`` measures what a caller waits for instead: a fresh interpreter imports the
handler and serves one real request (a lease, a produce, a stats call, ...) against a moto server on
127.0.0.1, timed from before the import to the reply. Import time alone rewards moving work from
the import to the first request; this figure does not. Its baseline is what any function that
calls DynamoDB must do: ``import boto3``, make a client, one request.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from querator.observability import WARM_UP_FAILED

ROOT = Path(__file__).resolve().parent.parent
REPEAT = 7
QUICK_REPEAT = 3
BASELINE = "boto3"
PYCACHE = Path(tempfile.gettempdir()) / "querator-coldstart-pycache"


def handler_modules(root: Path = ROOT) -> list[str]:
    """``functions.<name>.handler`` for every function folder with a handler."""
    return sorted(f"functions.{p.parent.name}.handler" for p in (root / "functions").glob("*/handler.py"))


def parse_importtime(stderr: str, module: str) -> int:
    """Cumulative microseconds of ``module`` from ``-X importtime`` output."""
    for line in stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        fields = [f.strip() for f in line.removeprefix("import time:").split("|")]
        if len(fields) == 3 and fields[2] == module and fields[1].isdigit():
            return int(fields[1])
    raise ValueError(f"{module} not found in -X importtime output")


def _dev_env(**extra: str) -> dict[str, str]:
    """This environment for a child interpreter of the dev venv, importing from the checkout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONPYCACHEPREFIX": str(PYCACHE), **extra}
    # A deployed package ships compiled bytecode (pip compiles on install) and Lambda cannot write
    # any, so measure with bytecode: cached under a prefix of our own, never in the checkout or venv.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def import_micros(module: str) -> int:
    """One fresh interpreter's cumulative import time of ``module``, in microseconds."""
    env = _dev_env()
    # Handlers read no settings at import; these only keep Powertools quiet if a future one does.
    env.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    result = subprocess.run(  # noqa: S603 - our interpreter, a module name from handler_modules()
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=True,
        timeout=120,
    )
    return parse_importtime(result.stderr, module)


@dataclass(frozen=True)
class ImportTime:
    module: str
    samples: tuple[int, ...]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples) / 1000


def measure(repeat: int = REPEAT) -> list[ImportTime]:
    """boto3 first, then every handler; samples interleaved so machine load hits all alike."""
    modules = [BASELINE, *handler_modules()]
    for module in modules:
        # Discarded: the first import compiles the bytecode the later ones read.
        import_micros(module)
    samples: dict[str, list[int]] = {m: [] for m in modules}
    for _ in range(repeat):
        for module in modules:
            samples[module].append(import_micros(module))
    return [ImportTime(m, tuple(samples[m])) for m in modules]


def format_table(times: list[ImportTime]) -> str:
    baseline = next(t for t in times if t.module == BASELINE)
    repeat = len(baseline.samples)
    lines = [
        f"Cold start: import time, median of {repeat} fresh interpreters (-X importtime, cumulative)",
        f"{'module':<28} {'median ms':>9} {'min ms':>7} {'max ms':>7} {'x boto3':>7}",
    ]
    for t in times:
        lines.append(
            f"{t.module:<28} {t.median_ms:>9.0f} {min(t.samples) / 1000:>7.0f} {max(t.samples) / 1000:>7.0f}"
            f" {t.median_ms / baseline.median_ms:>7.2f}"
        )
    return "\n".join(lines)


# -- import and first request (--first-request) -------------------------------------------------------

QUEUE = "coldstart"
#: The child: times the import and the first invocation, writes both (µs) and the status to argv[1].
#: Its Lambda context is a class of its own, not ``localserver.LocalContext``: importing the local
#: server would add its imports (http.server, ...) to the time measured.
_FIRST_REQUEST_CHILD = """
import json, sys, time
started = time.perf_counter()
import {module} as handler
imported = time.perf_counter()
event = json.loads(sys.argv[2])
class Context:
    function_name = "coldstart"; memory_limit_in_mb = 512; function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:us-east-1:000000000000:function:coldstart"
    aws_request_id = "coldstart"; log_group_name = log_stream_name = "coldstart"
    def get_remaining_time_in_millis(self): return 30000
reply = handler.lambda_handler(event, Context())
done = time.perf_counter()
status = reply.get("statusCode", 200) if isinstance(reply, dict) else 200
with open(sys.argv[1], "w") as out:
    json.dump([int((imported - started) * 1e6), int((done - started) * 1e6), status], out)
"""
#: The baseline child: the least a DynamoDB-calling function does.
_BASELINE_CHILD = """
import json, sys, time
started = time.perf_counter()
import boto3
imported = time.perf_counter()
boto3.client("dynamodb").describe_table(TableName=sys.argv[2])
done = time.perf_counter()
with open(sys.argv[1], "w") as out:
    json.dump([int((imported - started) * 1e6), int((done - started) * 1e6), 200], out)
"""


@dataclass(frozen=True)
class FirstRequest:
    """Medians (ms) of one function: import, and import plus its first reply."""

    function: str
    request: str
    import_ms: float
    first_ms: float


def _child_env(endpoint: str, items_table: str, catalog_table: str) -> dict[str, str]:
    env = _dev_env(
        AWS_ENDPOINT_URL_DYNAMODB=endpoint,
        AWS_DEFAULT_REGION="us-east-1",
        AWS_REGION="us-east-1",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",  # noqa: S106 - moto's fake credentials
        QUERATOR_ITEMS_TABLE=items_table,
        QUERATOR_CATALOG_TABLE=catalog_table,
    )
    env.pop("QUERATOR_STORE", None)
    return env


def _run_child(code: str, arg: str, env: dict[str, str]) -> tuple[int, int, int]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(  # noqa: S603 - our interpreter running our child script
            [sys.executable, "-c", code, out.name, arg],
            capture_output=True, cwd=ROOT, env=env, check=True, timeout=120,
        )  # fmt: skip
        imported, first, status = json.loads(Path(out.name).read_text())
    return int(imported), int(first), int(status)


def measure_first_request(repeat: int = QUICK_REPEAT) -> list[FirstRequest]:
    """Each HTTP function and the reaper serving one request in a fresh interpreter, against a moto
    server; samples interleaved with the baseline. The stream functions are not measured (they need
    the WebSocket API's connection records)."""
    from querator.localserver import proxy_event, scheduled_event  # noqa: PLC0415
    from querator.storage.dynamodb import schema  # noqa: PLC0415
    from querator.testing import dynamodb_client, moto_server_process  # noqa: PLC0415

    with moto_server_process() as endpoint:
        client = dynamodb_client(endpoint)
        items_table, catalog_table = "coldstart-items", "coldstart-queues"
        schema.create_tables(client, items_table=items_table, catalog_table=catalog_table)
        env = _child_env(endpoint, items_table, catalog_table)

        def call(function: str, name: str, body: dict[str, Any] | None) -> tuple[int, int, int]:
            if function == "reaper":
                event = scheduled_event()
            elif body is None:
                event = proxy_event("GET", f"/{name}", {}, b"", "127.0.0.1")
            else:
                data = json.dumps(body).encode()
                headers = {"Content-Type": "application/json"}
                event = proxy_event("POST", f"/v1/{name}", headers, data, "127.0.0.1")
            module = f"functions.{function}.handler"
            return _run_child(_FIRST_REQUEST_CHILD.format(module=module), json.dumps(event), env)

        def checked(function: str, name: str, body: dict[str, Any] | None) -> tuple[int, int]:
            imported, first, status = call(function, name, body)
            if status != 200:
                raise RuntimeError(f"{function} {name}: HTTP {status}")
            return imported, first

        checked(
            "queues", "queues.create", {"queue_name": QUEUE, "lease_timeout": "5m", "expire_timeout": "24h"}
        )
        leases = 0

        def requests() -> list[tuple[str, str, dict[str, Any] | None]]:
            nonlocal leases
            leases += 1
            return [
                ("produce", "queue.produce", {"queue_name": QUEUE, "items": [{"utf8": "x"}] * 2}),
                ("lease", "queue.lease", {"queue_name": QUEUE, "batch_size": 1, "client_id": f"c{leases}"}),
                ("queues", "queues.info", {"queue_name": QUEUE}),
                ("admin", "queue.stats", {"queue_name": QUEUE}),
                ("meta", "health", None),
                ("reaper", "reaper", None),
            ]

        samples: dict[str, list[tuple[int, int]]] = {}
        labels: dict[str, str] = {BASELINE: "import boto3, a client, one call"}
        for round_ in range(repeat + 1):
            for function, name, body in requests():
                sample = checked(function, name, body)
                labels[function] = name
                if round_:  # round 0 compiles the bytecode the later rounds read
                    samples.setdefault(function, []).append(sample)
            base = _run_child(_BASELINE_CHILD, items_table, env)
            if round_:
                samples.setdefault(BASELINE, []).append(base[:2])
    return [
        FirstRequest(
            function=function,
            request=labels[function],
            import_ms=statistics.median(s[0] for s in values) / 1000,
            first_ms=statistics.median(s[1] for s in values) / 1000,
        )
        for function, values in sorted(samples.items(), key=lambda kv: kv[0] != BASELINE)
    ]


def format_first_request_table(rows: list[FirstRequest], repeat: int) -> str:
    base = next(r for r in rows if r.function == BASELINE)
    lines = [
        f"Cold start to the first reply: median of {repeat} fresh interpreters, moto server on 127.0.0.1",
        f"{'function':<10} {'request':<34} {'import ms':>9} {'to reply ms':>11} {'x baseline':>10}",
    ]
    for r in rows:
        lines.append(
            f"{r.function:<10} {r.request:<34} {r.import_ms:>9.0f} {r.first_ms:>11.0f}"
            f" {r.first_ms / base.first_ms:>10.2f}"
        )
    return "\n".join(lines)


# -- the deployed artifacts (--layer) ---------------------------------------------------------------

#: Settings of the --layer runs: (column, bytecode, environment beyond the Lambda basics).
LAYER_SETTINGS: tuple[tuple[str, bool, dict[str, str]], ...] = (
    ("no bytecode", False, {}),
    ("bytecode", True, {}),
    ("bytecode, untraced", True, {"POWERTOOLS_TRACE_DISABLED": "true"}),
)


def _runtime_python(runtime: str) -> str:
    build = _build_module()
    python = build.runtime_interpreter(runtime)
    if python is None:
        raise SystemExit(f"no CPython {runtime} on this machine (set QUERATOR_LAYER_PYTHON)")
    return str(python)


def _build_module() -> Any:
    spec = importlib.util.spec_from_file_location("layer_build", ROOT / "layers" / "core" / "build.py")
    if spec is None or spec.loader is None:
        raise SystemExit("layers/core/build.py is missing")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prepare_artifacts(runtime: str, work: Path) -> dict[str, Path]:
    """The layer with and without bytecode, and the runtime's SDK, under ``work``."""
    architecture = "arm64" if platform.machine() in {"aarch64", "arm64"} else "x86_64"
    layer = work / "layer"
    build = [sys.executable, str(ROOT / "layers/core/build.py"), "--runtime", runtime]
    subprocess.run(  # noqa: S603 - the project's build script
        [*build, "--architecture", architecture, "--out", str(layer)], check=True, capture_output=True
    )
    bare = work / "layer-without-bytecode"
    shutil.copytree(layer / "python", bare / "python", ignore=shutil.ignore_patterns("__pycache__"))
    sdk = work / "runtime"
    platform_tag = ("aarch64" if architecture == "arm64" else "x86_64") + "-manylinux_2_28"
    subprocess.run(  # noqa: S603
        ["uv", "pip", "install", "--quiet", "--only-binary", ":all:", "--python-version",  # noqa: S607
         runtime.removeprefix("python"), "--python-platform", platform_tag, "--target", str(sdk),
         f"boto3=={importlib.metadata.version('boto3')}"],
        check=True, capture_output=True,
    )  # fmt: skip
    # The runtime ships botocore compiled; so does this stand-in.
    python = _runtime_python(runtime)
    subprocess.run([python, "-m", "compileall", "-q", "-j", "0", str(sdk)], check=True, capture_output=True)  # noqa: S603
    # The like-for-like baseline of a function that makes its client at init, as AWS advises.
    client = work / "client"
    client.mkdir()
    (client / CLIENT_BASELINE_MODULE).with_suffix(".py").write_text(
        'import boto3\nboto3.client("dynamodb")\n'
    )
    return {"layer": layer / "python", "bare": bare / "python", "sdk": sdk, "client": client}


#: What Lambda's runtime and the stack set for every function that its init phase reads: the
#: handlers make their clients at init (``observability.lambda_entry(prepare=...)``), which needs a
#: region, credentials (Lambda passes the role's in the environment) and the table names.
LAMBDA_ENVIRONMENT: dict[str, str] = {
    "PATH": "/usr/bin:/bin",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "coldstart",
    "AWS_SECRET_ACCESS_KEY": "coldstart",
    "AWS_SESSION_TOKEN": "coldstart",
    "AWS_LAMBDA_FUNCTION_NAME": "coldstart",
    "QUERATOR_ITEMS_TABLE": "coldstart-items",
    "QUERATOR_CATALOG_TABLE": "coldstart-queues",
    "QUERATOR_CONNECTIONS_TABLE": "coldstart-connections",
    "QUERATOR_STREAM_ENDPOINT": "https://coldstart.execute-api.us-east-1.amazonaws.com/live",
}
CLIENT_BASELINE_MODULE = "coldstart_client"
CLIENT_BASELINE = "boto3+client"


def layer_import_micros(
    python: str, task_root: Path, paths: list[Path], module: str, env: dict[str, str]
) -> int:
    """One fresh runtime interpreter's import of ``module`` with Lambda's path and no bytecode writes."""
    code = f"import sys; sys.path[:0] = {[str(task_root), *map(str, paths)]!r}; import {module}"
    result = subprocess.run(  # noqa: S603 - the runtime's interpreter importing one module
        [python, "-S", "-X", "importtime", "-B", "-c", code],
        capture_output=True, text=True, check=True, timeout=120,
        env={**LAMBDA_ENVIRONMENT, "LAMBDA_TASK_ROOT": str(task_root), **env},
    )  # fmt: skip
    if WARM_UP_FAILED in result.stderr:
        # The handler would have imported without its clients: a figure that looks good and is wrong.
        raise RuntimeError(f"{task_root.name}: the warm-up at init failed:\n{result.stderr[-2000:]}")
    return parse_importtime(result.stderr, module)


def measure_layer(runtime: str = "python3.12", repeat: int = REPEAT) -> dict[str, dict[str, float]]:
    """Median milliseconds per (module, column); ``boto3`` is the baseline row."""
    python = _runtime_python(runtime)
    with tempfile.TemporaryDirectory(prefix="coldstart-") as tmp:
        artifacts = prepare_artifacts(runtime, Path(tmp))
        names = sorted(p.parent.name for p in (ROOT / "functions").glob("*/handler.py"))
        rows: dict[str, dict[str, list[int]]] = {}
        for _ in range(repeat):
            for column, bytecode, env in LAYER_SETTINGS:
                layer = artifacts["layer" if bytecode else "bare"]
                for name in [BASELINE, CLIENT_BASELINE, *names]:
                    if name == BASELINE:
                        root, module = ROOT / "functions" / "meta", BASELINE
                    elif name == CLIENT_BASELINE:
                        root, module = artifacts["client"], CLIENT_BASELINE_MODULE
                    else:
                        root, module = ROOT / "functions" / name, "handler"
                    micros = layer_import_micros(python, root, [layer, artifacts["sdk"]], module, env)
                    rows.setdefault(name, {}).setdefault(column, []).append(micros)
    return {n: {c: statistics.median(v) / 1000 for c, v in cols.items()} for n, cols in rows.items()}


def format_layer_table(medians: dict[str, dict[str, float]], runtime: str) -> str:
    columns = [c for c, _, _ in LAYER_SETTINGS]
    base = medians[BASELINE]
    lines = [
        f"Cold start from the built layer on {runtime} (-S -B, median ms; x = against import boto3 alike)",
        f"{'module':<10}" + "".join(f" {c:>20} {'x':>5}" for c in columns),
    ]
    for name, cols in medians.items():
        cells = "".join(f" {cols[c]:>20.0f} {cols[c] / base[c]:>5.2f}" for c in columns)
        lines.append(f"{name:<10}{cells}")
    return "\n".join(lines)


# -- where the import goes (--steps) ------------------------------------------------------------------

#: What the lease handler imports, in layers: each step is timed after the ones before it, so its
#: figure is what it adds (modules an earlier step imported are not paid again).
STEPS: tuple[tuple[str, str], ...] = (
    ("botocore.session", "botocore (the clients)"),
    ("querator.domain.model", "the domain values"),
    ("querator.ports", "the ports' records"),
    ("querator.api.schemas", "the wire messages (querator.api.wire, plain Python)"),
    ("pynamodb.models", "PynamoDB"),
    ("aws_lambda_powertools.logging", "Powertools' logger"),
    ("querator.service", "the service"),
    ("querator.api.gateway", "the router and the endpoints"),
    ("querator.bootstrap", "the bootstrap (stores)"),
    ("functions.lease.handler", "the lease handler"),
)
_STEPS_CHILD = """
import sys, time
marks = []
started = time.perf_counter()
for module in sys.argv[1:]:
    __import__(module)
    marks.append(int((time.perf_counter() - started) * 1e6))
print(" ".join(map(str, marks)))
"""


def _steps_sample(modules: list[str]) -> list[int]:
    result = subprocess.run(  # noqa: S603 - our interpreter importing modules named above
        [sys.executable, "-c", _STEPS_CHILD, *modules],
        capture_output=True, text=True, cwd=ROOT, env=_dev_env(POWERTOOLS_METRICS_DISABLED="true"),
        check=True, timeout=120,
    )  # fmt: skip
    return [int(v) for v in result.stdout.split()]


def measure_steps(repeat: int = REPEAT) -> tuple[float, list[tuple[str, float]]]:
    """Median ms of ``import boto3`` alone, and of each step of ``STEPS`` after the ones before it
    (wall clock around each import, no ``-X importtime``), interleaved with the baseline."""
    modules = [m for m, _ in STEPS]
    _steps_sample([BASELINE])
    _steps_sample(modules)  # discarded: the first imports compile the bytecode the others read
    base: list[int] = []
    cumulative: list[list[int]] = []
    for _ in range(repeat):
        base.append(_steps_sample([BASELINE])[0])
        cumulative.append(_steps_sample(modules))
    medians = [statistics.median(sample[i] for sample in cumulative) for i in range(len(modules))]
    added = [m - (medians[i - 1] if i else 0) for i, m in enumerate(medians)]
    return statistics.median(base) / 1000, [(m, a / 1000) for m, a in zip(modules, added, strict=True)]


def format_steps_table(baseline_ms: float, steps: list[tuple[str, float]], repeat: int) -> str:
    labels = dict(STEPS)
    lines = [
        f"Where the lease handler's import goes: each step after the ones before it, wall clock, median of"
        f" {repeat} fresh interpreters; import boto3 alone: {baseline_ms:.0f} ms",
        f"{'step':<72} {'ms':>6} {'x boto3':>7} {'total x':>7}",
    ]
    total = 0.0
    for module, ms in steps:
        total += ms
        lines.append(f"{labels[module]:<72} {ms:>6.1f} {ms / baseline_ms:>7.2f} {total / baseline_ms:>7.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=REPEAT)
    parser.add_argument(
        "--layer", action="store_true", help="measure the built layer on the runtime's Python"
    )
    parser.add_argument("--runtime", default="python3.12")
    parser.add_argument(
        "--first-request", action="store_true", help="import plus one served request, against a moto server"
    )
    parser.add_argument(
        "--steps", action="store_true", help="where the lease handler's import goes, step by step"
    )
    args = parser.parse_args(argv)
    if args.steps:
        baseline_ms, steps = measure_steps(args.repeat)
        print(format_steps_table(baseline_ms, steps, args.repeat))
        return 0
    if args.first_request:
        print(format_first_request_table(measure_first_request(args.repeat), args.repeat))
        return 0
    if args.layer:
        print(format_layer_table(measure_layer(args.runtime, args.repeat), args.runtime))
        return 0
    print(format_table(measure(args.repeat)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
