r"""JSON lines encoded by Arrow exactly as Spark's JSON writer encodes them.

A `files` sink of format `jsonl` is written by Spark's JSON data source (after
`formats.timestamps_as_iso`, with `ignoreNullFields` off). When the keyed tasks write the
sink's files themselves (`connectors.files.files_sink.TaskFile`), `JsonLines.encode` renders each
batch with Arrow compute kernels to the same bytes, or raises `ArrowRefused` and the task
hands the rows to Spark's writer instead. What Spark writes, found by writing with it
(tests/connectors/test_arrow_json_writer.py compares the two byte for byte):
- one line per row, `\n` after every line, fields in schema order, no spaces; a null is
  `null`;
- strings and field names in quotes, with `"` and `\` escaped, `\b \t \n \f \r` as such and
  the other characters below U+0020 as `\u00XX` (upper-case hex); everything else as is, in
  UTF-8 (DEL, U+2028 and non-ASCII are not escaped);
- integers as decimal digits; booleans `true`/`false`;
- timestamps as `formats.iso_timestamp` renders them: `yyyy-MM-ddTHH:mm:ss`, then the
  microseconds without trailing zeros (none when zero), then `Z` (UTC). Years outside
  1000-9999 are refused;
- doubles as Java's `Double.toString`: in [10^-3, 10^7) plain with at least one fractional
  digit (`3.0`, `0.001`), otherwise `d.dddE±n`; `-0.0`; NaN and the infinities as the
  strings `"NaN"`, `"Infinity"`, `"-Infinity"`. Java 19 and later print the shortest digits
  that identify the double, the nearest of them (as Python's `repr` and Arrow's cast do).
  Java 17 and 18 sometimes print one more digit where the shortest has 16 or 17, and more
  for some values past 2^53 (JDK-4511638). On those JVMs a double is encoded only when
  it is a whole number below 2^53 or in [10^-3, 10^7) with at most 15 significant digits;
  any other value refuses the batch (`shortest` says which JVM rule applies).

Only the types in `TYPES` are encoded; a sink with another column type is written by Spark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from streamer.exceptions import ArrowRefused

#: Spark simple types `JsonLines` encodes.
TYPES = ("string", "bigint", "int", "double", "boolean", "timestamp")
#: Jackson's short escapes; other characters below U+0020 become \u00XX.
_SHORT = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
#: 1000-01-01T00:00:00Z and 10000-01-01T00:00:00Z in microseconds since the epoch.
_YEARS = (-30610224000 * 10**6, 253402300800 * 10**6)
#: Microseconds in a day.
_DAY = 86_400 * 10**6


def quoted(text: str) -> str:
    """`text` as Spark's JSON writer writes a string or field name (quotes included)."""
    out = text.replace("\\", "\\\\").replace('"', '\\"')
    for code in range(0x20):
        char = chr(code)
        if char in out:
            out = out.replace(char, _SHORT.get(char, f"\\u{code:04X}"))
    return f'"{out}"'


def jvm_prints_shortest(spark: Any) -> bool:
    """Whether the JVM Spark runs on prints a double's shortest digits (Java 19 or later;
    `java.specification.version` is "17", or "1.8" on old JVMs)."""
    text = str(spark.sparkContext._jvm.java.lang.System.getProperty(
        "java.specification.version"))
    return int(text.split(".")[1] if text.startswith("1.") else text.split(".")[0]) >= 19


def unsupported(fields: Sequence[tuple[str, str]]) -> str | None:
    """Why rows of these (name, Spark simple type) columns are not encoded, or None."""
    for name, kind in fields:
        if kind not in TYPES:
            return f"column {name!r} is {kind}"
    return None


