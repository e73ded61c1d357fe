"""The continuous mode's checkpoint coordinator (issue 36), on the driver: it injects barrier
n at every source subtask and completes checkpoint n once every subtask acknowledged it, in
the epoch mode's format (`checkpoint.checkpoint_metadata`), so the restore code of either
mode reads it.

Subtasks reach it over Arrow Flight (`exchange.coordination`): a source subtask follows its
barrier stream and acknowledges each barrier with its position
(`runtime.continuous.source_subtask.SourceSubtask.position`); a keyed subtask acknowledges with its
snapshot's state handle (`operators.continuous.ContinuousSubtask`'s `ack`, as
`{"snapshot": handle}`). Checkpoint n completes in numbered steps, as
`runtime.job.checkpointing.CheckpointCoordinator.complete` does for an epoch:
1. every acknowledgement is in (a subtask's second acknowledgement of n is ignored);
2. `_metadata` is written atomically: per source uid its offsets (as the epoch mode
   records them: the files read whole, or each partition's next offset; and each subtask's
   position under `continuous`), the watermark (the least of
   the subtasks' trackers, their splits named `<split>@<subtask>`), per operator uid its
   subtasks' handles, the epoch (the newest state version of the handles: an epoch-mode
   restore continues after it);
   with the sinks' staged output of n (`CommitHooks.stage`), as an epoch's pending commits;
3. the sinks commit it (`CommitHooks.commit`);
4. older checkpoints are pruned to `retain`.
A checkpoint whose acknowledgements do not all come within `timeout_s` is declined
(`wait` says so); the ones before it stand.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamer.checkpoint.checkpoint_metadata import (
    CheckpointMetadata,
    CheckpointStore,
    OperatorState,
    now,
)
from streamer.exceptions import StreamerError
from streamer.exchange.coordination import CoordinationServer
from streamer.runtime.watermarks import MIN_WATERMARK

#: Where a source's offsets keep each subtask's position (beside the epoch mode's splits).
CONTINUOUS = "continuous"


class CheckpointDeclinedError(StreamerError):
    """A continuous checkpoint did not complete: an acknowledgement did not come in time,
    or its `_metadata` could not be written. The previous checkpoints stand; the job
    restarts from the last one if a subtask failed."""


@dataclass(frozen=True)
class KeyedLayout:
    """A keyed operator of the gang: its uid, backend and parallelism."""

    uid: str
    backend: str
    parallelism: int
    max_parallelism: int


@dataclass(frozen=True)
class GangLayout:
    """The subtasks of a continuous job: per source id its uid and subtask count; per
    keyed node id its `KeyedLayout`."""

    job: str
    sources: dict[str, tuple[str, int]]
    operators: dict[str, KeyedLayout]

    def tasks(self) -> set[str]:
        """The name of every subtask (what acknowledges a checkpoint)."""
        names = {source_task(s, i) for s, (_, n) in self.sources.items() for i in range(n)}
        return names | {keyed_task(k, i) for k, op in self.operators.items()
                        for i in range(op.parallelism)}


def source_task(source_id: str, subtask: int) -> str:
    """The name a source subtask goes by on the control plane."""
    return f"source/{source_id}/{subtask}"


def keyed_task(node_id: str, subtask: int) -> str:
    """The name a keyed subtask goes by on the control plane."""
    return f"keyed/{node_id}/{subtask}"


@dataclass(frozen=True)
class CommitHooks:
    """The sinks' part in completing checkpoint n: `stage(meta)` puts the handles of what
    the subtasks staged for n in `meta.sinks` (sink id -> [[sink epoch, handle]]), before
    `_metadata` is written; `commit(meta)` commits them after."""

    stage: Callable[[CheckpointMetadata], None]
    commit: Callable[[CheckpointMetadata], None]


@dataclass
class _Pending:
    started: float
    acks: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Each acknowledging subtask's output rows so far (not part of `_metadata`).
    rows_out: dict[str, int] = field(default_factory=dict)


class BarrierCoordinator:
    """Checkpoints of one continuous run (module docstring). Serves its control plane on
    `host` (`location` is what subtasks connect to)."""

    def __init__(self, layout: GangLayout, store: CheckpointStore, *, run_id: str,
                 mode: str = "exactly_once", retain: int | None = None,
                 host: str = "127.0.0.1", hooks: CommitHooks | None = None) -> None:
        self.layout = layout
        self.hooks = hooks
        self.store = store
        self.run_id = run_id
        self.mode = mode
        self.retain = retain
        self.server = CoordinationServer(host, self._ack, on_fail=self._fail)
        self._cond = threading.Condition()
        self._pending: dict[int, _Pending] = {}
        self._done: dict[int, CheckpointMetadata | str] = {}
        self._last = 0
        self.completed: list[int] = []
        #: The first completed checkpoint whose every subtask had ended its input.
        self.all_ended: int | None = None
        #: The first reason a subtask gave for failing (`CoordinationClient.fail`), if any.
        self.failure: str | None = None
        #: The rows the subtasks wrote to the sink up to the newest completed checkpoint, as
        #: their acknowledgements count them (`rows_out`; since this coordinator started).
        self.rows_out = 0

    def _fail(self, task: str, reason: str) -> None:
        with self._cond:
            if self.failure is None:
                self.failure = reason

    @property
    def location(self) -> str:
        """The control plane's URI."""
        return self.server.location

    def next_id(self) -> int:
        """The id `trigger` gives next (above every `chk-<n>` on the storage; consecutive
        within a run)."""
        with self._cond:
            return max(self.store.next_id(), self._last + 1) if not self._last \
                else self._last + 1

    def trigger(self) -> int:
        """Inject the next checkpoint's barrier at every subtask (the sources send it on
        in their data; a subtask whose input ended answers it on the control plane); its
        id (`next_id`)."""
        checkpoint = self.next_id()
        with self._cond:
            self._last = checkpoint
            self._pending[checkpoint] = _Pending(time.monotonic())
        for task in sorted(self.layout.tasks()):
            self.server.inject(task, checkpoint)
        return checkpoint

    def wait(self, checkpoint: int, timeout_s: float) -> CheckpointMetadata:
        """Checkpoint `checkpoint`'s metadata once it completed; `CheckpointDeclinedError`
        when it was declined or did not complete within `timeout_s` (then it is declined)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while checkpoint not in self._done:
                left = deadline - time.monotonic()
                if left <= 0:
                    pending = self._pending.pop(checkpoint, None)
                    missing = sorted(self.layout.tasks() - set(pending.acks)) if pending else []
                    self._done[checkpoint] = (f"checkpoint {checkpoint} was not acknowledged "
                                              f"within {timeout_s:g} s by {missing}")
                    break
                self._cond.wait(left)
            done = self._done[checkpoint]
        if isinstance(done, str):
            raise CheckpointDeclinedError(done)
        return done

    def poll(self, checkpoint: int, timeout_s: float) -> CheckpointMetadata | None:
        """Checkpoint `checkpoint`'s metadata if it completes within `timeout_s`, else None
        (still pending); `CheckpointDeclinedError` if it was declined."""
        with self._cond:
            self._cond.wait_for(lambda: checkpoint in self._done, timeout_s)
            done = self._done.get(checkpoint)
        if isinstance(done, str):
            raise CheckpointDeclinedError(done)
        return done

    def _ack(self, task: str, checkpoint: int, payload: dict[str, Any]) -> None:
        """An acknowledgement (on a server thread); the last one completes the checkpoint."""
        if task not in self.layout.tasks():
            msg = f"an acknowledgement from {task!r}, which is no subtask of this job"
            raise ValueError(msg)
        with self._cond:
            pending = self._pending.get(checkpoint)
            if pending is None:  # declined, or completed: a late or repeated one
                return
            rows = int(payload.pop("rows_out", 0))
            if task not in pending.acks:
                pending.acks[task] = payload
                pending.rows_out[task] = rows
            if len(pending.acks) < len(self.layout.tasks()):
                return
            del self._pending[checkpoint]
            try:
                self._done[checkpoint] = self._complete(checkpoint, pending)
            except Exception as exc:  # the checkpoint is declined; the job goes on
                self._done[checkpoint] = f"checkpoint {checkpoint}: {exc}"
            self._cond.notify_all()

    def _complete(self, checkpoint: int, pending: _Pending) -> CheckpointMetadata:
        """Steps 2-4 of the module docstring (step 1: every acknowledgement is in)."""
        meta = self.metadata(checkpoint, pending.acks,
                             (time.monotonic() - pending.started) * 1000)
        if self.hooks is not None:
            self.hooks.stage(meta)
        self.store.write(meta)  # 2. the checkpoint exists from here on
        if self.hooks is not None:
            self.hooks.commit(meta)  # 3.
        self.completed.append(checkpoint)
        self.rows_out = max(self.rows_out, sum(pending.rows_out.values()))
        if self.all_ended is None and all(a.get("ended") for a in pending.acks.values()):
            self.all_ended = checkpoint
        if self.retain is not None:  # 4.
            self.store.prune(self.retain)
        return meta

    def metadata(self, checkpoint: int, acks: dict[str, dict[str, Any]],
                 elapsed_ms: float) -> CheckpointMetadata:
        """The `_metadata` of `checkpoint` from every subtask's acknowledgement."""
        operators = {}
        for node_id, op in self.layout.operators.items():
            handles = [acks[keyed_task(node_id, i)]["snapshot"] for i in range(op.parallelism)]
            operators[op.uid] = OperatorState(
                node=node_id, backend=op.backend, parallelism=op.parallelism,
                max_parallelism=op.max_parallelism, subtasks=handles)
        offsets: dict[str, dict[str, Any]] = {}
        records: dict[str, int] = {}
        splits: list[list[Any]] = []
        currents = []
        finished = []
        for source_id, (uid, subtasks) in self.layout.sources.items():
            positions = {i: acks[source_task(source_id, i)] for i in range(subtasks)}
            offsets[uid] = merge_offsets([p.get("epoch_offsets", {})
                                          for p in positions.values()])
            offsets[uid][CONTINUOUS] = {str(i): p for i, p in positions.items()}
            records[uid] = sum(int(p.get("records", 0)) for p in positions.values())
            trackers = {i: p.get("watermark", {}) for i, p in positions.items()}
            currents += [int(t.get("current", MIN_WATERMARK)) for t in trackers.values()]
            if all(p.get("ended") for p in positions.values()):
                finished.append(source_id)
            splits += [[source_id, f"{split}@{i}", max_ts, active]
                       for i, t in trackers.items()
                       for _, split, max_ts, active in t.get("splits", [])]
        versions = [int(h.get("version", 0)) for op in operators.values() for h in op.subtasks]
        return CheckpointMetadata(
            checkpoint_id=checkpoint, job=self.layout.job, run_id=self.run_id,
            epoch=max(versions, default=0), created_at=now(), mode=self.mode,
            offsets=offsets, records=records, operators=operators,
            watermark={"current": min(currents, default=MIN_WATERMARK),
                       "finished": sorted(finished), "splits": splits, "operators": {}},
            uids={"sources": {s: uid for s, (uid, _) in self.layout.sources.items()},
                  "operators": {n: op.uid for n, op in self.layout.operators.items()}},
            duration_ms=round(elapsed_ms, 1))

    def close(self) -> None:
        """Stop the control plane (the barrier streams end)."""
        self.server.close()


def merge_offsets(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The source's offsets as the epoch mode records them, from its subtasks' parts: lists
    (the files read) joined and sorted, other values (a partition's offset) as they are."""
    merged: dict[str, Any] = {}
    for part in parts:
        for split, value in part.items():
            if isinstance(value, list):
                merged[split] = sorted({*merged.get(split, []), *value})
            else:
                merged[split] = value
    return merged


def source_positions(meta: CheckpointMetadata, uid: str) -> dict[int, dict[str, Any]]:
    """Each subtask's recorded position of source `uid` in checkpoint `meta`."""
    found = meta.offsets.get(uid, {}).get(CONTINUOUS, {})
    return {int(i): dict(p) for i, p in found.items()}


def keyed_handles(meta: CheckpointMetadata, uid: str) -> dict[int, dict[str, Any]]:
    """Each subtask's state handle of operator `uid` in checkpoint `meta`."""
    state = meta.operators.get(uid)
    return {} if state is None else {int(h["subtask"]): h for h in state.subtasks}
