"""The dedupe kernel (`operators.dedupe.run_dedupe`) on one subtask's input, without Spark:
first record per key by event time then arrival, keys as state encodes them; its chunked state
(forgotten keys dropped, chunks merged) and the move of the per-key layout into it."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest

from streamer.columns import EVENT_TIME_MS, KEY_GROUP
from streamer.operators.dedupe import MAX_CHUNKS, run_dedupe
from streamer.operators.keyed_config import KeyedConfig
from streamer.operators.keyed_rows import NS_ROLLING, Emitter
from streamer.state import StateDescriptor, StateKind, key_group_range, open_backend
from streamer.state.codec import encode_key
from streamer.state.names import DEDUPE_SEEN

SCHEMA = pa.schema([("__kind", pa.string()), ("__meta", pa.string()), ("k", pa.float64()),
                    ("v", pa.int64()), ("__ts", pa.timestamp("us", tz="UTC"))])


def _config(tmp_path, backend: str) -> KeyedConfig:
    return KeyedConfig(
        uid="dd", kind="dedupe", keys=("k",), aggregates=(), window_kind=None, size_ms=None,
        slide_ms=None, gap_ms=None, count=None, lateness_ms=0, emit="updates", domain="event",
        dedupe_ms=1000, record_columns=("k", "v"), out_schema=SCHEMA, backend=backend,
        state_root=str(tmp_path), job="j", parallelism=1, max_parallelism=4, epoch=1,
        fire_up_to=0)


def _state(tmp_path, backend: str):
    return open_backend(backend, str(tmp_path), "j", "dd", 0, key_group_range(0, 1, 4),
                        states=[StateDescriptor("acc", StateKind.AGGREGATING)])


def _epoch(cfg: KeyedConfig, state, keys: list[float], ts: list[int], fire: int,
           kgs: list[int] | None = None, epoch: int = 1) -> list[tuple[float, int]]:
    """The (k, v) forwarded by one epoch of records k with v = their index."""
    out = Emitter(cfg)
    n = len(keys)
    table = pa.table({KEY_GROUP: pa.array(kgs or [1] * n, pa.int32()),
                      "k": pa.array(keys, pa.float64()), "v": pa.array(range(n), pa.int64()),
                      EVENT_TIME_MS: pa.array(ts, pa.int64())})
    run_dedupe(replace(cfg, fire_up_to=fire, epoch=epoch), state, table, out)
    rows = out.batch({}).to_pylist()[:-1]
    return sorted((r["k"], r["v"]) for r in rows if r["k"] == r["k"]) + [
        ("nan", r["v"]) for r in rows if r["k"] != r["k"]]


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_first_record_per_key_as_state_tells_keys_apart(tmp_path, backend: str) -> None:
    """-0.0 and 0.0 are one key to state (and NaNs one), though Arrow tells the zeros apart:
    one record each, the earliest by event time, then by arrival; a key seen in an earlier
    epoch is not forwarded again until its time is up."""
    cfg = _config(tmp_path, backend)
    state = _state(tmp_path, backend)
    try:
        def epoch(keys: list[float], ts: list[int], fire: int) -> list[tuple[float, int]]:
            return _epoch(cfg, state, keys, ts, fire)

        nan = float("nan")
        first = epoch([0.0, -0.0, nan, nan, -0.0, 2.0, 2.0], [10, 5, 7, 6, 1, 3, 3], 0)
        assert first == [(-0.0, 4), (2.0, 5), ("nan", 3)]
        # 2.0 and 0.0 are remembered until 1000 ms after their first record.
        assert epoch([0.0, 2.0, 3.0], [20, 20, 20], 500) == [(3.0, 2)]
        assert epoch([0.0, 2.0], [1500, 1500], 1003) == [(0.0, 0), (2.0, 1)]
    finally:
        state.close()


def _chunks(state) -> dict[int, list[bytes]]:
    """Per key group, the namespaces of the dedupe chunks."""
    return {kg: [ns for _, ns, _ in state.iterate(DEDUPE_SEEN, kg)] for kg in state.key_groups
            if any(True for _ in state.iterate(DEDUPE_SEEN, kg))}


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_forgotten_chunks_go_and_many_chunks_are_merged(tmp_path, backend: str) -> None:
    """A chunk whose keys are all forgotten is deleted, one partly forgotten keeps the rest,
    and a key group never holds more than MAX_CHUNKS + 1 chunks, however many epochs add
    keys to it; no timers are kept."""
    cfg = _config(tmp_path, backend)
    state = _state(tmp_path, backend)
    try:
        for e in range(1, 3 * MAX_CHUNKS):  # a new key per epoch, all remembered (fire 0)
            assert _epoch(cfg, state, [float(e)], [100], 0, epoch=e) == [(float(e), 0)]
            assert len(_chunks(state).get(1, [])) <= MAX_CHUNKS + 1
        assert state.next_timer("event") is None
        # Every key is still remembered across the merges.
        keys = [float(e) for e in range(1, 3 * MAX_CHUNKS)]
        assert _epoch(cfg, state, keys, [100] * len(keys), 0, epoch=100) == []
        # Keys 0.5 (ts 50) and 7.5 (ts 700) in one chunk; the first is forgotten at 1050.
        assert _epoch(cfg, state, [0.5, 7.5], [50, 700], 0, kgs=[2, 2], epoch=101) == [
            (0.5, 0), (7.5, 1)]
        assert _epoch(cfg, state, [0.5, 7.5], [60, 60], 1050, kgs=[2, 2], epoch=102) == [
            (0.5, 0)]
        # At 1100 everything remembered at ts 100 is forgotten: those chunks are deleted
        # without a record of their key group coming.
        assert _epoch(cfg, state, [], [], 1100, epoch=103) == []
        assert 1 not in _chunks(state)
    finally:
        state.close()


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_keys_remembered_per_key_by_an_earlier_version_move_into_chunks(
        tmp_path, backend: str) -> None:
    """The per-key layout (an "acc" entry and a timer per key) is read as remembered keys,
    then deleted: the next epochs forward exactly what they would have."""
    cfg = _config(tmp_path, backend)
    state = _state(tmp_path, backend)
    try:
        for kg, key, expiry in ((1, 2.0, 1010), (3, 4.0, 2000)):
            kb = encode_key((key,))
            state.put_many("acc", [(kg, kb, NS_ROLLING, (None, None, None, expiry))])
            state.add_timers("event", [(kg, expiry, kb, NS_ROLLING)])
        assert _epoch(cfg, state, [2.0, 4.0, 5.0], [20, 20, 20], 0, kgs=[1, 3, 1]) == [
            (5.0, 2)]
        assert state.next_timer("event") is None
        assert not [e for kg in state.key_groups for e in state.iterate("acc", kg)]
        assert _epoch(cfg, state, [2.0, 4.0], [30, 30], 1010, kgs=[1, 3], epoch=2) == [
            (2.0, 0)]
    finally:
        state.close()
