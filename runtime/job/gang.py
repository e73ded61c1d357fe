"""The continuous mode's run on the driver (issue 36, `job.execution.mode: continuous`).

Where the epoch loop runs a Spark job per epoch, this starts one: a barrier stage
(`rdd.barrier().mapPartitions`, `runtime.job.gang_tasks`) whose tasks are the job's source and
keyed subtasks, scheduled together and living for the whole run (one failed task fails
them all: the job restarts from its last checkpoint under `job.restart`, as an epoch's
failure does). The driver keeps the `BarrierCoordinator`: every `job.checkpoint.interval`
it injects a barrier; checkpoint n completes when every subtask acknowledged it, with
`_metadata` in the epoch mode's format (so a job stopped in one mode restores in the other)
and the files sink's staging of n committed after it.

What runs continuously today (`gang_plan` says why a plan does not): one local files
source whose chain Arrow computes (`runtime.arrow.arrow_input`), one keyed operator whose
subtasks take direct-read rows (a rolling aggregate or a tumbling or sliding window), and
one local jsonl or parquet files sink that its subtasks write.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from streamer.connectors.base import DECODE_ERROR_MARKER
from streamer.connectors.exceptions import DecodeError
from streamer.connectors.files.files_sink import epoch_staging
from streamer.exceptions import ConfigError
from streamer.runtime.watermarks import MIN_WATERMARK

#: The bound of an exchange channel (bytes).
CHANNEL_BYTES = 4 << 20

if TYPE_CHECKING:
    from streamer.checkpoint.checkpoint_metadata import CheckpointMetadata
    from streamer.runtime.job.barrier_coordinator import BarrierCoordinator
    from streamer.runtime.job.gang_tasks import GangTasks


@dataclass(frozen=True)
class GangPlan:
    """The pieces of a job the gang runs."""

    source_id: str
    source: Any
    #: The keyed operator's stage (`runtime.plan.stages.keyed_stage.KeyedOperatorStage`), or
    #: None: a stateless pipeline, whose source subtasks write the sink.
    stage: Any
    #: Its source plan (`runtime.continuous.source_subtask.SourcePlan`), config without checkpoints.
    plan: Any
    sink_id: str
    sink: Any
    #: The Spark schema of the rows the sink takes.
    sink_schema: Any
    #: Source subtasks and keyed subtasks.
    sources: int
    parallelism: int
    #: An at_least_once Kafka sink's producer (`KafkaSink.direct`), or None: the subtasks
    #: stage the sink's files for each checkpoint's commit.
    direct: Any = None
    #: The source's `on_error` sink (id and sink), whose dead letters the source subtasks
    #: stage for each checkpoint's commit; None without `on_error`.
    dead_id: str | None = None
    dead_sink: Any = None

    @property
    def staged_sinks(self) -> dict[str, Any]:
        """The sinks whose staging each checkpoint commits, by id."""
        found = {} if self.direct is not None else {self.sink_id: self.sink}
        if self.dead_id is not None:
            found[self.dead_id] = self.dead_sink
        return found

    @property
    def tasks(self) -> int:
        """Tasks of the barrier stage."""
        return self.sources + self.parallelism

    @property
    def node_id(self) -> str | None:
        """The keyed operator's node id (None: stateless)."""
        return None if self.stage is None else str(self.stage.node_id)

    def check_slots(self, spark: Any, file: Any, wait_s: float, say: Any) -> None:
        """Refuse, with the fix, a gang the session has too few task slots for (Spark
        schedules a barrier stage only whole, and would retry it for minutes). On a cluster,
        executors come over time: while none has come (a busy cluster) it waits, and says so
        after `wait_s`; it refuses once the slots have stayed short for `wait_s`."""
        from streamer.runtime.cluster.spark import task_slots

        seen, since, said = -1, time.monotonic(), False
        while (slots := task_slots(spark)) < self.tasks:
            now = time.monotonic()
            if slots != seen:
                seen, since = slots, now
            waited = now - since >= wait_s
            if (waited and slots > 0) or wait_s == 0:
                msg = (f"{file}: job.execution.mode is continuous, and its gang needs a task "
                       f"slot for each of its {self.sources} source and {self.parallelism} "
                       f"keyed subtasks ({self.tasks}), but the executors offer {slots}; set "
                       "job.parallelism lower, or give the job more executor cores")
                raise ConfigError(msg)
            if waited and not said:
                say(f"waiting for executors: the continuous gang needs {self.tasks} task "
                    f"slots, and the cluster has given this job none yet (after "
                    f"{wait_s:g} s, job.slot_timeout)")
                said = True
            time.sleep(0.5)


