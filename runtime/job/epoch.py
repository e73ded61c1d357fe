"""One epoch: run the physical plan's stages over the epoch's slices, pre-commit the
sinks, collect what the keyed subtasks reported, advance offsets and the watermark, and
complete the checkpoint (and savepoint) the epoch ends.

    decide ──> source stages ──> stateless chains ──> keyed stages ──> sink stages
           ──> barrier (the subtasks' metadata) ──> checkpoint ──> commit ──> metrics

Each stage reads the epoch's `EpochInput` and what the stages before it produced for it
(`Upstream`), and returns its `StageOutput`; the loop combines those (`EpochResults`) and
reads from them what the barrier, the checkpoint and the metrics need.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from streamer.connectors.base import DECODE_ERROR_MARKER
from streamer.connectors.exceptions import DecodeError
from streamer.exceptions import StreamerError
from streamer.runtime.exceptions import JobFailedError, UnreadableFileError
from streamer.runtime.job.checkpointing import CheckpointCoordinator
from streamer.runtime.job.job_state import JobState, now_ms
from streamer.runtime.job.jobcontrol import JobControl
from streamer.runtime.job.savepointing import complete_savepoint
from streamer.runtime.observe.metrics import EpochMetrics
from streamer.runtime.plan.physical import decide
from streamer.runtime.plan.stages.base import DEAD, LATE, OUT, EpochInput, Stage
from streamer.runtime.plan.stages.handoff import EpochResults

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from streamer.connectors.base import SourceSlice


def guarded(epoch: int, what: str, action: Callable[[], Any]) -> Any:
    """Run a Spark action (or a driver-side read or subtask); turn its failure into an
    error that says what happened in which epoch: where user code failed, the operator
    and the user's frames (not the stage whose Spark job ran it)."""
    from streamer.user_errors import UserCodeError, user_error_message

    try:
        return _guarded(epoch, what, action)
    except (JobFailedError, UserCodeError) as exc:
        cause = exc if isinstance(exc, UserCodeError) else exc.__cause__
        users = user_error_message(str(cause)) if cause is not None else None
        if users is None:
            raise
        msg = f"epoch {epoch}: {users}"
        raise JobFailedError(msg) from cause


