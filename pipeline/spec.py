"""The validated pipeline as frozen dataclasses: what the YAML says, apart from what runs.

`load_pipeline(path)` is the one entry point: parse with positions, validate (structure and
cross-references), and build a `PipelineSpec`. Locations of every value are kept on the spec
so that later checks (Spark's analyzer, the runtime) can still point at `file:line:col`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from streamer.pipeline.aggregate_calls import parse_call, split_arguments
from streamer.pipeline.cases_model import TestCaseModel
from streamer.pipeline.exceptions import Location
from streamer.pipeline.job_spec import JobSpec, build_job
from streamer.pipeline.join_model import JoinModel
from streamer.pipeline.operator_model import OperatorModel
from streamer.pipeline.over_spec import OverSpec, build_over
from streamer.pipeline.schema import PipelineModel
from streamer.pipeline.sink_model import sink_options
from streamer.pipeline.source_model import build_source
from streamer.pipeline.source_spec import SourceSpec
from streamer.pipeline.storage_model import storage_options
from streamer.pipeline.topn_spec import TopNSpec, build_top_n
from streamer.pipeline.units import parse_signed_duration_ms
from streamer.pipeline.window_model import JoinWindowModel, WindowModel
from streamer.pipeline.yaml_loader import Path, Positions
from streamer.pipeline.yaml_model import as_tuple

#: The window's and the join's defaults, read from their models (written once, there).
_WINDOW, _JOIN_TYPE = WindowModel(), JoinModel.model_fields["type"].default


@dataclass(frozen=True)
class WindowSpec:
    """A keyed window definition."""

    kind: str  # tumbling | sliding | session | count | until
    size_ms: int | None = None
    slide_ms: int | None = None
    gap_ms: int | None = None
    count: int | None = None
    time: str | None = None
    allowed_lateness_ms: int = _WINDOW.allowed_lateness
    late: str | None = None
    emit: str = _WINDOW.emit
    until: str | None = None  # (until: the column of each record's close time)


FOREVER_MS = 100 * 365 * 24 * 3600 * 1000  # (a regular join without a ttl: 100 years)
#: Aggregates that take back a value as well as add one (a retraction of an update stream).
RETRACTABLE = ("count", "sum", "avg")


@dataclass(frozen=True)
class AggregateSpec:
    """One output column of an aggregate: `name: function(arg) [filter (where ...)]`."""

    name: str
    function: str
    #: The argument text as written (`max_by(bid, price)`: "bid, price").
    arg: str | None
    #: The condition of `filter (where ...)`: only the rows for which it holds count.
    filter: str | None = None

    @property
    def args(self) -> tuple[str, ...]:
        """The arguments, split at top-level commas (`max_by`: the value, then the order)."""
        return tuple(split_arguments(self.arg)) if self.arg else ()


@dataclass(frozen=True)
class JoinSpec:
    """A `join:` of two keyed inputs: interval (`between`), window or table join."""

    left: str
    right: str
    #: Key columns of each side, in order; the output's key columns take the left names.
    left_key: tuple[str, ...]
    right_key: tuple[str, ...]
    type: str = _JOIN_TYPE  # inner | left | right | full
    mode: str = "interval"  # interval | window | table | regular
    #: Regular join: how long a record is kept in event time (None: forever).
    ttl_ms: int | None = None
    #: Table join: None (processing-time enrichment) or "event_time" (temporal).
    as_of: str | None = None
    #: Interval join: right event time - left event time in [lower_ms, upper_ms].
    lower_ms: int = 0
    upper_ms: int = 0
    #: Window join: tumbling or sliding (`WindowSpec`, event time).
    window: WindowSpec | None = None
    #: The sink of records behind the watermark (the operator's `late:`).
    late: str | None = None
    right_prefix: str = ""

    @property
    def outer_left(self) -> bool:
        """Unmatched left records are emitted (left and full joins)."""
        return self.type in ("left", "full")

    @property
    def outer_right(self) -> bool:
        """Unmatched right records are emitted (right and full joins)."""
        return self.type in ("right", "full")


@dataclass(frozen=True)
class OperatorSpec:
    """An operator; `kind` says which of the spec's operator keys it has."""

    id: str
    inputs: tuple[str, ...]
    kind: str  # filter | select | with_columns | keyed
    path: Path
    uid: str
    uid_explicit: bool = False
    filter: str | None = None
    columns: tuple[tuple[str, str], ...] = ()  # select / with_columns
    key_by: tuple[str, ...] = ()
    window: WindowSpec | None = None
    aggregates: tuple[AggregateSpec, ...] = ()
    dedupe_within_ms: int | None = None
    process: str | None = None
    #: process only: (side output name, sink id).
    side_outputs: tuple[tuple[str, str], ...] = ()
    #: process only: the input whose records every subtask gets (broadcast state); not in
    #: `inputs` (the keyed input).
    broadcast: str | None = None
    #: join only (`inputs` is then (left, right), `key_by` the left key columns).
    join: JoinSpec | None = None
    top_n: TopNSpec | None = None
    over: OverSpec | None = None

    @property
    def stateful(self) -> bool:
        """Whether this operator keeps keyed state."""
        return self.kind == "keyed"

    @property
    def keyed_kind(self) -> str | None:
        """Join | top_n | window | aggregate | dedupe | process for keyed operators (the
        name of its kind in `operators.kinds`)."""
        if self.kind != "keyed":
            return None
        if self.join:
            return "join"
        if self.top_n:
            return "top_n"
        if self.over:
            return "over"
        if self.window:
            return "window"
        if self.aggregates:
            return "aggregate"
        return "dedupe" if self.dedupe_within_ms is not None else "process"

    # What a keyed operator declares to the operators after it (how it composes).
    @property
    def emits_updates(self) -> str | None:
        """Why this operator's output is an update stream (each key's new value again and
        again: a changelog), or None when it is append-only (every row is final)."""
        kind = self.keyed_kind
        if kind == "aggregate":
            return "a rolling aggregate (it emits each key's new value after every epoch)"
        if kind == "window" and self.window is not None and self.window.emit == "updates":
            return "a window with emit: updates (it emits a window again after every change)"
        if kind == "top_n" and self.window is None:
            return "a top-N without a window (its top rows change as records arrive)"
        return None

    def output_event_time(self, input_has_event_time: bool) -> bool:
        """Whether this operator's output rows carry an event time (`__ts`): a time window's
        and a join's always (a window's end - 1 ms; a join's, the later side's), a count
        window's, a dedupe's and a process function's when their input has one (the record's
        or the timer's time), a stateless operator's as its input; a rolling aggregate's
        never (an update of a key has no time of its own)."""
        kind = self.keyed_kind
        if kind is None:
            return input_has_event_time
        if kind == "join" or (kind in ("window", "top_n") and self.window is not None
                              and self.window.kind != "count"):
            return True
        return kind not in ("aggregate", "top_n") and input_has_event_time

    @property
    def watermark_hold_ms(self) -> int:
        """How far behind the watermark it ran with this operator may still emit, which its
        output watermark stays behind (`runtime.watermarks`): a window emits a window once
        the watermark passed its end plus the allowed lateness, stamped with the end; a
        window join a window's pairs at its end; an interval join an unmatched outer record
        once the watermark passed it by the interval's bound. Operators that emit as records
        arrive (rolling aggregates, dedupe, table joins, process functions) hold nothing."""
        if self.window is not None and self.window.kind != "count":
            return self.window.allowed_lateness_ms
        join = self.join
        if join is not None:
            if join.mode == "window" and join.window is not None:
                return (join.window.size_ms or 0) + join.window.allowed_lateness_ms
            if join.mode in ("interval", "regular"):
                return max(0, join.upper_ms, -join.lower_ms)
        return 0


