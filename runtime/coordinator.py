"""The epoch loop (ARCHITECTURE.md §2): plan a slice of every source, run one Spark job per
sink over the slices through the stateless operators, commit the sinks, advance offsets.

An epoch boundary is an aligned barrier: every record of an epoch's slices is committed
together, none of the next epoch's. Bounded sources end the loop; unbounded ones run until
`request_stop()` (Ctrl-C in the CLI), which takes effect at the next epoch boundary.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from streamer.connectors.base import (
    DEAD_LETTER_DDL,
    DECODE_ERROR_MARKER,
    ConnectorContext,
    Sink,
    Source,
    SourceRead,
    SourceSlice,
)
from streamer.connectors.exceptions import DecodeError
from streamer.exceptions import StreamerError
from streamer.operators.stateless import apply_stateless, union
from streamer.pipeline.graph import Dataflow, compile_dataflow
from streamer.pipeline.spec import PipelineSpec
from streamer.runtime.analyze import analyze
from streamer.runtime.exceptions import JobFailedError
from streamer.runtime.local import LocalSeen, local_rows, local_table
from streamer.runtime.metrics import EpochMetrics, QuietReporter, Reporter
from streamer.runtime.spark import EpochConf, small_epoch_rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation, SparkSession
    from rich.console import Console

    from streamer.checkpoint.metadata import CheckpointMetadata, CheckpointStore


@dataclass
class RunOptions:
    """How to run a job (the CLI builds this from its options)."""

    master: str | None = None
    spark_conf: dict[str, str] = field(default_factory=dict)
    ui: bool = True
    #: Stop after this many epochs that read data (smoke runs); None = until done or stopped.
    max_epochs: int | None = None
    console: Console | None = None
    #: Keep the keyed subtasks' working state after the run (for inspection and tests).
    keep_state: bool = False
    #: Take checkpoints and resume from them (`streamer run`); off for in-process test runs.
    checkpoints: bool = False
    #: Resume from this checkpoint (its number or chk-<n> path) instead of the latest.
    from_checkpoint: str | None = None
    #: Delete the job's checkpoints and start from the sources' beginning.
    fresh: bool = False
    #: Storage URL for checkpoints (default: the pipeline's `storage:`).
    storage: str | None = None
    #: Start from this savepoint (`streamer restore`, `run --from-savepoint`).
    from_savepoint: str | None = None
    #: Drop savepoint state whose operator uid is gone instead of refusing.
    allow_non_restored_state: bool = False


@dataclass
class JobResult:
    """How a run ended."""

    status: str  # finished | stopped | cancelled
    epochs: int
    records_in: int
    records_out: int
    dead_letters: int
    reason: str
    offsets: dict[str, Any] = field(default_factory=dict)
    metrics: list[EpochMetrics] = field(default_factory=list)
    #: Checkpoints completed by this run, the one it resumed from, restarts it made.
    checkpoints: list[int] = field(default_factory=list)
    restored_from: int | None = None
    restarts: int = 0
    savepoints: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able summary."""
        return {"status": self.status, "epochs": self.epochs, "records_in": self.records_in,
                "records_out": self.records_out, "dead_letters": self.dead_letters,
                "reason": self.reason, "checkpoints": len(self.checkpoints),
                "restored_from": self.restored_from, "restarts": self.restarts,
                "savepoints": self.savepoints}


def _now_ms() -> int:
    return int(time.time() * 1000)


class _DirectSeen:
    """What an `Observation` of a source scan gives (`n`, `ts0`), for a slice its keyed
    stage read itself: every subtask reads all of the slice, so any one's metadata has it."""

    def __init__(self, metas: Any) -> None:
        self.metas = metas

    @property
    def get(self) -> dict[str, Any]:
        for meta in self.metas:
            if "records_in" in meta:
                return {"n": meta["records_in"], "ts0": meta["max_ts"]}
        return {}


def _local_stats(records: DataFrame, read: SourceRead, splits: list[str],
                 event_time: bool) -> LocalSeen | None:
    """What the source's observation would see (`n`, `ts<i>`) of a slice read as a local
    relation, computed on the driver without a Spark job; None when Spark cannot evaluate
    the event time that way."""
    if not event_time and read.local_rows is not None:
        return LocalSeen({"n": read.local_rows})
    split = read.split_column
    table = local_table(records.selectExpr(
        f"{split} AS split" if split else "'' AS split",
        "unix_millis(__ts) AS ms" if event_time else "CAST(NULL AS BIGINT) AS ms"))
    if table is None:
        return None
    newest: dict[str, int] = {}
    for name, ms in zip(table.column("split").to_pylist(), table.column("ms").to_pylist(),
                        strict=True):
        if ms is not None and (name not in newest or ms > newest[name]):
            newest[name] = ms
    got: dict[str, Any] = {"n": table.num_rows}
    for i, name in enumerate(splits):
        got[f"ts{i}"] = newest.get(str(name)) if split else max(newest.values(), default=None)
    return LocalSeen(got)


class _TaskRows:
    """What an `Observation` of a sink's input gives (`n`), for a sink whose files the
    keyed tasks wrote themselves: the sum of their `sink_rows`."""

    def __init__(self, metas: Any) -> None:
        self.metas = metas

    @property
    def get(self) -> dict[str, Any]:
        return {"n": sum(int(m.get("sink_rows", 0)) for m in self.metas)}


