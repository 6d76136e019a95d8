"""Build the core Lambda layer (``layers/core/dist/python``) without Docker.

The layer holds the ``querator`` wheel and the runtime dependencies pinned in ``uv.lock``, installed
from manylinux wheels for the Lambda runtime's Python and architecture (cross-platform install, no
compiler, no container). ``boto3``, ``botocore`` and ``s3transfer`` are left out: the Lambda Python
runtime ships them, and the layer would otherwise carry ~25 MB of botocore data for every function.
The build is skipped when a hash of the sources, the lock file, this script and the target is
unchanged (``dist/.build-stamp.json``).

The layer ships bytecode compiled by the runtime's CPython version (``compileall``, unchecked-hash
pycs, paths rewritten to ``/opt/python``): Lambda mounts ``/opt`` read-only, so a layer without it is
compiled again, in memory, on every cold start. The interpreter is found on this machine (pyenv,
``PATH``, or ``QUERATOR_LAYER_PYTHON``); without one the layer is built without bytecode and says so.

    uv run --frozen python layers/core/build.py [--runtime python3.12] [--architecture arm64] [--force]
"""

# A command-line build step: it prints its progress and runs uv (found on PATH) with fixed arguments.
# ruff: noqa: T201, S603, S607

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

ROOT: Final = Path(__file__).resolve().parents[2]
DEFAULT_OUT: Final = Path(__file__).resolve().parent / "dist"
STAMP_FILE: Final = ".build-stamp.json"
#: Shipped by the Lambda Python runtime; a second copy in the layer would shadow it (docs/adr/0011).
RUNTIME_PROVIDED: Final = frozenset({"boto3", "botocore", "s3transfer"})
#: Parts of the wheel that never run in Lambda: function code ships in its own asset, scripts are for a
#: shell, and uv's install lock is not a module.
NOT_IN_LAMBDA: Final = ("functions", "bin", ".lock")
#: ``querator`` modules (file or package) that never run in Lambda: the local server and store and
#: the test kit need moto, the Spark producer needs pyspark, the CLI and the console are for a terminal.
LOCAL_ONLY_MODULES: Final = ("localstore", "localserver", "devserver", "testing", "spark", "cli", "console")
#: Lambda's Python 3.12/3.13 runtimes run Amazon Linux 2023 (glibc 2.34); manylinux_2_28 wheels fit.
PLATFORMS: Final = {"arm64": "aarch64-manylinux_2_28", "x86_64": "x86_64-manylinux_2_28"}
MACHINE: Final = {"arm64": "aarch64", "x86_64": "x86_64"}
RUNTIMES: Final = ("python3.12", "python3.13")
#: Where Lambda mounts a layer's ``python/`` folder: the path tracebacks should name.
LAYER_MOUNT: Final = "/opt/python"
#: What the hash covers besides the product sources.
HASHED_FILES: Final = ("pyproject.toml", "uv.lock", "layers/core/build.py")


