"""HTTP wire layer: what a message is, in plain Python.

A message class declares its fields with ``field(kind, ...)``; this module gives it a constructor,
validation of a decoded JSON body into an instance (every problem named by its place in the body),
the JSON-ready form of an instance (``to_wire``) and its JSON Schema (for the OpenAPI document). One
definition serves all four, so what the handlers accept and what the document says cannot drift.

It replaces pydantic on the functions' path: importing pydantic and defining the wire models with it
cost about 0.55x ``import boto3`` of every cold start, more than the rest of our code together
(docs/adr/0014-plain-python-wire-layer.md). Only what the contract needs is here: strings, integers,
booleans, Go durations, RFC 3339 timestamps, base64, lists, nested messages and ``null``.
"""

from __future__ import annotations

import base64
import inspect
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeVar

from querator.api.durations import format_duration, format_timestamp, parse_duration, parse_timestamp
from querator.domain.errors import InvalidRequestError

if TYPE_CHECKING:
    from typing_extensions import Self, dataclass_transform
else:
    # Only the type checker reads it (PEP 681): at run time the decorator would cost an import.
    def dataclass_transform(**_: object) -> Callable[[type], type]:
        return lambda cls: cls


#: Where a value is in a body: keys and list indexes, outermost first.
Loc = tuple[str | int, ...]
MessageT = TypeVar("MessageT", bound="Message")

#: A problem that means "the body is not a message we understand" (455), not "a value is wrong" (400).
UNKNOWN_KEY: Final = "unknown_key"
NOT_AN_OBJECT: Final = "not_an_object"
INVALID: Final = "invalid"

#: Integers may come as JSON numbers with no fraction or as decimal strings ("5", "5.0"), as before
#: (pydantic's lax mode); a cap on digits keeps a hostile string from costing big-integer work.
_INTEGER_TEXT: Final = re.compile(r"\s*([+-]?[0-9]{1,30})(?:\.0*)?\s*")
_TRUE_TEXT: Final = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE_TEXT: Final = frozenset({"0", "off", "f", "false", "n", "no"})
#: The JSON escape of a UTF-16 surrogate; only a body that has one can hold a lone surrogate.
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]")


class _RepeatedKeys(dict):  # type: ignore[type-arg]
    """A JSON object that gave a key more than once: its last values, and which keys repeated.

    ``json.loads`` keeps the last value silently, so a body naming two queues would go to the second;
    ``Message.validate`` refuses one of these (400, naming each key where it is in the body).
    """

    repeated: tuple[str, ...] = ()


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads' object_pairs_hook: the C decoder hands each object's pairs over as a list.
    data = dict(pairs)
    if len(data) == len(pairs):
        return data
    seen: set[str] = set()
    twice: dict[str, None] = {}
    for key, _ in pairs:
        if key in seen:
            twice[key] = None
        seen.add(key)
    repeated = _RepeatedKeys(data)
    repeated.repeated = tuple(twice)
    return repeated


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


#: A field's default when it has none: the field is required.
MISSING: Final[Any] = _Missing()


class Problem:
    """One thing wrong with a body: where, which sort (``UNKNOWN_KEY``, ``NOT_AN_OBJECT``, ``INVALID``)
    and what, in words."""

    __slots__ = ("kind", "loc", "message")

    def __init__(self, loc: Loc, kind: str, message: str) -> None:
        self.loc = loc
        self.kind = kind
        self.message = message

    @property
    def not_understood(self) -> bool:
        """A key the message does not define, or a body that is not an object: not a wrong value."""
        return self.kind == UNKNOWN_KEY or (self.kind == NOT_AN_OBJECT and not self.loc)

    @property
    def where(self) -> str:
        """``items[1].bytes``: the snake_case path of the value."""
        text = ""
        for part in self.loc:
            text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
        return text

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.loc else self.message

    def __repr__(self) -> str:
        return f"Problem({self.loc!r}, {self.kind!r}, {self.message!r})"


class BodyError(Exception):
    """A body that is not JSON (``problems`` empty, the reason in the message) or not the message."""

    def __init__(self, problems: Sequence[Problem], reason: str = "") -> None:
        super().__init__(reason or "; ".join(map(str, problems)))
        self.problems = tuple(problems)
        #: Not JSON at all (a parse error, a lone surrogate), or the top level is not an object, or
        #: a key the message does not define: the body is not understood (455).
        self.not_understood = not problems or any(p.not_understood for p in problems)