def _guarded(epoch: int, what: str, action: Callable[[], Any]) -> Any:
    """`guarded` for what is not the user's code."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    from streamer.connectors.exceptions import ReadFailed
    from streamer.runtime.plan.keyed_plan import SubtaskFailed
    from streamer.spark_errors import spark_error_message, unreadable_file

    try:
        return action()
    except (ReadFailed, SubtaskFailed) as exc:  # on the driver, as a failed task would
        msg = _restore_failure(epoch, str(exc)) or f"epoch {epoch} failed in {what}: {exc}"
        raise JobFailedError(msg) from exc
    except StreamerError:
        raise
    except (PySparkException, Py4JJavaError) as exc:
        text = str(exc)
        restoring = _restore_failure(epoch, text)
        if restoring:
            raise JobFailedError(restoring) from exc
        at = text.find(DECODE_ERROR_MARKER)
        if at >= 0:
            detail = text[at + len(DECODE_ERROR_MARKER):].splitlines()[0]
            detail = detail.split(" SQLSTATE:")[0].rstrip(". ")
            msg = f"epoch {epoch}: {detail}"
            raise DecodeError(msg) from exc
        damaged = unreadable_file(text)
        if damaged is not None:
            path, reason = damaged
            msg = (f"epoch {epoch} failed in {what}: cannot read the file {path!r}: {reason} "
                   "(a damaged data page; nothing of the epoch was committed); with on_error "
                   "on its source it becomes a dead letter, else move the file away")
            raise UnreadableFileError(msg, path, reason) from exc
        msg = f"epoch {epoch} failed in {what}: {spark_error_message(exc)}"
        raise JobFailedError(msg) from exc
    except OSError as exc:  # a sink's or the storage's file system failed
        msg = f"epoch {epoch} failed in {what}: {type(exc).__name__}: {exc}"
        raise JobFailedError(msg) from exc


def _restore_failure(epoch: int, text: str) -> str | None:
    """The message of a keyed subtask's failed restore found in an error's text (its task
    ran in the Spark job of another stage, whose name the failure would otherwise carry)."""
    from streamer.checkpoint.task import RESTORE_ERROR_MARKER

    at = text.find(RESTORE_ERROR_MARKER)
    if at < 0:
        return None
    detail = text[at + len(RESTORE_ERROR_MARKER):].splitlines()[0]
    detail = detail.split(" SQLSTATE:")[0].rstrip(". ")
    return f"epoch {epoch} failed in restoring {detail}"


class EpochRunner:
    """Runs epochs of one job's physical plan."""

    def __init__(self, job: JobState, checkpoints: CheckpointCoordinator,
                 control: JobControl, use_small_conf: Callable[[bool], None]) -> None:
        self.job = job
        self.checkpoints = checkpoints
        self.control = control
        self.use_small_conf = use_small_conf

    def run(self, epoch: int, slices: Mapping[str, SourceSlice], plan_ms: float,
            flush: int | None = None, checkpoint: bool = False,
            savepoint_url: str | None = None) -> EpochMetrics:
        """Run one epoch; with `checkpoint`, its end is also a checkpoint: keyed subtasks
        snapshot their state after committing it, then `_metadata` is written and the
        sinks' staged output committed."""
        from streamer import failpoints

        job = self.job
        assert job.plan is not None
        failpoints.reached("epoch-start", epoch)
        decision = decide(job.plan, job.sources, slices, job.tracker.current,
                          job.history[-1].total_in if job.history else None)
        self.use_small_conf(decision.small)
        epoch_in = EpochInput(
            epoch=epoch, slices=slices, now=now_ms(), watermark=job.tracker.current,
            operator_watermarks=job.tracker.for_operators(), flush=flush,
            checkpoint_id=self.checkpoints.begin() if checkpoint else None,
            savepoint_url=savepoint_url, decision=decision,
            guard=lambda what, action: guarded(epoch, what, action))
        started, t0 = time.time(), time.monotonic()
        sinks = [s for s in job.plan.stages if s.kind == "sink"]
        results = EpochResults()
        cached: list[DataFrame] = []
        try:
            for stage in job.plan.stages:
                if stage.kind != "sink":
                    results.add(stage.run(epoch_in, results.upstream_for(stage)))
                    cached += self._persist_shared(results, stage)
            t1 = self._write_sinks(epoch_in, results, sinks)
        finally:
            for df in cached:
                df.unpersist()
        run_ms = (t1 - t0) * 1000
        barrier = self._barrier(epoch_in, results)
        self._advance(epoch_in, results)
        checkpoint_ms = self._complete(epoch_in, results, t1)
        return self._metrics(epoch_in, results, barrier, started=started, t0=t0, t1=t1,
                             plan_ms=plan_ms, run_ms=run_ms, checkpoint_ms=checkpoint_ms)

    def _persist_shared(self, results: EpochResults, stage: Stage) -> list[DataFrame]:
        """Read once, write to several consumers: keep the epoch's rows for the second.
        Returns the frames persisted (unpersisted when the epoch ends)."""
        assert self.job.plan is not None
        cached = []
        for node_id in stage.node_ids:
            df = results.frames.get(node_id)
            if df is not None and self.job.plan.consumers.get(node_id, 0) > 1:
                results.frames[node_id] = df.persist()
                cached.append(df)
        return cached

    def _write_sinks(self, epoch_in: EpochInput, results: EpochResults,
                     sinks: list[Stage]) -> float:
        """Phase one for every sink, then staged (exactly once) or committed; a failure
        aborts what the sinks pre-committed this epoch. Returns when phase one ended."""
        try:
            for stage in sinks:
                results.add(stage.run(epoch_in, results.upstream_for(stage)))
            written = time.monotonic()
            self.checkpoints.stage_or_commit(epoch_in.epoch, results.handles)
            return written
        except BaseException:
            for sink_id, handle in results.handles.items():
                with contextlib.suppress(Exception):
                    self.job.sinks[sink_id].abort(epoch_in.epoch, handle)
            raise

    def _barrier(self, epoch_in: EpochInput, results: EpochResults) -> dict[str, Any]:
        """Every keyed subtask reported (the epoch's jobs have run): check that all did,
        follow where they ran and restored, and take their next timers."""
        job = self.job
        out: dict[str, Any] = {"keyed_ms": None, "snapshot_ms": None, "moves": 0,
                               "restores": 0, "restore_ms": 0.0, "executors": set()}
        for node_id, metas in results.subtask_metas.items():
            found = list(metas)
            stage = job.keyed[node_id]
            if len(found) != stage.parallelism:
                msg = (f"epoch {epoch_in.epoch}: operator {node_id!r} reported {len(found)} of "
                       f"{stage.parallelism} subtasks; its output was not read")
                raise JobFailedError(msg)
            out["keyed_ms"] = max([out["keyed_ms"] or 0.0, *(
                float(m["task_ms"]) for m in found if "task_ms" in m)])
            if any("snapshot_ms" in m for m in found):
                out["snapshot_ms"] = max([out["snapshot_ms"] or 0.0, *(
                    float(m["snapshot_ms"]) for m in found if "snapshot_ms" in m)])
            out["moves"] += job.placement.update(node_id, found)
            out["executors"].update(str(m["executor"]) for m in found if m.get("executor"))
            self._restores(epoch_in.epoch, node_id, found, out)
            job.next_timers[node_id] = {
                domain: min((m[f"next_{domain}"] for m in found
                             if m[f"next_{domain}"] is not None), default=None)
                for domain in ("event", "processing")}
        return out

    def _restores(self, epoch: int, node_id: str, found: list[dict[str, Any]],
                  out: dict[str, Any]) -> None:
        """Count and report the subtasks of `node_id` that restored their state."""
        job = self.job
        restored = [m for m in found if m.get("restored")]
        out["restores"] += len(restored)
        out["restore_ms"] = max([out["restore_ms"], *(
            float(m.get("restore_ms", 0)) for m in restored)])
        if not restored:
            return
        local = sum(1 for m in restored if m["restored"] == "local")
        slowest = max(float(m.get("restore_ms", 0)) for m in restored)
        job.restore_report.append({"operator": node_id, "local": local,
                                   "remote": len(restored) - local, "ms": slowest,
                                   "epoch": epoch})
        if not job.on_cluster or epoch == job.first_epoch:
            # (On a cluster, subtasks that moved restore every epoch: see the metrics.)
            job.reporter.message(
                f"operator {node_id!r}: restored {local} subtasks from local copies and "
                f"{len(restored) - local} from checkpoint storage (slowest {slowest:,.0f} ms)")

    def _advance(self, epoch_in: EpochInput, results: EpochResults) -> None:
        """The sources' offsets move past the epoch's slices; the watermark follows. A
        bounded source whose slice was its last no longer holds the watermark back from
        this epoch on (Flink's end-of-input watermark), not from the next one's planning:
        a temporal join's left records do not wait an epoch more for a table read whole."""
        job = self.job
        for sid, piece in epoch_in.slices.items():
            job.offsets[sid] = dict(piece.end)
            source = job.sources[sid]
            if source.spec.event_time:
                got = results.records_in[sid].get
                job.tracker.observe(sid, {str(split): got.get(f"ts{i}")
                                          for i, split in enumerate(piece.end)}, epoch_in.now)
                if source.bounded and source.exhausted(job.offsets[sid]):
                    job.tracker.finish(sid)
        job.tracker.operators_ran(epoch_in.operator_watermarks)
        job.tracker.advance(now_ms())

    def _complete(self, epoch_in: EpochInput, results: EpochResults,
                  started: float) -> float | None:
        """Complete the checkpoint and savepoint the epoch ends; how long it took (ms).
        Nothing is committed by a run that another run took over meanwhile."""
        self.control.check_claim()
        if epoch_in.checkpoint_id is None:
            if epoch_in.savepoint_url is not None:
                complete_savepoint(self.job, self.control, epoch_in.savepoint_url, epoch_in.epoch,
                                   results.subtask_metas, False)
            return None
        t2 = time.monotonic()
        meta = self.checkpoints.complete(epoch_in.checkpoint_id, epoch_in.epoch,
                                         results.subtask_metas, started)
        if meta is not None:
            self.control.update(epoch=epoch_in.epoch, last_checkpoint=meta.checkpoint_id,
                                last_checkpoint_at=meta.created_at)
        if epoch_in.savepoint_url is not None:
            complete_savepoint(self.job, self.control, epoch_in.savepoint_url, epoch_in.epoch,
                               results.subtask_metas, meta is not None)
        return (time.monotonic() - t2) * 1000

    def _metrics(self, epoch_in: EpochInput, results: EpochResults, barrier: dict[str, Any], *,
                 started: float,
                 t0: float, t1: float, plan_ms: float, run_ms: float,
                 checkpoint_ms: float | None) -> EpochMetrics:
        job = self.job
        now = now_ms()
        seen_out = {k: o.get for k, o in results.sink_rows.items()}
        records_out = {k: int(got.get("n") or 0) for k, got in seen_out.items()}
        return EpochMetrics(
            epoch=epoch_in.epoch, started_at=started,
            duration_ms=(time.monotonic() - t0) * 1000 + plan_ms,
            records_in={k: int(o.get.get("n") or 0) for k, o in results.records_in.items()},
            records_out=records_out,
            sink_rows={k: {kind: n for kind in (OUT, DEAD, LATE)
                           if (n := int(got.get(f"n_{kind}") or 0))}
                       for k, got in seen_out.items()},
            dead_letters=results.count_of(DEAD),
            late=results.count_of(LATE) + sum(int(s.get.get("late") or 0)
                                              for s in results.late_dropped.values()),
            filtered=sum(int(seen.get.get("filtered") or 0)
                         for seen in results.filtered.values()),
            operators=operator_counts(results),
            lag={sid: src.lag(job.offsets[sid], now) for sid, src in job.sources.items()},
            split_lag={sid: per for sid, src in job.sources.items()
                       if (per := src.split_lag(job.offsets[sid], now)) is not None},
            plan_ms=plan_ms, run_ms=run_ms, commit_ms=(time.monotonic() - t1) * 1000,
            watermark=(job.tracker.current if any(s.event_time for s in job.spec.sources)
                       else None),
            checkpoint_id=(epoch_in.checkpoint_id
                           if epoch_in.checkpoint_id in self.checkpoints.completed else None),
            checkpoint_ms=checkpoint_ms, keyed_ms=barrier["keyed_ms"],
            snapshot_ms=barrier["snapshot_ms"], small=epoch_in.decision.small,
            direct=sorted(results.ran_direct), local=results.ran_local,
            staged=sorted(results.ran_staged), arrow_decoded=dict(results.arrow_decoded),
            arrow_refused=dict(results.arrow_refused),
            sink_refused=dict(results.sink_refused),
            moves=barrier["moves"], restores=barrier["restores"],
            restore_ms=round(barrier["restore_ms"], 1),
            executors=sorted(barrier["executors"]))


def operator_counts(results: EpochResults) -> dict[str, dict[str, int]]:
    """Per operator, the counts the epoch already has (no job of their own): a filter's
    records in, out and filtered (its observations), a keyed operator's records out (its
    subtasks' metadata) and a window's or join's late records (what counted the dropped
    ones, or its `late:` sink's late rows when no other operator sends late rows there)."""
    ops: dict[str, dict[str, int]] = {}
    for node_id, seen in results.filtered.items():
        ops[node_id] = {k: int(v or 0) for k, v in seen.get.items()}
    for node_id, metas in results.subtask_metas.items():
        ops[node_id] = {"out": sum(int(m.get("out") or 0) for m in metas)}
    for node_id, seen in results.late_dropped.items():
        ops.setdefault(node_id, {})["late"] = int(seen.get.get("late") or 0)
    senders: dict[str, list[str]] = {}
    for node_id, sink_id in results.late_to.items():
        senders.setdefault(sink_id, []).append(node_id)
    for sink_id, (node_id, *others) in senders.items():
        seen_sink = results.sink_rows.get(sink_id)
        if not others and seen_sink is not None:
            ops.setdefault(node_id, {})["late"] = int(seen_sink.get.get(f"n_{LATE}") or 0)
    return ops