def source_hash(runtime: str, architecture: str) -> str:
    """A digest of everything that decides the layer's content."""
    digest = hashlib.sha256(f"{runtime}/{architecture}\n".encode())
    sources = sorted(
        p for p in (ROOT / "src" / "querator").rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )
    for path in [*sources, *(ROOT / name for name in HASHED_FILES)]:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def read_stamp(out: Path) -> dict[str, object]:
    try:
        stamp: dict[str, object] = json.loads((out / STAMP_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return stamp


@contextlib.contextmanager
def exclusive(out: Path) -> Iterator[None]:
    """One build of ``out`` at a time (tests and a developer may start one together)."""
    lock_path = (
        Path(tempfile.gettempdir())
        / f"querator-layer-{hashlib.sha256(str(out).encode()).hexdigest()[:12]}.lock"
    )
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def run(command: Sequence[str]) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=ROOT)


def requirements(workdir: Path) -> Path:
    """The locked runtime dependencies (no dev/infra groups, no extras, not the project itself)."""
    exported = subprocess.run(
        [
            "uv", "export", "--frozen", "--no-default-groups", "--no-emit-project",
            "--format", "requirements-txt", "--no-hashes", "--no-header", "--no-annotate",
        ],
        check=True, cwd=ROOT, capture_output=True, text=True,
    ).stdout  # fmt: skip
    kept = [
        line
        for line in exported.splitlines()
        if line.strip() and line.split("==")[0].strip().lower() not in RUNTIME_PROVIDED
    ]
    path = workdir / "requirements.txt"
    path.write_text("\n".join(kept) + "\n", encoding="utf-8")
    return path


def check_binaries(target: Path, runtime: str, architecture: str) -> None:
    """Every extension module must be for the runtime's CPython and the architecture (or abi3)."""
    abi = "cpython-" + runtime.removeprefix("python").replace(".", "")
    machine = MACHINE[architecture]
    wrong = [
        str(path.relative_to(target))
        for path in target.rglob("*.so")
        if not ((abi in path.name or ".abi3." in path.name) and machine in path.name)
        and path.name.count(".") > 1
    ]
    if wrong:
        raise SystemExit(f"extension modules for another target: {wrong}")


def runtime_interpreter(runtime: str) -> str | None:
    """A CPython of the runtime's minor version on this machine (bytecode is per minor version)."""
    version = runtime.removeprefix("python")
    candidates = [os.environ.get("QUERATOR_LAYER_PYTHON", "")]
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        candidates.append(sys.executable)
    pyenv = Path.home() / ".pyenv" / "versions"
    candidates += [str(p) for p in sorted(pyenv.glob(f"{version}*/bin/python{version}"))]
    candidates.append(shutil.which(f"python{version}") or "")
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [candidate, "-S", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    return None


def compile_bytecode(target: Path, runtime: str) -> bool:
    """Compile every module for the runtime; ``False`` when no interpreter of its version is here.

    Unchecked-hash pycs are used without looking at the source's mtime or hash (the layer never
    changes once published) and make the output reproducible, so the asset hash stays stable.
    """
    python = runtime_interpreter(runtime)
    if python is None:
        print(
            f"warning: no CPython {runtime.removeprefix('python')} here (set QUERATOR_LAYER_PYTHON): "
            "the layer ships without bytecode and every cold start compiles it",
            file=sys.stderr,
        )
        return False
    run(
        [
            python, "-S", "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash",
            "-s", str(target), "-p", LAYER_MOUNT, str(target),
        ]
    )  # fmt: skip
    return True


def build(out: Path, runtime: str, architecture: str) -> dict[str, object]:
    started = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".build-") as tmp:
        workdir = Path(tmp)
        wheels = workdir / "wheel"
        run(["uv", "build", "--wheel", "--quiet", "--out-dir", str(wheels)])
        (wheel,) = wheels.glob("querator-*.whl")
        reqs = requirements(workdir)
        staged = workdir / "layer"
        target = staged / "python"
        run(
            [
                "uv", "pip", "install", "--quiet", "--no-deps", "--only-binary", ":all:",
                "--python-platform", PLATFORMS[architecture],
                "--python-version", runtime.removeprefix("python"),
                "--target", str(target), "--requirement", str(reqs), str(wheel),
            ]
        )  # fmt: skip
        local_only = [
            target / "querator" / f"{name}{suffix}" for name in LOCAL_ONLY_MODULES for suffix in ("", ".py")
        ]
        for path in [*(target / name for name in NOT_IN_LAMBDA), *local_only]:
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
        for cache in list(target.rglob("__pycache__")):
            shutil.rmtree(cache)
        check_binaries(target, runtime, architecture)
        # After stripping: the wheels' own __pycache__ (if any) came from pip, not from the runtime.
        bytecode = compile_bytecode(target, runtime)
        files = [p for p in target.rglob("*") if p.is_file()]
        stamp: dict[str, object] = {
            "hash": source_hash(runtime, architecture),
            "runtime": runtime,
            "architecture": architecture,
            "bytecode": bytecode,
            "files": len(files),
            "bytes": sum(p.stat().st_size for p in files),
            "seconds": round(time.monotonic() - started, 1),
        }
        (staged / STAMP_FILE).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
        # Swap in whole: a reader never sees a half-built layer.
        if out.exists():
            old = workdir / "old"
            out.rename(old)
        staged.rename(out)
    return stamp


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runtime", choices=RUNTIMES, default=os.environ.get("QUERATOR_LAYER_RUNTIME", "python3.12")
    )
    parser.add_argument("--architecture", choices=sorted(PLATFORMS), default="arm64")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--force", action="store_true", help="rebuild even if the sources are unchanged")
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    with exclusive(out):
        wanted = source_hash(args.runtime, args.architecture)
        if not args.force and read_stamp(out).get("hash") == wanted and (out / "python").is_dir():
            print(f"layer up to date: {out} ({wanted[:12]})")
            return 0
        stamp = build(out, args.runtime, args.architecture)
    print(f"layer built: {out} {json.dumps(stamp)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
