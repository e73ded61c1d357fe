"""The files sink's two-phase commit against real files and a real local Spark."""

from __future__ import annotations

import csv
import datetime
import json
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pyarrow.parquet as pq
import pytest
import yaml

from streamer.connectors.base import ConnectorContext
from streamer.connectors.exceptions import ConnectorError
from streamer.connectors.files.files_sink import FilesSink
from streamer.connectors.formats import json_value, timestamps_as_iso
from streamer.pipeline.validate import load_pipeline_text

ROWS_SQL = """
SELECT * FROM VALUES
  ('a', 1, TIMESTAMP'2026-01-01 00:01:00', DATE'2026-01-02', 1.50BD),
  ('b', 2, TIMESTAMP'2026-01-01 00:01:00.5', DATE'2026-01-03', NULL),
  ('c', 3, TIMESTAMP'2026-01-01 00:01:00.123456', NULL, 2.00BD)
AS t(user, n, ts, day, amount)
"""


@pytest.fixture
def make(spark: Any) -> Any:
    """A factory of opened files sinks."""

    def build(path: Any, fmt: str) -> FilesSink:
        text = yaml.safe_dump({
            "name": "t",
            "sources": [{"id": "gen", "type": "datagen", "limit": 1, "fields": {"x": "offset"}}],
            "sinks": [{"id": "out", "type": "files", "input": "gen", "path": str(path),
                       "format": fmt}]}, sort_keys=False)
        sink = FilesSink(load_pipeline_text(text).sinks[0], ConnectorContext(spark, "t"))
        sink.open()
        return sink

    return build


@pytest.fixture
def rows(spark: Any) -> Any:
    """Three rows over two partitions, with timestamps, a date and a decimal."""
    return spark.sql(ROWS_SQL).repartition(2, "user")


def visible(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_file())


def test_files_appear_only_on_commit(make: Any, rows: Any, tmp_path: Path) -> None:
    sink = make(tmp_path, "jsonl")
    handle = sink.write(7, rows)
    json.dumps(handle)  # a handle goes into checkpoint metadata
    assert visible(tmp_path) == [] and sink.committed_files() == []
    staged = list((tmp_path / "_staging" / "epoch-00000007").iterdir())
    assert any(p.name.startswith("part-") for p in staged)
    sink.commit(7, handle)
    names = visible(tmp_path)
    assert names == sink.committed_files()
    assert names == [f"part-00000007-{i:05d}.jsonl" for i in range(len(names))]
    assert 1 <= len(names) <= 2
    assert not (tmp_path / "_staging").exists()  # nothing staged: no empty directory left
    lines = [json.loads(line) for n in names for line in (tmp_path / n).read_text().splitlines()]
    assert sorted(lines, key=lambda r: r["user"]) == [
        {"user": "a", "n": 1, "ts": "2026-01-01T00:01:00Z", "day": "2026-01-02",
         "amount": 1.5},
        {"user": "b", "n": 2, "ts": "2026-01-01T00:01:00.5Z", "day": "2026-01-03",
         "amount": None},
        {"user": "c", "n": 3, "ts": "2026-01-01T00:01:00.123456Z", "day": None,
         "amount": 2.0},
    ]


def test_commit_is_idempotent(make: Any, rows: Any, tmp_path: Path) -> None:
    sink = make(tmp_path, "jsonl")
    handle = sink.write(1, rows)
    sink.commit(1, handle)
    before = {n: (tmp_path / n).read_bytes() for n in visible(tmp_path)}
    sink.commit(1, handle)
    assert {n: (tmp_path / n).read_bytes() for n in visible(tmp_path)} == before


