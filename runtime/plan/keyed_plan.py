"""Driver side of keyed operators: key groups, routing rows to their subtask, per-epoch
pre-aggregation in Spark SQL, and running the keyed stage exactly once per epoch.

Routing: a row's key group is `pmod(xxhash64(keys), max_parallelism)` and its subtask
`key_group * parallelism div max_parallelism` (Flink's assignment). To make Spark partition
index == subtask, each subtask gets a route value whose Spark hash partition (Murmur3, seed
42, the `hash()` function) is that subtask, found once per parallelism; rows are then
`repartition(parallelism, __route)` (a repartition by number, which adaptive execution never
coalesces). One dummy row per subtask makes every subtask run each epoch, so timers fire
even for subtasks that got no records.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pyspark.accumulators import AccumulatorParam

from streamer import columns as C
from streamer.columns import OUT
from streamer.operators.contract import COMBINES, Planning
from streamer.operators.direct import DirectRead, JoinSide, ipc_bytes
from streamer.operators.keyed import output_schema, run_task
from streamer.operators.keyed_config import KeyedConfig, window_settings
from streamer.operators.kinds import kind_of
from streamer.pipeline.job_spec import JobSpec
from streamer.pipeline.spec import OperatorSpec, SourceSpec
from streamer.runtime.subtasks import (
    claim_subtask,
    output_rows,
    subtask_batches,
    subtask_of_rows,
)
from streamer.state import held_subtasks
from streamer.worker import prepare_task

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from streamer.runtime.plan.join_plan import JoinPlan

EPOCH_SEQ = C.EPOCH_SEQ


def route_values(spark: SparkSession, parallelism: int) -> list[int]:
    """For each subtask s, a bigint whose Spark hash partition among `parallelism` is s."""
    from pyspark.sql import functions as F

    found: dict[int, int] = {}
    span = 64 * parallelism
    while len(found) < parallelism:
        rows = spark.range(0, span).select(
            "id", F.expr(f"pmod(hash(id), {parallelism})").alias("p")).collect()
        for row in rows:
            found.setdefault(row["p"], row["id"])
        span *= 4
    return [found[s] for s in range(parallelism)]


def visible(df: DataFrame) -> DataFrame:
    """`df` as a sink takes it: without an update stream's retractions (a sink keeps each
    key's new values) and without streamer's hidden columns (event time, routing)."""
    from pyspark.sql import functions as F

    if C.CHANGE in df.columns:
        df = df.filter(F.coalesce(F.col(C.CHANGE), F.lit(C.INSERT)) != F.lit(C.RETRACT))
    hidden = [c for c in df.columns if c.startswith(C.HIDDEN_PREFIX)]
    return df.drop(*hidden) if hidden else df


class _ListParam(AccumulatorParam[list[Any]]):
    """Accumulates task metadata lists."""

    def zero(self, value: list[Any]) -> list[Any]:
        return []

    def addInPlace(self, a: list[Any], b: list[Any]) -> list[Any]:  # Spark's method name
        a.extend(b)
        return a


class _Metas:
    """Per-subtask metadata of an epoch's keyed stage, read once its job has run; a subtask
    evaluated twice (a replay) reports the same metadata, so the last one per subtask wins."""

    def __init__(self, texts: Callable[[], list[str]]) -> None:
        self.texts = texts  # the JSON texts reported so far

    def __iter__(self) -> Any:
        by_subtask: dict[int, dict[str, Any]] = {}
        for text in self.texts():
            meta = json.loads(text)
            by_subtask.setdefault(meta["subtask"], {}).update(meta)
        return iter(by_subtask.values())


@dataclass
class KeyedResult:
    """What a keyed operator produced in an epoch."""

    output: DataFrame
    late: DataFrame | None
    #: Per-subtask metadata (next timers, rows out); complete after the epoch's jobs ran.
    metas: Any
    #: process only: side output name -> its rows.
    sides: dict[str, DataFrame] = field(default_factory=dict)
    #: With a `TaskTarget`: runs the stage's job, whose tasks write the output rows to the
    #: sink's staging files themselves (`output` is then empty).
    run_job: Any = None
    #: A window without a `late:` output: what counts the late records it dropped (`.get`:
    #: `late`), an `Observation` of the Spark path; None when `late` has them.
    late_seen: Any = None


@dataclass(frozen=True)
class DirectShape:
    """How a keyed stage reads its parquet source itself (fixed for the run)."""

    source_id: str
    columns: tuple[tuple[str, Any], ...]
    key_types: tuple[str, ...]
    ts_column: str | None
    #: A join reading both sources: per side (source id, the source's column of each of
    #: `columns` or None, the source's event-time column or None, its key columns);
    #: `source_id` is the left's.
    sides: tuple[tuple[str, tuple[str | None, ...], str | None, tuple[str, ...]], ...] = ()

    @property
    def source_ids(self) -> tuple[str, ...]:
        """The sources whose files the subtasks read."""
        return tuple(side[0] for side in self.sides) if self.sides else (self.source_id,)

    def read(self, watermark: int, files: tuple[str, ...] = (),
             table: bytes | None = None,
             side_files: tuple[tuple[str, ...], ...] = ()) -> DirectRead:
        """One epoch's `DirectRead` of these columns: `files`, or a local epoch's `table`
        (Arrow IPC), or a join's `side_files` (per side), or none (no input)."""
        sides = tuple(JoinSide(side_files[i] if side_files else (), columns, ts)
                      for i, (_, columns, ts, _) in enumerate(self.sides)) if table is None \
            else ()
        return DirectRead(files=files, columns=self.columns, key_types=self.key_types,
                          ts_column=self.ts_column, watermark=watermark, table=table,
                          sides=sides)


