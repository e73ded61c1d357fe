"""Keyed stages whose input Spark computes (JSON lines, a filter, a derived column) and
stages once per epoch as local parquet files for the subtasks (`StagedRun`,
`job.execution.staged_input`) compute exactly what the Spark-routed plan computes, count
the same records, and share its state layout (a job can switch between the two)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from fragments import KEEP, derive, files_sink, files_source, section
from test_direct import agg, committed_rows, keyed_head, run, write_events

pytestmark = pytest.mark.spark



def pipeline(name: str, data: Path, out: Path, state: Path, staged: str, parallelism: int,
             backend: str, keys: str, window: str, sink: str) -> str:
    """The JSON events, filtered and derived, through test_direct's `agg` into `sink` files;
    staged input on or off (`staged`), never a local epoch."""
    return (keyed_head(name, parallelism, backend, state, execution=(
                f"{{small_epoch_rows: 0, local_rows: 0, staged_input: {staged}}}"))
            + section("sources", files_source(data, files_per_epoch=2))
            + section("operators", KEEP, derive('{qty: "qty * 2 + 1", grp: "grp + 1"}'),
                      agg("derive", keys, window))
            + section("sinks", files_sink("agg", out, sink)))


CASES = {  # name: (parallelism, backend, keys, window, sink format)
    "tumbling-rocksdb-p3": (3, "rocksdb", "[user]", "window: {tumbling: 1m}", "jsonl"),
    "sliding-lateness-memory-p2": (
        2, "memory", "[user, grp]",
        "window: {sliding: {size: 1m, slide: 20s}, allowed_lateness: 30s}", "parquet"),
    "rolling-rocksdb-p2": (2, "rocksdb", "[grp, user]", "", "jsonl"),
    "session-rocksdb-p2": (2, "rocksdb", "[user]", "window: {session: {gap: 20s}}", "jsonl"),
}


def json_events(directory: Path, files: int, rows: int, seed: int) -> None:
    """`write_events`' events (null keys and values, late records) as JSON-lines files."""
    write_events(directory / "parquet", files=files, rows=rows, seed=seed)
    for part in sorted((directory / "parquet").glob("*.parquet")):
        lines = []
        for row in pq.read_table(part).to_pylist():
            row["ts"] = row["ts"].isoformat()
            lines.append(json.dumps(row))
        (directory / "jsonl").mkdir(exist_ok=True)
        (directory / "jsonl" / f"{part.stem}.jsonl").write_text("\n".join(lines) + "\n")


def rows_of(out: Path, sink: str) -> list[str]:
    if sink == "jsonl":
        return committed_rows(out)
    rows = [r for part in sorted(out.glob("part-*.parquet")) for r in
            pq.read_table(part).to_pylist()]
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_staged_input_gives_the_spark_plans_output(spark, tmp_path: Path, monkeypatch,
                                                   case: str) -> None:
    monkeypatch.delenv("STREAMER_STAGED_INPUT", raising=False)
    json_events(tmp_path / "data", files=5, rows=400, seed=len(case))
    parallelism, backend, keys, window, sink = CASES[case]
    outputs, metrics = {}, {}
    for staged in ("false", "true"):
        out = tmp_path / f"out-{staged}"
        _, result = run(spark, pipeline(
            name=f"staged-{staged}", data=tmp_path / "data" / "jsonl", out=out,
            state=tmp_path / f"state-{staged}", staged=staged, parallelism=parallelism,
            backend=backend, keys=keys, window=window, sink=sink))
        assert result.status == "finished"
        reading = [m for m in result.metrics if m.records_in]
        assert len(reading) == 3
        # Every epoch stages its input (the end-of-input epoch reads no files).
        assert [m.staged for m in result.metrics] == (
            [["agg"]] * len(result.metrics) if staged == "true" else [[]] * len(
                result.metrics))
        assert all(not m.direct and not m.local for m in result.metrics)
        outputs[staged] = rows_of(out, sink)
        metrics[staged] = [(m.records_in, m.records_out, m.watermark, m.late, m.filtered,
                            m.operators) for m in result.metrics]
    assert outputs["false"], "the pipeline produced nothing to compare"
    assert outputs["true"] == outputs["false"]
    assert metrics["true"] == metrics["false"]
    if window:  # late records were there to be counted, the same on both paths
        assert sum(m[3] for m in metrics["true"]) > 0