@dataclass(frozen=True)
class SinkSpec:
    """A sink; `inputs` may be empty for a sink fed only by on_error / late outputs."""

    id: str
    type: str
    inputs: tuple[str, ...]
    options: Mapping[str, Any]
    path: Path

    def option(self, name: str, default: Any = None) -> Any:
        """A type-specific setting (its default filled in by `pipeline/sink_model.py`), or
        `default` when it is not set."""
        return self.options.get(name, default)


@dataclass(frozen=True)
class TestCase:
    """One entry of the `tests:` block."""

    __test__ = False  # not a pytest test class

    name: str
    inputs: Mapping[str, list[dict[str, Any]]]
    expect: Mapping[str, list[dict[str, Any]]]
    path: Path


@dataclass(frozen=True)
class PipelineSpec:
    """A whole validated pipeline file."""

    name: str
    description: str
    storage: str
    job: JobSpec
    spark: Mapping[str, str]
    sources: tuple[SourceSpec, ...]
    operators: tuple[OperatorSpec, ...]
    sinks: tuple[SinkSpec, ...]
    tests: tuple[TestCase, ...]
    file: str
    positions: Positions = field(compare=False, repr=False)
    #: `storage_options:`, how `s3://` URLs are reached (credentials: never printed).
    storage_options: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def where(self, path: Path, *, key: bool = False) -> Location:
        """The file location of the value (or key) at `path`."""
        return self.positions.of_key(path) if key else self.positions.of(path)

    def keyed_behind(self, ref: str) -> tuple[frozenset[str], bool]:
        """What node `ref`'s rows come from: (the keyed operators behind it, through
        stateless operators, whether a source is behind it with no keyed operator
        between)."""
        by_id = {o.id: o for o in self.operators}
        keyed: set[str] = set()
        sourced = False
        seen: set[str] = set()
        todo = [ref]
        while todo:
            node_id = todo.pop()
            if node_id in seen:
                continue
            seen.add(node_id)
            op = by_id.get(node_id)
            if op is None:  # a source
                sourced = True
            elif op.stateful:
                keyed.add(op.id)
            else:
                todo.extend(op.inputs)
        return frozenset(keyed), sourced

    def updates_behind(self, ref: str) -> str | None:
        """The operator whose update stream (`OperatorSpec.emits_updates`) node `ref`'s rows
        are, directly or through stateless operators, or None when they are append-only."""
        by_id = {o.id: o for o in self.operators}
        return next((k for k in sorted(self.keyed_behind(ref)[0])
                     if by_id[k].emits_updates is not None), None)

    def node(self, node_id: str) -> SourceSpec | OperatorSpec | SinkSpec:
        """The source, operator or sink with this id."""
        items: tuple[SourceSpec | OperatorSpec | SinkSpec, ...] = (
            *self.sources, *self.operators, *self.sinks)
        for item in items:
            if item.id == node_id:
                return item
        raise KeyError(node_id)

    @property
    def dead_letter_sinks(self) -> set[str]:
        """Ids of sinks named by some on_error or late output."""
        out = {s.on_error for s in self.sources if s.on_error}
        out |= {o.window.late for o in self.operators if o.window and o.window.late}
        out |= {sink for o in self.operators for _, sink in o.side_outputs}
        out |= {o.join.late for o in self.operators if o.join and o.join.late}
        return out


