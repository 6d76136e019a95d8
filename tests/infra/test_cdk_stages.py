"""Every other stage of ``cdk.json`` synthesizes too, with cdk-nag clean (each stage flips settings
that add or remove resources: the API logging role, tracing, retention, reserved concurrency)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from tests.infra.synth import cdk_context, fake_assets, synthesize

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.infra

OTHER_STAGES = sorted(set(cdk_context()["stages"]) - {"dev"})


@pytest.mark.parametrize("stage", OTHER_STAGES)
def test_stage_synthesizes_with_nothing_unacknowledged(stage: str, tmp_path: Path) -> None:
    synth = synthesize(tmp_path / "cdk.out", cdk_context(**fake_assets(tmp_path), stage=stage))
    assert synth.validation_error is None
    report = json.loads((synth.outdir / "validation-report.json").read_text(encoding="utf-8"))
    assert report["pluginReports"] == []
    assert synth.stack.stack_name == f"querator-{stage}"
    retained = stage != "local"
    for table in synth.of_type("AWS::DynamoDB::Table").values():
        assert (table["DeletionPolicy"] == "Retain") == retained
    assert bool(synth.of_type("AWS::ApiGateway::Account")) == synth.stack.config.api_cloud_watch_role
