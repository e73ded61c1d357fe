"""Bad records in the continuous mode's source subtasks (issue 36), as the epoch mode
accounts them: a record that does not decode, or whose event time is null, is a dead letter
of the source's `on_error` sink with the epoch mode's columns and reason
(`connectors.base.DEAD_LETTER_COLUMNS`: the source, the file and line or the partition and
offset, the record, the field that failed); without `on_error` the subtask fails with a
message naming the record, which ends the run as the epoch mode's failed epoch does.

The epoch mode lets Spark decode what Arrow refuses; a source subtask has no Spark, so
`salvage_lines` and `salvage_values` take a JSON-lines file or a poll of Kafka values that
Arrow refused whole record by record: a record is bad when `connectors.dead_letters.
json_problem` names what Spark fails on (the epoch mode's dead letter's `error`) and Arrow
refuses it alone too; the rest is decoded by Arrow in one piece, and is an error as before
when Arrow still refuses it (input Arrow cannot read as Spark would).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from streamer.connectors.arrow.arrow_json import decode
from streamer.connectors.arrow.arrow_json_writer import JsonLines
from streamer.connectors.base import DEAD_LETTER_COLUMNS, DECODE_ERROR_MARKER
from streamer.connectors.dead_letters import json_problem
from streamer.connectors.exceptions import DecodeError
from streamer.exceptions import ArrowRefused
from streamer.runtime.plan.stages.event_time import named_columns, null_text, plain_column

#: (split, offset, record or None, error): one dead letter, without its source.
Dead = tuple[str | None, str | None, str | None, str]
#: Where each of some rows of a slice was: (split, offset, the record as read, or None to
#: show the decoded row as JSON), by row index in the slice.
Where = Callable[[list[int]], list[tuple[str | None, str | None, str | None]]]


def dead_schema() -> Any:
    """The Arrow schema of dead-letter rows (every column text)."""
    import pyarrow as pa

    return pa.schema([(name, pa.string()) for name in DEAD_LETTER_COLUMNS])


def dead_spark_schema() -> Any:
    """The Spark schema of dead-letter rows (`connectors.base.DEAD_LETTER_DDL`)."""
    from pyspark.sql.types import StringType, StructField, StructType

    return StructType([StructField(name, StringType()) for name in DEAD_LETTER_COLUMNS])


@dataclass(frozen=True)
class BadRecords:
    """How one source's subtasks treat bad records (picklable, made on the driver)."""

    source_id: str
    #: The dead-letter sink, or None: a bad record fails the run.
    on_error: str | None
    #: The source's `event_time` expression (None: no event time).
    event_time: str | None
    #: The decoded columns (name, Spark type).
    columns: tuple[tuple[str, str], ...]
    #: Whether the JVM prints the shortest digits of a double (`jvm_prints_shortest`).
    shortest: bool = True

    def table(self, dead: Sequence[Dead]) -> Any:
        """Dead-letter rows (`dead_schema`) of `dead`."""
        import pyarrow as pa

        rows = [(self.source_id, *d) for d in dead]
        return pa.table([pa.array([r[i] for r in rows], pa.string())
                         for i in range(len(DEAD_LETTER_COLUMNS))], schema=dead_schema())

    def undecodable(self, dead: Dead) -> DecodeError:
        """The error of a record that does not decode, for a source without `on_error`."""
        split, offset, record, error = dead
        msg = (f"{DECODE_ERROR_MARKER}source {self.source_id!r} cannot decode the record at "
               f"split {split} offset {offset}: {_quoted(record)} ({error}); add on_error: "
               "<sink id> to send such records to a dead-letter sink")
        return DecodeError(msg)

    def without_time(self, split: str | None, offset: str | None,
                     record: str | None) -> DecodeError:
        """The error of a record whose event time is null, for a source without `on_error`."""
        what = "is null" if plain_column(self.event_time or "") else \
            "is null or cannot be computed"
        msg = (f"{DECODE_ERROR_MARKER}source {self.source_id!r} read a record whose event "
               f"time {what} (`{self.event_time}`) at split {split or '?'} offset "
               f"{offset or '?'}: {(record or '')[:500]}; add on_error: <sink id> to send "
               "such records to a dead-letter sink, or give every record an event time")
        return DecodeError(msg)

    def null_times(self, table: Any, rows: list[int], where: Where) -> list[Dead]:
        """The dead letters of `rows` of `table` (decoded columns, as the slice had them),
        whose event time is null: the epoch mode's record and reason
        (`runtime.plan.stages.event_time`); the error of the first without `on_error`."""
        assert self.event_time is not None
        found = where(rows)
        picked = table.take(rows).select([name for name, _ in self.columns])
        shown = self._json(picked, self.columns)
        plain = plain_column(self.event_time)
        named = [] if plain else named_columns(self.event_time, [n for n, _ in self.columns])
        values = {c: self._json(picked.select([c]), [(c, dict(self.columns)[c])])
                  for c in named}
        dead: list[Dead] = []
        for i, (split, offset, record) in enumerate(found):
            text = record if record is not None else shown[i]
            if self.on_error is None:
                raise self.without_time(split, offset, text)
            reason = (f"field {plain!r}: null event time" if plain else null_text(
                self.event_time, [(c, _value_of(values[c][i])) for c in named]))
            dead.append((split, offset, text, reason))
        return dead

    def _json(self, table: Any, columns: Sequence[tuple[str, str]]) -> list[str]:
        """Each row of `table` as Spark's `to_json` renders it with its nulls."""
        encoder = JsonLines(tuple(columns), shortest=self.shortest)
        return [str(v) for v in encoder.values(table).to_pylist()]


