r"""CSV files decoded by Arrow's CSV reader where the result is certainly Spark's.

A `files` source of CSV is read by Spark's CSV reader (`connectors.files.files_source`:
PERMISSIVE, the declared schema, the source's `header` and `delimiter`, every other option at
its default), which is what defines a record's values and whether it is a bad record. For a file
whose every line passes the checks below, Arrow gives the same values, so a keyed stage's input
can be decoded in a Python task (`runtime.arrow.arrow_input`), as JSON lines are
(`connectors.arrow.arrow_json`). Where a check fails, `Refused` says why and Spark reads the
file as before: a bad record still becomes a dead letter (or an error) exactly as it would.

What is checked, and why:
- the bytes are UTF-8 (Spark would read replacement characters), with no byte order mark;
- no `"` (Spark's quote), `\` (its escape), carriage return (Spark also ends lines at a lone
  `\r`) or NUL (Spark's disabled comment character, which still skips a line starting with
  it) anywhere: then every line is its fields split at the delimiter, for both readers;
- the delimiter is one of `,` `;` `|` and tab;
- every line has exactly the schema's number of fields (Arrow refuses any other count; Spark
  makes such a line a bad record). Empty lines are skipped by both; a line of blanks (or
  other characters Java's `trim` removes) is refused, as Spark skips it and Arrow does not.
  With `header`, the first non-empty line of each file is the header, whose text neither
  reader checks;
- an empty field is null, as Spark's `nullValue` (the empty string) makes it in every type;
- a value of a bigint or int column is `-?[0-9]+` and in range; of a double column
  `-?[0-9]+(.[0-9]+)?([eE][-+]?[0-9]+)?` (both parse such text correctly rounded) or `NaN`,
  `Infinity`, `-Infinity` (Java's text, which Spark's writer gives), `Inf`, `-Inf` (Spark's
  `positiveInf`/`negativeInf`); of a boolean column `true` or `false`; of a timestamp column
  the ISO-8601 forms `connectors.arrow.arrow_json.ISO` lets through. Any other text (a `+` sign,
  blanks around a number, `1.`, `TRUE`, a hex float) is refused even where Spark reads it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from streamer.connectors.arrow.arrow_json import check_utf8, plain_iso, with_timestamps
from streamer.exceptions import ArrowRefused as Refused

#: The delimiters this decoder takes.
DELIMITERS = (",", ";", "|", "\t")
#: Characters that make a file Spark's to read (see the module's docstring).
_SPECIAL = re.compile(rb'["\\\r\x00]')
#: A line of blanks and control characters only, which Spark skips (it trims such a line
#: to nothing) and Arrow reads as a one-field row.
_BLANK_LINE = re.compile(rb"(?:^|\n)[\x01-\x09\x0b-\x20]+(?:\n|$)")
#: Per Spark type, the text of a value both readers read alike.
_PATTERNS = {
    "bigint": r"^-?[0-9]+$", "int": r"^-?[0-9]+$",
    "double": r"^(-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?|NaN|-?Infinity|-?Inf)$",
    "boolean": r"^(true|false)$", "string": None}  # (timestamps: `arrow_json.plain_iso`)


def refusal(delimiter: str) -> str | None:
    """Why files with this delimiter are Spark's to read, or None."""
    if delimiter not in DELIMITERS:
        return f"the delimiter {delimiter!r} is not one of , ; | or tab"
    return None


def decode(data: bytes, columns: Sequence[tuple[str, str]], *, header: bool,
           delimiter: str) -> Any:
    """The records of the CSV file `data` as an Arrow table of `columns` (name, Spark type),
    timestamps as `timestamp[us, UTC]`, exactly as Spark's CSV reader would give them;
    `Refused` when that is not certain."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv

    why = refusal(delimiter)
    if why is not None:
        raise Refused(why)
    check_utf8(data)
    if data.startswith(b"\xef\xbb\xbf"):
        msg = "the file starts with a byte order mark"
        raise Refused(msg)
    found = _SPECIAL.search(data)
    if found is not None:
        msg = f"the file holds {found.group()!r} (a quote, an escape, a carriage return or NUL)"
        raise Refused(msg)
    if _BLANK_LINE.search(data):
        msg = "a line holds only blanks (Spark skips it)"
        raise Refused(msg)
    if header:
        body = data.lstrip(b"\n")
        end = body.find(b"\n")
        data = b"" if end < 0 else body[end + 1:]
    names = [name for name, _ in columns]
    strings = pa.schema([(name, pa.string()) for name in names])
    if not data.strip(b"\n"):
        return with_timestamps(_typed(strings.empty_table(), columns), columns)
    try:
        table = pcsv.read_csv(
            pa.py_buffer(data),
            read_options=pcsv.ReadOptions(use_threads=False, block_size=1 << 24,
                                          column_names=names),
            parse_options=pcsv.ParseOptions(delimiter=delimiter, quote_char=False,
                                            escape_char=False, newlines_in_values=False,
                                            ignore_empty_lines=True),
            convert_options=pcsv.ConvertOptions(
                column_types=strings, null_values=[""], strings_can_be_null=True,
                quoted_strings_can_be_null=True))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        msg = f"Arrow's reader: {str(exc)[:200]}"
        raise Refused(msg) from exc
    for name, kind in columns:
        column = table.column(name)
        if kind == "timestamp":
            alike = plain_iso(column)
        else:
            pattern = _PATTERNS[kind]
            alike = pattern is None or not pc.any(pc.invert(
                pc.match_substring_regex(column, pattern))).as_py()
        if not alike:
            msg = f"a value of {kind} column {name!r} is not in a form read alike"
            raise Refused(msg)
    return with_timestamps(_typed(table, columns), columns)


def _typed(table: Any, columns: Sequence[tuple[str, str]]) -> Any:
    """`table` (every column text) with each column cast to its type (timestamps stay text
    for `with_timestamps`); `Refused` where a value is out of its type's range."""
    import pyarrow as pa

    from streamer.connectors.arrow.arrow_json import arrow_type

    out = []
    for name, kind in columns:
        try:  # (Arrow's cast reads `NaN`, `Infinity`, `Inf` and their negatives as Spark does)
            out.append(table.column(name).cast(arrow_type(kind)))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            msg = f"column {name!r}: {str(exc)[:200]}"
            raise Refused(msg) from exc
    return pa.table(out, names=[name for name, _ in columns])