def _build_window(model: JoinWindowModel) -> WindowSpec:
    window = model if isinstance(model, WindowModel) else _WINDOW
    common: dict[str, Any] = {"time": window.time, "allowed_lateness_ms": window.allowed_lateness,
                              "late": window.late, "emit": window.emit}
    if model.tumbling is not None:
        return WindowSpec("tumbling", size_ms=model.tumbling, **common)
    if model.sliding is not None:
        return WindowSpec("sliding", size_ms=model.sliding.size, slide_ms=model.sliding.slide,
                          **common)
    assert isinstance(model, WindowModel)  # validated: a join's window is one of the two
    if model.session is not None:
        return WindowSpec("session", gap_ms=model.session.gap, **common)
    if model.until is not None:
        return WindowSpec("until", until=model.until, **common)
    return WindowSpec("count", count=model.count, **common)


def _build_join(join: JoinModel, late: str | None) -> JoinSpec:
    left_key = as_tuple(join.on or join.left_key)
    right_key = as_tuple(join.on or join.right_key)
    lower = upper = 0
    window = None
    regular = join.regular
    ttl = regular.ttl if regular is not None and not isinstance(regular, bool) else None
    if join.between is not None:
        lower, upper = (parse_signed_duration_ms(v) or 0 for v in join.between)
    elif regular is not None:  # an interval join of +-ttl, its bound forever without one
        lower, upper = -(ttl if ttl is not None else FOREVER_MS), ttl or FOREVER_MS
    elif join.table is None and join.window is not None:
        window = _build_window(join.window)
    mode = ("interval" if join.between is not None else "regular" if regular is not None
            else "window" if join.table is None else "table")
    as_of = None if join.table is None or isinstance(join.table, bool) else join.table.as_of
    return JoinSpec(left=join.left, right=join.right, left_key=left_key, right_key=right_key,
                    type=join.type, mode=mode, lower_ms=lower, upper_ms=upper, as_of=as_of,
                    window=window, late=late, right_prefix=join.right_prefix or "", ttl_ms=ttl)


