"""The core layer: built without Docker for the Lambda target, runtime-provided SDK left out, cached."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from infra.config import StageConfig
from infra.constructs.core_layer import STAMP_FILE, LayerMismatchError, check_layer

if TYPE_CHECKING:
    from types import ModuleType

pytestmark = pytest.mark.infra

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "layers" / "core" / "build.py"
#: Lambda's limit for a function and all its layers, unzipped.
LAMBDA_UNZIPPED_LIMIT = 250 * 1024 * 1024


def _load_build_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("layer_build", BUILD_SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_module = _load_build_module()


def run_build(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(BUILD_SCRIPT), *args]
    return subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True, timeout=600)  # noqa: S603


def test_layer_holds_querator_and_its_dependencies_for_cpython_312_on_arm64(built_layer: Path) -> None:
    python = built_layer / "python"
    for package in ("querator", "aws_lambda_powertools", "pydantic", "pydantic_core", "pynamodb"):
        assert (python / package / "__init__.py").is_file(), package
    (extension,) = (python / "pydantic_core").glob("_pydantic_core*.so")
    assert extension.name.endswith(".cpython-312-aarch64-linux-gnu.so")


def test_layer_leaves_out_the_runtime_sdk_and_everything_that_never_runs_in_lambda(built_layer: Path) -> None:
    python = built_layer / "python"
    for absent in ("boto3", "botocore", "s3transfer", "functions", "bin", "moto", "pyspark"):
        assert not (python / absent).exists(), absent
    for absent in ("testing.py", "localstore.py", "localserver.py", "localserver", "spark", "cli", "cli.py"):
        assert not (python / "querator" / absent).exists(), absent


def test_layer_ships_bytecode_for_the_runtime_unchecked_and_named_by_its_lambda_path(
    built_layer: Path,
) -> None:
    # Lambda's /opt is read-only: without these, every cold start compiles the layer again.
    python = built_layer / "python"
    stamp = json.loads((built_layer / STAMP_FILE).read_text(encoding="utf-8"))
    assert stamp["bytecode"] is True
    sources = sorted((python / "querator").rglob("*.py"))
    assert sources
    for source in sources:
        pyc = source.parent / "__pycache__" / f"{source.stem}.cpython-312.pyc"
        assert pyc.is_file(), source
        header = pyc.read_bytes()[:16]
        # PEP 552: flags 0b01 = hash-based, check_source bit clear = never compared with the source.
        assert int.from_bytes(header[4:8], "little") == 1, pyc
    # Tracebacks name the file where Lambda mounts it (a 3.12 code object is not loadable here).
    pyc = python / "querator" / "__pycache__" / "config.cpython-312.pyc"
    assert b"/opt/python/querator/config.py" in pyc.read_bytes()
    assert not [p for p in python.rglob("*.pyc") if ".cpython-312." not in p.name]


def test_layer_fits_lambdas_size_limit_and_its_stamp_describes_it(built_layer: Path) -> None:
    stamp = json.loads((built_layer / STAMP_FILE).read_text(encoding="utf-8"))
    assert stamp["runtime"] == "python3.12"
    assert stamp["architecture"] == "arm64"
    assert stamp["hash"] == build_module.source_hash("python3.12", "arm64")
    size = sum(p.stat().st_size for p in (built_layer / "python").rglob("*") if p.is_file())
    assert size == stamp["bytes"]
    assert size < LAMBDA_UNZIPPED_LIMIT / 4


def test_an_unchanged_source_tree_is_not_rebuilt(built_layer: Path) -> None:
    before = (built_layer / STAMP_FILE).stat().st_mtime_ns
    result = run_build()
    assert "layer up to date" in result.stdout
    assert (built_layer / STAMP_FILE).stat().st_mtime_ns == before


def test_the_hash_covers_the_target_runtime_and_architecture() -> None:
    hashes = {
        build_module.source_hash(r, a) for r in ("python3.12", "python3.13") for a in ("arm64", "x86_64")
    }
    assert len(hashes) == 4


def test_an_extension_module_for_another_architecture_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "_speedups.cpython-312-x86_64-linux-gnu.so").write_bytes(b"")
    with pytest.raises(SystemExit, match="another target"):
        build_module.check_binaries(tmp_path, "python3.12", "arm64")
    build_module.check_binaries(tmp_path, "python3.12", "x86_64")


def test_the_stack_refuses_a_layer_built_for_another_runtime(tmp_path: Path) -> None:
    (tmp_path / "python").mkdir()
    (tmp_path / STAMP_FILE).write_text(json.dumps({"runtime": "python3.13", "architecture": "arm64"}))
    with pytest.raises(LayerMismatchError, match=r"python3\.13"):
        check_layer(tmp_path, StageConfig(layer_asset_path=str(tmp_path)))
    check_layer(tmp_path, StageConfig(runtime="python3.13", layer_asset_path=str(tmp_path)))


def test_the_stack_refuses_a_layer_that_was_never_built(tmp_path: Path) -> None:
    with pytest.raises(LayerMismatchError, match="build the layer first"):
        check_layer(tmp_path, StageConfig(layer_asset_path=str(tmp_path)))
