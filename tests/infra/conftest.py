"""Synthesize the stack once per session (jsii starts a Node process; a synth takes ~10-20 s).

Assets are temporary folders, so the tests need neither the functions nor a built layer; the context
is ``cdk.json``'s (feature flags, the dev stage's settings), so the template is the one ``cdk synth``
produces, apart from the asset hashes.
"""

from __future__ import annotations

import os
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
