"""Keyed stages: one keyed operator (its per-subtask logic is `operators.keyed.run_task`,
written once) and the strategies that run its subtasks for an epoch.

- `RoutedRun` (always available): Spark pre-aggregates the epoch's rows per key and window,
  routes them by key group so that Spark partition i is subtask i, and runs the subtasks in
  `mapInArrow` (a small epoch routes first and aggregates after: one shuffle, not two).
- `SubtaskReadRun`: the subtasks read the epoch's local parquet files themselves, one Spark
  task per subtask, no scan and no shuffle (`direct_plan` says when).
- `LocalRun`: a local epoch's few rows, collected on the driver without a job, go to the
  subtasks, which run in the driver process (local mode) or in one plain RDD job.
- `StagedRun` (local mode): Spark computes the stage's input (a JSON, CSV or Kafka read, a
  filter, a derived column) and writes it once as local parquet files, which the subtasks
  then read as `SubtaskReadRun` reads a source's: one write instead of a partial
  aggregation, two shuffles and a final aggregation. For JSON-lines files, Kafka JSON values
  or parquet files with operators before the stage, Python tasks may compute most or all of
  that input with Arrow instead (`runtime.arrow.arrow_input`).

Which one runs in an epoch follows one rule (`KeyedOperatorStage.choose`): the subtasks read
their source themselves when the epoch's decision gave them its slice; else the epoch is
local when its input is a local relation (or it has none and the last input was local);
else, when planned, Spark stages the input for the subtasks unless the epoch is small (an
epoch without input then reads no files); else Spark routes the rows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

from streamer import failpoints
from streamer.columns import CHANGE, EVENT_TIME, GLOBAL_KEY, HIDDEN_PREFIX, JOIN_SIDE
from streamer.connectors.base import WritesTaskFiles
from streamer.operators.contract import EVERY_RECORD, LOCAL_EPOCHS, WHOLE_RECORDS
from streamer.operators.direct import DIRECT_AGGREGATES, ipc_bytes
from streamer.operators.stateless import union
from streamer.runtime.arrow.arrow_input import clear_other_epochs
from streamer.runtime.plan.keyed_plan import DirectShape, KeyedResult, KeyedStage
from streamer.runtime.plan.local import local_table
from streamer.runtime.plan.stages.base import (
    DEAD,
    LATE,
    EpochInput,
    Routed,
    Seen,
    SinkJob,
    Stage,
    StageOutput,
    Upstream,
)
from streamer.runtime.plan.stages.sources import DirectSeen

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from streamer.runtime.arrow.arrow_input import ArrowInput


@dataclass(frozen=True)
class TaskSink:
    """The sink whose staging files a keyed stage's subtasks write themselves (planned by
    `runtime.plan.physical`: the stage's only consumer, a sink that takes task-written files)."""

    sink_id: str
    sink: WritesTaskFiles


@dataclass(frozen=True)
class KeyedInput:
    """What a keyed stage's strategy runs its subtasks over in one epoch."""

    #: The input frames that have rows this epoch (a join: both sides as one frame).
    present: list[DataFrame]
    #: A process function's broadcast input (every subtask gets its records), or None.
    broadcast: DataFrame | None
    #: The parquet files of its input Arrow tasks wrote this epoch (`StagedRun`).
    prestaged: tuple[str, ...]
    #: Timers due up to this fire (the operator's watermark, or now).
    fire: int
    #: The subtasks' checkpointing this epoch (`checkpointing` of the plan).
    tasks: Any
    #: Where the subtasks write their sink's staging files (a `TaskTarget`), or None.
    write_to: Any
    #: A local epoch: its input collected on the driver (an Arrow table).
    collected: Any = None


