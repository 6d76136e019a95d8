"""The Lambda layer that carries ``querator`` and its pinned runtime dependencies.

The layer is a build product of ``layers/core/build.py`` (no Docker); this construct only packages the
built folder. The build writes a stamp saying which runtime and architecture it targeted, and a
mismatch with the stage stops the synth: a layer of cp312 arm64 wheels on an x86_64 function fails
only at its first import, in the cloud.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Final

from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from infra.constructs.common import ARCHITECTURES, RUNTIMES, removal_policy

if TYPE_CHECKING:
    from infra.config import StageConfig

#: Written by ``layers/core/build.py`` next to ``python/``; not part of the layer.
STAMP_FILE: Final = ".build-stamp.json"


class LayerMismatchError(RuntimeError):
    """The built layer targets another runtime or architecture than the stage."""


def check_layer(path: Path, config: StageConfig) -> None:
    """Refuse a missing layer folder, or one built for another runtime or architecture."""
    if not (path / "python").is_dir():
        raise LayerMismatchError(
            f"{path}/python does not exist: build the layer first "
            f"(uv run --frozen python layers/core/build.py --runtime {config.runtime} "
            f"--architecture {config.architecture})"
        )
    stamp = path / STAMP_FILE
    if not stamp.is_file():
        return
    built = json.loads(stamp.read_text(encoding="utf-8"))
    wanted = {"runtime": config.runtime, "architecture": config.architecture}
    got = {key: built.get(key) for key in wanted}
    if got != wanted:
        raise LayerMismatchError(f"{path} was built for {got}, the stage needs {wanted}: rebuild the layer")


class CoreLayer(Construct):
    """``querator`` + dependencies as one layer version for the stage's runtime and architecture."""

    def __init__(self, scope: Construct, construct_id: str, *, config: StageConfig) -> None:
        super().__init__(scope, construct_id)
        path = Path(config.layer_asset_path)
        check_layer(path, config)
        self.layer = lambda_.LayerVersion(
            self,
            "Layer",
            code=lambda_.Code.from_asset(str(path), exclude=[STAMP_FILE]),
            compatible_runtimes=[RUNTIMES[config.runtime]],
            compatible_architectures=[ARCHITECTURES[config.architecture]],
            description="querator and its pinned runtime dependencies (boto3 from the runtime)",
            # Old versions stay so a rollback of the functions still finds the layer they used.
            removal_policy=removal_policy(config),
        )