class KeyedStage(Planning):
    """One keyed operator's per-epoch Spark plan."""

    def __init__(self, spark: SparkSession, op: OperatorSpec, job: JobSpec, job_name: str,
                 input_schema: StructType, has_event_time: bool, state_root: str,
                 join: JoinPlan | None = None) -> None:
        self.spark = spark
        #: `key_by: []`: every record is under one key, a constant column of the stage's
        #: input (`KeyedOperatorStage.run` adds it; sinks never see it).
        self.global_key = not op.key_by and op.join is None
        if self.global_key:
            from pyspark.sql.types import IntegerType, StructField, StructType

            op = replace(op, key_by=(C.GLOBAL_KEY,))
            input_schema = StructType([StructField(C.GLOBAL_KEY, IntegerType()),
                                       *input_schema.fields])
        self.op = op
        self.parallelism = job.parallelism or spark.sparkContext.defaultParallelism
        self.max_parallelism = job.max_parallelism
        self._dummies: DataFrame | None = None  # see _constants
        self._routed_dummies: DataFrame | None = None
        self._route: Any = None
        self._starts: DataFrame | None = None  # see run_direct
        self._subtasks: Any = None  # an RDD of one element per subtask, see _launch
        self._empty: DataFrame | None = None  # see _no_output
        #: The parquet source this stage reads itself, when `stages.keyed.direct_plan`
        #: allows it (set by the planner).
        self.direct: DirectShape | None = None
        #: The columns of a local epoch's input the driver collects for the tasks, when
        #: `stages.keyed.local_plan` allows it (see `run_local`; set by the planner).
        self.local: DirectShape | None = None
        #: Local epochs run their subtasks in the driver (`run_local`): in local mode, where
        #: the driver reaches the state directories (`STREAMER_DRIVER_SUBTASKS=0`: never).
        self.in_driver = False
        self.input_schema = input_schema
        #: The source whose records reach the operator through stateless operators only
        #: (`join_plan.origin_of`), where its bad records go (set by the planner).
        self.origin: SourceSpec | None = None
        window = op.window
        self.domain = "event"
        if (window and window.time == "processing") or not has_event_time:
            self.domain = "processing"
        self.kind = kind_of(op.keyed_kind or "aggregate")
        self.fn_class: Any = None
        self.side_schemas: dict[str, str] = {}
        if op.process is not None:
            from streamer.operators.process import load_function_class

            assert op.process is not None
            self.fn_class = load_function_class(op.process, "", op.id)
            self.side_schemas = dict(self.fn_class.side_output_schemas)
        self.out_schema = self._output_schema()
        from pyspark.sql.pandas.types import to_arrow_schema

        self.base_config = KeyedConfig(
            uid=op.uid, kind=self.kind.name, keys=op.key_by, aggregates=op.aggregates,
            **window_settings(window),
            domain=self.domain, dedupe_ms=op.dedupe_within_ms,
            record_columns=tuple(f.name for f in input_schema.fields),
            out_schema=to_arrow_schema(self.out_schema, timezone="UTC"), backend=job.state_backend,
            state_root=state_root, job=job_name, parallelism=self.parallelism,
            max_parallelism=self.max_parallelism, epoch=0, fire_up_to=0,
            fn_class=self.fn_class, join=op.join,
            join_columns=join.columns if join is not None else None, op=op)
        #: join only: its sides' projection and bad-record routing (`runtime.plan.join_plan`).
        self.join = join

    # ------------------------------------------------------------------ schemas
    def _output_schema(self) -> StructType:
        return output_schema(self.spark, self.op, self.input_schema)

    @property
    def visible_schema(self) -> StructType:
        """The operator's output columns as downstream operators and sinks see them."""
        from pyspark.sql.types import StructType

        return StructType([f for f in self.out_schema.fields
                           if not f.name.startswith(C.HIDDEN_PREFIX)])

    def _no_output(self) -> DataFrame:
        """An empty frame of the stage's output columns (for stages whose tasks wrote it)."""
        if self._empty is None:
            from pyspark.sql.types import StructType

            self._empty = self.spark.createDataFrame([], StructType([
                f for f in self.out_schema.fields
                if f.name not in C.BOOKKEEPING]))
        return self._empty

    # ------------------------------------------------------------------ per epoch
    def _constants(self) -> None:
        """What every epoch's plan shares, built once: one dummy row per subtask (so every
        subtask runs), and the column mapping `__subtask` to its route value."""
        from pyspark.sql import functions as F

        if self._dummies is not None:
            return
        # (A Spark job, run only by stages that take the Spark path: direct reads need none.)
        routes = route_values(self.spark, self.parallelism)
        self._route = F.element_at(F.array(*[F.lit(r).cast("bigint") for r in routes]),
                                   F.col(C.SUBTASK) + 1)
        self._dummies = self.spark.range(0, self.parallelism, 1, 1).select(
            F.col("id").cast("int").alias(C.SUBTASK), F.lit(True).alias(C.DUMMY))
        self._routed_dummies = self._dummies.withColumn(C.ROUTE, self._route).repartition(
            self.parallelism, C.ROUTE)

    def _routed(self, df: DataFrame) -> DataFrame:
        """`df` with its route, in the Spark partition of its subtask."""
        return df.withColumn(C.ROUTE, self._route).repartition(self.parallelism, C.ROUTE)

    def routed(self, df: DataFrame) -> DataFrame:
        """`df` with its route, in the Spark partition of its subtask."""
        return self._routed(df)

    def count_late(self, df: DataFrame, is_late: Column, epoch: int) -> tuple[DataFrame, Any]:
        """(the records in time, the observation that counts the late ones, which are
        dropped)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        seen = Observation(f"late_{self.op.id}_{epoch}")
        df = df.observe(seen, F.count_if(is_late).alias("late"))
        return df.filter(~is_late), seen

    def _prepare(self, df: DataFrame, epoch: int, now_ms: int, watermark: int,
                 prerouted: bool = False) -> tuple[DataFrame, DataFrame | None, Any]:
        """(the epoch's rows as the subtasks take them, with routing columns: its kind's
        `prepare`, late records for a `late:` output or None, what counts the late records
        dropped or None). `prerouted`: route the records to their subtask's partition first
        and combine there, so the plan has one shuffle instead of two (no map-side
        combining: for small epochs)."""
        from pyspark.sql import functions as F

        keys = [F.col(k) for k in self.op.key_by]
        ts = (F.lit(now_ms).cast("bigint") if self.domain == "processing"
              else F.expr(f"unix_millis({C.EVENT_TIME})"))
        p, mp = self.parallelism, self.max_parallelism
        df = df.withColumns({
            C.EVENT_TIME_MS: ts,
            C.SEQUENCE: F.lit(epoch * EPOCH_SEQ) + F.monotonically_increasing_id(),
            C.KEY_GROUP: F.expr(f"pmod(xxhash64({', '.join(self.op.key_by)}), {mp})").cast("int"),
        }).withColumn(C.SUBTASK, F.expr(f"cast({C.KEY_GROUP} * {p} div {mp} as int)"))
        group = [F.col(C.SUBTASK), F.col(C.KEY_GROUP), *keys]
        return self.kind.prepare(self, df, group, epoch, watermark, prerouted)

    def run(self, df: DataFrame | None, epoch: int, now_ms: int, watermark: int,
            fire_up_to: int, checkpointing: Any = None, small: bool = False,
            write_to: Any = None, broadcast: DataFrame | None = None,
            table_load: int | None = None, flush: int | None = None) -> KeyedResult:
        """Run the keyed stage for one epoch (one Spark job); `watermark` decides lateness,
        `fire_up_to` which timers fire (the watermark, or wall clock for processing time),
        and `flush` (the end of input) which fire after the epoch's records too.
        `small`: the epoch has few rows, so they are routed before they are aggregated (one
        shuffle, see `_prepare`). `write_to`: the tasks write the output rows to this
        files-sink `TaskTarget` (see `_launch`). `broadcast`: a process function's
        broadcast records of the epoch, one copy of each to every subtask
        (`_broadcast_copies`). `table_load`: a table join's `reload:` table was read whole
        this epoch, as this load (`operators.join._drop_unloaded`)."""
        from pyspark.sql import functions as F

        if df is None:
            df = self.spark.createDataFrame([], self.input_schema)
            if C.EVENT_TIME not in df.columns:
                df = df.withColumn(C.EVENT_TIME, F.lit(None).cast("timestamp"))
        self._constants()
        assert self._dummies is not None and self._routed_dummies is not None
        prerouted = small and self.kind.has(COMBINES)
        rows, late, late_seen = self._prepare(df, epoch, now_ms, watermark, prerouted)
        if prerouted:
            # Both sides are hash-partitioned by route into `parallelism` partitions, so the
            # union keeps partition i = subtask i (spark.sql.unionOutputPartitioning) and
            # needs no further shuffle; `_read_input` checks it.
            rows = rows.withColumn(C.DUMMY, F.lit(False)).unionByName(
                self._routed_dummies, allowMissingColumns=True)
        else:
            rows = rows.withColumn(C.DUMMY, F.lit(False)).unionByName(
                self._dummies, allowMissingColumns=True)
            if broadcast is not None:
                rows = rows.unionByName(self._broadcast_copies(broadcast, epoch, now_ms),
                                        allowMissingColumns=True)
            rows = self._routed(rows)
        cfg = replace(self.base_config, epoch=epoch, fire_up_to=fire_up_to, flush_to=flush,
                      now_ms=now_ms, checkpointing=checkpointing, park=small)
        if table_load is not None:
            cfg = replace(cfg, extra={**cfg.extra, "table_load": table_load})
        return replace(self._launch(rows, cfg, late, write_to), late_seen=late_seen)

    def _broadcast_copies(self, df: DataFrame, epoch: int, now_ms: int) -> DataFrame:
        """The broadcast records `df` as one struct column (`BROADCAST`), with their event
        time (the wall clock without one) and a sequence number, each once per subtask: a
        record and its copies share both, so every subtask applies the records in the same
        order (`operators.process.run_process`)."""
        from pyspark.sql import functions as F

        shown = [c for c in df.columns if not c.startswith(C.HIDDEN_PREFIX)]
        ts = F.lit(now_ms).cast("bigint")
        if self.domain == "event" and C.EVENT_TIME in df.columns:
            ts = F.coalesce(F.expr(f"unix_millis({C.EVENT_TIME})"), ts)
        records = df.select(
            F.struct(*[F.col(f"`{c}`") for c in shown]).alias(C.BROADCAST),
            ts.alias(C.EVENT_TIME_MS),
            (F.lit(epoch * EPOCH_SEQ) + F.monotonically_increasing_id()).alias(C.SEQUENCE))
        return records.select(  # (numbered first: the copies of a record share its number)
            "*", F.explode(F.sequence(F.lit(0), F.lit(self.parallelism - 1))).alias(C.SUBTASK),
            F.lit(False).alias(C.DUMMY))

    def run_direct(self, read: DirectRead, epoch: int, now_ms: int, fire_up_to: int,
                   checkpointing: Any = None, write_to: Any = None,
                   table_load: int | None = None, flush: int | None = None) -> KeyedResult:
        """Run the keyed stage for one epoch whose subtasks read the epoch's files
        themselves (`direct_plan` said they can): one Spark task per subtask, no scan and no
        shuffle; each task's metadata carries the epoch's `records_in` and `max_ts`. Every
        epoch parks the subtask's state open in its worker (big ones too): its p tasks
        usually land on the same p workers, and the open + close it saves was ~10 % of the
        keyed-windows benchmark (bench/keyed_windows.py: 1.69 -> 1.53 s)."""
        cfg = self._direct_config(read, epoch, now_ms, fire_up_to, checkpointing, table_load,
                                  flush)
        if write_to is not None:  # nothing reads the output through Spark
            return self._launch(None, cfg, None, write_to)
        if self._starts is None:
            # Partition i holds the one row i: Spark partition index == subtask.
            self._starts = self.spark.range(0, self.parallelism, 1, self.parallelism)
        return self._launch(self._starts, cfg, None)

    def run_local(self, read: DirectRead, epoch: int, now_ms: int, fire_up_to: int,
                  checkpointing: Any = None, write_to: Any = None,
                  table_load: int | None = None, flush: int | None = None) -> KeyedResult:
        """Run the keyed stage for a local epoch (`runtime.plan.local`): `read` holds the
        epoch's few rows, collected on the driver without a job. With `in_driver` (local
        mode: the driver reaches the subtasks' state directories) the driver runs the
        subtasks itself, one after the other, with no Spark job at all. Otherwise one plain
        RDD job of one task per subtask runs now and brings the output rows back to the
        driver. Either way the output becomes a local relation, so what reads it runs no job
        either (or the subtasks write it to `write_to`)."""
        cfg = self._direct_config(read, epoch, now_ms, fire_up_to, checkpointing, table_load,
                                  flush)
        if self.in_driver and not cfg.executor_scoped:
            texts: list[str] = []
            parts: list[Any] = []

            def run() -> None:
                for subtask in range(self.parallelism):
                    try:
                        for batch in subtask_batches(cfg, iter(()), subtask, write_to,
                                                     texts.append):
                            if write_to is None:
                                parts.append(output_rows(batch))
                    except Exception as exc:
                        msg = f"subtask {subtask} failed: {type(exc).__name__}: {exc}"
                        raise SubtaskFailed(msg) from exc

            metas = _Metas(lambda: texts)
            if write_to is not None:  # the sink runs them when it stages its files
                return KeyedResult(self._no_output(), None, metas, {}, run)
            run()
        elif write_to is not None:
            return self._launch(None, cfg, None, write_to)
        else:
            import pyarrow as pa

            result = self._launch(None, cfg, None, collect=True)
            parts = [pa.ipc.open_stream(b).read_all() for b in result.run_job()]
            metas = result.metas
        return KeyedResult(self._local_output(parts), None, metas)

    def _direct_config(self, read: DirectRead, epoch: int, now_ms: int, fire_up_to: int,
                       checkpointing: Any, table_load: int | None,
                       flush: int | None) -> KeyedConfig:
        """The subtasks' config of an epoch whose input they read (`run_direct`,
        `run_local`)."""
        cfg = replace(self.base_config, epoch=epoch, fire_up_to=fire_up_to, flush_to=flush,
                      now_ms=now_ms, checkpointing=checkpointing, park=True, direct=read)
        if table_load is not None:
            cfg = replace(cfg, extra={**cfg.extra, "table_load": table_load})
        return cfg

    def _local_output(self, parts: list[Any]) -> DataFrame:
        """A local relation of the output rows `parts` (Arrow tables or batches)."""
        import pyarrow as pa

        schema = pa.schema([f for f in self.base_config.out_schema
                            if f.name not in C.BOOKKEEPING])
        tables = [p if isinstance(p, pa.Table) else pa.Table.from_batches([p]) for p in parts]
        # One chunk: PySpark 4.3's createDataFrame drops the rows after an empty chunk
        # (measured: chunks of 2, 0 and 1 rows give 2 rows; tests/runtime/test_local.py).
        table = pa.concat_tables([schema.empty_table(), *tables]).cast(schema).combine_chunks()
        return self.spark.createDataFrame(table, schema=self._no_output().schema)

    def _launch(self, rows: DataFrame | None, cfg: KeyedConfig, late: DataFrame | None,
                write_to: Any = None, collect: bool = False) -> KeyedResult:
        """`run_task` over `rows` (partition i = subtask i), lazily: the stage runs inside
        whichever job first reads its output. With `write_to` (a files sink's `TaskTarget`)
        each task writes its output rows to the sink's staging directory itself and hands
        Spark only its metadata, so the rows never cross into the JVM; `run_job` runs it.
        `rows` None (a direct read that writes its sink): no input and no output go through
        Spark SQL at all, so the job is a plain RDD job of one task per subtask (~45 ms less
        per epoch than an empty `mapInArrow` job, measured on this machine)."""
        from pyspark.sql import functions as F

        metas = self.spark.sparkContext.accumulator([], _ListParam())

        def task(batches: Any) -> Any:
            prepare_task()
            # The subtask is read from the rows, never from the task's partition index: a
            # keyed stage's output read by a union (a join of it with another input) runs
            # in the union's stage, whose partition indices are offset by the other
            # inputs' partitions.
            batches, subtask = subtask_of_rows(batches)
            # (`run_task` named here, so cloudpickle ships whatever it is now: the benches
            # wrap it.)
            return subtask_batches(cfg, batches, subtask, write_to,
                                   lambda meta: metas.add([meta]), run_task)

        if rows is None:
            assert write_to is not None or collect
            # In local mode a task runs the subtask its worker still holds, if it can
            # (`runtime.subtasks.claim_subtask`); on a cluster partition i runs subtask i.
            claims = (None if cfg.executor_scoped
                      else os.path.join(cfg.state_root, cfg.job, cfg.uid, ".claims"))
            parallelism = self.parallelism

            def drain(partition: Any) -> Any:
                prepare_task()
                subtask = next(iter(partition))  # (partition i holds the one element i)
                if claims is not None:
                    held = held_subtasks(cfg.state_root, cfg.job, cfg.uid)
                    subtask = claim_subtask(claims, cfg.epoch, subtask, parallelism,
                                            held[::-1])
                for batch in subtask_batches(cfg, iter(()), subtask, write_to,
                                             lambda meta: metas.add([meta]), run_task):
                    out = None if write_to is not None else output_rows(batch)
                    if out is not None and out.num_rows:
                        yield ipc_bytes(out)

            if self._subtasks is None:
                self._subtasks = self.spark.sparkContext.parallelize(
                    range(self.parallelism), self.parallelism)
            job = self._subtasks.mapPartitions(drain)
            return KeyedResult(self._no_output(), None, _Metas(lambda: metas.value), {},
                               job.collect)

        # No eager materialization: the stage runs inside whichever job first reads it
        # (usually the sink's). A second evaluation is safe: every task finds its epoch
        # already committed and replays the stored output instead of applying it again.
        result = rows.mapInArrow(task, self.out_schema)
        output = result.filter(F.col(C.ROW_KIND) == OUT).drop(*C.BOOKKEEPING)
        sides = {}
        for name, ddl in self.side_schemas.items():
            rows_of = result.filter((F.col(C.ROW_KIND) == C.SIDE) & (F.col(C.SIDE_OUTPUT) == name))
            sides[name] = rows_of.select(F.from_json(C.ROW_META, ddl).alias("r")).select("r.*")
        run_job = None if write_to is None else result.select(C.ROW_KIND).collect
        return KeyedResult(output, late, _Metas(lambda: metas.value), sides, run_job)


class SubtaskFailed(Exception):
    """A keyed subtask that the driver ran itself (`KeyedStage.run_local`) failed; the
    message says which and how, as Spark's says it of a task."""
