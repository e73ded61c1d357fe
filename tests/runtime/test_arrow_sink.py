"""A stateless pipeline whose sink's staging files the source's Arrow tasks write
(`runtime.arrow.arrow_input` with a `ToSink` target, `ArrowWrittenSink`): the committed files hold
exactly what Spark's reader and writer give (jsonl byte for byte), the epoch's metrics
agree, a file the tasks refuse is read and written by Spark in the same epoch (its bad
records dead letters as before), and the plan says which path each stage takes and why."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from fragments import files_sink, job, kafka_sink, section
from test_arrow_input import epoch_metrics, kafka_events
from test_direct import run
from test_staged import json_events

from streamer.connectors.arrow.arrow_json_writer import jvm_prints_shortest

pytestmark = pytest.mark.spark

PIPELINE = """
name: {name}
job:
  parallelism: 2
  execution: {{small_epoch_rows: 0, local_rows: 0, arrow_input: {arrow}}}
sources:
  - id: events
    type: files
    path: "{data}"
    format: {source_format}
    schema: {{user: string, grp: int, ts: timestamp, amount: double, qty: bigint}}
    max_files_per_epoch: 2
    event_time: ts
    watermark: {{max_out_of_orderness: 5s}}
    on_error: dead
{operators}
sinks:
  - id: out
    type: files
    input: {last}
    path: "{out}"
    format: {sink_format}
  - id: dead
    type: files
    path: "{dead}"
    format: jsonl
"""

OPERATORS = """operators:
  - {id: keep, input: events, filter: "qty >= 0 or amount is null"}
  - {id: derive, input: keep, with_columns: {qty: "qty * 2 + 1", half: "amount / 2"}}
  - {id: pick, input: derive, select: {user: user, ts: ts, qty: qty, half: half, grp1: "grp + 1"}}
