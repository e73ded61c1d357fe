"""The pipeline file, version 1, as a model: every key, its type, and the rules between keys.

This is the single description from which `streamer validate` checks files and `streamer
schema` renders JSON Schema. Cross-references (inputs, on_error, cycles) are checked in
`pipeline/validate.py`, and expressions against schemas in `runtime/analyze.py` (it needs Spark).
"""

from __future__ import annotations

from typing import Any

from streamer.pipeline.aggregate_calls import (
    AGGREGATES,
    parse_aggregate,
    parse_call,
    split_arguments,
)
from streamer.pipeline.cases_model import TestCaseModel
from streamer.pipeline.job_model import JobModel
from streamer.pipeline.model import (
    Checker,
    Duration,
    Field,
    Int,
    ListOf,
    MapOf,
    Obj,
    OneOrList,
    Scalar,
    Str,
)
from streamer.pipeline.over_spec import OVER, OVER_FUNCTIONS
from streamer.pipeline.pydantic_bridge import ModelNode
from streamer.pipeline.schema_base import (
    COLUMN_HINT,
    COLUMN_PATTERN,
    EXPR,
    ID,
    ID_HINT,
    ID_PATTERN,
    REF,
    exactly_one,
    named,
)
from streamer.pipeline.schema_joins import join_schema
from streamer.pipeline.sink_model import RULES as SINK_RULES
from streamer.pipeline.sink_model import Sink
from streamer.pipeline.source_model import RULES as SOURCE_RULES
from streamer.pipeline.source_model import Source
from streamer.pipeline.storage_model import StorageOptionsModel
from streamer.pipeline.topn_spec import TOP_N
from streamer.pipeline.units import parse_duration_ms
from streamer.pipeline.yaml_loader import Path

