"""The console and memory sinks, and the registry of connector types."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import yaml
from rich.console import Console

from streamer.connectors.base import ConnectorContext
from streamer.connectors.builtin.console import ConsoleSink
from streamer.connectors.builtin.datagen import DatagenSource
from streamer.connectors.builtin.memory_sink import MemorySink
from streamer.connectors.exceptions import ConnectorError
from streamer.connectors.files.files_sink import FilesSink
from streamer.connectors.files.files_source import FilesSource
from streamer.connectors.kafka.kafka_sink import KafkaSink
from streamer.connectors.kafka.kafka_source import KafkaSource
from streamer.connectors.registry import make_sink, make_source
from streamer.pipeline.spec import PipelineSpec
from streamer.pipeline.validate import load_pipeline_text


def pipeline(sources: list[dict[str, Any]], sinks: list[dict[str, Any]]) -> PipelineSpec:
    return load_pipeline_text(yaml.safe_dump({"name": "t", "sources": sources, "sinks": sinks},
                                             sort_keys=False))


GEN = {"id": "gen", "type": "datagen", "limit": 1, "fields": {"x": "offset"}}


@pytest.fixture
def console() -> Console:
    return Console(file=io.StringIO(), width=120, color_system=None)


def output(console: Console) -> str:
    return console.file.getvalue()  # type: ignore[attr-defined]


def console_sink(spark: Any, console: Console, **options: Any) -> ConsoleSink:
    spec = pipeline([GEN], [{"id": "show", "type": "console", "input": "gen", **options}])
    return ConsoleSink(spec.sinks[0], ConnectorContext(spark, "t", console=console))


# ----------------------------------------------------------------------------- console
def test_console_prints_at_commit_not_at_write(spark: Any, console: Console) -> None:
    sink = console_sink(spark, console)
    df = spark.sql("SELECT 'a' AS user, TIMESTAMP'2026-01-01 00:01:00' AS ts, "
                   "TIMESTAMP'2026-01-01 00:01:00.5' AS ts2, CAST(NULL AS INT) AS n, "
                   "'[red]x[/red]' AS markup")
    handle = sink.write(3, df)
    assert handle == {"rows": 1}
    assert output(console) == ""
    sink.commit(3, handle)
    text = output(console)
    assert "show · epoch 3" in text
    for expected in ("user", "ts2", "2026-01-01T00:01:00Z", "2026-01-01T00:01:00.5Z", "null",
                     "[red]x[/red]"):
        assert expected in text
    sink.commit(3, handle)
    assert output(console) == text  # committed once, printed once


def test_console_truncates_to_max_rows_with_a_footer(spark: Any, console: Console) -> None:
    sink = console_sink(spark, console, max_rows=2)
    sink.commit(1, sink.write(1, spark.range(0, 7, 1, 2).selectExpr("id * 100 AS value")))
    text = output(console)
    assert "… and 5 more rows" in text
    shown = [v for v in ("0", "100", "200", "300") if f" {v} " in text]
    assert shown == ["0", "100"]


def test_console_abort_prints_nothing(spark: Any, console: Console) -> None:
    sink = console_sink(spark, console)
    handle = sink.write(1, spark.range(3))
    sink.abort(1, handle)
    sink.commit(1, handle)
    assert output(console) == ""


def test_console_nested_values_print_as_json(spark: Any, console: Console) -> None:
    sink = console_sink(spark, console)
    df = spark.sql("SELECT named_struct('at', TIMESTAMP'2026-01-01 00:00:00') AS s, "
                   "map('k', 1) AS m, array(1, 2) AS a")
    sink.commit(1, sink.write(1, df))
    text = output(console)
    assert '{"at": "2026-01-01T00:00:00Z"}' in text
    assert '{"k": 1}' in text and "[1, 2]" in text


# ------------------------------------------------------------------------------ memory
@pytest.fixture
def memory(spark: Any) -> MemorySink:
    spec = pipeline([GEN], [{"id": "out", "type": "console", "input": "gen"}])
    return MemorySink(spec.sinks[0], ConnectorContext(spark, "t"))


def test_memory_rows_are_visible_only_after_commit(spark: Any, memory: MemorySink) -> None:
    handle = memory.write(1, spark.range(2).selectExpr("id AS n"))
    assert handle == {"rows": 2}
    assert memory.committed == [] and memory.rows_of(1) == []
    memory.commit(1, handle)
    assert sorted(r["n"] for r in memory.committed) == [0, 1]
    memory.commit(1, handle)
    assert len(memory.committed) == 2
    memory.commit(2, memory.write(2, spark.range(1).selectExpr("id + 10 AS n")))
    assert memory.rows_of(2) == [{"n": 10}]
    assert memory.epochs == [1, 2]


def test_memory_values_are_json_friendly(spark: Any, memory: MemorySink) -> None:
    df = spark.sql("""
        SELECT TIMESTAMP'2026-01-01 00:01:00' AS ts, TIMESTAMP'2026-01-01 00:01:00.5' AS ts2,
               DATE'2026-01-02' AS day, 2.00BD AS whole, 1.25BD AS part, X'0102' AS raw,
               named_struct('at', TIMESTAMP'2026-01-01 00:00:00', 'd', 3.5BD) AS s,
               map('k', DATE'2026-01-05') AS m, array(TIMESTAMP'2026-01-01 00:00:01') AS a,
               CAST(NULL AS TIMESTAMP) AS missing""")
    memory.commit(1, memory.write(1, df))
    (row,) = memory.committed
    assert row == {
        "ts": "2026-01-01T00:01:00Z", "ts2": "2026-01-01T00:01:00.5Z", "day": "2026-01-02",
        "whole": 2, "part": 1.25, "raw": "AQI=",
        "s": {"at": "2026-01-01T00:00:00Z", "d": 3.5}, "m": {"k": "2026-01-05"},
        "a": ["2026-01-01T00:00:01Z"], "missing": None,
    }
    json.dumps(row)


def test_memory_abort_and_unknown_epoch(spark: Any, memory: MemorySink) -> None:
    handle = memory.write(4, spark.range(1))
    memory.abort(4, handle)
    with pytest.raises(ConnectorError, match="no staged rows for epoch 4"):
        memory.commit(4, handle)
    assert memory.committed == []


# ---------------------------------------------------------------------------- registry
def test_registry_builds_each_type(spark: Any, tmp_path: Any) -> None:
    spec = pipeline(
        [GEN, {"id": "logs", "type": "files", "path": str(tmp_path), "format": "jsonl"}],
        [{"id": "show", "type": "console", "input": "gen"},
         {"id": "out", "type": "files", "input": "logs", "path": str(tmp_path / "o"),
          "format": "csv"}])
    ctx = ConnectorContext(spark, "t")
    assert isinstance(make_source(spec.sources[0], ctx), DatagenSource)
    assert isinstance(make_source(spec.sources[1], ctx), FilesSource)
    assert isinstance(make_sink(spec.sinks[0], ctx), ConsoleSink)
    assert isinstance(make_sink(spec.sinks[1], ctx), FilesSink)


def test_registry_builds_kafka_without_a_broker(spark: Any) -> None:
    """Building the connectors contacts no broker (that happens when the job prepares)."""
    spec = pipeline(
        [{"id": "events", "type": "kafka", "bootstrap_servers": "localhost:9",
          "topic": "events", "schema": {"n": "int"}}],
        [{"id": "out", "type": "kafka", "input": "events", "bootstrap_servers": "localhost:9",
          "topic": "out"}])
    ctx = ConnectorContext(spark, "t")
    assert isinstance(make_source(spec.sources[0], ctx), KafkaSource)
    assert isinstance(make_sink(spec.sinks[0], ctx), KafkaSink)