def _aggregates(op: OperatorModel) -> tuple[AggregateSpec, ...]:
    out = []
    for name, text in (op.aggregate or {}).items():
        call = parse_call(text)
        assert call is not None  # validated
        out.append(AggregateSpec(name, call.resolved, call.arg, call.filter))
    return tuple(out)


def _build_operator(op: OperatorModel, path: Path) -> OperatorSpec:
    base: dict[str, Any] = {"id": op.id, "inputs": as_tuple(op.input), "path": path,
                            "uid": op.uid or op.id, "uid_explicit": "uid" in op.model_fields_set}
    if op.join is not None:
        join = _build_join(op.join, op.late)
        return OperatorSpec(kind="keyed", join=join, key_by=join.left_key,
                            **{**base, "inputs": (join.left, join.right)})
    if op.filter is not None:
        return OperatorSpec(kind="filter", filter=op.filter, **base)
    if op.select is not None:
        return OperatorSpec(kind="select", columns=tuple(op.select.items()), **base)
    if op.with_columns is not None:
        return OperatorSpec(kind="with_columns", columns=tuple(op.with_columns.items()),
                            **base)
    return OperatorSpec(
        kind="keyed", key_by=as_tuple(op.key_by),
        window=_build_window(op.window) if op.window is not None else None,
        aggregates=_aggregates(op),
        dedupe_within_ms=op.dedupe.within if op.dedupe is not None else None,
        process=op.process, broadcast=op.broadcast,
        top_n=build_top_n(op.top_n) if op.top_n is not None else None,
        over=build_over(op.over) if op.over is not None else None,
        side_outputs=tuple((op.side_outputs or {}).items()), **base)


def _build_test(case: TestCaseModel, path: Path) -> TestCase:
    return TestCase(name=case.name, inputs=case.inputs, expect=case.expect, path=path)


def build_spec(model: PipelineModel, positions: Positions,
               env: Mapping[str, str] | None = None) -> PipelineSpec:
    """Build the frozen spec from the file's validated `model` (`schema.check_pipeline`), each
    source, operator and sink from its own model, with its path."""
    env = os.environ if env is None else env
    sources = tuple(build_source(src, ("sources", i)) for i, src in enumerate(model.sources))
    operators = tuple(_build_operator(op, ("operators", i))
                      for i, op in enumerate(model.operators))
    sinks = tuple(
        SinkSpec(id=sink.id, type=sink.type, inputs=as_tuple(sink.input),
                 options=sink_options(sink), path=("sinks", i))
        for i, sink in enumerate(model.sinks))
    tests = tuple(_build_test(case, ("tests", i)) for i, case in enumerate(model.tests))
    return PipelineSpec(
        name=model.name, description=model.description,
        storage=model.storage or env.get("STREAMER_STORAGE") or "./.streamer",
        job=build_job(model.job), spark={str(k): str(v).lower() if isinstance(v, bool)
                                         else str(v) for k, v in (model.spark or {}).items()},
        sources=sources, operators=operators, sinks=sinks, tests=tests,
        file=positions.file, positions=positions,
        storage_options=storage_options(model.storage_options))
