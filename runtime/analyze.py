"""Check a pipeline's expressions against its input schemas with Spark's analyzer.

Each operator is applied to an empty DataFrame of its input's schema; no Spark job runs. A
failing expression is reported at its own `file:line:col` with Spark's first message line.
Returns the output schema of every node so later stages need not derive them again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamer.columns import HIDDEN_PREFIX
from streamer.exceptions import StreamerError
from streamer.frames import empty_frame
from streamer.pipeline.exceptions import PipelineError, Problem
from streamer.pipeline.graph import Dataflow, compile_dataflow
from streamer.pipeline.spec import (
    AggregateSpec,
    OperatorSpec,
    PipelineSpec,
    SinkSpec,
    SourceSpec,
)
from streamer.pipeline.yaml_loader import Path

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from streamer.connectors.base import Source

_NESTED = ("array", "map", "struct")


def _implicit_alias(expr: str, name: str) -> str | None:
    """The name Spark gave `expr` when it read its last word as an alias (`amount > 500 AND`
    is `amount > 500` named "AND"), else None. Aliases are never meant in these expressions
    (a select's column is named by its key)."""
    text = expr.rstrip()
    head = text[:-len(name)] if name and text.endswith(name) else None
    if head is None or not head or not head[-1].isspace() or not head.strip():
        return None
    before = head.split()[-1].upper()
    return None if before == "AS" else name


def _describe(schema: StructType) -> str:
    return ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in schema.fields)


