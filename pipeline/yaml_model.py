"""What the pydantic models of the pipeline file share (issue 38, item 3): `YamlModel` (unknown
keys are errors, no coercion, `key:` with no value is an error), and the value types whose
messages are the file's own: durations, non-empty strings, names of a pattern, one value or a
list of them, mappings of name to value and scalars. `pipeline/pydantic_bridge.py` turns each
error into a `file:line:col` line (docs/decisions/pydantic.md).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeAlias

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    Tag,
    TypeAdapter,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)
from pydantic_core import PydanticCustomError

from streamer.pipeline.checker import type_name
from streamer.pipeline.schema_base import ID_HINT, ID_PATTERN, named
from streamer.pipeline.units import DURATION_HINT, DURATION_PATTERN, parse_duration_ms
from streamer.pipeline.yaml_loader import Path

#: The types of the errors this module raises; `pydantic_bridge` reports a `RULE` error at the
#: key its context names (`at`), a `NULL` one with what the key takes, the others at their
#: key with the message as it is.
_DURATION, _BLANK, _PATTERN, _EMPTY, _SCALAR = "duration", "blank", "pattern", "empty", "scalar"
_NUMBER = "number"
NULL, RULE, KEY = "null", "rule", "key"
#: An error whose message is the whole line (an aggregate call's: `unknown aggregate function`).
PLAIN = "plain"


class Fix:
    """The fix that ends every message about a key (`Annotated[int, Fix("...")]`)."""

    def __init__(self, text: str) -> None:
        self.text = text


def _duration(allow_zero: bool) -> Any:
    def check(value: Any) -> int:
        ms = parse_duration_ms(value)
        if ms is None and parse_duration_ms(value, whole=False) is not None:
            raise PydanticCustomError(_DURATION, "must be a whole number of milliseconds, "
                                      "got {got}", {"got": type_name(value)})
        if ms is None:
            raise PydanticCustomError(_DURATION, "must be {hint}, got {got}",
                                      {"hint": DURATION_HINT, "got": type_name(value)})
        if ms == 0 and not allow_zero:
            raise PydanticCustomError(_DURATION, "must be longer than 0")
        return ms
    return BeforeValidator(check)


class Expects:
    """What a key takes, in a message's words, where its type does not say it (a duration is
    an `int` of milliseconds): `'idle_timeout' must be a duration like ..., got nothing`."""

    def __init__(self, text: str) -> None:
        self.text = text


_DURATION_SCHEMA = WithJsonSchema({"type": "string", "pattern": DURATION_PATTERN})
_DURATION_WORDS = Expects(f"must be {DURATION_HINT}")
#: A duration longer than 0 (`10s`), validated into milliseconds.
Duration = Annotated[int, _duration(False), _DURATION_SCHEMA, _DURATION_WORDS]
#: A duration that may be 0 (`0s`).
DurationOrZero = Annotated[int, _duration(True), _DURATION_SCHEMA, _DURATION_WORDS]


def _positive(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PydanticCustomError(_NUMBER, "must be a number, got {got}",
                                  {"got": type_name(value)})
    if value <= 0:
        raise PydanticCustomError(_NUMBER, "must be greater than 0, got {got}", {"got": value})
    return value


#: A number greater than 0, an integer or a decimal, kept as written (`100`, `0.5`).
PositiveNumber = Annotated[int | float, PlainValidator(_positive), Expects("must be a number"),
                           WithJsonSchema({"type": "number", "exclusiveMinimum": 0})]


def not_blank(value: str) -> str:
    """`value`, or a `must not be empty` error when it is blank."""
    if not value.strip():
        raise PydanticCustomError(_BLANK, "must not be empty")
    return value


NonEmptyStr = Annotated[str, Field(min_length=1), BeforeValidator(
    lambda v: not_blank(v) if isinstance(v, str) else v)]


class YamlModel(BaseModel):
    """A mapping of the pipeline file: unknown keys are errors, values are not coerced, and
    a key written with no value (`parallelism:`) is an error, not its default."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    #: How messages name an entry of a list of these by its id: `("sink", "sinks")` gives
    #: `sink 'out'`, else `sinks[2]` (`called`).
    noun: ClassVar[tuple[str, str] | None] = None

    @classmethod
    def called(cls, value: Any, path: Path) -> str | None:
        """How messages name a mapping of this model (`value`, at `path`): by its `noun`
        and id, or None for its label (`'job'`)."""
        return str(named(*cls.noun)(value, path)) if cls.noun else None

    @field_validator("*", mode="before")
    @classmethod
    def _not_null(cls, value: Any, info: ValidationInfo) -> Any:
        """`key:` with no value, for a key whose default is "not set" (None), is refused,
        not read as "not set" (the other keys refuse None by their type); the message says
        what the key takes (`pydantic_bridge`)."""
        if value is None and cls.model_fields[str(info.field_name)].default is None:
            raise PydanticCustomError(NULL, "got nothing (null)")
        return value


