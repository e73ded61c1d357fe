"""The physical planner (docs/architecture.md): the logical dataflow becomes a list of
stages, each with its strategy and the reason for it, once at the start of a run (and again
after a restore or rescale, which start a new run attempt); and `decide` is the one point
where what varies per epoch is chosen.

    logical dataflow ──plan_stages──> PhysicalPlan: source stages, stateless chains,
                                       keyed stages, sink stages (in dataflow order)
    per epoch: decide(plan, slices) -> EpochDecision ──> every stage's
               run(EpochInput, Upstream) -> StageOutput
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from streamer.columns import CHANGE, EVENT_TIME, HIDDEN_PREFIX
from streamer.connectors.base import WritesTaskFiles
from streamer.pipeline.job_spec import ExecutionSpec
from streamer.runtime.arrow.arrow_input import ArrowInput, plan_arrow_input
from streamer.runtime.bad_records import origin_of
from streamer.runtime.plan.keyed_plan import DirectShape, KeyedStage
from streamer.runtime.plan.mode_plan import GangShape, ModeChoice, choose_mode, plan_gang
from streamer.runtime.plan.stages.base import EpochDecision, Stage, SubtaskSlice
from streamer.runtime.plan.stages.keyed_stage import (
    KeyedOperatorStage,
    LocalRun,
    StagedRun,
    SubtaskReadRun,
    TaskSink,
    direct_plan,
    join_direct_plan,
    local_plan,
)
from streamer.runtime.plan.stages.sinks import ArrowWrittenSink, SparkWriterSink, SubtaskWrittenSink
from streamer.runtime.plan.stages.sources import (
    ArrowDecodeSource,
    ScanSource,
    SubtaskReadSource,
    ToKeyedStage,
    ToSink,
)
from streamer.runtime.plan.stages.stateless_stage import StatelessChain

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from streamer.connectors.base import Sink, Source, SourceSlice
    from streamer.pipeline.graph import Dataflow, Node
    from streamer.pipeline.spec import PipelineSpec


@dataclass(frozen=True)
class ArrowSink:
    """A sink whose staging files its source's Arrow tasks write (`runtime.arrow.arrow_input`):
    what the tasks compute, and where they write it."""

    arrow: ArrowInput
    target: ToSink


@dataclass
class PhysicalPlan:
    """The stages of a job in dataflow order, and what the epoch loop needs of them."""

    stages: list[Stage]
    settings: ExecutionSpec
    #: Node id -> how many nodes read its output (a frame read twice is persisted).
    consumers: dict[str, int] = field(default_factory=dict)
    #: The execution mode and why (`runtime.plan.mode_plan`).
    mode: ModeChoice = field(default_factory=lambda: ModeChoice("epochs", "default"))
    #: The continuous mode's barrier stage (None in the epoch mode).
    gang: GangShape | None = None

    @property
    def keyed(self) -> dict[str, KeyedStage]:
        """Keyed node id -> its stage's Spark plan (`runtime.plan.keyed_plan.KeyedStage`)."""
        return {s.node_id: s.stage for s in self.stages if isinstance(s, KeyedOperatorStage)}

    @property
    def task_sinks(self) -> dict[str, str]:
        """Keyed node id -> the sink whose files its subtasks write."""
        return {s.node_id: s.task_sink.sink_id for s in self.stages
                if isinstance(s, KeyedOperatorStage) and s.task_sink is not None}

    def to_json(self) -> dict[str, Any]:
        """The plan as `streamer plan --physical --format json` prints it: the mode, then the
        epoch mode's stages or the continuous mode's gang."""
        run: dict[str, Any] = ({"gang": self.gang.describe()} if self.gang is not None else
                               {"stages": [s.describe() for s in self.stages],
                                "per_epoch": PER_EPOCH_RULE})
        return {"mode": self.mode.describe(), **run,
                "settings": {key: {"value": value, "from": origin} for key, (value, origin)
                             in self.settings.describe().items()}}


