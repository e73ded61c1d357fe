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
    SourceSlice,
)
from streamer.connectors.exceptions import DecodeError
from streamer.exceptions import StreamerError
from streamer.operators.stateless import apply_stateless, union
from streamer.pipeline.analyze import analyze
from streamer.pipeline.graph import Dataflow, compile_dataflow
from streamer.pipeline.spec import PipelineSpec
from streamer.runtime.exceptions import JobFailedError
from streamer.runtime.metrics import EpochMetrics, QuietReporter, Reporter

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation, SparkSession
    from rich.console import Console


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


@dataclass
class JobResult:
    """How a run ended."""

    status: str  # finished | stopped
    epochs: int
    records_in: int
    records_out: int
    dead_letters: int
    reason: str
    offsets: dict[str, Any] = field(default_factory=dict)
    metrics: list[EpochMetrics] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able summary."""
        return {"status": self.status, "epochs": self.epochs, "records_in": self.records_in,
                "records_out": self.records_out, "dead_letters": self.dead_letters,
                "reason": self.reason}


def _now_ms() -> int:
    return int(time.time() * 1000)


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
        self.event_time: dict[str, bool] = {}
        self.state_root = ""
        self.next_timers: dict[str, dict[str, int | None]] = {}

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
            from streamer.runtime.spark import create_session

            conf = {**self.spec.spark, **self.options.spark_conf}
            self._spark = create_session(f"streamer:{self.spec.name}", self.options.master,
                                         conf, ui=self.options.ui)
        return self._spark

    def prepare(self) -> None:
        """Check the job can run, build connectors, analyze every expression, and plan the
        keyed stages."""
        from streamer.connectors.registry import make_sink, make_source

        ctx = ConnectorContext(spark=self.spark, job_name=self.spec.name,
                               console=self.options.console)
        make_src = self._source_factory or make_source
        make_snk = self._sink_factory or make_sink
        self.sources = {s.id: make_src(s, ctx) for s in self.spec.sources}
        self._ship_user_code()
        self.schemas = analyze(self.spec, self.spark, self.sources, self.flow)
        self.sinks = {k.id: make_snk(k, ctx) for k in self.spec.sinks}
        for sink in self.sinks.values():
            sink.open()
        self.offsets = {sid: dict(src.initial_offsets()) for sid, src in self.sources.items()}
        self._plan_keyed()

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

        from streamer.runtime.keyed import KeyedStage, default_state_root

        self.event_time = {}
        self.keyed = {}
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
                self.keyed[node.id] = stage
                self.event_time[node.id] = stage.kind == "window" or (
                    stage.kind == "dedupe" and has_ts)

    # ------------------------------------------------------------------------ the loop
    def run(self) -> JobResult:
        """Run epochs until the bounded sources are exhausted or a stop is requested."""
        def restore() -> object:
            return None
        try:
            # After the session exists: PySpark installs its own SIGINT handler (cancel all
            # jobs, raise KeyboardInterrupt) when the SparkContext starts.
            self.spark  # noqa: B018
            restore = self._install_sigint()
            self.prepare()
            ui = self.spark.sparkContext.uiWebUrl if self.options.ui else None
            self.reporter.started({"job": self.spec.name, "master": self.spark.sparkContext.master,
                                   "ui": ui, "sources": list(self.sources),
                                   "sinks": list(self.sinks)})
            result = self._loop()
        except BaseException as exc:
            if isinstance(exc, StreamerError):
                self.reporter.finished({"status": "failed", "reason": str(exc)})
            else:
                self.reporter.finished({"status": "failed", "reason": type(exc).__name__})
            raise
        finally:
            restore()
            for sink in self.sinks.values():
                sink.close()
            if self.keyed and not self.options.keep_state:
                # Until checkpoints exist nothing can resume from this state: remove it.
                import shutil

                shutil.rmtree(self.state_root, ignore_errors=True)
        self.reporter.finished(result.to_json())
        return result

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

    def _loop(self) -> JobResult:
        from streamer.runtime.watermarks import MAX_WATERMARK, WatermarkTracker

        self.watermarks = WatermarkTracker({s.id: s for s in self.spec.sources})
        history: list[EpochMetrics] = []
        epoch = 0
        reason = ""
        status = "finished"
        while True:
            if self._stop.is_set():
                status, reason = "stopped", f"stopped at the boundary after epoch {epoch}"
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
                if self._timers_due(MAX_WATERMARK, MAX_WATERMARK):
                    # End of input: the watermark goes to +inf and every timer fires.
                    epoch += 1
                    final = self._run_epoch(epoch, {}, 0.0, flush=MAX_WATERMARK)
                    history.append(final)
                    self.reporter.epoch(final)
                reason = f"all sources are exhausted after {epoch} epochs"
                break
            slices = {}
            for sid, src in live.items():
                piece = src.plan(self.offsets[sid], now)
                if piece is not None:
                    slices[sid] = piece
            plan_ms = (time.monotonic() - tick) * 1000
            if slices or self._timers_due(self.watermarks.current, now):
                epoch += 1
                metrics = self._run_epoch(epoch, slices, plan_ms)
                history.append(metrics)
                self.reporter.epoch(metrics)
                if self.options.max_epochs is not None and epoch >= self.options.max_epochs:
                    status, reason = "stopped", f"reached --max-epochs {epoch}"
                    break
            # Bounded sources without a rate limit run back to back; anything else waits for
            # the next epoch tick (an interruptible sleep, so a stop is taken at once).
            eager = slices and all(self.sources[s].bounded and not self.sources[s].spec.option(
                "rows_per_second") for s in slices)
            if not eager:
                remaining = self.spec.job.epoch_ms / 1000 - (time.monotonic() - tick)
                if remaining > 0:
                    self._stop.wait(remaining)
        return JobResult(
            status=status, epochs=epoch,
            records_in=sum(m.total_in for m in history),
            records_out=sum(m.total_out for m in history),
            dead_letters=sum(m.dead_letters for m in history),
            reason=reason, offsets={k: dict(v) for k, v in self.offsets.items()},
            metrics=history)

    # ------------------------------------------------------------------------ one epoch
    def _run_epoch(self, epoch: int, slices: Mapping[str, SourceSlice],
                   plan_ms: float, flush: int | None = None) -> EpochMetrics:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        from streamer.runtime.keyed import visible

        now = _now_ms()
        watermark = self.watermarks.current
        started = time.time()
        t0 = time.monotonic()
        frames: dict[str, DataFrame | None] = {}
        dead: dict[str, list[DataFrame]] = {}
        keyed_metas: dict[str, Any] = {}
        seen_in: dict[str, Observation] = {}
        cached: list[DataFrame] = []
        for node in self.flow.nodes:
            if node.role == "source":
                piece = slices.get(node.id)
                if piece is None:
                    frames[node.id] = None
                    continue
                read = self.sources[node.id].read(piece)
                obs = Observation(f"in_{node.id}_{epoch}")
                seen_in[node.id] = obs
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
                    result = self._guarded(epoch, f"operator {node.id!r}", partial(
                        stage.run, union(present) if present else None, epoch, now,
                        watermark if flush is None else flush, fire))
                    keyed_metas[node.id] = result.metas
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
        seen_out: dict[str, Observation] = {}
        try:
            for sink_id, sink in self.sinks.items():
                node = self.flow.node(sink_id)
                present = [f for i in node.inputs if (f := frames.get(i)) is not None]
                present += dead.get(sink_id, [])
                if not present:
                    continue
                obs = Observation(f"out_{sink_id}_{epoch}")
                seen_out[sink_id] = obs
                df = visible(union([visible(f) for f in present])).observe(
                    obs, F.count(F.lit(1)).alias("n"))
                handles[sink_id] = self._guarded(epoch, f"writing sink {sink_id!r}",
                                                 partial(sink.write, epoch, df))
            run_ms = (time.monotonic() - t0) * 1000
            t1 = time.monotonic()
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
        commit_ms = (time.monotonic() - t1) * 1000
        for node_id, metas in keyed_metas.items():  # complete now that the jobs have run
            found = list(metas)
            if len(found) != self.keyed[node_id].parallelism:
                msg = (f"epoch {epoch}: operator {node_id!r} reported {len(found)} of "
                       f"{self.keyed[node_id].parallelism} subtasks; its output was not read")
                raise JobFailedError(msg)
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
                       else None))

    def _guarded(self, epoch: int, what: str, action: Callable[[], Any]) -> Any:
        """Run a Spark action; turn Spark failures into errors that say what happened."""
        from py4j.protocol import Py4JJavaError
        from pyspark.errors import PySparkException

        from streamer.runtime.spark import spark_error_message

        try:
            return action()
        except StreamerError:
            raise
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


__all__ = ["DEAD_LETTER_DDL", "JobResult", "JobRunner", "RunOptions"]
