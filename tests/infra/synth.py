"""Synthesize the stack for the infra tests: fake assets, ``cdk.json``'s context, the template as dicts."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Before jsii is imported: Node 20 is past its end of life and jsii prints a banner on every start.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from aws_cdk import App
from aws_cdk.assertions import Template

from infra import nag
from infra.app import build
from infra.permissions import FUNCTION_NAMES

if TYPE_CHECKING:
    from collections.abc import Callable

    from infra.stack import QueratorStack

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Synth:
    stack: QueratorStack
    template: Template
    #: ``Template.to_json()``: plain dicts, quicker to walk than ``find_resources`` for every query.
    resources: dict[str, dict[str, Any]]
    outputs: dict[str, Any]
    outdir: Path
    #: The ``ValidationFailed`` message, if cdk-nag (or another validation) failed the synth.
    validation_error: str | None
    #: (construct path, rule id, reason) acknowledged while building this stack.
    acknowledged: list[tuple[str, str, str]]

    def logical_id(self, construct: Any) -> str:
        return str(self.stack.get_logical_id(construct.node.default_child))

    def of_type(self, resource_type: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.resources.items() if v["Type"] == resource_type}


def cdk_context(**overrides: object) -> dict[str, Any]:
    context: dict[str, Any] = json.loads((ROOT / "cdk.json").read_text(encoding="utf-8"))["context"]
    context.update(overrides)
    return context


def fake_assets(root: Path) -> dict[str, str]:
    """A layer folder and one ``handler.py`` per function, as context keys pointing at them."""
    (root / "layer" / "python").mkdir(parents=True)
    (root / "layer" / "python" / "placeholder.py").write_text("", encoding="utf-8")
    for name in FUNCTION_NAMES:
        (root / "functions" / name).mkdir(parents=True)
        (root / "functions" / name / "handler.py").write_text(
            "def lambda_handler(event, context):\n    return None\n", encoding="utf-8"
        )
    return {"layerAssetPath": str(root / "layer"), "functionsAssetRoot": str(root / "functions")}


def synthesize(
    outdir: Path, context: dict[str, Any], extend: Callable[[QueratorStack], None] | None = None
) -> Synth:
    """The app's stack for ``context``; ``extend`` adds what a test needs beside it (before cdk-nag)."""
    app = App(context=context, outdir=str(outdir))
    first_ack = len(nag.ACKNOWLEDGED)
    stack = build(app)
    if extend is not None:
        extend(stack)
    acknowledged = nag.ACKNOWLEDGED[first_ack:]
    error = None
    try:
        app.synth()
    except RuntimeError as exc:  # jsii raises validation failures as RuntimeError
        error = str(exc)
    template_json = json.loads((outdir / f"{stack.stack_name}.template.json").read_text(encoding="utf-8"))
    return Synth(
        stack=stack,
        template=Template.from_json(template_json),
        resources=template_json["Resources"],
        outputs=template_json.get("Outputs", {}),
        outdir=outdir,
        validation_error=error,
        acknowledged=acknowledged,
    )