#: How `decide` and the stages choose per epoch (shown with the plan).
PER_EPOCH_RULE = (
    "small-epoch mode when the epoch's input is known to be at most "
    "job.execution.small_epoch_rows rows (else when the previous epoch's was); a slice of at "
    "most job.execution.local_rows rows of a source that can is read on the driver, and the "
    "stages after it stay local while their input is a local relation; a keyed stage's "
    "subtasks read their source's parquet files themselves when the files allow it, else "
    "(planned, not small) the input Spark staged for them as local parquet files")


def plan_stages(spec: PipelineSpec, flow: Dataflow, spark: SparkSession,
                sources: Mapping[str, Source], sinks: Mapping[str, Sink],
                schemas: Mapping[str, Any], settings: ExecutionSpec, *, on_cluster: bool,
                state_root: str,
                checkpointing: Callable[[str, int | None, str | None], Any]) -> PhysicalPlan:
    """Compile the dataflow into stages: one per source, stateless chain, keyed operator and
    sink, each with the strategy it runs with and why; and the mode (a pipeline the
    continuous mode cannot run is a `PipelineError`) with, when continuous, its gang."""
    mode = choose_mode(spec, settings)
    event_time: dict[str, bool] = {}
    keyed: dict[str, KeyedOperatorStage] = {}
    for node in flow.nodes:
        if node.role == "source":
            event_time[node.id] = bool(node.source.event_time)
        elif node.role == "operator":
            has_ts = all(event_time.get(i, False) for i in node.operator.inputs)
            if node.kind != "keyed":
                event_time[node.id] = node.operator.output_event_time(has_ts)
                continue
            stage = _keyed_stage(spec, flow, spark, node, sources, sinks, schemas, settings,
                                 has_ts=has_ts, on_cluster=on_cluster, state_root=state_root,
                                 checkpointing=checkpointing)
            keyed[node.id] = stage
            event_time[node.id] = node.operator.output_event_time(has_ts)
            for origin in _updates_read(spec, node.operator):  # it takes their retractions
                producer = keyed[origin].stage
                producer.base_config = replace(producer.base_config, changelog=True)
    arrow_sinks: dict[str, ArrowSink] = {}
    not_arrow: dict[str, str] = {}
    for node in flow.nodes:
        if node.role == "sink":
            found = _arrow_sink(spec, flow, spark, node, sources, sinks, schemas, settings,
                                on_cluster=on_cluster)
            if found is None:
                continue
            if isinstance(found, str):
                not_arrow[node.id] = found
            else:
                arrow_sinks[node.id] = found
    stages: list[Stage] = []
    chained: dict[str, StatelessChain] = {}
    for node in flow.nodes:
        if node.role == "source":
            stages.append(_source_stage(node, sources[node.id], keyed.values(), settings,
                                        arrow_sinks))
        elif node.role == "sink":
            stages.append(_sink_stage(node, sinks[node.id], keyed.values(), arrow_sinks,
                                      not_arrow.get(node.id)))
        elif node.id in keyed:
            stages.append(keyed[node.id])
        else:
            head = node.inputs[0] if len(node.inputs) == 1 else None
            chain = chained.get(head) if head is not None else None
            if chain is not None and head is not None and len(flow.consumers(head)) == 1:
                chain.ops.append(node.operator)
                chain.node_id = node.id
            else:
                chain = StatelessChain([node.operator], "Spark SQL expressions, fused by "
                                       "Spark's whole-stage code generation")
                stages.append(chain)
            chained[node.id] = chain
    arrow_ops = {op_id: found.arrow.source_id for found in arrow_sinks.values()
                 for op_id in found.arrow.op_ids}
    arrow_ops.update({op_id: s.staged.arrow.source_id for s in keyed.values()
                      if s.staged is not None and s.staged.arrow is not None
                      for op_id in s.staged.arrow.op_ids})
    for chain in set(chained.values()):
        if all(op.id in arrow_ops for op in chain.ops):
            chain.reason += (f"; in epochs the Arrow tasks of source "
                             f"{arrow_ops[chain.ops[0].id]!r} read, only on what they refuse "
                             "(the tasks run these operators, translated, on the rest)")
    gang = plan_gang(spec, {k: s.stage for k, s in keyed.items()},
                     spark.sparkContext.defaultParallelism) \
        if mode.mode == "continuous" else None
    return PhysicalPlan(stages, settings, {n.id: len(flow.consumers(n.id)) for n in flow.nodes},
                        mode, gang)


