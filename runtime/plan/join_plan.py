"""Driver side of a join (`operators.join` runs it in the keyed subtasks).

A join is a keyed stage with two inputs: each epoch, each side's frame is projected onto the
join's output columns (`project_sides`: the key columns under the left's names, the left's
other columns, the right's with `right_prefix`, nulls for the other side's), tagged with
`JOIN_SIDE` (`DELETE` for a right record that is a changelog's tombstone, which deletes its
key's table row); the keyed stage unions the two and routes the rows by key group (or stages
them for its subtasks) as it does any keyed operator's. A record whose key or event time is
null is a bad record: a dead letter of the source its side reads (through stateless
operators) when that source has `on_error`, else the epoch fails with a message naming the
join and the record (`runtime.bad_records`).
`split_late` takes the records behind the watermark out for the `late:` output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamer.columns import EVENT_TIME, JOIN_SIDE, TOMBSTONE
from streamer.operators.join import DELETE, JoinColumns, join_columns
from streamer.runtime.bad_records import bad_records, origin_of

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

    from streamer.pipeline.graph import Dataflow
    from streamer.pipeline.spec import OperatorSpec, SourceSpec


@dataclass(frozen=True)
class JoinPlan:
    """What the driver needs of a join each epoch (fixed for the run)."""

    op: OperatorSpec
    columns: JoinColumns
    #: The keyed stage's input: the output columns, `__ts`, `__join_side`.
    schema: StructType
    #: Per side, the source its records come from through stateless operators (for bad
    #: records), or None when a keyed operator or a union is in between.
    origins: tuple[SourceSpec | None, SourceSpec | None]


def plan_join(op: OperatorSpec, flow: Dataflow, schemas: Mapping[str, Any]) -> JoinPlan:
    """The `JoinPlan` of join operator `op` (its inputs' schemas analyzed)."""
    from pyspark.sql.types import IntegerType, StructField, StructType, TimestampType

    join = op.join
    assert join is not None
    columns, problems, fields = join_columns(join, schemas[join.left], schemas[join.right])
    assert not problems, problems  # (runtime.analyze reported them)
    schema = StructType([*fields, StructField(EVENT_TIME, TimestampType()),
                         StructField(JOIN_SIDE, IntegerType())])
    return JoinPlan(op, columns, schema, (origin_of(flow, join.left), origin_of(flow, join.right)))


def project_sides(plan: JoinPlan, left: DataFrame | None, right: DataFrame | None
                  ) -> tuple[list[DataFrame], list[tuple[str, DataFrame]]]:
    """(each side's records as a frame of `plan.schema`, the keyed stage unions them; the
    dead letters of records with a null key or event time, as (on_error sink, frame))."""
    from pyspark.sql import functions as F

    join, cols = plan.op.join, plan.columns
    assert join is not None
    types = {f.name: f.dataType for f in plan.schema.fields}
    frames, dead = [], []
    for side, df in ((0, left), (1, right)):
        if df is None:
            continue
        keys = join.left_key if side == 0 else join.right_key
        df, bad = _bad_records(plan, side, df, keys)
        if bad is not None:
            dead.append(bad)
        own = cols.of_side(side)
        tag = F.lit(side)
        if side == 1 and TOMBSTONE in df.columns:  # a changelog's tombstone deletes its key
            tag = F.when(F.col(TOMBSTONE).isNotNull(), F.lit(DELETE)).otherwise(tag)
        frames.append(df.select(
            *[(F.col(f"`{own[name]}`") if name in own else F.lit(None)).cast(types[name])
              .alias(name) for name in (*cols.keys, *cols.left, *cols.right)],
            F.col(EVENT_TIME), tag.alias(JOIN_SIDE)))
    return frames, dead


def _bad_records(plan: JoinPlan, side: int, df: DataFrame, keys: tuple[str, ...]
                 ) -> tuple[DataFrame, tuple[str, DataFrame] | None]:
    """`df` without its records whose key or event time is null, and their dead letters
    (`bad_records`)."""
    from pyspark.sql import functions as F

    join = plan.op.join
    assert join is not None
    name = join.left if side == 0 else join.right
    is_bad: Column = F.col(EVENT_TIME).isNull()
    for key in keys:
        is_bad = is_bad | F.col(f"`{key}`").isNull()
    reason = (f"join {plan.op.id!r}: the {('left', 'right')[side]} input {name!r} has a record "
              f"whose key ({', '.join(keys)}) or event time is null")
    return bad_records(plan.origins[side], df, is_bad, reason, "the join")


def table_load(plan: JoinPlan, slices: Mapping[str, Any]) -> int | None:
    """The load of a table join's `reload:` files table read this epoch, or None (a table
    join's right input is that source, through stateless operators: validation)."""
    origin = plan.origins[1]
    if origin is None or origin.type != "files" or not origin.option("reload"):
        return None
    piece = slices.get(origin.id)
    load = (piece.payload or {}).get("load") if piece is not None else None
    return int(load) if load is not None else None


