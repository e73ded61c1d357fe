"""Local epochs (`runtime.plan.local`): a small datagen slice is an inline table that Spark
evaluates on the driver, so a stateless epoch runs no Spark job at all. Its rows, its sinks'
files, its counts and its watermark equal those of the same job with local epochs off
(`STREAMER_LOCAL_ROWS=0`), which runs Spark jobs."""

from __future__ import annotations

import datetime
import decimal
import json
import re
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from streamer.connectors.builtin.memory_sink import MemorySink
from streamer.exceptions import StreamerError
from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.coordinator import JobRunner, RunOptions
from streamer.runtime.plan.local import local_table

pytestmark = pytest.mark.spark

PIPELINE = """
name: local-{mode}
job:
  parallelism: 2
sources:
  - id: gen
    type: datagen
    splits: 2
    limit: 300
    max_records_per_epoch: 200
    event_time: ts
    fields:
      user: "concat('u', cast(offset * 7 % 13 as string))"
      amount: "cast(offset % 10 as double)"
      ts: "timestamp_millis(1700000000000L + offset * 1000 + split * 250)"
      day: "date_add(date'2024-02-28', cast(offset % 3 as int))"
      price: "cast(offset / 8 as decimal(10, 2))"
      maybe: "if(offset % 4 = 0, null, offset)"
operators:
  - id: some
    input: gen
    filter: "amount > 2"
sinks:
{sink}
"""

SINKS = {
    "memory": """  - id: out
    type: console
    input: some""",
    "parquet": """  - id: out
    type: files
    input: some
    path: "{out}"
    format: parquet""",
}


def run(spark, tmp_path: Path, sink: str, mode: str):
    out = tmp_path / f"out-{mode}"
    spec = load_pipeline_text(textwrap.dedent(PIPELINE.format(
        mode=mode, sink=SINKS[sink].format(out=out))))
    runner = JobRunner(spec, RunOptions(ui=False, checkpoints=False, fresh=True,
                                        storage=str(tmp_path / f"storage-{mode}")),
                       spark=spark, sink_factory=None if sink == "parquet" else MemorySink)
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup(None))
    result = runner.run()
    jobs = set(tracker.getJobIdsForGroup(None)) - before
    return runner, result, out, jobs


def committed(runner, sink: str, out: Path) -> list[dict]:
    if sink == "memory":
        rows = runner.sinks["out"].committed
    else:
        rows = [r for f in sorted(out.glob("part-*.parquet"))
                for r in pq.read_table(f).to_pylist()]
    return sorted(rows, key=lambda r: (r["ts"], r["user"]))


@pytest.mark.parametrize("sink", list(SINKS))
def test_a_local_epoch_runs_no_spark_job_and_equals_the_spark_one(spark, tmp_path: Path,
                                                                  monkeypatch, sink: str) -> None:
    monkeypatch.setenv("STREAMER_LOCAL_ROWS", "0")
    s_runner, s_result, s_out, s_jobs = run(spark, tmp_path, sink, "spark")
    monkeypatch.delenv("STREAMER_LOCAL_ROWS")
    l_runner, l_result, l_out, l_jobs = run(spark, tmp_path, sink, "local")

    assert s_jobs, "with local epochs off, every epoch runs Spark jobs"
    assert not l_jobs, f"local epochs ran Spark jobs {sorted(l_jobs)}"
    assert [m.local for m in l_result.metrics] == [["gen", "out"]] * 3
    assert all(m.local == [] for m in s_result.metrics)

    expected = committed(s_runner, sink, s_out)
    assert len(expected) == 2 * 300 * 7 // 10  # per split: amount 0, 1 and 2 filtered out
    assert committed(l_runner, sink, l_out) == expected
    assert [(m.records_in, m.records_out, m.watermark) for m in l_result.metrics] == [
        (m.records_in, m.records_out, m.watermark) for m in s_result.metrics]
    assert l_result.metrics[-1].watermark is not None
    # The filter's own counts: the same whether counted on the driver or observed.
    assert [m.operators for m in l_result.metrics] == [m.operators for m in s_result.metrics]
    assert [m.operators["some"]["filtered"] for m in l_result.metrics] == [
        m.filtered for m in l_result.metrics]
    assert sum(m.operators["some"]["out"] for m in l_result.metrics) == len(expected)
    if sink == "parquet":  # Spark's schema and types, as Spark's writer leaves them
        spark_file = next(s_out.glob("part-*.parquet"))
        local_file = next(l_out.glob("part-*.parquet"))
        assert pq.read_schema(local_file) == pq.read_schema(spark_file)
        footers = [{k: json.loads(v) if k.endswith(b"metadata") else v
                    for k, v in pq.read_schema(f).metadata.items()}
                   for f in (local_file, spark_file)]
        assert footers[0] == footers[1]
        assert [c.physical_type for c in pq.ParquetFile(local_file).schema] == [
            c.physical_type for c in pq.ParquetFile(spark_file).schema]
        assert (spark.read.parquet(str(l_out)).schema == spark.read.parquet(str(s_out)).schema)
        assert not list((l_out / "_staging").glob("epoch-*"))