def _set_by(settings: ExecutionSpec, key: str) -> str:
    """' (set by $VARIABLE)' when an environment variable set `key`, else ''."""
    variable = settings.set_by(key)
    return f" (set by {variable})" if variable else ""


def _keyed_stage(spec: PipelineSpec, flow: Dataflow, spark: SparkSession, node: Node,
                 sources: Mapping[str, Source], sinks: Mapping[str, Sink],
                 schemas: Mapping[str, Any], settings: ExecutionSpec, *, has_ts: bool,
                 on_cluster: bool, state_root: str,
                 checkpointing: Callable[[str, int | None, str | None], Any]
                 ) -> KeyedOperatorStage:
    """A keyed operator's stage with every strategy that applies to it."""
    op = node.operator
    schema, join = _keyed_input(op, flow, schemas, has_ts, bool(_updates_read(spec, op)))
    stage = KeyedStage(spark, op, spec.job, spec.name, schema, has_ts, state_root, join)
    if join is None:
        stage.origin = origin_of(flow, op.inputs[0])
    if on_cluster:
        stage.base_config = replace(stage.base_config, executor_scoped=True)
    skipped: list[dict[str, str]] = []
    subtask_read = local = staged = None
    if not settings.direct_read:
        off = _set_by(settings, "direct_read")
        skipped.append({"name": "subtasks-read-files / local",
                        "why": f"job.execution.direct_read is off{off}"})
    else:
        source_id = op.inputs[0]
        if op.join is not None:
            found = join_direct_plan(stage, sources, schemas,
                                     lambda i: len(flow.consumers(i)))
        elif len(op.inputs) == 1 and source_id in sources:
            found = direct_plan(stage, sources[source_id], schemas[source_id],
                                len(flow.consumers(source_id)))
        else:
            found = "its input is not a source it alone reads"
        if isinstance(found, DirectShape):
            stage.direct = found
            read = " and ".join(repr(i) for i in found.source_ids)
            what = f"sources {read} are" if found.sides else f"source {read} is"
            subtask_read = SubtaskReadRun(stage, f"{what} local parquet files it alone reads: "
                                          "the subtasks read them themselves, with no Spark "
                                          "scan or shuffle", found)
        else:
            skipped.append({"name": SubtaskReadRun.name, "why": found})
        shape = local_plan(stage)
        if isinstance(shape, DirectShape) and settings.local_rows > 0:
            stage.local = shape
            stage.in_driver = not on_cluster and settings.driver_subtasks
            where = ("in the driver process, one subtask after the other" if stage.in_driver
                     else "in one plain RDD job (" + ("on a cluster the driver does not reach "
                     "the executors' state" if on_cluster else "job.execution.driver_subtasks "
                     f"is off{_set_by(settings, 'driver_subtasks')}") + ")")
            local = LocalRun(stage, "a local epoch's input (a local relation, collected "
                             f"without a job) goes to the subtasks {where}", shape)
        else:
            skipped.append({"name": LocalRun.name, "why": shape if isinstance(shape, str)
                            else "job.execution.local_rows is 0"
                            f"{_set_by(settings, 'local_rows')}"})
        staged, why = _staged_run(stage, shape, subtask_read, settings, on_cluster, state_root)
        if staged is None:
            skipped.append({"name": StagedRun.name, "why": why})
        else:
            why = _arrow_tasks(spark, flow, node.id, sources, schemas, settings, staged)
            if why:
                skipped.append({"name": "arrow-tasks", "why": why})
    task_sink, why = _task_written_sink(spec, flow, node.id, stage, sinks, settings)
    if task_sink is None:
        skipped.append({"name": "writes its sink", "why": why})
    out = KeyedOperatorStage(
        stage, f"{stage.kind.name} keyed by {', '.join(op.key_by) or '(nothing)'} in "
        f"{stage.max_parallelism} key groups over {stage.parallelism} subtasks",
        checkpointing=checkpointing, subtask_read=subtask_read, local=local, staged=staged,
        task_sink=task_sink, local_epochs=settings.local_rows > 0)
    out.not_used = skipped
    return out