class KeyedRun(ABC):
    """One way to run a keyed stage's subtasks for an epoch."""

    name: ClassVar[str]

    def __init__(self, stage: KeyedStage, reason: str) -> None:
        self.stage = stage
        self.reason = reason

    @abstractmethod
    def run(self, epoch: EpochInput, given: KeyedInput) -> KeyedResult:
        """Run the subtasks for `epoch` over `given` (the input frames, or files)."""

    def records_in(self, epoch: EpochInput, result: KeyedResult) -> dict[str, Seen]:
        """Source id -> what observes the records of its slice the subtasks read themselves
        (none: Spark or the driver read the sources)."""
        return {}

    def ran(self, node_id: str) -> StageOutput:
        """How the epoch's metrics name this strategy's run of `node_id` (none: routed)."""
        return StageOutput()

    def table_load(self, epoch: EpochInput) -> int | None:
        """A table join's `reload:` table load read this epoch
        (`runtime.plan.join_plan.table_load`), or None."""
        if self.stage.join is None:
            return None
        from streamer.runtime.plan.join_plan import table_load

        return table_load(self.stage.join, epoch.slices)


class RoutedRun(KeyedRun):
    """Spark pre-aggregates, routes by key group and runs the subtasks in `mapInArrow`."""

    name = "spark-routed"

    def run(self, epoch: EpochInput, given: KeyedInput) -> KeyedResult:
        """One Spark plan, run by whichever job reads the output (or writes the sink); a
        process function's broadcast input goes with it, to every subtask."""
        op = self.stage.op
        present = given.present
        return self.stage.run(union(present) if present else None, epoch.epoch, epoch.now,
                              epoch.watermark_of(op.id), given.fire, given.tasks,
                              epoch.decision.small, given.write_to, given.broadcast,
                              table_load=self.table_load(epoch), flush=epoch.flush)


class SubtaskReadRun(KeyedRun):
    """The subtasks read their source's parquet files themselves."""

    name = "subtasks-read-files"

    def __init__(self, stage: KeyedStage, reason: str, shape: DirectShape) -> None:
        super().__init__(stage, reason)
        self.shape = shape

    def run(self, epoch: EpochInput, given: KeyedInput) -> KeyedResult:
        """One Spark task per subtask over the files the epoch's decision listed."""
        read = epoch.decision.direct[self.shape.source_id].read
        return self.stage.run_direct(read, epoch.epoch, epoch.now, given.fire, given.tasks,
                                     given.write_to, table_load=self.table_load(epoch),
                                     flush=epoch.flush)

    def records_in(self, epoch: EpochInput, result: KeyedResult) -> dict[str, Seen]:
        """Each source that had a slice: its records in and newest event time, from the
        subtasks' metadata (a join: per side)."""
        return {source_id: DirectSeen(result.metas, side if self.shape.sides else None)
                for side, source_id in enumerate(self.shape.source_ids)
                if epoch.decision.direct[source_id].had_slice}

    def ran(self, node_id: str) -> StageOutput:
        """The metrics' `direct`."""
        return StageOutput(ran_direct=(node_id,))


class LocalRun(KeyedRun):
    """A local epoch: the collected rows go to the subtasks in the driver or one RDD job."""

    name = "local"

    def __init__(self, stage: KeyedStage, reason: str, shape: DirectShape) -> None:
        super().__init__(stage, reason)
        self.shape = shape

    def run(self, epoch: EpochInput, given: KeyedInput) -> KeyedResult:
        """Run the subtasks over `collected` (an Arrow table of the epoch's input)."""
        inline = self.shape.read(epoch.watermark_of(self.stage.op.id),
                                 table=ipc_bytes(given.collected))
        return self.stage.run_local(inline, epoch.epoch, epoch.now, given.fire, given.tasks,
                                    given.write_to, table_load=self.table_load(epoch),
                                    flush=epoch.flush)

    def ran(self, node_id: str) -> StageOutput:
        """The metrics' `local` (its output is a local relation for the stages after it)."""
        return StageOutput(ran_local=(node_id,))


