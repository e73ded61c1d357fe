"""Keyed operators end to end on real Spark, real RocksDB and the memory backend."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.coordinator import JobRunner, RunOptions
from streamer.state import assign_subtask, key_group_range, open_backend
from streamer.state.base import StateEntry
from streamer.state.codec import decode_key

pytestmark = pytest.mark.spark


def rows_of(directory: Path) -> list[dict]:
    return [json.loads(line) for part in sorted(directory.glob("part-*.jsonl"))
            for line in part.read_text().splitlines() if line.strip()]


def run(spark, text: str, **options):
    spec = load_pipeline_text(textwrap.dedent(text))
    runner = JobRunner(spec, RunOptions(ui=False, **options), spark=spark)
    return runner, runner.run()


def test_each_key_is_owned_by_exactly_one_subtask_across_epochs(spark, tmp_path: Path) -> None:
    out, state = tmp_path / "out", tmp_path / "state"
    runner, result = run(spark, f"""
        name: routing
        job:
          parallelism: 3
          max_parallelism: 16
          state: {{backend: rocksdb, local_dir: {state}}}
        sources:
          - id: gen
            type: datagen
            splits: 2
            limit: 150
            max_records_per_epoch: 100
            fields: {{k: "concat('key-', cast(offset % 50 as string))"}}
        operators:
          - id: counts
            input: gen
            key_by: [k]
            aggregate: {{n: count()}}
        sinks:
          - id: out
            type: files
            input: counts
            path: {out}
            format: jsonl
        """, keep_state=True)
    assert result.epochs == 3
    final: dict[str, int] = {}
    for row in rows_of(out):  # rolling: the largest count seen is the key's total
        final[row["k"]] = max(final.get(row["k"], 0), row["n"])
    assert final == {f"key-{i}": 6 for i in range(50)}
    owner: dict[str, int] = {}
    for subtask in range(3):
        groups = key_group_range(subtask, 3, 16)
        backend = open_backend("rocksdb", runner.state_root, "routing", "counts", subtask, groups)
        try:
            for kg in groups:
                for entry in backend.entries_of_key_group(kg):
                    if isinstance(entry, StateEntry):
                        (key,) = decode_key(entry.key)
                        assert key not in owner, f"{key} is in subtasks {owner[key]} and {subtask}"
                        owner[key] = subtask
                        assert assign_subtask(kg, 3, 16) == subtask
        finally:
            backend.close()
    assert set(owner) == set(final)
    # The key group is Spark's xxhash64 of the key, as documented.
    expected = {r["k"]: r["kg"] for r in spark.createDataFrame(
        [(k,) for k in owner], "k string").selectExpr("k", "pmod(xxhash64(k), 16) as kg").collect()}
    assert all(assign_subtask(expected[k], 3, 16) == s for k, s in owner.items())


WINDOWED = """
    name: windows
    job: {{parallelism: 2, max_parallelism: 8, state: {{backend: {backend}, local_dir: {state}}}}}
    sources:
      - id: gen
        type: datagen
        splits: 2
        limit: 600
        max_records_per_epoch: 300
        fields:
          user: "concat('u', cast(offset % 7 as string))"
          amount: "cast(offset % 13 as double)"
          ts: "timestamp_millis(1767225600000 + offset * 1000 + split * 7)"
        event_time: ts
        watermark: {{max_out_of_orderness: 2s}}
    operators:
      - id: per_minute
        input: gen
        key_by: [user]
        window: {{{window}}}
        aggregate: {{n: count(), total: sum(amount), hi: max(amount), avg: avg(amount),
                    firsts: first(amount), lasts: last(amount)}}
    sinks:
      - id: out
        type: files
        input: per_minute
        path: {out}
        format: jsonl