def _updates_read(spec: PipelineSpec, op: Any) -> list[str]:
    """The operators whose update streams keyed operator `op` reads (validation allowed
    only a rolling aggregate that takes their retractions)."""
    return [origin for i in op.inputs if (origin := spec.updates_behind(i)) is not None]


def _keyed_input(op: Any, flow: Dataflow, schemas: Mapping[str, Any],
                 has_ts: bool, updates: bool = False) -> tuple[Any, Any]:
    """A keyed operator's input schema (with the event-time column when it has one, and an
    update stream's `CHANGE`), and a join's plan (its input: both sides projected onto its
    output columns) or None."""
    from pyspark.sql.types import StringType, StructField, StructType, TimestampType

    if op.join is not None:
        from streamer.runtime.plan.join_plan import plan_join

        join = plan_join(op, flow, schemas)
        return join.schema, join
    schema = schemas[op.inputs[0]]
    if has_ts:
        schema = StructType([*schema.fields, StructField(EVENT_TIME, TimestampType())])
    if updates:
        schema = StructType([*schema.fields, StructField(CHANGE, StringType())])
    return schema, None


def _staged_run(stage: KeyedStage, shape: DirectShape | str, subtask_read: Any,
                settings: ExecutionSpec, on_cluster: bool, state_root: str
                ) -> tuple[StagedRun | None, str]:
    """The stage's `StagedRun` (Spark writes its input as local parquet files for the
    subtasks), or (None, why not)."""
    import os

    if isinstance(shape, str):
        return None, shape
    if subtask_read is not None:
        return None, "the subtasks read its source's files themselves"
    if on_cluster:
        return None, "on a cluster the executors do not share the driver's disk"
    if not settings.staged_input:
        return None, f"job.execution.staged_input is off{_set_by(settings, 'staged_input')}"
    root = os.path.join(state_root, "_staged", stage.op.id)
    return StagedRun(stage, "Spark computes its input and writes it once as local parquet "
                     "files, which the subtasks read themselves (small epochs: Spark routes "
                     "the rows)", shape, root), ""


def _arrow_tasks(spark: SparkSession, flow: Dataflow, node_id: str,
                 sources: Mapping[str, Source], schemas: Mapping[str, Any],
                 settings: ExecutionSpec, staged: StagedRun) -> str:
    """Give `staged` its Arrow tasks (`runtime.arrow.arrow_input`) where they apply; else why
    not."""
    if not settings.arrow_input:
        return f"job.execution.arrow_input is off{_set_by(settings, 'arrow_input')}"
    arrow = plan_arrow_input(spark, flow, node_id, sources, schemas, staged.shape.columns)
    if isinstance(arrow, str):
        return arrow
    staged.arrow = arrow
    return ""