class JobRunner:
    """Runs one pipeline: sources, operators and sinks wired per the dataflow."""

    def __init__(self, spec: PipelineSpec, options: RunOptions | None = None, *,
                 reporter: Reporter | None = None, spark: SparkSession | None = None,
                 source_factory: Callable[[Any, ConnectorContext], Source] | None = None,
                 sink_factory: Callable[[Any, ConnectorContext], Sink] | None = None) -> None:
        self.spec = spec
        self.options = options or RunOptions()
        self.reporter: Reporter = reporter or QuietReporter()
        self._spark = spark
        self._source_factory = source_factory
        self._sink_factory = sink_factory
        self._stop = threading.Event()
        self.flow: Dataflow = compile_dataflow(spec)
        self.sources: dict[str, Source] = {}
        self.sinks: dict[str, Sink] = {}
        self.schemas: dict[str, Any] = {}
        self.offsets: dict[str, dict[str, Any]] = {}
        self.run_id = f"{int(time.time() * 1000):x}-{os.getpid()}"
        self.keyed: dict[str, Any] = {}
        #: keyed operator id -> the sink whose files its tasks write (`_task_written_sink`)
        self.task_sinks: dict[str, str] = {}
        self.event_time: dict[str, bool] = {}
        self.state_root = ""
        self.next_timers: dict[str, dict[str, int | None]] = {}
        self.epoch = 0
        self.history: list[EpochMetrics] = []
        # Checkpoints (see _recover and _complete_checkpoint).
        self.store: CheckpointStore | None = None
        self.last_checkpoint: CheckpointMetadata | None = None
        self.last_checkpoint_at = 0.0
        self.last_handles: dict[str, dict[int, dict[str, Any]]] = {}
        #: sink id -> [[epoch, handle], ...] staged, waiting for the covering checkpoint
        self.pending: dict[str, list[list[Any]]] = {}
        self.completed: list[int] = []
        self.restored_from: int | None = None
        self.result_restored_from: int | None = None
        self.bad_checkpoints: set[int] = set()
        self.state_roots: list[str] = []
        #: Per restore: operator, subtasks restored locally / remotely, slowest (ms).
        self.restore_report: list[dict[str, Any]] = []
        #: On a cluster (not `local[...]`): working state per executor, a checkpoint every
        #: epoch so a subtask that moves restores the latest version (runtime/placement.py).
        self.on_cluster = False
        from streamer.runtime.placement import Placement

        self.placement = Placement()
        self.first_epoch = 1
        self.storage_url = self.options.storage or spec.storage
        # Savepoints, the job registry and the control channel.
        self.registry: Any = None
        self.control: Any = None
        self.savepoint_restore: dict[str, dict[str, Any]] = {}
        self.savepoint_meta: Any = None
        self.lineage_start = 0  # checkpoints at or below this id predate a savepoint restore
        self.force_checkpoint = False
        self.savepoints: list[str] = []
        self.cancelled = False
        self.stop_savepoint: str | None = None
        self.stop_drain = False
        self.seen_requests: set[str] = set()
        #: savepoint url -> ids of the requests waiting for it
        self.savepoint_waiters: dict[str, list[str]] = {}
        #: Per-epoch Spark settings (the small-epoch mode), set once the session exists.
        self.epoch_conf: EpochConf | None = None

    # ------------------------------------------------------------------------ control
    def request_stop(self) -> None:
        """Stop cleanly at the next epoch boundary."""
        self._stop.set()

    @property
    def stop_requested(self) -> bool:
        """Whether a stop was requested."""
        return self._stop.is_set()

    # ------------------------------------------------------------------------ setup
    @property
    def spark(self) -> SparkSession:
        """The Spark session, started on first use."""
        if self._spark is None:
            from streamer.connectors.kafka import session_conf
            from streamer.runtime.spark import create_session

            conf = {**self.spec.spark, **self.options.spark_conf}
            conf.update(session_conf(self.spec, conf))
            self._spark = create_session(f"streamer:{self.spec.name}", self.options.master,
                                         conf, ui=self.options.ui)
        return self._spark

    def prepare(self) -> None:
        """Check the job can run, build connectors, analyze every expression, and plan the
        keyed stages."""
        from streamer.connectors.registry import make_sink, make_source

        ctx = ConnectorContext(spark=self.spark, job_name=self.spec.name,
                               console=self.options.console, storage_url=self.storage_url,
                               exactly_once=self.options.checkpoints
                               and self.spec.job.checkpoint.mode == "exactly_once",
                               local_rows=local_rows())
        make_src = self._source_factory or make_source
        make_snk = self._sink_factory or make_sink
        self.sources = {s.id: make_src(s, ctx) for s in self.spec.sources}
        self._ship_user_code()
        self.schemas = analyze(self.spec, self.spark, self.sources, self.flow)
        self.sinks = {k.id: make_snk(k, ctx) for k in self.spec.sinks}
        for sink in self.sinks.values():
            sink.open()
        self.offsets = {sid: dict(src.initial_offsets()) for sid, src in self.sources.items()}
        from streamer.runtime.placement import on_cluster

        self.on_cluster = on_cluster(self.spark.sparkContext.master)
        self._plan_keyed()
        if self.on_cluster and self.keyed and not self.options.checkpoints:
            from streamer.exceptions import ConfigError

            msg = ("on a cluster, keyed state follows its subtasks from executor to executor "
                   "through checkpoint storage, so --no-checkpoints cannot run this pipeline's "
                   f"keyed operators ({', '.join(map(repr, self.keyed))}); run it with "
                   "checkpoints, or with --master local[*]")
            raise ConfigError(msg)

    def _ship_user_code(self) -> None:
        """Import the modules named in `process:` (next to the pipeline file first) and ship
        them to Spark's Python workers."""
        from streamer.operators.process import load_function_class, module_file

        base = os.path.dirname(os.path.abspath(self.spec.file)) if os.path.exists(
            self.spec.file) else os.getcwd()
        from streamer.operators.process import ProcessFunctionError
        from streamer.pipeline.exceptions import PipelineError, Problem

        for op in self.spec.operators:
            if not op.process:
                continue
            try:
                load_function_class(op.process, base, op.id)
            except ProcessFunctionError as exc:
                where = self.spec.where((*op.path, "process"))
                raise PipelineError([Problem(where, str(exc))]) from exc
            path = module_file(op.process)
            if path and os.path.isfile(path):
                self.spark.sparkContext.addPyFile(path)
            elif path:  # a package: ship it zipped
                import shutil
                import tempfile

                archive = shutil.make_archive(
                    os.path.join(tempfile.mkdtemp(prefix="streamer-py-"),
                                 os.path.basename(path)), "zip", os.path.dirname(path),
                    os.path.basename(path))
                self.spark.sparkContext.addPyFile(archive)

    def _plan_keyed(self) -> None:
        """Which nodes carry event time, and a `KeyedStage` per keyed operator."""
        from pyspark.sql.types import StructField, StructType, TimestampType

        from streamer.runtime.keyed import (
            DirectShape,
            KeyedStage,
            default_state_root,
            direct_plan,
            local_plan,
        )

        self.event_time = {}
        self.keyed = {}
        self.task_sinks = {}
        self.state_root = default_state_root(self.spec.job.state_local_dir, self.spec.name,
                                             self.run_id)
        for node in self.flow.nodes:
            if node.role == "source":
                self.event_time[node.id] = bool(node.spec.event_time)  # type: ignore[union-attr]
            elif node.role == "operator":
                has_ts = all(self.event_time.get(i, False) for i in node.inputs)
                if node.kind != "keyed":
                    self.event_time[node.id] = has_ts
                    continue
                op = node.spec
                schema = self.schemas[op.inputs[0]]  # type: ignore[union-attr]
                if has_ts:
                    schema = StructType([*schema.fields, StructField("__ts", TimestampType())])
                stage = KeyedStage(self.spark, op, self.spec.job, self.spec.name,  # type: ignore
                                   schema, has_ts, self.state_root)
                if self.on_cluster:
                    from dataclasses import replace

                    stage.base_config = replace(stage.base_config, executor_scoped=True)
                self.keyed[node.id] = stage
                self.event_time[node.id] = stage.kind == "window" or (
                    stage.kind == "dedupe" and has_ts)
                source_id = op.inputs[0]  # type: ignore[union-attr]
                if len(op.inputs) == 1 and source_id in self.sources:  # type: ignore[union-attr]
                    plan = direct_plan(stage, self.sources[source_id], self.schemas[source_id],
                                       len(self.flow.consumers(source_id)))
                    if isinstance(plan, DirectShape):
                        stage.direct = plan
                shape = local_plan(stage)
                if isinstance(shape, DirectShape):
                    stage.local = shape
                    # The driver shares the executors' file system only in local mode.
                    stage.in_driver = (not self.on_cluster and os.environ.get(
                        "STREAMER_DRIVER_SUBTASKS", "1") != "0")
                sink_id = self._task_written_sink(node.id, stage)
                if sink_id is not None:
                    self.task_sinks[node.id] = sink_id

    def _task_written_sink(self, node_id: str, stage: Any) -> str | None:
        """The sink whose files the keyed stage `node_id`'s tasks write themselves
        (`FilesSink.task_target`), or None: the stage's only consumer is that sink, the sink
        reads nothing else (no dead letters, late or side outputs), the stage has no side
        outputs, and the sink is local parquet. `STREAMER_TASK_SINK=0` turns it off."""
        from streamer.connectors.files_sink import FilesSink

        if os.environ.get("STREAMER_TASK_SINK", "1") == "0" or stage.side_schemas:
            return None
        consumers = self.flow.consumers(node_id)
        if len(consumers) != 1:
            return None
        sink_id = consumers[0].id
        sink = self.sinks.get(sink_id)
        if (not isinstance(sink, FilesSink) or not sink.takes_task_files
                or self.flow.node(sink_id).inputs != (node_id,)
                or sink_id in self.spec.dead_letter_sinks):
            return None
        return sink_id

    # ------------------------------------------------------------------------ the loop
    def run(self) -> JobResult:
        """Run epochs until the bounded sources are exhausted or a stop is requested.

        With checkpoints on, the run first resumes from the job's latest checkpoint (if any),
        and a failed epoch restarts the job in-process from the latest checkpoint, up to
        `job.restart.attempts` times (a subtask whose state was lost is restored without
        counting as an attempt).
        """
        from streamer import failpoints

        def restore() -> object:
            return None
        restarts = 0
        try:
            if failpoints.ENV in os.environ:
                os.environ[failpoints.DRIVER_PID_ENV] = str(os.getpid())
            self._register()  # before Spark starts: a second run is refused at once
            # After the session exists: PySpark installs its own SIGINT handler (cancel all
            # jobs, raise KeyboardInterrupt) when the SparkContext starts.
            self.spark  # noqa: B018
            restore = self._install_sigint()
            self.prepare()
            small_epoch_rows(), local_rows()  # a bad setting fails here, not in an epoch
            self.epoch_conf = EpochConf(self.spark)
            if self.registry is not None:
                self.registry.update(master=self.spark.sparkContext.master, parallelism={
                    n: s.parallelism for n, s in self.keyed.items()})
            ui = self.spark.sparkContext.uiWebUrl if self.options.ui else None
            self.reporter.started({"job": self.spec.name, "master": self.spark.sparkContext.master,
                                   "ui": ui, "sources": list(self.sources),
                                   "sinks": list(self.sinks)})
            free = 0  # restarts that do not count as attempts (lost state, bad checkpoint)
            while True:
                try:
                    self._recover(first=restarts + free == 0)
                    result = self._loop()
                    break
                except JobFailedError as exc:
                    if not self._may_restart(exc, restarts, free):
                        raise
                    if self._free_restart(exc):
                        free += 1
                    else:
                        restarts += 1
                    self._abort_pending()
                    if self._stop.is_set():
                        raise
        except BaseException as exc:
            reason = str(exc) if isinstance(exc, StreamerError) else type(exc).__name__
            if self.registry is not None:
                self.registry.close("failed", reason, epoch=self.epoch)
            self.reporter.finished({"status": "failed", "reason": reason})
            raise
        finally:
            restore()
            if self.epoch_conf is not None:
                self.epoch_conf.use(False)  # the session's own settings again
            for sink in self.sinks.values():
                sink.close()
            for source in self.sources.values():
                source.close()
            if self.keyed:  # what the driver holds of local epochs' subtasks (`run_local`)
                from streamer.state import release_process_state

                for root in self.state_roots:
                    release_process_state(root)
            if self.keyed and not self.options.keep_state:
                # Working state is rebuilt from checkpoints (local recovery copies stay).
                import shutil

                for root in self.state_roots:
                    shutil.rmtree(root, ignore_errors=True)
                if self.on_cluster:
                    # The next application has other executors: their local copies would
                    # never be read again. (Only those on this host are reachable here.)
                    from streamer.runtime.keyed import local_recovery_root

                    copies = local_recovery_root(self.spec.job.state_local_dir)
                    for executor in self.placement.executors():
                        shutil.rmtree(os.path.join(copies, f"executor-{executor}"),
                                      ignore_errors=True)
        result.restarts = restarts
        result.savepoints = list(self.savepoints)
        if self.registry is not None:
            self.registry.close(result.status, result.reason, epoch=self.epoch,
                                records_in=result.records_in, records_out=result.records_out)
        self.reporter.finished(result.to_json())
        return result

    def _register(self) -> None:
        """Claim the job in its registry (refused if another run is alive) and start the
        heartbeat; open the control channel."""
        if not self.options.checkpoints:
            return
        from streamer.runtime.control import ControlChannel, JobRegistry

        registry = JobRegistry(self.storage_url, self.spec.name)
        note = registry.claim(self.run_id, {"file": self.spec.file})
        self.registry = registry  # only now: a refused run must not touch the other's record
        if note:
            self.reporter.message(note)
        self.registry.start_heartbeat()
        self.control = ControlChannel(self.storage_url, self.spec.name)

    # ------------------------------------------------------------------------ restarts
    def _may_restart(self, exc: JobFailedError, restarts: int, free: int) -> bool:
        """Whether a failed epoch restarts the job from its latest checkpoint."""
        from streamer.checkpoint.task import STATE_BEHIND

        if not self.options.checkpoints or self._stop.is_set():
            return False
        if self._free_restart(exc):
            if free >= 10:
                return False
            text = str(exc)
            if STATE_BEHIND in text:
                self.reporter.message("a keyed subtask lost its state since the last "
                                      "checkpoint; restarting from the last checkpoint")
            else:
                assert self.restored_from is not None
                self.bad_checkpoints.add(self.restored_from)
                self.reporter.message(
                    f"checkpoint {self.restored_from} is corrupt ({_first_line(text)}); "
                    "using the previous one")
            return True
        attempts = self.spec.job.restart_attempts
        if restarts >= attempts:
            return False
        delay = self.spec.job.restart_delay_ms / 1000
        self.reporter.message(f"{exc}\nrestarting from the last checkpoint in {delay:g}s "
                              f"(attempt {restarts + 1} of {attempts})")
        return not self._stop.wait(delay)

    def _free_restart(self, exc: JobFailedError) -> bool:
        """A restart for lost local state or a checkpoint found corrupt while restoring."""
        from streamer.checkpoint.task import STATE_BEHIND

        text = str(exc)
        if STATE_BEHIND in text:
            return True
        return (self.restored_from is not None and self.epoch <= self.first_epoch
                and "corrupt" in text.lower())

    def _abort_pending(self) -> None:
        """Drop what sinks staged since the last checkpoint (a restart writes it again)."""
        for sink_id, items in self.pending.items():
            for epoch, handle in items:
                with contextlib.suppress(Exception):
                    self.sinks[sink_id].abort(epoch, handle)
        self.pending = {}

    # ------------------------------------------------------------------------ recovery
    def _recover(self, *, first: bool) -> None:
        """Start a run attempt: fresh working state, then either the sources' beginning or
        the latest (or chosen) checkpoint: offsets, watermark, keyed state, and the sink
        commits it covers (done again, idempotently)."""
        from dataclasses import replace

        from streamer.runtime.keyed import default_state_root
        from streamer.runtime.watermarks import WatermarkTracker

        if not first:
            self.run_id = f"{int(time.time() * 1000):x}-{os.getpid()}"
        self.state_root = default_state_root(self.spec.job.state_local_dir, self.spec.name,
                                             self.run_id)
        self.state_roots.append(self.state_root)
        for stage in self.keyed.values():
            stage.base_config = replace(stage.base_config, state_root=self.state_root)
        self.watermarks = WatermarkTracker({s.id: s for s in self.spec.sources})
        self.offsets = {sid: dict(src.initial_offsets()) for sid, src in self.sources.items()}
        self.epoch = 0
        self.next_timers = {}
        self.pending = {}
        self.last_handles = {}
        self.last_checkpoint = None
        self.restored_from = None
        self.first_epoch = 1
        self.last_checkpoint_at = time.monotonic()
        if not self.options.checkpoints:
            return
        from streamer.checkpoint.metadata import CheckpointStore
        from streamer.runtime.keyed import cleanup_stale_runs

        self.store = CheckpointStore(self.storage_url, self.spec.name)
        if first:
            cleanup_stale_runs(self.spec.job.state_local_dir, self.spec.name, self.run_id)
        meta = None
        if self.options.from_savepoint and (first or self._no_checkpoint_since_savepoint()):
            self._restore_savepoint(self.options.from_savepoint, first=first)
        elif first and self.options.fresh:
            self.store.delete_all()
            self.reporter.message(f"--fresh: deleted the checkpoints of job "
                                  f"{self.spec.name!r}; starting from the beginning")
        elif first and self.options.from_checkpoint:
            meta = self.store.resolve(self.options.from_checkpoint)
            newer = [c for c in self.store.ids() if c > meta.checkpoint_id]
            if newer:
                self.reporter.message(
                    f"checkpoints {', '.join(map(str, newer))} are newer than "
                    f"{meta.checkpoint_id}: sinks already hold their output, which this run "
                    "produces again")
        else:
            from streamer.checkpoint.metadata import Listed

            skipped: list[Listed] = []
            meta = self.store.latest(skipped=skipped, exclude=self.bad_checkpoints | set(
                range(self.lineage_start + 1)))
            for item in skipped:
                self.reporter.message(f"checkpoint {item.checkpoint_id} cannot be used "
                                      f"({item.problem}); using an earlier one")
        if meta is not None:
            self._restore(meta)
            try:  # a run killed between _metadata and pruning left older checkpoints behind
                self.store.prune(self.spec.job.checkpoint.retain, keep=[meta.checkpoint_id])
            except Exception as exc:  # cleanup only; the next prune retries
                self.reporter.message(f"cleaning up older checkpoints failed: {exc}")
        self.first_epoch = self.epoch + 1

    def _no_checkpoint_since_savepoint(self) -> bool:
        assert self.store is not None
        return not any(c > self.lineage_start for c in self.store.ids()
                       if c not in self.bad_checkpoints)

    def _restore_savepoint(self, url: str, *, first: bool) -> None:
        """Start from a savepoint: per operator uid restore, start empty, drop or refuse;
        sources at its offsets (new ones at their start), its watermark and epoch."""
        from streamer.savepoint.metadata import SavepointError, plan_restore, read_metadata

        assert self.store is not None
        meta = read_metadata(url)
        decisions = plan_restore(meta, self.spec,
                                 allow_non_restored=self.options.allow_non_restored_state)
        refused = [d for d in decisions if d.action == "refuse"]
        if refused:
            msg = (f"cannot restore savepoint {url} into {self.spec.file}: " + "; ".join(
                f"operator {d.operator!r} (uid {d.uid!r}): {d.reason}" for d in refused))
            raise SavepointError(msg)
        from streamer.storage import Storage

        root = Storage(url).url
        by_uid = {stage.op.uid: node for node, stage in self.keyed.items()}
        self.savepoint_restore = {}
        for d in decisions:
            if d.action == "restore":
                self.savepoint_restore[by_uid[d.uid]] = {
                    "url": root, "files": meta.operators[d.uid].get("files", []),
                    "states": meta.operators[d.uid].get("states", {})}
        self._resume_sources(meta.offsets, meta.watermark)
        self.epoch = meta.epoch
        self.next_timers = {}
        for uid, node in by_uid.items():
            saved = meta.operators.get(uid, {})
            if "next_timers" in saved:
                self.next_timers[node] = dict(saved["next_timers"])
        for sink in self.sinks.values():
            sink.recover(meta.epoch)
        if first:
            self.lineage_start = max(self.store.ids(), default=0)
        self.savepoint_meta = meta
        self.force_checkpoint = True  # the restored lineage gets its first checkpoint at once
        summary = ", ".join(f"{d.operator}: {d.action}" for d in decisions) or "no keyed state"
        self.reporter.message(f"restoring savepoint {root} (epoch {meta.epoch}; {summary})")

    def _saved_sources(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Source offsets and the watermark tracker, keyed by source uid (as checkpoints and
        savepoints store them)."""
        uid_of = {s.id: s.uid for s in self.spec.sources}
        watermark = self.watermarks.to_json()
        watermark["finished"] = [uid_of[s] for s in watermark["finished"]]
        watermark["splits"] = [[uid_of[s], *rest] for s, *rest in watermark["splits"]]
        return {uid_of[sid]: dict(o) for sid, o in self.offsets.items()}, watermark

    def _resume_sources(self, offsets: dict[str, Any], saved: dict[str, Any]) -> None:
        """Continue each source at its saved offsets (by uid; a new source starts at its
        beginning) and the watermark where it was."""
        ids_of = {s.uid: s.id for s in self.spec.sources}
        for source in self.spec.sources:
            if source.uid in offsets:
                self.offsets[source.id] = dict(offsets[source.uid])
        watermark = dict(saved)
        watermark["finished"] = [ids_of[u] for u in watermark.get("finished", []) if u in ids_of]
        watermark["splits"] = [[ids_of[u], *rest] for u, *rest in watermark.get("splits", [])
                               if u in ids_of]
        self.watermarks.restore(watermark, _now_ms())

    def _restore(self, meta: CheckpointMetadata) -> None:
        from streamer.checkpoint.metadata import CheckpointError

        problems = []
        stages = {stage.op.uid: (node_id, stage) for node_id, stage in self.keyed.items()}
        for uid, state in meta.operators.items():
            if uid not in stages:
                problems.append(f"it holds state of operator uid {uid!r}, which the pipeline "
                                "no longer has")
                continue
            node_id, stage = stages[uid]
            was = (state.parallelism, state.max_parallelism, state.backend)
            now = (stage.parallelism, stage.max_parallelism, stage.base_config.backend)
            if was != now:
                problems.append(
                    f"operator {node_id!r} (uid {uid!r}) ran with parallelism {was[0]}, "
                    f"max_parallelism {was[1]}, backend {was[2]}; the pipeline now says "
                    f"{now[0]}, {now[1]}, {now[2]}")
        if problems:
            msg = (f"cannot resume job {self.spec.name!r} from checkpoint {meta.checkpoint_id}: "
                   + "; ".join(problems) + ". Keep the pipeline as it was, or start over with "
                   "`streamer run --fresh` (savepoints carry state across such changes)")
            raise CheckpointError(msg)
        self._resume_sources(meta.offsets, meta.watermark)
        self.epoch = meta.epoch
        for uid, (node_id, _) in stages.items():
            if uid in meta.next_timers:
                self.next_timers[node_id] = dict(meta.next_timers[uid])
            if uid in meta.operators:
                self.last_handles[node_id] = {int(h["subtask"]): h
                                              for h in meta.operators[uid].subtasks}
        for sink_id, items in meta.sinks.items():
            if sink_id in self.sinks:
                for epoch, handle in items:
                    self._guarded(epoch, f"committing sink {sink_id!r} again", partial(
                        self.sinks[sink_id].commit, epoch, handle))
        for sink in self.sinks.values():
            sink.recover(meta.epoch)
        self.last_checkpoint = meta
        self.restored_from = meta.checkpoint_id
        if not self.completed:  # the checkpoint this run resumed from (after any fallback)
            self.result_restored_from = meta.checkpoint_id
        import datetime as dt

        taken = dt.datetime.fromtimestamp(meta.created_at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        self.reporter.message(f"resuming from checkpoint {meta.checkpoint_id} (epoch "
                              f"{meta.epoch}, taken {taken} UTC; {_offsets_summary(meta)})")

    # ------------------------------------------------------------------------ the loop
    def _install_sigint(self) -> Callable[[], object]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = signal.getsignal(signal.SIGINT)

        def handler(signum: int, frame: Any) -> None:
            if self._stop.is_set():  # second Ctrl-C: cancel now
                signal.signal(signal.SIGINT, previous)
                raise KeyboardInterrupt
            self.reporter.message("stopping at the next epoch boundary "
                                  "(press Ctrl-C again to cancel now)")
            self._stop.set()

        signal.signal(signal.SIGINT, handler)
        return lambda: signal.signal(signal.SIGINT, previous)

    def _timers_due(self, watermark: int, now_ms: int) -> bool:
        """Whether some keyed subtask has a timer due (so an epoch must run without data)."""
        for nxt in self.next_timers.values():
            event, processing = nxt.get("event"), nxt.get("processing")
            if (event is not None and event <= watermark) or (
                    processing is not None and processing <= now_ms):
                return True
        return False

    def _checkpoint_due(self) -> bool:
        if self.options.checkpoints and self.on_cluster and self.keyed:
            return True  # every epoch: a moved subtask restores the latest version
        return self.options.checkpoints and (
            time.monotonic() - self.last_checkpoint_at
            >= self.spec.job.checkpoint.interval_ms / 1000)

    def _unsaved(self) -> bool:
        """Whether epochs ran (or sink output waits) since the last checkpoint."""
        done = self.last_checkpoint.epoch if self.last_checkpoint else 0
        return self.options.checkpoints and (self.epoch > done or any(self.pending.values()))

    def _final_checkpoint(self, flush: int | None, savepoint_url: str | None = None) -> None:
        """A checkpoint at the end of the run (no new data), so every staged output commits
        and a restart has nothing to redo; retried a few times, then the run fails. With
        `savepoint_url` it also writes a savepoint (stop-with-savepoint)."""
        for _ in range(3):
            self.epoch += 1
            metrics = self._run_epoch(self.epoch, {}, 0.0, flush=flush, checkpoint=True,
                                      savepoint_url=savepoint_url)
            self.history.append(metrics)
            self.reporter.epoch(metrics)
            if not self._unsaved() and (savepoint_url is None or self._savepoint_done(
                    savepoint_url) or savepoint_url != self.stop_savepoint):
                return
        msg = (f"the final checkpoint of job {self.spec.name!r} failed 3 times; output since "
               "checkpoint "
               f"{self.last_checkpoint.checkpoint_id if self.last_checkpoint else '(none)'} "
               "is staged but not committed; run the job again to finish it")
        raise JobFailedError(msg)

    def _loop(self) -> JobResult:
        from streamer.runtime.watermarks import MAX_WATERMARK

        reason = ""
        status = "finished"
        ran = 0
        while True:
            savepoint_url = self._poll_control()
            if self.cancelled:
                status, reason = "cancelled", f"cancelled after epoch {self.epoch}"
                break
            if self._stop.is_set():
                if self._unsaved() or self.stop_savepoint is not None:
                    self._final_checkpoint(MAX_WATERMARK if self.stop_drain else None,
                                           savepoint_url=self.stop_savepoint)
                if self._stop.is_set():  # (a failed stop-with-savepoint keeps the job going)
                    status, reason = "stopped", (
                        f"stopped at the boundary after epoch {self.epoch}" + (
                            f"; savepoint {self.stop_savepoint}" if self.stop_savepoint
                            else ""))
                    break
            tick = time.monotonic()
            now = _now_ms()
            live = {}
            for sid, src in self.sources.items():
                if src.bounded and src.exhausted(self.offsets[sid]):
                    self.watermarks.finish(sid)
                else:
                    live[sid] = src
            if not live:
                if (self._timers_due(MAX_WATERMARK, MAX_WATERMARK) or self._unsaved()
                        or savepoint_url):
                    # End of input: the watermark goes to +inf and every timer fires.
                    if self.options.checkpoints:
                        self._final_checkpoint(MAX_WATERMARK, savepoint_url=savepoint_url)
                    else:
                        self.epoch += 1
                        final = self._run_epoch(self.epoch, {}, 0.0, flush=MAX_WATERMARK)
                        self.history.append(final)
                        self.reporter.epoch(final)
                reason = f"all sources are exhausted after {self.epoch} epochs"
                break
            slices = {}
            for sid, src in live.items():
                piece = src.plan(self.offsets[sid], now)
                if piece is not None:
                    slices[sid] = piece
            plan_ms = (time.monotonic() - tick) * 1000
            if slices or self._timers_due(self.watermarks.current, now):
                self.epoch += 1
                ran += 1
                due = self._checkpoint_due() or self.force_checkpoint or bool(savepoint_url)
                metrics = self._run_epoch(self.epoch, slices, plan_ms, checkpoint=due,
                                          savepoint_url=savepoint_url)
                self.history.append(metrics)
                self.reporter.epoch(metrics)
                if self.options.max_epochs is not None and ran >= self.options.max_epochs:
                    if self._unsaved():
                        self._final_checkpoint(None)
                    status, reason = "stopped", f"reached --max-epochs {ran}"
                    break
            # Bounded sources without a rate limit run back to back; anything else waits for
            # the next epoch tick (an interruptible sleep, so a stop is taken at once).
            eager = slices and all(self.sources[s].bounded and not self.sources[s].spec.option(
                "rows_per_second") for s in slices)
            if not eager:
                remaining = self.spec.job.epoch_ms / 1000 - (time.monotonic() - tick)
                if remaining > 0:
                    self._stop.wait(remaining)
        for url, waiters in self.savepoint_waiters.items():  # asked too late to be taken
            for rid in waiters:
                self.control.respond(rid, "failed", path=url,
                                     reason=f"the job ended ({status}) before the savepoint")
        self.savepoint_waiters = {}
        history = self.history
        return JobResult(
            status=status, epochs=self.epoch,
            records_in=sum(m.total_in for m in history),
            records_out=sum(m.total_out for m in history),
            dead_letters=sum(m.dead_letters for m in history),
            reason=reason, offsets={k: dict(v) for k, v in self.offsets.items()},
            metrics=history, checkpoints=list(self.completed),
            restored_from=self.result_restored_from)

    # ------------------------------------------------------------------------ one epoch
    def _run_epoch(self, epoch: int, slices: Mapping[str, SourceSlice],
                   plan_ms: float, flush: int | None = None,
                   checkpoint: bool = False, savepoint_url: str | None = None) -> EpochMetrics:
        """Run one epoch; with `checkpoint`, the epoch's end is also a checkpoint: keyed
        subtasks snapshot their state after committing it, and `_complete_checkpoint` writes
        `_metadata` and commits the sinks' staged output."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        from streamer import failpoints
        from streamer.operators.direct import ipc_bytes
        from streamer.runtime.keyed import visible

        failpoints.reached("epoch-start", epoch)
        small = self._small_epoch(slices)
        if self.epoch_conf is not None:
            self.epoch_conf.use(small)
        checkpoint_id = self._begin_checkpoint() if checkpoint else None
        now = _now_ms()
        watermark = self.watermarks.current
        started = time.time()
        t0 = time.monotonic()
        frames: dict[str, DataFrame | None] = {}
        dead: dict[str, list[DataFrame]] = {}
        keyed_metas: dict[str, Any] = {}
        seen_in: dict[str, Observation | LocalSeen] = {}
        ran_local: list[str] = []  # what ran as a local epoch (`runtime.local`)
        cached: list[DataFrame] = []
        #: sink id -> (the job whose keyed tasks write its files, their metadata)
        task_jobs: dict[str, tuple[Callable[[], Any], Any]] = {}
        direct = self._direct_reads(slices, watermark if flush is None else flush)
        for node in self.flow.nodes:
            if node.role == "source":
                piece = slices.get(node.id)
                if piece is None:
                    frames[node.id] = None
                    continue
                if node.id in direct:  # its keyed stage reads the slice itself
                    frames[node.id] = None
                    dead_letters = direct[node.id][2]
                    on_error = node.spec.on_error  # type: ignore[union-attr]
                    if dead_letters is not None and on_error:
                        dead.setdefault(on_error, []).append(dead_letters)
                    continue
                read = self._guarded(epoch, f"reading source {node.id!r}",
                                     partial(self.sources[node.id].read, piece))
                records = read.records
                stats = [F.count(F.lit(1)).alias("n")]
                event_time = node.spec.event_time  # type: ignore[union-attr]
                if event_time:
                    records = records.withColumn("__ts", F.expr(event_time))
                    ms = F.expr("unix_millis(__ts)")
                    if read.split_column:
                        split_col = F.col(read.split_column)
                        for i, split in enumerate(piece.end):
                            stats.append(F.max(F.when(split_col == F.lit(str(split)), ms))
                                         .alias(f"ts{i}"))
                    else:
                        stats += [F.max(ms).alias(f"ts{i}") for i, _ in enumerate(piece.end)]
                # (Spark evaluates a local relation's expressions while it optimizes the
                # plan, so a record that fails them fails here.)
                seen = (None if not read.local else self._guarded(
                    epoch, f"reading source {node.id!r}",
                    partial(_local_stats, records, read, list(piece.end), bool(event_time))))
                if seen is not None:  # no observation: it would need a Spark job
                    seen_in[node.id] = seen
                    ran_local.append(node.id)
                else:
                    obs = Observation(f"in_{node.id}_{epoch}")
                    seen_in[node.id] = obs
                    records = records.observe(obs, *stats)
                if read.split_column:
                    records = records.drop(read.split_column)
                frames[node.id] = records
                on_error = node.spec.on_error  # type: ignore[union-attr]
                if read.dead_letters is not None and on_error:
                    dead.setdefault(on_error, []).append(read.dead_letters)
            elif node.role == "operator":
                present = [f for i in node.inputs if (f := frames.get(i)) is not None]
                if node.id in self.keyed:
                    stage = self.keyed[node.id]
                    fire = flush if flush is not None else (
                        now if stage.domain == "processing" else watermark)
                    tasks = self._task_checkpointing(node.id, checkpoint_id, savepoint_url)
                    reads = stage.direct and direct.get(stage.direct.source_id)
                    write_to = None
                    if node.id in self.task_sinks:
                        target = self.sinks[self.task_sinks[node.id]]
                        write_to = self._guarded(
                            epoch, f"writing sink {self.task_sinks[node.id]!r}",
                            partial(target.task_target, epoch,  # type: ignore[attr-defined]
                                    stage.visible_schema))
                    collected = None
                    if (not reads and stage.local is not None and not present and local_rows()
                            and stage.small_input):
                        import pyarrow as pa  # no input (timers only): nothing to collect

                        # (After big epochs the timers may fire many windows: those keep
                        # the Spark path, whose tasks fire them in parallel.)
                        collected = pa.schema(list(stage.local.columns)).empty_table()
                    elif not reads and stage.local is not None and ran_local:
                        collected = self._guarded(epoch, f"operator {node.id!r}", partial(
                            local_table, union(present).select(
                                *[F.col(f"`{name}`") for name, _ in stage.local.columns])))
                    if present:  # whether this epoch's input was small enough to collect
                        stage.small_input = collected is not None
                    if reads:
                        result = self._guarded(epoch, f"operator {node.id!r}", partial(
                            stage.run_direct, reads[1], epoch, now, fire, tasks, write_to))
                        if reads[0] is not None:
                            seen_in[reads[0]] = _DirectSeen(result.metas)  # type: ignore
                    elif collected is not None:  # a local epoch: no scan, no shuffle
                        shape = stage.local
                        assert shape is not None
                        inline = shape.read(watermark if flush is None else flush,
                                            table=ipc_bytes(collected))
                        result = self._guarded(epoch, f"operator {node.id!r}", partial(
                            stage.run_local, inline, epoch, now, fire, tasks, write_to))
                        ran_local.append(node.id)
                    else:
                        result = self._guarded(epoch, f"operator {node.id!r}", partial(
                            stage.run, union(present) if present else None, epoch, now,
                            watermark if flush is None else flush, fire, tasks, small,
                            write_to))
                    keyed_metas[node.id] = result.metas
                    if result.run_job is not None:
                        task_jobs[self.task_sinks[node.id]] = (result.run_job, result.metas)
                    frames[node.id] = result.output
                    late_sink = node.spec.window.late if node.spec.window else None  # type: ignore
                    if result.late is not None and late_sink:
                        dead.setdefault(late_sink, []).append(result.late)
                    for name, sink in node.spec.side_outputs:  # type: ignore[union-attr]
                        if name in result.sides:
                            dead.setdefault(sink, []).append(result.sides[name])
                else:
                    frames[node.id] = (apply_stateless(node.spec, union(present))  # type: ignore
                                       if present else None)
            df = frames.get(node.id)
            if node.role != "sink" and df is not None and len(self.flow.consumers(node.id)) > 1:
                # Read once, write to several sinks: keep the epoch's rows for the second.
                frames[node.id] = df.persist()
                cached.append(df)

        handles: dict[str, Any] = {}
        seen_out: dict[str, Any] = {}
        try:
            for sink_id, sink in self.sinks.items():
                node = self.flow.node(sink_id)
                if sink_id in task_jobs:
                    run_job, metas = task_jobs[sink_id]
                    handles[sink_id] = self._guarded(epoch, f"writing sink {sink_id!r}", partial(
                        sink.tasks_wrote, epoch, run_job))  # type: ignore[attr-defined]
                    seen_out[sink_id] = _TaskRows(metas)
                    continue
                present = [f for i in node.inputs if (f := frames.get(i)) is not None]
                present += dead.get(sink_id, [])
                if not present:
                    continue
                if ran_local and sink.takes_tables:
                    table = self._guarded(epoch, f"writing sink {sink_id!r}", partial(
                        local_table, sink.table_of(visible(union([visible(f)
                                                                  for f in present])))))
                    if table is not None:  # the rows, collected on the driver without a job
                        seen_out[sink_id] = LocalSeen({"n": table.num_rows})
                        ran_local.append(sink_id)
                        handles[sink_id] = self._guarded(
                            epoch, f"writing sink {sink_id!r}",
                            partial(sink.write_table, epoch, table))
                        continue
                obs = Observation(f"out_{sink_id}_{epoch}")
                seen_out[sink_id] = obs
                df = visible(union([visible(f) for f in present])).observe(
                    obs, F.count(F.lit(1)).alias("n"))
                handles[sink_id] = self._guarded(epoch, f"writing sink {sink_id!r}",
                                                 partial(sink.write, epoch, df))
            run_ms = (time.monotonic() - t0) * 1000
            t1 = time.monotonic()
            if self.options.checkpoints and self.spec.job.checkpoint.mode == "exactly_once":
                # Phase two waits for the checkpoint that covers this epoch.
                for sink_id, handle in handles.items():
                    self.pending.setdefault(sink_id, []).append([epoch, handle])
            else:
                for sink_id, handle in handles.items():
                    self._guarded(epoch, f"committing sink {sink_id!r}",
                                  partial(self.sinks[sink_id].commit, epoch, handle))
        except BaseException:
            for sink_id, handle in handles.items():
                with contextlib.suppress(Exception):
                    self.sinks[sink_id].abort(epoch, handle)
            raise
        finally:
            for df in cached:
                df.unpersist()
        keyed_ms: float | None = None
        snapshot_ms: float | None = None
        moves, restores, restore_ms = 0, 0, 0.0
        executors: set[str] = set()
        for node_id, metas in keyed_metas.items():  # complete now that the jobs have run
            found = list(metas)
            keyed_ms = max([keyed_ms or 0.0, *(float(m["task_ms"]) for m in found
                                               if "task_ms" in m)])
            if any("snapshot_ms" in m for m in found):
                snapshot_ms = max([snapshot_ms or 0.0, *(float(m["snapshot_ms"]) for m in found
                                                         if "snapshot_ms" in m)])
            if len(found) != self.keyed[node_id].parallelism:
                msg = (f"epoch {epoch}: operator {node_id!r} reported {len(found)} of "
                       f"{self.keyed[node_id].parallelism} subtasks; its output was not read")
                raise JobFailedError(msg)
            moves += self.placement.update(node_id, found)
            executors.update(str(m["executor"]) for m in found if m.get("executor"))
            restored = [m for m in found if m.get("restored")]
            restores += len(restored)
            restore_ms = max([restore_ms, *(float(m.get("restore_ms", 0)) for m in restored)])
            if restored:
                local = sum(1 for m in restored if m["restored"] == "local")
                slowest = max(float(m.get("restore_ms", 0)) for m in restored)
                self.restore_report.append({"operator": node_id, "local": local,
                                            "remote": len(restored) - local,
                                            "ms": slowest, "epoch": epoch})
            if restored and (not self.on_cluster or epoch == self.first_epoch):
                # (On a cluster, subtasks that moved restore every epoch: see the metrics.)
                self.reporter.message(
                    f"operator {node_id!r}: restored {local} subtasks from local copies and "
                    f"{len(restored) - local} from checkpoint storage (slowest "
                    f"{slowest:,.0f} ms)")
            self.next_timers[node_id] = {
                domain: min((m[f"next_{domain}"] for m in found
                             if m[f"next_{domain}"] is not None), default=None)
                for domain in ("event", "processing")}
        for sid, piece in slices.items():
            self.offsets[sid] = dict(piece.end)
            if self.sources[sid].spec.event_time:
                got = seen_in[sid].get
                self.watermarks.observe(sid, {str(split): got.get(f"ts{i}")
                                              for i, split in enumerate(piece.end)}, now)
        self.watermarks.advance(_now_ms())
        checkpoint_ms = None
        if checkpoint_id is not None:
            t2 = time.monotonic()
            done = self._complete_checkpoint(checkpoint_id, epoch, keyed_metas, t1)
            if done:
                self.force_checkpoint = False
            if savepoint_url is not None:
                self._complete_savepoint(savepoint_url, epoch, keyed_metas, done)
            checkpoint_ms = (time.monotonic() - t2) * 1000
        elif savepoint_url is not None:
            self._complete_savepoint(savepoint_url, epoch, keyed_metas, False)
        commit_ms = (time.monotonic() - t1) * 1000
        now = _now_ms()
        records_out = {k: int(o.get.get("n") or 0) for k, o in seen_out.items()}
        return EpochMetrics(
            epoch=epoch, started_at=started, duration_ms=(time.monotonic() - t0) * 1000 + plan_ms,
            records_in={k: int(o.get.get("n") or 0) for k, o in seen_in.items()},
            records_out=records_out,
            dead_letters=sum(n for k, n in records_out.items()
                             if k in self.spec.dead_letter_sinks),
            lag={sid: src.lag(self.offsets[sid], now) for sid, src in self.sources.items()},
            plan_ms=plan_ms, run_ms=run_ms, commit_ms=commit_ms,
            watermark=(self.watermarks.current if any(s.event_time for s in self.spec.sources)
                       else None),
            checkpoint_id=checkpoint_id if checkpoint_id in self.completed else None,
            checkpoint_ms=checkpoint_ms, keyed_ms=keyed_ms, snapshot_ms=snapshot_ms,
            small=small, direct=sorted(n for n, s in self.keyed.items()
                                       if s.direct and direct.get(s.direct.source_id)),
            local=ran_local,
            moves=moves, restores=restores, restore_ms=round(restore_ms, 1),
            executors=sorted(executors))

    def _direct_reads(self, slices: Mapping[str, SourceSlice], watermark: int
                      ) -> dict[str, tuple[str | None, Any, Any]]:
        """Per source id: (that id, the `DirectRead` of its keyed stage, dead letters or None)
        for this epoch's slices that keyed stages read themselves (`runtime.keyed.
        direct_plan`); a slice whose files do not allow it is read by Spark instead. A stage
        whose source has no slice this epoch gets an empty read (and None for the id)."""
        from streamer.connectors.files import FilesSource

        out: dict[str, tuple[str | None, Any, Any]] = {}
        for stage in self.keyed.values():
            shape = stage.direct
            if shape is None:
                continue
            if shape.source_id not in slices:
                # No input this epoch (timers only, or the end of input): no Spark plan either.
                out[shape.source_id] = (None, shape.read(watermark), None)
                continue
            source = self.sources[shape.source_id]
            assert isinstance(source, FilesSource)  # (direct_plan takes only these)
            found = source.plain_parquet(slices[shape.source_id], shape.ts_column)
            if found is None:
                continue
            files, dead_letters = found
            out[shape.source_id] = (shape.source_id, shape.read(watermark, tuple(files)),
                                    dead_letters)
        return out

    def _small_epoch(self, slices: Mapping[str, SourceSlice]) -> bool:
        """Whether the epoch runs in the small-epoch mode (`runtime.spark.SMALL_EPOCH_CONF`):
        its input is known to be at most `small_epoch_rows()` rows (a timer-only epoch has
        none), or, where a source cannot tell up front, the previous epoch's was."""
        limit = small_epoch_rows()
        if limit <= 0:
            return False
        known = [piece.expected_records for piece in slices.values()]
        if all(n is not None for n in known):
            return sum(n for n in known if n is not None) <= limit
        last = self.history[-1].total_in if self.history else None
        return last is not None and last <= limit

    # ------------------------------------------------------------------------ checkpoints
    def _begin_checkpoint(self) -> int | None:
        """The id of the checkpoint this epoch ends (above every existing `chk-<n>`)."""
        if self.store is None:
            return None
        try:
            return self.store.next_id()
        except Exception as exc:  # storage unreachable: this checkpoint fails, the job goes on
            self._decline(None, self.epoch, f"cannot list the checkpoint storage: {exc}")
            return None

    def _task_checkpointing(self, node_id: str, checkpoint_id: int | None,
                            savepoint_url: str | None = None) -> Any:
        """What the keyed subtasks of `node_id` need: restore source, snapshot target."""
        if self.store is None:
            return None
        from streamer.checkpoint.task import TaskCheckpointing
        from streamer.runtime.keyed import local_recovery_root

        job = self.spec.job.checkpoint
        keep = [*self.completed[-job.retain:], *(
            [self.restored_from] if self.restored_from is not None else [])]
        return TaskCheckpointing(
            url=self.store.url, local_copy_root=local_recovery_root(self.spec.job.state_local_dir),
            first_epoch=self.first_epoch, last=dict(self.last_handles.get(node_id, {})),
            snapshot_id=checkpoint_id,
            deadline=(time.time() + job.timeout_ms / 1000) if checkpoint_id is not None else None,
            keep_local=tuple(keep),
            savepoint_url=savepoint_url if checkpoint_id is not None else None,
            savepoint_restore=self.savepoint_restore.get(node_id))

    def _decline(self, checkpoint_id: int | None, epoch: int, reason: str) -> None:
        self.last_checkpoint_at = time.monotonic()  # try again after an interval
        self.reporter.checkpoint({"status": "failed", "id": checkpoint_id, "epoch": epoch,
                                  "reason": reason})

    def _complete_checkpoint(self, checkpoint_id: int, epoch: int, keyed_metas: dict[str, Any],
                             started: float) -> bool:
        """Every subtask reported its snapshot: write `_metadata` (the checkpoint exists from
        then on), commit the sinks' staged output, prune old checkpoints. A missing snapshot,
        a timeout or a storage error declines the checkpoint instead (reported; the previous
        ones are untouched and the job goes on)."""
        from streamer import failpoints
        from streamer.checkpoint.metadata import CheckpointMetadata, OperatorState, now

        assert self.store is not None
        job = self.spec.job
        errors: list[str] = []
        operators: dict[str, OperatorState] = {}
        snapshot_ms = 0.0
        for node_id, metas in keyed_metas.items():
            stage = self.keyed[node_id]
            handles = []
            for meta in sorted(metas, key=lambda m: int(m["subtask"])):
                if "snapshot" in meta:
                    handles.append(meta["snapshot"])
                    snapshot_ms = max(snapshot_ms, float(meta["snapshot"].get("duration_ms", 0)))
                else:
                    errors.append(f"operator {node_id!r} subtask {meta['subtask']}: "
                                  f"{meta.get('snapshot_error', 'no snapshot reported')}")
            operators[stage.op.uid] = OperatorState(
                node=node_id, backend=stage.base_config.backend, parallelism=stage.parallelism,
                max_parallelism=stage.max_parallelism, subtasks=handles)
        failpoints.reached("after-snapshot", checkpoint_id)
        elapsed_ms = (time.monotonic() - started) * 1000 + snapshot_ms
        if not errors and elapsed_ms > job.checkpoint.timeout_ms:
            errors.append(f"it took {elapsed_ms:,.0f} ms, over the timeout of "
                          f"{job.checkpoint.timeout_ms:,} ms")
        if errors:
            self._decline(checkpoint_id, epoch, "; ".join(errors))
            return False
        uid_of = {s.id: s.uid for s in self.spec.sources}
        offsets, watermark = self._saved_sources()
        meta = CheckpointMetadata(
            checkpoint_id=checkpoint_id, job=self.spec.name, run_id=self.run_id, epoch=epoch,
            created_at=now(), mode=job.checkpoint.mode,
            offsets=offsets, watermark=watermark, operators=operators,
            sinks={k: [list(i) for i in v] for k, v in self.pending.items() if v},
            next_timers={self.keyed[n].op.uid: dict(t) for n, t in self.next_timers.items()
                         if n in self.keyed},
            uids={"sources": dict(uid_of),
                  "operators": {n: s.op.uid for n, s in self.keyed.items()}},
            duration_ms=round(elapsed_ms, 1))
        try:
            self.store.write(meta)
        except Exception as exc:
            self._decline(checkpoint_id, epoch, f"cannot write its _metadata: {exc}")
            return False
        failpoints.reached("after-metadata", checkpoint_id)
        for n, (sink_id, items) in enumerate(self.pending.items()):
            for sink_epoch, handle in items:
                self._guarded(sink_epoch, f"committing sink {sink_id!r}",
                              partial(self.sinks[sink_id].commit, sink_epoch, handle))
            if n == 0:
                failpoints.reached("mid-commit", checkpoint_id)
        self.pending = {}
        self.last_checkpoint = meta
        self.last_checkpoint_at = time.monotonic()
        self.completed.append(checkpoint_id)
        self.last_handles = {op.node: {int(h["subtask"]): h for h in op.subtasks}
                             for op in operators.values()}
        deleted: list[int] = []
        try:
            keep = [self.restored_from] if self.restored_from is not None else []
            deleted = self.store.prune(job.checkpoint.retain, keep=keep)
        except Exception as exc:  # the checkpoint stands; old files wait for the next prune
            self.reporter.message(f"checkpoint {checkpoint_id}: cleaning up older "
                                  f"checkpoints failed: {exc}")
        self.reporter.checkpoint({
            "status": "completed", "id": checkpoint_id, "epoch": epoch,
            "duration_ms": round(elapsed_ms, 1), "state_size": meta.state_size,
            "uploaded_bytes": meta.uploaded_bytes, "pruned": deleted,
            "path": self.store.storage.path(self.store.dir_of(checkpoint_id))})
        if self.registry is not None:
            self.registry.update(epoch=epoch, last_checkpoint=checkpoint_id,
                                 last_checkpoint_at=meta.created_at)
        return True

    # ------------------------------------------------------------------------ savepoints
    def _poll_control(self) -> str | None:
        """At an epoch boundary: beat, and take the control channel's requests. Returns the
        savepoint URL the next epoch writes, if one was asked for."""
        if self.control is None:
            return None
        from streamer.savepoint.metadata import new_savepoint_url
        from streamer.storage import StorageError

        self.registry.update(epoch=self.epoch, records_in=sum(m.total_in for m in self.history))
        try:
            requests = self.control.pending()
        except StorageError as exc:
            self.reporter.message(f"cannot read the control channel: {exc}")
            return None
        url = None
        for req in requests:
            rid, kind = req["id"], req["kind"]
            if rid in self.seen_requests:
                continue
            if kind == "savepoint":
                if url is not None:
                    continue  # one savepoint per boundary; the next boundary takes it
                url = new_savepoint_url(self.storage_url, self.spec.name, req.get("target"))
                self.savepoint_waiters.setdefault(url, []).append(rid)
                self.control.respond(rid, "accepted", path=url)
                self.reporter.message(f"savepoint requested: writing {url}")
            elif kind == "stop":
                self._stop.set()
                if req.get("savepoint"):
                    self.stop_savepoint = self.stop_savepoint or new_savepoint_url(
                        self.storage_url, self.spec.name, req.get("target"))
                    self.stop_drain = self.stop_drain or bool(req.get("drain"))
                    self.savepoint_waiters.setdefault(self.stop_savepoint, []).append(rid)
                    self.control.respond(rid, "accepted", path=self.stop_savepoint)
                else:
                    self.control.respond(rid, "completed", status_after="stopped")
                self.reporter.message("stop requested: stopping at this epoch boundary"
                                      + (" with a savepoint" if req.get("savepoint") else ""))
            elif kind == "cancel":
                self.cancelled = True
                self.control.respond(rid, "completed", status_after="cancelled")
                self.reporter.message("cancel requested: cancelling now (no final checkpoint)")
            self.seen_requests.add(rid)
        return url

    def _savepoint_done(self, url: str) -> bool:
        return url in self.savepoints

    def _complete_savepoint(self, url: str, epoch: int, keyed_metas: dict[str, Any],
                            checkpointed: bool) -> None:
        """After the savepoint epoch's checkpoint: write the savepoint's `_metadata` from the
        subtasks' key-group files, answer whoever asked."""
        from streamer import __version__
        from streamer.savepoint.metadata import (
            SavepointMetadata,
            operator_definition,
            pipeline_fingerprint,
            write_metadata,
        )

        errors = [] if checkpointed else ["its checkpoint did not complete"]
        operators: dict[str, dict[str, Any]] = {}
        for node_id, metas in keyed_metas.items():
            stage = self.keyed[node_id]
            files: list[dict[str, Any]] = []
            states: dict[str, str] = {}
            keys: dict[str, int] = {}
            size = 0
            for meta in metas:
                handle = meta.get("savepoint")
                if handle is None:
                    errors.append(f"operator {node_id!r} subtask {meta.get('subtask')}: "
                                  f"{meta.get('savepoint_error', 'no savepoint files reported')}")
                    continue
                files += handle.get("files", [])
                states.update(handle.get("states", {}))
                for name, n in handle.get("keys", {}).items():
                    keys[name] = keys.get(name, 0) + int(n)
                size += int(handle.get("bytes", 0))
            operators[stage.op.uid] = {
                "node": node_id, "definition": operator_definition(stage.op),
                "states": states, "parallelism": stage.parallelism,
                "backend": stage.base_config.backend,
                "files": sorted(files, key=lambda f: int(f.get("key_group", 0))),
                "keys": keys, "bytes": size,
                "next_timers": self.next_timers.get(node_id, {})}
        waiters = self.savepoint_waiters.pop(url, [])
        if not errors:
            offsets, watermark = self._saved_sources()
            meta = SavepointMetadata(
                job=self.spec.name, created_at=time.time(), streamer_version=__version__,
                pipeline_fingerprint=pipeline_fingerprint(self.spec), epoch=epoch,
                max_parallelism=self.spec.job.max_parallelism,
                offsets=offsets, watermark=watermark, operators=operators,
                sources={s.uid: s.type for s in self.spec.sources}, run_id=self.run_id,
                drained=self.stop_drain and url == self.stop_savepoint)
            try:
                write_metadata(url, meta)
            except Exception as exc:
                errors.append(f"cannot write its _metadata: {exc}")
        if errors:
            reason = "; ".join(errors)
            self.reporter.message(f"savepoint {url} failed: {reason}")
            for rid in waiters:
                self.control.respond(rid, "failed", path=url, reason=reason)
            if url == self.stop_savepoint:
                msg = f"stop with savepoint failed: {reason}; the job was not stopped"
                self._stop.clear()
                self.stop_savepoint = None
                self.reporter.message(msg)
            return
        self.savepoints.append(url)
        self.reporter.message(f"savepoint written: {url}")
        for rid in waiters:
            self.control.respond(rid, "completed", path=url, epoch=epoch)

    def _guarded(self, epoch: int, what: str, action: Callable[[], Any]) -> Any:
        """Run a Spark action; turn Spark failures into errors that say what happened."""
        from py4j.protocol import Py4JJavaError
        from pyspark.errors import PySparkException

        from streamer.connectors.exceptions import ReadFailed
        from streamer.runtime.keyed import SubtaskFailed
        from streamer.spark_errors import spark_error_message

        try:
            return action()
        except ReadFailed as exc:  # a source's read on the driver (as a failed task would)
            msg = f"epoch {epoch} failed in {what}: {exc}"
            raise JobFailedError(msg) from exc
        except StreamerError:
            raise
        except SubtaskFailed as exc:  # a keyed subtask the driver ran (`run_local`)
            msg = f"epoch {epoch} failed in {what}: {exc}"
            raise JobFailedError(msg) from exc
        except (PySparkException, Py4JJavaError) as exc:
            text = str(exc)
            at = text.find(DECODE_ERROR_MARKER)
            if at >= 0:
                detail = text[at + len(DECODE_ERROR_MARKER):].splitlines()[0]
                detail = detail.split(" SQLSTATE:")[0].rstrip(". ")
                msg = f"epoch {epoch}: {detail}"
                raise DecodeError(msg) from exc
            msg = f"epoch {epoch} failed in {what}: {spark_error_message(exc)}"
            raise JobFailedError(msg) from exc
        except OSError as exc:  # a sink's or the storage's file system failed
            msg = f"epoch {epoch} failed in {what}: {type(exc).__name__}: {exc}"
            raise JobFailedError(msg) from exc


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _offsets_summary(meta: CheckpointMetadata) -> str:
    """Per source uid, its offsets in a few words (files: how many read)."""
    parts = []
    for uid, offsets in sorted(meta.offsets.items()):
        items = []
        for split, value in sorted(offsets.items()):
            if isinstance(value, list):
                items.append(f"{len(value)} files")
            else:
                items.append(f"{split}={value}")
        text = ", ".join(items[:4]) + (f", ... ({len(items)} splits)" if len(items) > 4 else "")
        parts.append(f"{uid}: {text}")
    return "; ".join(parts) or "no sources"


__all__ = ["DEAD_LETTER_DDL", "JobResult", "JobRunner", "RunOptions"]