@dataclass(frozen=True)
class JsonLines:
    """The encoder of one sink's rows: its columns (name, Spark simple type) in order and
    whether the JVM prints the shortest digits of a double (Java 19 or later)."""

    fields: tuple[tuple[str, str], ...]
    shortest: bool

    def encode(self, batch: Any) -> Any:
        """The rows of `batch` (an Arrow table or record batch with these columns) as Spark
        writes them, as an Arrow buffer; `ArrowRefused` when a value is one this encoder
        cannot be certain of."""
        import pyarrow as pa

        if not batch.num_rows:
            return pa.py_buffer(b"")
        try:
            lines = self._lines(batch)
        except pa.ArrowException as exc:  # (over 2 GiB of text, an Arrow type not foreseen)
            msg = f"Arrow could not render the batch: {exc}"
            raise ArrowRefused(msg) from exc
        offsets = lines.buffers()[1]
        first, last = (int.from_bytes(offsets[4 * k:4 * k + 4], "little", signed=True)
                       for k in (lines.offset, lines.offset + len(lines)))
        return lines.buffers()[2][first:last]

    def values(self, batch: Any) -> Any:
        """The rows of `batch` as Spark's `to_json` renders them (one JSON object a row, no
        line end: a Kafka sink's values), as an Arrow string array; `ArrowRefused` as
        `encode`."""
        import pyarrow as pa

        try:
            return self._lines(batch, "}")
        except pa.ArrowException as exc:
            msg = f"Arrow could not render the batch: {exc}"
            raise ArrowRefused(msg) from exc

    def _lines(self, batch: Any, end: str = "}\n") -> Any:
        """One string array: each row's line, ending with `end`. A column without nulls
        joins the line as its parts (`_render`), its quotes in the constant text around it:
        one concatenation writes every line."""
        import pyarrow as pa
        import pyarrow.compute as pc

        pieces: list[Any] = []
        for i, (name, kind) in enumerate(self.fields):
            column = batch.column(name)
            if isinstance(column, pa.ChunkedArray):
                column = column.combine_chunks()
            if kind == "string" and column.type != pa.string():
                column = column.cast(pa.string())  # (large or view strings)
            pieces.append(("{" if i == 0 else ",") + quoted(name) + ":")
            parts = self._render(column, kind)
            if column.null_count:  # (a part of a null row is null, and so its join)
                pieces.append(pc.fill_null(_joined(parts), "null"))
            else:
                pieces += parts
        pieces.append(end)
        lines = _joined(pieces)
        if isinstance(lines, pa.ChunkedArray):
            lines = lines.combine_chunks()
        return lines

    def _render(self, column: Any, kind: str) -> list[Any]:
        """`column`'s values as JSON text, as parts to concatenate: arrays (null where the
        value is) and constant strings."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if kind == "string":
            return ['"', _escaped(column), '"']
        if kind in ("bigint", "int"):
            return [pc.cast(column, pa.string())]
        if kind == "boolean":
            return [pc.if_else(column, pa.scalar("true"), pa.scalar("false"))]
        if kind == "timestamp":
            return _timestamps(column)
        return _doubles(column, self.shortest)


def _joined(parts: list[Any]) -> Any:
    """The parts concatenated row by row (adjacent constants merged first)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    merged: list[Any] = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] += part
        else:
            merged.append(part)
    if len(merged) == 1 and not isinstance(merged[0], str):
        return merged[0]
    return pc.binary_join_element_wise(
        *(pa.scalar(p) if isinstance(p, str) else p for p in merged), pa.scalar(""))


def _escaped(column: Any) -> Any:
    """Strings with Jackson's escapes (no quotes); as they are when no byte of the column
    needs one (a look at the bytes instead of three passes of string kernels)."""
    import numpy as np
    import pyarrow.compute as pc

    data = column.buffers()[2]
    if data is None:
        return column
    raw = np.frombuffer(data, dtype=np.uint8)
    if not ((raw < 0x20).any() or (raw == 0x22).any() or (raw == 0x5C).any()):
        return column
    text = pc.replace_substring(column, "\\", "\\\\")
    text = pc.replace_substring(text, '"', '\\"')
    if pc.any(pc.match_substring_regex(text, "[\\x00-\\x1f]")).as_py():
        for code in range(0x20):
            char = chr(code)
            text = pc.replace_substring(text, char, _SHORT.get(char, f"\\u{code:04X}"))
    return text


def _timestamps(column: Any) -> list[Any]:
    """`yyyy-MM-ddTHH:mm:ss[.ffffff without trailing zeros]Z` in quotes, as parts (see
    `JsonLines._render`). Only the days spanned go through `strftime` (about 1 us a
    value); the rest is integer arithmetic and lookups."""
    import pyarrow as pa
    import pyarrow.compute as pc

    micros = pc.cast(column, pa.timestamp("us", tz="UTC"))
    numbers = pc.cast(micros, pa.int64())
    low, high = pc.min_max(numbers).values()
    if low.is_valid and (low.as_py() < _YEARS[0] or high.as_py() >= _YEARS[1]):
        msg = "a timestamp outside the years 1000-9999"
        raise ArrowRefused(msg)
    return _iso(numbers)


