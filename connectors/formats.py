"""Decoding helpers shared by sources, and ISO rendering of timestamps shared by sinks.

A source that can meet an undecodable record parses it with Spark's PERMISSIVE mode into a
corrupt-record column, then calls `guard_or_split`: with `on_error` the bad rows become dead
letters, without it the first Spark action over the records fails with a message that names
the source, split and offset (the runtime turns `DECODE_ERROR_MARKER` into a `DecodeError`).
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from streamer.connectors.base import DECODE_ERROR_MARKER, SourceRead
from streamer.connectors.exceptions import ConnectorError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from streamer.pipeline.spec import SourceSpec

#: Name of the corrupt-record column while decoding; not a valid user column in practice.
CORRUPT_COLUMN = "__streamer_corrupt_record"
# Helper columns while decoding, named so that they cannot clash with the user's columns.
_VALUE, _SPLIT, _OFFSET = "__streamer_value", "__streamer_split", "__streamer_offset"
#: Undecodable records are quoted in error messages up to this many characters.
MAX_RECORD_CHARS = 500


def column(name: str) -> Column:
    """A reference to the top-level column `name`, whatever characters it contains."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _quoted_record(record: Column) -> Column:
    """The raw record, cut to `MAX_RECORD_CHARS` so a huge line cannot flood the message."""
    from pyspark.sql import functions as F

    return (F.when(F.length(record) > MAX_RECORD_CHARS,
                   F.concat(F.substring(record, 1, MAX_RECORD_CHARS), F.lit("...")))
            .otherwise(record))


#: Columns built by `_cached`, by what they were built from.
_COLUMNS: dict[tuple[Any, ...], Any] = {}


def _cached(key: tuple[Any, ...], build: Any) -> Any:
    """`build()`, once per `key` in this process. Building PySpark Columns costs a py4j round
    trip per function (a JSON decode's ~860, measured ~50 ms a slice); an unresolved Column
    belongs to no session or DataFrame, so a source's Columns serve all its slices."""
    found = _COLUMNS.get(key)
    if found is None:
        if len(_COLUMNS) >= 256:
            _COLUMNS.clear()
        found = _COLUMNS[key] = build()
    return found


def guard_or_split(df: DataFrame, spec: SourceSpec, corrupt_col: str, split_col: str,
                   offset_col: str, record_col: str, *, columns: Sequence[str] | None = None,
                   reason: str | None = None, raw_file_scan: bool = False) -> SourceRead:
    """Split a PERMISSIVE-parsed DataFrame into decoded records and dead letters.

    `df` has the decoded columns plus `corrupt_col` (non-null = undecodable), `split_col`,
    `offset_col` and `record_col` (the raw text). `columns` are the decoded columns to keep
    (default: every other column). With `spec.on_error` the bad rows are returned as dead
    letters whose `error` is `reason` (default: "cannot decode as {a: int, b: string}" with
    the decoded columns' types); without it the records carry a guard that fails the first
    Spark action that meets a bad record (no extra Spark job).

    `raw_file_scan=True` is for `df` read straight from CSV files by Spark's PERMISSIVE
    reader (atomic column types only): every filter then needs every decoded column.
    Otherwise Spark's reader would parse only the columns a later query uses, and whether a
    short or long line counts as corrupt would depend on that query (a count of dead letters
    would even be refused: UNSUPPORTED_FEATURE.QUERY_ONLY_CORRUPT_RECORD_COLUMN).
    """
    helpers = {corrupt_col, split_col, offset_col, record_col}
    keep = list(columns) if columns is not None else [c for c in df.columns if c not in helpers]
    if spec.on_error is not None and reason is None:
        types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
        reason = "cannot decode as {" + ", ".join(f"{c}: {types[c]}" for c in keep) + "}"
    names = (corrupt_col, split_col, offset_col, record_col)
    key = ("split", spec.id, spec.on_error, names, tuple(keep), reason, raw_file_scan)
    cols = _cached(key, lambda: _split_columns(spec, names, keep, reason, raw_file_scan))
    if spec.on_error is None:
        return SourceRead(records=df.where(cols["guard"]).select(*cols["keep"]))
    return SourceRead(records=df.where(cols["good"]).select(*cols["keep"]),
                      dead_letters=df.where(cols["bad"]).select(*cols["dead"]))


