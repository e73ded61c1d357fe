r"""JSON lines of one shape, split by Arrow's CSV reader where that gives Arrow's JSON table.

Arrow's JSON reader (`arrow_json.decode`) was most of a stateless JSON task's time: 80 ms of
about 200 for a 15 MB, 200 k-line file. Files written by a program usually have every line
in one shape: the same fields in the same order, no blanks between tokens, strings without
escapes. Such a line split at its commas is one `"key":value` per column, and Arrow's CSV
reader (quotes off) splits 15 MB in about 17 ms; the values are then slices of those columns
and, for numbers, Arrow's casts. `read_shaped` does that, and says None (Arrow's JSON reader
decides, as before) wherever it is not certain to give exactly the table Arrow's JSON reader
gives with the same explicit schema. It is certain when:

- no byte is a backslash (no escapes) or a control character other than the line breaks
  (JSON strings may not hold them raw, and Arrow's CSV reader would end a line at `\r`);
- every line has the first line's fields, in its order: `{`, then `"key":value` columns
  separated by `,`, then `}`, nothing around them (no blanks), no key twice; a value is a
  string (`"`, bytes without `"`, `"`) or a JSON number (`-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?
  \d+)?`); anything else (`null`, `true`, a nested value, a comma inside a string: a row
  of another width) is not certain. Each row's quotes are its fields' own: the file holds as
  many `"` as the first line's shape times the lines, and each row has those;
- each field the schema names is a string for a `string` column (timestamps are read as
  text) and a number for a `bigint` / `int` (integers only) or `double` column; fields the
  schema does not name are left out of the table, as Arrow's JSON reader leaves them, but
  their numbers are checked as it parses them (within the double range); a schema column no
  field names is null, as in Arrow's table;
- the casts succeed (an integer out of range: Arrow's JSON reader refuses it too) and give no
  infinity (Arrow's JSON reader refuses a number past the double range; the cast rounds it).

Arrow's JSON reader and the cast convert number text with the same parser; the tests
(tests/connectors/test_arrow_json_shaped.py) compare the two tables on generated files.
"""

from __future__ import annotations

import re
from typing import Any

#: A JSON integer, and a JSON number.
_INTEGER = r"^-?(0|[1-9][0-9]*)$"
_NUMBER = r"^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$"
#: A field of the first line: its key, and whether its value opens with a quote.
_FIELD = re.compile(rb'"([^"]*)":(")?')
#: A slice's end past any value (Arrow's default end fails on binary columns).
_END = 2**31 - 1


def read_shaped(data: bytes, schema: Any) -> Any:
    """The table Arrow's JSON reader gives for the JSON lines `data` (UTF-8: checked by the
    caller) with explicit schema `schema` (of int64, int32, float64 and string fields, others
    are never certain), one row per non-empty line, or None when that is not certain (see
    the module)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv

    fields = _template(data.partition(b"\n")[0])
    if fields is None:
        return None
    buf = np.frombuffer(data, dtype=np.uint8)
    if (buf == 92).any() or np.count_nonzero(buf < 32) != np.count_nonzero(buf == 10):
        return None
    quotes = np.count_nonzero(buf == 34)
    names = [f"f{i}" for i in range(len(fields))]
    try:
        split = pcsv.read_csv(
            pa.py_buffer(data),
            read_options=pcsv.ReadOptions(use_threads=False, block_size=1 << 24,
                                          column_names=names),
            parse_options=pcsv.ParseOptions(delimiter=",", quote_char=False,
                                            escape_char=False, newlines_in_values=False,
                                            ignore_empty_lines=True),
            convert_options=pcsv.ConvertOptions(
                column_types=dict.fromkeys(names, pa.binary()), check_utf8=False,
                strings_can_be_null=False, quoted_strings_can_be_null=False))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None  # (a row of another width)
    lines = split.num_rows
    if quotes != lines * sum(4 if text else 2 for _, text in fields):
        return None
    wanted = {f.name: f.type for f in schema}
    columns: dict[str, Any] = {}
    for i, (key, text) in enumerate(fields):
        head = (b"{" if i == 0 else b"") + b'"' + key + b'":' + (b'"' if text else b"")
        tail = (b'"' if text else b"") + (b"}" if i == len(fields) - 1 else b"")
        column = split.column(i)
        if not pc.all(pc.starts_with(column, head)).as_py() or (
                tail and not pc.all(pc.ends_with(column, tail)).as_py()):
            return None
        if text and pc.min(pc.binary_length(column)).as_py() < len(head) + len(tail):
            return None  # (`"k":"` alone: its quotes would be one)
        value = pc.binary_slice(column, len(head), -len(tail) if tail else _END)
        name = key.decode()
        kind = wanted.get(name)
        if text:
            if kind is not None and kind != pa.string():
                return None
            if kind is not None:  # (the file is UTF-8 and each cut is next to ASCII)
                columns[name] = value.cast(pa.string())
            continue
        number = _number(value.cast(pa.string()), kind)
        if number is None:
            return None
        if kind is not None:
            columns[name] = number
    return pa.table([columns.get(f.name, pa.nulls(lines, f.type)) for f in schema],
                    schema=schema)


def _template(line: bytes) -> list[tuple[bytes, bool]] | None:
    """The first line's fields as (key, a string value?), or None when its shape is not
    one this reader takes (every line, this one too, is checked against it after)."""
    if not (line.startswith(b"{") and line.endswith(b"}")):
        return None
    fields: list[tuple[bytes, bool]] = []
    for piece in line[1:-1].split(b","):
        field = _FIELD.match(piece)
        if field is None or any(field[1] == k for k, _ in fields):
            return None
        fields.append((field[1], field[2] is not None))
    return fields or None


def _number(text: Any, kind: Any) -> Any:
    """String column `text` of a number field as a column of Arrow type `kind` (None: a
    field the schema does not name, only checked), or None when not certainly Arrow's."""
    import pyarrow as pa
    import pyarrow.compute as pc

    integer = kind in (pa.int64(), pa.int32())
    if kind is not None and not integer and kind != pa.float64():
        return None
    if not pc.all(pc.match_substring_regex(text, _INTEGER if integer else _NUMBER)).as_py():
        return None
    if kind is None:  # Arrow's JSON reader parses it all the same: past the double range
        try:          # (an integer too: it reads one past 64 bits as a double) it refuses it
            values = pc.cast(text, pa.float64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        return None if pc.any(pc.is_inf(values)).as_py() else text
    try:
        column = pc.cast(text, kind)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if not integer and pc.any(pc.is_inf(column)).as_py():
        return None
    return column
