"""The pipeline file, version 1, as a model: every key, its type, and the rules between keys.

This is the single description from which `streamer validate` checks files and `streamer
schema` renders JSON Schema. Cross-references (inputs, on_error, cycles) are checked in
`pipeline/validate.py`, and expressions against schemas in `runtime/analyze.py` (it needs Spark).
"""

from __future__ import annotations

import re
from typing import Any

from streamer.pipeline.model import (
    AnyValue,
    Bool,
    Checker,
    Duration,
    Field,
    Int,
    ListOf,
    MapOf,
    Number,
    Obj,
    OneOrList,
    Scalar,
    SignedDuration,
    Str,
    Tagged,
)
from streamer.pipeline.units import parse_duration_ms, parse_signed_duration_ms
from streamer.pipeline.yaml_loader import Path

ID_PATTERN = r"[a-z][a-z0-9_]*"
ID_HINT = "lowercase letters, digits and underscores, starting with a letter"
COLUMN_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"
COLUMN_HINT = "a column name (letters, digits and underscores, not starting with a digit)"

AGGREGATES = {  # name -> number of arguments
    "count": 0, "sum": 1, "min": 1, "max": 1, "avg": 1, "first": 1, "last": 1,
    "collect_list": 1, "count_distinct": 1,
}
_AGG_CALL = re.compile(r"^\s*([A-Za-z_]\w*)\s*\(", re.S)


def parse_aggregate(text: str) -> tuple[str, str | None] | None:
    """`sum(amount)` -> ("sum", "amount"); `count()` -> ("count", None); None unless the text
    is exactly one call (`max(x) - min(x)` is two).
    """
    match = _AGG_CALL.match(text)
    if not match:
        return None
    depth, quote = 0, ""
    for i in range(match.end() - 1, len(text)):
        ch = text[i]
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                if text[i + 1:].strip():
                    return None
                arg = text[match.end():i].strip()
                return match.group(1).lower(), (arg or None if arg != "*" else None)
    return None


def _named(kind: str, plural: str) -> Any:
    def what(value: Any, path: Path) -> str:
        if isinstance(value, dict) and isinstance(value.get("id"), str):
            return f"{kind} {value['id']!r}"
        index = path[-1] if path else 0
        return f"{plural}[{index}]"
    return what


def _exactly_one(keys: tuple[str, ...], noun: str) -> Any:
    def rule(value: dict[str, Any], path: Path, ck: Checker) -> None:
        present = [k for k in keys if k in value]
        if len(present) == 1:
            return
        what = f"{noun}"
        if not present:
            ck.report(path, f"{what} needs exactly one of {', '.join(keys)}")
        else:
            ck.report((*path, present[1]), f"{what} needs exactly one of {', '.join(keys)}; "
                      f"it has {' and '.join(present)}", at_key=True)
    return rule


# ---------------------------------------------------------------------------------- sources
ID = Str(description="Unique id in the file.", pattern=ID_PATTERN, pattern_hint=ID_HINT)
REF = Str(description="The id of a source, operator or sink in this file.")
EXPR = Str(description="A Spark SQL expression.")
SPARK_TYPE = Str(description="A Spark SQL type name: string, bigint, double, timestamp, "
                 "decimal(10,2), array<string>, ...")

WATERMARK = Obj(
    {
        "max_out_of_orderness": Field(Duration("How late an event may arrive behind the "
                                               "newest one seen on its split.", allow_zero=True)),
        "idle_timeout": Field(Duration("A split with no records for this long is left out "
                                       "of the watermark.")),
    },
    description="Event-time watermark: per split, max event time - max_out_of_orderness.",
)

SOURCE_COMMON: dict[str, Field] = {
    "id": Field(ID, required=True),
    "uid": Field(Str("Stable identity of this source's offsets in checkpoints and savepoints "
                     "(default: the id).")),
    "schema": Field(MapOf(SPARK_TYPE, "Columns and their Spark SQL types, in order.",
                          key_pattern=COLUMN_PATTERN, key_hint=COLUMN_HINT, min_items=1)),
    "event_time": Field(Str("A column or expression of type timestamp: the "
                                       "record's event time.")),
    "watermark": Field(WATERMARK),
    "on_error": Field(Str("The id of a sink that receives records this source cannot "
                          "decode (the dead-letter output).")),
}


