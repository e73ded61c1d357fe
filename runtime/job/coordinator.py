"""The job coordinator (docs/architecture.md, "How an epoch runs"), which only sequences.

Per epoch:

    poll control ─> plan the epoch (source slices) ─> run the stages (runtime.job.epoch)
      ─> barrier ─> complete the checkpoint ─> commit sinks ─> loop

What it sequences lives elsewhere: the physical plan and the per-epoch decision in
`runtime.plan.physical`, the stages in `runtime.plan.stages`, one epoch in `runtime.job.epoch`,
checkpoint completion in `runtime.job.checkpointing`, recovery and restore in
`runtime.job.recovery`, savepoints in `runtime.job.savepointing`, stop / cancel / savepoint
requests in `runtime.job.jobcontrol`.

An epoch boundary is an aligned barrier: every record of an epoch's slices is committed
together, none of the next epoch's. Bounded sources end the loop; unbounded ones run until
`request_stop()` (Ctrl-C in the CLI), which takes effect at the next epoch boundary.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from streamer.connectors.base import DEAD_LETTER_DDL, ConnectorContext, Sink, Source, SourceSlice
from streamer.exceptions import StreamerError
from streamer.pipeline.graph import compile_dataflow
from streamer.pipeline.spec import PipelineSpec
from streamer.runtime.analyze import analyze
from streamer.runtime.exceptions import JobFailedError
from streamer.runtime.job.checkpointing import CheckpointCoordinator
from streamer.runtime.job.epoch import EpochRunner, guarded
from streamer.runtime.job.job_state import JobState, RunOptions, now_ms
from streamer.runtime.job.jobcontrol import JobControl
from streamer.runtime.job.recovery import Recovery
from streamer.runtime.observe.metrics import (
    EpochMetrics,
    QuietReporter,
    Reporter,
    TeeReporter,
)
from streamer.runtime.watermarks import MAX_WATERMARK
from streamer.text import plural

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from streamer.runtime.observe.prometheus import PrometheusExporter
    from streamer.runtime.plan.keyed_plan import KeyedStage
    from streamer.runtime.plan.physical import PhysicalPlan


@dataclass
class JobResult:
    """How a run ended."""

    status: str  # finished | stopped | cancelled
    epochs: int
    records_in: int
    records_out: int
    dead_letters: int
    reason: str
    #: Late records of windows (sent to `late:` outputs or dropped), and records removed by
    #: filters (see EpochMetrics).
    late: int = 0
    filtered: int = 0
    offsets: dict[str, Any] = field(default_factory=dict)
    #: The metrics of the last epochs (at least `runtime.job.job_state.HISTORY_KEEP`); the counts
    #: above cover every epoch.
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
                "late": self.late, "filtered": self.filtered, "reason": self.reason,
                "checkpoints": len(self.checkpoints),
                "restored_from": self.restored_from, "restarts": self.restarts,
                "savepoints": self.savepoints}


class JobRunner:
    """Runs one pipeline: plans it into stages, then sequences its epochs."""

    def __init__(self, spec: PipelineSpec, options: RunOptions | None = None, *,
                 reporter: Reporter | None = None, spark: SparkSession | None = None,
                 source_factory: Callable[[Any, ConnectorContext], Source] | None = None,
                 sink_factory: Callable[[Any, ConnectorContext], Sink] | None = None) -> None:
        from streamer.runtime.cluster.placement import Placement
        from streamer.storage import use_s3_options

        self.spec = spec
        self.options = options or RunOptions()
        self.exporter = _exporter(spec, self.options)
        #: Executors' `FSSPEC_S3` (the pipeline's `storage_options:`), for `spark.executorEnv`.
        self._s3_env = use_s3_options(spec.storage_options)
        self.reporter: Reporter = reporter or QuietReporter()
        if self.exporter is not None:
            self.reporter = TeeReporter(self.reporter, self.exporter)
        self._spark = spark
        self._source_factory = source_factory
        self._sink_factory = sink_factory
        self.job = JobState(spec=spec, options=self.options, reporter=self.reporter,
                            flow=compile_dataflow(spec), placement=Placement(),
                            storage_url=self.options.storage or spec.storage)
        self.control = JobControl(self.job)
        self.checkpoints = CheckpointCoordinator(self.job, guarded)
        self.recovery = Recovery(self.job, self.checkpoints, guarded)
        self.epochs: EpochRunner | None = None
        self._epoch_conf: Any = None

    # ------------------------------------------------------------------------ what tests read
    @property
    def plan(self) -> PhysicalPlan | None:
        """The physical plan (after `prepare`)."""
        return self.job.plan

    @property
    def keyed(self) -> dict[str, KeyedStage]:
        """Keyed node id -> its stage's Spark plan."""
        return self.job.keyed

    @property
    def task_sinks(self) -> dict[str, str]:
        """Keyed node id -> the sink whose files its subtasks write."""
        return self.job.plan.task_sinks if self.job.plan is not None else {}

    @property
    def sinks(self) -> dict[str, Sink]:
        """The job's sinks by id."""
        return self.job.sinks

    @property
    def restore_report(self) -> list[dict[str, Any]]:
        """Per restore: operator, subtasks restored locally / remotely, slowest (ms)."""
        return self.job.restore_report

    @property
    def state_root(self) -> str:
        """Where the current run attempt's subtasks keep their working state."""
        return self.job.state_root

    def _guarded(self, epoch: int, what: str, action: Callable[[], Any]) -> Any:
        return guarded(epoch, what, action)

    # ------------------------------------------------------------------------ control
    def request_stop(self) -> None:
        """Stop cleanly at the next epoch boundary."""
        self.control.stop.set()

    @property
    def stop_requested(self) -> bool:
        """Whether a stop was requested."""
        return self.control.stop.is_set()

    # ------------------------------------------------------------------------ setup
    @property
    def spark(self) -> SparkSession:
        """The Spark session, started on first use."""
        if self._spark is None:
            from streamer.connectors.registry import session_conf
            from streamer.runtime.cluster.spark import create_session

            conf = {**{f"spark.executorEnv.{k}": v for k, v in self._s3_env.items()},
                    **self.spec.spark, **self.options.spark_conf}
            conf.update(session_conf(self.spec, conf))
            master = self.options.master
            settings = self.spec.job.execution.with_overrides(os.environ)
            if settings.mode == "continuous":
                from streamer.runtime.cluster.spark import gang_slots

                master, conf = gang_slots(master, self.spec.job.parallelism, conf)
            self._spark = create_session(f"streamer:{self.spec.name}", master, conf,
                                         ui=self.options.ui)
        return self._spark

    def prepare(self) -> None:
        """Check the job can run, build connectors, analyze every expression, compile the
        physical plan, and open the sinks."""
        job = self.job
        self.build()
        for sink in job.sinks.values():
            sink.open()
        if job.on_cluster and job.keyed and not self.options.checkpoints:
            from streamer.exceptions import ConfigError

            msg = ("on a cluster, keyed state follows its subtasks from executor to executor "
                   "through checkpoint storage, so --no-checkpoints cannot run this pipeline's "
                   f"keyed operators ({', '.join(map(repr, job.keyed))}); run it with "
                   "checkpoints, or with --master local[*]")
            raise ConfigError(msg)

    def build(self) -> PhysicalPlan:
        """Build connectors, analyze every expression, and compile the physical plan (no
        side effects: nothing is opened or written; `streamer plan --physical` stops here)."""
        from streamer.runtime.cluster.placement import on_cluster
        from streamer.runtime.cluster.workdirs import default_state_root
        from streamer.runtime.plan.physical import plan_stages
        from streamer.runtime.userfunctions import ship_user_code

        job, spec = self.job, self.spec
        settings = spec.job.execution.with_overrides(os.environ)
        ctx = ConnectorContext(spark=self.spark, job_name=spec.name,
                               console=self.options.console, storage_url=job.storage_url,
                               exactly_once=self.options.checkpoints
                               and spec.job.checkpoint.mode == "exactly_once",
                               local_rows=settings.local_rows)
        job.sources = {s.id: (self._source_factory or _make_source)(s, ctx)
                       for s in spec.sources}
        ship_user_code(spec, self.spark)
        job.schemas = analyze(spec, self.spark, job.sources, job.flow)
        job.sinks = {k.id: (self._sink_factory or _make_sink)(k, ctx) for k in spec.sinks}
        job.offsets = {sid: dict(src.initial_offsets()) for sid, src in job.sources.items()}
        job.on_cluster = on_cluster(self.spark.sparkContext.master)
        job.state_root = default_state_root(spec.job.state_local_dir, spec.name, job.run_id)
        job.plan = plan_stages(spec, job.flow, self.spark, job.sources, job.sinks, job.schemas,
                               settings, on_cluster=job.on_cluster, state_root=job.state_root,
                               checkpointing=self.checkpoints.task_checkpointing)
        return job.plan

    # ------------------------------------------------------------------------ the run
    def run(self) -> JobResult:
        """Run epochs until the bounded sources are exhausted or a stop is requested.

        With checkpoints on, the run first resumes from the job's latest checkpoint (if any),
        and a failed epoch restarts the job in-process from the latest checkpoint, up to
        `job.restart.attempts` times (a subtask whose state was lost is restored without
        counting as an attempt).
        """
        def restore() -> object:
            return None
        restarts = 0
        if self.exporter is not None:  # before anything: a port in use is a config error
            self.exporter.start()
        try:
            restore = self.control.install_signals()  # SIGTERM during start-up stops too
            self._start()
            self.reporter.starting({"job": self.spec.name, "master": self.options.master})
            self.spark  # noqa: B018  (PySpark installs its SIGINT handler when it starts)
            self.control.started = True
            self.control.install_sigint()
            self._open()
            result, restarts = self._attempts()
        except BaseException as exc:
            from streamer import failpoints

            status, reason = _failure(exc)
            failpoints.reached("cancelling")
            self.control.close(status, reason)
            self.reporter.finished({"status": status, "reason": reason})
            raise
        finally:
            restore()
            self._release()
            if self.exporter is not None:
                self.exporter.stop()
        result.restarts = restarts
        result.savepoints = list(self.control.savepoints)
        self.control.close(result.status, result.reason, records_in=result.records_in,
                           records_out=result.records_out)
        self.reporter.finished(result.to_json())
        return result

    def _start(self) -> None:
        """Before Spark starts: claim the job (a second run is refused at once)."""
        from streamer import failpoints

        if failpoints.ENV in os.environ:
            os.environ[failpoints.DRIVER_PID_ENV] = str(os.getpid())
        self.control.register()
        failpoints.reached("starting")

    def _open(self) -> None:
        """Plan the job and announce it."""
        from streamer.runtime.cluster.spark import EpochConf

        self.prepare()
        self._epoch_conf = EpochConf(self.spark)
        self.epochs = EpochRunner(self.job, self.checkpoints, self.control,
                                  self._epoch_conf.use)
        self.control.update(master=self.spark.sparkContext.master,
                            parallelism={n: s.parallelism for n, s in self.keyed.items()})
        ui = self.spark.sparkContext.uiWebUrl if self.options.ui else None
        self.reporter.started({"job": self.spec.name, "master": self.spark.sparkContext.master,
                               "ui": ui, "sources": list(self.job.sources),
                               "sinks": list(self.job.sinks),
                               "outputs": [s.id for s in self.spec.sinks if s.inputs],
                               "lag_units": {sid: src.lag_unit()
                                             for sid, src in self.job.sources.items()},
                               "metrics": self.exporter.url if self.exporter else None})

    def _attempts(self) -> tuple[JobResult, int]:
        """Run attempts until one ends; a failed epoch restarts from the last checkpoint
        while `Recovery.may_restart` allows."""
        restarts = free = 0  # free: restarts that do not count (lost state, bad checkpoint)
        while True:
            try:
                first = restarts + free == 0
                self.recovery.recover(first=first)
                return self._attempt(first), restarts
            except JobFailedError as exc:
                if not self.recovery.may_restart(exc, restarts, free, self.control.stop):
                    raise
                if self.recovery.free_restart(exc):
                    free += 1
                else:
                    restarts += 1
                self.control.update(phase="restarting", restarts=restarts + free)
                if self.exporter is not None:
                    self.exporter.restarted()
                self.checkpoints.abort_pending()
                if self.control.stop.is_set():
                    raise

    def _release(self) -> None:
        """Close connectors and what the driver holds; drop the working state."""
        job = self.job
        if self._epoch_conf is not None:
            self._epoch_conf.use(False)  # the session's own settings again
        for sink in job.sinks.values():
            sink.close()
        for source in job.sources.values():
            source.close()
        if not job.keyed:
            return
        from streamer.state import release_process_state

        for root in job.state_roots:  # what the driver holds of local epochs' subtasks
            release_process_state(root)
        if self.options.keep_state:
            return
        for root in job.state_roots:  # working state is rebuilt from checkpoints
            shutil.rmtree(root, ignore_errors=True)
        if job.on_cluster:
            # The next application has other executors: their local copies would never be
            # read again. (Only those on this host are reachable here.)
            from streamer.runtime.cluster.workdirs import local_recovery_root

            copies = local_recovery_root(self.spec.job.state_local_dir)
            for executor in job.placement.executors():
                shutil.rmtree(os.path.join(copies, f"executor-{executor}"), ignore_errors=True)

    # ------------------------------------------------------------------------ the loop
    def _attempt(self, first: bool) -> JobResult:
        """One attempt of the run: the epoch loop, or the continuous mode's gang (whose
        first attempt checks the cluster has a task slot for each of its subtasks)."""
        plan = self.job.plan
        if plan is None or plan.settings.mode != "continuous":
            return self._loop()
        from streamer.runtime.job.gang import GangRun, gang_plan, refused

        gang = gang_plan(self.job, self.spark)
        if isinstance(gang, str):
            raise refused(self.spec.file, gang)
        if first:
            wait_s = self.spec.job.slot_timeout_ms / 1000 if self.job.on_cluster else 0.0
            gang.check_slots(self.spark, self.spec.file, wait_s, self.job.reporter.message)
        status, reason = GangRun(self, gang).run()
        return self._result(status, reason)

    def _loop(self) -> JobResult:
        """Epochs until the sources end, a stop, a cancel or `--max-epochs`."""
        ran = 0
        while True:
            savepoint_url = self.control.poll()
            ended = self._boundary()
            if ended is not None:
                status, reason = ended
                break
            tick = time.monotonic()
            now = now_ms()
            live = self._live_sources()
            if not live:
                self._end_of_input(savepoint_url)
                status = "finished"
                reason = f"all sources are exhausted after {plural(self.job.epoch, 'epoch')}"
                break
            slices = {sid: piece for sid, src in live.items()
                      if (piece := src.plan(self.job.offsets[sid], now)) is not None}
            plan_ms = (time.monotonic() - tick) * 1000
            # An owed savepoint is taken at this boundary even with nothing to read (a
            # rate-limited source's first plan, an idle one): its epoch may be empty.
            if slices or savepoint_url or self._timers_due(now):
                ran += 1
                last = self._ends_input(live, slices) and (
                    self.options.max_epochs is None or ran < self.options.max_epochs)
                due = (self.checkpoints.due() or bool(savepoint_url)
                       or (last and self.options.checkpoints))
                self._epoch(slices, plan_ms, checkpoint=due, savepoint_url=savepoint_url,
                            flush=MAX_WATERMARK if last else None)
                if self.options.max_epochs is not None and ran >= self.options.max_epochs:
                    if self.checkpoints.unsaved():
                        self._final_checkpoint(None)
                    status, reason = "stopped", f"reached --max-epochs {ran}"
                    break
            self._wait(slices, tick)
        return self._result(status, reason)

    def _boundary(self) -> tuple[str, str] | None:
        """At an epoch boundary: (status, reason) when a cancel or stop ends the run."""
        control = self.control
        if control.cancelled:
            return "cancelled", f"cancelled after epoch {self.job.epoch}"
        if not control.stop.is_set():
            return None
        control.check_deadline()
        while (owed := control.owed()) is not None:  # savepoints accepted before the stop
            self._epoch({}, 0.0, checkpoint=True, savepoint_url=owed)
        if self.checkpoints.unsaved() or control.stop_savepoint is not None:
            self._final_checkpoint(MAX_WATERMARK if control.stop_drain else None,
                                   savepoint_url=control.stop_savepoint)
        if not control.stop.is_set():  # a failed stop-with-savepoint keeps the job going
            return None
        return "stopped", (f"stopped at the boundary after epoch {self.job.epoch}" + (
            f"; savepoint {control.stop_savepoint}" if control.stop_savepoint else ""))

    def _live_sources(self) -> dict[str, Source]:
        """Sources with more to read; exhausted bounded ones finish their watermark."""
        live = {}
        for sid, src in self.job.sources.items():
            if src.bounded and src.exhausted(self.job.offsets[sid]):
                self.job.tracker.finish(sid)
            else:
                live[sid] = src
        return live

    def _ends_input(self, live: Mapping[str, Source], slices: Mapping[str, SourceSlice]
                    ) -> bool:
        """Whether these slices are the last of every source: then the epoch that reads
        them also ends the input (Flink's end-of-input watermark follows the last records
        in the same stream): after its records, every timer fires, and with checkpoints on
        it is the final checkpoint; no empty epoch follows it to do that."""
        return bool(slices) and all(
            src.bounded and sid in slices and src.exhausted(slices[sid].end)
            for sid, src in live.items())

    def _end_of_input(self, savepoint_url: str | None) -> None:
        """Every source ended: the watermark goes to +inf and every timer fires (unless the
        epoch with the last records did that already)."""
        if not (self._timers_due(MAX_WATERMARK, flush=True) or self.checkpoints.unsaved()
                or savepoint_url):
            return
        if not self.options.checkpoints:
            self._epoch({}, 0.0, flush=MAX_WATERMARK)
            return
        self._final_checkpoint(MAX_WATERMARK, savepoint_url=savepoint_url)
        while (owed := self.control.owed()) is not None:  # more than one was asked for
            self._epoch({}, 0.0, flush=MAX_WATERMARK, checkpoint=True, savepoint_url=owed)

    def _epoch(self, slices: Mapping[str, SourceSlice], plan_ms: float, *,
               flush: int | None = None, checkpoint: bool = False,
               savepoint_url: str | None = None) -> None:
        """Run the next epoch and report it."""
        assert self.epochs is not None
        self.job.epoch += 1
        self.reporter.epoch_started(self.job.epoch)
        metrics = self.epochs.run(self.job.epoch, slices, plan_ms, flush=flush,
                                  checkpoint=checkpoint, savepoint_url=savepoint_url)
        self.job.record(metrics)
        self.reporter.epoch(metrics)

    def _wait(self, slices: Mapping[str, SourceSlice], tick: float) -> None:
        """Bounded sources without a rate limit run back to back; anything else waits for
        the next epoch tick (an interruptible sleep, so a stop is taken at once)."""
        sources = self.job.sources
        eager = slices and all(sources[s].bounded and not sources[s].spec.option(
            "rows_per_second") for s in slices)
        if not eager:
            remaining = self.spec.job.epoch_ms / 1000 - (time.monotonic() - tick)
            if remaining > 0:
                self.control.stop.wait(remaining)

    def _timers_due(self, now: int, flush: bool = False) -> bool:
        """Whether some keyed subtask has a timer due (so an epoch must run without data):
        an event-time timer at or before the watermark its operator would run with
        (every one with `flush`), a processing-time one at or before `now`."""
        marks = self.job.tracker.for_operators()
        for node_id, nxt in self.job.next_timers.items():
            watermark = MAX_WATERMARK if flush else marks.get(node_id, self.job.tracker.current)
            event, processing = nxt.get("event"), nxt.get("processing")
            if (event is not None and event <= watermark) or (
                    processing is not None and processing <= now):
                return True
        return False

    def _final_checkpoint(self, flush: int | None, savepoint_url: str | None = None) -> None:
        """A checkpoint at the end of the run (no new data), so every staged output commits
        and a restart has nothing to redo; retried a few times, then the run fails. With
        `savepoint_url` it also writes a savepoint (stop-with-savepoint)."""
        control = self.control
        for _ in range(3):
            self._epoch({}, 0.0, flush=flush, checkpoint=True, savepoint_url=savepoint_url)
            if not self.checkpoints.unsaved() and (
                    savepoint_url is None or savepoint_url in control.savepoints
                    or savepoint_url != control.stop_savepoint):
                return
        last = self.checkpoints.last
        msg = (f"the final checkpoint of job {self.spec.name!r} failed 3 times; output since "
               f"checkpoint {last.checkpoint_id if last else '(none)'} is staged but not "
               "committed; run the job again to finish it")
        raise JobFailedError(msg)

    def _result(self, status: str, reason: str) -> JobResult:
        history = self.job.history
        return JobResult(
            status=status, epochs=self.job.epoch,
            records_in=self.job.totals["records_in"],
            records_out=self.job.totals["records_out"],
            dead_letters=self.job.totals["dead_letters"],
            late=self.job.totals["late"], filtered=self.job.totals["filtered"],
            reason=reason, offsets={k: dict(v) for k, v in self.job.offsets.items()},
            metrics=history, checkpoints=list(self.checkpoints.completed),
            restored_from=self.checkpoints.result_restored_from)


