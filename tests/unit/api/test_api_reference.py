"""docs/api.md, the API reference users read, against the OpenAPI document, the route table, the limits
and the error table: an endpoint, a field, a limit or a stable class cannot change without it."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from querator.api import routes
from querator.api.endpoints import MAX_IDEMPOTENCY_KEY
from querator.api.errors import CODE_TEXT, GENERIC_INTERNAL_MESSAGE, INTERNAL_ERROR, status_for
from querator.api.openapi import build_openapi
from querator.api.schemas import DEFAULT_LIST_LIMIT, DEFAULT_QUEUES_LIMIT
from querator.config import DEFAULT_LEASE_WAIT_CAP
from querator.domain import errors as domain_errors
from querator.domain import model

REFERENCE = Path(__file__).resolve().parents[3] / "docs" / "api.md"
TEXT = REFERENCE.read_text(encoding="utf-8")
DOCUMENT = build_openapi(version="0")
HEADING = re.compile(r"^### `(GET|POST) (/\S+)`$", re.MULTILINE)
#: First cells of table rows: "| `name` |" or "| `a`, `b` |".
ROW_FIELDS = re.compile(r"^\| (`[^|]+`) \|", re.MULTILINE)


def _sections() -> dict[tuple[str, str], str]:
    marks = list(HEADING.finditer(TEXT))
    sections = {}
    for mark, following in zip(marks, [*marks[1:], None], strict=True):
        end = following.start() if following else len(TEXT)
        # A section ends at the next heading of any level.
        body = TEXT[mark.end() : end]
        cut = re.search(r"^#{1,3} ", body, re.MULTILINE)
        sections[(mark.group(1), mark.group(2))] = body[: cut.start()] if cut else body
    return sections


SECTIONS = _sections()
QUEUE_INFO_TABLE = TEXT.split("A queue is described by a `QueueInfo`:", 1)[1].split("###", 1)[0]


def _context(section: str) -> str:
    """A section with what it refers to: the QueueInfo table, the storage listing's fields."""
    text = section
    if "`QueueInfo`" in section:
        text += QUEUE_INFO_TABLE
    if "storage/items.list" in section:
        text += SECTIONS[("POST", "/v1/storage/items.list")]
    return text


def _properties(schema: dict[str, Any], seen: set[str] | None = None) -> set[str]:
    """Every property name of a schema, nested ones included, following ``$ref``s."""
    seen = set() if seen is None else seen
    names: set[str] = set()
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        if name in seen:
            return names
        seen.add(name)
        return _properties(DOCUMENT["components"]["schemas"][name], seen)
    for key, value in schema.get("properties", {}).items():
        names.add(key)
        names |= _properties(value, seen)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            names |= _properties(schema[key], seen)
    for key in ("anyOf", "oneOf", "allOf"):
        for option in schema.get(key, []):
            names |= _properties(option, seen)
    return names


def _operations() -> list[tuple[str, str, dict[str, Any]]]:
    """The plain routes' operations: a scoped twin is documented once, in "Access per queue"."""
    return [
        (method.upper(), path, operation)
        for path, methods in DOCUMENT["paths"].items()
        for method, operation in methods.items()
        if not path.startswith("/v1/queues/{queue}/")
    ]


def _request_fields(operation: dict[str, Any]) -> set[str]:
    body = operation.get("requestBody")
    return _properties(body["content"]["application/json"]["schema"]) if body else set()


def _reply_fields(operation: dict[str, Any]) -> set[str]:
    content = operation["responses"]["200"]["content"]
    return _properties(content["application/json"]["schema"]) if "application/json" in content else set()


def test_every_route_has_a_section_and_every_section_a_route() -> None:
    assert set(SECTIONS) == {(route.method, route.path) for route in routes.ROUTES if not route.scoped}
    assert set(SECTIONS) == {(method, path) for method, path, _ in _operations()}


@pytest.mark.parametrize(("method", "path", "operation"), _operations(), ids=lambda v: str(v)[:40])
def test_every_field_of_each_endpoint_is_documented(
    method: str, path: str, operation: dict[str, Any]
) -> None:
    text = _context(SECTIONS[(method, path)])
    fields = _request_fields(operation) | _reply_fields(operation)
    missing = sorted(name for name in fields - {"code"} if f"`{name}`" not in text)
    assert not missing, f"{method} {path}: not in docs/api.md: {missing}"
    if "code" in _reply_fields(operation):
        assert '`{"code": 200}`' in text


@pytest.mark.parametrize(("method", "path", "operation"), _operations(), ids=lambda v: str(v)[:40])
def test_every_documented_field_exists(method: str, path: str, operation: dict[str, Any]) -> None:
    fields = _request_fields(operation) | _reply_fields(operation)
    documented = {
        name.strip("` ") for cell in ROW_FIELDS.findall(SECTIONS[(method, path)]) for name in cell.split(",")
    }
    assert documented <= fields, f"{method} {path}: documented but not in the API: {documented - fields}"


