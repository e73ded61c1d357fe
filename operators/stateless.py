"""Stateless operators: `filter`, `select`, `with_columns` and unions, as Spark SQL over the
epoch's DataFrames. They add no Spark job of their own; Spark fuses them into the read.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from typing import TYPE_CHECKING

from streamer.columns import CHANGE, EVENT_TIME
from streamer.pipeline.spec import OperatorSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def union(frames: Sequence[DataFrame]) -> DataFrame:
    """Union by column name (the validator has checked that the schemas match)."""
    return reduce(lambda a, b: a.unionByName(b), frames)


def apply_stateless(op: OperatorSpec, df: DataFrame) -> DataFrame:
    """Apply a filter / select / with_columns operator to its (unioned) input."""
    from pyspark.sql import functions as F

    if op.kind == "filter":
        assert op.filter is not None
        return df.filter(F.expr(op.filter))
    if op.kind == "select":
        # The hidden event-time column travels with the rows through a select.
        # (the event time and an update stream's change travel with the rows)
        keep = [F.col(c) for c in (EVENT_TIME, CHANGE)
                if c in df.columns and c not in dict(op.columns)]
        return df.select(*[F.expr(expr).alias(name) for name, expr in op.columns], *keep)
    if op.kind == "with_columns":
        return df.withColumns({name: F.expr(expr) for name, expr in op.columns})
    msg = f"operator {op.id!r} of kind {op.kind!r} is not stateless"
    raise ValueError(msg)
