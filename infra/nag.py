"""cdk-nag (AwsSolutions) wiring and the one way this app acknowledges a finding.

Every acknowledgement goes through ``acknowledge`` next to the resource it concerns, with a reason a
reviewer can check; ``ACKNOWLEDGED`` records them so the tests can list and vet them.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Final

from aws_cdk import Acknowledgment, Validations
from cdk_nag import AwsSolutionsChecks

if TYPE_CHECKING:
    from collections.abc import Iterator

    from constructs import IConstruct

#: (construct path, rule id, reason) of every acknowledgement made while building the app.
ACKNOWLEDGED: Final[list[tuple[str, str, str]]] = []
#: A reason shorter than this is not a reason.
MIN_REASON: Final = 40
_withheld: list[bool] = []


def acknowledge(scope: IConstruct, rule_id: str, reason: str) -> None:
    """Acknowledge one cdk-nag finding on ``scope`` (and its children), with why it is acceptable."""
    if len(reason) < MIN_REASON:
        raise ValueError(f"{rule_id}: say why the finding is acceptable (got {reason!r})")
    ACKNOWLEDGED.append((scope.node.path, rule_id, reason))
    if not _withheld:
        Validations.of(scope).acknowledge(Acknowledgment(id=rule_id, reason=reason))


def add_checks(scope: IConstruct) -> None:
    """Run the AwsSolutions rule pack on ``scope`` at synth; findings go to the validation report."""
    Validations.of(scope).add_plugins(AwsSolutionsChecks(scope))


@contextlib.contextmanager
def acknowledgements_withheld() -> Iterator[None]:
    """Record acknowledgements without applying them, so a test can check each one still matches a
    finding (an acknowledgement whose finding is gone would hide the next real one)."""
    _withheld.append(True)
    try:
        yield
    finally:
        _withheld.pop()