@dataclass(frozen=True)
class _Route:
    route: Any
    arrow: Any
    sink_schema: Any
    direct: Any


def gang_plan(job: Any, spark: Any) -> GangPlan | str:
    """The gang of `job`'s physical plan, or why it cannot run continuously."""
    from streamer.runtime.continuous.source_subtask import SourcePlan
    from streamer.runtime.plan.stages.keyed_stage import KeyedOperatorStage

    keyed = [s for s in job.plan.stages if isinstance(s, KeyedOperatorStage)]
    source_id, source = next(iter(job.sources.items()))
    dead_id = source.spec.on_error
    sinks = {k: v for k, v in job.sinks.items() if k != dead_id}
    if len(job.sources) != 1 or len(keyed) > 1 or len(sinks) != 1:
        return ("the continuous mode runs one source, at most one keyed operator and one "
                "sink (and the source's on_error sink)")
    if source.task_reads not in ("files", "csv", "parquet", "kafka"):
        return (f"source {source_id!r} is not local JSON-lines, CSV or parquet files, nor "
                "Kafka JSON values read by confluent-kafka")
    sink_id, sink = next(iter(sinks.items()))
    dead_sink = job.sinks.get(dead_id) if dead_id else None
    why = _dead_refusal(dead_id, dead_sink)
    if why is not None:
        return why
    found = (_keyed_route(job, spark, keyed[0], sink) if keyed
             else _sink_route(job, spark, sink_id, sink))
    if isinstance(found, str):
        return found
    stage = keyed[0] if keyed else None
    parallelism = (stage.stage.base_config.parallelism if stage is not None
                   else job.spec.job.parallelism or spark.sparkContext.defaultParallelism)
    sources = parallelism
    if source.task_reads == "kafka":  # (a subtask without partitions would hold the watermark)
        sources = max(1, min(parallelism, len(source.partitions())))
    plan = SourcePlan(source.spec, found.arrow, found.route, _bad_records(spark, found.arrow,
                                                                          source.spec))
    return GangPlan(source_id, source, stage, plan, sink_id, sink, found.sink_schema,
                    sources=sources, parallelism=parallelism if stage is not None else 0,
                    direct=found.direct, dead_id=dead_id, dead_sink=dead_sink)


def _dead_refusal(dead_id: str | None, dead_sink: Any) -> str | None:
    """Why the source subtasks cannot stage the dead letters of sink `dead_id`, or None."""
    from streamer.connectors.base import WritesTaskFiles
    from streamer.runtime.continuous.source_records import dead_spark_schema

    if dead_id is None:
        return None
    if not isinstance(dead_sink, WritesTaskFiles):
        return f"on_error sink {dead_id!r} is not one the source subtasks can write"
    why = dead_sink.task_files_refused(dead_spark_schema())
    return None if why is None else f"on_error sink {dead_id!r}: {why}"


def _bad_records(spark: Any, arrow: Any, spec: Any) -> Any:
    """How the source subtasks treat bad records (`runtime.continuous.source_records`)."""
    from streamer.connectors.arrow.arrow_json_writer import jvm_prints_shortest
    from streamer.runtime.continuous.source_records import BadRecords

    return BadRecords(spec.id, spec.on_error, spec.event_time, tuple(arrow.columns),
                      shortest=jvm_prints_shortest(spark))


def _direct(job: Any, sink: Any, reads: str, schema: Any) -> Any:
    """An at_least_once Kafka sink's producer, for a sink that reads only `reads`."""
    from streamer.connectors.kafka.kafka_sink import KafkaSink

    if isinstance(sink, KafkaSink) and sink.spec.inputs == (reads,):
        return sink.direct(schema, job.plan.settings.continuous_flush_interval)
    return None


