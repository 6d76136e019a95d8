"""Every other stage of ``cdk.json`` synthesizes too, with cdk-nag clean (each stage flips settings
that add or remove resources: the API logging role, tracing, retention, reserved concurrency)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from aws_cdk import App

from infra.config import StageConfig, StageConfigError
from querator.config import EnvVar
from tests.infra.conftest import ALARM_EMAIL
from tests.infra.synth import cdk_context, fake_assets, synthesize

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.infra

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
    assert bool(synth.of_type("AWS::ApiGateway::Account")) == synth.stack.config.api_cloud_watch_role


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
