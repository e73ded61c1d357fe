"""`runtime.continuous.source_records` without Spark: the records of a JSON-lines file or a Kafka
poll that Arrow refused whole are taken one by one; the bad ones become dead letters with
the epoch mode's reasons (`connectors.dead_letters.json_problem`) and positions, the good
ones are decoded, and a source subtask without `on_error` fails naming the first bad one.
The end-to-end comparison with the epoch mode is tests/runtime/test_continuous_dead_letters.py.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from streamer.connectors.base import DECODE_ERROR_MARKER
from streamer.connectors.exceptions import DecodeError
from streamer.exceptions import ArrowRefused
from streamer.runtime.continuous.source_records import (
    BadRecords,
    dead_schema,
    file_lines,
    salvage_lines,
    salvage_values,
)

COLUMNS = (("user", "string"), ("qty", "bigint"), ("ts", "bigint"))


def bad(on_error: str | None = "dead", event_time: str | None = "ts") -> BadRecords:
    return BadRecords("events", on_error, event_time, COLUMNS)


LINES = b"""{"user": "a", "qty": 1, "ts": 10}

{"user": "b", "qty": "lots", "ts": 11}
{not json
{"user": "c", "qty": 3, "ts": 12}\r
[1, 2]
"""


def test_a_refused_file_keeps_its_good_lines_and_names_each_bad_one() -> None:
    found = salvage_lines(bad(), LINES, "in/a.jsonl")
    assert found.table.column("user").to_pylist() == ["a", "c"]
    assert found.table.column("qty").to_pylist() == [1, 3]
    assert found.lines == [1, 5]  # (the blank line 2 is no record, but it counts)
    assert [d[:2] for d in found.dead] == [("in/a.jsonl", "3"), ("in/a.jsonl", "4"),
                                           ("in/a.jsonl", "6")]
    assert found.dead[0][3] == "field 'qty': \"lots\" is not a bigint"
    assert found.dead[1][2] == "{not json" and found.dead[1][3].startswith("not JSON: ")
    assert found.dead[2][3] == "not a JSON object but list [1, 2]"
    table = bad().table(found.dead)
    assert table.schema == dead_schema() and table.column("source").to_pylist() == [
        "events"] * 3


def test_without_on_error_the_first_bad_line_fails_naming_it() -> None:
    with pytest.raises(DecodeError) as caught:
        salvage_lines(bad(on_error=None), LINES, "in/a.jsonl")
    text = str(caught.value)
    assert text.startswith(DECODE_ERROR_MARKER)
    assert "split in/a.jsonl offset 3" in text and "add on_error: <sink id>" in text


def test_a_line_arrow_cannot_be_sure_of_is_still_an_error() -> None:
    """A record `json_problem` finds nothing wrong with, which Arrow refuses, is not called
    a dead letter: the file stays refused (`ArrowRefused`)."""
    with pytest.raises(ArrowRefused):
        salvage_lines(bad(), b'{"user": "a", "qty": 1, "ts": 10, "user": "b"}\n', "f")


def test_kafka_values_are_dead_letters_with_their_partition_and_offset() -> None:
    values = [b'{"user": "a", "qty": 1, "ts": 10}', b"not json", b"", None,
              b"\xff\xfe", b'{"user": "b", "qty": 2, "ts": 11}']
    found = salvage_values(bad(), values, ["t:0", "t:0", "t:1", "t:1", "t:0", "t:1"],
                           [4, 5, 7, 8, 6, 9])
    assert found.table.column("user").to_pylist() == ["a", "b"]
    assert list(zip(found.splits, found.lines, strict=True)) == [("t:0", 4), ("t:1", 9)]
    assert [(d[0], d[1]) for d in found.dead] == [("t:0", "5"), ("t:1", "7"), ("t:1", "8"),
                                                  ("t:0", "6")]
    assert [d[3] for d in found.dead][1:3] == ["empty record (no JSON object)"] * 2
    assert found.dead[2][2] is None and found.dead[3][2] == "\ufffd\ufffd"


def test_records_without_event_time_get_the_epoch_modes_reason() -> None:
    table = pa.table({"user": ["a", "b"], "qty": [1, None], "ts": pa.array([None, 5],
                                                                           pa.int64())})

    def where(rows: list[int]) -> list[tuple[str | None, str | None, str | None]]:
        return [("t:0", str(100 + i), None) for i in rows]

    plain = bad().null_times(table, [0], where)
    assert plain == [("t:0", "100", '{"user":"a","qty":1,"ts":null}',
                      "field 'ts': null event time")]
    expression = bad(event_time="timestamp_millis(ts)").null_times(table, [0], where)
    assert expression[0][3] == ("event time `timestamp_millis(ts)` is null or cannot be "
                                "computed (field 'ts': null)")
    with pytest.raises(DecodeError, match=r"offset 100: .*give every record an event time"):
        bad(on_error=None).null_times(table, [0], where)


def test_file_lines_number_every_line(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(LINES)
    assert [n for n, _ in file_lines(str(path))] == [1, 3, 4, 5, 6]


def test_the_gang_plan_shows_the_dead_letter_sink() -> None:
    """`streamer plan --physical` of a continuous pipeline with `on_error`: the sink is the
    pipeline's own (wherever the dead-letter sink is listed), and the dead letters are
    written by the source subtasks."""
    from streamer.pipeline.validate import load_pipeline_text
    from streamer.runtime.plan.mode_plan import plan_gang

    spec = load_pipeline_text("""\
name: p
job: {parallelism: 2, execution: {mode: continuous}}
sources:
  - {id: events, type: files, path: ./in, format: jsonl, on_error: dead,
     schema: {user: string, qty: bigint}}
operators:
  - {id: some, input: events, filter: "qty > 0"}
sinks:
  - {id: dead, type: files, path: ./dead, format: jsonl}
  - {id: out, type: files, input: some, path: ./out, format: jsonl}
""", file="p.yaml", env={})
    gang = plan_gang(spec, {}, 2)
    assert gang.sink.startswith("'out' (jsonl files), written by the source subtasks")
    assert gang.render()[-1].startswith("    - dead letters: 'dead', written by the source "
                                        "subtasks")
    assert gang.describe()["dead_letters"] == gang.dead_letters