class StagedRun(KeyedRun):
    """Spark writes the epoch's input once as local parquet files; the subtasks read them."""

    name = "spark-staged-files"

    def __init__(self, stage: KeyedStage, reason: str, shape: DirectShape, root: str) -> None:
        super().__init__(stage, reason)
        self.shape = shape
        #: The directory of the staged epochs (local: the subtasks share the driver's disk).
        self.root = root
        #: Arrow tasks compute the input from its source (`runtime.arrow.arrow_input`), or None.
        self.arrow: ArrowInput | None = None

    def run(self, epoch: EpochInput, given: KeyedInput) -> KeyedResult:
        """Stage `present` (a Spark job now), then one Spark task per subtask reads it."""
        present = given.present
        files = self.stage_input(epoch.epoch, union(present)) if present else ()
        files = (*given.prestaged, *files)
        failpoints.reached("staged", epoch.epoch)
        read = self.shape.read(epoch.watermark_of(self.stage.op.id), files=files)
        return self.stage.run_direct(read, epoch.epoch, epoch.now, given.fire, given.tasks,
                                     given.write_to, table_load=self.table_load(epoch),
                                     flush=epoch.flush)

    def ran(self, node_id: str) -> StageOutput:
        """The metrics' `staged`."""
        return StageOutput(ran_staged=(node_id,))

    def stage_input(self, epoch: int, frame: DataFrame) -> tuple[str, ...]:
        """Write the columns the subtasks read as the parquet files of epoch `epoch`
        (rewritten whole when an epoch is replayed); earlier epochs' files go."""
        import os

        from pyspark.sql import functions as F

        os.makedirs(self.root, exist_ok=True)
        target = os.path.join(self.root, f"epoch-{epoch}")
        clear_other_epochs(self.root, f"epoch-{epoch}")
        frame.select(*[F.col(f"`{name}`") for name, _ in self.shape.columns]).write.mode(
            "overwrite").option("compression", "none").parquet(target)
        return tuple(sorted(os.path.join(target, name) for name in os.listdir(target)
                            if name.startswith("part-") and name.endswith(".parquet")))


