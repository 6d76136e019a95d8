"""The deployed-stack tests' IAM evaluator (``iam_policy``) answers as IAM does for what they grant."""

from __future__ import annotations

import pytest

from tests.infra.iam_policy import Request, allowed, matches

pytestmark = pytest.mark.infra

API = "arn:aws:execute-api:us-east-1:123456789012:abc123/dev"


def _allow(
    *resources: str, effect: str = "Allow", action: str | list[str] = "execute-api:Invoke"
) -> dict[str, object]:
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


BUCKET = "arn:aws:s3:::querator-dev-payloadsbucket-abc"


def _listing(prefix: str | None) -> Request:
    return Request("s3:ListBucket", BUCKET, () if prefix is None else (("s3:prefix", prefix),))


def test_a_string_like_condition_allows_only_requests_whose_key_matches() -> None:
    # The reaper's listing: of the objects' prefix, or a longer one, and nothing else of the bucket.
    listing = {**_allow(BUCKET, action="s3:ListBucket"), "Condition": {"StringLike": {"s3:prefix": "o/*"}}}
    assert allowed([listing], _listing("o/"))
    assert allowed([listing], _listing("o/000001700000/"))
    assert not allowed([listing], _listing(""))
    assert not allowed([listing], _listing("x/o/"))
    # A request without the key fails the condition (IAM: no ...IfExists here).
    assert not allowed([listing], _listing(None))
    # Condition keys ignore case, values do not.
    assert allowed([listing], Request("s3:ListBucket", BUCKET, (("S3:Prefix", "o/"),)))
    assert not allowed([listing], _listing("O/"))


def test_a_string_equals_condition_is_exact_and_every_operator_must_hold() -> None:
    both = {
        **_allow(BUCKET, action="s3:ListBucket"),
        "Condition": {"StringEquals": {"s3:prefix": ["o/", "p/"]}, "StringLike": {"s3:prefix": "o*"}},
    }
    assert allowed([both], _listing("o/"))
    assert not allowed([both], _listing("p/"))  # StringEquals holds, StringLike does not
    assert not allowed([both], _listing("o/1"))  # StringLike holds, StringEquals does not


def test_an_object_grant_on_the_prefix_covers_its_keys_only() -> None:
    objects = _allow(f"{BUCKET}/o/*", action=["s3:GetObject", "s3:PutObject"])
    assert allowed([objects], Request("s3:GetObject", f"{BUCKET}/o/000001700000/ab12"))
    assert not allowed([objects], Request("s3:GetObject", f"{BUCKET}/other"))
    assert not allowed([objects], Request("s3:DeleteObject", f"{BUCKET}/o/000001700000/ab12"))
    assert not allowed([objects], Request("s3:ListBucket", BUCKET, (("s3:prefix", "o/"),)))
