"""Stateless chains: consecutive filters, projections and `with_columns` operators, fused
into one stage. Each operator is a Spark SQL expression over its input, so Spark's
semantics (ANSI casts, nulls, timestamps) hold, and Spark fuses the chain into one
whole-stage-generated function when the epoch runs."""

from __future__ import annotations

from streamer.operators.stateless import apply_stateless, union
from streamer.pipeline.spec import OperatorSpec
from streamer.runtime.stages.base import EpochContext, Stage


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
        for op in self.ops:
            df = apply_stateless(op, union(present)) if present else None
            ctx.frames[op.id] = df
            present = [df] if df is not None else []

    def describe(self) -> dict[str, object]:
        """The chain's operators too."""
        return {**super().describe(), "operators": list(self.node_ids)}
