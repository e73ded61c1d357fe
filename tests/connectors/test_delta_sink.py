"""The delta sink against real Delta tables (delta-rs) and a real local Spark: whole jobs that
append windows and merge a rolling aggregate, its two-phase commit done twice, and the
pipeline file's mistakes. (SIGKILL campaigns are in tests/runtime/test_delta_crash.py.)"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from fragments import BASE_MS, clicks, delta_sink, job, section, totals, window

from streamer.connectors.base import ConnectorContext
from streamer.connectors.delta.delta_sink import DeltaSink
from streamer.connectors.exceptions import ConnectorError
from streamer.pipeline.exceptions import PipelineError
from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.checks import analyze_spec
from streamer.runtime.job.coordinator import JobRunner, RunOptions

#: rows per split, and per epoch over both splits: 4 epochs of data (6 s of event time each),
#: the last one final; windows fire in the third and the fourth
LIMIT, PER_EPOCH = 240, 120

def run_job(spark: Any, root: Path, *, checkpoints: bool) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    spec = load_pipeline_text(
        job("dtest", root, backend="memory")
        + section("sources", clicks(limit=LIMIT, per_epoch=PER_EPOCH))
        + section("operators", window("per_window", "clicks", "5s"), totals())
        + section("sinks", delta_sink("per_window", root / "windows", id="windows"),
                  delta_sink("totals", root / "totals", id="totals_table", merge_key="[user]")))
    result = JobRunner(spec, RunOptions(ui=False, checkpoints=checkpoints), spark=spark).run()
    return {"epochs": result.epochs, "status": result.status}


def table_rows(path: Path) -> Counter[str]:
    """The table's rows (read with delta-rs) as a multiset of canonical JSON."""
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in rows)


def txns(path: Path) -> list[tuple[int, str, int]]:
    """(table version, app id, app version) of every `txn` action in the Delta log."""
    out = []
    for commit in sorted((path / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                out.append((int(commit.stem), action["txn"]["appId"], action["txn"]["version"]))
    return out


def datagen_rows() -> list[tuple[str, float, int]]:
    """(user, amount, ts in ms) of every row the job's source generates."""
    return [(f"u{(offset * 7 + split) % 13}", float(offset % 10), BASE_MS + offset * 100)
            for offset in range(LIMIT) for split in (0, 1)]


def utc(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def canonical(rows: Any) -> Counter[str]:
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in rows)


def expected_windows() -> Counter[str]:
    """Every 5 s window per user: its count and sum, from datagen's formulas."""
    per: dict[tuple[str, int], dict[str, Any]] = {}
    for user, amount, ts in datagen_rows():
        start = ts - ts % 5000
        row = per.setdefault((user, start), {"user": user, "window_start": utc(start),
                                             "window_end": utc(start + 5000), "n": 0,
                                             "spent": 0.0})
        row["n"] += 1
        row["spent"] += amount
    return canonical(per.values())


def expected_totals() -> Counter[str]:
    """The rolling aggregate's final row per user, from datagen's formulas."""
    per: dict[str, dict[str, Any]] = {}
    for user, amount, ts in datagen_rows():
        row = per.setdefault(user, {"user": user, "n": 0, "spent": 0.0, "last": 0})
        row["n"] += 1
        row["spent"] += amount
        row["last"] = max(row["last"], ts)
    return canonical({**r, "last": utc(r["last"])} for r in per.values())


@pytest.mark.slow
@pytest.mark.spark
def test_append_windows_and_merge_totals_exactly_once_over_epochs(
        spark: Any, tmp_path: Path) -> None:
    run = run_job(spark, tmp_path, checkpoints=True)
    assert run == {"epochs": 4, "status": "finished"}
    assert table_rows(tmp_path / "windows") == expected_windows()
    # Timestamps stay timestamps (UTC) in the table.
    schema = DeltaTable(str(tmp_path / "windows")).schema().to_arrow()
    assert schema.field("window_start").type == pa.timestamp("us", tz="UTC")
    # Merge: one row per key, its last value, after several epochs of updates.
    assert table_rows(tmp_path / "totals") == expected_totals()
    operations = [op["operation"] for op in DeltaTable(str(tmp_path / "totals")).history()]
    assert operations == ["MERGE", "MERGE", "MERGE", "WRITE"], operations
    # Every commit records its epoch under the run's app id, in the same commit.
    for table in ("windows", "totals"):
        log = txns(tmp_path / table)
        assert [version for version, _, _ in log] == list(range(len(log))), log
        assert [epoch for _, _, epoch in log] == sorted({e for _, _, e in log}), log
        assert len(log) >= 2 and len({app for _, app, _ in log}) == 1, log
    assert txns(tmp_path / "totals")[0][1].startswith("streamer.dtest.totals_table.")
    staged = tmp_path / "storage" / "dtest" / "sinks"
    assert [p for p in staged.rglob("*") if p.is_file()] == []


def sink(tmp_path: Path, spark: Any, mode: str = "append", **extra: Any) -> DeltaSink:
    options = {"key": ["k"]} if mode == "merge" else {}
    text = json.dumps({
        "name": "unit", "sources": [{"id": "gen", "type": "datagen", "fields": {"k": "offset"}}],
        "sinks": [{"id": "out", "type": "delta", "input": "gen", "path": str(tmp_path / "t"),
                   "mode": mode, **options, **extra}]})
    ctx = ConnectorContext(spark, "unit", storage_url=str(tmp_path / "storage"),
                           exactly_once=True)
    out = DeltaSink(load_pipeline_text(text).sinks[0], ctx)
    out.open()
    return out


def rows(keys: list[int], value: int) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array([value] * len(keys))})