def _task_written_sink(spec: PipelineSpec, flow: Dataflow, node_id: str, stage: KeyedStage,
                       sinks: Mapping[str, Sink], settings: ExecutionSpec
                       ) -> tuple[TaskSink | None, str]:
    """The sink whose files the keyed stage `node_id`'s tasks write themselves
    (`task_target`) and why, or (None, why none): the stage's only consumer is that sink,
    the sink reads nothing else (no dead letters, late or side outputs), the stage has no
    side outputs, and the sink is local parquet or jsonl (of columns the JSON encoder
    takes), or an exactly-once Kafka sink whose records the tasks stage
    (`task_files_refused`)."""
    if not settings.task_sink:
        return None, f"job.execution.task_sink is off{_set_by(settings, 'task_sink')}"
    if stage.side_schemas:
        return None, "the operator has side outputs"
    consumers = flow.consumers(node_id)
    if len(consumers) != 1 or consumers[0].role != "sink":
        return None, "its output is read by more than one sink or by an operator"
    sink_id = consumers[0].id
    sink = sinks.get(sink_id)
    if not isinstance(sink, WritesTaskFiles):
        return None, (f"sink {sink_id!r} is not a local parquet or jsonl files sink, nor an "
                      "exactly-once Kafka sink")
    why = sink.task_files_refused(stage.visible_schema)
    if why is not None:
        return None, why
    if flow.node(sink_id).inputs != (node_id,) or sink_id in spec.dead_letter_sinks:
        return None, f"sink {sink_id!r} reads other inputs too"
    what = ("an exactly-once Kafka sink" if sink.spec.type == "kafka"
            else f"a local {sink.format} files sink")
    return TaskSink(sink_id, sink), f"its only consumer is {what}"


def _arrow_sink(spec: PipelineSpec, flow: Dataflow, spark: SparkSession, node: Node,
                sources: Mapping[str, Source], sinks: Mapping[str, Sink],
                schemas: Mapping[str, Any], settings: ExecutionSpec, *, on_cluster: bool
                ) -> ArrowSink | str | None:
    """(The Arrow tasks' plan, where they write) when the tasks of sink `node`'s source
    can write its staging files themselves (`runtime.arrow.arrow_input`), else why not, or None
    where the question does not arise (the sink does not take task-written files, reads
    more than one input, dead letters, late records or side outputs, or a keyed
    operator's output). They can when its input comes through stateless operators (or
    none) from a source the tasks read, the sink takes task-written files of its columns
    (`task_files_refused`), in local mode (the tasks write the driver's disk), with
    job.execution.arrow_input and task_sink on."""
    from pyspark.sql.types import StructType

    from streamer.runtime.arrow.arrow_sql import arrow_type, supported

    sink = sinks[node.id]
    if not isinstance(sink, WritesTaskFiles) or len(node.inputs) != 1 \
            or node.id in spec.dead_letter_sinks:
        return None
    upstream = flow.node(node.inputs[0])
    if upstream.role == "operator" and upstream.kind == "keyed":
        return None
    if not settings.arrow_input:
        return f"job.execution.arrow_input is off{_set_by(settings, 'arrow_input')}"
    if not settings.task_sink:
        return f"job.execution.task_sink is off{_set_by(settings, 'task_sink')}"
    if on_cluster:
        return "on a cluster the executors do not share the driver's disk"
    schema = StructType([f for f in schemas[upstream.id].fields
                         if not f.name.startswith(HIDDEN_PREFIX)])
    why = sink.task_files_refused(schema)
    if why is not None:
        return why
    out = []
    for f in schema.fields:
        kind = f.dataType.simpleString()
        if not supported(kind):
            return f"column {f.name!r} is {kind}"
        out.append((f.name, arrow_type(kind)))
    arrow = plan_arrow_input(spark, flow, node.id, sources, schemas, tuple(out))
    if isinstance(arrow, str):
        return arrow
    return ArrowSink(arrow, ToSink(node.id, sink, schema))


