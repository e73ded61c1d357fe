"""The files source against real files and a real local Spark."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from streamer.connectors.base import DEAD_LETTER_COLUMNS, DECODE_ERROR_MARKER, ConnectorContext
from streamer.connectors.exceptions import ConnectorError, DecodeError
from streamer.connectors.files.files_source import FilesSource
from streamer.pipeline.validate import load_pipeline_text

SCHEMA = {"user": "string", "n": "int"}


@pytest.fixture
def make(spark: Any) -> Any:
    """A factory of files sources from their options (`on_error` adds a dead-letter sink)."""

    def build(path: Any, fmt: str, **options: Any) -> FilesSource:
        source = {"id": "clicks", "type": "files", "path": str(path), "format": fmt, **options}
        sinks: list[dict[str, Any]] = [{"id": "out", "type": "console", "input": "clicks"}]
        if "on_error" in options:
            sinks.append({"id": options["on_error"], "type": "console"})
        text = yaml.safe_dump({"name": "t", "sources": [source], "sinks": sinks},
                              sort_keys=False)
        return FilesSource(load_pipeline_text(text).sources[0], ConnectorContext(spark, "t"))

    return build


def jsonl(path: Path, *rows: Any) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def read_all(source: FilesSource) -> tuple[list[tuple], list[dict[str, Any]], dict[str, Any]]:
    """Every epoch until nothing is new: (records, dead letters, final offsets)."""
    offsets = source.initial_offsets()
    records: list[tuple] = []
    dead: list[dict[str, Any]] = []
    while (piece := source.plan(offsets, 0)) is not None:
        read = source.read(piece)
        records += [tuple(r) for r in read.records.collect()]
        if read.dead_letters is not None:
            dead += [r.asDict() for r in read.dead_letters.collect()]
        offsets = dict(piece.end)
    return sorted(records, key=str), dead, offsets


# ---------------------------------------------------------------------------- planning
def test_files_are_planned_in_name_order_at_most_n_per_epoch(make: Any, tmp_path: Path) -> None:
    for name in ("c.jsonl", "a.jsonl", "b.jsonl"):  # created out of name order
        jsonl(tmp_path / name, {"user": name[0], "n": 1})
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / ".a.jsonl.crc").write_text("x")
    source = make(tmp_path, "jsonl", schema=SCHEMA, max_files_per_epoch=2)
    assert source.bounded and source.lag_unit() == "files"
    offsets = source.initial_offsets()
    assert source.lag(offsets, 0) == 3
    first = source.plan(offsets, 0)
    assert first is not None
    assert first.payload["files"] == [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    assert sorted(r.user for r in source.read(first).records.collect()) == ["a", "b"]
    second = source.plan(first.end, 0)
    assert second is not None
    assert second.payload["files"] == [str(tmp_path / "c.jsonl")]
    assert second.end == {"files": sorted(str(tmp_path / f"{x}.jsonl") for x in "abc")}
    assert not source.exhausted(first.end)
    assert source.exhausted(second.end)
    assert source.plan(second.end, 0) is None
    assert source.lag(second.end, 0) == 0


def test_glob_path(make: Any, tmp_path: Path) -> None:
    jsonl(tmp_path / "x-1.jsonl", {"user": "a", "n": 1})
    jsonl(tmp_path / "y-1.jsonl", {"user": "b", "n": 2})
    records, _, _ = read_all(make(tmp_path / "x-*.jsonl", "jsonl", schema=SCHEMA))
    assert records == [("a", 1)]


def test_watch_picks_up_a_file_added_later(make: Any, tmp_path: Path) -> None:
    jsonl(tmp_path / "1.jsonl", {"user": "a", "n": 1})
    source = make(tmp_path, "jsonl", schema=SCHEMA, watch=True)
    assert not source.bounded
    piece = source.plan(source.initial_offsets(), 0)
    assert piece is not None
    offsets = dict(piece.end)
    assert source.plan(offsets, 0) is None
    assert not source.exhausted(offsets)
    jsonl(tmp_path / "2.jsonl", {"user": "b", "n": 2})
    later = source.plan(offsets, 0)
    assert later is not None and later.payload["files"] == [str(tmp_path / "2.jsonl")]
    assert [tuple(r) for r in source.read(later).records.collect()] == [("b", 2)]


def test_missing_directory_has_nothing_to_read(make: Any, tmp_path: Path) -> None:
    source = make(tmp_path / "not-yet", "jsonl", schema=SCHEMA, watch=True)
    assert source.plan(source.initial_offsets(), 0) is None
    assert source.lag(source.initial_offsets(), 0) == 0


# ------------------------------------------------------------------------------- jsonl
def test_jsonl_bad_lines_become_dead_letters(make: Any, tmp_path: Path) -> None:
    path = jsonl(tmp_path / "a.jsonl", {"user": "a", "n": 1}, "not json", "",
                 {"user": "b", "n": "x"}, '{"user": "c"}', "[1, 2]")
    records, dead, _ = read_all(make(tmp_path, "jsonl", schema=SCHEMA, on_error="bad"))
    assert records == [("a", 1), ("c", None)]
    assert [tuple(d) for d in dead] and set(dead[0]) == set(DEAD_LETTER_COLUMNS)
    assert sorted(d["record"] for d in dead) == ['[1, 2]', 'not json',
                                                 '{"user": "b", "n": "x"}']
    for letter in dead:
        assert letter["source"] == "clicks"
        assert letter["split"] == str(path)
    # The line in the file (1-based, as editors count) and the field that failed.
    assert sorted((d["offset"], d["error"]) for d in dead) == [
        ("2", "not JSON: Expecting value: line 1 column 1 (char 0)"),
        ("4", "field 'n': \"x\" is not an int"),
        ("6", "not a JSON object but list [1, 2]")]


def test_jsonl_bad_line_without_on_error_fails_the_first_action(make: Any,
                                                                  tmp_path: Path) -> None:
    jsonl(tmp_path / "a.jsonl", {"user": "a", "n": 1}, "{broken")
    source = make(tmp_path, "jsonl", schema=SCHEMA)
    read = source.read(source.plan(source.initial_offsets(), 0))
    assert read.dead_letters is None
    with pytest.raises(Exception) as err:
        read.records.select("n").count()
    message = str(err.value)
    assert DECODE_ERROR_MARKER in message
    assert "source 'clicks' cannot decode the record at split " in message
    assert str(tmp_path / "a.jsonl") in message and "{broken" in message
    assert "add on_error: <sink id>" in message


def test_jsonl_timestamps_and_decimals_decode(make: Any, tmp_path: Path) -> None:
    jsonl(tmp_path / "a.jsonl", {"ts": "2026-01-01T00:01:00.5Z", "amount": "12.30"})
    source = make(tmp_path, "jsonl", schema={"ts": "timestamp", "amount": "decimal(10,2)"})
    (row,) = read_all(source)[0]
    assert str(row[0]) == "2026-01-01 00:01:00.500000"
    assert str(row[1]) == "12.30"


def test_jsonl_columns_may_share_names_with_decoding_helpers(make: Any,
                                                            tmp_path: Path) -> None:
    jsonl(tmp_path / "a.jsonl", {"value": 1, "split": "s", "offset": 9}, "bad")
    source = make(tmp_path, "jsonl", schema={"value": "int", "split": "string",
                                             "offset": "bigint"}, on_error="bad")
    records, dead, _ = read_all(source)
    assert records == [(1, "s", 9)]
    assert [(d["record"], d["split"]) for d in dead] == [("bad", str(tmp_path / "a.jsonl"))]


def test_memory_url(make: Any) -> None:
    root = f"memory://streamer-tests/{uuid.uuid4().hex}"
    fs = fsspec.filesystem("memory")
    with fs.open(f"{root}/b.jsonl", "w") as f:
        f.write('{"user": "b", "n": 2}\nnope\n')
    with fs.open(f"{root}/a.jsonl", "w") as f:
        f.write('{"user": "a", "n": 1}\n')
    try:
        source = make(root, "jsonl", schema=SCHEMA, on_error="bad")
        records, dead, offsets = read_all(source)
        assert records == [("a", 1), ("b", 2)]
        canonical = "memory:///" + root.removeprefix("memory://")  # as fsspec names it
        names = [f"{canonical}/a.jsonl", f"{canonical}/b.jsonl"]
        assert offsets["files"] == names
        assert [(d["split"], d["record"]) for d in dead] == [(names[1], "nope")]
    finally:
        fs.rm(root.removeprefix("memory://"), recursive=True)


# --------------------------------------------------------------------------------- csv
def test_csv_bad_rows_become_dead_letters(make: Any, tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("user;n\na;1\nb;x\nc;3;extra\nd;4\n")
    source = make(tmp_path, "csv", schema=SCHEMA, delimiter=";", on_error="bad")
    records, dead, _ = read_all(source)
    assert records == [("a", 1), ("d", 4)]
    assert sorted((d["source"], d["split"], d["record"]) for d in dead) == [
        ("clicks", str(tmp_path / "a.csv"), "b;x"), ("clicks", str(tmp_path / "a.csv"),
                                                    "c;3;extra")]
    assert sorted((d["offset"], d["error"]) for d in dead) == [
        ("3", "field 'n': \"x\" is not an int"),
        ("4", "has 3 fields, the schema has 2 (user, n)")]


def test_csv_corrupt_lines_do_not_depend_on_the_columns_a_query_uses(make: Any,
                                                                     tmp_path: Path) -> None:
    # Spark's CSV reader parses only the columns a query needs, and refuses a query that
    # needs only the corrupt-record column; neither may change what counts as a bad line.
    (tmp_path / "a.csv").write_text("user,n\na,1\nb,x\nc\nd,4,extra\n")
    source = make(tmp_path, "csv", schema=SCHEMA, on_error="bad")
    read = source.read(source.plan(source.initial_offsets(), 0))
    assert read.dead_letters is not None
    assert read.dead_letters.count() == 3
    assert [r.record for r in read.dead_letters.select("record").collect()] == [
        "b,x", "c", "d,4,extra"]
    assert read.records.count() == 1
    assert [tuple(r) for r in read.records.select("user").collect()] == [("a",)]


def test_csv_bad_row_without_on_error_fails(make: Any, tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("user,n\na,1\nb,x\n")
    source = make(tmp_path, "csv", schema=SCHEMA)
    read = source.read(source.plan(source.initial_offsets(), 0))
    with pytest.raises(Exception) as err:
        read.records.count()
    assert DECODE_ERROR_MARKER in str(err.value) and "'clicks'" in str(err.value)
    assert "b,x" in str(err.value)


def test_csv_without_header(make: Any, tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("a,1\nb,2\n")
    records, _, _ = read_all(make(tmp_path, "csv", schema=SCHEMA, header=False))
    assert records == [("a", 1), ("b", 2)]


# ----------------------------------------------------------------------------- parquet
@pytest.fixture
def parquet_dir(tmp_path: Path) -> Iterator[Path]:
    pq.write_table(pa.table({"user": ["a", "b"], "n": pa.array([1, 2], pa.int32())}),
                   tmp_path / "1-good.parquet")
    pq.write_table(pa.table({"user": ["c"], "n": ["not a number"]}), tmp_path / "2-wrong.parquet")
    (tmp_path / "3-garbage.parquet").write_bytes(b"this is not parquet")
    pq.write_table(pa.table({"n": pa.array([7], pa.int16()), "user": ["d"], "x": [0.5]}),
                   tmp_path / "4-wider.parquet")
    yield tmp_path


def test_parquet_incompatible_files_become_one_dead_letter_each(make: Any,
                                                                 parquet_dir: Path) -> None:
    records, dead, _ = read_all(make(parquet_dir, "parquet", schema=SCHEMA, on_error="bad"))
    assert records == [("a", 1), ("b", 2), ("d", 7)]
    assert [(d["source"], d["split"], d["record"]) for d in sorted(dead, key=str)] == [
        ("clicks", str(parquet_dir / "2-wrong.parquet"), None),
        ("clicks", str(parquet_dir / "3-garbage.parquet"), None)]
    errors = {d["split"]: d["error"] for d in dead}
    assert "column 'n'" in errors[str(parquet_dir / "2-wrong.parquet")]
    assert "not a readable parquet file" in errors[str(parquet_dir / "3-garbage.parquet")]


def test_parquet_incompatible_file_without_on_error_raises(make: Any, parquet_dir: Path) -> None:
    source = make(parquet_dir, "parquet", schema=SCHEMA)
    offsets = source.initial_offsets()
    with pytest.raises(DecodeError) as err:
        read_all(source)
    assert "'clicks'" in str(err.value) and "2-wrong.parquet" in str(err.value)
    assert str(err.value).endswith("to a dead-letter sink")
    assert source.plan(offsets, 0) is not None


# ------------------------------------------------------------------------------ schema
def test_schema_is_inferred_once_from_the_files_present(make: Any, tmp_path: Path) -> None:
    jsonl(tmp_path / "a.jsonl", {"user": "a", "n": 1})
    source = make(tmp_path, "jsonl")
    first = source.schema()
    assert sorted((f.name, f.dataType.simpleString()) for f in first.fields) == [
        ("n", "bigint"), ("user", "string")]
    jsonl(tmp_path / "b.jsonl", {"user": "b", "n": 2, "extra": True})
    assert source.schema() == first
    records, _, _ = read_all(source)
    assert sorted(records) == [(1, "a"), (2, "b")]


def test_csv_schema_is_inferred_with_types(make: Any, tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("user,n,price\na,1,2.5\n")
    schema = make(tmp_path, "csv").schema()
    assert [(f.name, f.dataType.simpleString()) for f in schema.fields] == [
        ("user", "string"), ("n", "int"), ("price", "double")]


def test_parquet_schema_is_inferred(make: Any, tmp_path: Path) -> None:
    pq.write_table(pa.table({"user": ["a"], "n": pa.array([1], pa.int64())}), tmp_path / "a.pq")
    schema = make(tmp_path, "parquet").schema()
    assert [(f.name, f.dataType.simpleString()) for f in schema.fields] == [
        ("user", "string"), ("n", "bigint")]


def _typed_table() -> pa.Table:
    """One column of every plain type `parquet_footer_schema` maps itself."""
    import datetime as dt
    from decimal import Decimal

    return pa.table({
        "b": [True], "i8": pa.array([1], pa.int8()), "i16": pa.array([1], pa.int16()),
        "i32": pa.array([1], pa.int32()), "i64": pa.array([1], pa.int64()),
        "u8": pa.array([1], pa.uint8()), "u16": pa.array([1], pa.uint16()),
        "u32": pa.array([1], pa.uint32()), "u64": pa.array([1], pa.uint64()),
        "f": pa.array([0.5], pa.float32()), "d": [0.5], "s": ["x"],
        "day": [dt.date(2026, 1, 1)], "dec": pa.array([Decimal("1.25")], pa.decimal128(7, 2)),
        "big": pa.array([Decimal("1")], pa.decimal128(38, 0)),
        "ms": pa.array([1], pa.timestamp("ms", tz="UTC")),
        "us": pa.array([1], pa.timestamp("us", tz="Europe/Paris"))})


def test_parquet_footer_schema_is_the_one_spark_infers(spark: Any, tmp_path: Path) -> None:
    """The footers' schema equals Spark's own inference for every plain type, and is None
    (Spark infers) for anything else: nested, time zone-less or nanosecond timestamps,
    binary, differing files, a file that is not parquet."""
    from streamer.connectors.files.parquet_footers import parquet_footer_schema

    pq.write_table(_typed_table(), tmp_path / "plain.parquet")
    pq.write_table(_typed_table(), tmp_path / "plain2.parquet")
    paths = [str(tmp_path / "plain.parquet"), str(tmp_path / "plain2.parquet")]
    assert parquet_footer_schema(paths) == spark.read.parquet(*paths).schema
    others = {
        "nested": pa.table({"a": [{"x": 1}]}), "list": pa.table({"a": [[1, 2]]}),
        "naive": pa.table({"a": pa.array([1], pa.timestamp("us"))}),
        "nanos": pa.table({"a": pa.array([1], pa.timestamp("ns", tz="UTC"))}),
        "binary": pa.table({"a": [b"x"]}), "wider": pa.table({"b": [True], "c": [1]})}
    for name, table in others.items():
        pq.write_table(table, tmp_path / f"{name}.parquet")
        if name != "nanos":  # (which Spark refuses, in its own words)
            assert spark.read.parquet(str(tmp_path / f"{name}.parquet")).schema
    for name in ("nested", "list", "naive", "nanos", "binary"):
        assert parquet_footer_schema([str(tmp_path / f"{name}.parquet")]) is None, name
    assert parquet_footer_schema([paths[0], str(tmp_path / "wider.parquet")]) is None
    (tmp_path / "garbage.parquet").write_bytes(b"not parquet")
    assert parquet_footer_schema([str(tmp_path / "garbage.parquet")]) is None


def test_no_schema_and_no_files_is_an_error(make: Any, tmp_path: Path) -> None:
    with pytest.raises(ConnectorError) as err:
        make(tmp_path, "jsonl").schema()
    assert str(err.value) == (f"source 'clicks' has no schema and no files to infer one from at "
                              f"{str(tmp_path)!r}; add schema: {{column: type}}")


def test_declared_schema_with_an_unknown_type_names_the_column(make: Any,
                                                               tmp_path: Path) -> None:
    with pytest.raises(ConnectorError) as err:
        make(tmp_path, "jsonl", schema={"user": "string", "n": "integr"}).schema()
    assert "column 'n' of source 'clicks' has type 'integr'" in str(err.value)
    assert "\n" not in str(err.value)
