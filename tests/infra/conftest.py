"""Synthesize the stack once per session (jsii starts a Node process; a synth takes ~10-20 s).

Assets are temporary folders, so the tests need neither the functions nor a built layer; the context
is ``cdk.json``'s (feature flags, the dev stage's settings), so the template is the one ``cdk synth``
produces, apart from the asset hashes. The tests that run the built artifacts share the runtime's
Python with its SDK (``lambda_runtime``) and a layer built for this machine (``host_layer``).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Before jsii is imported: Node 20 is past its end of life and jsii prints a banner on every start.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from infra import nag
from tests.infra.synth import Synth, cdk_context, fake_assets, synthesize

ALARM_EMAIL = "alarms@example.com"


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The dev stage, with an alarm e-mail so the alarm topic exists."""
    root = tmp_path_factory.mktemp("infra")
    context = cdk_context(**fake_assets(root), alarmEmail=ALARM_EMAIL)
    return synthesize(root / "cdk.out", context)


@pytest.fixture(scope="session")
def unacknowledged_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The same stack with every acknowledgement withheld: what cdk-nag finds on its own."""
    root = tmp_path_factory.mktemp("infra-raw")
    context = cdk_context(**fake_assets(root), alarmEmail=ALARM_EMAIL)
    # Withheld only while this stack is built: later synths in the session acknowledge as usual.
    with nag.acknowledgements_withheld():
        return synthesize(root / "cdk.out", context)


@pytest.fixture(scope="session")
def built_layer() -> Path:
    """The layer at its default path, where ``cdk synth`` packages it from: built, or reused if current.

    Building needs PyPI (or uv's cache) on the first run; ``cdk synth`` itself stays offline."""
    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, str(root / "layers" / "core" / "build.py")]
    subprocess.run(command, cwd=root, check=True, capture_output=True, text=True, timeout=600)  # noqa: S603
    return root / "layers" / "core" / "dist"


#: The Lambda runtime the functions run on in the deploy tests (every stage of cdk.json uses it).
LAMBDA_RUNTIME = "python3.12"


def runtime_python(version: str = LAMBDA_RUNTIME.removeprefix("python")) -> str | None:
    """A working CPython of the runtime's version (a pyenv shim on PATH may exist without one)."""
    candidates = [str(p) for p in sorted(Path.home().glob(f".pyenv/versions/{version}*/bin/python{version}"))]
    candidates += [found] if (found := shutil.which(f"python{version}")) else []
    for candidate in candidates:
        probe = subprocess.run(  # noqa: S603 - probing a candidate interpreter
            [candidate, "-S", "-c", f"import sys; print('%d.%d' % sys.version_info[:2] == {version!r})"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        if probe.stdout.strip() == "True":
            return candidate
    return None


def host_architecture() -> str:
    return "arm64" if platform.machine() in {"aarch64", "arm64"} else "x86_64"


@pytest.fixture(scope="session")
def lambda_runtime(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The runtime's Python and, beside it, what the runtime ships: boto3 at the locked version."""
    python = runtime_python()
    assert python, f"no CPython {LAMBDA_RUNTIME} on this machine to stand in for the Lambda runtime"
    sdk = tmp_path_factory.mktemp("runtime")
    platform_tag = ("aarch64" if host_architecture() == "arm64" else "x86_64") + "-manylinux_2_28"
    uv = shutil.which("uv")
    assert uv, "uv is not on PATH"
    subprocess.run(  # noqa: S603
        [uv, "pip", "install", "--quiet", "--only-binary", ":all:", "--python-version",
         LAMBDA_RUNTIME.removeprefix("python"), "--python-platform", platform_tag, "--target", str(sdk),
         f"boto3=={importlib.metadata.version('boto3')}"],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return python, sdk


@pytest.fixture(scope="session")
def host_layer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The layer built by ``layers/core/build.py`` for the runtime on this machine's architecture."""
    root = Path(__file__).resolve().parents[2]
    out = tmp_path_factory.mktemp("host-layer") / "layer"
    subprocess.run(  # noqa: S603 - the project's build script with fixed arguments
        [sys.executable, str(root / "layers/core/build.py"), "--runtime", LAMBDA_RUNTIME,
         "--architecture", host_architecture(), "--out", str(out)],
        cwd=root, check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return out
