"""Hand-picked bad inputs: each gets its contract status in the envelope, and a rejected write stores
nothing (the queue's counts are unchanged)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from tests.fuzz.api import QUEUE, assert_envelope

if TYPE_CHECKING:
    from tests.fuzz.api import Api

pytestmark = pytest.mark.server

ID = "0" * 30
PRODUCE_LIMIT = 5_000_000

# (name, method, body, expected status)
CASES: list[tuple[str, str, Any, int]] = [
    ("empty body", "queue.produce", b"", 455),
    ("body is not JSON", "queue.produce", b"queue_name=fuzz", 455),
    (
        "invalid UTF-8 in the body",
        "queue.produce",
        b'{"queue_name":"fuzz\xff\xfe","items":[{"utf8":"x"}]}',
        455,
    ),
    ("lone surrogate escape", "queue.produce", '{"queue_name":"fuzz","items":[{"utf8":"\\ud800"}]}', 455),
    ("deeply nested array", "queue.produce", "[" * 100_000 + "]" * 100_000, 455),
    ("deeply nested value", "queue.produce", '{"queue_name":' + "[" * 5000 + "]" * 5000 + "}", 455),
    ("a key the message does not define", "queue.produce", {"queue_name": QUEUE, "items": [], "x": 1}, 455),
    ("JSON array body", "queue.produce", [1, 2, 3], 455),
    (
        "a key given twice",
        "queue.produce",
        '{"queue_name":"' + QUEUE + '","queue_name":"other","items":[{"utf8":"x"}]}',
        400,
    ),
    (
        "a key given twice in an item",
        "queue.produce",
        '{"queue_name":"' + QUEUE + '","items":[{"utf8":"x","utf8":"y"}]}',
        400,
    ),
    (
        "queue name with ESC",
        "queues.create",
        {"queue_name": "esc\x1b[2Jq", "lease_timeout": "30s", "expire_timeout": "1h"},
        400,
    ),
    ("empty item list", "queue.produce", {"queue_name": QUEUE, "items": []}, 400),
    ("1001 items", "queue.produce", {"queue_name": QUEUE, "items": [{"utf8": "x"}] * 1001}, 400),
    ("invalid base64", "queue.produce", {"queue_name": QUEUE, "items": [{"bytes": "!!not base64"}]}, 400),
    (
        "an item over the payload limit",
        "queue.produce",
        {"queue_name": QUEUE, "items": [{"utf8": "x" * 1_048_577}]},
        400,
    ),
    (
        "enqueue_at in year 9999",
        "queue.produce",
        {"queue_name": QUEUE, "items": [{"utf8": "x", "enqueue_at": "9999-12-31T23:59:59Z"}]},
        400,
    ),
    (
        "enqueue_at before the epoch",
        "queue.produce",
        {"queue_name": QUEUE, "items": [{"utf8": "x", "enqueue_at": "0001-01-01T00:00:00Z"}]},
        200,
    ),
    (
        "enqueue_at not RFC 3339",
        "queue.produce",
        {"queue_name": QUEUE, "items": [{"utf8": "x", "enqueue_at": "tomorrow"}]},
        400,
    ),
    ("unknown queue", "queue.produce", {"queue_name": "no-such-queue", "items": [{"utf8": "x"}]}, 400),
    ("queue name with whitespace", "queue.produce", {"queue_name": "a b", "items": [{"utf8": "x"}]}, 400),
    ("queue name over 512 bytes", "queue.stats", {"queue_name": "q" * 513}, 400),
    (
        "negative lease_timeout",
        "queues.create",
        {"queue_name": "neg", "lease_timeout": "-5s", "expire_timeout": "1h"},
        400,
    ),
    (
        "absurd durations",
        "queues.create",
        {"queue_name": "absurd", "lease_timeout": "99999999999999h", "expire_timeout": "999999999999999999h"},
        400,
    ),
    (
        "duration without a unit",
        "queues.create",
        {"queue_name": "unitless", "lease_timeout": "5", "expire_timeout": "1h"},
        400,
    ),
    (
        "lease_timeout longer than expire_timeout",
        "queues.create",
        {"queue_name": "inverted", "lease_timeout": "2h", "expire_timeout": "1h"},
        400,
    ),
    (
        "negative request_timeout",
        "queue.lease",
        {"queue_name": QUEUE, "batch_size": 1, "client_id": "c", "request_timeout": "-1s"},
        400,
    ),
    ("batch_size 1001", "queue.lease", {"queue_name": QUEUE, "batch_size": 1001, "client_id": "c"}, 400),
    ("batch_size 0", "queue.lease", {"queue_name": QUEUE, "batch_size": 0, "client_id": "c"}, 400),
    ("batch_size infinite", "queue.lease", '{"queue_name":"fuzz","batch_size":1e999,"client_id":"c"}', 400),
    (
        "batch_size of 5000 digits",
        "queue.lease",
        '{"queue_name":"fuzz","batch_size":' + "9" * 5000 + "}",
        400,  # valid JSON; past Python's digit limit, read as out of range (a 400 naming it)
    ),
    ("1001 ids", "queue.complete", {"queue_name": QUEUE, "partition": 0, "ids": [ID] * 1001}, 400),
    ("negative partition", "queue.complete", {"queue_name": QUEUE, "partition": -1, "ids": [ID]}, 400),
    (
        "partition that does not exist",
        "queue.complete",
        {"queue_name": QUEUE, "partition": 99, "ids": [ID]},
        400,
    ),
    ("malformed item id", "queue.complete", {"queue_name": QUEUE, "partition": 0, "ids": ["../../etc"]}, 400),
    (
        "retry_at in year 9999",
        "queue.retry",
        {"queue_name": QUEUE, "partition": 0, "items": [{"id": ID, "retry_at": "9999-12-31T23:59:59Z"}]},
        400,
    ),
    (
        "import with enqueue_at in year 9999",
        "storage/items.import",
        {
            "queue_name": QUEUE,
            "partition": 0,
            "items": [{"payload": "eA==", "enqueue_at": "9999-12-31T23:59:59Z"}],
        },
        400,
    ),
    ("clear with nothing to clear", "queue.clear", {"queue_name": QUEUE}, 400),
]


@pytest.mark.parametrize(("method", "body", "status"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_gets_its_status_in_the_envelope_and_stores_nothing(
    api: Api, method: str, body: Any, status: int
) -> None:
    before = api.counts()
    response = api.post(method, body)
    assert_envelope(response)
    assert response.status_code == status, response.text[:300]
    if status != 200:
        assert api.counts() == before
    else:
        api.post("queue.clear", {"queue_name": QUEUE, "queue": True, "scheduled": True, "destructive": True})


def test_a_body_over_the_produce_limit_is_413_and_stores_nothing(api: Api) -> None:
    before = api.counts()
    body = json.dumps({"queue_name": QUEUE, "items": [{"utf8": "x" * 300_000}] * 18})
    assert len(body) > PRODUCE_LIMIT
    response = api.post("queue.produce", body)
    assert_envelope(response)
    assert response.status_code == 413
    assert api.counts() == before


def test_a_wrong_content_type_is_455(api: Api) -> None:
    response = api.post("queue.stats", {"queue_name": QUEUE}, content_type="text/plain")
    assert_envelope(response)
    assert response.status_code == 455


def test_another_method_on_an_api_path_is_400_in_the_envelope(api: Api) -> None:
    for method in ("PUT", "DELETE", "OPTIONS", "TRACE", "QUERY"):
        response = api.session.request(method, f"{api.url}/v1/queue.stats", timeout=30)
        assert_envelope(response)
        assert response.status_code == 400, (method, response.text[:200])
