"""Joins on every path a keyed stage can take: Spark routing the records to the subtasks,
the subtasks reading both parquet sources themselves, Spark staging the input as parquet
files the subtasks read, and a local epoch's rows collected on the driver. Each join kind
(interval, window, table, temporal table) and join type gives the same output rows, counts,
late drops and watermarks on each path; a table join's left records, joined a column at a
time, give what the record-by-record logic gives; and a join whose only consumer is a local
parquet sink has its subtasks write it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_direct import BASE_MS, committed_rows, run

pytestmark = pytest.mark.spark

PIPELINE = """
name: {name}
job:
  parallelism: {parallelism}
  max_parallelism: 16
  state: {{backend: {backend}, local_dir: "{state}"}}
  checkpoint: {{interval: 1ms}}
  execution: {{small_epoch_rows: 0, local_rows: {local_rows}, staged_input: {staged},
              task_sink: {task_sink}, direct_read: {direct}}}
sources:
  - id: left
    type: files
    path: "{data}/left"
    format: jsonl
    schema: {{k: bigint, u: string, a: double, ts: timestamp}}
    max_files_per_epoch: 1
    event_time: ts
    watermark: {{max_out_of_orderness: 2s}}
  - id: right
    type: files
    path: "{data}/right"
    format: jsonl
    schema: {{k: bigint, u: string, b: string, rts: timestamp}}
    max_files_per_epoch: 1
    event_time: rts
    watermark: {{max_out_of_orderness: 2s}}
operators:
  - id: keep
    input: left
    filter: "a is null or a > -80"
  - id: j
    join: {join}
sinks:
  - id: out
    type: files
    input: j
    path: "{out}"
    format: {sink}