def _iso(numbers: Any) -> list[Any]:
    """Microseconds since the epoch (an int64 array) as the parts of `_timestamps`' text:
    day, second and fraction by integer arithmetic, each looked up as text."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    nulls = numbers.is_null().to_numpy(zero_copy_only=False) if numbers.null_count else None
    values = numbers.fill_null(0).to_numpy(zero_copy_only=False)
    day = np.floor_divide(values, _DAY)
    second, fraction = np.divmod(values - day * _DAY, 10**6)  # (into the day: never negative)
    low, high = int(day.min()), int(day.max())
    if high - low < 1 << 16:  # the dates of the days spanned, looked up by day
        starts = pa.array(np.arange(low, high + 1, dtype=np.int64) * _DAY,
                          pa.timestamp("us", tz="UTC"))
        dates, index = pc.strftime(starts, format="%Y-%m-%d"), day - low
    else:  # (a span of centuries: the distinct days only)
        days = pc.unique(pa.array(day))
        dates = pc.strftime(pc.cast(pc.multiply(days, _DAY), pa.timestamp("us", tz="UTC")),
                            format="%Y-%m-%d")
        index = pc.index_in(pa.array(day), days).to_numpy(zero_copy_only=False)
    date = pc.take(dates, pa.array(index, mask=nulls))
    clock = pc.take(_clock_texts(), pa.array(second, mask=nulls))  # "HH:MM:SS"
    millis, rest = np.divmod(fraction, 1000)
    if not rest.any():  # (whole milliseconds)
        tail = pc.take(_milli_tails(), pa.array(millis, mask=nulls))
    else:
        micro = pa.array(fraction, mask=nulls)
        digits = pc.utf8_rtrim(pc.utf8_lpad(pc.cast(micro, pa.string()), 6, "0"), "0")
        tail = pc.if_else(pc.equal(micro, 0), pa.scalar('Z"'),
                          pc.binary_join_element_wise(pa.scalar("."), digits, pa.scalar('Z"'),
                                                      pa.scalar("")))
    return ['"', date, "T", clock, tail]


@cache
def _clock_texts() -> Any:
    """"HH:MM:SS" of every second of a day, by its number (a lookup instead of arithmetic
    and padding per value)."""
    import pyarrow as pa

    return pa.array([f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}" for s in range(86400)],
                    pa.string())


@cache
def _milli_tails() -> Any:
    """The end of a timestamp with k whole milliseconds into its second, by k: `Z"`, or
    `.` and the digits without trailing zeros then `Z"`."""
    import pyarrow as pa

    return pa.array(['Z"'] + [f".{k:03d}".rstrip("0") + 'Z"' for k in range(1, 1000)],
                    pa.string())


def _doubles(column: Any, shortest: bool) -> list[Any]:
    """Doubles as `Double.toString`, as parts (see `JsonLines._render`): Arrow's shortest
    text where it is plain and in [10^-3, 10^7) or zero (and `.0` where it has no point),
    each other value in Python (see the module's note on Java 17)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text = pc.cast(column, pa.string())
    size = pc.abs(column)
    plain = pc.and_(pc.or_(pc.equal(size, 0.0), pc.and_(pc.greater_equal(size, 1e-3),
                                                          pc.less(size, 1e7))),
                    pc.invert(pc.match_substring(text, "e")))
    if not shortest and (pc.max(pc.utf8_length(text)).as_py() or 0) > 15:  # (else: at
        # most 15 digits)
        digits = pc.utf8_length(pc.utf8_ltrim(pc.replace_substring(
            pc.replace_substring(text, "-", ""), ".", ""), "0"))
        if pc.any(pc.and_(plain, pc.greater(digits, 15))).as_py():
            msg = "a double whose shortest digits are more than 15 (Java 17 may print others)"
            raise ArrowRefused(msg)
    dot = pc.if_else(pc.match_substring(text, "."), pa.scalar(""), pa.scalar(".0"))
    others = pc.invert(pc.fill_null(plain, True))  # (a null stays null)
    if not pc.any(others).as_py():
        return [text, dot]
    values = pc.filter(column, others).to_pylist()
    rendered = pa.array([java_double(v, shortest) for v in values], pa.string())
    return [pc.replace_with_mask(_joined([text, dot]), others, rendered)]


def java_double(value: float, shortest: bool = True) -> str:
    """`value` as Spark's JSON writer prints a double (`Double.toString`; NaN and the
    infinities quoted); `ArrowRefused` where Java 17 may differ (`shortest` false)."""
    import math
    import sys

    if math.isnan(value):
        return '"NaN"'
    if math.isinf(value):
        return '"Infinity"' if value > 0 else '"-Infinity"'
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return f"{sign}0.0"
    if abs(value) < sys.float_info.min:  # (Java prints at least two digits: 4.9E-324)
        msg = f"the subnormal double {value!r}"
        raise ArrowRefused(msg)
    mantissa, _, power = repr(abs(value)).partition("e")  # (the shortest, nearest digits)
    whole, _, fraction = mantissa.partition(".")
    significant = (whole + fraction).lstrip("0").rstrip("0") or "0"
    lead = len(whole) - 1 if whole != "0" else len(fraction.lstrip("0")) - len(fraction) - 1
    point = lead + int(power or 0)  # (the power of ten of the first significant digit)
    plain = 1e-3 <= abs(value) < 1e7
    if not shortest and not ((value == int(value) and abs(value) < 2**53)
                             or (plain and len(significant) <= 15)):
        msg = f"the double {value!r} (Java 17 may print other digits)"
        raise ArrowRefused(msg)
    if not plain:
        return f"{sign}{significant[0]}.{significant[1:] or '0'}E{point}"
    if point < 0:
        return f"{sign}0.{'0' * (-point - 1)}{significant}"
    whole_digits = significant[:point + 1].ljust(point + 1, "0")
    return f"{sign}{whole_digits}.{significant[point + 1:] or '0'}"
