"""What one run of a job holds while the coordinator sequences its epochs: the pipeline,
its connectors and physical plan, and the progress the checkpoints record (source offsets,
the watermark, the epoch, the keyed stages' next timers). The coordinator, the checkpoint
coordinator, recovery, savepoints and job control all work on one `JobState`."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from streamer.connectors.base import Sink, Source
    from streamer.pipeline.graph import Dataflow
    from streamer.pipeline.spec import PipelineSpec
    from streamer.runtime.cluster.placement import Placement
    from streamer.runtime.observe.metrics import EpochMetrics, Reporter
    from streamer.runtime.plan.keyed_plan import KeyedStage
    from streamer.runtime.plan.physical import PhysicalPlan
    from streamer.runtime.watermarks import WatermarkTracker


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
    #: Serve Prometheus metrics on this port (overrides `job.metrics.prometheus.port`).
    metrics_port: int | None = None
    #: Serve the metrics the file asks for (off for `streamer test`'s in-process cases).
    metrics: bool = True


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds."""
    return int(time.time() * 1000)


def new_run_id() -> str:
    """A run attempt's id: its start time and the process."""
    return f"{now_ms():x}-{os.getpid()}"


#: How many epochs' metrics a run keeps (for `JobResult.metrics` and the reporters).
HISTORY_KEEP = 1000


@dataclass
class JobState:
    """One run of a job: what it runs and how far it got."""

    spec: PipelineSpec
    options: RunOptions
    reporter: Reporter
    flow: Dataflow
    placement: Placement
    storage_url: str
    run_id: str = field(default_factory=new_run_id)
    sources: dict[str, Source] = field(default_factory=dict)
    sinks: dict[str, Sink] = field(default_factory=dict)
    schemas: dict[str, Any] = field(default_factory=dict)
    plan: PhysicalPlan | None = None
    #: On a cluster (not `local[...]`): working state per executor, a checkpoint every
    #: epoch so a subtask that moves restores the latest version (runtime/cluster/placement.py).
    on_cluster: bool = False
    offsets: dict[str, dict[str, Any]] = field(default_factory=dict)
    watermarks: WatermarkTracker | None = None
    epoch: int = 0
    #: The first epoch of this run attempt (after the checkpoint it resumed from).
    first_epoch: int = 1
    #: Keyed node id -> its subtasks' earliest `event` and `processing` timers.
    next_timers: dict[str, dict[str, int | None]] = field(default_factory=dict)
    #: The last `HISTORY_KEEP` epochs' metrics (an unbounded job must not keep them all:
    #: bench/soak.py saw the driver grow ~4 KB per epoch); `totals` counts every epoch.
    history: list[EpochMetrics] = field(default_factory=list)
    #: records_in, records_out, dead_letters, late and filtered over every epoch run.
    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("records_in", "records_out", "dead_letters", "late", "filtered"), 0))
    state_root: str = ""
    state_roots: list[str] = field(default_factory=list)
    #: Per restore: operator, subtasks restored locally / remotely, slowest (ms).
    restore_report: list[dict[str, Any]] = field(default_factory=list)
    #: Keyed node id -> the savepoint state its subtasks restore (`streamer restore`).
    savepoint_restore: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def keyed(self) -> dict[str, KeyedStage]:
        """Keyed node id -> its stage's Spark plan."""
        return self.plan.keyed if self.plan is not None else {}

    @property
    def tracker(self) -> WatermarkTracker:
        """The watermark tracker of the current run attempt."""
        assert self.watermarks is not None
        return self.watermarks

    def saved_sources(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Source offsets and the watermark tracker, keyed by source uid (as checkpoints
        and savepoints store them)."""
        uid_of = {s.id: s.uid for s in self.spec.sources}
        watermark = self.tracker.to_json()
        watermark["finished"] = [uid_of[s] for s in watermark["finished"]]
        watermark["splits"] = [[uid_of[s], *rest] for s, *rest in watermark["splits"]]
        op_uid = {o.id: o.uid for o in self.spec.operators}
        watermark["operators"] = {op_uid[o]: wm for o, wm in watermark["operators"].items()}
        return {uid_of[sid]: dict(o) for sid, o in self.offsets.items()}, watermark

    def record(self, metrics: EpochMetrics) -> None:
        """Count an epoch in the totals and keep its metrics among the last few."""
        self.totals["records_in"] += metrics.total_in
        self.totals["records_out"] += metrics.total_out
        self.totals["dead_letters"] += metrics.dead_letters
        self.totals["late"] += metrics.late
        self.totals["filtered"] += metrics.filtered
        self.history.append(metrics)
        if len(self.history) > 2 * HISTORY_KEEP:
            del self.history[:-HISTORY_KEEP]

    def _refuse_mid_file(self, source_id: str, offsets: dict[str, Any]) -> None:
        """The epoch mode reads a file whole, so it cannot go on from a continuous run's
        position in the middle of one (it would read that file's first rows again):
        refuse, rather than write them twice."""
        if self.plan is None or self.plan.settings.mode == "continuous":
            return
        for subtask, position in sorted(offsets.get("continuous", {}).items()):
            if position.get("file") is not None and int(position.get("row", 0)) > 0:
                from streamer.exceptions import ConfigError

                msg = (f"source {source_id!r}: the checkpoint or savepoint was taken in "
                       f"the continuous mode while its subtask {subtask} was in the middle "
                       f"of file {position['file']!r} (row {position['row']}), which the "
                       "epoch mode can only read whole; restore it with "
                       "job.execution.mode: continuous at the same parallelism")
                raise ConfigError(msg)

    def resume_sources(self, offsets: dict[str, Any], saved: dict[str, Any]) -> None:
        """Continue each source at its saved offsets (by uid; a new source starts at its
        beginning) and the watermark where it was."""
        ids_of = {s.uid: s.id for s in self.spec.sources}
        for source in self.spec.sources:
            if source.uid in offsets:
                self._refuse_mid_file(source.id, offsets[source.uid])
                self.offsets[source.id] = dict(offsets[source.uid])
        watermark = dict(saved)
        watermark["finished"] = [ids_of[u] for u in watermark.get("finished", [])
                                 if u in ids_of]
        watermark["splits"] = [[ids_of[u], *rest] for u, *rest in watermark.get("splits", [])
                               if u in ids_of]
        op_id = {o.uid: o.id for o in self.spec.operators}
        watermark["operators"] = {op_id[u]: wm for u, wm in watermark.get("operators", {}).items()
                                  if u in op_id}
        self.tracker.restore(watermark, now_ms())