@pytest.mark.parametrize("mode", ["append", "merge"])
def test_a_commit_done_again_after_a_crash_is_a_no_op(tmp_path: Path, mode: str) -> None:
    out = sink(tmp_path, None, mode)
    first = out.write_table(1, rows([1, 2], 10))
    staged = Path(first["file"])
    assert staged.exists() and not (tmp_path / "t").exists()  # nothing visible before commit
    copy = shutil.copy(staged, tmp_path / "copy.parquet")
    out.commit(1, first)
    assert not staged.exists()
    second = out.write_table(2, rows([2, 3], 20))
    out.commit(2, second)
    # A crash after the Delta commit but before the staged file was removed: recovery
    # commits the checkpoint's handle again, and the table says it has epoch 1.
    shutil.copy(copy, staged)
    again = sink(tmp_path, None, mode)
    again.commit(1, first)
    again.recover(2)
    assert not staged.exists()
    got = Counter((r["k"], r["v"]) for r in DeltaTable(str(tmp_path / "t")).to_pyarrow_table()
                  .to_pylist())
    want = ({(1, 10): 1, (2, 10): 1, (2, 20): 1, (3, 20): 1} if mode == "append"
            else {(1, 10): 1, (2, 20): 1, (3, 20): 1})
    assert got == Counter(want)
    # A new lineage (after recover, or --fresh) starts its epochs over: its epoch 1 commits.
    assert again.lineage != first["lineage"]
    fresh = again.write_table(1, rows([4], 40))
    again.commit(1, fresh)
    assert DeltaTable(str(tmp_path / "t")).to_pyarrow_table().num_rows == len(want) + 1


def test_merge_keeps_the_last_row_of_a_key_written_twice_in_one_epoch(tmp_path: Path) -> None:
    out = sink(tmp_path, None, "merge")
    for epoch, table in enumerate([rows([1, 2], 1), pa.table({"k": [2, 1, 2, None, None],
                                                              "v": [5, 6, 7, 8, 9]})], 1):
        out.commit(epoch, out.write_table(epoch, table))
    got = sorted(DeltaTable(str(tmp_path / "t")).to_pyarrow_table().to_pylist(),
                 key=lambda r: (r["k"] is None, r["k"]))
    assert got == [{"k": 1, "v": 6}, {"k": 2, "v": 7}, {"k": None, "v": 9}]


def test_rows_that_do_not_fit_the_table_fail_with_the_fix(tmp_path: Path) -> None:
    out = sink(tmp_path, None)
    out.commit(1, out.write_table(1, rows([1], 1)))
    wrong = pa.table({"k": pa.array([2], pa.int64()), "other": pa.array(["x"])})
    with pytest.raises(ConnectorError, match=r"sink 'out' cannot commit epoch 2 to the Delta "
                       r"table at .*; the table's columns \(k, v\).*write to a new path"):
        out.commit(2, out.write_table(2, wrong))


# --------------------------------------------------------------------- the pipeline file
def problems(body: str, spark: Any = None) -> list[str]:
    text = textwrap.dedent("""\
        name: p
        sources:
          - id: src
            type: datagen
            fields: {user: "concat('u', offset)", n: offset}
        sinks:
          - id: out
            type: delta
            input: src
        """) + textwrap.indent(textwrap.dedent(body), "    ")
    with pytest.raises(PipelineError) as info:
        spec = load_pipeline_text(text, file="p.yaml", env={})
        analyze_spec(spec, spark)
    return [str(p) for p in info.value.problems]


def test_invalid_keys_are_located() -> None:
    assert problems("mode: merge\n") == [
        "p.yaml:7:5: sink 'out' is missing required key 'path'",
        "p.yaml:10:11: mode: merge upserts rows by key; add key: [<columns>] that identify a "
        "row (e.g. the key_by columns, and window_start for windows)"]
    assert problems("path: t\nkey: [user]\n") == [
        "p.yaml:11:5: 'key' applies only to mode: merge; add mode: merge, or remove 'key'"]
    assert problems("path: t\nmode: upsert\n") == [
        "p.yaml:11:11: 'mode' must be one of append, merge; got 'upsert'"]
    assert problems("path: t\nmode: merge\nkey: [user, user]\npartition_by: 3\n") == [
        "p.yaml:12:10: 'key' names column 'user' twice; name each column once",
        "p.yaml:13:19: 'partition_by' must be a string, got 3"]
    assert problems("path: t\nstorage_option: {a: b}\n") == [
        "p.yaml:11:5: unknown key 'storage_option' in sink 'out'; did you mean "
        "'storage_options'?"]


@pytest.mark.spark
def test_key_columns_must_be_columns_of_the_input(spark: Any) -> None:
    assert problems("path: t\nmode: merge\nkey: [user, id]\npartition_by: day\n", spark) == [
        "p.yaml:12:17: sink 'out' has key: id, but its input has no such column (it has "
        "user, n); use one of them",
        "p.yaml:13:19: sink 'out' has partition_by: day, but its input has no such column "
        "(it has user, n); use one of them"]
