"""The session window kernel (`operators.sessions.run_sessions`) on one subtask's partial
sessions, without Spark: merging across epochs (touching sessions too), firing at the
watermark, every aggregate's merge and final value, one chunk and one timer per key group,
and the move of the per-key layout of earlier versions into chunks."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest

from streamer.columns import KEY_GROUP, WINDOW_END, WINDOW_START, partial
from streamer.operators.keyed_config import KeyedConfig
from streamer.operators.keyed_rows import NS_ROLLING, Emitter, ns_of
from streamer.operators.sessions import run_sessions
from streamer.pipeline.spec import AggregateSpec
from streamer.state import StateDescriptor, StateKind, key_group_range, open_backend
from streamer.state.codec import encode_key
from streamer.state.names import SESSION_CHUNKS

GAP = 100
AGGS = (AggregateSpec("n", "count", None), AggregateSpec("total", "sum", "v"),
        AggregateSpec("lo", "min", "v"), AggregateSpec("hi", "max", "v"),
        AggregateSpec("mean", "avg", "v"), AggregateSpec("fst", "first", "v"),
        AggregateSpec("lst", "last", "v"), AggregateSpec("vals", "collect_list", "v"),
        AggregateSpec("nd", "count_distinct", "v"))
TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("__kind", pa.string()), ("__meta", pa.string()), ("k", pa.float64()),
                    ("window_start", TS), ("window_end", TS), ("__ts", TS),
                    ("n", pa.int64()), ("total", pa.int64()), ("lo", pa.int64()),
                    ("hi", pa.int64()), ("mean", pa.float64()), ("fst", pa.int64()),
                    ("lst", pa.int64()), ("vals", pa.list_(pa.int64())), ("nd", pa.int64())])
# Spark names the fields of a first/last/collect_list partial after its expressions.
ITEM = pa.struct([("__ts_ms", pa.int64()), ("__seq", pa.int64()), ("v", pa.int64())])


def _config(tmp_path, backend: str, emit: str = "final") -> KeyedConfig:
    return KeyedConfig(
        uid="ss", kind="window", keys=("k",), aggregates=AGGS, window_kind="session",
        size_ms=None, slide_ms=None, gap_ms=GAP, count=None, lateness_ms=0, emit=emit,
        domain="event", dedupe_ms=None, record_columns=(), out_schema=SCHEMA,
        backend=backend, state_root=str(tmp_path), job="j", parallelism=1,
        max_parallelism=4, epoch=1, fire_up_to=0)


def _state(tmp_path, backend: str):
    return open_backend(backend, str(tmp_path), "j", "ss", 0, key_group_range(0, 1, 4),
                        states=[StateDescriptor("acc", StateKind.AGGREGATING)])


def accumulators_of(records: list[tuple[float, int, int]], kg: int = 1) -> pa.Table:
    """One partial session per record (k, ts, v): [ts, ts + GAP), as Spark hands them."""
    n = len(records)
    item = [{"__ts_ms": ts, "__seq": i, "v": v} for i, (_, ts, v) in enumerate(records)]
    columns = [[1] * n, [v for _, _, v in records], [v for _, _, v in records],
               [v for _, _, v in records], [float(v) for _, _, v in records], [1] * n,
               item, item, [[x] for x in item], [[v] for _, _, v in records]]
    types = [pa.int64()] * 4 + [pa.float64(), pa.int64(), ITEM, ITEM, pa.list_(ITEM),
                                pa.list_(pa.int64())]
    table = {KEY_GROUP: pa.array([kg] * n, pa.int32()),
             "k": pa.array([k for k, _, _ in records], pa.float64()),
             WINDOW_START: pa.array([ts for _, ts, _ in records], pa.int64()),
             WINDOW_END: pa.array([ts + GAP for _, ts, _ in records], pa.int64())}
    for i, (values, dtype) in enumerate(zip(columns, types, strict=True)):
        table[partial(i)] = pa.array(values, dtype)
    return pa.table(table)


def _epoch(cfg: KeyedConfig, state: Any, table: pa.Table, fire: int, epoch: int
           ) -> list[dict[str, Any]]:
    out = Emitter(cfg)
    run_sessions(replace(cfg, fire_up_to=fire, epoch=epoch), state, table, out)
    rows = out.batch({}).to_pylist()[:-1]
    return sorted(({k: v for k, v in r.items() if not k.startswith("__")} for r in rows),
                  key=lambda r: (r["k"], r["window_start"]))


def _session(k: float, start: int, end: int, values: list[int]) -> dict[str, Any]:
    """The expected result row of a session of values in time order."""
    from datetime import UTC, datetime

    def at(ms: int) -> datetime:
        return datetime.fromtimestamp(ms / 1000, UTC)

    return {"k": k, "window_start": at(start), "window_end": at(end), "n": len(values),
            "total": sum(values), "lo": min(values), "hi": max(values),
            "mean": sum(values) / len(values), "fst": values[0], "lst": values[-1],
            "vals": values, "nd": len(set(values))}


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_sessions_merge_across_epochs_and_fire_at_the_watermark(tmp_path, backend) -> None:
    """A session bridged by a later epoch's record (touching: exactly GAP apart) merges with
    every aggregate; -0.0 and 0.0 are one key; a key group keeps one chunk and one timer, at
    its earliest session's end - 1."""
    cfg = _config(tmp_path, backend)
    state = _state(tmp_path, backend)
    try:
        # k=1: 0 and 250 (two sessions), k=0.0: -0.0 at 10 and 0.0 at 60 (one), k=2 in kg 2.
        first = accumulators_of([(1.0, 0, 5), (1.0, 250, 7), (-0.0, 10, 3), (0.0, 60, 3)])
        assert _epoch(cfg, state, pa.concat_tables([first, accumulators_of([(2.0, 20, 1)], kg=2)]),
                      0, 1) == []
        assert state.next_timer("event") == 0 + GAP - 1  # k=1's [0, 100)
        assert [len(list(state.iterate(SESSION_CHUNKS, kg))) for kg in (1, 2)] == [1, 1]
        # k=1's record at 100 touches [0, 100): [0, 200) and [250, 350).
        assert _epoch(cfg, state, accumulators_of([(1.0, 100, 9)]), 0, 2) == []
        # Watermark 158: the 0.0 session [10, 160) fires (end - 1 <= 158), k=2's [20, 120)
        # too; k=1's [0, 200) does not.
        fired = _epoch(cfg, state, accumulators_of([]), 159, 3)
        assert fired == [_session(0.0, 10, 160, [3, 3]), _session(2.0, 20, 120, [1])]
        assert list(state.iterate(SESSION_CHUNKS, 2)) == []
        # A record at 200 bridges [0, 200) and [250, 350): one session of four records.
        assert _epoch(cfg, state, accumulators_of([(1.0, 200, 2)]), 159, 4) == []
        assert _epoch(cfg, state, accumulators_of([]), 1000, 5) == [
            _session(1.0, 0, 350, [5, 9, 2, 7])]
        assert state.next_timer("event") is None
        assert list(state.iterate(SESSION_CHUNKS, 1)) == []
    finally:
        state.close()


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_updates_emit_each_changed_session(tmp_path, backend) -> None:
    """With `emit: updates` an epoch emits the merged value of every session it changed,
    and the session again when it fires."""
    cfg = _config(tmp_path, backend, emit="updates")
    state = _state(tmp_path, backend)
    try:
        assert _epoch(cfg, state, accumulators_of([(1.0, 0, 5), (2.0, 0, 1)]), 0, 1) == [
            _session(1.0, 0, 100, [5]), _session(2.0, 0, 100, [1])]
        assert _epoch(cfg, state, accumulators_of([(1.0, 50, 6)]), 0, 2) == [
            _session(1.0, 0, 150, [5, 6])]
        assert _epoch(cfg, state, accumulators_of([]), 500, 3) == [
            _session(1.0, 0, 150, [5, 6]), _session(2.0, 0, 100, [1])]
    finally:
        state.close()


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_sessions_kept_per_key_by_an_earlier_version_move_into_chunks(tmp_path, backend
                                                                     ) -> None:
    """The per-key layout (an "acc" entry with the key's sessions and Python accumulators,
    a timer per session) is read as open sessions, then deleted: later epochs merge into
    them and fire them as the old layout would have."""
    cfg = _config(tmp_path, backend)
    state = _state(tmp_path, backend)
    try:
        kb = encode_key((1.0,))
        # [0, 100) of values 5 then 7 (records at 0 and... 0), as the old kernel lifted them.
        acc = [2, 12, 5, 7, (12.0, 2), (0, 0, 5), (0, 1, 7), [(0, 0, 5), (0, 1, 7)],
               frozenset({5, 7})]
        state.put_many("acc", [(1, kb, NS_ROLLING, ((1.0,), None, None, [(0, 100, acc)]))])
        state.add_timers("event", [(1, 99, kb, ns_of(0))])
        assert _epoch(cfg, state, accumulators_of([(1.0, 100, 9)]), 0, 1) == []
        assert not [e for kg in state.key_groups for e in state.iterate("acc", kg)]
        assert state.next_timer("event") == 199
        assert _epoch(cfg, state, accumulators_of([]), 500, 2) == [
            _session(1.0, 0, 200, [5, 7, 9])]
    finally:
        state.close()


