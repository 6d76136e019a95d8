"""CDK entry point: ``cdk.json`` runs ``python -m infra.app``; the stage comes from context."""

from __future__ import annotations

from aws_cdk import App

from infra.config import StageConfig
from infra.nag import add_checks
from infra.stack import QueratorStack


def build(app: App) -> QueratorStack:
    """Add the stage's stack (and the cdk-nag checks) to ``app``."""
    config = StageConfig.from_context(app.node)
    # Environment-agnostic: the template is the same with or without credentials, and synth needs none.
    stack = QueratorStack(app, config.stack_name, config=config)
    add_checks(app)
    return stack


def main() -> None:
    app = App()
    build(app)
    app.synth()


if __name__ == "__main__":
    main()
