"""The route table (querator.api.routes)."""

from __future__ import annotations

import pytest

from querator.api import routes
from querator.api.errors import WireError
from querator.api.schemas import WireRequest, WireResponse

#: The contract's endpoints and the function that serves each.
EXPECTED = {
    ("POST", "/v1/queues.create"): "queues",
    ("POST", "/v1/queues.update"): "queues",
    ("POST", "/v1/queues.info"): "queues",
    ("POST", "/v1/queues.list"): "queues",
    ("POST", "/v1/queues.delete"): "queues",
    ("POST", "/v1/queue.produce"): "produce",
    ("POST", "/v1/queue.lease"): "lease",
    ("POST", "/v1/queue.complete"): "items",
    ("POST", "/v1/queue.retry"): "items",
    ("POST", "/v1/queue.renew"): "items",
    ("POST", "/v1/queue.reprioritize"): "admin",
    ("POST", "/v1/queue.stats"): "admin",
    ("POST", "/v1/queue.clear"): "admin",
    ("POST", "/v1/queue.redrive"): "admin",
    ("POST", "/v1/stream.ticket"): "lease",
    ("POST", "/v1/storage/items.list"): "admin",
    ("POST", "/v1/storage/scheduled.list"): "admin",
    ("POST", "/v1/storage/items.import"): "admin",
    ("POST", "/v1/storage/items.delete"): "admin",
    ("GET", "/health"): "meta",
    ("GET", "/openapi.json"): "meta",
    ("GET", "/docs"): "meta",
}
#: Routes that name no queue, or span queues: no scoped twin.
UNSCOPED = {"/v1/queues.list", "/health", "/openapi.json", "/docs"}


def test_table_is_the_contract() -> None:
    plain = {(r.method, r.path): r.function for r in routes.ROUTES if not r.scoped}
    assert plain == EXPECTED


def test_every_single_queue_route_has_a_scoped_twin() -> None:
    twins = {(r.method, r.path): r.function for r in routes.ROUTES if r.scoped}
    expected = {
        (method, path.replace("/v1/", "/v1/queues/{queue}/", 1)): function
        for (method, path), function in EXPECTED.items()
        if path not in UNSCOPED
    }
    assert twins == expected
    for twin in routes.SCOPED_ROUTES:
        plain = twin.plain
        assert plain is not None and plain.path == f"/v1/{twin.name}" and not plain.scoped
        assert twin.base is plain and plain.base is plain
        assert twin.path == routes.scoped_path(twin.name)
        # The same endpoint, models and limit: only the path differs.
        assert (twin.name, twin.method, twin.function, twin.request_model, twin.response_model) == (
            plain.name,
            plain.method,
            plain.function,
            plain.request_model,
            plain.response_model,
        )
        assert twin.body_limit == plain.body_limit and routes.scoped(twin.name) is twin
    assert routes.scoped("queues.list") is None


def test_every_route_has_a_unique_path_and_name() -> None:
    assert len({r.path for r in routes.ROUTES}) == len(routes.ROUTES)
    assert len({(r.name, r.scoped) for r in routes.ROUTES}) == len(routes.ROUTES)


def test_posts_have_models_and_gets_take_no_body() -> None:
    for route in routes.ROUTES:
        if route.method == "POST":
            assert route.request_model is not None
            assert issubclass(route.request_model, WireRequest)
            assert route.response_model is not None
            assert issubclass(route.response_model, WireResponse)
            assert route.path == (routes.scoped_path(route.name) if route.scoped else f"/v1/{route.name}")
        else:
            assert route.request_model is None
        assert route.summary


def test_body_limits() -> None:
    large = {r.path for r in routes.ROUTES if r.body_limit == 5_000_000}
    assert large == {
        "/v1/queue.produce",
        "/v1/storage/items.import",
        "/v1/queues/{queue}/queue.produce",
        "/v1/queues/{queue}/storage/items.import",
    }
    assert all(r.body_limit == 262_144 for r in routes.ROUTES if r.path not in large)


def test_by_path() -> None:
    assert routes.by_path("/v1/queue.lease") is routes.LEASE
    assert routes.by_path("/v1/queue.nope") is None
    assert routes.by_path("/v1/queue.lease/") is None


def test_for_function() -> None:
    items = (routes.COMPLETE, routes.RETRY, routes.RENEW)
    assert routes.for_function(routes.Function.ITEMS) == (*items, *(routes.scoped(r.name) for r in items))
    assert {r.function for r in routes.ROUTES} == {
        routes.Function.PRODUCE,
        routes.Function.LEASE,
        routes.Function.ITEMS,
        routes.Function.QUEUES,
        routes.Function.ADMIN,
        routes.Function.META,
    }


def test_match_finds_a_twin_and_its_queue_segment_as_sent() -> None:
    produce = routes.scoped("queue.produce")
    assert routes.match("/v1/queue.produce") == (routes.PRODUCE, None)
    assert routes.match("/v1/queues/orders/queue.produce") == (produce, "orders")
    assert routes.match("/v1/queues/a%2Fb/queue.produce") == (produce, "a%2Fb")
    listing = routes.scoped("storage/items.list")
    assert routes.match("/v1/queues/orders/storage/items.list") == (listing, "orders")
    for missing in (
        "/v1/queues/orders/queues.list",  # spans queues: no twin
        "/v1/queues/orders/queue.nope",
        "/v1/queues//queue.produce",
        "/v1/queues/orders",
        "/v1/queues/orders/",
        "/v1/queues/a/b/queue.produce",
    ):
        assert routes.match(missing) is None, missing


def test_resolve_applies_the_contract_misses() -> None:
    assert routes.resolve("POST", "/v1/queue.produce") is routes.PRODUCE
    assert routes.resolve("post", "/v1/queue.produce") is routes.PRODUCE
    assert routes.resolve("GET", "/health") is routes.HEALTH
    with pytest.raises(WireError) as unknown:
        routes.resolve("POST", "/v1/queue.nope")
    assert unknown.value.status == 501
    with pytest.raises(WireError) as method:
        routes.resolve("GET", "/v1/queue.produce")
    assert method.value.status == 400
    assert routes.resolve("POST", "/v1/queues/orders/queue.lease") is routes.scoped("queue.lease")
    with pytest.raises(WireError) as scoped_method:
        routes.resolve("GET", "/v1/queues/orders/queue.lease")
    assert scoped_method.value.status == 400
    with pytest.raises(WireError) as no_twin:
        routes.resolve("POST", "/v1/queues/orders/queues.list")
    assert no_twin.value.status == 501


def test_routes_are_frozen() -> None:
    with pytest.raises(AttributeError):
        routes.PRODUCE.path = "/elsewhere"  # type: ignore[misc]