def _source(fields: dict[str, Field], doc: str, rules: list[Any] | None = None) -> Obj:
    return Obj({**SOURCE_COMMON, **fields}, description=doc, what=_named("source", "sources"),
               extra_keys=("type",), rules=rules or [])


def _watermark_needs_event_time(value: dict[str, Any], path: Path, ck: Checker) -> None:
    if "watermark" in value and "event_time" not in value:
        ck.report((*path, "watermark"), f"{_named('source', 'sources')(value, path)} has a "
                  "watermark but no event_time; add event_time: <timestamp column>", at_key=True)


DATAGEN = _source(
    {
        "splits": Field(Int("Number of parallel splits (default 1).", minimum=1)),
        "rows_per_second": Field(Number("Total rate over all splits; absent = as fast as "
                                        "possible.")),
        "limit": Field(Int("Rows per split; absent = unbounded.", minimum=0)),
        "max_records_per_epoch": Field(Int("At most this many rows per epoch over all "
                                           "splits.", minimum=1)),
        "fields": Field(MapOf(EXPR, "Columns as Spark SQL expressions of `offset`, "
                              "`split` and `generated_at`.", key_pattern=COLUMN_PATTERN,
                              key_hint=COLUMN_HINT, min_items=1), required=True),
    },
    "Deterministic rows computed from (split, offset).",
    [_watermark_needs_event_time],
)


def _datagen_rules(value: dict[str, Any], path: Path, ck: Checker) -> None:
    if "schema" in value:
        ck.report((*path, "schema"), "a datagen source takes its schema from `fields`; "
                  "remove `schema` (cast in the field expressions instead)", at_key=True)


DATAGEN.rules.append(_datagen_rules)

FILES_SOURCE = _source(
    {
        "path": Field(Str("fsspec URL or glob of the input files."), required=True),
        "format": Field(Str("File format; `text` gives one column `line` per line.",
                            enum=("jsonl", "csv", "parquet", "text")), required=True),
        "watch": Field(Bool("Watch for new files (unbounded); default false.")),
        "header": Field(Bool("CSV only: the first line names the columns (default true).")),
        "delimiter": Field(Str("CSV only: the field separator (default ',').")),
        "max_files_per_epoch": Field(Int("At most this many new files per epoch.", minimum=1)),
    },
    "Files read in name order; with watch: true, new files are picked up as they appear.",
    [_watermark_needs_event_time],
)


def _files_source_rules(value: dict[str, Any], path: Path, ck: Checker) -> None:
    if value.get("format") == "text":
        for key in ("schema", "on_error"):
            if key in value:
                ck.report((*path, key), f"format: text has one column `line` and cannot fail "
                          f"to decode; remove {key!r}", at_key=True)
    if value.get("format") != "csv":
        for key in ("header", "delimiter"):
            if key in value:
                ck.report((*path, key), f"{key!r} applies only to format: csv", at_key=True)


FILES_SOURCE.rules.append(_files_source_rules)

KAFKA_SOURCE = _source(
    {
        "bootstrap_servers": Field(Str("host:port[,host:port]"), required=True),
        "topic": Field(Str("Topic to read.")),
        "topics": Field(ListOf(Str(), "Topics to read.", min_items=1)),
        "start": Field(Str("Where a new job starts reading.", enum=("earliest", "latest"))),
        "format": Field(Str("Value format.", enum=("json", "raw"))),
        "properties": Field(MapOf(Scalar(), "Passed to the Kafka client as-is.")),
        "bounded": Field(Bool("Stop at the partitions' end offsets read when the job starts "
                              "(smoke runs); default false.")),
        "client": Field(Str("How partitions are read: confluent-kafka in the Spark tasks "
                            "(default) or Spark's own Kafka connector.",
                            enum=("confluent", "spark"))),
        "record_timestamp": Field(Str("Add the Kafka record timestamp as this column (use it "
                                      "as event_time).", pattern=COLUMN_PATTERN,
                                      pattern_hint=COLUMN_HINT)),
        "max_records_per_epoch": Field(Int("At most this many records per partition per "
                                           "epoch.", minimum=1)),
    },
    "Kafka topic partitions; offsets are the source's state.",
    [_watermark_needs_event_time, _exactly_one(("topic", "topics"), "a kafka source")],
)