def test_a_sum_past_64_bits_fails_as_the_accumulators_do(tmp_path) -> None:
    """Arrow's grouped sum would wrap around; merging two sessions whose bigint sum passes
    2**63 - 1 fails instead, as the Python accumulators and Spark's ANSI sum do."""
    cfg = _config(tmp_path, "memory")
    state = _state(tmp_path, "memory")
    try:
        big = 2**62
        assert _epoch(cfg, state, accumulators_of([(1.0, 0, big), (2.0, 0, big)]), 0, 1) == []
        assert _epoch(cfg, state, accumulators_of([(2.0, 50, -5)]), 0, 2) == []  # no overflow
        with pytest.raises(ArithmeticError, match="ARITHMETIC_OVERFLOW"):
            _epoch(cfg, state, accumulators_of([(1.0, 50, big)]), 0, 3)
    finally:
        state.close()


def test_processing_time_sessions_keep_their_timers_in_that_domain(tmp_path) -> None:
    """In processing time the clock takes the watermark's place: timers are processing-time
    timers, and a session fires once the clock passes its end."""
    cfg = replace(_config(tmp_path, "rocksdb"), domain="processing")
    state = _state(tmp_path, "rocksdb")
    try:
        assert _epoch(cfg, state, accumulators_of([(1.0, 1000, 4), (1.0, 1050, 6)]), 1000, 1) == []
        assert state.next_timer("event") is None
        assert state.next_timer("processing") == 1050 + GAP - 1
        assert _epoch(cfg, state, accumulators_of([]), 1148, 2) == []
        assert _epoch(cfg, state, accumulators_of([]), 1149, 3) == [
            _session(1.0, 1000, 1150, [4, 6])]
        assert state.next_timer("processing") is None
    finally:
        state.close()
