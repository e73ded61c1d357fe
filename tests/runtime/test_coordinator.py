"""The epoch runtime end to end on real Spark and real files."""

from __future__ import annotations

import json
import textwrap
import threading
import time
from pathlib import Path

import pytest

from streamer.connectors.exceptions import DecodeError
from streamer.pipeline.exceptions import PipelineError
from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.coordinator import JobRunner, RunOptions

pytestmark = pytest.mark.spark


def committed_rows(directory: Path) -> list[dict]:
    rows = []
    for part in sorted(directory.glob("part-*.jsonl")):
        rows += [json.loads(line) for line in part.read_text().splitlines() if line.strip()]
    return rows


def run(spark, text: str, **options) -> tuple[JobRunner, object]:
    spec = load_pipeline_text(textwrap.dedent(text))
    runner = JobRunner(spec, RunOptions(ui=False, **options), spark=spark)
    return runner, runner.run()


def test_bounded_datagen_filter_select_to_files(spark, tmp_path: Path) -> None:
    out = tmp_path / "out"
    _, result = run(spark, f"""
        name: t
        sources:
          - id: gen
            type: datagen
            splits: 2
            limit: 500
            max_records_per_epoch: 300
            fields:
              n: "offset"
              s: "split"
              ts: "timestamp_millis(1767225600000 + offset * 1000)"
        operators:
          - id: even
            input: gen
            filter: "n % 2 = 0"
          - id: shaped
            input: even
            select:
              key: "concat(cast(s as string), '-', cast(n as string))"
              ts: ts
        sinks:
          - id: out
            type: files
            input: shaped
            path: {out}
            format: jsonl
        """)
    assert result.status == "finished"
    assert result.epochs == 4  # 1,000 rows admitted 300 at a time
    assert result.records_in == 1000
    assert result.records_out == 500
    rows = committed_rows(out)
    assert sorted(r["key"] for r in rows) == sorted(
        f"{s}-{n}" for s in range(2) for n in range(0, 500, 2))
    assert rows[0]["ts"].endswith("Z") and "." not in rows[0]["ts"]
    assert not list((out / "_staging").glob("*/part-*")) if (out / "_staging").exists() else True
    assert [m.records_in["gen"] for m in result.metrics] == [300, 300, 300, 100]


