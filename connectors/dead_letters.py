"""Dead letters a user can act on: the line of a file that failed to decode, and which field
and value failed (`field 'amount': "lots" is not a double`) instead of the whole schema.

Spark's text and CSV readers give a record no line number without a second pass over the
file, so the second pass is made here, only over what failed: a Python task reads each file
that has dead letters once and finds their lines. Each dead letter carries the start byte of
the Spark file block (one partition's part of a large file) it was read in; Spark reads a
block's lines in order, so the n-th dead letter with a given text in a block is the n-th line
with that text in the block, exact even where identical bad lines fill several partitions.
Each input row gives exactly one output row: what the runtime counts stays the same.
"""

from __future__ import annotations

import bisect
import csv
import datetime
import json
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from streamer.text import a_noun

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from streamer.connectors.base import SourceRead

_INTS = {"tinyint": 8, "smallint": 16, "int": 32, "bigint": 64}
_NUMBERS = ("float", "double", "decimal")
#: How many bytes of a file are read at a time while looking for lines.
_CHUNK = 1 << 20



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
            return f"is not {a_noun(kind)}"
        bits = _INTS[kind] - 1
        return None if -(2 ** bits) <= value < 2 ** bits else f"is out of range for {kind}"
    if kind.startswith(_NUMBERS):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return None if ok else f"is not {a_noun(kind.split('(')[0])}"
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
        return f"is not {a_noun(kind.split('(')[0])}"
    if kind == "boolean":
        return None if text.strip().lower() in ("true", "false") else "is not a boolean"
    if kind.startswith("timestamp") or kind == "date":
        return None if _timestamp(text) else f"is not {a_noun(kind)}"
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


def _lines(name: str) -> Iterator[tuple[int, int, str]]:
    """(1-based number, byte position, text) of each line of file `name`; bytes that are not
    UTF-8 read as U+FFFD, as a damaged record's do in `_rows`."""
    import fsspec

    position = 0
    with fsspec.open(name, "rb") as f:
        for number, raw in enumerate(f, start=1):
            yield number, position, raw.decode("utf-8", errors="replace").rstrip("\n").rstrip(
                "\r")
            position += len(raw)


def _block(offset: str | None) -> int:
    """The start byte of the Spark file block a dead letter was read in (its `offset`, as
    the source gave it), 0 when it gives none."""
    try:
        return int(offset or 0)
    except ValueError:
        return 0


def _starts_block(block: int, number: int, position: int) -> bool:
    """Whether the line at `position` is the first line Spark reads in the block starting
    at byte `block`: the file's first line for block 0, else the first line that starts
    after the block's first byte (Hadoop's LineRecordReader leaves a line that starts
    exactly there to the block before)."""
    return number == 1 if block == 0 else position > block


def _number_lines(name: str, rows: list[dict[str, Any]],
                  used: dict[tuple[str, int, str], int]) -> None:
    """Give each row (a dead letter of file `name`, in the order Spark read it) the number
    of its line: the n-th line with its text in its block, for the n-th such row (`used`:
    how many of each were numbered in the task's earlier batches)."""
    blocks = sorted({row["block"] for row in rows})
    wanted = {row["record"] for row in rows if row["record"] is not None}
    first: dict[int, int] = {}
    found: dict[str, list[int]] = {}
    for number, position, text in _lines(name):
        while len(first) < len(blocks) and _starts_block(blocks[len(first)], number, position):
            first[blocks[len(first)]] = number
        if text in wanted:
            found.setdefault(text, []).append(number)
    for row in rows:
        block = row["block"]
        numbers = found.get(row["record"], [])
        if block not in first or not numbers:
            continue
        nth = used.get((name, block, row["record"]), 0)
        used[(name, block, row["record"])] = nth + 1
        at = bisect.bisect_left(numbers, first[block]) + nth
        if at < len(numbers):
            row["offset"] = str(numbers[at])


def _csv_fits(fields: Sequence[tuple[str, str]], values: list[str],
              record: dict[str, Any]) -> bool:
    """Whether a CSV line's `values` may have decoded to `record` (a dead letter's record
    as JSON of its decoded columns): strings equal, numbers and booleans equal, a null from
    an empty or unreadable text; timestamps, dates and decimals are not compared."""
    if len(values) != len(fields):
        return False
    for (name, kind), text in zip(fields, values, strict=True):
        value = record.get(name)
        try:
            if value is None:
                ok = text == "" if kind == "string" else (
                    not text.strip() or text_value_problem(kind, text) is not None)
            elif kind == "string":
                ok = text == str(value)
            elif kind == "boolean":
                ok = text.strip().lower() == str(value).lower()
            elif kind in _INTS:
                ok = int(text.strip()) == value
            elif kind in ("float", "double"):
                ok = math.isclose(float(text), float(value), rel_tol=1e-6)
            else:
                ok = True
        except ValueError:
            ok = False
        if not ok:
            return False
    return True


