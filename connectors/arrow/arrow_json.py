r"""JSON lines decoded by Arrow's JSON reader where the result is certainly Spark's.

A `files` source of JSON lines is decoded by Spark's `from_json` (`connectors.formats`),
which is what defines a record's values and whether it is a bad record. Arrow's reader is
several times faster, and for a file whose every line passes the checks below it gives the
same values, so a keyed stage's input can be decoded in a Python task instead
(`runtime.arrow.arrow_input`). Where a check fails, `Refused` says why and the file is decoded by
Spark as before: a bad record still becomes a dead letter (or an error) exactly as it would.
A file whose lines are all of one compact shape skips Arrow's JSON reader and the line checks:
`arrow_json_shaped` gives the table that reader would, in about half its time.

What is checked, and why (each difference found by trying both readers):
- the bytes are UTF-8, and a `\r` occurs only in a `\r\n` line end (Spark's text reader
  also ends lines at a lone `\r`);
- every line is blank (spaces only: Spark skips it) or its first and last characters other
  than spaces and tabs are `{` and `}`: Arrow accepts a bare `null` or scalar as a row (and
  crashes on a top-level `null`), Spark makes it a bad record;
- no `}` is followed by `{` on a line, blanks between: Arrow reads two objects on one line as
  two rows where Spark has one line; with this and the row count equal to the non-blank lines,
  every row is exactly one line;
- Arrow's conversion of each value to the declared type succeeded, with the types limited to
  those where its conversion is Spark's: bigint and int (JSON integers only, in range: Spark
  refuses `1.0`, `1e2` and strings there too), double (JSON numbers and Arrow's `NaN`,
  `Infinity`, `-Infinity`, which Spark's default `allowNonNumericNumbers` also reads; Arrow
  refuses the quoted forms Spark would read, and numbers past the double range, so those
  files go to Spark), string (JSON strings only: Spark would give any other value's text),
  boolean (`true`/`false` only) and timestamp, read as text and accepted only in ISO-8601
  form (`2026-01-01T00:00:00[.ffffff][Z|+hh:mm]`, or a space for `T`) that Spark's parser reads
  the same way, a value without a zone in UTC (the planner takes this path only while
  Spark's session time zone is UTC);
- no field occurs twice in an object (Arrow refuses it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from streamer.connectors.arrow.arrow_json_shaped import read_shaped
from streamer.exceptions import ArrowRefused as Refused

#: Spark simple type names this decoder takes, with the Arrow type it reads each as.
TYPES = ("bigint", "int", "double", "string", "boolean", "timestamp")
#: A `}` followed by `{` on one line.
_TWO_OBJECTS = re.compile(rb"\}[ \t]*\{")
#: An ISO-8601 timestamp Spark's and Arrow's parsers read to the same instant.
ISO = (r"^[1-9][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[T ]([01][0-9]|2[0-3]):[0-5][0-9]"
        r":[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?$")


def arrow_type(kind: str) -> Any:
    """The Arrow type a column of Spark type `kind` is read as (a timestamp as text)."""
    import pyarrow as pa

    return {"bigint": pa.int64(), "int": pa.int32(), "double": pa.float64(),
            "string": pa.string(), "boolean": pa.bool_(), "timestamp": pa.string()}[kind]


def check_utf8(data: bytes) -> None:
    """`Refused` unless `data` is valid UTF-8 (Spark would read replacement characters)."""
    import pyarrow as pa

    try:  # one string over the bytes, without a copy: its cast validates the UTF-8
        offsets = pa.py_buffer(pa.array([0, len(data)], pa.int64()).buffers()[1])
        pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, pa.py_buffer(data)]).cast(
            pa.large_string())
    except pa.ArrowInvalid as exc:
        msg = "the file is not valid UTF-8"
        raise Refused(msg) from exc


def _lines(data: bytes) -> int:
    """The number of lines Spark decodes (non-blank), or `Refused` when a line is one whose
    Arrow decode could differ from Spark's."""
    import numpy as np

    if b"\r" in data and data.count(b"\r") != data.count(b"\r\n"):
        msg = "a line ends with a lone carriage return"
        raise Refused(msg)
    if _TWO_OBJECTS.search(data):
        msg = "a line holds more than one JSON object (or a '}' and a '{' meet)"
        raise Refused(msg)
    buf = np.frombuffer(data, dtype=np.uint8)
    breaks = np.flatnonzero(buf == 10)
    starts = np.concatenate(([0], breaks + 1))
    ends = np.concatenate((breaks, [len(buf)]))  # exclusive; a \r before it is blank below
    keep = starts < ends  # (an empty line, and the piece after a final line break)
    starts, ends = starts[keep], ends[keep]
    if not len(starts):
        return 0
    if (buf[starts] == ord("{")).all() and (buf[ends - 1] == ord("}")).all():
        return len(starts)  # (every line is '{...}' with nothing around it: the usual case)
    blank = (buf == 32) | (buf == 9) | (buf == 13)
    solid = np.flatnonzero(~blank)  # positions of the other characters, ascending
    first_at = np.searchsorted(solid, starts)  # the first solid character at or after start
    last_at = np.searchsorted(solid, ends) - 1  # the last solid character before end
    has = first_at < len(solid)
    has[has] = solid[first_at[has]] < ends[has]
    tabs = np.flatnonzero(buf == 9)
    if len(tabs) and not has.all():  # Spark skips a line of spaces, not one with a tab
        line_of = np.searchsorted(starts, tabs, side="right") - 1
        if (~has[line_of]).any():
            msg = "a line holds only blanks and a tab, a bad record to Spark"
            raise Refused(msg)
    firsts = buf[solid[first_at[has]]]
    lasts = buf[solid[last_at[has]]]
    if (firsts != ord("{")).any() or (lasts != ord("}")).any():
        msg = "a line is not a JSON object ('{' ... '}')"
        raise Refused(msg)
    return int(has.sum())