def _source_stage(node: Node, source: Source, keyed: Any, settings: ExecutionSpec,
                  arrow_sinks: Mapping[str, ArrowSink]) -> ScanSource:
    for sink_id, found in arrow_sinks.items():
        to_sink = found.arrow
        if to_sink.source_id == node.id:
            chain = _runs(to_sink.op_ids)
            return ArrowDecodeSource(
                node.id, f"its rows reach only sink {sink_id!r}: Python tasks read each "
                f"{'range' if to_sink.kind == 'kafka' else 'file'} with Arrow{chain} and "
                "write the sink's staging files (job.execution.arrow_input, task_sink); Spark "
                "reads what they refuse", source, node.source, to_sink, found.target)
    for stage in keyed:
        arrow = stage.staged.arrow if stage.staged is not None else None
        if arrow is not None and arrow.source_id == node.id:
            chain = _runs(arrow.op_ids)
            return ArrowDecodeSource(
                node.id, f"its only reader, keyed stage {stage.node_id!r}, takes its input "
                f"from Python tasks that read each {'range' if arrow.kind == 'kafka' else 'file'}"
                f" with Arrow{chain} and write the stage's columns (job.execution.arrow_input);"
                " Spark reads what they refuse",
                source, node.source, arrow, ToKeyedStage(stage.node_id, stage.staged.root))
        if stage.subtask_read is not None and node.id in stage.subtask_read.shape.source_ids:
            return SubtaskReadSource(
                node.id, f"its only reader, keyed stage {stage.node_id!r}, reads its parquet "
                "files itself (Spark reads only a slice whose files need it)", source,
                node.source)
    reason = "Spark reads the slice"
    if source.local_reads and settings.local_rows > 0:
        reason += (f"; a slice of at most {settings.local_rows:,} rows is read on the driver "
                   "as a local relation (job.execution.local_rows)")
    return ScanSource(node.id, reason, source, node.source)


def _runs(op_ids: tuple[str, ...]) -> str:
    """", run 'a', 'b'" for the operators the Arrow tasks run (empty for none)."""
    return f", run {', '.join(repr(i) for i in op_ids)}" if op_ids else ""


def _sink_stage(node: Node, sink: Sink, keyed: Any,
                arrow_sinks: Mapping[str, ArrowSink],
                not_arrow: str | None) -> SparkWriterSink:
    found = arrow_sinks.get(node.id)
    if found is not None:
        return ArrowWrittenSink(node.id, f"the Arrow tasks of source {found.arrow.source_id!r} "
                                "write its staging files (rows of what they refuse, and of "
                                "small epochs, by Spark's writer)", sink, node.inputs)
    for stage in keyed:
        if stage.task_sink is not None and stage.task_sink.sink_id == node.id:
            how = ("local parquet" if isinstance(sink, WritesTaskFiles)
                   and sink.format == "parquet" else
                   "Kafka records staged for the commit's transaction, values in Spark's "
                   "to_json bytes; rows the encoder refuses go through Spark"
                   if sink.spec.type == "kafka" else
                   "local jsonl in Spark's bytes; rows the encoder refuses go to Spark's writer")
            return SubtaskWrittenSink(node.id, f"written by the subtasks of keyed stage "
                                      f"{stage.node_id!r} ({how}: no rows cross into the JVM)",
                                      sink, node.inputs)
    reason = "Spark's writer"
    if sink.takes_tables:
        reason += "; a local epoch's rows are written from the driver without a job"
    out = SparkWriterSink(node.id, reason, sink, node.inputs)
    if not_arrow is not None:
        out.not_used = [{"name": ArrowWrittenSink.strategy, "why": not_arrow}]
    return out


def decide(plan: PhysicalPlan, sources: Mapping[str, Source],
           slices: Mapping[str, SourceSlice], watermark: int,
           last_input: int | None) -> EpochDecision:
    """The one per-epoch decision: the small-epoch mode, and which slices keyed stages read
    themselves (the rule is `PER_EPOCH_RULE`). `last_input`: the previous epoch's records
    in (None before the first)."""
    return EpochDecision(small=_small(plan.settings, slices, last_input),
                         direct=_direct_reads(plan, sources, slices, watermark))


def _small(settings: ExecutionSpec, slices: Mapping[str, SourceSlice],
           last_input: int | None) -> bool:
    """Whether the epoch runs in the small-epoch mode (`runtime.cluster.spark.SMALL_EPOCH_CONF`):
    its input is known to be at most `small_epoch_rows` rows (a timer-only epoch has none),
    or, where a source cannot tell up front, the previous epoch's was."""
    limit = settings.small_epoch_rows
    if limit <= 0:
        return False
    known = [piece.expected_records for piece in slices.values()]
    if all(n is not None for n in known):
        return sum(n for n in known if n is not None) <= limit
    return last_input is not None and last_input <= limit