def test_union_of_two_sources_and_two_sinks_of_one_operator(spark, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _, result = run(spark, f"""
        name: t
        sources:
          - id: left
            type: datagen
            limit: 10
            fields: {{v: "offset", side: "'L'"}}
          - id: right
            type: datagen
            limit: 5
            fields: {{v: "offset * 100", side: "'R'"}}
        operators:
          - id: both
            input: [left, right]
            filter: "v >= 0"
        sinks:
          - id: a
            type: files
            input: both
            path: {a}
            format: jsonl
          - id: b
            type: files
            input: both
            path: {b}
            format: csv
        """)
    rows = committed_rows(a)
    assert sorted((r["side"], r["v"]) for r in rows) == sorted(
        [("L", i) for i in range(10)] + [("R", i * 100) for i in range(5)])
    csv_lines = [line for p in sorted(b.glob("part-*.csv")) for line in p.read_text().splitlines()]
    assert len([x for x in csv_lines if x != "v,side"]) == 15
    assert result.records_out == 30


def test_dead_letters_from_files_source(spark, tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jsonl").write_text('{"id": 1, "name": "x"}\nnot json\n{"id": "two", "name": "y"}\n')
    (src / "b.jsonl").write_text('{"id": 3, "name": "z"}\n')
    good, bad = tmp_path / "good", tmp_path / "bad"
    _, result = run(spark, f"""
        name: t
        sources:
          - id: people
            type: files
            path: {src}
            format: jsonl
            schema: {{id: bigint, name: string}}
            on_error: dlq
        sinks:
          - id: good
            type: files
            input: people
            path: {good}
            format: jsonl
          - id: dlq
            type: files
            path: {bad}
            format: jsonl
        """)
    assert sorted(r["id"] for r in committed_rows(good)) == [1, 3]
    dead = committed_rows(bad)
    assert sorted(r["record"] for r in dead) == ['not json', '{"id": "two", "name": "y"}']
    assert {r["source"] for r in dead} == {"people"}
    assert all(r["split"].endswith("a.jsonl") for r in dead)
    assert all(r["error"] for r in dead)
    assert result.dead_letters == 2


def test_undecodable_record_without_on_error_fails_with_its_location(spark, tmp_path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jsonl").write_text('{"id": 1}\n{"id": oops}\n')
    with pytest.raises(DecodeError) as info:
        run(spark, f"""
            name: t
            sources:
              - id: people
                type: files
                path: {src}
                format: jsonl
                schema: {{id: bigint}}
            sinks:
              - id: out
                type: files
                input: people
                path: {tmp_path / 'out'}
                format: jsonl
            """)
    message = str(info.value)
    assert "'people'" in message and "a.jsonl" in message and "on_error" in message
    assert not list((tmp_path / "out").glob("part-*")), "a failed epoch must not commit"


@pytest.mark.slow
def test_stop_request_ends_an_unbounded_job_at_an_epoch_boundary(spark, tmp_path: Path) -> None:
    out = tmp_path / "out"
    spec = load_pipeline_text(textwrap.dedent(f"""
        name: t
        job: {{epoch: 200ms}}
        sources:
          - id: gen
            type: datagen
            rows_per_second: 1000
            fields: {{n: "offset"}}
        sinks:
          - id: out
            type: files
            input: gen
            path: {out}
            format: jsonl
        """))
    runner = JobRunner(spec, RunOptions(ui=False), spark=spark)
    threading.Timer(4.0, runner.request_stop).start()
    result = runner.run()
    assert result.status == "stopped"
    assert result.epochs >= 2
    numbers = sorted(r["n"] for r in committed_rows(out))
    # Every committed epoch is complete: offsets 0..k-1 with no gap and no duplicate.
    assert numbers == list(range(len(numbers)))
    assert len(numbers) == result.records_in == result.offsets["gen"]["0"]


@pytest.mark.slow
def test_watch_picks_up_files_that_appear_while_running(spark, tmp_path: Path) -> None:
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    (src / "001.jsonl").write_text('{"v": 1}\n')
    spec = load_pipeline_text(textwrap.dedent(f"""
        name: t
        job: {{epoch: 200ms}}
        sources:
          - id: drop
            type: files
            path: {src}
            format: jsonl
            watch: true
            schema: {{v: int}}
        sinks:
          - id: out
            type: files
            input: drop
            path: {out}
            format: jsonl
        """))
    runner = JobRunner(spec, RunOptions(ui=False), spark=spark)

    def later() -> None:
        time.sleep(2.5)
        (src / "002.jsonl").write_text('{"v": 2}\n{"v": 3}\n')
        time.sleep(3.0)
        runner.request_stop()

    threading.Thread(target=later, daemon=True).start()
    result = runner.run()
    assert result.status == "stopped"
    assert sorted(r["v"] for r in committed_rows(out)) == [1, 2, 3]
    assert result.epochs == 2


@pytest.mark.slow
def test_max_epochs_stops_a_smoke_run(spark, tmp_path: Path) -> None:
    _, result = run(spark, f"""
        name: t
        sources:
          - id: gen
            type: datagen
            max_records_per_epoch: 10
            fields: {{n: "offset"}}
        sinks:
          - id: out
            type: files
            input: gen
            path: {tmp_path / 'o'}
            format: parquet
        """, max_epochs=3)
    assert (result.status, result.epochs, result.records_in) == ("stopped", 3, 30)
    assert len(list((tmp_path / "o").glob("part-*.parquet"))) >= 3


def test_a_missing_process_class_is_reported_at_its_line(spark, tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match=r"<string>:12:14: operator 'fraud': cannot import "
                       r"module 'no_such_module_here'"):
        run(spark, f"""
            name: t
            sources:
              - id: gen
                type: datagen
                limit: 1
                fields: {{k: "offset"}}
            operators:
              - id: fraud
                input: gen
                key_by: [k]
                process: "no_such_module_here:Rule"
            sinks:
              - id: out
                type: files
                input: fraud
                path: {tmp_path / 'o'}
                format: jsonl
            """)


SMALL_AND_LARGE = """
    name: small-large
    job: {{parallelism: 2}}
    sources:
      - id: gen
        type: datagen
        splits: 2
        limit: 3000
        max_records_per_epoch: {cap}
        fields:
          user: "concat('u', cast(offset * 7 % 50 as string))"
          amount: "cast(offset % 10 as double)"
          ts: "timestamp_millis(1767225600000 + offset * 100)"
        event_time: ts
        watermark: {{max_out_of_orderness: 1s}}
    operators:
      - id: big
        input: gen
        filter: "amount > 1"
      - id: per_window
        input: big
        key_by: [user]
        window: {{tumbling: 10s}}
        aggregate: {{n: count(), spent: sum(amount), first: min(ts)}}
    sinks:
      - id: out
        type: files
        input: per_window
        path: {out}
        format: jsonl
    """


@pytest.mark.slow
def test_small_epochs_run_interpreted_and_give_the_same_results(spark, tmp_path: Path,
                                                                monkeypatch) -> None:
    """The small-epoch mode (no code generation, no adaptive execution, one shuffle
    partition) changes how Spark runs an epoch, never what it computes; the session's own
    settings are back after the run."""
    key = "spark.sql.adaptive.enabled"
    before = spark.conf.get(key)
    outputs = {}
    for mode, limit in (("codegen", "0"), ("small", "1000000"), ("mixed", "2000")):
        monkeypatch.setenv("STREAMER_SMALL_EPOCH_ROWS", limit)
        out = tmp_path / mode
        _, result = run(spark, SMALL_AND_LARGE.format(cap=2400, out=out))
        assert result.status == "finished"
        flags = [m.small for m in result.metrics]
        data = [m for m in result.metrics if m.records_in]
        if mode == "codegen":
            assert not any(flags)
        elif mode == "small":
            assert all(flags)
        else:  # 2,400-row epochs run generated code; 1,200 and the final epoch run small
            assert [m.small for m in data] == [m.records_in["gen"] <= 2000 for m in data]
            assert set(flags) == {True, False}
        assert spark.conf.get(key) == before
        outputs[mode] = sorted(json.dumps(r, sort_keys=True) for r in committed_rows(out))
    assert outputs["codegen"] and outputs["codegen"] == outputs["small"] == outputs["mixed"]


#: (format, job.execution) -> the keyed path the last epoch takes (so each is covered).
LAST_EPOCH_PATHS = {
    ("jsonl", "{}"): "spark", ("parquet", "{}"): "direct",
    ("jsonl", "{small_epoch_rows: 0, local_rows: 0}"): "staged",
    ("parquet", "{small_epoch_rows: 0, local_rows: 0}"): "direct",
    ("jsonl", "{direct_read: false, staged_input: false}"): "spark",
    ("parquet", "{direct_read: false, staged_input: false}"): "spark"}


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "execution"), sorted(LAST_EPOCH_PATHS))
def test_the_epoch_with_the_last_records_ends_the_input(spark, tmp_path: Path, fmt,
                                                        execution) -> None:
    """The end of input follows the last records in their own epoch (Flink's MAX_WATERMARK
    after them): no empty epoch follows to fire the windows or take the final checkpoint.
    Lateness in that epoch is still judged at the epoch's start: its one late record is late
    and its others count; on each path a keyed stage's epoch can take."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = 1_767_225_600_000
    src = tmp_path / "in"
    src.mkdir()
    files = [[{"user": f"u{i % 3}", "ts": base + (60 * n + i) * 1000} for i in range(30)]
             for n in range(3)]
    files[2].append({"user": "u0", "ts": base})  # the first window fired in epoch 2
    for n, rows in enumerate(files):
        table = pa.table({"user": [r["user"] for r in rows],
                          "ts": pa.array([r["ts"] * 1000 for r in rows],
                                         pa.timestamp("us", tz="UTC"))})
        if fmt == "parquet":
            pq.write_table(table, src / f"{n}.parquet")
        else:
            (src / f"{n}.jsonl").write_text("".join(
                json.dumps({"user": r["user"], "ts": r["ts"] / 1000}) + "\n" for r in rows))
    out = tmp_path / "out"
    ts_type = "timestamp" if fmt == "parquet" else "double"
    event_time = "ts" if fmt == "parquet" else "timestamp_seconds(ts)"
    _, result = run(spark, f"""
        name: last-epoch
        storage: {tmp_path / "storage"}
        job: {{parallelism: 2, checkpoint: {{interval: 1h}}, execution: {execution}}}
        sources:
          - id: events
            type: files
            path: {src}
            format: {fmt}
            schema: {{user: string, ts: {ts_type}}}
            max_files_per_epoch: 1
            event_time: {event_time}
            watermark: {{max_out_of_orderness: 0s}}
        operators:
          - id: counts
            input: events
            key_by: [user]
            window: {{tumbling: 1m}}
            aggregate: {{n: count()}}
        sinks:
          - id: out
            type: files
            input: counts
            path: {out}
            format: jsonl
        """, checkpoints=True)
    assert result.status == "finished"
    assert result.epochs == 3
    assert [m.checkpoint_id is not None for m in result.metrics] == [False, False, True]
    assert result.late == 1 and result.metrics[-1].late == 1
    last = result.metrics[-1]
    assert ("direct" if last.direct else "staged" if last.staged else "local" if last.local
            else "spark") == LAST_EPOCH_PATHS[(fmt, execution)]
    windows = sorted((r["user"], r["n"]) for r in committed_rows(out))
    assert windows == sorted((f"u{u}", 10) for u in range(3) for _ in range(3))