class InvalidValueError(Exception):
    """Raised by a kind's or a message's check: the value is wrong, and why."""


# -- kinds of value -----------------------------------------------------------------------------------


class Kind:
    """How one sort of value is read from JSON, written back, and described in JSON Schema."""

    #: ``dump`` is the identity: ``to_wire`` skips the call.
    plain: bool = True
    #: ``convert`` reads the whole value (no nested places): callers skip building its place unless
    #: it is wrong, which is most of the cost of a 1,000-item body.
    leaf: bool = True

    def convert(self, value: object) -> Any:
        """The Python value of a JSON value; raises ``InvalidValueError``."""
        raise NotImplementedError

    def validate(self, value: object, loc: Loc, problems: list[Problem]) -> Any:
        """``convert``, with a wrong value recorded in ``problems`` (returns ``MISSING`` then)."""
        try:
            return self.convert(value)
        except InvalidValueError as exc:
            problems.append(Problem(loc, INVALID, str(exc)))
            return MISSING

    def dump(self, value: Any) -> Any:
        """The JSON value of a Python value."""
        return value

    def schema(self, defs: dict[str, Any], ref: str) -> dict[str, Any]:
        """This kind's JSON Schema; nested messages go into ``defs`` and are referenced by ``ref``."""
        raise NotImplementedError


class Text(Kind):
    """A JSON string, ``min_length`` characters or more, then ``check`` (which raises
    ``InvalidRequestError`` with the reason, or returns the value to keep)."""

    def __init__(self, *, min_length: int = 0, check: Callable[[str], str] | None = None) -> None:
        self.min_length = min_length
        self.check = check

    def convert(self, value: object) -> str:
        if type(value) is not str:
            raise InvalidValueError("Input should be a valid string")
        if len(value) < self.min_length:
            raise InvalidValueError(f"String should have at least {self.min_length} character(s)")
        if self.check is not None:
            try:
                return self.check(value)
            except InvalidRequestError as exc:
                raise InvalidValueError(str(exc)) from exc
        return value

    def schema(self, defs: dict[str, Any], ref: str) -> dict[str, Any]:
        return {"type": "string", "minLength": self.min_length} if self.min_length else {"type": "string"}


class Choice(Kind):
    """One of a few strings, exactly."""

    def __init__(self, values: Sequence[str], message: str) -> None:
        self.values = tuple(values)
        self.message = message

    def convert(self, value: object) -> str:
        if type(value) is not str or value not in self.values:
            raise InvalidValueError(self.message)
        return value

    def schema(self, defs: dict[str, Any], ref: str) -> dict[str, Any]:
        return {"type": "string", "enum": list(self.values)}


class Integer(Kind):
    """An integer in ``[ge, le]``. ``strict``: a JSON integer only; otherwise also a number with no
    fraction (``5.0``) or a decimal string (``"5"``), as the API took them before. Never a boolean."""

    def __init__(self, *, ge: int | None = None, le: int | None = None, strict: bool = False) -> None:
        self.ge = ge
        self.le = le
        self.strict = strict

    def convert(self, value: object) -> int:
        if type(value) is not int:
            value = self._lax(value)
        if self.ge is not None and value < self.ge:
            raise InvalidValueError(f"Input should be greater than or equal to {self.ge}")
        if self.le is not None and value > self.le:
            raise InvalidValueError(f"Input should be less than or equal to {self.le}")
        return value

    def _lax(self, value: object) -> int:
        if not self.strict:
            if type(value) is float and value.is_integer():
                return int(value)
            if type(value) is str and (match := _INTEGER_TEXT.fullmatch(value)):
                return int(match.group(1))
        raise InvalidValueError("Input should be a valid integer")

    def schema(self, defs: dict[str, Any], ref: str) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "integer"}
        if self.ge is not None:
            schema["minimum"] = self.ge
        if self.le is not None:
            schema["maximum"] = self.le
        return schema


