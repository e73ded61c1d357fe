"""Recovery and restore: how a run attempt starts (the sources' beginning, the latest or a
chosen checkpoint, or a savepoint), and whether a failed epoch restarts the job from its
latest checkpoint (docs/operations/recovery.md)."""

from __future__ import annotations

import datetime as dt
from functools import partial
from typing import TYPE_CHECKING, Any

from streamer.runtime.cluster.workdirs import cleanup_stale_runs, default_state_root
from streamer.runtime.exceptions import JobFailedError, UnreadableFileError
from streamer.runtime.job.checkpointing import CheckpointCoordinator, Guard
from streamer.runtime.job.job_state import JobState, new_run_id

if TYPE_CHECKING:
    import threading

    from streamer.checkpoint.checkpoint_metadata import CheckpointMetadata


class Recovery:
    """Starts run attempts of one job and decides on restarts."""

    def __init__(self, job: JobState, checkpoints: CheckpointCoordinator, guard: Guard) -> None:
        self.job = job
        self.checkpoints = checkpoints
        self.guard = guard

    def recover(self, *, first: bool) -> None:
        """Start a run attempt: fresh working state, then either the sources' beginning or
        the latest (or chosen) checkpoint: offsets, watermark, keyed state, and the sink
        commits it covers (done again, idempotently)."""
        from dataclasses import replace

        from streamer.runtime.watermarks import WatermarkTracker, operator_chains

        job, options = self.job, self.job.options
        if not first:
            job.run_id = new_run_id()
        job.state_root = default_state_root(job.spec.job.state_local_dir, job.spec.name,
                                            job.run_id)
        job.state_roots.append(job.state_root)
        for stage in job.keyed.values():
            stage.base_config = replace(stage.base_config, state_root=job.state_root)
        job.watermarks = WatermarkTracker({s.id: s for s in job.spec.sources},
                                          chains=operator_chains(job.spec))
        job.offsets = {sid: dict(src.initial_offsets()) for sid, src in job.sources.items()}
        job.epoch = 0
        job.next_timers = {}
        job.first_epoch = 1
        self.checkpoints.reset()
        if not options.checkpoints:
            return
        from streamer.checkpoint.checkpoint_metadata import CheckpointStore

        store = self.checkpoints.store = CheckpointStore(job.storage_url, job.spec.name)
        if first:
            cleanup_stale_runs(job.spec.job.state_local_dir, job.spec.name, job.run_id)
        meta = self._starting_point(first)
        if meta is not None:
            self.restore_checkpoint(meta)
            try:  # a run killed between _metadata and pruning left older checkpoints behind
                store.prune(job.spec.job.checkpoint.retain, keep=[meta.checkpoint_id])
            except Exception as exc:  # cleanup only; the next prune retries
                job.reporter.message(f"cleaning up older checkpoints failed: {exc}")
        job.first_epoch = job.epoch + 1

    def _starting_point(self, first: bool) -> CheckpointMetadata | None:
        """The checkpoint to resume from (None: a savepoint, or the sources' beginning)."""
        job, options, chk = self.job, self.job.options, self.checkpoints
        store = chk.store
        assert store is not None
        if options.from_savepoint and (first or self._no_checkpoint_since_savepoint()):
            self.restore_savepoint(options.from_savepoint, first=first)
            return None
        if first and options.fresh:
            store.delete_all()
            job.reporter.message(f"--fresh: deleted the checkpoints of job {job.spec.name!r}; "
                                 "starting from the beginning")
            return None
        if first and options.from_checkpoint:
            meta = store.resolve(options.from_checkpoint)
            newer = [c for c in store.ids() if c > meta.checkpoint_id]
            if newer:
                job.reporter.message(
                    f"checkpoints {', '.join(map(str, newer))} are newer than "
                    f"{meta.checkpoint_id}: sinks already hold their output, which this run "
                    "produces again")
            return meta
        from streamer.checkpoint.checkpoint_metadata import Listed

        skipped: list[Listed] = []
        latest = store.latest(skipped=skipped, exclude=chk.bad | set(
            range(chk.lineage_start + 1)))
        for item in skipped:
            job.reporter.message(f"checkpoint {item.checkpoint_id} cannot be used "
                                 f"({item.problem}); using an earlier one")
        return latest

    def _no_checkpoint_since_savepoint(self) -> bool:
        chk = self.checkpoints
        assert chk.store is not None
        return not any(c > chk.lineage_start for c in chk.store.ids() if c not in chk.bad)

    def restore_savepoint(self, url: str, *, first: bool) -> None:
        """Start from a savepoint: per operator uid restore, start empty, drop or refuse;
        sources at its offsets (new ones at their start), its watermark and epoch."""
        from streamer.savepoint.savepoint_metadata import (
            SavepointError,
            plan_restore,
            read_metadata,
        )
        from streamer.storage import Storage

        job, chk = self.job, self.checkpoints
        assert chk.store is not None
        meta = read_metadata(url)
        decisions = plan_restore(meta, job.spec,
                                 allow_non_restored=job.options.allow_non_restored_state)
        refused = [d for d in decisions if d.action == "refuse"]
        if refused:
            msg = (f"cannot restore savepoint {url} into {job.spec.file}: " + "; ".join(
                f"operator {d.operator!r} (uid {d.uid!r}): {d.reason}" for d in refused))
            raise SavepointError(msg)
        root = Storage(url).url
        by_uid = {stage.op.uid: node for node, stage in job.keyed.items()}
        job.savepoint_restore = {
            by_uid[d.uid]: {"url": root, "files": meta.operators[d.uid].get("files", []),
                            "states": meta.operators[d.uid].get("states", {})}
            for d in decisions if d.action == "restore"}
        job.resume_sources(meta.offsets, meta.watermark)
        job.epoch = meta.epoch
        job.next_timers = {node: dict(meta.operators[uid]["next_timers"])
                           for uid, node in by_uid.items()
                           if "next_timers" in meta.operators.get(uid, {})}
        for sink in job.sinks.values():
            sink.recover(meta.epoch)
        if first:
            chk.lineage_start = max(chk.store.ids(), default=0)
        chk.force = True  # the restored lineage gets its first checkpoint at once
        summary = ", ".join(f"{d.operator}: {d.action}" for d in decisions) or "no keyed state"
        job.reporter.message(f"restoring savepoint {root} (epoch {meta.epoch}; {summary})")

    def restore_checkpoint(self, meta: CheckpointMetadata) -> None:
        """Resume at checkpoint `meta`: refuse a pipeline it cannot resume, then offsets,
        watermark, epoch, timers, subtask handles, and its sink commits done again."""
        from streamer import failpoints
        from streamer.checkpoint.checkpoint_metadata import CheckpointError

        failpoints.reached("recovering", meta.checkpoint_id)
        job, chk = self.job, self.checkpoints
        stages = {stage.op.uid: (node_id, stage) for node_id, stage in job.keyed.items()}
        problems = _resume_problems(meta, stages)
        if problems:
            msg = (f"cannot resume job {job.spec.name!r} from checkpoint {meta.checkpoint_id}: "
                   + "; ".join(problems) + ". Keep the pipeline as it was, or start over with "
                   "`streamer run --fresh` (savepoints carry state across such changes)")
            raise CheckpointError(msg)
        job.resume_sources(meta.offsets, meta.watermark)
        job.epoch = meta.epoch
        for uid, (node_id, _) in stages.items():
            if uid in meta.next_timers:
                job.next_timers[node_id] = dict(meta.next_timers[uid])
            if uid in meta.operators:
                chk.last_handles[node_id] = {int(h["subtask"]): h
                                             for h in meta.operators[uid].subtasks}
        for sink_id, items in meta.sinks.items():
            if sink_id in job.sinks:
                for epoch, handle in items:
                    self.guard(epoch, f"committing sink {sink_id!r} again", partial(
                        job.sinks[sink_id].commit, epoch, handle))
        for sink in job.sinks.values():
            sink.recover(meta.epoch)
        chk.last = meta
        chk.restored_from = meta.checkpoint_id
        if not chk.completed:  # the checkpoint this run resumed from (after any fallback)
            chk.result_restored_from = meta.checkpoint_id
        taken = dt.datetime.fromtimestamp(meta.created_at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        job.reporter.message(f"resuming from checkpoint {meta.checkpoint_id} (epoch "
                             f"{meta.epoch}, taken {taken} UTC; {offsets_summary(meta)})")

    # ------------------------------------------------------------------ restarts
    def may_restart(self, exc: JobFailedError, restarts: int, free: int,
                    stop: threading.Event) -> bool:
        """Whether a failed epoch restarts the job from its latest checkpoint."""
        from streamer.checkpoint.task import STATE_BEHIND

        job, chk = self.job, self.checkpoints
        if not job.options.checkpoints or stop.is_set():
            return False
        if isinstance(exc, UnreadableFileError):  # it would fail the same way again
            return self._unreadable_file(exc) and free < 10
        if self.free_restart(exc):
            if free >= 10:
                return False
            text = str(exc)
            if STATE_BEHIND in text:
                job.reporter.message("a keyed subtask lost its state since the last "
                                     "checkpoint; restarting from the last checkpoint")
            else:
                assert chk.restored_from is not None
                chk.bad.add(chk.restored_from)
                job.reporter.message(f"checkpoint {chk.restored_from} is corrupt "
                                     f"({_first_line(text)}); using the previous one")
            return True
        attempts = job.spec.job.restart_attempts
        if restarts >= attempts:
            return False
        delay = job.spec.job.restart_delay_ms / 1000
        job.reporter.message(f"{exc}\nrestarting from the last checkpoint in {delay:g}s "
                             f"(attempt {restarts + 1} of {attempts})")
        return not stop.wait(delay)

    def _unreadable_file(self, exc: UnreadableFileError) -> bool:
        """Whether a source with `on_error` takes the damaged file as a dead letter from now
        on (`Source.mark_unreadable`), so the restart reads past it."""
        for source in self.job.sources.values():
            if source.spec.on_error and source.mark_unreadable(exc.path, exc.reason):
                self.job.reporter.message(
                    f"{exc}\nsource {source.spec.id!r}: the file becomes a dead letter; "
                    "restarting from the last checkpoint")
                return True
        return False

    def free_restart(self, exc: JobFailedError) -> bool:
        """A restart for lost local state, a checkpoint found corrupt while restoring, or a
        damaged file that a source now takes as a dead letter."""
        from streamer.checkpoint.task import STATE_BEHIND

        if isinstance(exc, UnreadableFileError):
            return True
        text = str(exc)
        if STATE_BEHIND in text:
            return True
        return (self.checkpoints.restored_from is not None
                and self.job.epoch <= self.job.first_epoch and "corrupt" in text.lower())


def _resume_problems(meta: CheckpointMetadata, stages: dict[str, tuple[str, Any]]) -> list[str]:
    """Why the pipeline cannot resume from `meta` (operators gone or rescaled)."""
    problems = []
    for uid, state in meta.operators.items():
        if uid not in stages:
            problems.append(f"it holds state of operator uid {uid!r}, which the pipeline no "
                            "longer has")
            continue
        node_id, stage = stages[uid]
        was = (state.parallelism, state.max_parallelism, state.backend)
        now = (stage.parallelism, stage.max_parallelism, stage.base_config.backend)
        if was != now:
            problems.append(
                f"operator {node_id!r} (uid {uid!r}) ran with parallelism {was[0]}, "
                f"max_parallelism {was[1]}, backend {was[2]}; the pipeline now says "
                f"{now[0]}, {now[1]}, {now[2]}")
    return problems


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def offsets_summary(meta: CheckpointMetadata) -> str:
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
