"""A keyed operator without Spark: Flink's `KeyedOneInputStreamOperatorTestHarness` for
streamer's keyed kinds (issue 38).

`OperatorHarness` takes one keyed operator of a pipeline YAML text and runs the engine's own
per-subtask code on real state backends, in this process, with no SparkSession:

- its config is the engine's (`operators.keyed_config.KeyedConfig`, from the validated
  `OperatorSpec` as `runtime.plan.keyed_plan.KeyedStage` builds it), its output columns
  `operators.keyed.output_schema` (typed without a session: `windows.arrow_typed_aggregate`);
- each `process(rows)` is one epoch as a *local epoch* runs it (`runtime.plan.local`, the
  `LocalRun` strategy): the rows go to every subtask as an Arrow IPC table
  (`operators.direct.DirectRead`), each subtask's `operators.keyed.run_task` reads its own key
  groups with `operators.direct.read_direct` (Spark's key-group hash, late records dropped and
  counted, windows assigned, partials combined in Arrow: what Spark's `prepare` delivers),
  fires the timers due at the watermark, applies the kind's logic and commits its state;
- `advance_watermark(ms)` is an epoch without records whose timers up to `ms` fire, and
  `finish()` the end of input (every timer fires);
- `snapshot(url)` writes every subtask's key groups in the savepoint format
  (`savepoint.format.write_key_groups`), and `OperatorHarness.restore` reads them into a fresh
  harness, on either backend, at any parallelism (each new subtask takes its key groups).

A join's two inputs (`process(left, right=...)`) go to its subtasks as one parquet file per
side and epoch, which `read_direct` projects onto the join's columns as when a join's
subtasks read both its sources' files (`operators.direct.JoinSide`).

What it can drive is what a local epoch can (`contract.LOCAL_EPOCHS`, `local_refusal`, the
direct read's shapes): windows (tumbling, sliding, session) and rolling aggregates of count,
sum, min, max and avg without `filter:`, dedupe, and interval, window and table joins, over
an append-only input. Count windows, `late:` outputs, the other aggregate functions (their
partials are Spark SQL: `operators.aggregates.accumulator(...).sql`), process functions,
top-N and OVER windows need Spark's `prepare`, and the harness refuses them with the reason.

It lives in `streamer.testing` (not in tests/) so a pipeline's author can test an operator
in their own suite in milliseconds, as with Flink's harness; nothing in the engine imports it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from streamer.columns import (
    BOOKKEEPING,
    CHANGE,
    EVENT_TIME,
    GLOBAL_KEY,
    HIDDEN_PREFIX,
    JOIN_SIDE,
    META,
    OUT,
    RETRACT,
    ROW_KIND,
    ROW_META,
)
from streamer.exchange.alignment import MAX_WATERMARK, MIN_WATERMARK
from streamer.operators.contract import LOCAL_EPOCHS, WHOLE_RECORDS
from streamer.operators.direct import DIRECT_AGGREGATES, DirectRead, JoinSide, ipc_bytes
from streamer.operators.keyed import open_state_of, output_schema, run_task
from streamer.operators.keyed_config import KeyedConfig, window_settings
from streamer.operators.kinds import kind_of
from streamer.pipeline.spec import OperatorSpec, PipelineSpec
from streamer.pipeline.validate import load_pipeline_text
from streamer.savepoint.format import restore_key_groups, write_key_groups
from streamer.state import key_group_range
from streamer.state.keygroups import PYTHON_HASHED_TYPES

#: Spark type names of a source's `schema:` the harness reads (the direct read's types).
_TYPES = ("string", "tinyint", "smallint", "int", "bigint", "float", "double", "boolean",
          "date", "timestamp")


class HarnessError(ValueError):
    """The operator cannot be driven without Spark, or the harness was asked something it
    does not do: the message says which setting and why."""


@dataclass(frozen=True)
class Snapshot:
    """A harness's state in the savepoint format: where, every subtask's key-group files,
    the epoch it was taken after and the watermark its next epoch runs with."""

    url: str
    files: tuple[Mapping[str, Any], ...]
    epoch: int
    watermark: int


class OperatorHarness:
    """One keyed operator's subtasks, run in this process (module docstring). `rows` is
    everything emitted so far, as a sink sees it (visible columns, no retractions);
    `emitted` the same rows with the hidden columns (`__ts`, `__op`), as a keyed operator
    after it would read them; `late_dropped` the late records the reads dropped."""

    def __init__(self, spec: PipelineSpec, op: OperatorSpec, input_schema: Any, root: Path, *,
                 backend: str, parallelism: int, changelog: bool = False,
                 event_from: str | None = None, join: JoinInput | None = None,
                 watermark: int = MIN_WATERMARK, epoch: int = 0) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.op = op
        self.input_schema = input_schema  # a Spark StructType (its classes need no session)
        self.root = root
        #: The column of an input row that holds its event time, when it has no `__ts`.
        self.event_from = event_from
        #: A join's two inputs (None for the other kinds).
        self.join = join
        self.watermark = watermark
        #: The watermark its last epoch ran with (see `output_watermark`).
        self.ran_with = watermark
        self.epoch = epoch
        self.emitted: list[dict[str, Any]] = []
        self.late_dropped = 0
        kind = kind_of(op.keyed_kind or "aggregate")
        out_schema = output_schema(None, op, input_schema)
        window = op.window
        timed = join.timed if join is not None else EVENT_TIME in input_schema.fieldNames()
        event = timed and not (window and window.time == "processing")
        self.cfg = KeyedConfig(
            uid=op.uid, kind=kind.name, keys=op.key_by, aggregates=op.aggregates,
            **window_settings(window),
            domain="event" if event else "processing", dedupe_ms=op.dedupe_within_ms,
            record_columns=tuple(input_schema.fieldNames()),
            out_schema=to_arrow_schema(out_schema, timezone="UTC"), backend=backend,
            state_root=str(root), job=spec.name, parallelism=parallelism,
            max_parallelism=spec.job.max_parallelism, epoch=0, fire_up_to=0,
            changelog=changelog, op=op, park=True,  # (as a local epoch's subtasks do)
            join=op.join, join_columns=join.columns if join is not None else None)
        self.arrow_input = to_arrow_schema(input_schema, timezone="UTC")
        self.columns = _direct_columns(op, kind.has(WHOLE_RECORDS), input_schema)
        self.key_types = tuple(input_schema[k].dataType.simpleString() for k in op.key_by)

    # ------------------------------------------------------------------ building one
    @classmethod
    def of(cls, text: str, operator: str, root: str | Path, *, backend: str | None = None,
           parallelism: int | None = None, schema: Mapping[str, str] | None = None,
           right_schema: Mapping[str, str] | None = None, changelog: bool = False
           ) -> OperatorHarness:
        """The harness of keyed operator `operator` of the pipeline YAML `text`, its state
        under `root`. Its input columns are `schema` ({column: Spark type name}) or, when
        it reads a source, the source's `schema:` (its `event_time:` column becomes the
        record's event time); the backend and parallelism are the job's unless given.
        A join's inputs are `schema` (its left) and `right_schema` (else `schema`), else
        their sources' through stateless operators (which the harness does not run: give
        it each side's rows as they reach the join). `changelog`: a keyed operator reads
        this rolling aggregate (the planner's rule)."""
        spec = load_pipeline_text(text)
        op = next((o for o in spec.operators if o.id == operator), None)
        if op is None or op.keyed_kind is None:
            msg = f"pipeline {spec.name!r} has no keyed operator {operator!r}"
            raise HarnessError(msg)
        refusal = refusal_of(op)
        if refusal is not None:
            msg = f"operator {operator!r} needs Spark: {refusal}"
            raise HarnessError(msg)
        settings: dict[str, Any] = {"backend": backend or spec.job.state_backend,
                                    "parallelism": parallelism or spec.job.parallelism or 1,
                                    "changelog": changelog}
        if op.join is not None:
            join = join_input(spec, op, schema, right_schema or schema)
            return cls(spec, op, join.stage, Path(root), join=join, **settings)
        source = _source_of(spec, op.inputs[0])
        fields = dict(schema) if schema is not None else _source_schema(op, source)
        if CHANGE in fields:  # (as `runtime.plan.stages.keyed_stage.local_plan` refuses it)
            msg = (f"operator {operator!r} needs Spark: its input is an update stream (its "
                   f"retractions are signed in Spark's partials)")
            raise HarnessError(msg)
        keyed = _keyed(op)
        return cls(spec, keyed, _struct(fields, keyed.key_by), Path(root),
                   event_from=source.event_time if source is not None else None, **settings)

    # ------------------------------------------------------------------ driving it
    def process(self, rows: Iterable[Mapping[str, Any]] | Any, now_ms: int = 0, *,
                right: Iterable[Mapping[str, Any]] | Any = ()) -> list[dict[str, Any]]:
        """One epoch: the timers due at the watermark fire, then `rows` (dicts, or an Arrow
        table of the input columns; event times as epoch ms or datetimes) are taken (a
        join's left rows; `right` its right rows); late ones are dropped and counted.
        Returns the rows emitted, as `rows` holds them."""
        if self.join is None:
            return self._epoch(self.table(rows), now_ms, None)
        return self._epoch(self._sides(rows, right), now_ms, None)

    def advance_watermark(self, ms: int, now_ms: int = 0, *, fire: bool = True
                          ) -> list[dict[str, Any]]:
        """The watermark moves to `ms` (never back): the timers up to it fire now, or, with
        `fire=False`, at the start of the next `process` (as the engine's next epoch fires
        them before its records)."""
        self.watermark = max(self.watermark, ms)
        return self._epoch(None, now_ms, None) if fire else []

    def finish(self, now_ms: int = 0) -> list[dict[str, Any]]:
        """The end of input: every timer fires (Flink's MAX_WATERMARK)."""
        return self._epoch(None, now_ms, MAX_WATERMARK)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Everything emitted, as a sink sees it."""
        return visible(self.emitted)

    def table(self, rows: Iterable[Mapping[str, Any]] | Any) -> Any:
        """`rows` as an Arrow table of the operator's input columns."""
        return _arrow_table(rows, self.arrow_input, self.op, self.event_from)

    def _sides(self, left: Any, right: Any) -> tuple[JoinSide, JoinSide]:
        """A join's rows of the epoch, each side's as the parquet file its subtasks read
        (`operators.direct.JoinSide`: the join's subtasks reading both sources' files)."""
        import pyarrow.parquet as pq

        assert self.join is not None
        folder = self.root / "input"
        folder.mkdir(parents=True, exist_ok=True)
        names = [name for name, _ in self.columns]
        out = []
        for side, rows in enumerate((left, right)):
            path = folder / f"{self.epoch + 1}-{side}.parquet"
            pq.write_table(_arrow_table(rows, self.join.schemas[side], self.op,
                                        self.join.event_from[side]), path)
            own = self.join.columns.of_side(side)
            out.append(JoinSide((str(path),), tuple(own.get(n) for n in names),
                                EVENT_TIME if self.cfg.domain == "event" else None))
        return out[0], out[1]

    def _epoch(self, rows: Any, now_ms: int, flush: int | None) -> list[dict[str, Any]]:
        import pyarrow as pa

        if rows is None and self.join is not None:
            rows = self._sides([], [])
        self.epoch += 1
        if rows is None:
            rows = pa.schema([pa.field(n, t) for n, t in self.columns]).empty_table()
        sides = rows if isinstance(rows, tuple) else ()
        read = DirectRead(files=(), columns=self.columns, key_types=self.key_types,
                          ts_column=EVENT_TIME if self.cfg.domain == "event" else None,
                          watermark=self.watermark, sides=sides, table=None if sides else
                          ipc_bytes(rows.select([n for n, _ in self.columns])))
        fire_up_to = self.watermark if self.cfg.domain == "event" else now_ms
        self.ran_with = self.watermark
        cfg = replace(self.cfg, epoch=self.epoch, fire_up_to=fire_up_to, now_ms=now_ms,
                      flush_to=flush, direct=read)
        out: list[dict[str, Any]] = []
        late = 0
        for subtask in range(cfg.parallelism):
            for batch in run_task(cfg, iter(()), subtask):
                for row in batch.to_pylist():
                    if row[ROW_KIND] == OUT:
                        out.append({k: v for k, v in row.items() if k not in BOOKKEEPING})
                    elif row[ROW_KIND] == META:
                        late = max(late, json.loads(row[ROW_META]).get("late", 0))
        self.late_dropped += late  # (every subtask reads all rows: each counts them all)
        if flush is not None:
            self.watermark = flush
        self.emitted += out
        return visible(out)

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, url: str | Path) -> Snapshot:
        """Every subtask's state, in the savepoint format, under `url` (a new directory)."""
        files: list[Mapping[str, Any]] = []
        for subtask in range(self.cfg.parallelism):
            backend = open_state_of(self.cfg, subtask)
            try:
                files += write_key_groups(backend, str(url), self.cfg.uid, subtask)["files"]
            except BaseException:
                backend.close()
                raise
            backend.park()
        return Snapshot(str(url), tuple(files), self.epoch, self.watermark)

    def restore(self, snapshot: Snapshot, root: str | Path, *, backend: str | None = None,
                parallelism: int | None = None) -> OperatorHarness:
        """A fresh harness of this operator whose state is `snapshot`'s, under `root`, on
        `backend` at `parallelism` (each subtask takes its key groups), which goes on from
        the snapshot's epoch and watermark."""
        root = Path(root)
        if root.exists() and any(root.iterdir()):
            msg = f"cannot restore into {str(root)!r}: it is not empty (give a new directory)"
            raise HarnessError(msg)
        fresh = copy.copy(self)
        fresh.root, fresh.emitted, fresh.late_dropped = root, [], 0
        fresh.epoch, fresh.watermark = snapshot.epoch, snapshot.watermark
        fresh.cfg = replace(self.cfg, state_root=str(root),
                            backend=backend or self.cfg.backend,
                            parallelism=parallelism or self.cfg.parallelism)
        p, maxp = fresh.cfg.parallelism, fresh.cfg.max_parallelism
        for subtask in range(p):
            state = open_state_of(fresh.cfg, subtask)
            try:
                restore_key_groups(snapshot.url, snapshot.files, state,
                                   key_group_range(subtask, p, maxp))
                state.commit(snapshot.epoch)
            except BaseException:
                state.close()
                raise
            state.park()
        return fresh

    @property
    def output_watermark(self) -> int:
        """The watermark a keyed operator reading this one runs its next epoch with: the one
        this one's last epoch ran with, less what it may still emit behind it
        (`OperatorSpec.watermark_hold_ms`; `runtime.watermarks`)."""
        if self.ran_with in (MIN_WATERMARK, MAX_WATERMARK):
            return self.ran_with
        return self.ran_with - self.op.watermark_hold_ms

    def close(self) -> None:
        """Close the subtasks' state (a RocksDB handle stays open between epochs, parked in
        this process as a local epoch's is: `KeyedStateBackend.park`)."""
        for subtask in range(self.cfg.parallelism):
            open_state_of(self.cfg, subtask).close()

    def __enter__(self) -> OperatorHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def output_schema(self) -> dict[str, str]:
        """The operator's output columns ({name: Spark type name}), hidden ones (`__ts`,
        `__op`) included: the `schema` of a harness of a keyed operator reading it."""
        from pyspark.sql.pandas.types import from_arrow_type

        return {f.name: str(from_arrow_type(f.type).simpleString())
                for f in self.cfg.out_schema if f.name not in BOOKKEEPING}


