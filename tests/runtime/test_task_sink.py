"""Keyed tasks that write a files sink themselves (`connectors/files_sink.TaskFile`) commit
the same files Spark's writer would. Parquet: the same rows, the same Spark schema, the same
parquet types (INT96 timestamps, as the session says). Jsonl: the same bytes, file by file,
also where the JSON encoder refused rows and Spark's writer rendered them. Both: the same
counts in the epoch metrics, and nothing left in the staging directory. `STREAMER_TASK_SINK=0`
gives Spark's writer."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from fragments import files_sink, section
from test_direct import keyed_head, source, write_events

from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.coordinator import JobRunner, RunOptions

pytestmark = pytest.mark.spark

CASES = {  # name: (backend, operators, the operator the sink reads, what reads the files)
    "tumbling, direct read": ("rocksdb", """
  - id: agg
    input: events
    key_by: [user]
    window: {tumbling: 1m}
    aggregate: {n: count(), total: sum(amount), low: min(qty)}""", "agg", "direct"),
    "sliding with a filter first, Spark read": ("memory", """
  - id: some
    input: events
    filter: "qty > 0"
  - id: agg
    input: some
    key_by: [grp]
    window: {sliding: {size: 1m, slide: 20s}}
    aggregate: {n: count(), high: max(amount)}""", "agg", "spark"),
    "tumbling with a mean (doubles Java 17 may print otherwise)": ("memory", """
  - id: agg
    input: events
    key_by: [grp]
    window: {tumbling: 1m}
    aggregate: {n: count(), mean: avg(qty), total: sum(amount)}""", "agg", "direct"),
    "dedupe": ("rocksdb", """
  - id: timed
    input: events
    filter: "ts IS NOT NULL"
  - id: agg
    input: timed
    key_by: [user]
    dedupe: {within: 1m}""", "agg", "spark"),
}


def run(spark, tmp_path: Path, case: str, mode: str, fmt: str = "parquet"):
    """The case's pipeline with STREAMER_TASK_SINK=`mode` (set by the caller): (runner,
    result, output directory, committed files), checked to have finished with committed
    files only, task-written when `mode` is 1."""
    backend, operators, last, _ = CASES[case]
    out = tmp_path / f"out-{mode}"
    spec = load_pipeline_text(
        keyed_head(f"task-sink-{mode}", 2, backend, tmp_path / f"state-{mode}",
                   checkpoint="{interval: 1ms, mode: exactly_once}")
        + source(tmp_path / "data") + section("operators", operators.lstrip("\n") + "\n")
        + section("sinks", files_sink(last, out, fmt)))
    runner = JobRunner(spec, RunOptions(ui=False, checkpoints=True, fresh=True,
                                        storage=str(tmp_path / f"storage-{mode}")),
                       spark=spark)
    result = runner.run()
    assert result.status == "finished"
    assert runner.task_sinks == ({"agg": "out"} if mode == "1" else {})
    files = sorted(out.glob(f"part-*.{fmt}"))
    assert files, "the pipeline produced nothing to compare"
    assert sorted(p for p in out.rglob("*") if p.is_file()) == files, \
        "something besides committed files was left"
    return runner, result, out, files


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_task_written_parquet_equals_sparks(spark, tmp_path: Path, monkeypatch,
                                            case: str) -> None:
    write_events(tmp_path / "data", files=5, rows=300, seed=len(case))
    found = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("STREAMER_TASK_SINK", mode)
        runner, result, out, files = run(spark, tmp_path, case, mode)
        assert (runner.keyed["agg"].direct is not None) == (CASES[case][3] == "direct")
        frame = spark.read.parquet(str(out))
        found[mode] = {
            "rows": sorted(map(repr, frame.collect())),
            "spark schema": frame.schema,
            "parquet types": {tuple((c.name, c.physical_type, str(c.logical_type))
                                    for c in pq.ParquetFile(p).schema) for p in files},
            "counts": [(m.records_in, m.records_out) for m in result.metrics],
            "footers": {json.dumps({k.decode(): json.loads(v) if k.endswith(b"metadata") else
                                    v.decode() for k, v in pq.read_schema(p).metadata.items()},
                                   sort_keys=True) for p in files},
        }
    assert found["1"]["rows"] == found["0"]["rows"]
    assert found["1"]["spark schema"] == found["0"]["spark schema"]
    assert found["1"]["parquet types"] == found["0"]["parquet types"]
    assert found["1"]["counts"] == found["0"]["counts"]
    assert found["1"]["footers"] == found["0"]["footers"]  # Spark's schema and version


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_task_written_jsonl_is_sparks_bytes(spark, tmp_path: Path, monkeypatch,
                                             case: str) -> None:
    write_events(tmp_path / "data", files=5, rows=300, seed=len(case))
    found = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("STREAMER_TASK_SINK", mode)
        _, result, _, files = run(spark, tmp_path, case, mode, fmt="jsonl")
        refused = [why for m in result.metrics for name, why in m.sink_refused.items()
                   if name.startswith("out subtask")]
        found[mode] = {"files": [p.read_bytes() for p in files], "refused": refused,
                       "counts": [(m.records_in, m.records_out) for m in result.metrics]}
    assert found["1"]["files"] == found["0"]["files"]
    assert found["1"]["counts"] == found["0"]["counts"]
    assert not found["0"]["refused"]
    # Means like 12.333333333333334 need 17 digits: under Java 17's rule those subtasks'
    # rows went to Spark's writer; quarters (sums of `amount`) and counts never do.
    assert bool(found["1"]["refused"]) == ("mean" in case), found["1"]["refused"]


ROLLING = """
name: task-sink-or-not
sources:
  - id: events
    type: files
    path: "{data}"
    format: jsonl
    schema: {{user: string}}
operators:
  - id: agg
    input: events
    key_by: [user]
    aggregate: {{n: count()}}
{more}sinks:
  - id: out
    type: files
    input: {last}
    path: "{out}"
    format: {fmt}
{extra}"""
BIG = """  - id: big
    input: agg
    filter: "n > 1"
"""
CONSOLE = """  - id: other
    type: console
    input: big
"""
WRITERS = {  # name: (format, operators after agg, the sink's input, more sinks, task-written)
    "a parquet sink fed by the keyed stage": ("parquet", "", "agg", "", True),
    "a jsonl sink": ("jsonl", "", "agg", "", True),
    "a csv sink": ("csv", "", "agg", "", False),
    "an operator between": ("parquet", BIG, "big", "", False),
    "a second reader of the keyed output": ("parquet", BIG, "agg", CONSOLE, False),
}


@pytest.mark.parametrize("case", list(WRITERS))
def test_only_a_local_file_sink_fed_by_the_keyed_stage_alone_is_task_written(
        spark, tmp_path: Path, case: str) -> None:
    fmt, more, last, extra, written = WRITERS[case]
    text = ROLLING.format(data=tmp_path, out=tmp_path / "out", fmt=fmt, more=more, last=last,
                          extra=extra)
    runner = JobRunner(load_pipeline_text(text), RunOptions(ui=False), spark=spark)
    runner.prepare()
    assert runner.task_sinks == ({"agg": "out"} if written else {})
