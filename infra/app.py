"""CDK entry point: ``cdk.json`` runs ``python -m infra.app``; the stage comes from context.

Before synthesizing, the entry point brings the core layer up to date for the stage's runtime and
architecture (``layers/core/build.py``, a no-op while the source hash is unchanged), so a deploy can
never package a layer older than the code. ``-c buildLayer=false`` skips that, e.g. when
``layerAssetPath`` points at a layer built elsewhere.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from aws_cdk import App

from infra.config import StageConfig, StageConfigError
from infra.nag import add_checks
from infra.stack import QueratorStack

ROOT = Path(__file__).resolve().parents[1]
LAYER_BUILD = ROOT / "layers" / "core" / "build.py"


def build(app: App) -> QueratorStack:
    """Add the stage's stack (and the cdk-nag checks) to ``app``."""
    config = StageConfig.from_context(app.node)
    # Environment-agnostic: the template is the same with or without credentials, and synth needs none.
    stack = QueratorStack(app, config.stack_name, config=config)
    add_checks(app)
    return stack


def ensure_layer(config: StageConfig) -> None:
    """Build the layer where the stage expects it, unless it is current (cached by source hash)."""
    command = [
        sys.executable,
        str(LAYER_BUILD),
        "--runtime",
        config.runtime,
        "--architecture",
        config.architecture,
        "--out",
        config.layer_asset_path,
    ]
    # The CDK CLI reads the app's stdout for nothing, but keep the build's progress on stderr anyway.
    subprocess.run(command, check=True, cwd=ROOT, stdout=sys.stderr)  # noqa: S603 - fixed arguments


def main() -> int:
    app = App()
    try:
        config = StageConfig.from_context(app.node)
    except StageConfigError as exc:
        # A setting to fix, not a bug: its message alone (the CDK CLI then says the app failed).
        print(f"infra: {exc}", file=sys.stderr)  # noqa: T201
        return 1
    if str(app.node.try_get_context("buildLayer")).lower() != "false":
        ensure_layer(config)
    build(app)
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