@pytest.mark.slow  # 7 s
def test_staged_files_of_ended_epochs_are_removed(spark, tmp_path: Path) -> None:
    """Each epoch's staging replaces the ones before it (their subtasks have read them);
    a replayed epoch rewrites its own whole; a finished job leaves none behind."""
    from streamer.runtime.plan.keyed_plan import DirectShape
    from streamer.runtime.plan.stages.keyed_stage import StagedRun

    shape = DirectShape("", (("user", None), ("n", None)), ("string",), None)
    staged = StagedRun(None, "test", shape, str(tmp_path / "agg"))  # type: ignore[arg-type]
    frame = spark.createDataFrame([("a", 1, "x"), ("b", 2, "y")], "user string, n int, z string")
    first = staged.stage_input(1, frame)
    assert first and all(Path(f).exists() for f in first)
    again = staged.stage_input(1, frame.limit(1))  # a replay of epoch 1
    assert sum(pq.read_table(f).num_rows for f in again) == 1
    second = staged.stage_input(2, frame)
    assert [p.name for p in (tmp_path / "agg").iterdir()] == ["epoch-2"]
    assert pq.read_table(second[0]).column_names == ["user", "n"]  # only what tasks read
    assert sum(pq.read_table(f).num_rows for f in second) == 2

    json_events(tmp_path / "data", files=4, rows=100, seed=2)
    _, result = run(spark, pipeline(
        name="staged-cleanup", data=tmp_path / "data" / "jsonl", out=tmp_path / "out",
        state=tmp_path / "state", staged="true", parallelism=2, backend="memory",
        keys="[user]", window="window: {tumbling: 1m}", sink="jsonl"))
    assert result.status == "finished" and result.metrics[0].staged == ["agg"]
    assert not list((tmp_path / "state").rglob("_staged"))


@pytest.mark.slow
def test_a_checkpointed_job_can_switch_between_staged_and_routed_epochs(
        spark, tmp_path: Path, monkeypatch) -> None:
    """Stopped after staged epochs, resumed with staged input off (set by the variable):
    the same output as one uninterrupted run."""
    json_events(tmp_path / "data", files=6, rows=300, seed=9)
    data = tmp_path / "data" / "jsonl"

    def text(name: str, out: str, state: str) -> str:
        return textwrap.dedent(pipeline(
            name=name, data=data, out=tmp_path / out, state=tmp_path / state, staged="true",
            parallelism=2, backend="rocksdb", keys="[user]", window="window: {tumbling: 1m}",
            sink="jsonl")).replace("job:\n", "job:\n  checkpoint: {interval: 1ms}\n")

    options = {"checkpoints": True, "storage": str(tmp_path / "chk")}
    _, first = run(spark, text("switch", "out", "state"), max_epochs=2, **options)
    assert first.status == "stopped"
    assert [m.staged for m in first.metrics if m.records_in] == [["agg"], ["agg"]]
    monkeypatch.setenv("STREAMER_STAGED_INPUT", "0")
    _, second = run(spark, text("switch", "out", "state"), **options)
    assert second.status == "finished"
    assert all(not m.staged for m in second.metrics)
    monkeypatch.delenv("STREAMER_STAGED_INPUT")
    _, ref = run(spark, text("reference", "ref", "ref-state"))
    assert ref.status == "finished"
    assert committed_rows(tmp_path / "ref")
    assert committed_rows(tmp_path / "out") == committed_rows(tmp_path / "ref")