def test_the_queue_info_table_is_the_queue_info_reply() -> None:
    documented = {
        name.strip("` ") for cell in ROW_FIELDS.findall(QUEUE_INFO_TABLE) for name in cell.split(",")
    }
    reply = DOCUMENT["paths"]["/v1/queues.info"]["post"]["responses"]["200"]
    assert documented == _properties(reply["content"]["application/json"]["schema"])


def _limit_row(what: str) -> str:
    row = re.search(rf"^\| {re.escape(what)} \| (.*) \|$", TEXT, re.MULTILINE)
    assert row is not None, what
    return row.group(1)


def test_the_limits_are_the_codes() -> None:
    assert _limit_row("payload of one item").startswith(f"{model.MAX_PAYLOAD_BYTES:,} bytes")
    assert f"at most {routes.LARGE_BODY_LIMIT:,} bytes" in TEXT
    assert f"every other endpoint {routes.SMALL_BODY_LIMIT:,} bytes" in TEXT
    assert {route.body_limit for route in routes.ROUTES} == {routes.LARGE_BODY_LIMIT, routes.SMALL_BODY_LIMIT}
    large = sorted({route.name for route in routes.ROUTES if route.body_limit == routes.LARGE_BODY_LIMIT})
    assert large == ["queue.produce", "storage/items.import"]
    for what in (
        "items per `queue.produce`, `storage/items.import`",
        "ids per `queue.complete`, `queue.retry`, `queue.renew`, `storage/items.delete`",
        "`batch_size` of `queue.lease`",
        "`limit` of `queues.list` and the storage listings",
    ):
        assert _limit_row(what) == f"1 to {model.MAX_BATCH}"
    assert _limit_row("`queue_name`").startswith(f"1 to {model.MAX_QUEUE_NAME_BYTES} bytes")
    assert (
        _limit_row("`reference` of a queue, and `reference`, `encoding`, `kind` of an item")
        == f"at most {model.MAX_REFERENCE_BYTES} bytes each"
    )
    assert _limit_row("`max_attempts`").startswith(f"0 to {model.MAX_ATTEMPTS_LIMIT}")
    assert _limit_row("`requested_partitions`") == f"1 to {model.MAX_PARTITIONS}"
    assert _limit_row("`max_leased_per_group`").startswith(f"0 to {model.MAX_LEASED_PER_GROUP_LIMIT:,}")
    assert _limit_row("`Idempotency-Key` header") == f"1 to {MAX_IDEMPOTENCY_KEY} characters"
    wait = int(DEFAULT_LEASE_WAIT_CAP.total_seconds())
    assert _limit_row("lease wait (`request_timeout` of `queue.lease`)").startswith(f"{wait} s")
    assert f"at most this many, 1 to {model.MAX_BATCH} (default {DEFAULT_QUEUES_LIMIT})" in TEXT
    assert f"at most this many, 1 to {model.MAX_BATCH} (default {DEFAULT_LIST_LIMIT})" in TEXT


def test_every_status_is_in_the_status_table() -> None:
    table = TEXT.split("| status | `code_text` | meaning |", 1)[1].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\| ([\d /]+) \| ([^|]+) \|", table, re.MULTILINE))
    documented = {}
    for statuses, texts in rows.items():
        for status, text in zip(statuses.split(" / "), texts.strip().split(" / "), strict=True):
            documented[int(status)] = text
    assert documented == dict(CODE_TEXT)


def test_every_stable_class_is_documented_with_its_status() -> None:
    table = TEXT.split("| stable class | status | when |", 1)[1].split("\n\n", 1)[0]
    documented = {name: int(status) for name, status in re.findall(r"^\| `([^`]+)` \| (\d+) \|", table, re.M)}
    expected = {
        klass.stable_class: status_for(klass)
        for _, klass in inspect.getmembers(domain_errors, inspect.isclass)
        if issubclass(klass, domain_errors.QueratorError) and status_for(klass) != INTERNAL_ERROR
    }
    # Refused by the wire before any domain code runs (querator.api.errors), and the generic 500.
    expected |= {"Unsupported content": 455, "Not implemented": 501, GENERIC_INTERNAL_MESSAGE: 500}
    assert documented == expected


def test_the_readme_and_the_other_docs_link_to_it() -> None:
    root = REFERENCE.parents[1]
    assert "(docs/api.md)" in (root / "README.md").read_text(encoding="utf-8")
    for name in ("cli.md", "client.md"):
        assert "(api.md)" in (root / "docs" / name).read_text(encoding="utf-8"), name


def test_the_openapi_document_states_the_payload_limit() -> None:
    item = DOCUMENT["components"]["schemas"]["ProduceItem"]["properties"]
    for key in ("bytes", "utf8"):
        assert f"at most {model.MAX_PAYLOAD_BYTES:,} bytes" in item[key]["description"]