def _direct_reads(plan: PhysicalPlan, sources: Mapping[str, Source],
                  slices: Mapping[str, SourceSlice], watermark: int
                  ) -> dict[str, SubtaskSlice]:
    """Per source id: the slice its keyed stage reads itself this epoch (its `DirectRead`
    and dead letters); a slice whose files do not allow it is read by Spark instead. A stage
    whose source has no slice this epoch gets an empty read."""
    from streamer.connectors.files.files_source import FilesSource

    out: dict[str, SubtaskSlice] = {}
    for stage in plan.stages:
        if not isinstance(stage, KeyedOperatorStage) or stage.subtask_read is None:
            continue
        shape = stage.subtask_read.shape
        if shape.sides:
            out.update(_join_reads(shape, sources, slices, watermark))
            continue
        if shape.source_id not in slices:
            # No input this epoch (timers only, or the end of input): no Spark plan either.
            out[shape.source_id] = SubtaskSlice(had_slice=False, read=shape.read(watermark))
            continue
        source = sources[shape.source_id]
        assert isinstance(source, FilesSource)  # (direct_plan takes only these)
        found = source.plain_parquet(slices[shape.source_id], shape.ts_column)
        if found is None:
            continue
        files, dead_letters = found
        out[shape.source_id] = SubtaskSlice(had_slice=True,
                                            read=shape.read(watermark, tuple(files)),
                                            dead_letters=dead_letters)
    return out


def _join_reads(shape: DirectShape, sources: Mapping[str, Source],
                slices: Mapping[str, SourceSlice], watermark: int
                ) -> dict[str, SubtaskSlice]:
    """`_direct_reads` of a join reading both its sources: one read of both sides' files,
    under each source's id; none at all when either slice's files need Spark (a key or
    event time the footers do not rule out being null: a bad record, which Spark reports)."""
    from streamer.connectors.files.files_source import FilesSource

    files: list[tuple[str, ...]] = []
    found: dict[str, tuple[bool, Any]] = {}
    for source_id, _, ts_column, keys in shape.sides:
        piece = slices.get(source_id)
        if piece is None:
            files.append(())
            found[source_id] = (False, None)
            continue
        source = sources[source_id]
        assert isinstance(source, FilesSource)  # (join_direct_plan takes only these)
        plain = source.plain_parquet(piece, ts_column, not_null=keys)
        if plain is None:
            return {}
        files.append(tuple(plain[0]))
        found[source_id] = (True, plain[1])
    read = shape.read(watermark, side_files=tuple(files))
    return {source_id: SubtaskSlice(had_slice=had, read=read, dead_letters=dead)
            for source_id, (had, dead) in found.items()}


def render(plan: PhysicalPlan) -> str:
    """The plan as text: the mode, then one block per stage with its strategy and why (or
    the continuous mode's gang)."""
    lines = [plan.mode.line()]
    if plan.gang is not None:
        return "\n".join([*lines, *plan.gang.render()]) + "\n"
    for stage in plan.stages:
        info = stage.describe()
        name = info["stage"]
        if info["kind"] == "stateless":
            name = " -> ".join(info["operators"])
        lines.append(f"{info['kind']} stage {name}: {info['strategy']}")
        lines.append(f"    {info['reason']}")
        for run in info.get("strategies", []):
            lines.append(f"    - {run['name']}: {run['reason']}")
        for run in info.get("not_used", []):
            lines.append(f"    - not {run['name']}: {run['why']}")
        if "broadcast" in info:
            lines.append(f"    - broadcast input {info['broadcast']['input']!r}: "
                         f"{info['broadcast']['how']}")
    lines.append("per epoch: " + PER_EPOCH_RULE)
    return "\n".join(lines) + "\n"