def decode(data: bytes, columns: Sequence[tuple[str, str]], records: int | None = None) -> Any:
    """The records of the JSON lines `data` as an Arrow table of `columns` (name, Spark
    type), timestamps as `timestamp[us, UTC]`, exactly as Spark's `from_json` would give
    them; `Refused` when that is not certain. `records`: `data` is that many values joined
    by line breaks, each a record (a Kafka value: a blank one is a bad record to Spark)."""
    import pyarrow as pa
    import pyarrow.json as pj

    check_utf8(data)
    schema = pa.schema([(name, arrow_type(kind)) for name, kind in columns])
    # Lines of one shape: Arrow's table by a faster route, each row one line (the module).
    table = read_shaped(data, schema)
    expected = _lines(data) if table is None else table.num_rows
    if records is not None and expected != records:
        msg = f"{records - expected} of {records} values are blank (bad records to Spark)"
        raise Refused(msg)
    if not expected:
        return with_timestamps(schema.empty_table(), columns)
    if table is None:
        try:
            table = pj.read_json(
                pa.py_buffer(data), read_options=pj.ReadOptions(use_threads=False,
                                                                block_size=1 << 24),
                parse_options=pj.ParseOptions(explicit_schema=schema,
                                              newlines_in_values=False,
                                              unexpected_field_behavior="ignore"))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            msg = f"Arrow's reader: {str(exc)[:200]}"
            raise Refused(msg) from exc
        if table.num_rows != expected:
            msg = f"{table.num_rows} objects on {expected} lines"
            raise Refused(msg)
    for name, kind in columns:
        if kind == "timestamp" and not plain_iso(table.column(name)):
            msg = f"a value of timestamp column {name!r} is not plain ISO-8601"
            raise Refused(msg)
    return with_timestamps(table.select([n for n, _ in columns]), columns)


