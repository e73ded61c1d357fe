"""The `operators:` block of the pipeline file as pydantic v2 models (issue 38, item 3):
`OperatorModel` with its nested `dedupe:`, `top_n:` and `over:` models (the window's are in
`window_model.py`, the join's in `join_model.py`), `extra="forbid"`, each default written
once, and the aggregate call as an `Annotated` type with its own messages. The rules between
keys (exactly one kind, what applies to which kind, the OVER window's, the window's and the
join's) are functions over the raw mapping, run after pydantic (`RULES`), so that an operator
with a wrong type and a broken rule gets both messages in one run
(docs/decisions/pydantic.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, TypeAlias

from pydantic import BeforeValidator, Field, WithJsonSchema
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from streamer.pipeline.aggregate_calls import (
    AGGREGATES,
    parse_aggregate,
    parse_call,
    split_arguments,
)
from streamer.pipeline.checker import Checker, Rule, did_you_mean
from streamer.pipeline.join_model import JoinModel, join_rules
from streamer.pipeline.schema_base import (
    COLUMN_HINT,
    COLUMN_PATTERN,
    ID_HINT,
    ID_PATTERN,
    exactly_one,
    named,
)
from streamer.pipeline.window_model import WindowModel, window_rules
from streamer.pipeline.yaml_loader import Path
from streamer.pipeline.yaml_model import (
    PLAIN,
    Duration,
    Id,
    Ref,
    Text,
    YamlModel,
    mapping,
    not_blank,
    one_or_list,
    text,
)

#: The aggregate functions an OVER window computes.
OVER_FUNCTIONS = ("count", "sum", "avg", "min", "max")
#: One `order_by` entry of a top-N: a column, then optionally asc or desc.
ORDER_PATTERN = r"\s*[A-Za-z_][A-Za-z0-9_]*(\s+(?i:asc|desc))?\s*"


def _call_problem(value: str) -> str | None:
    """What is wrong with an aggregate call such as `sum(amount)`, or None."""
    call = parse_call(value)
    if call is None:
        return (f"aggregate {value!r} must be a call such as count() or sum(x), optionally "
                "followed by filter (where <condition>)")
    name, arg = call.resolved, call.arg
    args = split_arguments(arg) if arg is not None else []
    if call.distinct and call.function != "count":
        return (f"{call.function}(distinct ...) is not supported; only count(distinct x) "
                "counts distinct values")
    if name not in AGGREGATES:
        return (f"unknown aggregate function {name!r}"
                f"{did_you_mean(name, list(AGGREGATES), listing='valid functions')}")
    if AGGREGATES[name] == -1 and (not args or not all(args)):
        return ("count(distinct ...) needs one or more columns or expressions, e.g. "
                "count(distinct bidder)")
    if AGGREGATES[name] == 1 and arg is None:
        return f"{name}() needs a column or expression, e.g. {name}(amount)"
    if AGGREGATES[name] == 2 and (arg is None or len(args) != 2 or not all(args)):
        return (f"{name}() takes the value and what orders it, e.g. {name}(bid, price): the "
                f"bid with the {name[:3]}imum price")
    if AGGREGATES[name] == 0 and arg is not None:
        return f"count() takes no argument; use count(distinct {arg}) to count distinct values"
    return None


def _aggregate_call(value: Any) -> Any:
    if isinstance(value, str):
        not_blank(value)
        problem = _call_problem(value)
        if problem is not None:
            raise PydanticCustomError(PLAIN, "{message}", {"message": problem})
    return value


if TYPE_CHECKING:  # what they validate to; pydantic reads the types below
    Ids: TypeAlias = str | list[str]
    Columns: TypeAlias = str | list[str]
    KeyBy: TypeAlias = str | list[str]
    Orders: TypeAlias = str | list[str]
    Column: TypeAlias = str
    Exprs: TypeAlias = dict[str, str]
    Aggregates: TypeAlias = dict[str, str]
    SideOutputs: TypeAlias = dict[str, str]
    NodeId: TypeAlias = str
    ProcessClass: TypeAlias = str
else:
    Ids = one_or_list(Ref, "id")
    Columns = one_or_list(text(pattern=COLUMN_PATTERN, hint=COLUMN_HINT), "column")
    KeyBy = one_or_list(text(pattern=COLUMN_PATTERN, hint=COLUMN_HINT), "column",
                        allow_empty=True)
    Orders = one_or_list(text(pattern=ORDER_PATTERN, hint="'column' or 'column desc'"),
                         "column")
    Column = text(pattern=COLUMN_PATTERN, hint=COLUMN_HINT)
    #: An aggregate call such as `sum(amount)` from the functions `AGGREGATES` lists.
    AggregateCall = Annotated[str, BeforeValidator(_aggregate_call),
                              WithJsonSchema({"type": "string", "minLength": 1})]
    Aggregates = mapping(AggregateCall, "Output column: aggregate function, e.g. count(), "
                         "sum(x), count(distinct x), optionally with filter (where "
                         "<condition>).", COLUMN_PATTERN, COLUMN_HINT)
    SideOutputs = mapping(text("The id of a sink."), "process only: side output name -> "
                          "the sink that receives it.", ID_PATTERN, ID_HINT)
    NodeId = text(pattern=ID_PATTERN, hint=ID_HINT)
    ProcessClass = text(pattern=r"[A-Za-z_][\w.]*:[A-Za-z_]\w*",
                        hint="'module:Class', e.g. 'fraud:LargeAfterSmall'")


def _exprs(description: str) -> Any:
    return mapping(text("A Spark SQL expression."), description, COLUMN_PATTERN, COLUMN_HINT)


if TYPE_CHECKING:
    Select: TypeAlias = dict[str, str]
    WithColumns: TypeAlias = dict[str, str]
else:
    Select = _exprs("The output has exactly these columns.")
    WithColumns = _exprs("Add or replace these columns.")


class DedupeModel(YamlModel):
    """Forward the first record per key."""

    within: Duration = Field(description="Forget a key after this long.")


class TopNModel(YamlModel):
    """The first n rows per key (and window), as ROW_NUMBER() OVER (PARTITION BY key ORDER
    BY ...) <= n: an update stream without a window, each window's rows once with one."""

    n: Annotated[int, Field(ge=1)] = Field(description="How many rows per key (and window): "
                                           "ranks 1 to n.")
    order_by: Orders = Field(description="The columns that rank the rows, each asc (the "
                             "default) or desc; ties go to the earlier record.")
    rank: Column = Field(default="rank", description="The output column of each row's rank, "
                         "1 to n.")