"""

#: Spark routes every epoch; Spark stages the input for the subtasks.
PATHS = {
    "routed": {"local_rows": 0, "staged": "false", "direct": "false"},
    "staged": {"local_rows": 0, "staged": "true", "direct": "true"},
    "direct": {"local_rows": 0, "staged": "false", "direct": "true"},
}

JOINS = {
    "interval-left": "{left: keep, right: right, on: [k], type: left, between: [-3s, 6s], "
                     "right_prefix: r_}",
    "interval-full-string": "{left: keep, right: right, on: [u], type: full, "
                            "between: [0s, 10s], right_prefix: r_}",
    "window-full": "{left: keep, right: right, on: [k], type: full, window: {tumbling: 10s}, "
                   "right_prefix: r_}",
    "table-left": "{left: keep, right: right, on: [k], type: left, table: true, "
                  "right_prefix: r_}",
    "table-inner-string": "{left: keep, right: right, left_key: [u], right_key: [u], "
                          "table: true, right_prefix: r_}",
    "temporal-left": "{left: keep, right: right, on: [k], type: left, "
                     "table: {as_of: event_time}, right_prefix: r_}",
}


def write_sides(directory: Path, files: int, rows: int, seed: int) -> None:
    """Both sides as JSON lines, one file per epoch: keys from a small set (so keys meet
    across epochs), times mostly within the 2 s bound and a few far behind (late), values
    with nulls. The right side's times are unique, so which table row is newest never
    depends on arrival order."""
    rng = random.Random(seed)
    for side in ("left", "right"):
        (directory / side).mkdir(parents=True, exist_ok=True)
        for f in range(files):
            lines = []
            for i in range(rows):
                k = rng.randrange(25)
                base = BASE_MS + (f * rows + i) * 400
                back = rng.randrange(2_000) if rng.random() < 0.9 else rng.randrange(40_000)
                ts = (base - back) * 1000 + (1 if side == "right" else 0) * (i % 997)
                record = {"k": k, "u": f"u{k % 13}é", "ts" if side == "left" else "rts":
                          pa.scalar(ts, pa.timestamp("us", tz="UTC")).as_py().isoformat()}
                if side == "left":
                    record["a"] = None if rng.random() < 0.1 else rng.randrange(-99, 99) * 1.0
                else:
                    record["b"] = rng.choice(["x", "y", None])
                lines.append(json.dumps(record))
            (directory / side / f"part-{f:03d}.jsonl").write_text("\n".join(lines) + "\n")
            records = [json.loads(line) for line in lines]
            ts = "ts" if side == "left" else "rts"
            for record in records:
                record[ts] = int(pa.scalar(record[ts], pa.string()).cast(
                    pa.timestamp("us", tz="UTC")).value)
            types = {"k": pa.int64(), "u": pa.string(), "a": pa.float64(), "b": pa.string(),
                     ts: pa.timestamp("us", tz="UTC")}
            (directory / f"{side}-parquet").mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({name: pa.array([r[name] for r in records], types[name])
                                     for name in records[0]}),
                           directory / f"{side}-parquet" / f"part-{f:03d}.parquet")


def pipeline(tmp_path: Path, path: str, join: str, *, parallelism: int = 2,
             backend: str = "rocksdb", sink: str = "jsonl", task_sink: bool = True) -> str:
    name = f"jp-{path}-{sink}-{'task' if task_sink else 'spark'}"
    return PIPELINE.format(
        name=name, data=tmp_path / "data", join=JOINS[join], out=tmp_path / f"out-{name}",
        state=tmp_path / f"state-{name}", parallelism=parallelism, backend=backend,
        sink=sink, task_sink=str(task_sink).lower(), **PATHS[path])


def run_path(spark, tmp_path: Path, path: str, join: str, *, parquet: bool = False,
             **options):
    text = pipeline(tmp_path, path, join, **options)
    if parquet:  # the sources as parquet files, the join reading them directly
        text = text.replace(f'"{tmp_path / "data"}/left"', f'"{tmp_path / "data"}/left-parquet"')
        text = text.replace(f'"{tmp_path / "data"}/right"',
                            f'"{tmp_path / "data"}/right-parquet"')
        text = text.replace("format: jsonl\n    schema:", "format: parquet\n    schema:")
        text = text.replace("left: keep,", "left: left,")
        text = text.replace("  - id: keep\n    input: left\n    filter: \"a is null or a > -80\"\n",
                            "")
    return run(spark, text)


def summary(result) -> list[tuple]:
    return [(m.records_in, m.records_out, m.watermark, m.late, m.operators)
            for m in result.metrics]


@pytest.mark.slow
@pytest.mark.parametrize(("path", "join", "parallelism", "backend"), [
    ("staged", "interval-left", 2, "rocksdb"),
    ("staged", "interval-full-string", 3, "memory"),
    ("staged", "window-full", 2, "memory"),
    ("staged", "table-left", 2, "rocksdb"),
    ("staged", "table-inner-string", 3, "rocksdb"),
    ("staged", "temporal-left", 2, "memory"),
    ("direct", "interval-left", 3, "rocksdb"),
    ("direct", "interval-full-string", 2, "memory"),
    ("direct", "window-full", 2, "rocksdb"),
    ("direct", "table-left", 2, "memory"),
    ("direct", "temporal-left", 2, "rocksdb"),
])
def test_every_path_joins_as_the_routed_plan(spark, tmp_path: Path, path: str, join: str,
                                             parallelism: int, backend: str) -> None:
    """Staged: JSON sources and a filter before the join, Spark stages the input. Direct:
    parquet sources the join reads itself. Each against the routed plan on the same data."""
    parquet = path == "direct"
    write_sides(tmp_path / "data", files=4, rows=120, seed=parallelism + 10 * parquet)
    _, reference = run_path(spark, tmp_path, "routed", join, parallelism=parallelism,
                            backend=backend, parquet=parquet)
    assert reference.status == "finished"
    want = committed_rows(tmp_path / "out-jp-routed-jsonl-task")
    assert len(want) > 100
    if not join.startswith("table"):  # (a processing-time table join has no late records)
        assert sum(m.late for m in reference.metrics) > 0
    _, result = run_path(spark, tmp_path, path, join, parallelism=parallelism,
                         backend=backend, parquet=parquet)
    assert result.status == "finished"
    took = {m.epoch: getattr(m, path) for m in result.metrics if m.records_in}
    assert took and all(v == ["j"] for v in took.values()), took
    assert committed_rows(tmp_path / f"out-jp-{path}-jsonl-task") == want
    assert summary(result) == summary(reference)


def parquet_rows(directory: Path) -> list[str]:
    rows = []
    for part in sorted(directory.glob("part-*.parquet")):
        for row in pq.read_table(part).to_pylist():
            rows.append(json.dumps(row, sort_keys=True, default=str))
    return sorted(rows)


@pytest.mark.slow
def test_a_join_writes_its_local_parquet_sink_from_its_subtasks(spark, tmp_path: Path) -> None:
    from test_plan import stage

    from streamer.pipeline.validate import load_pipeline_text
    from streamer.runtime.job.checks import physical_plan

    write_sides(tmp_path / "data", files=3, rows=150, seed=7)
    text = pipeline(tmp_path, "staged", "table-left", sink="parquet")
    plan = physical_plan(load_pipeline_text(text), spark)
    assert stage(plan, "j")["writes_sink"] == "out"
    assert stage(plan, "out")["strategy"] == "written-by-subtasks"
    _, result = run(spark, text)
    _, routed = run_path(spark, tmp_path, "routed", "table-left", sink="parquet",
                         task_sink=False)
    assert result.status == routed.status == "finished"
    want = parquet_rows(tmp_path / "out-jp-routed-parquet-spark")
    assert len(want) > 300  # (the filter keeps about nine in ten)
    assert parquet_rows(tmp_path / "out-jp-staged-parquet-task") == want
    assert summary(result) == summary(routed)


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "backend"), [("between: [0s, 30s]", "rocksdb"),
                                               ("table: true", "memory")])
def test_local_epochs_join_as_the_routed_plan(spark, tmp_path: Path, kind: str,
                                              backend: str) -> None:
    """Generated slices small enough are local relations: the join runs in the driver."""
    from test_join import BASE_MS as JOIN_BASE
    from test_join import PIPELINE as JOIN_PIPELINE

    outputs, summaries = {}, {}
    for path, local_rows in (("routed", 0), ("local", 10_000)):
        text = JOIN_PIPELINE.format(
            storage=tmp_path / path / "storage", parallelism=2, backend=backend,
            local=tmp_path / path / "local", base=JOIN_BASE, out=tmp_path / path / "out")
        text = text.replace("  checkpoint: {interval: 1h}\n", "  checkpoint: {interval: 1h}\n"
                            f"  execution: {{local_rows: {local_rows}, small_epoch_rows: 0}}\n")
        text = text.replace("between: [0s, 30s]", kind)
        _, result = run(spark, text)
        assert result.status == "finished"
        reading = [m for m in result.metrics if m.records_in]
        assert len(reading) == 4
        assert all(("paid" in m.local) == (path == "local") for m in reading), (
            path, [m.local for m in reading])
        outputs[path] = committed_rows(tmp_path / path / "out")
        summaries[path] = summary(result)
    assert len(outputs["routed"]) == 400
    assert outputs["local"] == outputs["routed"]
    assert summaries["local"] == summaries["routed"]

