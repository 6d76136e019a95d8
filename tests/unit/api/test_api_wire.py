"""What a wire message is (querator.api.wire): declaration, schema, and the rules every message shares."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from querator.api.wire import (
    BodyError,
    Duration,
    Integer,
    ListOf,
    Message,
    Nested,
    Text,
    camel,
    field,
)

REF = "#/components/schemas/{model}"


class Inner(Message):
    """One inner value."""

    size: int = field(Integer(ge=1))


class Outer(Message):
    """A message of every shape the schema writer knows."""

    camel_case_keys = True

    name: str = field(Text(min_length=1), description="who")
    wait: timedelta | None = field(Duration(), default=None, nullable=True)
    inner: list[Inner] = field(ListOf(Nested(Inner), min_items=1, max_items=3))
    note: str = field(Text(), default="", wire_name="theNote")


class Child(Outer):
    extra: int = field(Integer(), default=7)


def test_camel_spelling() -> None:
    assert [camel(n) for n in ("queue_name", "utf8", "id", "max_leased_per_group")] == [
        "queueName",
        "utf8",
        "id",
        "maxLeasedPerGroup",
    ]


def test_a_field_declared_without_field_is_refused_at_class_creation() -> None:
    with pytest.raises(TypeError, match=r"Broken\.size: declare message fields with field"):

        class Broken(Message):
            size: int = 3


def test_fields_keep_declaration_order_and_subclasses_append() -> None:
    assert [f.name for f in Child.fields] == ["name", "wait", "inner", "note", "extra"]
    assert set(Child.keys) == {"name", "wait", "inner", "note", "theNote", "extra"}
    assert set(Inner.keys) == {"size"}


def test_the_json_schema_says_what_validation_does() -> None:
    defs: dict[str, Any] = {}
    assert Outer.schema_ref(defs, REF) == {"$ref": "#/components/schemas/Outer"}
    schema = defs["Outer"]
    assert schema["required"] == ["name", "inner"]
    assert schema["additionalProperties"] is False
    assert schema["description"] == "A message of every shape the schema writer knows."
    properties = schema["properties"]
    assert properties["name"] == {"type": "string", "minLength": 1, "description": "who"}
    assert properties["wait"]["anyOf"][1] == {"type": "null"}
    assert properties["wait"]["default"] is None
    assert properties["inner"] == {
        "type": "array",
        "items": {"$ref": "#/components/schemas/Inner"},
        "minItems": 1,
        "maxItems": 3,
    }
    assert properties["theNote"] == {"type": "string", "default": ""}
    assert defs["Inner"]["properties"]["size"] == {"type": "integer", "minimum": 1}


def test_validation_and_the_schema_agree_on_one_body() -> None:
    message = Outer.from_json(b'{"name": "a", "wait": "1m", "inner": [{"size": 2}], "theNote": "n"}')
    assert (message.name, message.wait, message.inner[0].size, message.note) == (
        "a",
        timedelta(minutes=1),
        2,
        "n",
    )
    assert message.to_wire() == {"name": "a", "wait": "1m0s", "inner": [{"size": 2}], "theNote": "n"}
    assert message.fields_set == {"name", "wait", "inner", "note"}


def test_every_problem_is_named_by_its_place() -> None:
    with pytest.raises(BodyError) as raised:
        Outer.from_json(b'{"name": "", "inner": [{"size": 0}, {"size": "x"}, 5]}')
    assert [p.where for p in raised.value.problems] == ["name", "inner[0].size", "inner[1].size", "inner[2]"]
    assert not raised.value.not_understood
    with pytest.raises(BodyError) as raised:
        Outer.from_json(b'{"name": "a", "inner": [{"size": 1, "colour": 1}]}')
    assert raised.value.not_understood
    assert str(raised.value) == "inner[0].colour: unknown key"
