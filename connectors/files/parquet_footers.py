"""The schema of local parquet files from their footers, as Spark would infer it, without
asking Spark (`parquet_footer_schema`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql.types import StructType


def parquet_footer_schema(paths: Sequence[str]) -> StructType | None:
    """The schema Spark infers for the local parquet files `paths`, read from their footers
    without asking Spark (which plans a scan for it: ~90 ms a source, every run), or None
    when Spark must say: a file that does not open, files whose columns differ (Spark picks
    one; which one is Spark's business), a nested column, or a column type outside the
    plain ones whose mapping is fixed (Spark's ParquetToSparkSchemaConverter with its
    default settings; tests/connectors/test_files_source.py compares every one of them
    with Spark's answer). Every field is nullable, as Spark's file sources make them."""
    import pyarrow.parquet as pq
    from pyspark.sql.types import StructField, StructType

    found: list[tuple[str, Any]] | None = None
    for path in paths:
        try:
            schema = pq.ParquetFile(path).schema
        except Exception:  # (Spark reports it in its own words)
            return None
        fields = []
        for i in range(len(schema)):
            column = schema.column(i)
            dtype = None if column.max_repetition_level or "." in column.path else \
                _parquet_type(column)
            if dtype is None:
                return None
            fields.append((column.name, dtype))
        if len({n.lower() for n, _ in fields}) != len(fields) or (
                found is not None and found != fields):
            return None
        found = fields
    if not found:
        return None
    return StructType([StructField(n, t, True) for n, t in found])


def _parquet_type(column: Any) -> Any:
    """The Spark type of a flat parquet column (`pyarrow.parquet.ColumnSchema`), or None."""
    from pyspark.sql import types as T

    physical, logical = column.physical_type, column.logical_type
    kind = logical.type
    if kind == "NONE":
        return {"BOOLEAN": T.BooleanType(), "INT32": T.IntegerType(), "INT64": T.LongType(),
                "FLOAT": T.FloatType(), "DOUBLE": T.DoubleType()}.get(physical)
    if kind == "STRING" and physical == "BYTE_ARRAY":
        return T.StringType()
    if kind == "DATE" and physical == "INT32":
        return T.DateType()
    if kind == "DECIMAL" and 0 < column.precision <= 38:
        return T.DecimalType(column.precision, column.scale)
    info = json.loads(logical.to_json())
    if kind == "INT":
        width, signed = info.get("bitWidth"), info.get("isSigned")
        return {(8, True): T.ByteType(), (16, True): T.ShortType(), (32, True): T.IntegerType(),
                (64, True): T.LongType(), (8, False): T.ShortType(),
                (16, False): T.IntegerType(), (32, False): T.LongType(),
                (64, False): T.DecimalType(20, 0)}.get((width, signed))
    if kind == "TIMESTAMP" and physical == "INT64" and info.get("isAdjustedToUTC") and \
            info.get("timeUnit") in ("milliseconds", "microseconds"):
        return T.TimestampType()
    return None