# -------------------------------------------------------------------------------- operators
WINDOW = Obj(
    {
        "tumbling": Field(Duration("Fixed, non-overlapping windows of this size.")),
        "sliding": Field(Obj({"size": Field(Duration("How long each window is."),
                                            required=True),
                              "slide": Field(Duration("How often a window starts."),
                                             required=True)},
                             "Overlapping windows of `size`, one starting every `slide`.")),
        "session": Field(Obj({"gap": Field(Duration("A key's session closes after this long "
                                                    "without a record."), required=True)},
                             "Per-key windows closed by a gap of inactivity.")),
        "count": Field(Int("A window per key of this many records.", minimum=1)),
        "until": Field(Str("A window per key closing at this timestamp column's time (e.g. "
                           "an auction's expires): emitted once the watermark passes it.",
                           pattern=COLUMN_PATTERN, pattern_hint=COLUMN_HINT)),
        "time": Field(Str("Event time or processing time (default event when the input has "
                          "an event time).",
                          enum=("event", "processing"))),
        "allowed_lateness": Field(Duration("Keep windows open this long after the "
                                           "watermark passes their end (default 0s).",
                                           allow_zero=True)),
        "late": Field(Str("The id of a sink for records later than watermark + lateness.")),
        "emit": Field(Str("`final`: once per window; `updates`: also after every epoch in "
                          "which it changed (default final).", enum=("final", "updates"))),
    },
    "A keyed window; exactly one of tumbling, sliding, session, count, until.",
    rules=[exactly_one(("tumbling", "sliding", "session", "count", "until"), "window")],
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
        call = parse_call(value)
        if call is None:
            ck.report(path, f"aggregate {value!r} must be a call such as count() or sum(x), "
                      "optionally followed by filter (where <condition>)")
            return
        name, arg = call.resolved, call.arg
        args = split_arguments(arg) if arg is not None else []
        if call.distinct and call.function != "count":
            ck.report(path, f"{call.function}(distinct ...) is not supported; only "
                      "count(distinct x) counts distinct values")
        elif name not in AGGREGATES:
            from streamer.pipeline.model import did_you_mean
            ck.report(path, f"unknown aggregate function {name!r}"
                      f"{did_you_mean(name, list(AGGREGATES), listing='valid functions')}")
        elif AGGREGATES[name] == -1 and (not args or not all(args)):
            ck.report(path, "count(distinct ...) needs one or more columns or expressions, "
                      "e.g. count(distinct bidder)")
        elif AGGREGATES[name] == 1 and arg is None:
            ck.report(path, f"{name}() needs a column or expression, e.g. {name}(amount)")
        elif AGGREGATES[name] == 2 and (arg is None or len(args) != 2 or not all(args)):
            ck.report(path, f"{name}() takes the value and what orders it, e.g. "
                      f"{name}(bid, price): the bid with the {name[:3]}imum price")
        elif AGGREGATES[name] == 0 and arg is not None:
            ck.report(path, f"count() takes no argument; use count(distinct {arg}) to count "
                      "distinct values")


JOIN = join_schema(WINDOW, _sliding_rule)


OPERATOR_KINDS = ("filter", "select", "with_columns", "key_by", "join")
KEYED_KINDS = ("window", "aggregate", "dedupe", "process", "top_n", "over")


def _operator_rules(value: dict[str, Any], path: Path, ck: Checker) -> None:
    what = named("operator", "operators")(value, path)
    exactly_one(OPERATOR_KINDS, f"{what}")(value, path, ck)
    for key in ("side_outputs", "broadcast"):
        if key in value and "process" not in value and "join" not in value:
            ck.report((*path, key), f"{key!r} applies only to process operators; remove it "
                      f"from {what}", at_key=True)
    if "join" in value:
        if "input" in value:
            ck.report((*path, "input"), f"{what} is a join, which names its two inputs in "
                      "join.left and join.right; remove input", at_key=True)
        for key in (*KEYED_KINDS, "side_outputs", "broadcast"):
            if key in value and key != "window":
                ck.report((*path, key), f"{key!r} does not apply to a join; remove it from "
                          f"{what}", at_key=True)
        if "window" in value:
            ck.report((*path, "window"), f"a window join's window goes inside join: "
                      f"(join: {{window: ...}}); remove it from {what}", at_key=True)
        join = value["join"]
        if "late" in value and isinstance(join, dict) and "regular" in join:
            ck.report((*path, "late"), f"{what} is a regular join, which takes every record, "
                      "late ones too; remove late", at_key=True)
        if "late" in value and isinstance(join, dict) and join.get("table") is True:
            ck.report((*path, "late"), f"{what} is a processing-time table join (table: "
                      "true), which has no late records (each left record joins the row its "
                      "key has when it is processed); remove late, or use table: {as_of: "
                      "event_time} (a temporal join, whose late records go there)",
                      at_key=True)
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
    if "window" in value and "aggregate" not in value and "top_n" not in value:
        ck.report((*path, "window"), f"{what} has a window but no aggregate; add aggregate: "
                  "{name: count()} (or top_n: for the first rows per window)", at_key=True)
        return
    if "over" in value:
        _over_rules(value, path, ck, what)
        return
    kinds = [k for k in ("aggregate", "dedupe", "process", "top_n") if k in value]
    if not kinds:
        ck.report(path, f"{what} has key_by but nothing to do per key; add one of window + "
                  "aggregate, aggregate, dedupe, process, top_n")
    elif len(kinds) > 1:
        ck.report((*path, kinds[1]), f"{what} can have only one of aggregate, dedupe, "
                  f"process, top_n; it has {' and '.join(kinds)}", at_key=True)
    elif kinds == ["top_n"] and isinstance(value.get("window"), dict) and not (
            {"tumbling", "sliding"} & set(value["window"])):
        ck.report((*path, "window"), f"{what}: a top-N per window needs a tumbling or sliding "
                  "window", at_key=True)


def _over_rules(value: dict[str, Any], path: Path, ck: Checker, what: str) -> None:
    """An OVER window: exactly one of rows and range, its aggregates, no other kind."""
    over = value["over"]
    if isinstance(over, dict) and len([k for k in ("rows", "range") if k in over]) != 1:
        ck.report((*path, "over"), f"{what}: an OVER window needs exactly one of rows: <n> "
                  "or range: <duration>")
    for other in ("window", "dedupe", "process", "top_n"):
        if other in value:
            ck.report((*path, other), f"{what} is an OVER window, which cannot have "
                      f"{other}; remove it", at_key=True)
    aggregates = value.get("aggregate")
    if not isinstance(aggregates, dict):
        ck.report((*path, "over"), f"{what}: an OVER window needs aggregate: (e.g. "
                  "{avg_price: avg(price)})", at_key=True)
        return
    for name, text in aggregates.items():
        parsed = parse_aggregate(text) if isinstance(text, str) else None
        if parsed is not None and parsed[0] not in OVER_FUNCTIONS:
            ck.report((*path, "aggregate", name), f"an OVER window computes "
                      f"{', '.join(OVER_FUNCTIONS)}; {parsed[0]}() is not one of them")


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
                                  "Key columns; [] puts every record under one key (a "
                                  "global window or aggregate, run by one subtask).",
                                  noun="column", allow_empty=True)),
        "window": Field(WINDOW),
        "aggregate": Field(MapOf(AggregateFn(), "Output column: aggregate function, e.g. "
                                 "count(), sum(x), count(distinct x), optionally with "
                                 "filter (where <condition>).",
                                 key_pattern=COLUMN_PATTERN, key_hint=COLUMN_HINT,
                                 min_items=1)),
        "top_n": Field(TOP_N),
        "over": Field(OVER),
        "dedupe": Field(Obj({"within": Field(Duration("Forget a key after this long."),
                                             required=True)},
                            "Forward the first record per key.")),
        "side_outputs": Field(MapOf(Str("The id of a sink."), "process only: side output "
                                    "name -> the sink that receives it.",
                                    key_pattern=ID_PATTERN, key_hint=ID_HINT, min_items=1)),
        "broadcast": Field(Str("process only: the id of a source or operator whose records "
                               "go to every subtask, for `process_broadcast_element` and "
                               "broadcast state (rules, thresholds).", pattern=ID_PATTERN,
                               pattern_hint=ID_HINT)),
        "join": Field(JOIN),
        "late": Field(Str("join only: the id of a sink for records that arrive behind the "
                          "watermark (otherwise dropped and counted).")),
        "process": Field(Str("A keyed process function, `module:Class`.",
                             pattern=r"[A-Za-z_][\w.]*:[A-Za-z_]\w*",
                             pattern_hint="'module:Class', e.g. 'fraud:LargeAfterSmall'")),
    },
    "One transformation; exactly one of filter, select, with_columns, key_by, join.",
    what=named("operator", "operators"),
    rules=[_operator_rules],
)