#: One adapter per annotation (building one takes milliseconds), by its id: the annotations
#: are module-level objects that live as long as the process.
_ADAPTERS: dict[int, TypeAdapter[Any]] = {}


def adapter(annotation: Any) -> TypeAdapter[Any]:
    """The (one) `TypeAdapter` of `annotation`: a model, or a union of them."""
    found = _ADAPTERS.get(id(annotation))
    if found is None:
        found = _ADAPTERS[id(annotation)] = TypeAdapter(annotation)
    return found


def text(description: str = "", pattern: str | None = None, hint: str = "") -> Any:
    """A non-empty string, matching `pattern` (whole) when given: `'table' '9lives' must be
    <hint>` when it does not."""
    def check(value: Any) -> Any:
        if isinstance(value, str):
            not_blank(value)
            if pattern and not re.fullmatch(pattern, value):
                raise PydanticCustomError(_PATTERN, "{got} must be {hint}",
                                          {"got": repr(value), "hint": hint or pattern})
        return value
    schema: dict[str, Any] = {"type": "string"}
    if pattern:
        schema["pattern"] = f"^{pattern}$"
    schema["minLength"] = 1
    if description:
        schema["description"] = description
    return Annotated[str, BeforeValidator(check), WithJsonSchema(schema)]


def mapping(value: Any, description: str, key_pattern: str, key_hint: str) -> Any:
    """A mapping of user-chosen names (matching `key_pattern`) to `value`s, with at least one
    entry (`fields:`, `schema:`): `name '1x' must be <key_hint>`, at the name."""
    def key(name: Any) -> Any:
        if not isinstance(name, str) or not re.fullmatch(key_pattern, name):
            raise PydanticCustomError(KEY, "name {got} must be {hint}",
                                      {"got": repr(name), "hint": key_hint})
        return name
    schema = {"type": "object", "additionalProperties": TypeAdapter(value).json_schema(),
              "propertyNames": {"pattern": f"^{key_pattern}$"}, "minProperties": 1,
              "description": description}
    return Annotated[dict[Annotated[str, BeforeValidator(key)], value], Field(min_length=1),
                     WithJsonSchema(schema)]


def _one_or_list(value: Any) -> str:
    return "list" if isinstance(value, list) else "one"


def as_tuple(value: str | list[str] | None) -> tuple[str, ...]:
    """A validated `one_or_list` value (or a "not set" None) as a tuple: `a` -> `("a",)`."""
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (value,)


def one_or_list(item: Any, noun: str, *, allow_empty: bool = False) -> Any:
    """One value, or a non-empty list of them (`input: a` or `input: [a, b]`; `[]` too when
    `allow_empty`: `key_by: []`). Only the branch the value's shape picks reports (a
    callable discriminator): `input: 3` is one message, not one per member of the union."""
    def not_empty(value: Any) -> Any:
        if isinstance(value, list) and not value and not allow_empty:
            raise PydanticCustomError(_EMPTY, "must name at least one {noun}", {"noun": noun})
        return value
    one = TypeAdapter(item).json_schema()
    schema = {"anyOf": [one, {"type": "array", "items": one,
                              "minItems": 0 if allow_empty else 1}]}
    return Annotated[Annotated[item, Tag("one")] | Annotated[list[item], Tag("list")],
                     Discriminator(_one_or_list), BeforeValidator(not_empty),
                     WithJsonSchema(schema)]


def _scalar(value: Any) -> Any:
    if isinstance(value, dict | list) or value is None:
        raise PydanticCustomError(_SCALAR, "must be a string, number or boolean, got {got}",
                                  {"got": type_name(value)})
    return value


#: Any string, number or boolean (a client's or an object store's settings, as-is).
Scalar = Annotated[Any, BeforeValidator(_scalar),
                   WithJsonSchema({"type": ["string", "number", "boolean"]})]
#: A mapping of user-chosen names to scalars, passed through as-is.
Settings = dict[Any, Scalar]


def tag(value: str) -> Any:
    """The `type:` of one variant of a discriminated union (`Literal["files"]`)."""
    return Literal[value]


def type_of(value: Any) -> str | None:
    """The variant a source's or sink's mapping names by its `type:`: the callable
    discriminator of their unions (`YamlModel`'s before-validator of every field rules out
    pydantic's `discriminator="type"`)."""
    kind = value.get("type") if isinstance(value, dict) else None
    return None if kind is None else str(kind)


if TYPE_CHECKING:  # what they validate to; pydantic reads the types below
    Id: TypeAlias = str
    Ref: TypeAlias = str
    Text: TypeAlias = str
else:
    Id = text("Unique id in the file.", ID_PATTERN, ID_HINT)
    Ref = text("The id of a source, operator or sink in this file.")
    Text = text()