def _split_columns(spec: SourceSpec, names: tuple[str, str, str, str], keep: list[str],
                   reason: str | None, raw_file_scan: bool) -> dict[str, Any]:
    """The Columns of `guard_or_split`."""
    from pyspark.sql import functions as F

    corrupt_col, split_col, offset_col, record_col = names
    corrupt = column(corrupt_col)
    is_bad, is_good = corrupt.isNotNull(), corrupt.isNull()
    if raw_file_scan:
        # A tautology over every decoded column that Spark's optimizer cannot fold away.
        every_column = F.hash(*[column(c) for c in keep]) >= F.lit(-(2**31))
        is_bad, is_good = is_bad & every_column, is_good & every_column
    record = column(record_col).cast("string")
    kept = [column(c) for c in keep]
    if spec.on_error is None:
        message = F.concat(
            F.lit(f"{DECODE_ERROR_MARKER}source {spec.id!r} cannot decode the record at split "),
            column(split_col).cast("string"), F.lit(" offset "),
            column(offset_col).cast("string"), F.lit(": "), _quoted_record(record),
            F.lit("; add on_error: <sink id> to send such records to a dead-letter sink"))
        return {"guard": F.when(is_bad, F.raise_error(message)).otherwise(F.lit(True)),
                "keep": kept}
    dead = [F.lit(spec.id).alias("source"), column(split_col).cast("string").alias("split"),
            column(offset_col).cast("string").alias("offset"), record.alias("record"),
            F.lit(reason).alias("error")]
    return {"good": is_good, "bad": is_bad, "keep": kept, "dead": dead}


def decode_json_lines(spark: SparkSession, df: DataFrame, schema: StructType,
                      spec: SourceSpec, extra: Sequence[str] = (),
                      local: bool = False, blank_is_record: bool = False) -> SourceRead:
    """Decode JSON objects, one per row of `df(value string, split string, offset string)`.
    Columns of `df` named in `extra` are carried through to the decoded records. `local`:
    `df` is a local relation (`runtime.plan.local`), to be decoded by plain projections, which
    Spark folds into a local relation again (it does not fold a `Generate`).

    Blank lines are skipped, unless `blank_is_record` (a Kafka value: every value is a
    record, an empty one and a null one, a tombstone, too). A value that is not a JSON object,
    or whose fields do not fit `schema` (e.g. "x" for an int column), is undecodable: a dead
    letter with `on_error`, else a failure of the first Spark action (see `guard_or_split`).
    """
    if CORRUPT_COLUMN in schema.fieldNames():
        msg = (f"source {spec.id!r} has a column named {CORRUPT_COLUMN!r}, which streamer "
               "uses while decoding; rename the column")
        raise ConnectorError(msg)
    nonblank, parse, flatten = _cached(("json", schema.json(), tuple(extra), local),
                                       lambda: _json_columns(schema, extra, local))
    flat = (df if blank_is_record else df.where(nonblank)).select(*parse).select(*flatten)
    reason = None
    if extra:  # the carried columns are not part of what failed to decode
        reason = "cannot decode as {" + ", ".join(
            f"{f.name}: {f.dataType.simpleString()}" for f in schema.fields) + "}"
    return guard_or_split(flat, spec, CORRUPT_COLUMN, _SPLIT, _OFFSET, _VALUE,
                          columns=[*schema.fieldNames(), *extra], reason=reason)


