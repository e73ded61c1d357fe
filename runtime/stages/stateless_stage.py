"""Stateless chains: consecutive filters, projections and `with_columns` operators, fused
into one stage. Each operator is a Spark SQL expression over its input, so Spark's
semantics (ANSI casts, nulls, timestamps) hold, and Spark fuses the chain into one
whole-stage-generated function when the epoch runs.

The records a filter removes are counted (`EpochMetrics.filtered`) without a job of their
own: on the driver when the chain's input is a local relation (`runtime.local`), else by an
observation of the filter's input and one of its output, in the job that reads the chain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamer.operators.stateless import apply_stateless, union
from streamer.pipeline.spec import OperatorSpec
from streamer.runtime.local import LocalSeen, local_table
from streamer.runtime.stages.base import EpochContext, Stage
from streamer.runtime.stages.sources import SummedSeen

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

    def run(self, ctx: EpochContext) -> None:
        """Apply the chain to the union of its first operator's inputs (if any rows)."""
        present = ctx.inputs(self.ops[0].inputs)
        local = bool(present) and all(i in ctx.ran_local for i in self.ops[0].inputs
                                      if ctx.frames.get(i) is not None)
        for op in self.ops:
            df = None
            if present:
                before = union(present)
                df = (_filtered(ctx, op, before, local) if op.kind == "filter"
                      else apply_stateless(op, before))
            ctx.frames[op.id] = df
            present = [df] if df is not None else []
            if op.id in ctx.prefiltered:  # (what the Arrow tasks filtered before it)
                n_in, n_out = ctx.prefiltered[op.id]
                done = LocalSeen({"filtered": n_in - n_out, "in": n_in, "out": n_out})
                ran = ctx.seen_filtered.get(op.id)
                ctx.seen_filtered[op.id] = done if ran is None else SummedSeen([done, ran])

    def describe(self) -> dict[str, object]:
        """The chain's operators too."""
        return {**super().describe(), "operators": list(self.node_ids)}


def _filtered(ctx: EpochContext, op: OperatorSpec, before: DataFrame,
              local: bool) -> DataFrame:
    """The filter `op` applied to `before`, with the records it removes (and its records in
    and out) counted into `ctx.seen_filtered`: on the driver for a local relation (no job),
    else by observing the filter's input and output inside the job that reads them."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    after = apply_stateless(op, before)
    if local:
        one = F.lit(1).alias("one")
        counted = [local_table(df.select(one)) for df in (before, after)]
        if counted[0] is not None and counted[1] is not None:
            n_in, n_out = counted[0].num_rows, counted[1].num_rows
            ctx.seen_filtered[op.id] = LocalSeen(
                {"filtered": n_in - n_out, "in": n_in, "out": n_out})
            return after
    seen_in = Observation(f"filter_in_{op.id}_{ctx.epoch}")
    seen_out = Observation(f"filter_out_{op.id}_{ctx.epoch}")
    observed = before.observe(seen_in, F.count(F.lit(1)).alias("n"))
    ctx.seen_filtered[op.id] = Filtered(seen_in, seen_out)
    return apply_stateless(op, observed).observe(seen_out, F.count(F.lit(1)).alias("n"))


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