def test_local_table_gives_what_to_arrow_gives(spark) -> None:
    df = spark.sql("""SELECT * FROM VALUES
        (1, 'a', timestamp'2024-03-01 10:00:00.123456', date'2024-02-29', 1.5D,
         CAST(2.25 AS DECIMAL(10, 2)), true, X'0102', timestamp_ntz'2024-03-01 10:00:00'),
        (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)
        AS t(i, s, ts, d, f, dec, b, bin, ntz)""").filter("i > 0")
    table = local_table(df)
    assert table is not None
    assert table.equals(df.toArrow())
    assert table.column("ts")[0].as_py() == datetime.datetime(
        2024, 3, 1, 10, 0, 0, 123456, tzinfo=datetime.UTC) or str(
        spark.conf.get("spark.sql.session.timeZone")) != "UTC"
    assert table.column("dec")[0].as_py() == decimal.Decimal("2.25")
    # Needs a job (an aggregate) or holds a nested column: left to toArrow.
    assert local_table(df.groupBy("s").count()) is None
    assert local_table(df.selectExpr("array(i) AS a")) is None


def test_a_bad_local_rows_setting_is_a_clear_error(spark, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("STREAMER_LOCAL_ROWS", "lots")
    with pytest.raises(StreamerError, match=re.escape(
            "STREAMER_LOCAL_ROWS='lots' is not valid: it overrides job.execution.local_rows")):
        run(spark, tmp_path, "memory", "bad")


BAD_FIELD = """
name: local-bad-{mode}
job:
  restart: {{attempts: 0}}
sources:
  - id: gen
    type: datagen
    limit: 10
    fields:
      n: "cast(concat('x', offset) as int)"
{event_time}sinks:
  - id: out
    type: console
    input: gen
"""


@pytest.mark.parametrize("event_time", [False, True])
def test_a_record_that_fails_its_expressions_fails_a_local_epoch_as_it_fails_a_spark_one(
        spark, tmp_path: Path, monkeypatch, event_time: bool) -> None:
    """Spark evaluates a local relation's expressions while it optimizes the plan, outside
    any job: the error must still be the epoch's clear failure, not an internal error."""
    from streamer.runtime.exceptions import JobFailedError

    messages = {}
    for mode in ("spark", "local"):
        if mode == "spark":
            monkeypatch.setenv("STREAMER_LOCAL_ROWS", "0")
        else:
            monkeypatch.delenv("STREAMER_LOCAL_ROWS")
        spec = load_pipeline_text(textwrap.dedent(BAD_FIELD.format(
            mode=mode, event_time="    event_time: timestamp_seconds(n)\n" if event_time
            else "")))
        runner = JobRunner(spec, RunOptions(ui=False, checkpoints=False, fresh=True,
                                            storage=str(tmp_path / f"storage-{mode}")),
                           spark=spark, sink_factory=MemorySink)
        with pytest.raises(JobFailedError) as failed:
            runner.run()
        messages[mode] = str(failed.value)
    for text in messages.values():
        assert text.startswith("epoch 1 failed in "), text
        assert "[CAST_INVALID_INPUT] The value 'x0'" in text, text


KEYED = """
name: local-keyed-{mode}
job:
  parallelism: 2
  max_parallelism: 16
  state: {{backend: {backend}, local_dir: "{state}"}}
sources:
  - id: gen
    type: datagen
    splits: 2
    limit: 150
    max_records_per_epoch: 100
{event_time}    fields:
      user: "concat('u', cast(offset * 7 % 13 as string))"
      amount: "cast(offset % 10 as double)"
      ts: "timestamp_millis(1700000000000L + offset * 1000 + split * 250)"
operators:
  - id: agg
    input: gen
    key_by: [user]
{operator}
sinks:
  - id: out
    type: console
    input: agg
"""

KEYED_CASES = {
    "rolling": ("", "    aggregate: {n: count(), total: sum(amount), last: max(ts)}"),
    "tumbling": ("    event_time: ts\n",
                 "    window: {tumbling: 20s}\n"
                 "    aggregate: {n: count(), low: min(amount), first: min(ts)}"),
}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["rocksdb", "memory"])
@pytest.mark.parametrize("case", list(KEYED_CASES))
def test_a_local_keyed_epoch_runs_in_the_driver_or_one_plain_job_and_equals_the_spark_path(
        spark, tmp_path: Path, monkeypatch, case: str, backend: str) -> None:
    event_time, operator = KEYED_CASES[case]
    found = {}
    for mode in ("spark", "rdd", "driver"):
        monkeypatch.delenv("STREAMER_LOCAL_ROWS", raising=False)
        monkeypatch.delenv("STREAMER_DRIVER_SUBTASKS", raising=False)
        if mode == "spark":
            monkeypatch.setenv("STREAMER_LOCAL_ROWS", "0")
        elif mode == "rdd":
            monkeypatch.setenv("STREAMER_DRIVER_SUBTASKS", "0")
        spec = load_pipeline_text(textwrap.dedent(KEYED.format(
            mode=mode, backend=backend, state=tmp_path / f"state-{mode}",
            event_time=event_time, operator=operator)))
        runner = JobRunner(spec, RunOptions(ui=False, checkpoints=False, fresh=True,
                                            storage=str(tmp_path / f"storage-{mode}")),
                           spark=spark, sink_factory=MemorySink)
        tracker = spark.sparkContext.statusTracker()
        before = set(tracker.getJobIdsForGroup(None))
        result = runner.run()
        jobs = set(tracker.getJobIdsForGroup(None)) - before
        sink = runner.sinks["out"]
        found[mode] = {
            "rows": [sorted(map(json.dumps, sink.rows_of(e))) for e in sink.epochs],
            "counts": [(m.records_in, m.records_out, m.watermark, m.operators)
                       for m in result.metrics],
        }
        assert len([m for m in result.metrics if m.records_in]) == 3
        # The operator's rows out (its subtasks' metadata) are the rows the sink received.
        assert [m.operators["agg"]["out"] for m in result.metrics] == [
            m.records_out.get("out", 0) for m in result.metrics]
        stages = [len(tracker.getJobInfo(j).stageIds) for j in sorted(jobs)]
        if mode == "spark":
            assert all(m.local == [] for m in result.metrics)
            assert max(stages) > 1
        else:
            assert all(m.local[-2:] == ["agg", "out"] for m in result.metrics)
            # rdd: one plain job per epoch, of one stage: no scan, no shuffle, no Python
            # stage; driver: the driver runs the subtasks, no job at all.
            assert stages == ([1] * len(result.metrics) if mode == "rdd" else [])
            assert all(m.keyed_ms is not None for m in result.metrics)
        # The driver keeps nothing of the run open or cached once it ends.
        from streamer.state import memory_files, rocksdb_parking

        held = [*rocksdb_parking.parked_paths(), *memory_files.cached_paths()]
        assert not [path for path in held if path.startswith(str(tmp_path))]
    assert found["rdd"] == found["spark"]
    assert found["driver"] == found["spark"]
    assert sum(map(len, found["driver"]["rows"])), "nothing to compare"