def plain_iso(column: Any) -> bool:
    """Whether every value of string column `column` (nulls aside) is in a form `ISO`
    takes: seen on its bytes where each chunk has one width (`_fixed_iso`), else by `ISO`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    if all(_fixed_iso(c) for c in chunks):
        return True
    ok = pc.match_substring_regex(column, ISO)
    return not pc.any(pc.invert(ok)).as_py()  # (null stays null: `any` skips it)


#: The digits of `yyyy-MM-ddTHH:mm:ss`, by position.
_DIGITS = (0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18)
#: (first position, lowest, highest) of the two-digit fields: month, day, hour, minute,
#: second (as `ISO` bounds them).
_FIELDS = ((5, 1, 12), (8, 1, 31), (11, 0, 23), (14, 0, 59), (17, 0, 59))


def _fixed_iso(text: Any) -> bool:
    """True when every value of string array `text` is certainly matched by `ISO`, seen
    on its bytes as a table of one width: no null, `yyyy-MM-dd[T ]HH:mm:ss`, then `.` and
    1-6 digits or nothing, then `Z` or nothing, the same form in every row (what a
    writer's output is). False only means that `ISO` must decide."""
    import numpy as np
    import pyarrow as pa

    if text.type != pa.string() or text.null_count or not len(text):
        return False
    offsets = np.frombuffer(text.buffers()[1], dtype=np.int32, count=len(text) + 1,
                            offset=text.offset * 4)
    width = int(offsets[1] - offsets[0])
    if width < 19 or int(offsets[-1] - offsets[0]) != width * len(text) or \
            not (np.diff(offsets) == width).all():
        return False
    rows = np.frombuffer(text.buffers()[2], dtype=np.uint8, count=width * len(text),
                         offset=int(offsets[0])).reshape(len(text), width)
    zone = bool(rows[0, -1] == ord("Z"))
    digits = width - 19 - zone - 1  # (after the point)
    if not (digits == -1 or 1 <= digits <= 6):
        return False
    places = [*_DIGITS, *range(20, 20 + max(digits, 0))]
    marks = {4: b"-", 7: b"-", 13: b":", 16: b":", **({19: b"."} if digits > 0 else {}),
             **({width - 1: b"Z"} if zone else {})}
    if not (rows[:, places] - np.uint8(48) <= 9).all() or (rows[:, 0] == ord("0")).any():
        return False
    if not all((rows[:, at] == mark[0]).all() for at, mark in marks.items()):
        return False
    if not ((rows[:, 10] == ord("T")) | (rows[:, 10] == ord(" "))).all():
        return False
    for at, low, high in _FIELDS:
        value = (rows[:, at] - 48).astype(np.int16) * 10 + (rows[:, at + 1] - 48)
        if value.min() < low or value.max() > high:
            return False
    return True


def with_timestamps(table: Any, columns: Sequence[tuple[str, str]]) -> Any:
    """`table` with its ISO-8601 timestamp text as `timestamp[us, UTC]` (no zone: UTC)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for i, (name, kind) in enumerate(columns):
        if kind != "timestamp":
            continue
        text = table.column(name)
        if text.null_count < len(text):
            # Arrow's ISO-8601 parser takes the forms `ISO` lets through; a value without a
            # zone is UTC, as Spark reads it in a UTC session.
            zoned = text
            if not pc.all(pc.ends_with(text, "Z")).as_py():  # (`all` skips nulls)
                zoned = pc.if_else(pc.match_substring_regex(
                    text, r"(Z|[+-][0-9]{2}:[0-9]{2})$"), text,
                    pc.binary_join_element_wise(text, "Z", ""))
            try:
                values = pc.cast(zoned, pa.timestamp("us", tz="UTC"))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                msg = f"timestamp column {name!r}: {str(exc)[:200]}"
                raise Refused(msg) from exc
        else:
            values = pa.nulls(len(text), pa.timestamp("us", tz="UTC"))
        table = table.set_column(i, name, values)
    return table
