"""Bad records met after a source: rows that reach a stateful operator without what it needs
(a join's key or event time, an until window's close time).

Such a record is accounted where its source's own bad records are: a dead letter of the
source it comes from through stateless operators (`origin_of`) when that source has
`on_error`, with the reason and the record as JSON; else the epoch fails with a message
naming the record, the reason and the fix. Joins (`runtime.plan.join_plan`) and until windows
(`runtime.plan.stages.keyed_stage`) use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamer.columns import HIDDEN_PREFIX
from streamer.connectors.base import DECODE_ERROR_MARKER

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from streamer.pipeline.graph import Dataflow
    from streamer.pipeline.spec import SourceSpec


def origin_of(flow: Dataflow, node_id: str) -> SourceSpec | None:
    """The source whose records `node_id` passes on through stateless operators only, or
    None (a keyed operator or a union is in between): where its bad records are accounted."""
    node = flow.node(node_id)
    while node.role == "operator" and node.kind != "keyed" and len(node.inputs) == 1:
        node = flow.node(node.inputs[0])
    return node.source if node.role == "source" else None

def bad_records(origin: SourceSpec | None, df: DataFrame, is_bad: Column, reason: str,
                before: str) -> tuple[DataFrame, tuple[str, DataFrame] | None]:
    """`df` without its records where `is_bad`, and their dead letters as (the `on_error`
    sink of `origin`, the source the records come from through stateless operators, frame),
    each with `reason`; without an `on_error` (or an origin), `df` with a guard that fails
    the epoch on such a record, naming it, `reason` and the fix (filter them out `before`)."""
    from pyspark.sql import functions as F

    shown = [c for c in df.columns if not c.startswith(HIDDEN_PREFIX)]
    record = F.to_json(F.struct(*[F.col(f"`{c}`") for c in shown]),
                       {"ignoreNullFields": "false"})
    if origin is None or origin.on_error is None:
        fix = (f"add on_error: <sink id> to source {origin.id!r} to send such records to a "
               "dead-letter sink, or " if origin is not None else "")
        guard = F.when(is_bad, F.raise_error(F.concat(
            F.lit(f"{DECODE_ERROR_MARKER}{reason}: "), F.substring(record, 1, 500),
            F.lit(f"; {fix}filter them out before {before}")))).otherwise(F.lit(True))
        return df.where(guard), None
    dead = df.where(is_bad).select(
        F.lit(origin.id).alias("source"), F.lit(None).cast("string").alias("split"),
        F.lit(None).cast("string").alias("offset"), record.alias("record"),
        F.lit(reason).alias("error"))
    return df.where(~is_bad), (origin.on_error, dead)