def _keyed_route(job: Any, spark: Any, stage: Any, sink: Any) -> _Route | str:
    """The route of a keyed pipeline: its source's rows to the keyed subtasks."""
    from streamer.runtime.arrow.arrow_input import plan_arrow_input
    from streamer.runtime.continuous.source_subtask import KeyedRoute
    from streamer.runtime.plan.stages.keyed_stage import local_plan

    schema = stage.stage.visible_schema
    direct = None
    if stage.task_sink is None:
        direct = _direct(job, sink, stage.node_id, schema)
        if direct is None:
            return (f"operator {stage.node_id!r}: its subtasks cannot write its sink "
                    "themselves (a local jsonl or parquet files sink, or a Kafka sink, that "
                    "reads only it)")
    shape = local_plan(stage.stage)
    if isinstance(shape, str):
        return f"operator {stage.node_id!r}: {shape}"
    arrow = plan_arrow_input(spark, job.flow, stage.node_id, job.sources, job.schemas,
                             shape.columns)
    if isinstance(arrow, str):
        return f"operator {stage.node_id!r}: {arrow}"
    route = KeyedRoute(stage.stage.base_config, shape.key_types, shape.columns,
                       shape.ts_column)
    return _Route(route, arrow, schema, direct)


def _sink_route(job: Any, spark: Any, sink_id: str, sink: Any) -> _Route | str:
    """The route of a stateless pipeline: its source's rows, through the chain, to the
    sink, which its source subtasks write."""
    from pyspark.sql.types import StructType

    from streamer.columns import HIDDEN_PREFIX
    from streamer.connectors.base import WritesTaskFiles
    from streamer.runtime.arrow.arrow_input import plan_arrow_input
    from streamer.runtime.arrow.arrow_sql import arrow_type, supported
    from streamer.runtime.continuous.source_subtask import SinkRoute

    node = job.flow.node(sink_id)
    schema = StructType([f for f in job.schemas[node.inputs[0]].fields
                         if not f.name.startswith(HIDDEN_PREFIX)])
    direct = _direct(job, sink, node.inputs[0], schema)
    if direct is None and not (isinstance(sink, WritesTaskFiles)
                               and sink.task_files_refused(schema) is None):
        return (f"sink {sink_id!r}: the source subtasks cannot write it themselves (a local "
                "jsonl or parquet files sink, or a Kafka sink)")
    out = []
    for f in schema.fields:
        if not supported(f.dataType.simpleString()):
            return f"sink {sink_id!r}: column {f.name!r} is {f.dataType.simpleString()}"
        out.append((f.name, arrow_type(f.dataType.simpleString())))
    arrow = plan_arrow_input(spark, job.flow, sink_id, job.sources, job.schemas, tuple(out))
    if isinstance(arrow, str):
        return f"sink {sink_id!r}: {arrow}"
    return _Route(SinkRoute(tuple(name for name, _ in out)), arrow, schema, direct)


def refused(file: Any, why: str) -> ConfigError:
    """The error of a continuous job whose plan the gang cannot run (`gang_plan`'s why)."""
    return ConfigError(f"{file}: job.execution.mode is continuous, but {why}; run it with "
                       "job.execution.mode: epochs")


