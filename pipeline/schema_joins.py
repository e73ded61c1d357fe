"""The `join:` operator of the pipeline file's model (`join_schema`): its keys, types and
rules. Part of `schema.py`'s model, kept apart for its size."""

from __future__ import annotations

from typing import Any

from streamer.pipeline.model import (
    Checker,
    Duration,
    Field,
    ListOf,
    Node,
    Obj,
    OneOrList,
    SignedDuration,
    Str,
    label,
    type_name,
)
from streamer.pipeline.schema_base import COLUMN_HINT, COLUMN_PATTERN, exactly_one
from streamer.pipeline.units import parse_signed_duration_ms
from streamer.pipeline.yaml_loader import Path

JOIN_TYPES = ("inner", "left", "right", "full")
JOIN_MODES = ("between", "window", "table", "regular")


def _key_columns(doc: str) -> OneOrList:
    return OneOrList(Str(pattern=COLUMN_PATTERN, pattern_hint=COLUMN_HINT), doc, noun="column")


def _join_rules(value: dict[str, Any], path: Path, ck: Checker) -> None:
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
    exactly_one(JOIN_MODES, "a join")(value, path, ck)
    if "table" in value and value.get("type") in ("right", "full"):
        ck.report((*path, "type"), f"a table join is inner or left, not {value['type']}: a "
                  "table has no unmatched rows to emit (its rows are upserts of the current "
                  "value of their key); use type: inner or left", at_key=True)
    regular = value.get("regular")
    if regular is True and value.get("type", "inner") != "inner":
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


#: The spellings of a temporal table join's `as_of:`.
TABLE_AS_OF = ("event_time",)


class TrueOr(Node):
    """A join mode that is `true` or a mapping of its settings (`table: {as_of: ...}`,
    `regular: {ttl: ...}`); `meaning` says what each spelling does, for the error."""

    def __init__(self, description: str, settings: Obj, meaning: str) -> None:
        self.description = description
        self.settings = settings
        self.meaning = meaning

    def check(self, value: Any, path: Path, ck: Checker) -> None:
        """Report a value that is neither true nor the mapping."""
        if isinstance(value, dict):
            self.settings.check(value, path, ck)
        elif value is not True:
            ck.report(path, f"{label(path)} must be {self.meaning}, got "
                      f"{type_name(value) if not isinstance(value, bool) else 'false'}")

    def schema(self) -> dict[str, Any]:
        """true, or the mapping."""
        return self._with_doc({"anyOf": [{"type": "boolean"}, self.settings.schema()]})


def table_mode(description: str) -> TrueOr:
    """`table:` of a join: true (processing-time enrichment) or {as_of: event_time}."""
    return TrueOr(description, Obj({"as_of": Field(Str(
        "event_time: each left record joins the version of its key's row as of the "
        "record's event time (a temporal join).", enum=TABLE_AS_OF), required=True)},
        "A temporal table join."),
        "true (enrich each left record with the table's current row) or {as_of: "
        "event_time} (a temporal join)")


def regular_mode(description: str) -> TrueOr:
    """`regular:` of a join: true (keep every record) or {ttl: duration}."""
    return TrueOr(description, Obj({"ttl": Field(Duration(
        "How long a record is kept, in event time: it joins records up to this far before "
        "or after it, and is forgotten (an outer side's unmatched record emitted with nulls) "
        "once the watermark passes its time + ttl."), required=True)},
        "A regular join with a state TTL."),
        "true (keep every record of both sides) or {ttl: <duration>} (keep each that long)")


def _join_window(window: Obj, sliding_rule: Any) -> Obj:
    return Obj(
        {key: window.fields[key] for key in ("tumbling", "sliding")},
        "The window of a window join: records of both sides in the same window and key join "
        "when the window closes; exactly one of tumbling, sliding.",
        rules=[exactly_one(("tumbling", "sliding"), "a join's window"), sliding_rule],
    )


def join_schema(window: Obj, sliding_rule: Any) -> Obj:
    """The `join:` of an operator; `window` and `sliding_rule` are the windows' (schema.py)."""
    return Obj(
        {
            "left": Field(Str("The id of the left input (a source or operator)."), required=True),
            "right": Field(Str("The id of the right input (source or operator)."), required=True),
            "on": Field(_key_columns("Key columns on both sides (once in the output).")),
            "left_key": Field(_key_columns("The left's key columns (the output's), + right_key.")),
            "right_key": Field(_key_columns("The right's key columns, one per left_key column.")),
            "type": Field(Str("inner (default): matched pairs only; left, right, full: also the "
                              "unmatched records of that side (both for full), with nulls, once "
                              "their partner can no longer arrive (a table join: inner or "
                              "left).", enum=JOIN_TYPES)),
            "between": Field(ListOf(SignedDuration(), "Interval join: [lower, upper]; a right "
                                    "record joins a left record when right event time - left "
                                    "event time is within these bounds (inclusive), e.g. [0s, 30m] "
                                    "or [-10m, 5m].")),
            "window": Field(_join_window(window, sliding_rule)),
            "table": Field(table_mode(
                "Table join (enrichment): the right side's records are upserts of the row of "
                "their key (latest event time wins, then arrival). true: each left record joins "
                "its key's row when it is processed (a left join: nulls without one); "
                "{as_of: event_time}: the row as of the left record's event time (temporal).")),
            "regular": Field(regular_mode(
                "Regular join (Flink SQL's plain JOIN): every record of one side joins every "
                "record of the other with its key, whatever their times, late ones too. true "
                "keeps every record (state grows with the input; inner joins only); {ttl: 1d} "
                "keeps each that long in event time.")),
            "right_prefix": Field(Str("Prepended to the right side's column names in the output "
                                      "(resolves name clashes), e.g. 'payment_'.",
                                      pattern=r"[A-Za-z_][A-Za-z0-9_]*",
                                      pattern_hint=COLUMN_HINT)),
        },
        "Joins two keyed inputs: exactly one of between (interval join), window (window join), "
        "table (table join: enrichment), regular (a regular join).",
        rules=[_join_rules],
    )