def _match_decoded(name: str, rows: list[dict[str, Any]], fields: Sequence[tuple[str, str]],
                   delimiter: str, after: dict[tuple[str, int], int]) -> None:
    """As `_number_lines`, for rows whose record is the JSON of a CSV line's decoded columns
    (a null event time's dead letter): within its block, the first line after the previous
    row's (`after`: the last line matched in each block by the task's earlier batches)
    that may have decoded to it."""
    pending: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        pending.setdefault(row["block"], []).append(row)
    records = {id(row): json.loads(row["record"] or "{}") for row in rows}
    blocks, active = sorted(pending), []
    for number, position, text in _lines(name):
        while blocks and _starts_block(blocks[0], number, position):
            active.append((blocks[0], pending[blocks.pop(0)]))
        values = next(csv.reader([text], delimiter=delimiter), []) if active else []
        for block, waiting in active:
            if number > after.get((name, block), 0) and _csv_fits(
                    fields, values, records[id(waiting[0])]):
                waiting.pop(0)["offset"] = str(number)
                after[(name, block)] = number
        active = [(block, waiting) for block, waiting in active if waiting]
        if not active and not blocks:
            return


def explain_batches(batches: Iterator[pa.RecordBatch], fields: Sequence[tuple[str, str]],
                    fmt: str, delimiter: str, lines: bool, reasons: bool = True,
                    ) -> Iterator[pa.RecordBatch]:
    """The `mapInArrow` function of `explain`: dead letters with the line as `offset` and
    the failing field as `error`, one row out per row in."""
    import pyarrow as pa

    used: dict[tuple[str, int, str], int] = {}  # (what the task's earlier batches found)
    after: dict[tuple[str, int], int] = {}
    for batch in batches:
        rows = _rows(batch)
        by_file: dict[str, list[dict[str, Any]]] = {}
        for row in rows if lines else ():
            if row["split"]:
                by_file.setdefault(row["split"], []).append(row)
        for name, found in by_file.items():
            for row in found:  # (no line found: no offset, rather than a byte)
                row["block"], row["offset"] = _block(row["offset"]), None
            try:
                if fmt == "csv" and not reasons:
                    _match_decoded(name, found, fields, delimiter, after)
                else:
                    _number_lines(name, found, used)
            except OSError:
                pass
        for row in rows if reasons else ():
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
            lines: bool = True, reasons: bool = True) -> DataFrame:
    """`dead` (dead letters of records decoded with `schema` from `fmt`, jsonl | csv |
    json) with each record's line in its file as `offset` (`lines`: the split is a file
    and the offset the start byte of the Spark file block it was read in,
    `_metadata.file_block_start`) and, with `reasons`, the field that failed as `error`.
    Without `reasons` (the dead letters of records whose event time is null) a CSV record
    is the JSON of its decoded columns, and found by them.

    `dead` must be in the order Spark read the files, with no shuffle since: the n-th dead
    letter of a text in a block is the n-th line with that text in the block."""
    fields = tuple((f.name, f.dataType.simpleString()) for f in schema.fields)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return explain_batches(batches, fields, fmt, delimiter, lines, reasons)

    from pyspark.sql.types import StructField, StructType

    # (Every column nullable: a line that cannot be found, such as one of a file another
    # process's memory:// holds, leaves its offset null.)
    out = StructType([StructField(f.name, f.dataType, True) for f in dead.schema.fields])
    return dead.mapInArrow(run, out)


def explained(read: SourceRead, schema: StructType, fmt: str,
              position: tuple[str, str] | None, raw: str | None,
              delimiter: str = ",") -> SourceRead:
    """A files source's `read` with dead letters that give the line and the field that
    failed; with an event time (`position`: the file and block columns), what finds the
    line of a record whose event time is null (`SourceRead.locate`), from its text (`raw`:
    the line's column) or, without one, from its decoded columns."""
    if read.dead_letters is not None:
        read.dead_letters = explain(read.dead_letters, schema, fmt, delimiter=delimiter)
    read.position, read.raw_record = position, raw if position else None
    if position is not None:
        def locate(dead: DataFrame) -> DataFrame:
            return explain(dead, schema, fmt, delimiter=delimiter, reasons=False)

        read.locate = locate
    return read
