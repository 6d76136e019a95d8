"""Every other stage of ``cdk.json`` synthesizes too, with cdk-nag clean (each stage flips settings
that add or remove resources: the API logging role, tracing, retention, reserved concurrency)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App

from infra.config import StageConfig, StageConfigError
from infra.constructs.core_layer import STAMP_FILE, bundle_hash
from infra.permissions import FUNCTION_NAMES
from querator.config import EnvVar
from tests.infra.conftest import ALARM_EMAIL
from tests.infra.synth import cdk_context, fake_assets, synthesize

pytestmark = pytest.mark.infra

ROOT = Path(__file__).resolve().parents[2]

OTHER_STAGES = sorted(set(cdk_context()["stages"]) - {"dev"})


@pytest.mark.parametrize("stage", OTHER_STAGES)
def test_stage_synthesizes_with_nothing_unacknowledged(stage: str, tmp_path: Path) -> None:
    # A stage that retains data needs an alarm destination (cdk.json's prod has a placeholder).
    context = cdk_context(**fake_assets(tmp_path), stage=stage, alarmEmail=ALARM_EMAIL)
    synth = synthesize(tmp_path / "cdk.out", context)
    assert synth.validation_error is None
    report = json.loads((synth.outdir / "validation-report.json").read_text(encoding="utf-8"))
    assert report["pluginReports"] == []
    assert synth.stack.stack_name == f"querator-{stage}"
    retained = stage != "local"
    for table in synth.of_type("AWS::DynamoDB::Table").values():
        assert (table["DeletionPolicy"] == "Retain") == retained
    # The account-wide logging role is a REST API's need; an HTTP API (prod's) writes access logs without.
    config = synth.stack.config
    assert bool(synth.of_type("AWS::ApiGateway::Account")) == (
        config.api_cloud_watch_role and config.api_flavour == "rest"
    )


@pytest.mark.parametrize("stage", OTHER_STAGES)
def test_a_stage_that_retains_data_refuses_to_synthesize_without_an_alarm_destination(
    stage: str, tmp_path: Path
) -> None:
    context = cdk_context(**fake_assets(tmp_path), stage=stage)
    if not StageConfig.from_context(App(context={**context, "alarmEmail": ALARM_EMAIL}).node).retains_data:
        synthesize(tmp_path / "cdk.out", context)  # a dev stage may notify nobody
        return
    with pytest.raises(StageConfigError, match="alarmTopicArn"):
        synthesize(tmp_path / "cdk.out", context)


@pytest.mark.parametrize("stage", OTHER_STAGES)
def test_only_stage_local_gives_its_functions_a_longer_store_read_timeout(stage: str, tmp_path: Path) -> None:
    # An emulator on a laptop may answer a write later than the functions' 5 s: botocore would send
    # it again, and a conditional write applied the first time then fails its own condition.
    context = cdk_context(**fake_assets(tmp_path), stage=stage, alarmEmail=ALARM_EMAIL)
    synth = synthesize(tmp_path / "cdk.out", context)
    timeouts = {
        props["Properties"]["Environment"]["Variables"].get(EnvVar.STORE_READ_TIMEOUT)
        for props in synth.of_type("AWS::Lambda::Function").values()
    }
    assert timeouts == ({"30"} if stage == "local" else {None})


def _asset_dir(outdir: Path, function: dict[str, Any]) -> Path:
    """The folder CDK staged a function's asset in (its zip's name is the asset hash)."""
    return outdir / f"asset.{function['Properties']['Code']['S3Key'].removesuffix('.zip')}"


def _bundling_stage() -> str:
    (stage,) = (s for s, settings in cdk_context()["stages"].items() if settings.get("bundleLayer"))
    return stage


def test_a_bundling_stage_gives_every_function_one_asset_of_the_layer_and_the_functions(
    tmp_path: Path,
) -> None:
    stage = _bundling_stage()
    assets = fake_assets(tmp_path)
    layer = Path(assets["layerAssetPath"])
    config = StageConfig.from_context(App(context=cdk_context(**assets, stage=stage)).node)
    stamp = {"hash": "from-these-sources", "runtime": config.runtime, "architecture": config.architecture}
    (layer / STAMP_FILE).write_text(json.dumps(stamp), encoding="utf-8")
    functions_root = Path(assets["functionsAssetRoot"])
    for name in FUNCTION_NAMES:  # nine different functions, as deployed (fake_assets writes one text)
        with (functions_root / name / "handler.py").open("a", encoding="utf-8") as handler:
            handler.write(f"NAME = {name!r}\n")
    synth = synthesize(tmp_path / "cdk.out", cdk_context(**assets, stage=stage))
    functions = synth.of_type("AWS::Lambda::Function")
    assert len(functions) == len(FUNCTION_NAMES)
    # One asset, uploaded once, not nine copies of the layer.
    (asset,) = {_asset_dir(synth.outdir, f) for f in functions.values()}
    manifest = json.loads(
        (synth.outdir / f"{synth.stack.stack_name}.assets.json").read_text(encoding="utf-8")
    )
    zipped = [
        a["source"]["path"] for a in manifest["files"].values() if a["source"].get("packaging") == "zip"
    ]
    assert zipped == [asset.name]
    # The layer's file is the same file (a hard link), not a copy of it.
    assert (asset / "placeholder.py").samefile(layer / "python" / "placeholder.py")
    handlers = {}
    for logical_id, function in functions.items():
        handler = function["Properties"]["Handler"]
        module, _, name = handler.rpartition(".")
        handlers[logical_id] = module
        assert name == "lambda_handler"
        # The runtime imports the dotted module path from the asset's root.
        source = asset / (module.replace(".", "/") + ".py")
        assert source.is_file(), handler
    # Each function runs its own handler.
    assert {(asset / (m.replace(".", "/") + ".py")).read_text(encoding="utf-8").splitlines()[-1]
            for m in handlers.values()} == {f"NAME = {n!r}" for n in FUNCTION_NAMES}  # fmt: skip
    by_name = {synth.logical_id(f.function): n for n, f in synth.stack.functions.items()}
    assert {by_name[i]: m for i, m in handlers.items()} == {
        n: f"functions.{n}.handler" for n in FUNCTION_NAMES
    }
    # The same layer contents, built from other sources: the asset changes. (Hashed as shipped, it
    # would not: the stamp is beside python/, not in it.)
    (layer / STAMP_FILE).write_text(json.dumps({**stamp, "hash": "from-other-sources"}), encoding="utf-8")
    rebuilt = synthesize(tmp_path / "cdk.out-rebuilt", cdk_context(**assets, stage=stage))
    renamed = {_asset_dir(rebuilt.outdir, f).name for f in rebuilt.of_type("AWS::Lambda::Function").values()}
    assert len(renamed) == 1
    assert asset.name not in renamed


def test_a_bundling_stage_without_a_build_stamp_hashes_what_it_ships(tmp_path: Path) -> None:
    stage = _bundling_stage()
    assets = fake_assets(tmp_path)
    synth = synthesize(tmp_path / "cdk.out", cdk_context(**assets, stage=stage))
    assert synth.validation_error is None
    functions = synth.of_type("AWS::Lambda::Function").values()
    (asset,) = {_asset_dir(synth.outdir, f) for f in functions}
    assert (asset / "placeholder.py").is_file()
    assert {(asset / "functions" / n / "handler.py").is_file() for n in FUNCTION_NAMES} == {True}
    # With nothing to name the layer by, a changed layer file changes the asset.
    layer_file = Path(assets["layerAssetPath"]) / "python" / "placeholder.py"
    layer_file.write_text("CHANGED = 1\n", encoding="utf-8")
    again = synthesize(tmp_path / "cdk.out-changed", cdk_context(**assets, stage=stage))
    changed = {_asset_dir(again.outdir, f).name for f in again.of_type("AWS::Lambda::Function").values()}
    assert len(changed) == 1
    assert asset.name not in changed


def test_the_bundled_assets_hash_follows_the_layers_build_and_every_functions_code(tmp_path: Path) -> None:
    functions = tmp_path / "functions"
    (functions / "lease").mkdir(parents=True)
    (functions / "lease" / "handler.py").write_text(
        "def lambda_handler(event, context): ...\n", encoding="utf-8"
    )
    first = bundle_hash(functions, "layer-1")
    assert bundle_hash(functions, "layer-1") == first
    assert bundle_hash(functions, "layer-2") != first
    # Bytecode is left out of the asset, so it is left out of the hash.
    (functions / "lease" / "__pycache__").mkdir()
    (functions / "lease" / "__pycache__" / "handler.cpython-312.pyc").write_bytes(b"\0")
    assert bundle_hash(functions, "layer-1") == first
    (functions / "lease" / "handler.py").write_text(
        "def lambda_handler(event, context): return 1\n", encoding="utf-8"
    )
    changed = bundle_hash(functions, "layer-1")
    assert changed != first
    (functions / "produce").mkdir()
    (functions / "produce" / "handler.py").write_text("", encoding="utf-8")
    assert bundle_hash(functions, "layer-1") not in (first, changed)


def test_synth_raises_no_warnings(synth) -> None:
    # `npx cdk synth` prints each one, --quiet or not: the meta integration once drew 24 identical
    # "allowTestInvoke is ignored" warnings, one per catch-all method.
    metadata = json.loads(
        (synth.outdir / f"{synth.stack.stack_name}.metadata.json").read_text(encoding="utf-8")
    )
    warnings = [
        (path, entry["data"])
        for path, entries in metadata.items()
        for entry in entries
        if entry["type"] == "aws:cdk:warning"
    ]
    assert warnings == []


def test_a_stage_setting_to_fix_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    # What `npx cdk synth -c stage=prod` runs: the app, with the context in CDK_CONTEXT_JSON.
    env = {
        **os.environ,
        "CDK_CONTEXT_JSON": json.dumps({**cdk_context(), "stage": "prod", "buildLayer": "false"}),
    }
    env["JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"] = "20"
    done = subprocess.run(
        [sys.executable, "-m", "infra.app"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().startswith(
        "infra: stage 'prod' retains data, so its alarms must notify someone"
    )