def _kafka_source_rules(value: dict[str, Any], path: Path, ck: Checker) -> None:
    if value.get("format") == "raw" and "schema" in value:
        ck.report((*path, "schema"), "format: raw has the columns key, value, topic, "
                  "partition, offset, timestamp; remove 'schema'", at_key=True)
    if value.get("format") == "raw" and "on_error" in value:
        ck.report((*path, "on_error"), "format: raw cannot fail to decode; remove "
                  "'on_error'", at_key=True)


KAFKA_SOURCE.rules.append(_kafka_source_rules)

SOURCE = Tagged({"datagen": DATAGEN, "files": FILES_SOURCE, "kafka": KAFKA_SOURCE},
                what=_named("source", "sources"), description="A source of records.")

# -------------------------------------------------------------------------------- operators
WINDOW = Obj(
    {
        "tumbling": Field(Duration("Fixed, non-overlapping windows of this size.")),
        "sliding": Field(Obj({"size": Field(Duration(), required=True),
                              "slide": Field(Duration(), required=True)},
                             "Overlapping windows of `size`, one starting every `slide`.")),
        "session": Field(Obj({"gap": Field(Duration(), required=True)},
                             "Per-key windows closed by a gap of inactivity.")),
        "count": Field(Int("A window per key of this many records.", minimum=1)),
        "time": Field(Str("Event time (default when the input has one) or processing time.",
                          enum=("event", "processing"))),
        "allowed_lateness": Field(Duration("Keep windows open this long after the "
                                           "watermark passes their end.", allow_zero=True)),
        "late": Field(Str("The id of a sink for records later than watermark + lateness.")),
        "emit": Field(Str("`final`: once per window (default); `updates`: also after every "
                          "epoch in which it changed.", enum=("final", "updates"))),
    },
    "A keyed window; exactly one of tumbling, sliding, session, count.",
    rules=[_exactly_one(("tumbling", "sliding", "session", "count"), "window")],
)


def _sliding_rule(value: dict[str, Any], path: Path, ck: Checker) -> None:
    sliding = value.get("sliding")
    if isinstance(sliding, dict):
        size, slide = parse_duration_ms(sliding.get("size")), parse_duration_ms(
            sliding.get("slide"))
        if size and slide and slide > size:
            ck.report((*path, "sliding", "slide"), f"slide ({sliding['slide']}) must not be "
                      f"longer than size ({sliding['size']}), or some records would fall in "
                      "no window")


WINDOW.rules.append(_sliding_rule)


class AggregateFn(Str):
    """An aggregate call such as `sum(amount)` from the functions the spec lists."""

    def check(self, value: Any, path: Path, ck: Checker) -> None:
        """Check the call's form, function name and argument count."""
        super().check(value, path, ck)
        if not isinstance(value, str) or not value.strip():
            return
        call = parse_aggregate(value)
        if call is None:
            ck.report(path, f"aggregate {value!r} must be a call such as count() or sum(x)")
            return
        name, arg = call
        if name not in AGGREGATES:
            from streamer.pipeline.model import did_you_mean
            ck.report(path, f"unknown aggregate function {name!r}"
                      f"{did_you_mean(name, list(AGGREGATES), listing='valid functions')}")
        elif AGGREGATES[name] == 1 and arg is None:
            ck.report(path, f"{name}() needs a column or expression, e.g. {name}(amount)")
        elif AGGREGATES[name] == 0 and arg is not None:
            ck.report(path, f"count() takes no argument; use count_distinct({arg}) to count "
                      "distinct values")


JOIN_TYPES = ("inner", "left", "right", "full")
JOIN_MODES = ("between", "window", "table")