def _value_of(line: str) -> str:
    """The value of a one-field JSON object's text (`{"c":value}`)."""
    return line[line.index(":") + 1:-1]


def _quoted(record: str | None) -> str:
    if record is None:
        return "null"
    return repr(record if len(record) <= 200 else record[:200] + "...")


def _bad(bad: BadRecords, raw: bytes | None, text: str | None, records: int | None) -> str | None:
    """Why a record is a bad one to Spark (the dead letter's `error`), or None when it is not
    certainly one: `json_problem` names the failure and Arrow refuses the record alone."""
    problem = json_problem(bad.columns, text)
    if problem is None or raw is None:
        return problem
    try:
        decode(raw, bad.columns, records)
    except ArrowRefused:
        return problem
    return None


@dataclass
class Salvaged:
    """What a refused file or poll holds: its good records decoded, where each was (its
    line or offset, its text, its split), and its bad records as dead letters."""

    table: Any
    dead: list[Dead]
    lines: list[int] = field(default_factory=list)
    texts: list[str | None] = field(default_factory=list)
    splits: list[str] = field(default_factory=list)


#: One record as read: its bytes, its text, its split and its line or offset.
Record = tuple[bytes | None, str | None, str, int]


def _salvage(bad: BadRecords, records: list[Record], alone: int | None) -> Salvaged:
    """`records` sorted into good ones (`Salvaged` without its table) and dead letters
    (`alone`: how `decode` counts a record taken alone)."""
    salvaged = Salvaged(None, [])
    for raw, text, split, offset in records:
        error = _bad(bad, raw, text, alone)
        if error is None:
            salvaged.lines.append(offset)
            salvaged.texts.append(text)
            salvaged.splits.append(split)
            continue
        found: Dead = (split, str(offset), text, error)
        if bad.on_error is None:
            raise bad.undecodable(found)
        salvaged.dead.append(found)
    return salvaged


def _json_lines(data: bytes, split: str) -> list[Record]:
    """The records of JSON-lines text: its non-blank lines (Spark drops blank ones), each
    with its line number (1-based, as `connectors.dead_letters` counts)."""
    found: list[Record] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        text = raw.decode("utf-8", errors="replace").rstrip("\r")
        if text.strip(" "):
            found.append((raw, text, split, number))
    return found


def salvage_lines(bad: BadRecords, data: bytes, split: str) -> Salvaged:
    """The records of a JSON-lines file (`data`, named `split`) Arrow refused whole
    (module docstring); each dead letter's offset is its line. `ArrowRefused` when the good
    records are refused still; without `on_error`, the error of the first bad record."""
    records = _json_lines(data, split)
    salvaged = _salvage(bad, records, None)
    kept = set(salvaged.lines)
    salvaged.table = decode(b"".join((r[0] or b"") + b"\n" for r in records if r[3] in kept),
                            bad.columns)
    return salvaged


def salvage_values(bad: BadRecords, values: list[bytes | None], splits: list[str],
                   offsets: list[int]) -> Salvaged:
    """As `salvage_lines`, for Kafka values (`splits` and `offsets`: each one's partition
    and offset, the dead letter's split and offset); the good ones' splits and offsets
    (`lines`)."""
    from streamer.runtime.arrow.arrow_input import kafka_text

    records: list[Record] = [
        (value, None if value is None else value.decode("utf-8", errors="replace"), split,
         offset) for value, split, offset in zip(values, splits, offsets, strict=True)]
    salvaged = _salvage(bad, records, 1)
    kept = set(zip(salvaged.splits, salvaged.lines, strict=True))
    good = [r[0] for r in records if (r[2], r[3]) in kept]
    salvaged.table = decode(kafka_text(good), bad.columns, len(good))
    return salvaged


def file_lines(name: str) -> list[tuple[int, str | None]]:
    """(line number, text) of each record of a JSON-lines file (its non-blank lines)."""
    with open(name, "rb") as f:
        return [(r[3], r[1]) for r in _json_lines(f.read(), name)]
