"""How the epoch loop combines what the stages return (`runtime.plan.stages.base.StageOutput`)
and passes each stage what the ones before it produced for it (`Upstream`).

Every hand-off is addressed to a node id: a frame to the stages that read that node, routed
rows to their sink, Arrow tasks' files to their keyed stage, their filter counts to their
chain, their staged rows and a keyed stage's writing job to their sink. The rest is the
epoch's record for the loop: observations for the watermark and the metrics, subtask
metadata for the barrier and the checkpoint, the sinks' pre-commit handles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from streamer.runtime.plan.stages.base import Routed, Seen, SinkJob, Stage, StageOutput, Upstream

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass
class EpochResults:
    """The stages' outputs of one epoch so far, combined (owned by the epoch loop)."""

    #: Per node id, its output this epoch (None: no rows this epoch).
    frames: dict[str, DataFrame | None] = field(default_factory=dict)
    routed: list[Routed] = field(default_factory=list)
    #: What ran as a local epoch (Spark evaluated it on the driver, no job), in order.
    ran_local: list[str] = field(default_factory=list)
    ran_direct: list[str] = field(default_factory=list)
    ran_staged: list[str] = field(default_factory=list)
    records_in: dict[str, Seen] = field(default_factory=dict)
    sink_rows: dict[str, Seen] = field(default_factory=dict)
    filtered: dict[str, Seen] = field(default_factory=dict)
    late_dropped: dict[str, Seen] = field(default_factory=dict)
    late_to: dict[str, str] = field(default_factory=dict)
    subtask_metas: dict[str, Any] = field(default_factory=dict)
    sink_jobs: dict[str, SinkJob] = field(default_factory=dict)
    prestaged: dict[str, tuple[str, ...]] = field(default_factory=dict)
    prefiltered: dict[str, tuple[int, int]] = field(default_factory=dict)
    arrow_written: dict[str, int] = field(default_factory=dict)
    arrow_decoded: dict[str, int] = field(default_factory=dict)
    arrow_refused: dict[str, str] = field(default_factory=dict)
    sink_refused: dict[str, str] = field(default_factory=dict)
    handles: dict[str, Any] = field(default_factory=dict)

    def add(self, out: StageOutput) -> None:
        """Take one stage's output (stages run in dataflow order)."""
        self.frames.update(out.frames)
        self.routed.extend(out.routed)
        self.ran_local.extend(out.ran_local)
        self.ran_direct.extend(out.ran_direct)
        self.ran_staged.extend(out.ran_staged)
        self.records_in.update(out.records_in)
        self.sink_rows.update(out.sink_rows)
        self.filtered.update(out.filtered)
        self.late_dropped.update(out.late_dropped)
        self.late_to.update(out.late_to)
        self.subtask_metas.update(out.subtask_metas)
        self.sink_jobs.update(out.sink_jobs)
        self.prestaged.update(out.prestaged)
        for op_id, (n_in, n_out) in out.prefiltered.items():  # (several sources' tasks)
            had = self.prefiltered.get(op_id, (0, 0))
            self.prefiltered[op_id] = (had[0] + n_in, had[1] + n_out)
        self.arrow_written.update(out.arrow_written)
        self.arrow_decoded.update(out.arrow_decoded)
        self.arrow_refused.update(out.arrow_refused)
        self.sink_refused.update(out.sink_refused)
        self.handles.update(out.handles)

    def upstream_for(self, stage: Stage) -> Upstream:
        """What the stages so far produced that `stage` reads."""
        node_id = stage.node_id
        return Upstream(
            frames={i: self.frames.get(i) for i in stage.reads},
            ran_local=tuple(self.ran_local),
            routed=tuple(r for r in self.routed if r.sink_id == node_id),
            prestaged=self.prestaged.get(node_id),
            prefiltered={i: self.prefiltered[i] for i in stage.node_ids
                         if i in self.prefiltered},
            arrow_written=self.arrow_written.get(node_id),
            sink_job=self.sink_jobs.get(node_id))

    def count_of(self, kind: str) -> int:
        """The rows of `kind` the sinks received this epoch (after their jobs ran)."""
        return sum(int(seen.get.get(f"n_{kind}") or 0) for seen in self.sink_rows.values())