class GangRun:
    """One attempt of a continuous run (module docstring): `run()` returns (status,
    reason) or raises `JobFailedError` for `_attempts` to restart."""

    def __init__(self, coordinator: Any, gang: GangPlan) -> None:
        self.owner = coordinator  # runtime.job.coordinator.JobCoordinator
        self.job = coordinator.job
        self.gang = gang
        self.error: BaseException | None = None
        self.done = threading.Event()
        #: The run's output rows before this attempt (its coordinator counts from 0).
        self.rows_before = self.job.totals["records_out"]

    def run(self) -> tuple[str, str]:
        """Start the gang, checkpoint it every interval until its input ended (or a stop),
        and wait for its tasks."""
        from streamer.runtime.exceptions import JobFailedError

        coord = self._coordinator()
        group = f"streamer-gang-{self.job.run_id}"
        runner: threading.Thread | None = None
        status: tuple[str, str] | None = None
        try:
            runner = threading.Thread(target=self._spark_job, daemon=True, name="gang",
                                      args=(self._tasks(coord), group))
            runner.start()
            status = self._checkpoints(coord)
        finally:
            ended = coord.all_ended is not None
            if runner is not None and not ended and not self.done.is_set():
                self.owner.spark.sparkContext.cancelJobGroup(group)  # a stop, or a failure
            coord.close()  # (the barrier streams end: tasks whose input ended return)
            if runner is not None:
                runner.join()
        if self.error is not None and status is None and not ended:
            detail = coord.failure or task_error(self.error)
            if DECODE_ERROR_MARKER in detail:  # a bad record without on_error: no restart
                msg = detail[detail.index(DECODE_ERROR_MARKER) + len(DECODE_ERROR_MARKER):]
                raise DecodeError(msg) from self.error
            msg = f"the continuous gang failed: {detail}"
            raise JobFailedError(msg) from self.error
        return status or ("finished", "every source is exhausted (continuous mode)")

    def _spark_job(self, tasks: GangTasks, group: str) -> None:
        sc = self.owner.spark.sparkContext
        try:
            sc.setJobGroup(group, f"continuous gang of {self.job.spec.name}", True)
            n = self.gang.tasks
            sc.parallelize(range(n), n).barrier().mapPartitions(tasks).collect()
        except BaseException as exc:  # reported by `run`
            self.error = exc
        finally:
            self.done.set()

    def _coordinator(self) -> BarrierCoordinator:
        from streamer.runtime.job.barrier_coordinator import (
            BarrierCoordinator,
            CommitHooks,
            GangLayout,
            KeyedLayout,
        )

        gang, chk, spec = self.gang, self.owner.checkpoints, self.job.spec
        operators = {}
        if gang.node_id is not None:
            cfg = gang.stage.stage.base_config
            operators[gang.node_id] = KeyedLayout(cfg.uid, cfg.backend, cfg.parallelism,
                                                  cfg.max_parallelism)
        layout = GangLayout(spec.name, {gang.source_id: (gang.source.spec.uid, gang.sources)},
                            operators)
        if chk.store is None:
            msg = "the continuous mode needs checkpoints (its sinks commit with them)"
            raise ConfigError(msg)
        return BarrierCoordinator(layout, chk.store, run_id=self.job.run_id,
                                  retain=spec.job.checkpoint.retain, host=self._host(),
                                  hooks=CommitHooks(self._stage, self._commit))

    def _host(self) -> str:
        if not self.job.on_cluster:
            return "127.0.0.1"
        return str(self.owner.spark.conf.get("spark.driver.host"))

    def _tasks(self, coord: BarrierCoordinator) -> GangTasks:
        """What the tasks are given: the plan with this attempt's checkpointing, each source
        subtask's files and position, the sink's staging."""
        from streamer.operators.continuous import SnapshotTarget
        from streamer.runtime.job.gang_tasks import GangTasks

        gang, chk, job = self.gang, self.owner.checkpoints, self.job
        settings = self._settings()
        checkpointing = chk.task_checkpointing(gang.node_id or "", None)
        plan = gang.plan
        if gang.node_id is not None:
            cfg = replace(gang.plan.route.cfg, checkpointing=checkpointing)
            plan = replace(gang.plan, route=replace(gang.plan.route, cfg=cfg))
        meta = chk.last
        first = coord.next_id()
        self.base = job.epoch + 1 - first
        gang.sink.recover(job.epoch)  # (no staging of a dead attempt stays)
        target = dead = None
        if gang.direct is None:
            target = gang.sink.task_target(self.base + first, gang.sink_schema)
            target = replace(target, directory=gang.sink.staging_root)
        if gang.dead_id is not None:
            from streamer.runtime.continuous.source_records import dead_spark_schema

            gang.dead_sink.recover(job.epoch)
            dead = gang.dead_sink.task_target(self.base + first, dead_spark_schema())
            dead = replace(dead, directory=gang.dead_sink.staging_root)
        return GangTasks(
            sources=gang.sources, keyed=gang.parallelism, plan=plan, reads=self._reads(meta),
            slice_rows=settings.continuous_batch_rows, coordinator=coord.location,
            snapshots=SnapshotTarget(checkpointing.url, checkpointing.local_copy_root),
            sink=target, direct=gang.direct,
            sink_epoch_base=self.base, positions=self._positions(meta),
            last_checkpoint=meta.checkpoint_id if meta else 0, first_checkpoint=first,
            watermark=int(meta.watermark.get("current", MIN_WATERMARK)) if meta
            else MIN_WATERMARK,
            channel_bytes=CHANNEL_BYTES, batch_rows=settings.continuous_batch_rows,
            host="127.0.0.1" if not job.on_cluster else None, dead_letters=dead)

    def _settings(self) -> Any:
        """The run's `job.execution` settings (the environment's overrides applied)."""
        assert self.job.plan is not None
        return self.job.plan.settings

    def _flush_s(self) -> float:
        return float(self._settings().continuous_flush_interval) / 1000

    def _reads(self, meta: CheckpointMetadata | None) -> tuple[Any, ...]:
        """What each source subtask reads: a files source's files (those of the
        checkpoint's positions, else the files not read whole yet, split over the
        subtasks); a Kafka source's partitions from the restored offsets (any parallelism:
        the offsets say all), split over the subtasks."""
        from streamer.runtime.continuous.source_subtask import split_files
        from streamer.runtime.job.barrier_coordinator import CONTINUOUS
        from streamer.runtime.job.gang_tasks import FileReads, KafkaReads

        source, n = self.gang.source, self.gang.sources
        offsets = {k: v for k, v in self.job.offsets[self.gang.source_id].items()
                   if k != CONTINUOUS}
        if source.task_reads == "kafka":
            splits = sorted(set(source.partitions()) | set(offsets))
            marks = source.watermarks(splits)
            start = {s: max(int(offsets.get(s, marks[s][0])), marks[s][0]) for s in splits}
            ends = source.bounds()
            return tuple(KafkaReads({s: start[s] for s in splits[i::n]},
                                    None if ends is None else
                                    {s: ends.get(s, start[s]) for s in splits[i::n]},
                                    self._flush_s()) for i in range(n))
        positions = self._positions(meta)
        if positions:
            return tuple(FileReads(tuple(p["files"])) for _, p in sorted(positions.items()))
        done = set(offsets.get("files", []))
        files = [f for f in source.list_files() if f not in done]
        return tuple(FileReads(tuple(share)) for share in split_files(files, n))

    def _positions(self, meta: CheckpointMetadata | None) -> dict[int, dict[str, Any]]:
        """The source subtasks' positions in the checkpoint restored, if it was taken
        continuously at this parallelism ({} otherwise)."""
        from streamer.runtime.job.barrier_coordinator import source_positions

        if meta is None or self.gang.source.task_reads == "kafka":
            return {}  # (Kafka: the offsets say where every partition is)
        found = source_positions(meta, self.gang.source.spec.uid)
        if not found:
            return {}
        if len(found) != self.gang.sources:
            msg = (f"checkpoint {meta.checkpoint_id} was taken by {len(found)} continuous "
                   f"source subtasks, and this run has {self.gang.sources}; stop the job with "
                   "a savepoint to change its parallelism")
            raise ConfigError(msg)
        return found

    # ------------------------------------------------------------------ checkpoints
    def _checkpoints(self, coord: BarrierCoordinator) -> tuple[str, str] | None:
        """Trigger a checkpoint every interval, and at once for a savepoint or a stop, until
        one completes with every subtask's input ended (None), a stop ends the run after a
        last checkpoint (and its savepoint), or a cancel. A failed gang ends the loop (None:
        `run` raises)."""
        spec, control = self.job.spec.job.checkpoint, self.owner.control
        due = time.monotonic() + spec.interval_ms / 1000
        while not self.done.wait(0.05):
            url = control.poll()
            if control.cancelled:
                return "cancelled", "cancelled (continuous mode: no final checkpoint)"
            stopping = control.stop.is_set()
            if not (url or stopping or time.monotonic() >= due):
                continue
            meta = self._checkpoint(coord, spec.timeout_ms / 1000)
            due = time.monotonic() + spec.interval_ms / 1000
            if meta is None:
                continue  # (declined; a failed gang ends the loop)
            if url is not None:
                self._savepoint(meta, url)
            if stopping and self._stopped(meta):
                return "stopped", f"stopped at checkpoint {meta.checkpoint_id}" + (
                    f"; savepoint {control.stop_savepoint}" if control.stop_savepoint else "")
            if coord.all_ended is not None:
                return None
        return None

    def _checkpoint(self, coord: BarrierCoordinator, timeout_s: float
                    ) -> CheckpointMetadata | None:
        """Take a checkpoint now: its metadata, or None if it was declined."""
        from streamer import failpoints
        from streamer.runtime.job.barrier_coordinator import CheckpointDeclinedError

        checkpoint = coord.trigger()
        failpoints.reached("barrier-injected", checkpoint)
        try:
            meta = self._wait(coord, checkpoint, timeout_s)
        except CheckpointDeclinedError as exc:
            self._declined(coord, checkpoint, str(exc))
            return None
        if meta is not None:
            self.job.totals["records_out"] = self.rows_before + coord.rows_out
            self._completed(meta)
        return meta

    def _savepoint(self, meta: CheckpointMetadata, url: str) -> bool:
        from streamer.runtime.job.gang_savepoint import savepoint_of_checkpoint

        return savepoint_of_checkpoint(self.owner, self.gang.node_id, meta, url)

    def _stopped(self, meta: CheckpointMetadata) -> bool:
        """A stop after checkpoint `meta`: the savepoints owed, then the stop's own; whether
        the run stops (a failed stop-with-savepoint keeps it going)."""
        control = self.owner.control
        while (owed := control.owed()) is not None:
            self._savepoint(meta, owed)
        if control.stop_savepoint is not None:
            self._savepoint(meta, control.stop_savepoint)
        return control.stop.is_set()

    def _wait(self, coord: BarrierCoordinator, checkpoint: int, timeout_s: float
              ) -> CheckpointMetadata | None:
        """Checkpoint `checkpoint` once complete; None when the gang ended first (failed)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            meta = coord.poll(checkpoint, 0.2)
            if meta is not None:
                return meta
            if self.done.is_set() and coord.all_ended is None:
                return None  # the gang ended without it: `run` says why
        return coord.wait(checkpoint, 0)  # declines it

    def _declined(self, coord: BarrierCoordinator, checkpoint: int, reason: str) -> None:
        """A checkpoint that did not complete. One whose `_metadata` was written but whose
        sinks did not commit fails the run: its restart commits them (`Recovery`)."""
        from streamer.runtime.exceptions import JobFailedError

        if checkpoint in coord.store.ids():
            msg = f"checkpoint {checkpoint}: its sinks did not commit: {reason}"
            raise JobFailedError(msg)
        if self.done.is_set():  # the gang failed: `run` says why
            return
        self.job.reporter.checkpoint({"status": "failed", "id": checkpoint,
                                      "epoch": self.job.epoch, "reason": reason})

    def _completed(self, meta: CheckpointMetadata) -> None:
        """The driver's record of checkpoint `meta` (what a restart resumes from)."""
        chk = self.owner.checkpoints
        chk.last = meta
        chk.completed.append(meta.checkpoint_id)
        if self.gang.node_id is not None:
            chk.last_handles = {self.gang.node_id: {
                int(h["subtask"]): h for op in meta.operators.values() for h in op.subtasks}}
        self.job.epoch = meta.epoch
        self.job.totals["records_in"] = sum(meta.records.values())
        self.job.offsets[self.gang.source_id] = dict(
            meta.offsets[self.gang.source.spec.uid])
        self.job.reporter.checkpoint({
            "status": "completed", "id": meta.checkpoint_id, "epoch": meta.epoch,
            "duration_ms": meta.duration_ms, "state_size": meta.state_size,
            "uploaded_bytes": meta.uploaded_bytes, "pruned": [],
            "path": chk.store.storage.path(chk.store.dir_of(meta.checkpoint_id))})

    def _stage(self, meta: CheckpointMetadata) -> None:
        """Before `_metadata` of n is written: the staged files of n of the sink and of the
        `on_error` sink as their pending commits (a direct sink produced its rows already,
        and flushed them before the acknowledgements), and the epoch above the sinks' (an
        epoch-mode restore goes on after it)."""
        epoch = self.base + meta.checkpoint_id
        meta.epoch = max(meta.epoch, epoch)
        meta.sinks = {}
        for sink_id, sink in self.gang.staged_sinks.items():
            # (a checkpoint none of whose subtasks wrote a row has no directory yet)
            os.makedirs(epoch_staging(sink.staging_root, epoch), exist_ok=True)
            meta.sinks[sink_id] = [[epoch, sink.tasks_wrote(epoch, lambda: None)]]

    def _commit(self, meta: CheckpointMetadata) -> None:
        """After `_metadata` of n: commit the staged files of n."""
        from streamer import failpoints

        failpoints.reached("after-metadata", meta.checkpoint_id)
        for sink_id, sink in self.gang.staged_sinks.items():
            for epoch, handle in meta.sinks.get(sink_id, []):
                sink.commit(epoch, handle)


def task_error(exc: BaseException) -> str:
    """What failed a gang's task: the Python exception a task raised, without Spark's and
    the JVM's frames around it (else the error as it is)."""
    import re

    text = str(exc)
    found = re.findall(r"^([A-Za-z_.]*(?:Error|Exception|Interrupt)\b[^\n]*)$", text, re.M)
    python = [line for line in found if not line.startswith(("org.", "java.", "py4j."))]
    return python[-1].removesuffix(" SQLSTATE: 38000").strip() if python else text
