"""Cold start: import time of each Lambda handler module against ``import boto3``.

Run ``uv run python -m benchmarks.coldstart`` (``--repeat N``); ``python -m benchmarks`` runs it with
everything else. Each figure is the median over ``repeat`` fresh interpreters of the cumulative
import time CPython reports with ``-X importtime`` for the top module (``functions.<name>.handler``,
or ``boto3``), with warm bytecode caches: only the import, not interpreter start-up. A handler
imports boto3 itself (through the composition root), so its ratio to boto3 is at least about 1;
what is above 1 is ours (Powertools, pydantic, the route table, the schemas). The Lambda init
phase creates no client (clients are made on the first request, ``querator.bootstrap``), so this
is the import share of a cold start.

``--layer`` measures what Lambda runs instead: each handler imported from its function folder and the
layer ``layers/core/build.py`` builds (for this machine's architecture), on the runtime's CPython with
``-S`` and no bytecode writes (``/opt`` is read-only), next to the runtime's boto3 (installed at the
locked version, compiled as the runtime ships it). Three columns: the layer without bytecode (what
the build shipped before it compiled), with bytecode, and with bytecode in an untraced stage (no
X-Ray SDK import); each against ``import boto3`` in the same setting.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
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


def import_micros(module: str) -> int:
    """One fresh interpreter's cumulative import time of ``module``, in microseconds."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONPYCACHEPREFIX": str(PYCACHE)}
    # A deployed package ships compiled bytecode (pip compiles on install) and Lambda cannot write
    # any, so measure with bytecode: cached under a prefix of our own, never in the checkout or venv.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
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
    return {"layer": layer / "python", "bare": bare / "python", "sdk": sdk}


def layer_import_micros(
    python: str, task_root: Path, paths: list[Path], module: str, env: dict[str, str]
) -> int:
    """One fresh runtime interpreter's import of ``module`` with Lambda's path and no bytecode writes."""
    code = f"import sys; sys.path[:0] = {[str(task_root), *map(str, paths)]!r}; import {module}"
    result = subprocess.run(  # noqa: S603 - the runtime's interpreter importing one module
        [python, "-S", "-X", "importtime", "-B", "-c", code],
        capture_output=True, text=True, check=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "LAMBDA_TASK_ROOT": str(task_root), "AWS_REGION": "us-east-1",
             "AWS_LAMBDA_FUNCTION_NAME": "coldstart", **env},
    )  # fmt: skip
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
                for name in [BASELINE, *names]:
                    root = ROOT / "functions" / (name if name != BASELINE else "meta")
                    module = BASELINE if name == BASELINE else "handler"
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=REPEAT)
    parser.add_argument(
        "--layer", action="store_true", help="measure the built layer on the runtime's Python"
    )
    parser.add_argument("--runtime", default="python3.12")
    args = parser.parse_args(argv)
    if args.layer:
        print(format_layer_table(measure_layer(args.runtime, args.repeat), args.runtime))
        return 0
    print(format_table(measure(args.repeat)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