class Number(Kind):
    """A JSON number (integer or fraction) in ``[ge, le]``, as a float. Never a boolean or a string."""

    def __init__(self, *, ge: float | None = None, le: float | None = None) -> None:
        self.ge = ge
        self.le = le

    def convert(self, value: object) -> float:
        if type(value) not in (int, float) or not math.isfinite(value):  # type: ignore[arg-type]
            raise InvalidValueError("Input should be a valid number")
        number = float(value)  # type: ignore[arg-type]
        if self.ge is not None and number < self.ge:
            raise InvalidValueError(f"Input should be greater than or equal to {self.ge:g}")
        if self.le is not None and number > self.le:
            raise InvalidValueError(f"Input should be less than or equal to {self.le:g}")
        return number

    def schema(self, defs: dict[str, Any], ref: str) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "number"}
        if self.ge is not None:
            schema["minimum"] = self.ge
        if self.le is not None:
            schema["maximum"] = self.le
        return schema


class Boolean(Kind):
    """``true`` / ``false``; also 0 / 1 and the usual words ("yes", "off"), as the API took them."""

    def convert(self, value: object) -> bool:
        if type(value) is bool:
            return value
        if type(value) in (int, float) and value in (0, 1):
            return bool(value)
        if type(value) is str:
            word = value.strip().lower()
            if word in _TRUE_TEXT:
                return True
            if word in _FALSE_TEXT:
                return False
        raise InvalidValueError("Input should be a valid boolean")

    def schema(self, defs: dict[str, Any], ref: str) -> dict[str, Any]:
        return {"type": "boolean"}


class _Formatted(Kind):
    """A value with a string form: ``parse`` reads it (raising ``InvalidRequestError`` with the
    reason), ``dump`` writes it; anything but a string is ``wrong_type``."""

    plain = False
    wrong_type: str

    def parse(self, text: str) -> Any:
        raise NotImplementedError

    def convert(self, value: object) -> Any:
        if type(value) is not str:
            raise InvalidValueError(self.wrong_type)
        try:
            return self.parse(value)
        except InvalidRequestError as exc:
            raise InvalidValueError(str(exc)) from exc


class Duration(_Formatted):
    """A Go duration string on the wire (``"1m30s"``), a ``timedelta`` in Python."""

    wrong_type = "must be a Go duration string such as '30s' or '1h30m'"

    def __init__(self, *, non_negative: bool = False) -> None:
        self.non_negative = non_negative

    def parse(self, text: str) -> timedelta:
        value = parse_duration(text)
        if self.non_negative and value < timedelta(0):
            raise InvalidRequestError(f"must not be negative, not {text!r}")
        return value

    def dump(self, value: timedelta) -> str:
        return format_duration(value)

    def schema(self, defs: dict[str, Any], ref: str) -> dict[str, Any]:
        if self.non_negative:
            return {
                "type": "string",
                "description": "Go duration, 0 or more, such as '30s'",
                "examples": ["30s"],
            }
        return {"type": "string", "description": "Go duration such as '30s' or '1h30m'", "examples": ["1m0s"]}


class Timestamp(_Formatted):
    """An RFC 3339 string on the wire (written in UTC with ``Z``), an aware ``datetime`` in Python."""

    wrong_type = "must be an RFC 3339 string such as '2026-11-22T05:33:11Z'"

    def parse(self, text: str) -> datetime:
        return parse_timestamp(text)

    def dump(self, value: datetime) -> str:
        return format_timestamp(value)

    def schema(self, defs: dict[str, Any], ref: str) -> dict[str, Any]:
        return {"type": "string", "format": "date-time", "examples": ["2026-11-22T05:33:11.123456Z"]}


class Base64(Kind):
    """Standard base64 on the wire (padding optional on input, as protojson), ``bytes`` in Python."""

    plain = False

    def convert(self, value: object) -> bytes:
        if type(value) is not str:
            raise InvalidValueError("must be a standard base64 string")
        padded = value + "=" * (-len(value) % 4)
        try:
            return base64.b64decode(padded, validate=True)
        except ValueError as exc:  # binascii.Error, or a character outside ASCII
            raise InvalidValueError(f"invalid standard base64: {exc}") from exc

    def dump(self, value: bytes) -> str:
        return base64.b64encode(value).decode("ascii")

    def schema(self, defs: dict[str, Any], ref: str) -> dict[str, Any]:
        return {"type": "string", "contentEncoding": "base64"}