"""


@pytest.mark.slow
@pytest.mark.parametrize("window", ["tumbling: 1m", "sliding: {size: 1m, slide: 20s}",
                                    "session: {gap: 5s}"])
def test_memory_and_rocksdb_backends_give_identical_windows(spark, tmp_path, window) -> None:
    outputs = {}
    for backend in ("memory", "rocksdb"):
        out = tmp_path / backend
        run(spark, WINDOWED.format(backend=backend, state=tmp_path / f"s-{backend}", out=out,
                                   window=window))
        outputs[backend] = sorted(json.dumps(r, sort_keys=True) for r in rows_of(out))
    assert outputs["memory"] == outputs["rocksdb"]
    rows = [json.loads(r) for r in outputs["memory"]]
    if window.startswith("tumbling"):
        # 1,200 records at one per second per split over 600 s: 10 minutes x 7 users.
        assert len(rows) == 70 and sum(r["n"] for r in rows) == 1200
    elif window.startswith("sliding"):
        assert sum(r["n"] for r in rows) == 1200 * 3  # every record is in 3 windows
    else:
        assert sum(r["n"] for r in rows) == 1200


def test_dedupe_forwards_the_first_record_per_key(spark, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run(spark, f"""
        name: dedupe
        job: {{parallelism: 2}}
        sources:
          - id: gen
            type: datagen
            limit: 100
            max_records_per_epoch: 30
            fields:
              id: "offset % 10"
              seen: "offset"
              ts: "timestamp_millis(1767225600000 + offset * 1000)"
            event_time: ts
        operators:
          - id: unique
            input: gen
            key_by: [id]
            dedupe: {{within: 1h}}
        sinks:
          - id: out
            type: files
            input: unique
            path: {out}
            format: jsonl
        """)
    rows = rows_of(out)
    assert sorted((r["id"], r["seen"]) for r in rows) == [(i, i) for i in range(10)]


@pytest.mark.slow
def test_count_windows_and_processing_time_windows(spark, tmp_path: Path) -> None:
    counted, timed = tmp_path / "counted", tmp_path / "timed"
    run(spark, f"""
        name: counting
        sources:
          - id: gen
            type: datagen
            limit: 35
            max_records_per_epoch: 8
            fields:
              k: "offset % 5"
              ts: "timestamp_millis(1767225600000 + offset * 1000)"
            event_time: ts
        operators:
          - id: threes
            input: gen
            key_by: [k]
            window: {{count: 3}}
            aggregate: {{n: count(), items: collect_list(ts)}}
          - id: wall
            input: gen
            key_by: [k]
            window: {{tumbling: 1h, time: processing}}
            aggregate: {{n: count()}}
        sinks:
          - id: counted
            type: files
            input: threes
            path: {counted}
            format: jsonl
          - id: timed
            type: files
            input: wall
            path: {timed}
            format: jsonl
        """)
    windows = rows_of(counted)
    assert len(windows) == 10 and all(w["n"] == 3 for w in windows)  # 7 per key: 2 full windows
    for w in windows:
        assert w["window_start"] == w["items"][0] and w["window_end"] == w["items"][-1]
    assert sum(r["n"] for r in rows_of(timed)) == 35  # flushed at the end of the input


def test_a_retried_task_replays_its_output_instead_of_applying_the_epoch_twice(tmp_path) -> None:
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from streamer.operators.keyed import run_task
    from streamer.operators.keyed_config import KeyedConfig
    from streamer.pipeline.spec import AggregateSpec

    schema = StructType([StructField("__kind", StringType()), StructField("__meta", StringType()),
                         StructField("k", StringType()), StructField("n", LongType())])
    cfg = KeyedConfig(
        uid="op", kind="aggregate", keys=("k",), aggregates=(AggregateSpec("n", "count", None),),
        window_kind=None, size_ms=None, slide_ms=None, gap_ms=None, count=None, lateness_ms=0,
        emit="updates", domain="event", dedupe_ms=None, record_columns=("k",),
        out_schema=to_arrow_schema(schema, timezone="UTC"), backend="rocksdb",
        state_root=str(tmp_path), job="j", parallelism=1, max_parallelism=4, epoch=1,
        fire_up_to=0)
    batch = pa.RecordBatch.from_pylist(
        [{"__subtask": 0, "__kg": 1, "k": "a", "__start": 0, "__p0": 2, "__dummy": False}])

    def outputs(config: KeyedConfig) -> list[dict]:
        (result,) = list(run_task(config, iter([batch]), 0))
        return [r for r in result.to_pylist() if r["__kind"] == "out"]

    first = outputs(cfg)
    assert [(r["k"], r["n"]) for r in first] == [("a", 2)]
    assert outputs(cfg) == first  # the same epoch again: replayed, not counted twice
    from dataclasses import replace

    assert [(r["k"], r["n"]) for r in outputs(replace(cfg, epoch=2))] == [("a", 4)]


@pytest.mark.slow
@pytest.mark.parametrize("per_epoch", [10_000, 700])
def test_process_function_matches_a_brute_force_evaluation(spark, tmp_path, per_epoch) -> None:
    repo = Path(__file__).resolve().parents[2]
    text = (repo / "pipelines" / "fraud_detection.yaml").read_text()
    text = text.replace("max_records_per_epoch: 2000", f"max_records_per_epoch: {per_epoch}")
    text = text.replace("./out/fraud_alerts", str(tmp_path / "alerts"))
    text = text.replace("./out/small_transactions", str(tmp_path / "small"))
    pipeline = repo / "pipelines" / f"_fraud_{per_epoch}.yaml"  # next to fraud.py
    pipeline.write_text(text)
    try:
        spec = load_pipeline_text(text, file=str(pipeline))
        JobRunner(spec, RunOptions(ui=False), spark=spark).run()
    finally:
        pipeline.unlink()
    got = sorted((r["account"], r["amount"], r["small_amount"])
                 for r in rows_of(tmp_path / "alerts"))

    def amount(o: int) -> float:
        if o % 97 == 3:
            return 0.5
        if o % 89 == 7:
            return 900.0
        return float(o % 300) + 1.5

    events = sorted((1767225600000 + o * 500, f"acct-{(o * 13 + s) % 200}", amount(o))
                    for s in range(2) for o in range(5000))
    pending: dict[str, tuple[float, int]] = {}
    expected = []
    for ts, account, value in events:
        small = pending.get(account)
        if small and value > 500 and ts - small[1] <= 60_000:
            expected.append((account, value, small[0]))
            del pending[account]
        if value < 1:
            pending[account] = (value, ts)
    assert got == sorted(expected) and expected
    smalls = rows_of(tmp_path / "small")
    assert len(smalls) == sum(1 for _, _, v in events if v < 1)


def test_a_window_stored_in_both_layouts_fires_once_with_every_partial(tmp_path) -> None:
    """State written per key (`emit: updates`, as every version before the columnar layout
    wrote `emit: final` windows too) and columnar partials of the same window from a later
    epoch merge by key when the window fires."""
    from dataclasses import replace

    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    from streamer.operators.keyed import run_task
    from streamer.operators.keyed_config import KeyedConfig
    from streamer.pipeline.spec import AggregateSpec

    schema = StructType([StructField("__kind", StringType()), StructField("__meta", StringType()),
                         StructField("k", StringType()),
                         StructField("window_start", TimestampType()),
                         StructField("window_end", TimestampType()),
                         StructField("__ts", TimestampType()), StructField("n", LongType())])
    cfg = KeyedConfig(
        uid="op", kind="window", keys=("k",), aggregates=(AggregateSpec("n", "count", None),),
        window_kind="tumbling", size_ms=60_000, slide_ms=60_000, gap_ms=None, count=None,
        lateness_ms=0, emit="updates", domain="event", dedupe_ms=None, record_columns=("k",),
        out_schema=to_arrow_schema(schema, timezone="UTC"), backend="memory",
        state_root=str(tmp_path), job="j", parallelism=1, max_parallelism=4, epoch=1,
        fire_up_to=0)

    def run(config: KeyedConfig, rows: list[tuple[str, int]]) -> list[tuple[str, int]]:
        batch = pa.RecordBatch.from_pylist(
            [{"__subtask": 0, "__kg": 1, "k": k, "__start": 0, "__p0": n, "__dummy": False}
             for k, n in rows] or [{"__subtask": 0, "__dummy": True}],
            schema=pa.schema([("__subtask", pa.int32()), ("__kg", pa.int32()),
                              ("k", pa.string()), ("__start", pa.int64()),
                              ("__p0", pa.int64()), ("__dummy", pa.bool_())]))
        (result,) = list(run_task(config, iter([batch]), 0))
        return sorted((r["k"], r["n"]) for r in result.to_pylist() if r["__kind"] == "out")

    assert run(cfg, [("a", 2), ("b", 1)]) == [("a", 2), ("b", 1)]  # updates: emitted at once
    final = replace(cfg, emit="final")
    assert run(replace(final, epoch=2), [("a", 3), ("c", 4)]) == []  # columnar, not yet due
    assert run(replace(final, epoch=3, fire_up_to=60_000), []) == [("a", 5), ("b", 1), ("c", 4)]
    assert run(replace(final, epoch=4, fire_up_to=120_000), []) == []  # fired once
