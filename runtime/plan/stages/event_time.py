"""A source's event time, and the one rule for records that have none.

A record whose `event_time` expression yields null is a bad record, whatever operator reads
it next: with the source's `on_error` it becomes a dead letter (`DEAD_LETTER_COLUMNS`: the
source, where the record was when the source says so (`SourceRead.position`, made a line
by `SourceRead.locate`), the record as read (`SourceRead.raw_record`) or as JSON, and the
reason, naming the field), else the first Spark action that meets it fails the epoch with a
message naming the source and the record (as an undecodable record does, through
`DECODE_ERROR_MARKER`). Either way no keyed operator ever sees a null event time.

An event time that cannot be computed for a record (`to_timestamp` of an unparseable string,
a cast of garbage: errors under Spark's ANSI mode) is the same: the expression is analyzed
with ANSI mode off, where such a value is null, so one bad record becomes a dead letter (or
the one clear failure above) instead of failing the epoch with Spark's error.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from streamer.columns import EVENT_TIME, HIDDEN_PREFIX, TOMBSTONE
from streamer.connectors.base import DECODE_ERROR_MARKER
from streamer.frames import lenient

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from streamer.connectors.base import SourceRead
    from streamer.pipeline.spec import SourceSpec




_NAME = re.compile(r"\s*`?([A-Za-z_][A-Za-z0-9_]*)`?\s*")


def plain_column(event_time: str) -> str | None:
    """The column an `event_time` that is a bare column name names, else None."""
    found = _NAME.fullmatch(event_time)
    return found.group(1) if found else None


def named_columns(event_time: str, columns: list[str]) -> list[str]:
    """Those of `columns` an `event_time` expression names (a null reason shows them)."""
    return [c for c in columns if re.search(rf"(?<![\w.]){re.escape(c)}(?!\w)", event_time)]


def null_text(event_time: str, values: list[tuple[str, str]]) -> str:
    """A null event time's `error` when `event_time` is an expression: which, and the
    (column, value as JSON) it names."""
    shown = ", ".join(f"field {c!r}: {v}" for c, v in values)
    return (f"event time `{event_time}` is null or cannot be computed"
            + (f" ({shown})" if values else ""))


def null_reason(spec: SourceSpec, columns: list[str]) -> Column:
    """The `error` of a dead letter whose event time is null (a column: `field 'ts': null
    event time`) or null or not computable (an expression: which, and the values of the
    `columns` it names: `... (field 't': "yesterday")`)."""
    from pyspark.sql import functions as F

    assert spec.event_time
    plain = plain_column(spec.event_time)
    if plain:
        return F.lit(f"field {plain!r}: null event time")
    named = named_columns(spec.event_time, columns)
    values = [F.concat(F.lit(f"field {c!r}: "), F.regexp_extract(F.to_json(
        F.struct(F.col(f"`{c}`")), {"ignoreNullFields": "false"}), r'^\{"[^"]*":(.*)\}$', 1))
        for c in named]
    return F.concat(F.lit(f"event time `{spec.event_time}` is null or cannot be computed"),
                    *([F.lit(" ("), F.concat_ws(", ", *values), F.lit(")")] if values else []))


def _what(spec: SourceSpec) -> str:
    if _NAME.fullmatch(spec.event_time or ""):
        return "is null"
    return "is null or cannot be computed"


def with_event_time(records: DataFrame, read: SourceRead, spec: SourceSpec
                    ) -> tuple[DataFrame, DataFrame | None]:
    """(`records` with `EVENT_TIME` and without the records whose event time is null, the
    dead letters of those or None). Without `on_error` the records carry a guard that fails
    the first Spark action meeting such a record (no extra Spark job)."""
    from pyspark.sql import functions as F

    assert spec.event_time
    event_time = F.expr(spec.event_time)
    if TOMBSTONE in records.columns:  # a tombstone has no value: its Kafka timestamp
        event_time = F.coalesce(F.col(TOMBSTONE), event_time)
    with lenient(records.sparkSession):  # (withColumn analyzes at once)
        records = records.withColumn(EVENT_TIME, event_time)
    hidden = {c for c in (read.split_column, *(read.position or ()), read.raw_record) if c}
    shown = [c for c in records.columns
             if c not in hidden and not c.startswith(HIDDEN_PREFIX)]
    record = (F.col(read.raw_record) if read.raw_record else F.to_json(
        F.struct(*[F.col(f"`{c}`") for c in shown]),
        {"ignoreNullFields": "false"}))  # the record shows its null event time
    split, offset = ((F.col(read.position[0]).cast("string"),
                      F.col(read.position[1]).cast("string")) if read.position
                     else (F.lit(None).cast("string"), F.lit(None).cast("string")))
    is_null = F.col(EVENT_TIME).isNull()
    dead = None
    if spec.on_error is None:
        records = records.where(F.when(is_null, F.raise_error(_message(
            spec, split, None if read.locate else offset, record))).otherwise(F.lit(True)))
    else:
        dead = records.where(is_null).select(
            F.lit(spec.id).alias("source"), split.alias("split"), offset.alias("offset"),
            record.alias("record"), null_reason(spec, shown).alias("error"))
        if read.locate is not None:
            dead = read.locate(dead)
        records = records.where(~is_null)
    if read.position:
        records = records.drop(*[c for c in (*read.position, read.raw_record)
                                 if c and c != read.split_column])
    return records, dead


def _message(spec: SourceSpec, split: Column, offset: Column | None, record: Column) -> Column:
    """The failure of a record without event time, for a source without `on_error`
    (`offset` None: the source's offsets mean nothing to a user before `locate`)."""
    from pyspark.sql import functions as F

    at = [] if offset is None else [F.lit(" offset "), F.coalesce(offset, F.lit("?"))]
    return F.concat(
        F.lit(f"{DECODE_ERROR_MARKER}source {spec.id!r} read a record whose event time "
              f"{_what(spec)} (`{spec.event_time}`) at split "), F.coalesce(split, F.lit("?")),
        *at, F.lit(": "),
        F.substring(record, 1, 500),
        F.lit("; add on_error: <sink id> to send such records to a dead-letter sink, or give "
              "every record an event time"))
