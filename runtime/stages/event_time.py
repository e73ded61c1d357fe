"""A source's event time, and the one rule for records that have none.

A record whose `event_time` expression yields null is a bad record, whatever operator reads
it next: with the source's `on_error` it becomes a dead letter (`DEAD_LETTER_COLUMNS`: the
source, where the record was when the source says so (`SourceRead.position`), the record
as JSON and the reason), else the first Spark action that meets it fails the epoch with a
message naming the source and the record (as an undecodable record does, through
`DECODE_ERROR_MARKER`). Either way no keyed operator ever sees a null event time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamer.columns import EVENT_TIME, HIDDEN_PREFIX
from streamer.connectors.base import DECODE_ERROR_MARKER

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from streamer.connectors.base import SourceRead
    from streamer.pipeline.spec import SourceSpec


def null_reason(spec: SourceSpec) -> str:
    """The `error` of a dead letter whose event time is null."""
    return f"event time is null: `{spec.event_time}`"


def with_event_time(records: DataFrame, read: SourceRead, spec: SourceSpec
                    ) -> tuple[DataFrame, DataFrame | None]:
    """(`records` with `EVENT_TIME` and without the records whose event time is null, the
    dead letters of those or None). Without `on_error` the records carry a guard that fails
    the first Spark action meeting such a record (no extra Spark job)."""
    from pyspark.sql import functions as F

    assert spec.event_time
    records = records.withColumn(EVENT_TIME, F.expr(spec.event_time))
    hidden = {c for c in (read.split_column, *(read.position or ())) if c}
    shown = [c for c in records.columns
             if c not in hidden and not c.startswith(HIDDEN_PREFIX)]
    record = F.to_json(F.struct(*[F.col(f"`{c}`") for c in shown]),
                       {"ignoreNullFields": "false"})  # the record shows its null event time
    split, offset = ((F.col(read.position[0]).cast("string"),
                      F.col(read.position[1]).cast("string")) if read.position
                     else (F.lit(None).cast("string"), F.lit(None).cast("string")))
    is_null = F.col(EVENT_TIME).isNull()
    dead = None
    if spec.on_error is None:
        records = records.where(F.when(is_null, F.raise_error(_message(
            spec, split, offset, record))).otherwise(F.lit(True)))
    else:
        dead = records.where(is_null).select(
            F.lit(spec.id).alias("source"), split.alias("split"), offset.alias("offset"),
            record.alias("record"), F.lit(null_reason(spec)).alias("error"))
        records = records.where(~is_null)
    if read.position:
        records = records.drop(*[c for c in read.position if c != read.split_column])
    return records, dead


def _message(spec: SourceSpec, split: Column, offset: Column, record: Column) -> Column:
    """The failure of a record without event time, for a source without `on_error`."""
    from pyspark.sql import functions as F

    return F.concat(
        F.lit(f"{DECODE_ERROR_MARKER}source {spec.id!r} read a record whose event time is "
              f"null (`{spec.event_time}`) at split "), F.coalesce(split, F.lit("?")),
        F.lit(" offset "), F.coalesce(offset, F.lit("?")), F.lit(": "),
        F.substring(record, 1, 500),
        F.lit("; add on_error: <sink id> to send such records to a dead-letter sink, or give "
              "every record an event time"))
