"""The deployed-stack tests' IAM evaluator (``iam_policy``) answers as IAM does for what they grant."""

from __future__ import annotations

import pytest

from tests.infra.iam_policy import Request, allowed, matches

pytestmark = pytest.mark.infra

API = "arn:aws:execute-api:us-east-1:123456789012:abc123/dev"


def _allow(*resources: str, effect: str = "Allow", action: str = "execute-api:Invoke") -> dict[str, object]:
    return {"Effect": effect, "Action": action, "Resource": list(resources)}


def _invoke(path: str) -> Request:
    return Request("execute-api:Invoke", f"{API}/{path}")


def test_a_star_spans_any_characters_slashes_included_and_a_question_mark_one() -> None:
    assert matches(
        f"{API}/POST/v1/queues/orders-*/queue.produce",
        f"{API}/POST/v1/queues/orders-eu/queue.produce",
        case=True,
    )
    assert matches(f"{API}/*", f"{API}/POST/v1/queues/a/queue.produce", case=True)
    assert matches("q?", "q1", case=True)
    assert not matches("q?", "q12", case=True)
    assert not matches("q?", "q", case=True)


def test_brackets_and_dots_are_themselves_not_patterns() -> None:
    # fnmatch would read [ab] as a class; IAM has no classes.
    assert not matches("queue[ab]", "queuea", case=True)
    assert matches("queue[ab]", "queue[ab]", case=True)
    assert not matches("a.c", "abc", case=True)


def test_actions_ignore_case_and_resources_do_not() -> None:
    statements = [_allow(f"{API}/POST/v1/queues/orders/queue.produce", action="Execute-API:invoke")]
    assert allowed(statements, _invoke("POST/v1/queues/orders/queue.produce"))
    assert not allowed(statements, _invoke("POST/v1/queues/Orders/queue.produce"))


def test_an_explicit_deny_wins_over_any_allow_and_nothing_is_allowed_by_default() -> None:
    prefix = _allow(f"{API}/POST/v1/queues/orders-*/queue.produce")
    deny = _allow(f"{API}/POST/v1/queues/orders-secret/*", effect="Deny")
    assert allowed([prefix, deny], _invoke("POST/v1/queues/orders-eu/queue.produce"))
    assert not allowed([prefix, deny], _invoke("POST/v1/queues/orders-secret/queue.produce"))
    assert not allowed([], _invoke("POST/v1/queues/orders-eu/queue.produce"))
    assert not allowed([prefix], _invoke("POST/v1/queues/emails/queue.produce"))


def test_a_statement_it_cannot_judge_fails_instead_of_being_misjudged() -> None:
    conditional = {**_allow(f"{API}/*"), "Condition": {"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}}
    with pytest.raises(AssertionError, match="Condition"):
        allowed([conditional], _invoke("GET/health"))
