"""The generated OpenAPI document (querator.api.openapi)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from querator.api import routes
from querator.api.openapi import EXAMPLES, build_openapi
from querator.api.schemas import parse_request


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return build_openapi(version="1.2.3", server_url="https://example.invalid")


def _strings_under(key: str, node: object) -> list[str]:
    """Every string value of ``key`` anywhere in the document (``$ref``, ``description``)."""
    if isinstance(node, dict):
        found = [node[key]] if isinstance(node.get(key), str) else []
        return found + [text for value in node.values() for text in _strings_under(key, value)]
    if isinstance(node, list):
        return [text for value in node for text in _strings_under(key, value)]
    return []


def test_basic_structure(document: dict[str, Any]) -> None:
    assert document["openapi"] == "3.1.0"
    assert document["info"]["title"] == "querator"
    assert document["info"]["version"] == "1.2.3"
    assert document["servers"] == [{"url": "https://example.invalid"}]
    json.dumps(document)  # serialisable as the GET /openapi.json body


def test_every_route_is_a_path(document: dict[str, Any]) -> None:
    assert set(document["paths"]) == {r.path for r in routes.ROUTES}
    for route in routes.ROUTES:
        operation = document["paths"][route.path][route.method.lower()]
        assert "200" in operation["responses"]
        assert operation["summary"] == route.summary
    operation_ids = [op["operationId"] for item in document["paths"].values() for op in item.values()]
    assert len(set(operation_ids)) == len(operation_ids)


def test_posts_document_body_and_error_statuses(document: dict[str, Any]) -> None:
    for route in routes.ROUTES:
        if route.method != "POST":
            continue
        operation = document["paths"][route.path]["post"]
        # A scoped path's body leaves the queue to the path (its schema's "InQueue" twin).
        expected = route.request_model.__name__ + ("InQueue" if route.scoped else "")  # type: ignore[union-attr]
        assert operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(expected)
        assert {"400", "413", "453", "454", "455", "500"} <= set(operation["responses"])


def test_every_ref_resolves(document: dict[str, Any]) -> None:
    for ref in _strings_under("$ref", document):
        node: Any = document
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
        assert isinstance(node, dict)


def test_error_envelope_schema(document: dict[str, Any]) -> None:
    schema = document["components"]["schemas"]["ErrorBody"]
    # next_lease_at: only on a lease held back by a rate limit.
    assert set(schema["properties"]) == {"code", "code_text", "message", "next_lease_at"}
    assert set(schema["required"]) == {"code", "code_text", "message"}


def test_requests_are_documented_in_snake_case(document: dict[str, Any]) -> None:
    assert "queue_name" in document["components"]["schemas"]["LeaseRequest"]["properties"]
    assert "batch_size" in document["components"]["schemas"]["LeaseRequest"]["properties"]
    assert "logicalQueues" in document["components"]["schemas"]["StatsResponse"]["properties"]


def test_every_post_has_an_example_that_parses() -> None:
    posts = [r for r in routes.ROUTES if r.request_model is not None]
    assert set(EXAMPLES) == {r.name for r in posts}
    for route in posts:
        assert route.request_model is not None
        parse_request(route.request_model, json.dumps(EXAMPLES[route.name]), limit=route.body_limit)


def test_produce_documents_the_idempotency_key(document: dict[str, Any]) -> None:
    parameters = document["paths"]["/v1/queue.produce"]["post"]["parameters"]
    assert [p["name"] for p in parameters] == ["Idempotency-Key"]


def test_no_description_names_a_python_class(document: dict[str, Any]) -> None:
    # The descriptions are for API users: a Python name there ("InvalidValueError") is a slip.
    found = _strings_under("description", document)
    assert len(found) > 20
    assert [text for text in found if re.search(r"\b[A-Z][a-z]+(?:[A-Z][a-z]+)+Error\b", text)] == []


def test_a_scoped_path_takes_a_body_without_its_queue(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    plain = document["paths"]["/v1/queue.produce"]["post"]["requestBody"]["content"]["application/json"]
    scoped = document["paths"]["/v1/queues/{queue}/queue.produce"]["post"]["requestBody"]["content"][
        "application/json"
    ]
    assert plain["schema"] == {"$ref": "#/components/schemas/ProduceRequest"}
    assert "queue_name" in schemas["ProduceRequest"]["required"]
    assert scoped["schema"] == {"$ref": "#/components/schemas/ProduceRequestInQueue"}
    in_queue = schemas["ProduceRequestInQueue"]
    assert in_queue["required"] == ["items"]
    assert in_queue["properties"] == schemas["ProduceRequest"]["properties"]
    # Every scoped route's body leaves the queue to the path.
    for route in routes.ROUTES:
        if route.scoped and route.request_model is not None:
            ref = document["paths"][route.path]["post"]["requestBody"]["content"]["application/json"]
            name = ref["schema"]["$ref"].rsplit("/", 1)[1]
            assert "queue_name" not in schemas[name].get("required", []), route.path