def _json_columns(schema: StructType, extra: Sequence[str],
                  local: bool) -> tuple[Column, list[Column], list[Column]]:
    """The Columns of `decode_json_lines`: its blank-line filter, the projection that
    parses and the one that flattens."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    with_corrupt = StructType([*schema.fields, StructField(CORRUPT_COLUMN, StringType())])
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}
    parsed = F.from_json(F.col("value"), with_corrupt, options)
    carried = [F.col("value").alias(_VALUE), F.col("split").cast("string").alias(_SPLIT),
               F.col("offset").cast("string").alias(_OFFSET), *[F.col(c) for c in extra]]
    # `inline(array(struct(...)))` puts the parse in a Generate node, which Spark does not push
    # the corrupt-record filter through; a plain projection would be copied into the filter
    # and every line parsed twice. A local relation takes the plain projection (Spark folds
    # it; the few rows are parsed twice).
    parse = ([parsed.alias("r"), *carried] if local else
             [F.inline(F.array(F.struct(parsed.alias("r"), *carried)))])
    # A JSON `null`, a bare scalar, an empty or a null value parse to a null struct:
    # undecodable too.
    corrupt = F.coalesce(F.col("r").getField(CORRUPT_COLUMN),
                         F.when(F.col("r").isNull(), F.coalesce(F.col(_VALUE), F.lit(""))))
    flatten = [*[F.col("r").getField(n).alias(n) for n in schema.fieldNames()],
               corrupt.alias(CORRUPT_COLUMN), F.col(_VALUE), F.col(_SPLIT), F.col(_OFFSET),
               *[F.col(c) for c in extra]]
    return F.trim(F.col("value")) != "", parse, flatten


def iso_timestamp(ts: Column) -> Column:
    """A timestamp as an ISO-8601 UTC string, `2026-01-01T00:01:00Z` or `...:00.5Z`.

    Assumes the session time zone is UTC (streamer's default).
    """
    from pyspark.sql import functions as F

    text = F.date_format(ts, "yyyy-MM-dd'T'HH:mm:ss.SSSSSS")
    return F.concat(F.regexp_replace(text, r"\.?0+$", ""), F.lit("Z"))


def _as_iso(col: Column, dtype: Any) -> Column | None:
    """`col` with every timestamp/date inside it rendered as text, or None if it has none."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import (
        ArrayType,
        DateType,
        MapType,
        StructType,
        TimestampNTZType,
        TimestampType,
    )

    if isinstance(dtype, TimestampType | TimestampNTZType):
        return iso_timestamp(col)
    if isinstance(dtype, DateType):
        return F.date_format(col, "yyyy-MM-dd")
    if isinstance(dtype, ArrayType):
        element = dtype.elementType
        if _as_iso(F.lit(None).cast(element), element) is None:
            return None
        return F.transform(col, lambda x: _as_iso(x, element))  # type: ignore[arg-type,return-value]
    if isinstance(dtype, MapType):
        value_type = dtype.valueType
        if _as_iso(F.lit(None).cast(value_type), value_type) is None:
            return None
        return F.transform_values(col, lambda _, v: _as_iso(v, value_type))  # type: ignore
    if isinstance(dtype, StructType):
        parts = [(f.name, _as_iso(col.getField(f.name), f.dataType)) for f in dtype.fields]
        if all(p is None for _, p in parts):
            return None
        return F.when(col.isNull(), F.lit(None)).otherwise(F.struct(*[
            (p if p is not None else col.getField(n)).alias(n) for n, p in parts]))
    return None


def not_utc(spark: SparkSession) -> str | None:
    """Why Spark's session time zone is not UTC, or None when it is. Paths that compute
    Spark's text or instants outside Spark (Arrow decoding, task-written jsonl) assume UTC."""
    zone = str(spark.conf.get("spark.sql.session.timeZone", "UTC") or "").strip()
    if zone in ("UTC", "Etc/UTC", "Z", "+00:00"):
        return None
    return f"Spark's session time zone is {zone}, not UTC"


def timestamps_as_iso(df: DataFrame) -> DataFrame:
    """Render timestamps as ISO-8601 UTC strings and dates as `yyyy-MM-dd`, also inside
    arrays, maps and structs.

    Used where values leave Spark as text (jsonl/csv files, console, `streamer test`) so that
    every output shows time the same way whatever the writer's defaults.
    """
    converted = []
    changed = False
    for field in df.schema.fields:
        ref = column(field.name)
        iso = _as_iso(ref, field.dataType)
        converted.append(ref if iso is None else iso.alias(field.name))
        changed |= iso is not None
    return df.select(*converted) if changed else df


def iso_datetime(value: datetime.datetime) -> str:
    """A Python datetime in the same ISO-8601 UTC form as `iso_timestamp` (naive = UTC)."""
    if value.tzinfo is not None:
        value = value.astimezone(datetime.UTC).replace(tzinfo=None)
    return value.strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0").rstrip(".") + "Z"


def json_value(value: Any) -> Any:
    """A value collected from Spark (via Arrow) as plain JSON data.

    Timestamps become ISO-8601 UTC strings, dates `yyyy-MM-dd`, decimals int or float,
    binary base64; structs and maps become dicts and arrays lists, converted all the way down.
    """
    if isinstance(value, datetime.datetime):
        return iso_datetime(value)
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    return value


def json_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Every row of an Arrow table collected from Spark (ISO timestamps) as JSON values."""
    return [json_value(row) for row in table.to_pylist(maps_as_pydicts="lossy")]