class KeyedOperatorStage(Stage):
    """A keyed operator: the strategies planned for it, chosen per epoch by `choose`."""

    kind = "keyed"
    strategy = "keyed"

    def __init__(self, stage: KeyedStage, reason: str, *,
                 checkpointing: Callable[[str, int | None, str | None], Any],
                 subtask_read: SubtaskReadRun | None = None, local: LocalRun | None = None,
                 staged: StagedRun | None = None, task_sink: TaskSink | None = None,
                 local_epochs: bool = True) -> None:
        super().__init__(stage.op.id, reason)
        self.stage = stage
        self.routed = RoutedRun(stage, "always available")
        self.subtask_read = subtask_read
        self.local = local
        self.staged = staged
        self.task_sink = task_sink
        self.checkpointing = checkpointing
        #: Local epochs are on (`job.execution.local_rows` > 0).
        self.local_epochs = local_epochs
        #: The stage's last epoch with input ran locally: its epochs without input (timers
        #: only) run locally too. After a big epoch they take the Spark path, whose tasks
        #: fire many windows in parallel.
        self.small_input = True

    @property
    def runs(self) -> list[KeyedRun]:
        """The planned strategies, in the order `choose` prefers them."""
        return [r for r in (self.subtask_read, self.local, self.staged, self.routed)
                if r is not None]

    @property
    def reads(self) -> tuple[str, ...]:
        """The operator's inputs, and a process function's broadcast input."""
        op = self.stage.op
        return (*op.inputs, op.broadcast) if op.broadcast else op.inputs

    def choose(self, epoch: EpochInput, upstream: Upstream,
               present: list[DataFrame]) -> tuple[KeyedRun, Any]:
        """The strategy for this epoch and, for a local one, its collected input."""
        read = self.subtask_read
        if read is not None and epoch.decision.direct.get(read.shape.source_id):
            return read, None
        if self.staged is not None and upstream.prestaged is not None:
            return self.staged, None  # (Arrow tasks computed its input: `arrow_input`)
        collected = None
        if self.local is not None:
            columns = self.local.shape.columns
            if not present and self.local_epochs and self.small_input:
                import pyarrow as pa  # no input (timers only): nothing to collect

                collected = pa.schema(list(columns)).empty_table()
            elif present and upstream.ran_local:
                collected = epoch.guard(f"operator {self.node_id!r}", partial(
                    _local_input, present, [name for name, _ in columns]))
        if present:  # whether this epoch's input was small enough to collect
            self.small_input = collected is not None
        if collected is not None:
            assert self.local is not None
            return self.local, collected
        if self.staged is not None and not (present and epoch.decision.small):
            return self.staged, None
        return self.routed, None

    def run(self, epoch: EpochInput, upstream: Upstream) -> StageOutput:
        """Run the operator's subtasks for the epoch; route late rows and side outputs."""
        stage, node_id = self.stage, self.node_id
        routed: list[Routed] = []
        if stage.join is not None:  # both sides as one frame (`runtime.plan.join_plan`)
            from streamer.runtime.plan.join_plan import project_sides

            present, dead = project_sides(stage.join,
                                          *(upstream.frames.get(i) for i in stage.op.inputs))
            routed += [Routed(sink_id, frame, DEAD) for sink_id, frame in dead]
        else:
            present = upstream.inputs(stage.op.inputs)
            window = stage.op.window
            if window is not None and window.until is not None:
                present = self._closing(present, window.until, routed)
        if stage.global_key:
            from pyspark.sql import functions as F

            present = [f.withColumn(GLOBAL_KEY, F.lit(0)) for f in present]
        fire = epoch.now if stage.domain == "processing" else epoch.watermark_of(node_id)
        tasks = self.checkpointing(node_id, epoch.checkpoint_id, epoch.savepoint_url)
        write_to = None
        if self.task_sink is not None:
            write_to = epoch.guard(f"writing sink {self.task_sink.sink_id!r}", partial(
                self.task_sink.sink.task_target, epoch.epoch, stage.visible_schema))
        how, collected = self.choose(epoch, upstream, present)
        given = KeyedInput(
            present=present, collected=collected, write_to=write_to,
            broadcast=upstream.frames.get(stage.op.broadcast) if stage.op.broadcast else None,
            prestaged=upstream.prestaged or (), fire=fire, tasks=tasks)
        result = epoch.guard(f"operator {node_id!r}", partial(how.run, epoch, given))
        ran = how.ran(node_id)
        late_to: dict[str, str] = {}
        late_dropped: dict[str, Seen] = {}
        late_sink = (stage.op.window.late if stage.op.window else
                     stage.op.join.late if stage.op.join else None)
        if result.late is not None and late_sink:
            routed.append(Routed(late_sink, result.late, LATE))
            late_to[node_id] = late_sink
        elif (stage.op.window is not None or stage.op.join is not None
              or result.late_seen is not None) and not late_sink:
            # dropped (a window's, or a join's without late:): counted all the same
            late_dropped[node_id] = (result.late_seen if result.late_seen is not None
                                     else LateInMetas(result.metas))
        routed += [Routed(sink_id, result.sides[name]) for name, sink_id in
                   stage.op.side_outputs if name in result.sides]
        return StageOutput(
            frames={node_id: result.output}, routed=tuple(routed), ran_local=ran.ran_local,
            ran_direct=ran.ran_direct, ran_staged=ran.ran_staged,
            records_in=how.records_in(epoch, result), subtask_metas={node_id: result.metas},
            sink_jobs=self._sink_job(result), late_to=late_to, late_dropped=late_dropped)

    def _sink_job(self, result: KeyedResult) -> dict[str, SinkJob]:
        """Sink id -> the job whose subtasks write its files, when they do this epoch."""
        if result.run_job is None:
            return {}
        assert self.task_sink is not None
        return {self.task_sink.sink_id: SinkJob(result.run_job, result.metas)}

    def _closing(self, present: list[DataFrame], until: str, routed: list[Routed]
                 ) -> list[DataFrame]:
        """An until window's input without the records whose close time is null: they can
        never close, so they are bad records (`join_plan.bad_records`, their dead letters
        added to `routed`), never dropped."""
        from pyspark.sql import functions as F

        from streamer.runtime.bad_records import bad_records

        reason = (f"operator {self.node_id!r}: a record whose close time {until!r} (window: "
                  "{until: ...}) is null")
        kept = []
        for frame in present:
            frame, dead = bad_records(self.stage.origin, frame, F.col(f"`{until}`").isNull(),
                                      reason, "the window")
            if dead is not None:
                routed.append(Routed(dead[0], dead[1], DEAD))
            kept.append(frame)
        return kept

    def describe(self) -> dict[str, Any]:
        """The strategies, each with its reason, and the per-epoch rule."""
        out = super().describe()
        out["strategy"] = " | ".join(r.name for r in self.runs)
        out["parallelism"] = self.stage.parallelism
        out["strategies"] = [{"name": r.name, "reason": r.reason} for r in self.runs]
        if self.task_sink is not None:
            out["writes_sink"] = self.task_sink.sink_id
        if self.stage.op.broadcast:
            out["broadcast"] = {"input": self.stage.op.broadcast,
                                "how": f"each record copied to all {self.stage.parallelism} "
                                       "subtasks before the routing shuffle"}
        return out


