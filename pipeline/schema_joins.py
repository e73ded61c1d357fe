"""The `join:` operator of the pipeline file's model (`join_schema`): its keys, types and
rules. Part of `schema.py`'s model, kept apart for its size."""

from __future__ import annotations

from typing import Any

from streamer.pipeline.model import (
    Bool,
    Checker,
    Field,
    ListOf,
    Obj,
    OneOrList,
    SignedDuration,
    Str,
)
from streamer.pipeline.schema_base import COLUMN_HINT, COLUMN_PATTERN, _exactly_one
from streamer.pipeline.units import parse_signed_duration_ms
from streamer.pipeline.yaml_loader import Path

JOIN_TYPES = ("inner", "left", "right", "full")
JOIN_MODES = ("between", "window", "table")


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
    _exactly_one(JOIN_MODES, "a join")(value, path, ck)
    if value.get("table") is not None and "between" not in value and "window" not in value:
        ck.report((*path, "table"), "table joins (enrichment) are not available yet in this "
                  "version of streamer; use between: [lower, upper] (an interval join) or "
                  "window: (a window join)", at_key=True)
    between = value.get("between")
    if isinstance(between, list) and len(between) != 2:
        ck.report((*path, "between"), f"between must be [lower, upper] (two durations), got "
                  f"{len(between)} value(s)")
    elif isinstance(between, list):
        lower, upper = (parse_signed_duration_ms(v) for v in between)
        if lower is not None and upper is not None and lower > upper:
            ck.report((*path, "between"), f"between's lower bound ({between[0]}) must not be "
                      f"after its upper bound ({between[1]})")


def _join_window(window: Obj, sliding_rule: Any) -> Obj:
    return Obj(
        {key: window.fields[key] for key in ("tumbling", "sliding")},
        "The window of a window join: records of both sides in the same window and key join "
        "when the window closes; exactly one of tumbling, sliding.",
        rules=[_exactly_one(("tumbling", "sliding"), "a join's window"), sliding_rule],
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
                              "their partner can no longer arrive.", enum=JOIN_TYPES)),
            "between": Field(ListOf(SignedDuration(), "Interval join: [lower, upper]; a right "
                                    "record joins a left record when right event time - left "
                                    "event time is within these bounds (inclusive), e.g. [0s, 30m] "
                                    "or [-10m, 5m].")),
            "window": Field(_join_window(window, sliding_rule)),
            "table": Field(Bool("The right side is a table (enrichment); not available yet.")),
            "right_prefix": Field(Str("Prepended to the right side's column names in the output "
                                      "(resolves name clashes), e.g. 'payment_'.",
                                      pattern=r"[A-Za-z_][A-Za-z0-9_]*",
                                      pattern_hint=COLUMN_HINT)),
        },
        "Joins two keyed inputs on event time: exactly one of between (interval join), window "
        "(window join), table.",
        rules=[_join_rules],
    )
