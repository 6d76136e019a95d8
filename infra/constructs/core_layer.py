"""The Lambda layer that carries ``querator`` and its pinned runtime dependencies.

The layer is a build product of ``layers/core/build.py`` (no Docker); this construct only packages the
built folder. The build writes a stamp saying which runtime and architecture it targeted, and a
mismatch with the stage stops the synth: a layer of cp312 arm64 wheels on an x86_64 function fails
only at its first import, in the cloud.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import jsii
from aws_cdk import AssetHashType, BundlingOptions, DockerImage, ILocalBundling
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from infra.constructs.common import ARCHITECTURES, RUNTIMES, removal_policy

if TYPE_CHECKING:
    from infra.config import StageConfig

#: Written by ``layers/core/build.py`` next to ``python/``; not part of the layer.
STAMP_FILE: Final = ".build-stamp.json"


class LayerMismatchError(RuntimeError):
    """The built layer targets another runtime or architecture than the stage."""


#: The package a bundled asset keeps the functions' folders in: a function's handler is then
#: ``functions.<name>.handler.lambda_handler`` (the runtime imports a dotted module path).
BUNDLED_PACKAGE: Final = "functions"
#: A function's handler in its own asset: ``handler.py`` at the asset's root.
HANDLER: Final = "handler.lambda_handler"

#: Left out of a function's own folder: bytecode differs per machine and would change the asset hash.
NOT_CODE: Final = ["__pycache__", "*.pyc"]


def read_stamp(path: Path) -> dict[str, Any]:
    """The build's stamp of the layer at ``path``; empty when there is none."""
    stamp = path / STAMP_FILE
    return dict(json.loads(stamp.read_text(encoding="utf-8"))) if stamp.is_file() else {}


def bundle_hash(functions_root: Path, layer_hash: str) -> str:
    """The hash of the bundled asset: the layer's build hash and the functions' own files (bytecode
    left out, as the asset leaves it out), by path and content."""
    digest = hashlib.sha256(f"layer {layer_hash}\n".encode())
    for file in sorted(functions_root.rglob("*")):
        relative = file.relative_to(functions_root)
        skipped = any(fnmatch.fnmatch(part, pattern) for part in relative.parts for pattern in NOT_CODE)
        if skipped or file.is_dir():
            continue
        digest.update(f"{relative.as_posix()}\n".encode())
        digest.update(hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()


def check_layer(path: Path, config: StageConfig) -> dict[str, Any]:
    """Refuse a missing layer folder, or one built for another runtime or architecture; the build's
    stamp (empty for a layer without one)."""
    if not (path / "python").is_dir():
        raise LayerMismatchError(
            f"{path}/python does not exist: build the layer first "
            f"(uv run --frozen python layers/core/build.py --runtime {config.runtime} "
            f"--architecture {config.architecture})"
        )
    built = read_stamp(path)
    if not built:
        return built
    wanted = {"runtime": config.runtime, "architecture": config.architecture}
    got = {key: built.get(key) for key in wanted}
    if got != wanted:
        raise LayerMismatchError(f"{path} was built for {got}, the stage needs {wanted}: rebuild the layer")
    return built


@jsii.implements(ILocalBundling)
class _LayerAndFunctions:
    """CDK local bundling, no Docker: the layer's ``python/`` tree, and the functions' folders in the
    ``functions`` package beside it."""

    def __init__(self, functions_root: Path, layer_python: Path) -> None:
        self.functions_root = functions_root
        self.layer_python = layer_python

    def try_bundle(self, output_dir: str, options: Any) -> bool:
        shutil.copytree(self.layer_python, output_dir, dirs_exist_ok=True, copy_function=_link_or_copy)
        shutil.copytree(
            self.functions_root,
            Path(output_dir) / BUNDLED_PACKAGE,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns(*NOT_CODE),
        )
        return True


def _link_or_copy(source: str, target: str) -> None:
    # The layer's files are never written after the build (a rebuild replaces the folder), so nine
    # functions can share them: a hard link is ~7x quicker than a copy of the 27 MB tree.
    try:
        os.link(source, target)
    except OSError:  # another file system, or one without hard links
        shutil.copy2(source, target)


class CoreLayer(Construct):
    """``querator`` + dependencies as one layer version for the stage's runtime and architecture.

    With ``bundle_layer`` (stage ``local``) there is no layer version: ``function_code`` gives every
    function one asset instead, the layer's contents with all the functions' folders, because
    LocalStack Community accepts layers but does not mount them, and every function would fail with
    ``No module named 'querator'``. One asset, not nine: a deploy uploads the 27 MB once.
    """

    def __init__(self, scope: Construct, construct_id: str, *, config: StageConfig) -> None:
        super().__init__(scope, construct_id)
        path = Path(config.layer_asset_path)
        built = check_layer(path, config).get("hash")
        self.path = path
        #: What the build's stamp says the layer was built from; ``None`` without a stamp.
        self.build_hash = built if isinstance(built, str) else None
        self.bundled = config.bundle_layer
        self.layer: lambda_.LayerVersion | None = None
        #: The bundled asset, made with the first function that asks (CDK binds it to each).
        self._bundle: lambda_.Code | None = None
        if self.bundled:
            return
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

    def function_code(self, functions_root: str, name: str) -> tuple[lambda_.Code, str]:
        """A function's asset and its handler: its own folder, or the bundled asset it shares."""
        if not self.bundled:
            return lambda_.Code.from_asset(str(Path(functions_root) / name), exclude=NOT_CODE), HANDLER
        if self._bundle is None:
            self._bundle = self._bundled_code(Path(functions_root))
        return self._bundle, f"{BUNDLED_PACKAGE}.{name}.{HANDLER}"

    def _bundled_code(self, functions_root: Path) -> lambda_.Code:
        # A rebuilt layer or a changed function changes the asset. The build's stamp names the layer
        # by what it was built from, so CDK need not hash 27 MB of output; a layer without a stamp is
        # hashed as shipped.
        custom = None if self.build_hash is None else bundle_hash(functions_root, self.build_hash)
        return lambda_.Code.from_asset(
            str(functions_root),
            asset_hash_type=AssetHashType.OUTPUT if custom is None else AssetHashType.CUSTOM,
            asset_hash=custom,
            bundling=BundlingOptions(
                # Never pulled: local bundling always succeeds, and BundlingOptions requires an image.
                image=DockerImage.from_registry("local-bundling-only"),
                # jsii hands try_bundle the options as one positional struct, not as the keywords
                # of the generated stub, so the stub's Protocol check cannot match.
                local=_LayerAndFunctions(functions_root, self.path / "python"),  # type: ignore[arg-type]
            ),
        )

    @property
    def layers(self) -> list[lambda_.ILayerVersion]:
        """What each function attaches: the layer, or nothing when it is bundled."""
        return [] if self.layer is None else [self.layer]