def test_create_dataframe_drops_rows_after_an_empty_arrow_chunk(spark) -> None:
    """Why `KeyedStage._local_output` combines the chunks of the output table: PySpark's
    `createDataFrame` of an Arrow table stops at an empty chunk. If this starts failing,
    PySpark fixed it and the workaround can go."""
    import pyarrow as pa

    schema = pa.schema([("a", pa.int64())])
    table = pa.concat_tables([pa.table({"a": [1, 2]}, schema=schema), schema.empty_table(),
                              pa.table({"a": [3]}, schema=schema)])
    assert [b.num_rows for b in table.to_batches()] == [2, 0, 1]
    assert [r.a for r in spark.createDataFrame(table).collect()] == [1, 2]
    assert [r.a for r in spark.createDataFrame(table.combine_chunks()).collect()] == [1, 2, 3]


KEYED_TO_FILES = KEYED.replace("""  - id: out
    type: console
    input: agg""", """  - id: out
    type: files
    input: agg
    path: "{out}"
    format: parquet""")


@pytest.mark.slow  # 3-6 s each
@pytest.mark.parametrize("case", list(KEYED_CASES))
def test_local_keyed_subtasks_write_the_parquet_sink_as_spark_does(
        spark, tmp_path: Path, monkeypatch, case: str) -> None:
    """The keyed subtasks of local epochs write the files sink's staging files themselves
    (in the driver or in one plain job); the sink commits exactly what Spark writes."""
    event_time, operator = KEYED_CASES[case]
    found = {}
    for mode in ("spark", "rdd", "driver"):
        monkeypatch.delenv("STREAMER_LOCAL_ROWS", raising=False)
        monkeypatch.delenv("STREAMER_DRIVER_SUBTASKS", raising=False)
        monkeypatch.setenv("STREAMER_TASK_SINK", "0" if mode == "spark" else "1")
        if mode == "spark":
            monkeypatch.setenv("STREAMER_LOCAL_ROWS", "0")
        elif mode == "rdd":
            monkeypatch.setenv("STREAMER_DRIVER_SUBTASKS", "0")
        out = tmp_path / f"out-{mode}"
        spec = load_pipeline_text(textwrap.dedent(KEYED_TO_FILES.format(
            mode=mode, backend="rocksdb", state=tmp_path / f"state-{mode}",
            event_time=event_time, operator=operator, out=out)))
        runner = JobRunner(spec, RunOptions(ui=False, checkpoints=False, fresh=True,
                                            storage=str(tmp_path / f"storage-{mode}")),
                           spark=spark)
        result = runner.run()
        assert runner.task_sinks == ({} if mode == "spark" else {"agg": "out"})
        assert all(("agg" in m.local) == (mode != "spark") for m in result.metrics)
        files = sorted(out.glob("part-*.parquet"))
        assert sorted(p for p in out.rglob("*") if p.is_file()) == files
        found[mode] = {
            "rows": sorted(json.dumps(r, default=str) for f in files
                           for r in pq.read_table(f).to_pylist()),
            "counts": [(m.records_in, m.records_out) for m in result.metrics],
        }
    assert found["spark"]["rows"], "nothing to compare"
    assert found["rdd"] == found["spark"]
    assert found["driver"] == found["spark"]