def _key_columns(doc: str) -> OneOrList:
    return OneOrList(Str(pattern=COLUMN_PATTERN, pattern_hint=COLUMN_HINT), doc, noun="column")


JOIN_WINDOW = Obj(
    {key: WINDOW.fields[key] for key in ("tumbling", "sliding")},
    "The window of a window join: records of both sides in the same window and key join when "
    "the window closes; exactly one of tumbling, sliding.",
    rules=[_exactly_one(("tumbling", "sliding"), "a join's window"), _sliding_rule],
)


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


JOIN = Obj(
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
        "window": Field(JOIN_WINDOW),
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

OPERATOR_KINDS = ("filter", "select", "with_columns", "key_by", "join")
KEYED_KINDS = ("window", "aggregate", "dedupe", "process")


def _operator_rules(value: dict[str, Any], path: Path, ck: Checker) -> None:
    what = _named("operator", "operators")(value, path)
    _exactly_one(OPERATOR_KINDS, f"{what}")(value, path, ck)
    if "side_outputs" in value and "process" not in value:
        ck.report((*path, "side_outputs"), f"'side_outputs' applies only to process "
                  f"operators; remove it from {what}", at_key=True)
    if "join" in value:
        if "input" in value:
            ck.report((*path, "input"), f"{what} is a join, which names its two inputs in "
                      "join.left and join.right; remove input", at_key=True)
        for key in (*KEYED_KINDS, "side_outputs"):
            if key in value and key != "window":
                ck.report((*path, key), f"{key!r} does not apply to a join; remove it from "
                          f"{what}", at_key=True)
        if "window" in value:
            ck.report((*path, "window"), f"a window join's window goes inside join: "
                      f"(join: {{window: ...}}); remove it from {what}", at_key=True)
        return
    if "input" not in value:
        ck.report(path, f"{what} is missing required key 'input'")
    if "late" in value:
        ck.report((*path, "late"), "'late' at the operator level applies only to joins; a "
                  "window's late output goes in window: {late: <sink id>}", at_key=True)
    if "key_by" not in value:
        for key in (*KEYED_KINDS, "uid"):
            if key in value:
                ck.report((*path, key), f"{key!r} needs key_by in {what}; add key_by: "
                          "[columns]" if key != "uid" else f"'uid' applies only to stateful "
                          f"(key_by) operators; remove it from {what}", at_key=True)
        return
    if "window" in value and "aggregate" not in value:
        ck.report((*path, "window"), f"{what} has a window but no aggregate; add aggregate: "
                  "{name: count()}", at_key=True)
        return
    kinds = [k for k in ("aggregate", "dedupe", "process") if k in value]
    if not kinds:
        ck.report(path, f"{what} has key_by but nothing to do per key; add one of window + "
                  "aggregate, aggregate, dedupe, process")
    elif len(kinds) > 1:
        ck.report((*path, kinds[1]), f"{what} can have only one of aggregate, dedupe, "
                  f"process; it has {' and '.join(kinds)}", at_key=True)


OPERATOR = Obj(
    {
        "id": Field(ID, required=True),
        "input": Field(OneOrList(REF, "One id, or a list of ids (a union; schemas must "
                                 "match). Every operator but a join has one.")),
        "uid": Field(Str("Stable identity of this operator's state (default: the id).")),
        "filter": Field(Str("Keep rows for which this boolean expression is "
                                       "true.")),
        "select": Field(MapOf(EXPR, "The output has exactly these columns.",
                              key_pattern=COLUMN_PATTERN, key_hint=COLUMN_HINT, min_items=1)),
        "with_columns": Field(MapOf(EXPR, "Add or replace these columns.",
                                    key_pattern=COLUMN_PATTERN, key_hint=COLUMN_HINT,
                                    min_items=1)),
        "key_by": Field(OneOrList(Str(pattern=COLUMN_PATTERN, pattern_hint=COLUMN_HINT),
                                  "Key columns.", noun="column")),
        "window": Field(WINDOW),
        "aggregate": Field(MapOf(AggregateFn(), "Output column: aggregate function.",
                                 key_pattern=COLUMN_PATTERN, key_hint=COLUMN_HINT,
                                 min_items=1)),
        "dedupe": Field(Obj({"within": Field(Duration("Forget a key after this long."),
                                             required=True)},
                            "Forward the first record per key.")),
        "side_outputs": Field(MapOf(Str("The id of a sink."), "process only: side output "
                                    "name -> the sink that receives it.",
                                    key_pattern=ID_PATTERN, key_hint=ID_HINT, min_items=1)),
        "join": Field(JOIN),
        "late": Field(Str("join only: the id of a sink for records that arrive behind the "
                          "watermark (otherwise dropped and counted).")),
        "process": Field(Str("A keyed process function, `module:Class`.",
                             pattern=r"[A-Za-z_][\w.]*:[A-Za-z_]\w*",
                             pattern_hint="'module:Class', e.g. 'fraud:LargeAfterSmall'")),
    },
    "One transformation; exactly one of filter, select, with_columns, key_by, join.",
    what=_named("operator", "operators"),
    rules=[_operator_rules],
)

# ------------------------------------------------------------------------------------ sinks
SINK_COMMON: dict[str, Field] = {
    "id": Field(ID, required=True),
    "input": Field(OneOrList(REF, "One id or a list of ids. A sink used only as on_error "
                             "or late output needs none.")),
}


def _sink(fields: dict[str, Field], doc: str) -> Obj:
    return Obj({**SINK_COMMON, **fields}, description=doc, what=_named("sink", "sinks"),
               extra_keys=("type",))


SINK = Tagged(
    {
        "console": _sink({"max_rows": Field(Int("Rows printed per epoch (default 20).",
                                                minimum=1))},
                         "Prints committed rows as a table."),
        "files": _sink({"path": Field(Str("fsspec URL of the output directory."),
                                      required=True),
                        "format": Field(Str("File format.", enum=("jsonl", "csv", "parquet")),
                                        required=True)},
                       "Files that become visible only when their epoch commits."),
        "kafka": _sink({"bootstrap_servers": Field(Str(), required=True),
                        "topic": Field(Str(), required=True),
                        "format": Field(Str(enum=("json",))),
                        "key": Field(Str("Column used as the record key.")),
                        "properties": Field(MapOf(Scalar(), "Passed to the Kafka producer "
                                                  "as-is."))},
                       "A Kafka topic; transactional in exactly_once mode."),
    },
    what=_named("sink", "sinks"), description="Where results go.",
)

# -------------------------------------------------------------------------------- top level
EXECUTION = Obj(
    {
        "small_epoch_rows": Field(Int(
            "Epochs with at most this many input rows run in the small-epoch mode: "
            "interpreted Spark expressions (no code generation), no adaptive execution, one "
            "shuffle partition, and keyed records routed to their subtask before they are "
            "aggregated. Default 20000; 0 turns the mode off. $STREAMER_SMALL_EPOCH_ROWS "
            "overrides it.", minimum=0,
            hint="set a number of rows, or 0 to turn the small-epoch mode off")),
        "local_rows": Field(Int(
            "A source slice of at most this many rows (over all its splits) is read on the "
            "driver as a local relation, and its epoch runs without Spark jobs where it can "
            "(a local epoch). Default 1000; 0 = never. $STREAMER_LOCAL_ROWS overrides it.",
            minimum=0, hint="set a number of rows, or 0 to never read a slice on the driver")),
        "direct_read": Field(Bool(
            "Keyed subtasks (rolling aggregates, tumbling and sliding windows) read a local "
            "parquet files source themselves, and take a local epoch's rows collected on the "
            "driver; false leaves both to Spark. Default true. $STREAMER_DIRECT_READ "
            "overrides it.")),
        "driver_subtasks": Field(Bool(
            "In local mode (local[*]) a local epoch runs the keyed subtasks in the driver "
            "process, one after the other, instead of as a Spark job; false always runs a "
            "Spark job. No effect on a cluster. Default true. $STREAMER_DRIVER_SUBTASKS "
            "overrides it.")),
        "task_sink": Field(Bool(
            "A keyed operator's tasks write the staging files of a local parquet files sink "
            "that reads only that operator (with pyarrow); false has Spark write them. "
            "Default true. $STREAMER_TASK_SINK overrides it.")),
    },
    "Engine settings: how epochs run, not what they compute (results are the same either "
    "way). The environment variables named here override them for one run.",
)

JOB = Obj(
    {
        "parallelism": Field(Int("Keyed subtasks (default: Spark's default parallelism).",
                                 minimum=1)),
        "max_parallelism": Field(Int("Key groups; fixed for the life of the state "
                                     "(default 128).", minimum=1, maximum=32768)),
        "epoch": Field(Duration("Epoch length for unbounded sources (default 1s).")),
        "checkpoint": Field(Obj({
            "interval": Field(Duration("Minimum time between checkpoints (default 10s).")),
            "mode": Field(Str(enum=("exactly_once", "at_least_once"))),
            "retain": Field(Int("Completed checkpoints kept (default 3).", minimum=1)),
            "timeout": Field(Duration("A checkpoint taking longer fails (default 10m).")),
        }, "Checkpointing.")),
        "state": Field(Obj({
            "backend": Field(Str(enum=("rocksdb", "memory"))),
            "local_dir": Field(Str("Where subtasks keep working state (default: a "
                                   "directory under the system temp dir).")),
        }, "Keyed state.")),
        "restart": Field(Obj({
            "attempts": Field(Int("Automatic restarts from the last checkpoint.", minimum=0)),
            "delay": Field(Duration("Wait between restarts.", allow_zero=True)),
        }, "Restart strategy.")),
        "shutdown_timeout": Field(Duration(
            "After SIGTERM, how long the job may take to stop at its next epoch boundary "
            "with a final checkpoint before it is cancelled (default 30s).")),
        "execution": Field(EXECUTION),
    },
    "How the job runs.",
)


def _job_rules(value: dict[str, Any], path: Path, ck: Checker) -> None:
    p, mp = value.get("parallelism"), value.get("max_parallelism", 128)
    if isinstance(p, int) and isinstance(mp, int) and not isinstance(p, bool) and p > mp:
        ck.report((*path, "parallelism"), f"parallelism ({p}) cannot exceed max_parallelism "
                  f"({mp}); raise max_parallelism or lower parallelism")


JOB.rules.append(_job_rules)

ROW = MapOf(AnyValue(), "One row: column -> value.")
TEST = Obj(
    {
        "name": Field(Str("What this case checks."), required=True),
        "inputs": Field(MapOf(ListOf(ROW), "Source id -> rows that replace the source."),
                        required=True),
        "expect": Field(MapOf(ListOf(ROW), "Sink id -> the rows it must receive, in any "
                              "order."), required=True),
    },
    "A smoke test run by `streamer test`.",
    what=lambda v, p: (f"test {v['name']!r}" if isinstance(v, dict) and
                       isinstance(v.get("name"), str) else f"tests[{p[-1]}]"),
)

PIPELINE = Obj(
    {
        "name": Field(Str("Job name.", pattern=r"[a-z0-9][a-z0-9-]*",
                          pattern_hint="lowercase letters, digits and dashes, e.g. "
                          "'clicks-per-user'"), required=True),
        "description": Field(Str(non_empty=False)),
        "storage": Field(Str("fsspec URL for the job registry, checkpoints and savepoints "
                             "(default ./.streamer).")),
        "job": Field(JOB),
        "spark": Field(MapOf(Scalar(), "Spark configuration, passed through as-is.")),
        "sources": Field(ListOf(SOURCE, "Where records come from.", min_items=1),
                         required=True),
        "operators": Field(ListOf(OPERATOR, "Transformations, in any order.")),
        "sinks": Field(ListOf(SINK, "Where results go.", min_items=1), required=True),
        "tests": Field(ListOf(TEST, "Smoke tests for `streamer test`.")),
    },
    "A streamer pipeline, version 1.",
    what=lambda v, p: "the pipeline",
)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the pipeline file, for editors (`streamer schema`)."""
    out = PIPELINE.schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://streamer.dev/schema/pipeline-v1.json",
        "title": "streamer pipeline",
        **out,
    }