class ListOf(Kind):
    """A JSON array of ``min_items`` to ``max_items`` values of one kind."""

    leaf = False

    def __init__(self, item: Kind, *, min_items: int = 0, max_items: int | None = None) -> None:
        self.item = item
        self.min_items = min_items
        self.max_items = max_items
        self.plain = item.plain

    def validate(self, value: object, loc: Loc, problems: list[Problem]) -> Any:
        if type(value) is not list:
            problems.append(Problem(loc, INVALID, "Input should be a valid list"))
            return MISSING
        if len(value) < self.min_items:
            problems.append(Problem(loc, INVALID, f"List should have at least {self.min_items} item(s)"))
            return MISSING
        if self.max_items is not None and len(value) > self.max_items:
            problems.append(
                Problem(loc, INVALID, f"List should have at most {self.max_items} items, not {len(value)}")
            )
            return MISSING
        item = self.item
        if item.leaf:
            try:
                return [item.convert(v) for v in value]
            except InvalidValueError:
                pass  # the slow way, to name every wrong value
        before = len(problems)
        converted = [item.validate(v, (*loc, i), problems) for i, v in enumerate(value)]
        return MISSING if len(problems) > before else converted

    def dump(self, value: Sequence[Any]) -> list[Any]:
        dump = self.item.dump
        return [dump(v) for v in value]

    def schema(self, defs: dict[str, Any], ref: str) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "array", "items": self.item.schema(defs, ref)}
        if self.min_items:
            schema["minItems"] = self.min_items
        if self.max_items is not None:
            schema["maxItems"] = self.max_items
        return schema


class Nested(Kind):
    """A JSON object that is another message."""

    plain = False
    leaf = False

    def __init__(self, message: type[Message]) -> None:
        self.message = message

    def validate(self, value: object, loc: Loc, problems: list[Problem]) -> Any:
        return self.message.validate(value, loc, problems)

    def dump(self, value: Message) -> dict[str, Any]:
        return value.to_wire()

    def schema(self, defs: dict[str, Any], ref: str) -> dict[str, Any]:
        return self.message.schema_ref(defs, ref)


# -- fields and messages ------------------------------------------------------------------------------


class Field:
    """One field of a message: its kind, default (``MISSING``: required), whether ``null`` is taken
    (as ``None``), its description, and the key it is written under when that is not its name."""

    __slots__ = ("alias", "default", "description", "kind", "name", "nullable")

    def __init__(self, kind: Kind, default: Any, nullable: bool, description: str, alias: str | None) -> None:
        self.kind = kind
        self.default = default
        self.nullable = nullable
        self.description = description
        self.alias = alias
        self.name = ""

    @property
    def required(self) -> bool:
        return self.default is MISSING

    def schema(self, defs: dict[str, Any], ref: str) -> dict[str, Any]:
        schema = self.kind.schema(defs, ref)
        if self.nullable:
            schema = {"anyOf": [schema, {"type": "null"}]}
        if self.description:
            schema = {**schema, "description": self.description}
        if self.default is None:
            # A reply leaves a None field out; only a request that takes null says so.
            if self.nullable:
                schema["default"] = None
        elif not self.required:
            schema["default"] = self.kind.dump(self.default)
        return schema


def field(
    kind: Kind,
    *,
    default: Any = MISSING,
    nullable: bool = False,
    description: str = "",
    wire_name: str | None = None,
) -> Any:
    """Declare a message field (typed ``Any`` so the annotation says the Python type)."""
    return Field(kind, default, nullable, description, wire_name)


