"""What a dead letter says about its record: the field and the value that failed, or what
else is wrong; and the line of its file (`connectors.dead_letters`, pure Python; the Spark
paths are in test_files_source.py, test_kafka.py and runtime/test_bad_records.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from streamer.connectors.dead_letters import csv_problem, explain_batches, json_problem

FIELDS = (("user", "string"), ("n", "int"), ("amount", "double"), ("ok", "boolean"),
          ("ts", "timestamp"), ("tags", "array<string>"))


@pytest.mark.parametrize(("record", "error"), [
    ('{"user": "a", "n": "lots"}', "field 'n': \"lots\" is not an int"),
    ('{"n": 3000000000}', "field 'n': 3000000000 is out of range for int"),
    ('{"n": true}', "field 'n': true is not an int"),
    ('{"amount": "12,50"}', "field 'amount': \"12,50\" is not a double"),
    ('{"ok": "yes"}', "field 'ok': \"yes\" is not a boolean"),
    ('{"ts": "yesterday"}', "field 'ts': \"yesterday\" is not a timestamp"),
    ("{broken", "not JSON: Expecting property name enclosed in double quotes: line 1 "
                "column 2 (char 1)"),
    ("[1, 2]", "not a JSON object but list [1, 2]"),
    ("", "empty record (no JSON object)"),
    ('{"user": 5, "n": 1, "amount": 2, "ts": 1767225600, "tags": ["x"]}', None),
])
def test_json_records_name_the_field_that_failed(record: str, error: str | None) -> None:
    assert json_problem(FIELDS, record) == error


@pytest.mark.parametrize(("record", "error"), [
    ("a;x;1.5;true;2026-01-01T00:00:00Z;", "field 'n': \"x\" is not an int"),
    ("a;1;lots;true;2026-01-01T00:00:00Z;", "field 'amount': \"lots\" is not a double"),
    ("a;1", "has 2 fields, the schema has 6 (user, n, amount, ok, ts, tags)"),
    ("a;;;;;", None),
])
def test_csv_lines_name_the_field_that_failed(record: str, error: str | None) -> None:
    assert csv_problem(FIELDS, record, ";") == error


def test_each_dead_letter_gets_its_line_and_identical_lines_get_one_each(
        tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"n": 1}\nbad\r\n{"n": 2}\nbad\n{"n": "x"}\n')
    rows = [{"source": "s", "split": str(path), "offset": str(path), "record": r,
             "error": "cannot decode"} for r in ("bad", '{"n": "x"}', "bad")]
    schema = pa.schema([(c, pa.string()) for c in ("source", "split", "offset", "record",
                                                    "error")])
    out = [r for b in explain_batches(iter([pa.RecordBatch.from_pylist(rows, schema)]),
                                      (("n", "int"),), "jsonl", ",", True)
           for r in b.to_pylist()]
    assert [(r["offset"], r["error"]) for r in out] == [
        ("2", "not JSON: Expecting value: line 1 column 1 (char 0)"),
        ("5", "field 'n': \"x\" is not an int"),
        ("4", "not JSON: Expecting value: line 1 column 1 (char 0)")]


SCHEMA = pa.schema([(c, pa.string()) for c in ("source", "split", "offset", "record", "error")])


def explained(rows: list[dict], batches: list[int], fields: tuple, fmt: str,
              reasons: bool = True) -> list[str | None]:
    """The offsets `explain_batches` gives `rows`, fed to it as one task's batches of the
    given sizes."""
    given, start = [], 0
    for size in batches:
        given.append(pa.RecordBatch.from_pylist(rows[start:start + size], SCHEMA))
        start += size
    return [r["offset"] for b in explain_batches(iter(given), fields, fmt, ",", True, reasons)
            for r in b.to_pylist()]


def test_identical_lines_in_two_blocks_and_two_batches_get_their_own_lines(
        tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"  # bytes: line 1 at 0, 2 at 9, 3 at 13, 4 at 17, 5 at 26
    path.write_text('{"n": 1}\nbad\nbad\n{"n": 2}\nbad\n')
    # Spark's block at byte 14 starts inside line 3: its first line is line 4.
    rows = [{"source": "s", "split": str(path), "offset": block, "record": "bad",
             "error": "cannot decode"} for block in ("0", "0", "14")]
    assert explained(rows, [1, 2], (("n", "int"),), "jsonl") == ["2", "3", "5"]
    assert explained(rows, [3], (("n", "int"),), "jsonl") == ["2", "3", "5"]


def test_a_csv_record_without_event_time_is_found_by_its_columns(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("user,n,ts\nu1,5,\nu2,6,2026-01-01T00:00:00Z\nu1,5,2026-01-01T00:00:01Z\n"
                    "u1,5,\n")
    record = json.dumps({"user": "u1", "n": 5, "ts": None})
    rows = [{"source": "s", "split": str(path), "offset": "0", "record": record,
             "error": "field 'ts': null event time"}] * 2
    fields = (("user", "string"), ("n", "int"), ("ts", "timestamp"))
    assert explained(rows, [1, 1], fields, "csv", reasons=False) == ["2", "5"]