def _failure(exc: BaseException) -> tuple[str, str]:
    """How a run that raised `exc` is recorded: cancelled (a second Ctrl-C or SIGTERM, or a
    SIGTERM stop past `job.shutdown_timeout`) or failed, and why."""
    from streamer.runtime.exceptions import JobTerminatedError

    if isinstance(exc, JobTerminatedError):
        return "cancelled", f"cancelled: {exc}"
    if isinstance(exc, KeyboardInterrupt):
        return "cancelled", "cancelled with Ctrl-C"
    return "failed", str(exc) if isinstance(exc, StreamerError) else type(exc).__name__


def _exporter(spec: PipelineSpec, options: RunOptions) -> PrometheusExporter | None:
    """The job's Prometheus exporter, when the file or `--metrics-port` asks for one."""
    port = options.metrics_port or spec.job.metrics.prometheus_port
    if port is None or not options.metrics:
        return None
    from streamer.runtime.observe.prometheus import PrometheusExporter

    return PrometheusExporter(spec.name, port, spec.job.metrics.prometheus_host)


def _make_source(spec: Any, ctx: ConnectorContext) -> Source:
    from streamer.connectors.registry import make_source

    return make_source(spec, ctx)


def _make_sink(spec: Any, ctx: ConnectorContext) -> Sink:
    from streamer.connectors.registry import make_sink

    return make_sink(spec, ctx)


__all__ = ["DEAD_LETTER_DDL", "JobResult", "JobRunner", "RunOptions"]