def test_timers_after_big_epochs_fire_on_the_spark_path(spark, tmp_path: Path,
                                                        monkeypatch) -> None:
    """An epoch without input runs locally only when the stage's last input did: after big
    epochs its timers may fire many windows, which Spark's tasks fire in parallel. (A
    watched directory: a bounded source's last epoch fires its timers itself.)"""
    import json

    monkeypatch.setenv("STREAMER_LOCAL_ROWS", "50")  # below the 100 rows per epoch
    src = tmp_path / "in"
    src.mkdir()
    for f in range(3):
        (src / f"{f}.jsonl").write_text("".join(json.dumps({
            "user": f"u{o * 7 % 13}", "amount": float(o % 10),
            "ts": (1_700_000_000_000 + o * 1000) / 1000}) + "\n"
            for o in range(f * 100, f * 100 + 100)))
    spec = load_pipeline_text(textwrap.dedent(f"""
        name: local-keyed-timers
        job:
          parallelism: 2
          max_parallelism: 16
          epoch: 100ms
          state: {{backend: rocksdb, local_dir: "{tmp_path / 'state'}"}}
        sources:
          - id: gen
            type: files
            path: {src}
            format: jsonl
            watch: true
            max_files_per_epoch: 1
            schema: {{user: string, amount: double, ts: double}}
            event_time: timestamp_seconds(ts)
        operators:
          - id: agg
            input: gen
            key_by: [user]
            window: {{tumbling: 20s}}
            aggregate: {{n: count(), low: min(amount)}}
        sinks:
          - id: out
            type: console
            input: agg
        """))
    runner = JobRunner(spec, RunOptions(ui=False, checkpoints=False, fresh=True, max_epochs=4,
                                        storage=str(tmp_path / "storage")),
                       spark=spark, sink_factory=MemorySink)
    result = runner.run()
    assert [bool(m.records_in) for m in result.metrics] == [True, True, True, False]
    assert [m.local for m in result.metrics] == [[], [], [], []]
    fired = result.metrics[-1].records_out["out"]
    assert fired > 0, "the last epoch fires the windows its watermark closed"


def test_what_fails_on_the_driver_fails_the_epoch_as_a_task_would(spark, tmp_path: Path) -> None:
    """A source's read and keyed subtasks run on the driver in local epochs; their failures
    become the failed epoch (`JobFailedError`, restarted per `job.restart`) that a failed
    Spark task gives, not an internal error."""
    from streamer.connectors.exceptions import ReadFailed
    from streamer.runtime.exceptions import JobFailedError
    from streamer.runtime.plan.keyed_plan import SubtaskFailed

    spec = load_pipeline_text(textwrap.dedent(BAD_FIELD.format(mode="guard", event_time="")))
    runner = JobRunner(spec, RunOptions(ui=False, checkpoints=False, fresh=True,
                                        storage=str(tmp_path / "storage")),
                       spark=spark, sink_factory=MemorySink)
    for what, exc in (("reading source 'gen'", ReadFailed("source 'gen' cannot read t:0")),
                      ("operator 'agg'", SubtaskFailed("subtask 1 failed: ValueError: x"))):
        def fail(exc: Exception = exc) -> None:
            raise exc

        with pytest.raises(JobFailedError) as failed:
            runner._guarded(3, what, fail)
        assert str(failed.value) == f"epoch 3 failed in {what}: {exc}"