def _local_input(present: list[DataFrame], columns: list[str]) -> Any:
    """The input frames' `columns` as one Arrow table collected without a Spark job, or
    None when a frame needs one (a union of local relations is collected a frame at a time:
    Spark plans it as a union, not one local relation)."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    tables = []
    for frame in present:
        table = local_table(frame.select(*[F.col(f"`{name}`") for name in columns]))
        if table is None:
            return None
        tables.append(table)
    return pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]


class LateInMetas:
    """The late records a window read by its subtasks (a direct or local epoch) dropped
    (`get`: `late`): every subtask reads all of the epoch's rows, so any one's metadata has
    the count."""

    def __init__(self, metas: Any) -> None:
        self.metas = metas

    @property
    def get(self) -> dict[str, int]:
        """`late`, from the first subtask that reported it (0 when none did)."""
        for meta in self.metas:
            if "late" in meta:
                return {"late": int(meta["late"])}
        return {"late": 0}


#: Spark types whose values Arrow aggregates as Spark's partial aggregates do.
_NUMERIC = ("tinyint", "smallint", "int", "bigint", "float", "double")


def direct_plan(stage: KeyedStage, source: Any, source_schema: StructType,
                consumers: int) -> DirectShape | str:
    """Whether `stage`'s subtasks can read `source` themselves (operators/direct.py), or
    why not. They can when the operator's only input is that source and nothing else reads
    it; the source is local parquet files; the operator is a rolling aggregate, a tumbling,
    sliding or session window without a `late:` output, or a dedupe (whose columns Arrow holds as
    Spark does); its aggregates are count, or sum, min, max and avg of numeric columns, or
    min and max of timestamps; its keys are string, integer, boolean or date columns; its
    event time (if any) is a timestamp column as it is."""
    shape = local_plan(stage)
    if isinstance(shape, str):
        return shape
    op, spec = stage.op, source.spec
    if op.inputs != (spec.id,) or consumers != 1:
        return "the source has other readers, or the operator other inputs"
    if not source.parquet_files:
        return "the source is not local parquet files"
    ts_column = (spec.event_time or "").strip() if stage.domain == "event" else None
    return _direct_shape(stage, spec.id, source_schema, ts_column)


def join_direct_plan(stage: KeyedStage, sources: Any, schemas: Any,
                     consumers: Callable[[str], int]) -> DirectShape | str:
    """Whether a join's subtasks can read both its sources' files themselves, or why not:
    each input is a local parquet `files` source (not `reload:`) that only the join reads,
    with its event time (if any) a timestamp column; the join has the shapes `local_plan`
    takes. Records with a null key or event time never reach them: a file whose footer
    does not rule those out is read by Spark that epoch (`FilesSource.plain_parquet`)."""
    shape = local_plan(stage)
    if isinstance(shape, str):
        return shape
    join, plan = stage.op.join, stage.join
    assert join is not None and plan is not None
    cols = plan.columns
    names = [name for name, _ in shape.columns]
    sides = []
    for index, (source_id, keys) in enumerate(((join.left, join.left_key),
                                               (join.right, join.right_key))):
        source = sources.get(source_id)
        if source is None:
            return f"its {('left', 'right')[index]} input {source_id!r} is not a source"
        spec = source.spec
        if consumers(source_id) != 1 or join.left == join.right:
            return f"source {source_id!r} has other readers"
        if not source.parquet_files:
            return f"source {source_id!r} is not local parquet files (or it reloads)"
        own = cols.of_side(index)
        ts = (spec.event_time or "").strip() if stage.domain == "event" else None
        types = {f.name: f.dataType.simpleString() for f in schemas[source_id].fields}
        if ts is not None and types.get(ts) != "timestamp":
            return f"the event time of source {source_id!r} is not a timestamp column"
        sides.append((source_id, tuple(own.get(name) for name in names), ts or None,
                      tuple(keys)))
    return replace(shape, source_id=join.left, sides=tuple(sides))


def local_plan(stage: KeyedStage) -> DirectShape | str:
    """Whether `stage` can take a local epoch's rows collected on the driver
    (`runtime.plan.local`) in place of files, or why not: the operator and column shapes of
    `direct_plan`, over the stage's input (its event time is `__ts`)."""
    kind = stage.kind
    if not kind.has(LOCAL_EPOCHS):
        return f"a {kind.name} operator"
    refusal = kind.local_refusal(stage.op)
    if refusal is not None:
        return refusal
    if CHANGE in stage.input_schema.fieldNames():
        return "its input is an update stream (its retractions are signed in Spark's partials)"
    return _direct_shape(stage, "", stage.input_schema,
                         EVENT_TIME if stage.domain == "event" else None)