def test_names_are_deterministic_per_epoch(make: Any, rows: Any, tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for root in (first, second):
        sink = make(root, "csv")
        sink.commit(3, sink.write(3, rows))
    assert visible(first) == visible(second)
    assert [(first / n).read_text() for n in visible(first)] == [
        (second / n).read_text() for n in visible(second)]


def test_csv_has_a_header_and_iso_timestamps(make: Any, rows: Any, tmp_path: Path) -> None:
    sink = make(tmp_path, "csv")
    sink.commit(2, sink.write(2, rows))
    records = []
    for name in visible(tmp_path):
        with open(tmp_path / name, newline="") as handle:
            reader = csv.DictReader(handle)
            assert reader.fieldnames == ["user", "n", "ts", "day", "amount"]
            records += list(reader)
    assert sorted((r["user"], r["ts"], r["day"]) for r in records) == [
        ("a", "2026-01-01T00:01:00Z", "2026-01-02"),
        ("b", "2026-01-01T00:01:00.5Z", "2026-01-03"),
        ("c", "2026-01-01T00:01:00.123456Z", "")]


def test_parquet_keeps_types(make: Any, rows: Any, tmp_path: Path) -> None:
    sink = make(tmp_path, "parquet")
    sink.commit(4, sink.write(4, rows))
    names = visible(tmp_path)
    assert names and all(n.endswith(".parquet") for n in names)
    table = pq.ParquetDataset([str(tmp_path / n) for n in names]).read()
    assert sorted(table.column("user").to_pylist()) == ["a", "b", "c"]
    assert str(table.schema.field("amount").type) == "decimal128(3, 2)"
    assert "timestamp" in str(table.schema.field("ts").type)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_empty_epoch_writes_no_files(make: Any, spark: Any, tmp_path: Path, fmt: str) -> None:
    sink = make(tmp_path, fmt)
    handle = sink.write(5, spark.sql(ROWS_SQL).where("n > 100"))
    assert handle["files"] == []
    sink.commit(5, handle)
    assert visible(tmp_path) == []
    assert not (tmp_path / "_staging" / "epoch-00000005").exists()


def test_empty_partitions_leave_no_empty_files(make: Any, spark: Any, tmp_path: Path) -> None:
    sink = make(tmp_path, "csv")
    df = spark.range(0, 8, 1, 4).where("id >= 6").selectExpr("id AS x")  # rows in one partition
    sink.commit(1, sink.write(1, df))
    assert visible(tmp_path) == ["part-00000001-00000.csv"]
    assert (tmp_path / "part-00000001-00000.csv").read_text() == "x\n6\n7\n"


def test_abort_discards_the_staged_files(make: Any, rows: Any, tmp_path: Path) -> None:
    sink = make(tmp_path, "jsonl")
    handle = sink.write(9, rows)
    sink.abort(9, handle)
    assert not (tmp_path / "_staging" / "epoch-00000009").exists()
    assert visible(tmp_path) == []


def test_rewriting_an_epoch_replaces_its_staged_files(make: Any, rows: Any,
                                                      tmp_path: Path) -> None:
    sink = make(tmp_path, "jsonl")
    sink.write(2, rows)
    handle = sink.write(2, rows.where("user = 'a'"))
    sink.commit(2, handle)
    content = "".join((tmp_path / n).read_text() for n in visible(tmp_path))
    assert [json.loads(line)["user"] for line in content.splitlines()] == ["a"]


def test_commit_without_staged_or_final_files_fails_clearly(make: Any, rows: Any,
                                                           tmp_path: Path) -> None:
    sink = make(tmp_path, "jsonl")
    handle = sink.write(6, rows)
    sink.abort(6, handle)
    with pytest.raises(ConnectorError) as err:
        sink.commit(6, handle)
    assert "sink 'out' cannot commit epoch 6" in str(err.value)


def test_memory_url(make: Any, rows: Any) -> None:
    root = f"memory://streamer-tests/{uuid.uuid4().hex}/out"
    fs = fsspec.filesystem("memory")
    try:
        sink = make(root, "jsonl")
        handle = sink.write(1, rows)
        assert sink.committed_files() == []
        sink.commit(1, handle)
        names = sink.committed_files()
        assert names and names[0] == "part-00000001-00000.jsonl"
        text = "".join(fs.cat(f"{root}/{n}").decode() for n in names)
        assert sorted(json.loads(line)["ts"] for line in text.splitlines()) == [
            "2026-01-01T00:01:00.123456Z", "2026-01-01T00:01:00.5Z", "2026-01-01T00:01:00Z"]
        assert not fs.exists(f"{root}/_staging/epoch-00000001")
    finally:
        fs.rm(root.removeprefix("memory://").rsplit("/", 1)[0], recursive=True)


def test_iso_timestamps_strip_only_trailing_fraction_zeros(spark: Any) -> None:
    df = spark.sql("SELECT TIMESTAMP'2026-01-01 00:00:10' AS a, "
                   "TIMESTAMP'2026-01-01 10:00:00.100' AS b, "
                   "TIMESTAMP_NTZ'2026-01-01 00:01:00.5' AS c, DATE'2026-01-02' AS d, 1 AS e")
    (row,) = timestamps_as_iso(df).collect()
    assert tuple(row) == ("2026-01-01T00:00:10Z", "2026-01-01T10:00:00.1Z",
                          "2026-01-01T00:01:00.5Z", "2026-01-02", 1)
    # Values collected from Spark are rendered the same way in Python.
    assert json_value(datetime.datetime(2026, 1, 1, 0, 0, 10)) == "2026-01-01T00:00:10Z"
    assert json_value(datetime.datetime(2026, 1, 1, 10, 0, 0, 100000,
                                        tzinfo=datetime.UTC)) == "2026-01-01T10:00:00.1Z"


def test_staging_is_removed_only_when_nothing_is_staged(make: Any, rows: Any,
                                                        tmp_path: Path) -> None:
    sink = make(tmp_path, "jsonl")
    first, second = sink.write(1, rows), sink.write(2, rows)
    sink.commit(1, first)
    assert [p.name for p in (tmp_path / "_staging").iterdir()] == ["epoch-00000002"]
    sink.commit(2, second)
    assert not (tmp_path / "_staging").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == visible(tmp_path)
