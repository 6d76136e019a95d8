"""The endpoint table covers the route table, and the edge's small decisions."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest

from querator.api import routes
from querator.api.endpoints import ENDPOINTS, MAX_IDEMPOTENCY_KEY, idempotency_key
from querator.api.gateway import _wait_limit
from querator.config import EnvVar, settings_from
from querator.domain.errors import InvalidRequestError


def test_every_route_with_a_body_or_a_store_read_has_exactly_one_endpoint():
    documents = {routes.OPENAPI.name, routes.DOCS.name}  # served by the gateway itself
    assert set(ENDPOINTS) == {r.name for r in routes.ROUTES} - documents


def test_the_idempotency_key_header_is_found_in_any_case_and_bounded():
    assert idempotency_key({"IDEMPOTENCY-KEY": " abc "}) == "abc"
    assert idempotency_key({"Content-Type": "application/json"}) is None
    assert idempotency_key(None) is None
    for bad in ("", "   ", "k" * (MAX_IDEMPOTENCY_KEY + 1)):
        with pytest.raises(InvalidRequestError):
            idempotency_key({"Idempotency-Key": bad})


@dataclass
class Context:
    remaining_ms: int

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


@pytest.mark.parametrize(
    ("remaining_ms", "expected"),
    [(60_000, timedelta(seconds=20)), (8_000, timedelta(seconds=7)), (500, timedelta(0)), (None, None)],
)
def test_a_lease_waits_at_most_the_cap_and_never_past_the_invocation(remaining_ms, expected):
    settings = settings_from({EnvVar.ITEMS_TABLE: "items", EnvVar.CATALOG_TABLE: "queues"})
    context = Context(remaining_ms) if remaining_ms is not None else object()
    assert _wait_limit(settings, context) == (settings.lease_wait_cap if expected is None else expected)