def _direct_shape(stage: KeyedStage, source_id: str, schema: StructType,
                  ts_column: str | None) -> DirectShape | str:
    """The columns a direct read casts (keys, aggregate arguments, event time), or why the
    columns do not allow it."""
    from pyspark.sql.pandas.types import to_arrow_type

    from streamer.state.keygroups import PYTHON_HASHED_TYPES

    op = stage.op
    types = {f.name: f.dataType for f in schema.fields}
    wanted: dict[str, Any] = {}
    whole = stage.kind.has(WHOLE_RECORDS)
    if whole:  # the whole record goes on: every column
        for f in schema.fields:
            if f.name.startswith(HIDDEN_PREFIX) and f.name not in (ts_column, *(
                    (EVENT_TIME, JOIN_SIDE) if stage.kind.has(EVERY_RECORD) else ())):
                return f"its input has the internal column {f.name!r}"
            try:
                wanted[f.name] = to_arrow_type(f.dataType, timezone="UTC")
            except Exception:  # (a type Arrow cannot hold as Spark does)
                return f"column {f.name!r} of type {f.dataType.simpleString()}"
    key_types = []
    for key in op.key_by:
        if key not in types or types[key].simpleString() not in PYTHON_HASHED_TYPES:
            return f"key {key!r} is not a plain string, integer, boolean or date column"
        key_types.append(types[key].simpleString())
        wanted[key] = to_arrow_type(types[key])
    for agg in op.aggregates:
        if agg.function not in DIRECT_AGGREGATES:
            return f"aggregate {agg.function}"
        if agg.filter is not None:
            return f"aggregate {agg.name!r} has a filter"
        if agg.arg is not None:
            kind = types[agg.arg].simpleString() if agg.arg in types else None
            if kind not in _NUMERIC and not (kind == "timestamp" and agg.function in (
                    "min", "max")):
                return f"{agg.function}({agg.arg}) is not over a numeric column"
            wanted[agg.arg] = to_arrow_type(types[agg.arg], timezone="UTC")
    if ts_column is not None:
        if ts_column not in types or types[ts_column].simpleString() != "timestamp":
            return "the event time is not a timestamp column"
        import pyarrow as pa

        wanted[ts_column] = pa.timestamp("us", tz="UTC")
    return DirectShape(source_id, tuple(wanted.items()), tuple(key_types), ts_column)


__all__ = ["KeyedOperatorStage", "LocalRun", "RoutedRun", "StagedRun", "SubtaskReadRun",
           "direct_plan", "local_plan"]
