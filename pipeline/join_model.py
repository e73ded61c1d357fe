"""An operator's `join:` as a pydantic v2 model (issue 38, item 3): `JoinModel`, its
`table:` and `regular:` modes (each `true` or a mapping of its settings) and its window
(`window_model.JoinWindowModel`). The rules between keys (the key columns, exactly one mode,
what each mode allows) are functions over the raw mapping, run after pydantic
(`join_rules`), as the sources' and sinks' are (docs/decisions/pydantic.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

from pydantic import Discriminator, Field, PlainValidator, Tag, TypeAdapter, WithJsonSchema
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from streamer.pipeline.checker import Checker, type_name
from streamer.pipeline.schema_base import COLUMN_HINT, COLUMN_PATTERN, exactly_one
from streamer.pipeline.units import DURATION_HINT, parse_signed_duration_ms
from streamer.pipeline.window_model import JoinWindowModel, join_window_rules
from streamer.pipeline.yaml_loader import Path
from streamer.pipeline.yaml_model import Duration, Expects, Text, YamlModel, one_or_list, text

JOIN_MODES = ("between", "window", "table", "regular")
#: The types of this module's errors (`pydantic_bridge` puts the key's name before them).
_DURATION, _TRUE_OR = "duration", "true_or"
_SIGNED = r"^\s*-?\d+(\.\d+)?\s*(ms|s|m|h|d)\s*$"


def _signed(value: Any) -> Any:
    if parse_signed_duration_ms(value) is None:
        raise PydanticCustomError(_DURATION, "must be {hint}, optionally with a leading '-', "
                                  "got {got}", {"hint": DURATION_HINT, "got": type_name(value)})
    return value


def true_or(model: type[YamlModel], meaning: str, description: str) -> Any:
    """A join mode that is `true` or a mapping of its settings (`table: {as_of: ...}`,
    `regular: {ttl: ...}`); `meaning` says what each spelling does, for the error."""
    def only_true(value: Any) -> Any:
        if value is not True:
            got = "false" if value is False else type_name(value)
            raise PydanticCustomError(_TRUE_OR, "{message}",
                                      {"message": f"must be {meaning}, got {got}"})
        return value
    schema = {"anyOf": [{"type": "boolean"}, TypeAdapter(model).json_schema()],
              "description": description}
    return Annotated[Annotated[model, Tag("mapping")]
                     | Annotated[bool, PlainValidator(only_true), Tag("true")],
                     Discriminator(lambda v: "mapping" if isinstance(v, dict) else "true"),
                     Expects(f"must be {meaning}"), WithJsonSchema(schema)]


class TableModel(YamlModel):
    """A temporal table join."""

    as_of: Literal["event_time"] = Field(
        description="event_time: each left record joins the version of its key's row as of "
        "the record's event time (a temporal join).")


class RegularModel(YamlModel):
    """A regular join with a state TTL."""

    ttl: Duration = Field(
        description="How long a record is kept, in event time: it joins records up to this "
        "far before or after it, and is forgotten (an outer side's unmatched record emitted "
        "with nulls) once the watermark passes its time + ttl.")


if TYPE_CHECKING:  # what they validate to; pydantic reads the types below
    Columns: TypeAlias = str | list[str]
    SignedDuration: TypeAlias = str
    Prefix: TypeAlias = str
    TableMode: TypeAlias = bool | TableModel
    RegularMode: TypeAlias = bool | RegularModel
else:
    Columns = one_or_list(text(pattern=COLUMN_PATTERN, hint=COLUMN_HINT), "column")
    #: A duration that may be negative or zero, such as `-10m`, kept as written.
    SignedDuration = Annotated[str, PlainValidator(_signed),
                               WithJsonSchema({"type": "string", "pattern": _SIGNED})]
    Prefix = text(pattern=COLUMN_PATTERN, hint=COLUMN_HINT)
    TableMode = true_or(
        TableModel, "true (enrich each left record with the table's current row) or {as_of: "
        "event_time} (a temporal join)",
        "Table join (enrichment): the right side's records are upserts of the row of their "
        "key (latest event time wins, then arrival). true: each left record joins its key's "
        "row when it is processed (a left join: nulls without one); {as_of: event_time}: the "
        "row as of the left record's event time (temporal).")
    RegularMode = true_or(
        RegularModel, "true (keep every record of both sides) or {ttl: <duration>} (keep each "
        "that long)",
        "Regular join (Flink SQL's plain JOIN): every record of one side joins every record "
        "of the other with its key, whatever their times, late ones too. true keeps every "
        "record (state grows with the input; inner joins only); {ttl: 1d} keeps each that "
        "long in event time.")


class JoinModel(YamlModel):
    """Joins two keyed inputs: exactly one of between (interval join), window (window join),
    table (table join: enrichment), regular (a regular join)."""

    left: Text = Field(description="The id of the left input (a source or operator).")
    right: Text = Field(description="The id of the right input (source or operator).")
    on: Columns | SkipJsonSchema[None] = Field(
        default=None, description="Key columns on both sides (once in the output).")
    left_key: Columns | SkipJsonSchema[None] = Field(
        default=None, description="The left's key columns (the output's), + right_key.")
    right_key: Columns | SkipJsonSchema[None] = Field(
        default=None, description="The right's key columns, one per left_key column.")
    type: Literal["inner", "left", "right", "full"] = Field(
        default="inner", description="inner: matched pairs only; left, right, full: also the "
        "unmatched records of that side (both for full), with nulls, once their partner can "
        "no longer arrive (a table join: inner or left).")
    between: list[SignedDuration] | SkipJsonSchema[None] = Field(
        default=None, description="Interval join: [lower, upper]; a right record joins a "
        "left record when right event time - left event time is within these bounds "
        "(inclusive), e.g. [0s, 30m] or [-10m, 5m].")
    window: JoinWindowModel | SkipJsonSchema[None] = None
    table: TableMode | SkipJsonSchema[None] = None
    regular: RegularMode | SkipJsonSchema[None] = None
    right_prefix: Prefix | SkipJsonSchema[None] = Field(
        default=None, description="Prepended to the right side's column names in the output "
        "(resolves name clashes), e.g. 'payment_'.")


def _key_rules(value: dict[str, Any], path: Path, ck: Checker) -> None:
    keys = [k for k in ("on", "left_key", "right_key") if k in value]
    if "on" in value and len(keys) > 1:
        ck.report((*path, keys[1]), f"a join takes either on: or left_key: + right_key:; it "
                  f"has {' and '.join(keys)}", at_key=True)
    elif not keys:
        ck.report(path, "a join needs its key: on: [columns], or left_key: and right_key:")
    elif "on" not in value and len(keys) == 1:
        other = "right_key" if keys[0] == "left_key" else "left_key"
        ck.report((*path, keys[0]), f"{keys[0]!r} needs {other!r} too (one column per key "
                  "column of the other side), or use on: for columns named alike", at_key=True)
    elif "on" not in value:
        n_left, n_right = (len(v) if isinstance(v, list) else 1
                           for v in (value.get("left_key"), value.get("right_key")))
        if n_left != n_right:
            ck.report((*path, "right_key"), f"right_key has {n_right} column(s) but left_key "
                      f"has {n_left}; give one right column per left key column")


def join_rules(value: Any, path: Path, ck: Checker) -> None:
    """The rules of an operator's `join:` (a mapping; anything else pydantic reports)."""
    if not isinstance(value, dict):
        return
    _key_rules(value, path, ck)
    exactly_one(JOIN_MODES, "a join")(value, path, ck)
    if "table" in value and value.get("type") in ("right", "full"):
        ck.report((*path, "type"), f"a table join is inner or left, not {value['type']}: a "
                  "table has no unmatched rows to emit (its rows are upserts of the current "
                  "value of their key); use type: inner or left", at_key=True)
    regular = value.get("regular")
    if regular is True and value.get("type", JoinModel.model_fields["type"].default) != "inner":
        ck.report((*path, "regular"), f"a regular join without a ttl keeps every record "
                  f"forever, so an unmatched {value['type']} record would never be emitted; "
                  "set regular: {ttl: <duration>} (an unmatched record is emitted with nulls "
                  "once its ttl passes), or use type: inner")
    between = value.get("between")
    if isinstance(between, list) and len(between) != 2:
        ck.report((*path, "between"), f"between must be [lower, upper] (two durations), got "
                  f"{len(between)} value(s)")
    elif isinstance(between, list):
        lower, upper = (parse_signed_duration_ms(v) for v in between)
        if lower is not None and upper is not None and lower > upper:
            ck.report((*path, "between"), f"between's lower bound ({between[0]}) must not be "
                      f"after its upper bound ({between[1]})")
    join_window_rules(value.get("window"), (*path, "window"), ck)