class OverModel(YamlModel):
    """An OVER window per key: each record with aggregates over the records before it;
    exactly one of rows, range."""

    rows: Annotated[int, Field(ge=1)] | SkipJsonSchema[None] = Field(
        default=None, description="The aggregates cover the key's last this many records, "
        "the current one included (ROWS BETWEEN n - 1 PRECEDING AND CURRENT ROW).")
    range: Duration | SkipJsonSchema[None] = Field(
        default=None, description="The aggregates cover the key's records at most this long "
        "before the current one's event time, and it (RANGE BETWEEN ... PRECEDING AND "
        "CURRENT ROW).")
    order_by: Columns | SkipJsonSchema[None] = Field(
        default=None, description="Columns that order records of the same event time "
        "(ascending; then arrival), so ties come out the same in every run.")


class OperatorModel(YamlModel):
    """One transformation; exactly one of filter, select, with_columns, key_by, join."""

    #: How messages name an operator: `operator 'clean'` by its id, else `operators[2]`.
    noun: ClassVar[tuple[str, str]] = ("operator", "operators")

    id: Id
    input: Ids | SkipJsonSchema[None] = Field(
        default=None, description="One id, or a list of ids (a union; schemas must match). "
        "Every operator but a join has one.")
    uid: Text | SkipJsonSchema[None] = Field(
        default=None, description="Stable identity of this operator's state (default: the "
        "id).")
    filter: Text | SkipJsonSchema[None] = Field(
        default=None, description="Keep rows for which this boolean expression is true.")
    select: Select | SkipJsonSchema[None] = None
    with_columns: WithColumns | SkipJsonSchema[None] = None
    key_by: KeyBy | SkipJsonSchema[None] = Field(
        default=None, description="Key columns; [] puts every record under one key (a global "
        "window or aggregate, run by one subtask).")
    window: WindowModel | SkipJsonSchema[None] = None
    aggregate: Aggregates | SkipJsonSchema[None] = None
    top_n: TopNModel | SkipJsonSchema[None] = None
    over: OverModel | SkipJsonSchema[None] = None
    dedupe: DedupeModel | SkipJsonSchema[None] = None
    side_outputs: SideOutputs | SkipJsonSchema[None] = None
    broadcast: NodeId | SkipJsonSchema[None] = Field(
        default=None, description="process only: the id of a source or operator whose "
        "records go to every subtask, for `process_broadcast_element` and broadcast state "
        "(rules, thresholds).")
    join: JoinModel | SkipJsonSchema[None] = None
    late: Text | SkipJsonSchema[None] = Field(
        default=None, description="join only: the id of a sink for records that arrive "
        "behind the watermark (otherwise dropped and counted).")
    process: ProcessClass | SkipJsonSchema[None] = Field(
        default=None, description="A keyed process function, `module:Class`.")


OPERATOR_KINDS = ("filter", "select", "with_columns", "key_by", "join")
KEYED_KINDS = ("window", "aggregate", "dedupe", "process", "top_n", "over")


def _join_rules(value: dict[str, Any], path: Path, ck: Checker, what: str) -> None:
    """What a join operator may not have besides its `join:`."""
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


def _keyed_rules(value: dict[str, Any], path: Path, ck: Checker, what: str) -> None:
    """What a keyed (`key_by`) operator needs: one thing to do per key."""
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


def _operator_rules(value: dict[str, Any], path: Path, ck: Checker) -> None:
    what = named(*OperatorModel.noun)(value, path)
    exactly_one(OPERATOR_KINDS, f"{what}")(value, path, ck)
    window_rules(value.get("window"), (*path, "window"), ck)
    join_rules(value.get("join"), (*path, "join"), ck)
    for key in ("side_outputs", "broadcast"):
        if key in value and "process" not in value and "join" not in value:
            ck.report((*path, key), f"{key!r} applies only to process operators; remove it "
                      f"from {what}", at_key=True)
    if "join" in value:
        _join_rules(value, path, ck, what)
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
    _keyed_rules(value, path, ck, what)


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
    for name, call in aggregates.items():
        parsed = parse_aggregate(call) if isinstance(call, str) else None
        if parsed is not None and parsed[0] not in OVER_FUNCTIONS:
            ck.report((*path, "aggregate", name), f"an OVER window computes "
                      f"{', '.join(OVER_FUNCTIONS)}; {parsed[0]}() is not one of them")


#: The rules between an operator's keys (and its window's and join's): run on the raw
#: mapping of every operator, whatever else is wrong with it.
RULES: dict[str, list[Rule]] = {"": [_operator_rules]}