"""


def committed(out: Path, fmt: str) -> list[str]:
    """The committed rows: jsonl lines as written (bytes), parquet rows as JSON."""
    if fmt == "jsonl":
        return sorted(line for part in out.glob("part-*.jsonl")
                      for line in part.read_text().splitlines())
    return sorted(json.dumps(r, sort_keys=True, default=str)
                  for part in out.glob("part-*.parquet") for r in pq.read_table(part).to_pylist())


def run_both(spark, tmp_path: Path, data: Path, *, source_format: str = "jsonl",
             sink_format: str = "jsonl", operators: bool = True):
    """The pipeline with arrow_input off and on: per mode (committed output, dead letters,
    per-epoch metrics, the run's result)."""
    found = {}
    for arrow in ("false", "true"):
        out, dead = tmp_path / f"out-{arrow}", tmp_path / f"dead-{arrow}"
        _, result = run(spark, PIPELINE.format(
            name=f"arrow-sink-{arrow}", data=data, out=out, dead=dead, arrow=arrow,
            source_format=source_format, sink_format=sink_format,
            operators=OPERATORS if operators else "", last="pick" if operators else "events"))
        assert result.status == "finished", result
        found[arrow] = (committed(out, sink_format),
                        committed(dead, "jsonl") if dead.exists() else [],
                        epoch_metrics(result), result)
    return found


@pytest.mark.slow
@pytest.mark.parametrize(("source_format", "sink_format", "operators"), [
    ("jsonl", "jsonl", True), ("jsonl", "parquet", True), ("csv", "jsonl", True),
    ("parquet", "jsonl", False)])
def test_arrow_tasks_write_what_spark_writes(spark, tmp_path: Path, monkeypatch,
                                             source_format: str, sink_format: str,
                                             operators: bool) -> None:
    monkeypatch.delenv("STREAMER_ARROW_INPUT", raising=False)
    json_events(tmp_path / "data", files=5, rows=400, seed=11)
    data = tmp_path / "data" / ("parquet" if source_format == "parquet" else "jsonl")
    if source_format == "csv":
        data = _as_csv(spark, tmp_path / "data" / "parquet", tmp_path / "data" / "csv")
    found = run_both(spark, tmp_path, data, source_format=source_format,
                     sink_format=sink_format, operators=operators)
    off, on = found["false"], found["true"]
    assert off[0], "the pipeline produced nothing to compare"
    assert on[0] == off[0]
    assert on[2] == off[2]  # records in and out, filter counts, watermarks
    reading = [m for m in on[3].metrics if m.records_in]
    assert [m.arrow_decoded for m in reading] == [{"events": 2}, {"events": 2}, {"events": 1}]
    assert all(not m.arrow_refused and not m.sink_refused for m in reading)
    assert all(not m.arrow_decoded for m in off[3].metrics)
    assert not list((tmp_path / "out-true").glob("_staging/*"))


def _as_csv(spark, parquet: Path, target: Path) -> Path:
    """Each parquet file as one CSV file with a header, as Spark's CSV writer writes it."""
    target.mkdir()
    for part in sorted(parquet.glob("*.parquet")):
        scratch = target / f".{part.stem}"
        spark.read.parquet(str(part)).coalesce(1).write.option("header", True).csv(str(scratch))
        (written,) = scratch.glob("part-*.csv")
        written.rename(target / f"{part.stem}.csv")
        for leftover in scratch.iterdir():
            leftover.unlink()
        scratch.rmdir()
    return target


@pytest.mark.slow
def test_refused_files_are_read_and_written_by_spark_in_the_same_epoch(
        spark, tmp_path: Path, monkeypatch) -> None:
    """A file with undecodable lines and one with a record without event time go to Spark,
    whose rows are written beside the tasks' files; the dead letters are as before."""
    monkeypatch.delenv("STREAMER_ARROW_INPUT", raising=False)
    json_events(tmp_path / "data", files=5, rows=300, seed=5)
    data = tmp_path / "data" / "jsonl"
    bad = data / "part-001.jsonl"
    lines = bad.read_text().splitlines()
    lines[10] = lines[10][:20]  # cut short
    bad.write_text("\n".join(lines) + "\n")
    untimed = data / "part-003.jsonl"
    lines = untimed.read_text().splitlines()
    row = json.loads(lines[5])
    row["ts"] = None
    lines[5] = json.dumps(row)
    untimed.write_text("\n".join(lines) + "\n")

    found = run_both(spark, tmp_path, data)
    off, on = found["false"], found["true"]
    assert on[0] == off[0] and on[0]
    assert on[1] == off[1] and len(on[1]) == 2
    assert on[2] == off[2]
    refused = {}
    for m in on[3].metrics:
        refused.update(m.arrow_refused)
    assert sorted(refused) == [str(bad), str(untimed)], refused
    both = [m for m in on[3].metrics if m.records_in and m.arrow_refused]
    assert both and all(m.arrow_decoded == {"events": 1} for m in both)


def test_doubles_the_encoder_refuses_go_to_sparks_writer(spark, tmp_path: Path,
                                                        monkeypatch) -> None:
    """A double whose text the JSON encoder cannot be sure of on this JVM (or, on Java 19+,
    every value is certain): either way the committed bytes are Spark's."""
    monkeypatch.delenv("STREAMER_ARROW_INPUT", raising=False)
    json_events(tmp_path / "data", files=3, rows=200, seed=3)
    data = tmp_path / "data" / "jsonl"
    first = data / "part-000.jsonl"
    lines = first.read_text().splitlines()
    row = json.loads(lines[0])
    row["amount"], row["qty"] = 0.30000000000000004 * 7, 5  # 17 significant digits
    lines[0] = json.dumps(row)
    first.write_text("\n".join(lines) + "\n")
    found = run_both(spark, tmp_path, data)
    off, on = found["false"], found["true"]
    assert on[0] == off[0] and on[0]
    assert on[2] == off[2]
    refused = {k: v for m in on[3].metrics for k, v in m.sink_refused.items()}
    if jvm_prints_shortest(spark):
        assert not refused
    else:  # Java 17: the task of the first file left its rows to Spark's writer
        assert list(refused) == [f"out task {first}"], refused
        assert "15" in refused[f"out task {first}"]


def test_the_plan_names_the_arrow_written_sink(spark, tmp_path: Path, monkeypatch) -> None:
    from streamer.pipeline.validate import load_pipeline_text
    from streamer.runtime.job.checks import physical_plan

    monkeypatch.delenv("STREAMER_ARROW_INPUT", raising=False)
    for arrow, source_strategy, sink_strategy in (
            ("true", "arrow-tasks", "written-by-arrow-tasks"),
            ("false", "spark-scan", "spark-writer")):
        text = PIPELINE.format(name="plan", data=tmp_path, out=tmp_path / "out",
                               dead=tmp_path / "dead", arrow=arrow, source_format="jsonl",
                               sink_format="jsonl", operators=OPERATORS, last="pick")
        stages = {s["stage"]: s for s in (stage.describe() for stage in physical_plan(
            load_pipeline_text(text), spark).stages)}
        assert stages["events"]["strategy"] == source_strategy
        assert stages["out"]["strategy"] == sink_strategy
        assert stages["dead"]["strategy"] == "spark-writer"  # (dead letters: Spark's)
        refusals_only = "only on what they refuse" in stages["pick"]["reason"]
        assert refusals_only == (arrow == "true")  # (the chain: what Spark still runs)
        if arrow == "false":
            assert "arrow_input is off" in stages["out"]["not_used"][0]["why"]


def kafka_pipeline(name: str, storage: Path, arrow: str, bootstrap: str, topic: str, out: str,
                   keyed: str, last: str, key: str) -> str:
    """test_arrow_input's Kafka events (and `keyed` after them) into the topic `out`, keyed
    by `key`, exactly once; arrow_input and the task-written sink both on or off."""
    return (job(name, storage=f'"{storage}"', checkpoint="{interval: 1h, mode: exactly_once}",
                backend="rocksdb", local_dir=f'"{storage}/state"', execution=(
                    f"{{small_epoch_rows: 0, local_rows: 0, arrow_input: {arrow}, "
                    f"task_sink: {arrow}}}"))
            + kafka_events(bootstrap, topic, 500, "at") + (keyed + "\n" if keyed else "")
            + section("sinks", kafka_sink(last, bootstrap, out, key=key),
                      files_sink(None, f'"{storage}/dead"', id="dead")))
WINDOW = """  - id: keyed
    input: derive
    key_by: [user]
    window: {tumbling: 1m}
    aggregate: {n: count(), total: sum(amount), last: max(at)}"""


@pytest.mark.kafka
@pytest.mark.parametrize("keyed", [False, True])
def test_kafka_records_staged_by_tasks(spark, kafka, tmp_path: Path, monkeypatch,
                                       keyed: bool) -> None:
    """Kafka JSON values in, exactly-once Kafka out: the records the Arrow tasks (stateless)
    or the keyed subtasks (windows) stage are, key and value byte for byte, what Spark's
    `to_json` gives with the tasks off; the marker moves with them; a range with a bad value
    goes to Spark in the same epoch, its rows staged beside the tasks'."""
    import random
    import uuid
    from collections import Counter

    monkeypatch.delenv("STREAMER_ARROW_INPUT", raising=False)
    monkeypatch.delenv("STREAMER_TASK_SINK", raising=False)
    topic = kafka.create_topic(f"arrow-sink-{uuid.uuid4().hex[:8]}", 2)
    rng = random.Random(9)
    records = []
    for i in range(2400):
        value = {"id": i, "user": f"u{rng.randrange(30)}", "amount": float(rng.randrange(40)),
                 "ts": 1767225600000 + i * 150 - rng.randrange(4000)}
        if i % 97 == 0:
            value["amount"] = 10.1 * 3  # (17 digits: a double Java 17 may print otherwise)
        records.append((None, value, i % 2))
    records[701] = (None, "{not json", 1)
    kafka.produce(topic, records)
    found = {}
    for arrow in ("false", "true"):
        out = kafka.create_topic(f"arrow-sink-out-{uuid.uuid4().hex[:8]}", 2)
        storage = tmp_path / f"st-{arrow}"
        text = kafka_pipeline(name=f"kafka-sink-{arrow}", storage=storage, arrow=arrow,
                              bootstrap=kafka.bootstrap, topic=topic, out=out,
                              keyed=WINDOW if keyed else "",
                              last="keyed" if keyed else "derive", key="user")
        if arrow == "true":
            from streamer.pipeline.validate import load_pipeline_text
            from streamer.runtime.job.checks import physical_plan

            plan = {s.node_id: s.strategy for s in physical_plan(load_pipeline_text(text),
                                                                 spark).stages}
            assert plan["out"] == ("written-by-subtasks" if keyed
                                   else "written-by-arrow-tasks"), plan
        _, result = run(spark, text, checkpoints=True)
        assert result.status == "finished", result
        found[arrow] = (Counter((k, v) for k, v, _p, _o in kafka.read(out, "read_committed")),
                        epoch_metrics(result), result, storage)
    off, on = found["false"], found["true"]
    assert sum(off[0].values()) > 100 and on[0] == off[0]
    assert on[1] == off[1]
    if keyed:
        assert all("keyed" in m.staged for m in on[2].metrics if m.records_in)
    else:
        reading = [m for m in on[2].metrics if m.records_in]
        assert all(m.arrow_decoded for m in reading)
        assert any(m.arrow_refused for m in reading)  # the bad value's range: Spark's
    assert not list((on[3] / "kafka-sink-true" / "sinks" / "out").iterdir())
    refused = [k for m in on[2].metrics for k in m.sink_refused]
    assert bool(refused) == (not jvm_prints_shortest(spark)), refused  # (Spark renders)