class Analyzer:
    """Derives node schemas; collects problems instead of stopping at the first."""

    def __init__(self, spec: PipelineSpec, spark: SparkSession,
                 sources: dict[str, Source]) -> None:
        self.spec = spec
        self.spark = spark
        self.sources = sources
        self.problems: list[Problem] = []
        self.schemas: dict[str, StructType] = {}
        #: Whether each node's rows carry an event time (from a source's event_time).
        self.event_time: dict[str, bool] = {}

    def report(self, path: Path, message: str, *, key: bool = False) -> None:
        """Record a problem at `path`."""
        self.problems.append(Problem(self.spec.where(path, key=key), message))

    def empty(self, schema: StructType) -> DataFrame:
        """An empty DataFrame of `schema` (analysis only, never executed)."""
        return empty_frame(self.spark, schema)

    def try_expr(self, df: DataFrame, expr: str, path: Path, what: str) -> DataFrame | None:
        """`df.select(expr)`, or None after reporting Spark's analysis error at `path`."""
        from pyspark.errors import PySparkException
        from pyspark.sql import functions as F

        from streamer.spark_errors import spark_error_message

        try:
            out = df.select(F.expr(expr))
            out.schema  # noqa: B018 - forces analysis
        except (PySparkException, ValueError, TypeError) as exc:
            self.report(path, f"{what}: {spark_error_message(exc)}")
            return None
        alias = _implicit_alias(expr, out.columns[0])
        if alias:
            self.report(path, f"{what} is incomplete or has a stray word: Spark reads "
                        f"{expr!r} as {expr.rstrip()[:-len(alias)].rstrip()!r} named "
                        f"{alias!r}; complete the expression, or remove {alias!r}")
            return None
        return out

    # ------------------------------------------------------------------------ per node
    def source(self, s: SourceSpec) -> None:
        """Derive a source's schema and check its event_time."""
        try:
            schema = self.sources[s.id].schema()
        except StreamerError as exc:
            self.report(s.path, str(exc))
            return
        self.schemas[s.id] = schema
        self.event_time[s.id] = bool(s.event_time)
        if s.event_time:
            out = self.try_expr(self.empty(schema), s.event_time, (*s.path, "event_time"),
                                f"event_time of source {s.id!r}")
            if out is not None:
                kind = out.schema.fields[0].dataType.typeName()
                if kind not in ("timestamp", "timestamp_ntz"):
                    self.report((*s.path, "event_time"), f"event_time of source {s.id!r} must "
                                f"be a timestamp, but {s.event_time!r} is {kind}; convert it, "
                                "e.g. timestamp_millis(ts_ms) or to_timestamp(ts)")

    def inputs(self, node_id: str, inputs: tuple[str, ...], path: Path,
               owner: str) -> DataFrame | None:
        """An empty frame of the (unioned) inputs, or None if they cannot be unioned."""
        schemas = [(i, self.schemas[i]) for i in inputs if i in self.schemas]
        if len(schemas) != len(inputs):
            return None  # an upstream problem is already reported
        first_id, first = schemas[0]
        for other_id, other in schemas[1:]:
            a = sorted((f.name, f.dataType.simpleString()) for f in first.fields)
            b = sorted((f.name, f.dataType.simpleString()) for f in other.fields)
            if a != b:
                self.report((*path, "input"), f"the inputs of {owner} must have the same "
                            f"columns to be unioned: {first_id!r} has ({_describe(first)}) but "
                            f"{other_id!r} has ({_describe(other)}); align them with a select")
                return None
        return self.empty(first)

    def operator(self, o: OperatorSpec) -> None:
        """Check an operator's expressions and derive its output schema."""
        owner = f"operator {o.id!r}"
        if o.join is not None:
            self.join(o)
            return
        df = self.inputs(o.id, o.inputs, o.path, owner)
        if df is None:
            return
        has_ts = all(self.event_time.get(i, False) for i in o.inputs)
        self.event_time[o.id] = o.output_event_time(has_ts)
        if o.kind == "filter":
            assert o.filter is not None
            out = self.try_expr(df, o.filter, (*o.path, "filter"), f"filter of {owner}")
            if out is not None:
                kind = out.schema.fields[0].dataType.typeName()
                if kind != "boolean":
                    self.report((*o.path, "filter"), f"filter of {owner} must be a boolean "
                                f"expression, but {o.filter!r} is {kind}")
                else:
                    self.schemas[o.id] = df.schema
            return
        if o.kind in ("select", "with_columns"):
            ok = True
            for name, expr in o.columns:
                ok &= self.try_expr(df, expr, (*o.path, o.kind, name),
                                    f"column {name!r} of {owner}") is not None
            if ok:
                from streamer.operators.stateless import apply_stateless

                self.schemas[o.id] = apply_stateless(o, df).schema
            return
        self.keyed(o, df)

    def keyed(self, o: OperatorSpec, df: DataFrame) -> None:
        """Check key columns and aggregate arguments of a keyed operator."""
        owner = f"operator {o.id!r}"
        if o.window and o.window.time == "event" and not all(
                self.event_time.get(i, False) for i in o.inputs):
            self.report((*o.path, "window", "time"), f"{owner} has an event-time window, but "
                        "its input has no event time; set event_time: (and a watermark) on "
                        "the source, or use time: processing")
        columns = df.columns
        from streamer.pipeline.checker import did_you_mean

        for i, key in enumerate(o.key_by):
            if key not in columns:
                path: Path = (*o.path, "key_by", i)
                if path not in self.spec.positions.values:  # `key_by: user`, not a list
                    path = (*o.path, "key_by")
                self.report(path, f"key_by column {key!r} of {owner} is not in its input"
                            f"{did_you_mean(key, columns, listing='columns')}")
        types = {f.name: f.dataType for f in df.schema.fields}
        for i, key in enumerate(o.key_by):
            kind = type(types[key]).__name__ if key in types else None
            if kind in ("ArrayType", "MapType", "StructType", "VariantType"):
                path = (*o.path, "key_by", i)
                if path not in self.spec.positions.values:
                    path = (*o.path, "key_by")
                self.report(path, f"key_by column {key!r} of {owner} is "
                            f"{types[key].simpleString()}, which cannot be a key (no value of "
                            "it can be hashed into a key group); key by atomic columns, e.g. "
                            f"with_columns: {{{key}_key: \"to_json({key})\"}}")
        ok = all(key in columns for key in o.key_by)
        if o.process is not None:
            from streamer.operators.process import ProcessFunctionError, load_function_class

            try:
                import os

                from pyspark.sql.types import StructType

                base = os.path.dirname(os.path.abspath(self.spec.file))
                fn = load_function_class(o.process, base, o.id)
                declared = StructType.fromDDL(fn.output_schema)
                assert isinstance(declared, StructType)
                self.schemas[o.id] = declared
                for ddl in fn.side_output_schemas.values():
                    StructType.fromDDL(ddl)
                mapped = {name for name, _ in o.side_outputs}
                unknown = mapped - set(fn.side_output_schemas)
                if unknown:
                    self.report((*o.path, "side_outputs"), f"{owner} maps side outputs "
                                f"{sorted(unknown)}, which {o.process} does not declare in "
                                "side_output_schemas", key=True)
            except ProcessFunctionError as exc:
                self.report((*o.path, "process"), str(exc))
            except Exception as exc:  # a bad DDL string in user code
                self.report((*o.path, "process"), f"{owner}: the schemas of {o.process} are "
                            f"not valid Spark DDL: {exc}")
            return
        for agg in o.aggregates:
            ok &= self.aggregate(o, agg, df)
        if ok and o.process is None:
            from pyspark.sql.types import StructType

            from streamer.operators.keyed import output_schema

            out = output_schema(self.spark, o, df.schema)
            self.schemas[o.id] = StructType(
                [f for f in out.fields if not f.name.startswith(HIDDEN_PREFIX)])

    def aggregate(self, o: OperatorSpec, agg: AggregateSpec, df: DataFrame) -> bool:
        """Check an aggregate's arguments and that its function takes their types (Spark's
        analyzer on the partial and the final expression; the types the state's merges
        compare or hash), reporting at its line with the fix."""
        from streamer.operators.aggregates import accumulator

        path: Path = (*o.path, "aggregate", agg.name)
        what = f"aggregate {agg.name!r} of operator {o.id!r}"
        for arg in agg.args:
            out = self.try_expr(df, arg, path, what)
            if out is None:
                return False
            kind = out.schema.fields[0].dataType
            if agg.function in ("sum", "avg") and not _summable(kind):
                self.report(path, f"{what}: {agg.function}() needs numbers, but {arg!r} is "
                            f"{kind.simpleString()}; cast it, e.g. "
                            f"{agg.function}(cast({arg} as double))")
                return False
            if type(kind).__name__ in ("StructType", "ArrayType", "MapType", "VariantType"):
                compared = {"min": "value", "max": "value", "count_distinct": "value",
                            "max_by": "order", "min_by": "order"}.get(agg.function)
                if compared == "value" or (compared == "order" and arg == agg.args[-1]):
                    fix = (f"use max_by({arg}, <column>) or min_by({arg}, <column>) for the "
                           "row with the largest or smallest value of a column"
                           if agg.function in ("min", "max") else
                           f"count(distinct to_json({arg}))" if agg.function == "count_distinct"
                           else "order by an atomic column, e.g. a field of it")
                    shown = ("count(distinct ...)" if agg.function == "count_distinct"
                             else f"{agg.function}()")
                    self.report(path, f"{what}: {shown} cannot compare values of type "
                                f"{kind.simpleString()}; {fix}")
                    return False
        if agg.function in ("max_by", "min_by") and o.window is not None and (
                o.window.kind == "session"):
            self.report(path, f"{what}: {agg.function}() is not supported in session windows "
                        "yet; use a tumbling or sliding window, or a rolling aggregate")
            return False
        if agg.function == "count_distinct" and len(agg.args) > 1 and o.window is not None \
                and o.window.kind == "session":
            self.report(path, f"{what}: count(distinct) of several columns is not supported "
                        "in session windows yet; count one column, e.g. count(distinct "
                        f"concat_ws('|', {agg.arg}))")
            return False
        if agg.filter is not None and not self.condition(df, agg, path, what):
            return False
        acc = accumulator(agg, "0", "0")
        return all(self.try_expr(df, sql, path, what) is not None
                   for sql in (*acc.sql, acc.type_sql))

    def condition(self, df: DataFrame, agg: AggregateSpec, path: Path, what: str) -> bool:
        """Check an aggregate's `filter (where ...)`: a boolean expression of the input's
        columns, and no aggregate of its own."""
        assert agg.filter is not None
        out = self.try_expr(df, agg.filter, path, f"the filter of {what}")
        if out is None:
            return False
        kind = out.schema.fields[0].dataType
        if kind.simpleString() != "boolean":
            self.report(path, f"the filter of {what} must be a condition (true or false), but "
                        f"{agg.filter!r} is {kind.simpleString()}; compare it, e.g. filter "
                        f"(where {agg.filter} > 0)")
            return False
        return True

    def join(self, o: OperatorSpec) -> None:
        """Check a join's key columns, their types and the output's names (clashes); its
        output schema is the key columns, the left's others, the right's others."""
        from pyspark.sql.types import StructType

        from streamer.operators.join import join_columns, window_fields

        join = o.join
        assert join is not None
        self.event_time[o.id] = True
        if join.left not in self.schemas or join.right not in self.schemas:
            return  # an upstream problem is already reported
        for side, ref in (("left", join.left), ("right", join.right)):
            if not self.event_time.get(ref, False):
                self.report((*o.path, "join", side), f"the {side} input "
                            f"{ref!r} of join {o.id!r} has no event time; a "
                            "join matches records by event time: set event_time: (and a "
                            "watermark) on its source")
        _, problems, fields = join_columns(join, self.schemas[join.left],
                                           self.schemas[join.right])
        base: Path = (*o.path, "join")
        by_on = (*base, "on") in self.spec.positions.values
        for where, message in problems:
            if where == "on":
                where = "on" if by_on else "left_key"
            elif where.endswith("_key") and by_on:
                where = "on"
            path: Path = (*base, where)
            self.report(path, f"join {o.id!r}: {message}")
        if not problems:
            self.schemas[o.id] = StructType([*fields, *window_fields(join)])

    def sink(self, k: SinkSpec) -> None:
        """Check that a sink's inputs union and fit its format."""
        if k.id in self.spec.dead_letter_sinks:
            return
        df = self.inputs(k.id, k.inputs, k.path, f"sink {k.id!r}")
        if df is None:
            return
        if k.type == "delta":
            self.delta_columns(k, df.columns)
        if k.type == "files" and k.option("format") == "csv":
            for f in df.schema.fields:
                if f.dataType.typeName() in _NESTED:
                    self.report((*k.path, "format"), f"sink {k.id!r} writes csv, which cannot "
                                f"hold column {f.name!r} of type {f.dataType.simpleString()}; "
                                "use jsonl or parquet, or turn the column into a string")
        if k.type == "postgres":
            self._postgres_sink(k, df.schema)

    def _postgres_sink(self, k: SinkSpec, schema: Any) -> None:
        """The key columns are input columns; every column has a PostgreSQL type."""
        from streamer.connectors.postgres.database import unwritable

        key = k.option("key") or []
        for i, name in enumerate([key] if isinstance(key, str) else key):
            if name not in schema.fieldNames():
                where = (*k.path, "key") if isinstance(key, str) else (*k.path, "key", i)
                self.report(where, f"sink {k.id!r} has key column {name!r}, but its input "
                            f"has no such column (it has {', '.join(schema.fieldNames())}); "
                            "use one of them")
        bad = unwritable(schema)
        if bad:
            self.report((*k.path, "type"), f"sink {k.id!r} cannot write column "
                        f"{', '.join(bad)} to PostgreSQL; cast it to a supported type "
                        "(string, numbers, boolean, date, timestamp, binary, arrays, maps, "
                        "structs) before the sink")


    def delta_columns(self, k: SinkSpec, columns: list[str]) -> None:
        """A delta sink's `key` and `partition_by` name columns of its input."""
        for name in ("key", "partition_by"):
            value = k.option(name)
            for i, column in enumerate(value if isinstance(value, list) else [value]):
                if column is None or column in columns:
                    continue
                at = (*k.path, name, i) if isinstance(value, list) else (*k.path, name)
                self.report(at, f"sink {k.id!r} has {name}: {column}, but its input has no "
                            f"such column (it has {', '.join(columns)}); use one of them")


def analyze(spec: PipelineSpec, spark: SparkSession, sources: dict[str, Source],
            dataflow: Dataflow | None = None) -> dict[str, Any]:
    """Check all expressions; return the output schema per node id or raise `PipelineError`."""
    flow = dataflow or compile_dataflow(spec)
    az = Analyzer(spec, spark, sources)
    for node in flow.nodes:
        if node.role == "source":
            az.source(node.source)
        elif node.role == "operator":
            az.operator(node.operator)
        else:
            az.sink(node.sink)
    if az.problems:
        raise PipelineError(az.problems)
    return az.schemas


def _summable(kind: Any) -> bool:
    """Whether `sum`/`avg` add values of the Spark type `kind` as numbers (Spark itself would
    cast a string to a double, and fail the epoch on the first one that is not a number)."""
    from pyspark.sql.types import DayTimeIntervalType, NumericType, YearMonthIntervalType

    return isinstance(kind, NumericType | DayTimeIntervalType | YearMonthIntervalType)
