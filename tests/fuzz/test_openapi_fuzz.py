"""Property-based fuzzing of the HTTP API from its own OpenAPI document (schemathesis).

Every operation of ``build_openapi()`` gets generated requests, valid and invalid, against
``querator serve``: no 5xx, every error in the contract's envelope. The write operations are also
fuzzed against a queue that exists, and a request they reject must leave the queue as it was.
Bounded: a few dozen examples per operation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.config import SchemathesisConfig

from querator.api.openapi import build_openapi
from tests.fuzz.api import QUEUE, assert_envelope

if TYPE_CHECKING:
    from tests.fuzz.api import Api

pytestmark = pytest.mark.server

# Valid and invalid requests alike ("positive" and "negative" generation).
schema = schemathesis.openapi.from_dict(
    build_openapi(), config=SchemathesisConfig.from_dict({"generation": {"mode": "all"}})
)

EXAMPLES = 50
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)


@schema.parametrize()
@FUZZ_SETTINGS
def test_no_server_error_and_every_error_in_the_envelope(case: Any, api: Api) -> None:
    if isinstance(case.body, dict) and "request_timeout" in case.body:
        # A lease on an existing queue may wait up to the platform cap; a short wait tests the same.
        case.body["request_timeout"] = "10ms"
    response = case.call(base_url=api.url, timeout=60)
    assert_envelope(response)


def _body_strategy(path: str) -> Any:
    """Generated request bodies of one operation, pointed at the existing queue."""
    operation = schema[path]["POST"]

    def aim(case: Any) -> Any:
        body = case.body
        if isinstance(body, dict):
            body = {**body, "queue_name": QUEUE}
        return body

    return operation.as_strategy().map(aim)


WRITES = [
    "/v1/queue.produce",
    "/v1/storage/items.import",
    "/v1/queue.clear",
    "/v1/storage/items.delete",
    "/v1/queue.complete",
    "/v1/queue.retry",
]


@pytest.mark.parametrize("path", WRITES)
def test_a_rejected_write_stores_nothing(path: str, api: Api) -> None:
    @FUZZ_SETTINGS
    @given(body=_body_strategy(path), mangle=st.sampled_from(["as is", "drop a key", "bad type"]))
    def check(body: Any, mangle: str) -> None:
        if isinstance(body, dict) and body and mangle != "as is":
            key = sorted(k for k in body if k != "queue_name")[:1]
            if key and mangle == "drop a key":
                body = {k: v for k, v in body.items() if k != key[0]}
            elif key:
                body = {**body, key[0]: {"not": ["what", "it", "wants"]}}
        before = api.counts()
        response = api.post(path.removeprefix("/v1/"), body)
        assert_envelope(response)
        if response.status_code != 200:
            assert api.counts() == before, f"{path} rejected ({response.status_code}) but changed the queue"
        else:
            # Accepted writes are fine; empty the queue so the next example starts clean.
            cleared = api.post(
                "queue.clear", {"queue_name": QUEUE, "queue": True, "scheduled": True, "destructive": True}
            )
            assert cleared.status_code == 200, cleared.text

    check()