def refusal_of(op: OperatorSpec) -> str | None:
    """Why the harness cannot drive `op` without Spark (None: it can)."""
    kind = kind_of(op.keyed_kind or "aggregate")
    if not kind.has(LOCAL_EPOCHS):
        return f"a {kind.name} operator's records go through Spark's `prepare` every epoch"
    refusal = kind.local_refusal(op)
    if refusal is not None:
        return refusal
    for agg in op.aggregates:
        if agg.function not in DIRECT_AGGREGATES:
            return (f"aggregate {agg.name!r} is {agg.function}(), whose partials are Spark "
                    f"SQL (the harness computes count, sum, min, max and avg)")
        if agg.filter is not None:
            return f"aggregate {agg.name!r} has a filter (a Spark SQL condition)"
    return None


def visible(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` as a sink gets them: no retractions, no hidden columns
    (`runtime.plan.keyed_plan.visible`)."""
    return [{k: v for k, v in r.items() if not k.startswith(HIDDEN_PREFIX)}
            for r in rows if r.get(CHANGE) != RETRACT]


def _keyed(op: OperatorSpec) -> OperatorSpec:
    """`op` as the keyed stage runs it: `key_by: []` keys every record by one constant."""
    if not op.key_by and op.join is None:
        return replace(op, key_by=(GLOBAL_KEY,))
    return op


@dataclass(frozen=True)
class JoinInput:
    """A join's two inputs as the harness takes them: each side's columns (an Arrow schema
    of its own columns, with `__ts` when timed) and event-time column of its rows, the
    join's columns (`operators.join.join_columns`) and the stage's input (Spark schema:
    the output columns, `__ts`, `__join_side`, as `runtime.plan.join_plan.plan_join` has it)."""

    schemas: tuple[Any, Any]
    event_from: tuple[str | None, str | None]
    columns: Any
    stage: Any
    timed: bool


def join_input(spec: PipelineSpec, op: OperatorSpec, left: Mapping[str, str] | None,
               right: Mapping[str, str] | None) -> JoinInput:
    """The `JoinInput` of join `op`: its sides' columns given, or their sources'."""
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_schema

    from streamer.operators.join import join_columns

    join = op.join
    assert join is not None
    structs, event_from = [], []
    for given, name in ((left, join.left), (right, join.right)):
        source = _source_of(spec, name)
        side = dict(given) if given is not None else _source_schema(op, source)
        structs.append(_struct(side, ()))
        event_from.append(source.event_time if source is not None else None)
    columns, problems, output = join_columns(join, structs[0], structs[1])
    if problems:
        msg = f"join {op.id!r}: " + "; ".join(message for _, message in problems)
        raise HarnessError(msg)
    stage = T.StructType([*output, T.StructField(EVENT_TIME, T.TimestampType()),
                          T.StructField(JOIN_SIDE, T.IntegerType())])
    timed = all(EVENT_TIME in s.fieldNames() for s in structs)
    return JoinInput((to_arrow_schema(structs[0], timezone="UTC"),
                      to_arrow_schema(structs[1], timezone="UTC")),
                     (event_from[0], event_from[1]), columns, stage, timed)


def _source_of(spec: PipelineSpec, node: str) -> Any:
    """The source whose records reach `node` through stateless operators, or None."""
    while True:
        source = next((s for s in spec.sources if s.id == node), None)
        if source is not None:
            return source
        op = next((o for o in spec.operators if o.id == node), None)
        if op is None or op.keyed_kind is not None or len(op.inputs) != 1:
            return None
        node = op.inputs[0]


def _source_schema(op: OperatorSpec, source: Any) -> dict[str, str]:
    """The operator's input columns when it reads a source with a `schema:`: that schema,
    its `event_time:` column also as the record's event time."""
    if source is None or source.schema is None:
        msg = (f"operator {op.id!r} does not read a source with a `schema:` through stateless "
               f"operators: give the harness its input columns (schema=)")
        raise HarnessError(msg)
    fields = dict(source.schema)
    if source.event_time:
        fields[EVENT_TIME] = "timestamp"
    return fields


def _struct(fields: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    """The Spark schema of `fields` (`key_by: []`, keyed by `GLOBAL_KEY`, adds it)."""
    from pyspark.sql import types as T

    simple = {"string": T.StringType(), "tinyint": T.ByteType(), "smallint": T.ShortType(),
              "int": T.IntegerType(), "bigint": T.LongType(), "float": T.FloatType(),
              "double": T.DoubleType(), "boolean": T.BooleanType(), "date": T.DateType(),
              "timestamp": T.TimestampType()}
    out = [T.StructField(GLOBAL_KEY, T.IntegerType())] if keys == (GLOBAL_KEY,) else []
    for name, type_name in fields.items():
        if str(type_name) not in simple:
            msg = f"column {name!r} of type {type_name!r}: the harness reads {', '.join(_TYPES)}"
            raise HarnessError(msg)
        out.append(T.StructField(name, simple[str(type_name)]))
    for key in keys:
        if key == GLOBAL_KEY:
            continue
        if key not in fields or str(fields[key]) not in PYTHON_HASHED_TYPES:
            msg = f"key {key!r} is not a plain string, integer, boolean or date column"
            raise HarnessError(msg)
    return T.StructType(out)


def _direct_columns(op: OperatorSpec, whole: bool, schema: Any
                    ) -> tuple[tuple[str, Any], ...]:
    """The columns a direct read casts (`runtime.plan.stages.keyed_stage._direct_shape`): every
    column for a kind of whole records, else the keys, the aggregates' arguments and the
    event time."""
    from pyspark.sql.pandas.types import to_arrow_type

    names = list(schema.fieldNames()) if whole else [
        *op.key_by, *[a.arg for a in op.aggregates if a.arg is not None],
        *([EVENT_TIME] if EVENT_TIME in schema.fieldNames() else [])]
    unique = list(dict.fromkeys(names))
    return tuple((n, to_arrow_type(schema[n].dataType, timezone="UTC")) for n in unique)


def _arrow_table(rows: Any, schema: Any, op: OperatorSpec, event_from: str | None) -> Any:
    """`rows` (dicts, event times as epoch ms or datetimes, or an Arrow table) as an Arrow
    table of `schema`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(rows, pa.Table):
        return _with_constants(rows, op).select(schema.names).cast(schema)
    listed = [dict(r) for r in rows]
    arrays = []
    for f in schema:
        values = [_value(r, f.name, op, event_from) for r in listed]
        if pa.types.is_timestamp(f.type) and any(isinstance(v, int) for v in values):
            ms = pa.array(values, pa.int64())
            arrays.append(pc.multiply(ms, 1000).cast(f.type))
        else:
            arrays.append(pa.array(values, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _with_constants(table: Any, op: OperatorSpec) -> Any:
    import pyarrow as pa

    if GLOBAL_KEY in table.column_names or op.key_by != (GLOBAL_KEY,):
        return table
    return table.append_column(GLOBAL_KEY, pa.array([0] * table.num_rows, pa.int32()))


def _value(row: Mapping[str, Any], name: str, op: OperatorSpec, event_from: str | None
           ) -> Any:
    """Column `name` of an input row (the event time: its `event_from` column, unless it
    has `__ts` already)."""
    if name == GLOBAL_KEY and op.key_by == (GLOBAL_KEY,):
        return 0
    if name == EVENT_TIME and name not in row and event_from is not None:
        return row.get(event_from)
    return row.get(name)