def camel(name: str) -> str:
    """``queue_name`` → ``queueName``: the second spelling every request key is accepted in."""
    first, *rest = name.split("_")
    return first + "".join(part.capitalize() for part in rest)


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(field,))
class Message:
    """Base of every request and response body: fields declared with ``field``, immutable."""

    #: Every field, the base classes' first.
    fields: ClassVar[tuple[Field, ...]] = ()
    #: Every key a body may use (the name, its ``wire_name``, and for requests its camelCase), to the field.
    keys: ClassVar[Mapping[str, Field]] = {}
    #: Requests accept camelCase keys too; responses write the names (or a field's ``wire_name``).
    camel_case_keys: ClassVar[bool] = False

    #: The fields the body (or the constructor) gave; the others have their defaults.
    fields_set: frozenset[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own: list[Field] = []
        for name, annotation in inspect.get_annotations(cls).items():
            if str(annotation).startswith(("ClassVar", "typing.ClassVar")):
                continue
            declared = cls.__dict__.get(name)
            if not isinstance(declared, Field):
                raise TypeError(f"{cls.__name__}.{name}: declare message fields with field(...)")
            declared.name = name
            own.append(declared)
            # Left on the class, a Field would read as the value of an instance that lacks one.
            delattr(cls, name)
        inherited = [f for f in cls.fields if f.name not in {o.name for o in own}]
        cls.fields = (*inherited, *own)
        keys: dict[str, Field] = {}
        for f in cls.fields:
            keys[f.name] = f
            if f.alias:
                # The key the schema documents is read too (the name stays accepted).
                keys[f.alias] = f
            if cls.camel_case_keys:
                keys.setdefault(camel(f.name), f)
        cls.keys = keys

    def __init__(self, **values: Any) -> None:
        given = frozenset(values)
        for f in self.fields:
            value = values.pop(f.name, f.default)
            if value is MISSING:
                raise TypeError(f"{type(self).__name__}: missing field {f.name!r}")
            self.__dict__[f.name] = value
        if values:
            raise TypeError(f"{type(self).__name__}: no field(s) {', '.join(map(repr, values))}")
        self.__dict__["fields_set"] = given

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in self.fields)

    __hash__ = None  # type: ignore[assignment]  # equal by value, and lists inside: not hashable

    def __repr__(self) -> str:
        values = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in self.fields)
        return f"{type(self).__name__}({values})"

    def check(self) -> None:
        """Rules across fields, run after each field is valid; raise ``InvalidValueError`` to refuse."""

    # -- reading ---------------------------------------------------------------------------------------

    @classmethod
    def validate(cls, data: object, loc: Loc, problems: list[Problem]) -> Self | Any:
        """The message of a decoded JSON value, or ``MISSING`` with what is wrong in ``problems``."""
        before = len(problems)
        if type(data) is not dict:
            if type(data) is not _RepeatedKeys:
                problems.append(Problem(loc, NOT_AN_OBJECT, "Input should be an object"))
                return MISSING
            problems.extend(Problem((*loc, k), INVALID, "key given more than once") for k in data.repeated)
        keys = cls.keys
        given: dict[str, object] = {}
        #: The spelling each field was first given in (``queueName`` or ``queue_name``).
        spelt: dict[str, str] = {}
        for key, raw in data.items():
            declared = keys.get(key)
            if declared is None:
                problems.append(Problem((*loc, key), UNKNOWN_KEY, _unknown_key(key, cls.fields)))
            elif declared.name in given:
                first = spelt[declared.name]
                problems.append(
                    Problem((*loc, declared.name), INVALID, f"given twice, as {first!r} and {key!r}")
                )
            else:
                given[declared.name] = raw
                spelt[declared.name] = key
        values: dict[str, Any] = {}
        for f in cls.fields:
            raw = given.get(f.name, MISSING)
            if raw is MISSING:
                if f.default is MISSING:
                    problems.append(Problem((*loc, f.name), INVALID, "Field required"))
                values[f.name] = f.default
            elif raw is None and f.nullable:
                values[f.name] = None
            elif f.kind.leaf:
                try:
                    values[f.name] = f.kind.convert(raw)
                except InvalidValueError as exc:
                    problems.append(Problem((*loc, f.name), INVALID, str(exc)))
            else:
                values[f.name] = f.kind.validate(raw, (*loc, f.name), problems)
        if len(problems) > before:
            return MISSING
        message = cls.__new__(cls)
        message.__dict__.update(values)
        message.__dict__["fields_set"] = frozenset(given)
        try:
            message.check()
        except InvalidValueError as exc:
            problems.append(Problem(loc, INVALID, str(exc)))
            return MISSING
        return message

    @classmethod
    def from_json(cls, body: bytes, *, queue_name: str | None = None) -> Self:
        """Decode a UTF-8 JSON body into this message.

        ``queue_name``: the queue of a scoped route's path. The body may leave its ``queue_name`` out
        (the path's is used) or give the same one; another one is a wrong value (400), so a caller
        granted one queue cannot reach another through the body.

        Raises
        ------
        BodyError
            The body is not JSON, or is not this message (each problem named).
        """
        try:
            text = body.decode("utf-8")
            if text.startswith("\ufeff"):  # what json.loads says of it; the decoder alone would not
                raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
            data = _DECODER.decode(text)
        except ValueError as exc:  # also UnicodeDecodeError
            raise BodyError((), f"invalid JSON: {exc}") from exc
        except RecursionError as exc:
            # "[[[[..." a hundred thousand deep: the decoder recurses once per level.
            raise BodyError((), "invalid JSON: nested too deeply") from exc
        if _SURROGATE_ESCAPE.search(body) and _has_lone_surrogate(data):
            # Valid JSON, but such a string has no UTF-8 form: nothing could store or send it back.
            raise BodyError((), "invalid JSON: a string holds a lone UTF-16 surrogate (\\ud800-\\udfff)")
        if queue_name is not None and isinstance(data, dict):
            data = cls._with_queue(data, queue_name)
        problems: list[Problem] = []
        message = cls.validate(data, (), problems)
        if problems:
            raise BodyError(problems)
        return message

    @classmethod
    def _with_queue(cls, data: dict[str, Any], queue_name: str) -> dict[str, Any]:
        """``data`` with the path's queue as its ``queue_name``; a body naming another queue is refused."""
        keys = [key for key, declared in cls.keys.items() if declared.name == "queue_name" and key in data]
        for key in keys:
            if data[key] != queue_name:
                raise BodyError(
                    [
                        Problem(
                            ("queue_name",),
                            INVALID,
                            f"the body names queue {data[key]!r} but the path names {queue_name!r}; "
                            "leave queue_name out of the body or give the path's",
                        )
                    ]
                )
        if not keys:
            data["queue_name"] = queue_name  # in place: the object was decoded for this call alone
        return data

    # -- writing ---------------------------------------------------------------------------------------

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready body: ``None`` fields left out."""
        body: dict[str, Any] = {}
        values = self.__dict__
        for f in self.fields:
            value = values[f.name]
            if value is not None:
                body[f.alias or f.name] = value if f.kind.plain else f.kind.dump(value)
        return body

    # -- describing ------------------------------------------------------------------------------------

    @classmethod
    def schema_ref(cls, defs: dict[str, Any], ref: str) -> dict[str, Any]:
        """``{"$ref": ...}`` to this message's schema, which is added to ``defs`` (with its own)."""
        if cls.__name__ not in defs:
            defs[cls.__name__] = {}  # a placeholder first: a message may refer to itself
            defs[cls.__name__] = cls.json_schema(defs, ref)
        return {"$ref": ref.format(model=cls.__name__)}

    @classmethod
    def json_schema(cls, defs: dict[str, Any], ref: str) -> dict[str, Any]:
        """This message's JSON Schema, keys as written (requests: the snake_case names)."""
        schema: dict[str, Any] = {
            "title": cls.__name__,
            "type": "object",
            "properties": {f.alias or f.name: f.schema(defs, ref) for f in cls.fields},
            "additionalProperties": False,
        }
        required = [f.alias or f.name for f in cls.fields if f.required]
        if required:
            schema["required"] = required
        if cls.__doc__:
            schema["description"] = inspect.cleandoc(cls.__doc__)
        return schema


