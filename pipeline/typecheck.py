"""Checks that need only the declared schemas, not Spark: column references of `key_by`,
aggregates and joins, key types, event time, and which windows and joins are possible.

Each node's columns are derived from what the file declares (a source's `schema:`, a
datagen source's `fields:`, an operator's `select:`); where they cannot be known without
Spark (a files source without a schema, a process function's output) a node's columns are
unknown and the checks that need them are left to Spark's analyzer (`streamer validate`
without `--no-spark`). Nothing here reports what the analyzer would not: a problem found
here is one `streamer run` would also stop on, seconds instead of a minute earlier.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from streamer.pipeline.checker import did_you_mean
from streamer.pipeline.exceptions import Problem
from streamer.pipeline.join_names import WINDOW_COLUMNS, name_clashes
from streamer.pipeline.spec import OperatorSpec, PipelineSpec, SourceSpec
from streamer.pipeline.yaml_loader import Path

#: A bare column reference (an expression that is just a name).
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Bare words that are literals, not columns.
_LITERALS = {"true", "false", "null"}
#: The columns of a Kafka record read with `format: raw`
#: (connectors/kafka/kafka_source.py `RAW_DDL`).
_KAFKA_RAW = {"key": "binary", "value": "binary", "topic": "string", "partition": "int",
              "offset": "bigint", "timestamp": "timestamp"}
#: A word an expression cannot end with: Spark's parser reads it as a column alias, so
#: `amount > 500 AND` is `amount > 500` named "AND".
_DANGLING = re.compile(r"\S\s+(AND|OR|NOT|IS|IN|LIKE|RLIKE|BETWEEN|WHEN|THEN|ELSE|CASE)\s*$",
                       re.IGNORECASE)
_NESTED = ("array", "map", "struct", "variant")
_TIMESTAMPS = ("timestamp", "timestamp_ntz", "timestamp_ltz")

#: Column name -> Spark type name (None: not known without Spark); None for the whole
#: mapping when not even the names are known.
Columns = dict[str, str | None] | None


@dataclass
class _Node:
    columns: Columns
    #: Whether the node's rows carry an event time.
    event_time: bool
    #: Why they do not: the source without event_time, or the operator whose output has
    #: none (("source", id) or ("operator", id, what it is)).
    no_time: tuple[str, ...] = ()


@dataclass
class TypeChecker:
    """Walks the pipeline in dataflow order, deriving columns and reporting problems."""

    spec: PipelineSpec
    problems: list[Problem] = field(default_factory=list)
    nodes: dict[str, _Node] = field(default_factory=dict)

    def report(self, path: Path, message: str) -> None:
        """Record a problem at the value at `path` (or its nearest present parent)."""
        while path and path not in self.spec.positions.values and len(path) > 1:
            path = path[:-1]
        self.problems.append(Problem(self.spec.where(path), message))

    # ---------------------------------------------------------------------- sources
    def source(self, s: SourceSpec) -> None:
        """A source's declared columns and its event_time."""
        columns: Columns = None
        if s.schema is not None:
            columns = {name: kind.strip().lower() for name, kind in s.schema}
        elif s.type == "datagen":
            fields = s.option("fields") or {}
            columns = dict.fromkeys(fields) if isinstance(fields, dict) else None
        elif s.type == "files" and s.option("format") == "text":
            columns = {"line": "string"}
        elif s.type == "kafka" and s.option("format") == "raw":
            columns = dict(_KAFKA_RAW)
        if columns is not None and s.type == "kafka" and s.option("record_timestamp"):
            columns[str(s.option("record_timestamp"))] = "timestamp"
        if s.event_time and columns is not None and _NAME.fullmatch(s.event_time) \
                and s.event_time.lower() not in _LITERALS:
            where: Path = (*s.path, "event_time")
            if s.event_time not in columns:
                self.report(where, f"event_time of source {s.id!r} is {s.event_time!r}, which "
                            "is not a column of the source"
                            f"{did_you_mean(s.event_time, list(columns), listing='columns')}")
            elif (kind := columns[s.event_time]) is not None and kind not in _TIMESTAMPS:
                self.report(where, f"event_time of source {s.id!r} must be a timestamp, but "
                            f"column {s.event_time!r} is {kind}; convert it, e.g. "
                            f"timestamp_millis({s.event_time}) or to_timestamp({s.event_time})")
        self.nodes[s.id] = _Node(columns, bool(s.event_time),
                                 () if s.event_time else ("source", s.id))

    def expressions(self, spec: PipelineSpec) -> None:
        """Report expressions that end in the middle (`amount > 500 AND`)."""
        found: list[tuple[Path, str, str]] = [
            ((*s.path, "event_time"), s.event_time, f"event_time of source {s.id!r}")
            for s in spec.sources if s.event_time]
        for o in spec.operators:
            owner = f"operator {o.id!r}"
            if o.filter:
                found.append(((*o.path, "filter"), o.filter, f"filter of {owner}"))
            found += [((*o.path, o.kind, name), expr, f"column {name!r} of {owner}")
                      for name, expr in o.columns]
            found += [((*o.path, "aggregate", a.name), a.arg, f"aggregate {a.name!r} of {owner}")
                      for a in o.aggregates if a.arg]
        for path, expr, what in found:
            dangling = _DANGLING.search(expr)
            if dangling:
                word = dangling.group(1)
                self.report(path, f"{what} is incomplete: {expr!r} ends with {word!r}, which "
                            f"Spark would read as a column name; complete the expression after "
                            f"{word!r} or remove it")

    # -------------------------------------------------------------------- operators
    def _input(self, o: OperatorSpec) -> _Node | None:
        found = [self.nodes.get(i) for i in o.inputs]
        if any(n is None for n in found) or not found:
            return None
        nodes = [n for n in found if n is not None]
        columns = nodes[0].columns
        if any(n.columns is None or set(n.columns) != set(columns or ()) for n in nodes[1:]):
            columns = None  # (a union of different columns: the analyzer says so)
        timeless = next((n for n in nodes if not n.event_time), None)
        return _Node(columns, timeless is None, timeless.no_time if timeless else ())

    def operator(self, o: OperatorSpec) -> None:
        """Check an operator's column references; derive its output columns."""
        if o.join is not None:
            self.join(o)
            return
        node = self._input(o)
        if node is None:
            self.nodes[o.id] = _Node(None, False, ("operator", o.id, "operator"))
            return
        cols = node.columns
        if o.kind == "filter":
            self.nodes[o.id] = node
        elif o.kind == "select":
            self.nodes[o.id] = _Node(
                None if cols is None else {name: _type_of(expr, cols) for name, expr in o.columns},
                node.event_time, node.no_time)
        elif o.kind == "with_columns":
            out = None if cols is None else {
                **cols, **{name: _type_of(expr, cols) for name, expr in o.columns}}
            self.nodes[o.id] = _Node(out, node.event_time, node.no_time)
        else:
            self.keyed(o, node)

    def _column(self, name: str, cols: Columns, path: Path, what: str) -> bool:
        """Whether `name` may be a column of `cols`; reports `what` ... is not when not."""
        if cols is None or name in cols:
            return True
        self.report(path, f"{what} is not in its input"
                    f"{did_you_mean(name, list(cols), listing='columns')}")
        return False

    def keyed(self, o: OperatorSpec, node: _Node) -> None:
        """Key columns, aggregate arguments, and event time of a keyed operator."""
        owner = f"operator {o.id!r}"
        cols = node.columns
        for i, key in enumerate(o.key_by):
            path: Path = (*o.path, "key_by", i)
            if path not in self.spec.positions.values:  # `key_by: user`, not a list
                path = (*o.path, "key_by")
            if not self._column(key, cols, path, f"key_by column {key!r} of {owner}"):
                continue
            kind = cols.get(key) if cols is not None else None
            if kind is not None and kind.startswith(_NESTED):
                self.report(path, f"key_by column {key!r} of {owner} is {kind}, which cannot "
                            "be a key (no value of it can be hashed into a key group); key by "
                            f"atomic columns, e.g. with_columns: {{{key}_key: "
                            f"\"to_json({key})\"}}")
        for agg in o.aggregates:
            for arg in agg.args:  # (max_by and min_by take two)
                if _NAME.fullmatch(arg) and arg.lower() not in _LITERALS:
                    self._column(arg, cols, (*o.path, "aggregate", agg.name),
                                 f"column {arg!r} of aggregate {agg.name!r} of {owner}")
        top_n = o.top_n
        if top_n is not None:
            listed = (*o.path, "top_n", "order_by", 0) in self.spec.positions.values
            for i, column in enumerate(top_n.columns):
                at: Path = (*o.path, "top_n", "order_by", *((i,) if listed else ()))
                self._column(column, cols, at, f"order_by column {column!r} of {owner}")
            if cols is not None and top_n.rank in cols:
                self.report((*o.path, "top_n", "rank") if (*o.path, "top_n", "rank") in
                            self.spec.positions.values else (*o.path, "top_n"),
                            f"the rank column {top_n.rank!r} of {owner} is already a column of "
                            "its input; name it otherwise with rank: <column>")
        for i, column in enumerate(o.over.order_by if o.over is not None else ()):
            at = (*o.path, "over", "order_by", i)
            self._column(column, cols, at if at in self.spec.positions.values else (
                *o.path, "over", "order_by"), f"order_by column {column!r} of {owner}")
        if o.over is not None and not node.event_time:
            self.report((*o.path, "over"), f"{owner} is an OVER window, which orders each "
                        "key's records by event time, but its input has none; set event_time: "
                        "on the source (or window the records before it)")
        window = o.window
        if window is not None and window.until is not None and self._column(
                window.until, cols, (*o.path, "window", "until"),
                f"the until column {window.until!r} of {owner}") and cols is not None \
                and cols.get(window.until) not in (None, "timestamp"):
            self.report((*o.path, "window", "until"), f"the until column {window.until!r} of "
                        f"{owner} is {cols[window.until]}, not a timestamp; cast it")
        if window is not None and window.kind != "count" and not node.event_time \
                and window.time != "processing":
            self._no_event_time(o, node)
        keys = {k: (cols.get(k) if cols else None) for k in o.key_by}
        aggs: dict[str, str | None] = {a.name: None for a in o.aggregates}
        kind = o.keyed_kind
        timed = o.output_event_time(node.event_time)
        no_time = () if timed else (("operator", o.id, "rolling aggregate")
                                    if kind == "aggregate" else node.no_time)
        out: Columns = None  # (a process function's: declared in its class)
        if kind == "window":
            out = {**keys, "window_start": "timestamp", "window_end": "timestamp", **aggs}
        elif kind == "aggregate":
            out = {**keys, **aggs}
        elif kind == "dedupe":
            out = cols
        elif kind == "over" and cols is not None:
            out = {**cols, **aggs}
        elif kind == "top_n" and cols is not None and o.top_n is not None:
            out = {**cols, o.top_n.rank: "int", **({"window_start": "timestamp",
                                                    "window_end": "timestamp"} if window else {})}
        self.nodes[o.id] = _Node(out, timed, no_time)

    def _no_event_time(self, o: OperatorSpec, node: _Node) -> None:
        """A time window whose input has no event time, without `time: processing`."""
        at: Path = (*o.path, "window", "time") if o.window and o.window.time else (
            *o.path, "window")
        what = o.window.kind if o.window else "window"
        if node.no_time[:1] == ("source",):
            why = (f"source {node.no_time[1]!r} has no event_time; set event_time: on source "
                   f"{node.no_time[1]!r} (and a watermark)")
        else:
            culprit, kind = node.no_time[1], node.no_time[2]
            why = (f"its input comes from {kind} {culprit!r}, whose output has no event time; "
                   f"window the records before {culprit!r}")
        if o.window and o.window.time == "event":
            self.report(at, f"operator {o.id!r} has an event-time {what} window, but {why}")
            return
        self.report(at, f"operator {o.id!r} has a {what} window on event time, but {why}, or "
                    "set time: processing on the window to count by the clock")

    def join(self, o: OperatorSpec) -> None:
        """A join's key columns on both sides and the event time it matches by."""
        join = o.join
        assert join is not None
        sides = {"left": (join.left, join.left_key), "right": (join.right, join.right_key)}
        by_on = (*o.path, "join", "on") in self.spec.positions.values
        out: Columns = {}
        names: list[list[str]] = []
        for side, (ref, keys) in sides.items():
            node = self.nodes.get(ref)
            if node is None:
                out = None
                continue
            if node.columns is not None:
                names.append([n for n in node.columns if not n.startswith("__")])
            if not node.event_time:
                self.report((*o.path, "join", side), f"the {side} input {ref!r} of join "
                            f"{o.id!r} has no event time; a join matches records by event "
                            "time: set event_time: (and a watermark) on its source")
            key_path: Path = (*o.path, "join", "on" if by_on else f"{side}_key")
            for i, key in enumerate(keys):
                path = (*key_path, i) if (*key_path, i) in self.spec.positions.values \
                    else key_path
                self._column(key, node.columns, path, f"join {o.id!r}: {side} key column {key!r}")
            if node.columns is None or out is None:
                out = None
                continue
            prefix = join.right_prefix if side == "right" else ""
            if side == "left":
                out.update({k: node.columns.get(k) for k in keys})
            out.update({f"{prefix}{name}": kind for name, kind in node.columns.items()
                        if name not in keys})
        clashes = name_clashes(join, *names) if len(names) == 2 else []
        for where, message in clashes:
            self.report((*o.path, "join", where), f"join {o.id!r}: {message}")
        if clashes:
            out = None
        if out is not None and join.mode == "window":  # the window each pair met in
            out.update(dict.fromkeys(WINDOW_COLUMNS, "timestamp"))
        self.nodes[o.id] = _Node(out, True)


def _type_of(expr: str, columns: dict[str, str | None]) -> str | None:
    """The type of `expr` when it is a bare column reference, else None (unknown)."""
    return columns.get(expr.strip()) if _NAME.fullmatch(expr.strip()) else None


def check_types(spec: PipelineSpec) -> list[Problem]:
    """Every problem the declared schemas show, without Spark (see the module doc)."""
    from streamer.pipeline.graph import compile_dataflow

    ck = TypeChecker(spec)
    ck.expressions(spec)
    for node in compile_dataflow(spec).nodes:
        if node.role == "source":
            ck.source(node.source)
        elif node.role == "operator":
            ck.operator(node.operator)
    return ck.problems
