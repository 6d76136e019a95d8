"""Cold start: import time of each Lambda handler module against ``import boto3``.

Run ``uv run python -m benchmarks.coldstart`` (``--repeat N``); ``python -m benchmarks`` runs it with
everything else. Each figure is the median over ``repeat`` fresh interpreters of the cumulative
import time CPython reports with ``-X importtime`` for the top module (``functions.<name>.handler``,
or ``boto3``), with warm bytecode caches: only the import, not interpreter start-up. A handler
imports boto3 itself (through the composition root), so its ratio to boto3 is at least about 1;
what is above 1 is ours (Powertools, pydantic, the route table, the schemas). The Lambda init
phase creates no client (clients are made on the first request, ``querator.bootstrap``), so this
is the import share of a cold start.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=REPEAT)
    args = parser.parse_args(argv)
    print(format_table(measure(args.repeat)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