def _unknown_key(key: str, fields: Sequence[Field]) -> str:
    """``"unknown key; did you mean 'retry_at'"`` when a field's name is near ``key``."""
    import difflib  # noqa: PLC0415 - only a refused body needs it; cold starts do not

    names = [f.alias or f.name for f in fields]
    nearest = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    if not nearest and camel(key) != key:
        nearest = difflib.get_close_matches(key, [camel(name) for name in names], n=1, cutoff=0.6)
    return f"unknown key; did you mean '{nearest[0]}'" if nearest else "unknown key"


def _refuse_constant(name: str) -> Any:
    # json.loads takes NaN and Infinity, which are not JSON.
    raise ValueError(f"{name} is not JSON")


#: Digits Python converts to an ``int`` at most (``sys.get_int_max_str_digits``' default).
_INT_DIGITS = 4300


def _integer(text: str) -> int | float:
    # Valid JSON, but past Python's conversion limit (a guard against quadratic conversion): far out
    # of every field's range anyway, so it is read as an infinity the field refuses by name.
    if len(text.lstrip("-")) > _INT_DIGITS:
        return float("-inf") if text.startswith("-") else float("inf")
    return int(text)


#: ``json.loads`` with these arguments, made once (``loads`` builds a decoder per call when given any).
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_int=_integer, object_pairs_hook=_object)


def _has_lone_surrogate(data: object) -> bool:
    # A stack, not recursion: the decoder took the body, so it may be nested as deep as its limit.
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if _lone(value):
                return True
        elif isinstance(value, dict):
            stack.extend(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


def _lone(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