# -------------------------------------------------------------------------------- top level

#: The `job:` block, each source, each sink, `storage_options:` and each test are pydantic
#: models (`pipeline/job_model.py`, `pipeline/source_model.py`, `pipeline/sink_model.py`,
#: `pipeline/storage_model.py`, `pipeline/cases_model.py`, issue 38).
JOB = ModelNode(JobModel)
SOURCE = ModelNode(Source, "A source of records.", rules=SOURCE_RULES)
SINK = ModelNode(Sink, "Where results go.", rules=SINK_RULES)
STORAGE_OPTIONS = ModelNode(StorageOptionsModel)
TEST = ModelNode(TestCaseModel)


def _s3_urls(value: dict[str, Any]) -> bool:
    """Whether the pipeline's storage, or a source's or sink's path, is an `s3://` URL."""
    urls = [value.get("storage")] + [node.get("path") for key in ("sources", "sinks")
                                     for node in (value.get(key) or []) if isinstance(node, dict)]
    return any(isinstance(u, str) and u.startswith(("s3://", "s3a://")) for u in urls)


def _storage_options_need_s3(value: dict[str, Any], path: Path, ck: Checker) -> None:
    if "storage_options" in value and not _s3_urls(value):
        ck.report(("storage_options",), "storage_options applies to s3:// URLs, and neither "
                  "storage: nor any source or sink path is one; remove storage_options or set "
                  "storage: s3://bucket/prefix", at_key=True)


PIPELINE = Obj(
    {
        "name": Field(Str("Job name.", pattern=r"[a-z0-9][a-z0-9-]*",
                          pattern_hint="lowercase letters, digits and dashes, e.g. "
                          "'clicks-per-user'"), required=True),
        "description": Field(Str("What the job does, for people reading the file.",
                                 non_empty=False)),
        "storage": Field(Str("fsspec URL for the job registry, checkpoints and savepoints "
                             "(default $STREAMER_STORAGE, else ./.streamer).")),
        "storage_options": Field(STORAGE_OPTIONS),
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
    rules=[_storage_options_need_s3],
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
