"""The dedupe kernel (`operators.keyed_kinds._dedupe`) on one subtask's input, without Spark:
first record per key by event time then arrival, keys as state encodes them."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest

from streamer.columns import EVENT_TIME_MS, KEY_GROUP
from streamer.operators.keyed_config import KeyedConfig
from streamer.operators.keyed_kinds import _dedupe
from streamer.operators.keyed_rows import _Emitter, _Input
from streamer.state import StateDescriptor, StateKind, key_group_range, open_backend

SCHEMA = pa.schema([("__kind", pa.string()), ("__meta", pa.string()), ("k", pa.float64()),
                    ("v", pa.int64()), ("__ts", pa.timestamp("us", tz="UTC"))])


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_first_record_per_key_as_state_tells_keys_apart(tmp_path, backend: str) -> None:
    """-0.0 and 0.0 are one key to state (and NaNs one), though Arrow tells the zeros apart:
    one record each, the earliest by event time, then by arrival; a key seen in an earlier
    epoch is not forwarded again until its time is up."""
    cfg = KeyedConfig(
        uid="dd", kind="dedupe", keys=("k",), aggregates=(), window_kind=None, size_ms=None,
        slide_ms=None, gap_ms=None, count=None, lateness_ms=0, emit="updates", domain="event",
        dedupe_ms=1000, record_columns=("k", "v"), out_schema=SCHEMA, backend=backend,
        state_root=str(tmp_path), job="j", parallelism=1, max_parallelism=4, epoch=1,
        fire_up_to=0)
    state = open_backend(backend, str(tmp_path), "j", "dd", 0, key_group_range(0, 1, 4),
                         states=[StateDescriptor("acc", StateKind.AGGREGATING)])
    try:
        def epoch(keys: list[float], ts: list[int], fire: int) -> list[tuple[float, int]]:
            out = _Emitter(cfg)
            n = len(keys)
            table = pa.table({KEY_GROUP: pa.array([1] * n, pa.int32()), "k": keys,
                              "v": list(range(n)), EVENT_TIME_MS: ts})
            _dedupe(replace(cfg, fire_up_to=fire), state, _Input(table), out)
            rows = out.batch({}).to_pylist()[:-1]
            return sorted((r["k"], r["v"]) for r in rows if r["k"] == r["k"]) + [
                ("nan", r["v"]) for r in rows if r["k"] != r["k"]]

        nan = float("nan")
        first = epoch([0.0, -0.0, nan, nan, -0.0, 2.0, 2.0], [10, 5, 7, 6, 1, 3, 3], 0)
        assert first == [(-0.0, 4), (2.0, 5), ("nan", 3)]
        # 2.0 and 0.0 are remembered until 1000 ms after their first record.
        assert epoch([0.0, 2.0, 3.0], [20, 20, 20], 500) == [(3.0, 2)]
        assert epoch([0.0, 2.0], [1500, 1500], 1003) == [(0.0, 0), (2.0, 1)]
    finally:
        state.close()
