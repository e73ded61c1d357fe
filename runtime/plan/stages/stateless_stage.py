"""Stateless chains: consecutive filters, projections and `with_columns` operators, fused
into one stage. Each operator is a Spark SQL expression over its input, so Spark's
semantics (ANSI casts, nulls, timestamps) hold, and Spark fuses the chain into one
whole-stage-generated function when the epoch runs.

The records a filter removes are counted (`EpochMetrics.filtered`) without a job of their
own: on the driver when the chain's input is a local relation (`runtime.plan.local`), else by an
observation of the filter's input and one of its output, in the job that reads the chain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamer.operators.stateless import apply_stateless, union
from streamer.pipeline.spec import OperatorSpec
from streamer.runtime.plan.local import LocalSeen, local_table
from streamer.runtime.plan.stages.base import EpochInput, Seen, Stage, StageOutput, Upstream
from streamer.runtime.plan.stages.sources import SummedSeen

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class StatelessChain(Stage):
    """One or more stateless operators applied one after the other."""

    kind = "stateless"
    strategy = "spark-sql"

    def __init__(self, ops: list[OperatorSpec], reason: str) -> None:
        super().__init__(ops[-1].id, reason)
        self.ops = ops

    @property
    def node_ids(self) -> tuple[str, ...]:
        """The operators of the chain, in order."""
        return tuple(op.id for op in self.ops)

    @property
    def reads(self) -> tuple[str, ...]:
        """The first operator's inputs."""
        return self.ops[0].inputs

    def run(self, epoch: EpochInput, upstream: Upstream) -> StageOutput:
        """Apply the chain to the union of its first operator's inputs (if any rows)."""
        present = upstream.inputs(self.reads)
        local = bool(present) and all(i in upstream.ran_local for i in self.reads
                                      if upstream.frames.get(i) is not None)
        frames: dict[str, DataFrame | None] = {}
        filtered: dict[str, Seen] = {}
        for op in self.ops:
            df = None
            if present:
                before = union(present)
                if op.kind == "filter":
                    df, filtered[op.id] = _filtered(epoch, op, before, local)
                else:
                    df = apply_stateless(op, before)
            frames[op.id] = df
            present = [df] if df is not None else []
            if op.id in upstream.prefiltered:  # (what the Arrow tasks filtered before it)
                n_in, n_out = upstream.prefiltered[op.id]
                done = LocalSeen({"filtered": n_in - n_out, "in": n_in, "out": n_out})
                ran = filtered.get(op.id)
                filtered[op.id] = done if ran is None else SummedSeen([done, ran])
        return StageOutput(frames=frames, filtered=filtered)

    def describe(self) -> dict[str, object]:
        """The chain's operators too."""
        return {**super().describe(), "operators": list(self.node_ids)}


def _filtered(epoch: EpochInput, op: OperatorSpec, before: DataFrame,
              local: bool) -> tuple[DataFrame, Seen]:
    """The filter `op` applied to `before`, and what counts the records it removes (and
    its records in and out): on the driver for a local relation (no job), else observing
    the filter's input and output inside the job that reads them."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    after = apply_stateless(op, before)
    if local:
        one = F.lit(1).alias("one")
        counted = [local_table(df.select(one)) for df in (before, after)]
        if counted[0] is not None and counted[1] is not None:
            n_in, n_out = counted[0].num_rows, counted[1].num_rows
            return after, LocalSeen({"filtered": n_in - n_out, "in": n_in, "out": n_out})
    seen_in = Observation(f"filter_in_{op.id}_{epoch.epoch}")
    seen_out = Observation(f"filter_out_{op.id}_{epoch.epoch}")
    observed = before.observe(seen_in, F.count(F.lit(1)).alias("n"))
    return (apply_stateless(op, observed).observe(seen_out, F.count(F.lit(1)).alias("n")),
            Filtered(seen_in, seen_out))


class Filtered:
    """What a filter removed (`get`: `filtered`, with its records `in` and `out`), from the
    observations of its input and output (read once the epoch's jobs ran)."""

    def __init__(self, seen_in: Any, seen_out: Any) -> None:
        self.seen_in = seen_in
        self.seen_out = seen_out

    @property
    def get(self) -> dict[str, int]:
        """`filtered`: records in minus records out."""
        n_in = int(self.seen_in.get.get("n") or 0)
        n_out = int(self.seen_out.get.get("n") or 0)
        return {"filtered": n_in - n_out, "in": n_in, "out": n_out}
