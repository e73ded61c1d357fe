"""Dead letters a user can act on: the line of a file that failed to decode, and which field
and value failed (`field 'amount': "lots" is not a double`) instead of the whole schema.

Spark's text and CSV readers give a record no line number without a second pass over the
file, so the second pass is made here, only over what failed: a Python task reads each file
that has dead letters once and finds their lines (identical lines decode alike, so every
line with a bad record's text is one of its dead letters). Each input row gives exactly one
output row: what the runtime counts stays the same.
"""

from __future__ import annotations

import csv
import datetime
import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

_INTS = {"tinyint": 8, "smallint": 16, "int": 32, "bigint": 64}
_NUMBERS = ("float", "double", "decimal")
#: How many bytes of a file are read at a time while looking for lines.
_CHUNK = 1 << 20


def _a(kind: str) -> str:
    return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"


def _timestamp(text: str) -> bool:
    try:
        datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def json_value_problem(kind: str, value: Any) -> str | None:
    """Why a JSON value cannot be a Spark `kind` (a simple type name), or None if it can."""
    if value is None or kind == "string" or kind.startswith(("array", "map", "struct")):
        return None
    if kind in _INTS:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"is not {_a(kind)}"
        bits = _INTS[kind] - 1
        return None if -(2 ** bits) <= value < 2 ** bits else f"is out of range for {kind}"
    if kind.startswith(_NUMBERS):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return None if ok else f"is not {_a(kind.split('(')[0])}"
    if kind == "boolean":
        return None if isinstance(value, bool) else "is not a boolean"
    if kind.startswith("timestamp"):
        ok = (isinstance(value, int | float) and not isinstance(value, bool)) or (
            isinstance(value, str) and _timestamp(value))
        return None if ok else "is not a timestamp"
    if kind == "date":
        ok = isinstance(value, str) and _timestamp(value)
        return None if ok else "is not a date (yyyy-MM-dd)"
    return None


def text_value_problem(kind: str, text: str) -> str | None:
    """Why a CSV field's text cannot be a Spark `kind`, or None if it can (or may)."""
    if text == "" or kind == "string":
        return None
    try:
        if kind in _INTS:
            return json_value_problem(kind, int(text.strip()))
        if kind.startswith(_NUMBERS):
            float(text)
            return None
    except ValueError:
        return f"is not {_a(kind.split('(')[0])}"
    if kind == "boolean":
        return None if text.strip().lower() in ("true", "false") else "is not a boolean"
    if kind.startswith("timestamp") or kind == "date":
        return None if _timestamp(text) else f"is not {_a(kind)}"
    return None


def json_problem(fields: Sequence[tuple[str, str]], record: str | None) -> str | None:
    """The first field of a JSON record that does not fit its type, as the dead letter's
    `error`; why the record is not a JSON object; or None (no better reason found)."""
    if record is None or not record.strip():
        return "empty record (no JSON object)"
    try:
        value = json.loads(record)
    except ValueError as exc:
        return f"not JSON: {exc}"
    if not isinstance(value, dict):
        return f"not a JSON object but {type(value).__name__} {record.strip()[:40]}"
    for name, kind in fields:
        problem = json_value_problem(kind, value.get(name))
        if problem:
            return f"field {name!r}: {json.dumps(value[name])[:100]} {problem}"
    return None


def csv_problem(fields: Sequence[tuple[str, str]], record: str | None,
                delimiter: str) -> str | None:
    """As `json_problem`, for a CSV line."""
    if record is None:
        return None
    values = next(csv.reader([record], delimiter=delimiter), [])
    if len(values) != len(fields):
        return (f"has {len(values)} fields, the schema has {len(fields)} "
                f"({', '.join(name for name, _ in fields)})")
    for (name, kind), text in zip(fields, values, strict=True):
        problem = text_value_problem(kind, text)
        if problem:
            return f"field {name!r}: {json.dumps(text)[:100]} {problem}"
    return None


def _line_numbers(name: str, wanted: set[str]) -> dict[str, list[int]]:
    """The 1-based numbers of the lines of file `name` whose text is in `wanted`."""
    import fsspec

    found: dict[str, list[int]] = {}
    with fsspec.open(name, "rb") as f:
        for number, raw in enumerate(f, start=1):
            text = raw.decode("utf-8", errors="replace").rstrip("\n").rstrip("\r")
            if text in wanted:
                found.setdefault(text, []).append(number)
    return found


def explain_batches(batches: Iterator[pa.RecordBatch], fields: Sequence[tuple[str, str]],
                    fmt: str, delimiter: str, lines: bool) -> Iterator[pa.RecordBatch]:
    """The `mapInArrow` function of `explain`: dead letters with the line as `offset` and
    the failing field as `error`, one row out per row in."""
    import pyarrow as pa

    for batch in batches:
        rows = _rows(batch)
        if lines:
            by_file: dict[str, set[str]] = {}
            for row in rows:
                if row["split"] and row["record"] is not None:
                    by_file.setdefault(row["split"], set()).add(row["record"])
            numbers: dict[str, dict[str, list[int]]] = {}
            for name, wanted in by_file.items():
                try:
                    numbers[name] = _line_numbers(name, wanted)
                except OSError:
                    numbers[name] = {}
            used: dict[tuple[str, str], int] = {}
            for row in rows:
                key = (row["split"], row["record"])
                found = numbers.get(row["split"] or "", {}).get(row["record"], [])
                if found:
                    nth = used.get(key, 0)
                    used[key] = nth + 1
                    row["offset"] = str(found[min(nth, len(found) - 1)])
        for row in rows:
            better = (csv_problem(fields, row["record"], delimiter) if fmt == "csv"
                      else json_problem(fields, row["record"]))
            if better:
                row["error"] = better
        names = batch.schema.names
        columns = [batch.column(i) if name == "record" else pa.array(
            [row[name] for row in rows], batch.schema.field(i).type)
            for i, name in enumerate(names)]  # (the record's bytes kept as they were)
        yield pa.RecordBatch.from_arrays(columns, schema=batch.schema)


def _rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The batch's rows as dicts, the record as text even where its bytes are not UTF-8 (a
    damaged line: Spark keeps its bytes; those that are not UTF-8 read as U+FFFD, as the
    file's lines do in `_line_numbers`)."""
    import pyarrow as pa

    names = batch.schema.names
    records = [None if b is None else b.decode("utf-8", errors="replace")
               for b in batch.column(names.index("record")).cast(pa.binary()).to_pylist()]
    others = batch.select([n for n in names if n != "record"]).to_pylist()
    return [{**row, "record": record} for row, record in zip(others, records, strict=True)]


def explain(dead: DataFrame, schema: StructType, fmt: str, *, delimiter: str = ",",
            lines: bool = True) -> DataFrame:
    """`dead` (dead letters of records decoded with `schema` from `fmt`, jsonl | csv |
    json) with each record's line in its file as `offset` (`lines`: the split is a file)
    and the field that failed as `error`."""
    fields = tuple((f.name, f.dataType.simpleString()) for f in schema.fields)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return explain_batches(batches, fields, fmt, delimiter, lines)

    return dead.mapInArrow(run, dead.schema)
