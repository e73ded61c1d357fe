"""The checkpoint coordinator (docs/concepts/checkpoints.md), apart from the epoch loop as Flink
keeps its CheckpointCoordinator apart from scheduling.

A checkpoint is an epoch boundary: the coordinator gives it an id before the epoch runs
(`begin`), hands the keyed subtasks what they need to snapshot and restore
(`task_checkpointing`), and, once every subtask reported its snapshot, completes it in
numbered steps (`complete`): 1. collect the subtasks' handles; 2. write `_metadata`
atomically (the checkpoint exists from then on); 3. commit the sinks' staged output (phase
two of two-phase commit); 4. prune old checkpoints. A missing snapshot, a timeout or a
storage error declines the checkpoint instead: reported, the previous ones untouched, the
job goes on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from streamer.runtime.cluster.workdirs import local_recovery_root
from streamer.runtime.job.job_state import JobState

if TYPE_CHECKING:
    from streamer.checkpoint.checkpoint_metadata import (
        CheckpointMetadata,
        CheckpointStore,
        OperatorState,
    )


#: Runs a sink commit for an epoch, turning its failure into a JobFailedError.
Guard = Callable[[int, str, Callable[[], Any]], Any]


class CheckpointCoordinator:
    """Checkpoints of one job: when they are due, their ids, completion and pruning, and
    the sink output staged until a checkpoint covers it."""

    def __init__(self, job: JobState, guard: Guard) -> None:
        self.job = job
        self.guard = guard
        self.store: CheckpointStore | None = None
        self.last: CheckpointMetadata | None = None
        self.last_at = 0.0
        #: Keyed node id -> subtask -> its handle in the last completed checkpoint.
        self.last_handles: dict[str, dict[int, dict[str, Any]]] = {}
        #: sink id -> [[epoch, handle], ...] staged, waiting for the covering checkpoint
        self.pending: dict[str, list[list[Any]]] = {}
        self.completed: list[int] = []
        #: The checkpoint this run attempt resumed from (None: from the sources' start).
        self.restored_from: int | None = None
        #: The checkpoint the whole run resumed from (after any fallback), for its result.
        self.result_restored_from: int | None = None
        self.bad: set[int] = set()
        #: Checkpoints at or below this id predate a savepoint restore.
        self.lineage_start = 0
        #: The next epoch is a checkpoint whatever the interval (after a savepoint restore).
        self.force = False

    @property
    def enabled(self) -> bool:
        """Whether this run takes checkpoints."""
        return self.job.options.checkpoints

    def reset(self) -> None:
        """A new run attempt: nothing staged, no checkpoint yet."""
        self.pending = {}
        self.last_handles = {}
        self.last = None
        self.restored_from = None
        self.last_at = time.monotonic()

    def due(self) -> bool:
        """Whether the next epoch ends a checkpoint (the interval passed, or on a cluster
        every epoch: a moved subtask restores the latest version)."""
        if not self.enabled:
            return False
        if self.job.on_cluster and self.job.keyed:
            return True
        interval = self.job.spec.job.checkpoint.interval_ms / 1000
        return self.force or time.monotonic() - self.last_at >= interval

    def unsaved(self) -> bool:
        """Whether epochs ran (or sink output waits) since the last checkpoint."""
        done = self.last.epoch if self.last else 0
        return self.enabled and (self.job.epoch > done or any(self.pending.values()))

    def begin(self) -> int | None:
        """The id of the checkpoint this epoch ends (above every existing `chk-<n>`)."""
        if self.store is None:
            return None
        try:
            return self.store.next_id()
        except Exception as exc:  # storage unreachable: this checkpoint fails, the job goes on
            self.decline(None, self.job.epoch, f"cannot list the checkpoint storage: {exc}")
            return None

    def task_checkpointing(self, node_id: str, checkpoint_id: int | None,
                           savepoint_url: str | None = None) -> Any:
        """What the keyed subtasks of `node_id` need: restore source, snapshot target."""
        if self.store is None:
            return None
        from streamer.checkpoint.task import TaskCheckpointing

        job = self.job.spec.job
        keep = [*self.completed[-job.checkpoint.retain:], *(
            [self.restored_from] if self.restored_from is not None else [])]
        return TaskCheckpointing(
            url=self.store.url, local_copy_root=local_recovery_root(job.state_local_dir),
            first_epoch=self.job.first_epoch, last=dict(self.last_handles.get(node_id, {})),
            snapshot_id=checkpoint_id,
            deadline=((time.time() + job.checkpoint.timeout_ms / 1000)
                      if checkpoint_id is not None else None),
            keep_local=tuple(keep),
            savepoint_url=savepoint_url if checkpoint_id is not None else None,
            savepoint_restore=self.job.savepoint_restore.get(node_id))

    def stage_or_commit(self, epoch: int, handles: dict[str, Any]) -> None:
        """Phase one done: exactly once, the sinks' output waits for the checkpoint that
        covers `epoch`; otherwise it commits now."""
        spec = self.job.spec.job.checkpoint
        if self.enabled and spec.mode == "exactly_once":
            for sink_id, handle in handles.items():
                self.pending.setdefault(sink_id, []).append([epoch, handle])
            return
        for sink_id, handle in handles.items():
            self.guard(epoch, f"committing sink {sink_id!r}",
                       partial(self.job.sinks[sink_id].commit, epoch, handle))

    def abort_pending(self) -> None:
        """Drop what sinks staged since the last checkpoint (a restart writes it again)."""
        for sink_id, items in self.pending.items():
            for epoch, handle in items:
                with contextlib.suppress(Exception):
                    self.job.sinks[sink_id].abort(epoch, handle)
        self.pending = {}

    def decline(self, checkpoint_id: int | None, epoch: int, reason: str) -> None:
        """Report a checkpoint that did not complete; the next is tried after an interval."""
        self.last_at = time.monotonic()
        self.job.reporter.checkpoint({"status": "failed", "id": checkpoint_id, "epoch": epoch,
                                      "reason": reason})

    def complete(self, checkpoint_id: int, epoch: int, keyed_metas: dict[str, Any],
                 started: float) -> CheckpointMetadata | None:
        """Complete the checkpoint in its numbered steps (module docstring); its metadata,
        or None when it was declined."""
        from streamer import failpoints

        assert self.store is not None
        # 1. the subtasks' handles
        operators, snapshot_ms, errors = self._operator_states(keyed_metas)
        failpoints.reached("after-snapshot", checkpoint_id)
        elapsed_ms = (time.monotonic() - started) * 1000 + snapshot_ms
        timeout = self.job.spec.job.checkpoint.timeout_ms
        if not errors and elapsed_ms > timeout:
            errors.append(f"it took {elapsed_ms:,.0f} ms, over the timeout of {timeout:,} ms")
        if errors:
            self.decline(checkpoint_id, epoch, "; ".join(errors))
            return None
        # 2. _metadata
        meta = self._metadata(checkpoint_id, epoch, operators, elapsed_ms)
        try:
            self.store.write(meta)
        except Exception as exc:
            self.decline(checkpoint_id, epoch, f"cannot write its _metadata: {exc}")
            return None
        failpoints.reached("after-metadata", checkpoint_id)
        # 3. the sinks' staged output
        for n, (sink_id, items) in enumerate(self.pending.items()):
            for sink_epoch, handle in items:
                self.guard(sink_epoch, f"committing sink {sink_id!r}",
                           partial(self.job.sinks[sink_id].commit, sink_epoch, handle))
            if n == 0:
                failpoints.reached("mid-commit", checkpoint_id)
        self.pending = {}
        self.last = meta
        self.last_at = time.monotonic()
        self.force = False
        self.completed.append(checkpoint_id)
        self.last_handles = {op.node: {int(h["subtask"]): h for h in op.subtasks}
                             for op in operators.values()}
        # 4. prune
        self._prune_and_report(meta, elapsed_ms)
        return meta

    def _operator_states(self, keyed_metas: dict[str, Any]
                         ) -> tuple[dict[str, OperatorState], float, list[str]]:
        """Per operator uid its subtasks' snapshot handles; the slowest snapshot (ms); what
        is missing."""
        from streamer.checkpoint.checkpoint_metadata import OperatorState

        errors: list[str] = []
        operators: dict[str, OperatorState] = {}
        snapshot_ms = 0.0
        for node_id, metas in keyed_metas.items():
            stage = self.job.keyed[node_id]
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
        return operators, snapshot_ms, errors

    def _metadata(self, checkpoint_id: int, epoch: int, operators: dict[str, OperatorState],
                  elapsed_ms: float) -> CheckpointMetadata:
        from streamer.checkpoint.checkpoint_metadata import CheckpointMetadata, now

        job, spec = self.job, self.job.spec
        uid_of = {s.id: s.uid for s in spec.sources}
        offsets, watermark = job.saved_sources()
        return CheckpointMetadata(
            checkpoint_id=checkpoint_id, job=spec.name, run_id=job.run_id, epoch=epoch,
            created_at=now(), mode=spec.job.checkpoint.mode,
            offsets=offsets, watermark=watermark, operators=operators,
            sinks={k: [list(i) for i in v] for k, v in self.pending.items() if v},
            next_timers={job.keyed[n].op.uid: dict(t) for n, t in job.next_timers.items()
                         if n in job.keyed},
            uids={"sources": dict(uid_of),
                  "operators": {n: s.op.uid for n, s in job.keyed.items()}},
            duration_ms=round(elapsed_ms, 1))

    def _prune_and_report(self, meta: CheckpointMetadata, elapsed_ms: float) -> None:
        assert self.store is not None
        deleted: list[int] = []
        try:
            keep = [self.restored_from] if self.restored_from is not None else []
            # No upload of a live checkpoint takes longer than its timeout: a temporary file
            # older than that was left by a killed one.
            checkpoint = self.job.spec.job.checkpoint
            deleted = self.store.prune(checkpoint.retain, keep=keep,
                                       temporaries_after_s=checkpoint.timeout_ms / 1000)
        except Exception as exc:  # the checkpoint stands; old files wait for the next prune
            self.job.reporter.message(f"checkpoint {meta.checkpoint_id}: cleaning up older "
                                      f"checkpoints failed: {exc}")
        self.job.reporter.checkpoint({
            "status": "completed", "id": meta.checkpoint_id, "epoch": meta.epoch,
            "duration_ms": round(elapsed_ms, 1), "state_size": meta.state_size,
            "uploaded_bytes": meta.uploaded_bytes, "pruned": deleted,
            "path": self.store.storage.path(self.store.dir_of(meta.checkpoint_id))})
