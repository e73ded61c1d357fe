"""The interval join's chunked state (`operators.join_interval`), run as a keyed task runs it
(`run_task`) on real state backends: state of the per-key layout of earlier versions moves
into chunks and joins as if it had been written as chunks, and many small epochs do not pile
up chunks. (The join's results on every path are checked against the oracle in
test_join_properties.py and against the routed plan in tests/runtime/test_join_paths.py.)"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from streamer.operators.join_interval import CHUNKS, MAX_CHUNKS, STATES

BASE = 1_767_225_600_000
HOUR = 3_600_000


def _config(tmp: Path, backend: str, join_type: str, upper_ms: int) -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    from streamer.operators.join import JoinColumns
    from streamer.operators.keyed_config import KeyedConfig
    from streamer.pipeline.spec import JoinSpec

    schema = StructType([StructField("__kind", StringType()), StructField("__meta", StringType()),
                         StructField("k", StringType()), StructField("a", LongType()),
                         StructField("b", LongType()), StructField("__ts", TimestampType())])
    join = JoinSpec(left="l", right="r", left_key=("k",), right_key=("k",), type=join_type,
                    lower_ms=0, upper_ms=upper_ms)
    return KeyedConfig(
        uid="j", kind="join", keys=("k",), aggregates=(), window_kind=None, size_ms=None,
        slide_ms=None, gap_ms=None, count=None, lateness_ms=0, emit="final", domain="event",
        dedupe_ms=None, record_columns=(), out_schema=to_arrow_schema(schema, timezone="UTC"),
        backend=backend, state_root=str(tmp), job="jobid", parallelism=1, max_parallelism=4,
        epoch=1, fire_up_to=BASE - 1, join=join,
        join_columns=JoinColumns(("k",), ("a",), ("b",), ("b",), ("k",)))


def _kg(key: str) -> int:
    return sum(key.encode()) % 4


def _epoch(cfg: Any, epoch: int, watermark: int, records: list[tuple[int, str, int, int]]
           ) -> list[tuple[Any, ...]]:
    """Run epoch `epoch` over `records` (side, key, value, ts): the output rows, sorted."""
    import pyarrow as pa

    from streamer.operators.keyed import run_task

    rows = [{"__subtask": 0, "__dummy": True, "__kg": None, "k": None, "a": None, "b": None,
             "__ts_ms": None, "__seq": None, "__join_side": None}]
    for i, (side, key, value, ts) in enumerate(records):
        rows.append({"__subtask": 0, "__dummy": False, "__kg": _kg(key), "k": key,
                     "a": value if side == 0 else None, "b": value if side == 1 else None,
                     "__ts_ms": ts, "__seq": epoch * 1000 + i, "__join_side": side})
    schema = pa.schema([("__subtask", pa.int32()), ("__dummy", pa.bool_()),
                        ("__kg", pa.int32()), ("k", pa.string()), ("a", pa.int64()),
                        ("b", pa.int64()), ("__ts_ms", pa.int64()), ("__seq", pa.int64()),
                        ("__join_side", pa.int32())])
    batch = pa.RecordBatch.from_pylist(rows, schema=schema)
    (result,) = list(run_task(replace(cfg, epoch=epoch, fire_up_to=watermark), iter([batch]), 0))
    return sorted((r["k"], r["a"], r["b"], r["__ts"]) for r in result.to_pylist()
                  if r["__kind"] == "out")


def _state(cfg: Any) -> Any:
    from streamer.state import key_group_range, open_backend

    return open_backend(cfg.backend, cfg.state_root, cfg.job, cfg.uid, 0,
                        key_group_range(0, 1, 4))


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_state_of_the_per_key_layout_joins_as_chunks(tmp_path: Path, backend: str) -> None:
    from streamer.state import StateDescriptor, StateKind
    from streamer.state.codec import encode_key

    lefts = [(0, f"k{i % 5}", i, BASE + i * 1000) for i in range(20)]
    rights = [(1, f"k{i % 7}", 100 + i, BASE + 5000 + i * 1500) for i in range(20)]
    later = [(1, f"k{i % 5}", 200 + i, BASE + 30_000 + i) for i in range(5)]
    reference = _config(tmp_path / "chunks", backend, "full", 10_000)
    expected = [_epoch(reference, 1, BASE - 1, lefts),
                _epoch(reference, 2, BASE + 2_000, rights),
                _epoch(reference, 3, BASE + 29_000, later),
                _epoch(reference, 4, BASE + HOUR, [])]
    assert expected[1] and expected[3]  # (pairs, and outer rows at the end)

    # The same left records as the record-by-record layout kept them after epoch 1: per
    # (key group, key), [ts, seq, values, matched, first window], and a timer per record.
    cfg = _config(tmp_path / "lists", backend, "full", 10_000)
    with _state(cfg) as state:
        for name in STATES:
            state.declare(StateDescriptor(name, StateKind.VALUE))
        buffered: dict[tuple[int, bytes], list[Any]] = {}
        for i, (_, key, value, ts) in enumerate(lefts):
            buffered.setdefault((_kg(key), encode_key((key,))), []).append(
                [ts, 1000 + i, [value], False, None])
        state.put_many(STATES[0], [(kg, kb, b"", v) for (kg, kb), v in buffered.items()])
        state.add_timers("event", [(kg, r[0] + 10_000, kb, b"")
                                   for (kg, kb), v in buffered.items() for r in v])
        state.commit(1)
    got = [expected[0], _epoch(cfg, 2, BASE + 2_000, rights),
           _epoch(cfg, 3, BASE + 29_000, later), _epoch(cfg, 4, BASE + HOUR, [])]
    assert got == expected
    with _state(cfg) as state:
        assert not [e for kg in state.key_groups for name in STATES
                    for e in state.iterate(name, kg)]
        assert state.next_timer("event") is None  # (everything expired)


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_many_small_epochs_do_not_pile_up_chunks(tmp_path: Path, backend: str) -> None:
    cfg = _config(tmp_path, backend, "left", HOUR)
    keys = ["a", "b", "c", "d"]
    for epoch in range(1, 41):
        out = _epoch(cfg, epoch, BASE + epoch * 10 - 1,
                     [(0, key, epoch, BASE + epoch * 10) for key in keys])
        assert out == []  # (nothing matches and nothing expires yet)
        with _state(cfg) as state:
            for kg in state.key_groups:
                sides = [ns[0] for _, ns, _ in state.iterate(CHUNKS, kg)]
                assert sides.count(0) <= MAX_CHUNKS + 1 and 1 not in sides
            assert state.next_timer("event") == BASE + 10 + HOUR
    # A right record for key "a" within the hour of every left record: 40 pairs; then the
    # watermark passes every bound: the other keys' 120 records come out with no right side.
    pairs = _epoch(cfg, 41, BASE + 500, [(1, "a", -1, BASE + 1000)])
    assert pairs == sorted(("a", e, -1, _ts(BASE + 1000)) for e in range(1, 41))
    outer = _epoch(cfg, 42, BASE + 2 * HOUR, [])
    assert outer == sorted((k, e, None, _ts(BASE + e * 10)) for k in keys[1:]
                           for e in range(1, 41))


def _ts(ms: int) -> Any:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def test_only_key_columns_are_normalized() -> None:
    """-0.0 and 0.0 are one key (as `encode_key` has them), but a value column keeps the
    record's own -0.0."""
    import math

    import pyarrow as pa

    from streamer.operators.join_interval import _new_records

    schema = pa.schema([("k", pa.float64()), ("a", pa.float64()), ("__ts_ms", pa.int64()),
                        ("__matched", pa.bool_())])
    table = pa.table({"k": [-0.0], "a": [-0.0], "__ts_ms": [1], "__kg": [0],
                      "__join_side": pa.array([0], pa.int32())})
    rows = _new_records(table, schema, 0, ("k",)).to_pylist()[0]
    assert math.copysign(1, rows["k"]) == 1 and math.copysign(1, rows["a"]) == -1
