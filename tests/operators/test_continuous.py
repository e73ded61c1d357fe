"""The continuous keyed subtask (`operators.continuous`) on real state backends, without
Spark: a tumbling-window count and a rolling aggregate fed by 2-3 channels in random
interleavings of records, watermarks, barriers and end of input through the barrier aligner,
checked against a brute-force oracle; and the snapshot of a barrier, restored on the other
backend into a fresh loop fed the rest of the channels, gives what an uninterrupted run does.

Each channel's watermarks are true lower bounds of its later records, so no record is late
(the loop does not drop late records yet: the epoch mode does that in Spark's `prepare`).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamer.exchange.alignment import (
    Barrier,
    BarrierAligner,
    EndOfInput,
    Message,
    Records,
    Watermark,
)
from streamer.operators.continuous import ContinuousSubtask, SnapshotTarget
from streamer.operators.keyed import open_state_of
from streamer.operators.keyed_config import KeyedConfig
from streamer.pipeline.spec import AggregateSpec
from streamer.savepoint.format import restore_key_groups, write_key_groups
from streamer.state import SubtaskLocation, key_group_range, open_backend
from streamer.state.snapshot import restore_snapshot

SIZE = 1_000  # the tumbling window, ms
MAXP = 8
KEYS = "abcd"
TS = pa.timestamp("us", tz="UTC")
PROPERTY = settings(max_examples=12, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def config(kind: str, root: Path, backend: str) -> KeyedConfig:
    """A tumbling-window count (`window`) or a rolling count, sum and max (`aggregate`)."""
    head = [("__kind", pa.string()), ("__meta", pa.string()), ("k", pa.string())]
    if kind == "window":
        aggs: tuple[AggregateSpec, ...] = (AggregateSpec("n", "count", None),)
        schema = pa.schema([*head, ("window_start", TS), ("window_end", TS), ("__ts", TS),
                            ("n", pa.int64())])
    else:
        aggs = (AggregateSpec("n", "count", None), AggregateSpec("total", "sum", "v"),
                AggregateSpec("top", "max", "v"))
        schema = pa.schema([*head, ("n", pa.int64()), ("total", pa.int64()),
                            ("top", pa.int64()), ("__op", pa.string())])
    return KeyedConfig(
        uid="op", kind=kind, keys=("k",), aggregates=aggs,
        window_kind="tumbling" if kind == "window" else None,
        size_ms=SIZE if kind == "window" else None, slide_ms=SIZE if kind == "window" else None,
        gap_ms=None, count=None, lateness_ms=0,
        emit="final" if kind == "window" else "updates", domain="event", dedupe_ms=None,
        record_columns=("k",), out_schema=schema, backend=backend, state_root=str(root),
        job="j", parallelism=1, max_parallelism=MAXP, epoch=0, fire_up_to=0)


def payload(kind: str, records: list[tuple[str, int, int]]) -> pa.Table:
    """Records (k, ts, v) as the logic takes them: one partial per record (keys may repeat:
    the loop combines them)."""
    columns: dict[str, Any] = {
        "__kg": pa.array([KEYS.index(k) % MAXP for k, _, _ in records], pa.int32()),
        "k": pa.array([k for k, _, _ in records], pa.string()),
        "__start": pa.array([ts - ts % SIZE if kind == "window" else 0
                             for _, ts, _ in records], pa.int64()),
        "__p0": pa.array([1] * len(records), pa.int64())}
    if kind == "aggregate":
        columns["__p1"] = pa.array([v for _, _, v in records], pa.int64())
        columns["__p2"] = pa.array([v for _, _, v in records], pa.int64())
    return pa.table(columns)


def channels(rnd: random.Random, kind: str, barriers: int) -> list[list[Message]]:
    """2-3 channels: record batches, watermarks (each the minimum time of the channel's
    later records), the same barriers 1..`barriers` in each, and the end of input."""
    out = []
    for _ in range(rnd.randint(2, 3)):
        batches = [[(rnd.choice(KEYS), rnd.randint(0, 8_000), rnd.randint(-5, 50))
                    for _ in range(rnd.randint(1, 4))] for _ in range(rnd.randint(1, 12))]
        messages: list[Message] = []
        for i, batch in enumerate(batches):
            messages.append(Records(payload(kind, batch)))
            later = [ts for b in batches[i + 1:] for _, ts, _ in b]
            if rnd.random() < 0.5:
                messages.append(Watermark(min(later) if later else 9_000))
        for n in range(1, barriers + 1):  # at increasing positions
            at = rnd.randint(0, len(messages))
            while any(isinstance(m, Barrier) for m in messages[at:]):
                at += 1
            messages.insert(at, Barrier(n))
        out.append([*messages, EndOfInput()])
    return out


class Run:
    """A loop over a backend, with what it emitted and acknowledged."""

    def __init__(self, cfg: KeyedConfig, root: Path, *, watermark: int | None = None,
                 base: dict[str, Any] | None = None) -> None:
        self.backend = open_state_of(cfg, 0)
        self.rows: list[dict[str, Any]] = []
        self.acks: dict[int, tuple[dict[str, Any], int, int]] = {}
        extra = {} if watermark is None else {"watermark": watermark}
        self.loop = ContinuousSubtask(
            cfg, self.backend, out=lambda batch: self.rows.extend(batch.to_pylist()),
            ack=lambda n, handle: self.acks.__setitem__(
                n, (handle, len(self.rows), self.loop.watermark)),
            snapshots=SnapshotTarget(str(root / "checkpoints"), str(root / "local")),
            base=base, batch_rows=3, **extra)

    def feed(self, rnd: random.Random, chans: list[list[Message]], aligner: BarrierAligner
             ) -> None:
        """Every message, channels interleaved at random, through `aligner` into the loop."""
        pending = [list(c) for c in chans]
        while any(pending):
            ch = rnd.choice([i for i, msgs in enumerate(pending) if msgs])
            self.loop.handle(aligner.receive(ch, pending[ch].pop(0)))
        assert self.loop.finished


def oracle(kind: str, chans: list[list[Message]]) -> Counter[tuple[Any, ...]]:
    """Windows: (k, start ms, count); rolling: each key's final (k, count, sum, max)."""
    table = pa.concat_tables([m.payload for c in chans for m in c if isinstance(m, Records)])
    rows = table.to_pylist()
    if kind == "window":
        counts = Counter((r["k"], r["__start"]) for r in rows)
        return Counter((k, start, n) for (k, start), n in counts.items())
    return Counter((k, sum(1 for r in rows if r["k"] == k), sum(r["__p1"] for r in rows
                   if r["k"] == k), max(r["__p1"] for r in rows if r["k"] == k))
                   for k in {r["k"] for r in rows})


def result(kind: str, rows: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    """What the loop emitted, as `oracle` states it (rolling: each key's last update)."""
    if kind == "window":
        return Counter((r["k"], int(r["window_start"].timestamp() * 1000), r["n"]) for r in rows)
    last = {r["k"]: (r["k"], r["n"], r["total"], r["top"]) for r in rows}
    return Counter(last.values())


@pytest.mark.parametrize("kind", ["window", "aggregate"])
@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@PROPERTY
@given(seed=st.integers(0, 2**32 - 1))
def test_the_loop_computes_what_the_oracle_does(tmp_path_factory, kind, backend, seed) -> None:
    rnd = random.Random(seed)
    root = tmp_path_factory.mktemp("run")
    chans = channels(rnd, kind, rnd.randint(0, 3))
    run = Run(config(kind, root, backend), root)
    try:
        run.feed(rnd, chans, BarrierAligner(len(chans)))
    finally:
        run.backend.close()
    assert result(kind, run.rows) == oracle(kind, chans)
    if kind == "window":  # each window fires once
        assert sum(result(kind, run.rows).values()) == len(run.rows)
    handles = [handle for handle, _, _ in run.acks.values()]
    assert [h["checkpoint_id"] for h in handles] == sorted(run.acks)
    assert all(h["backend"] == backend and h["uid"] == "op" for h in handles)


def restored(handle: dict[str, Any], root: Path, to: str, cfg: KeyedConfig) -> KeyedConfig:
    """The checkpoint's state restored (its own backend) and moved through a savepoint onto
    backend `to`, committed at the handle's version: the config of the new state."""
    source = SubtaskLocation(str(root / "restored"), cfg.job, cfg.uid, 0)
    restore_snapshot(handle, str(root / "checkpoints"), source, local_copy_root=None)
    groups = key_group_range(0, 1, MAXP)
    with open_backend(handle["backend"], source.root_dir, cfg.job, cfg.uid, 0, groups) as b:
        assert b.version() == handle["version"]
        saved = write_key_groups(b, str(root / "savepoint"), cfg.uid, 0)
    moved = config(cfg.kind, root / "moved", to)
    with open_backend(to, moved.state_root, cfg.job, cfg.uid, 0, groups) as b:
        restore_key_groups(str(root / "savepoint"), saved["files"], b, groups)
        b.commit(handle["version"])
    return moved


@pytest.mark.parametrize("kind", ["window", "aggregate"])
@pytest.mark.parametrize(("backend", "other"), [("rocksdb", "memory"), ("memory", "rocksdb")])
@PROPERTY
@given(seed=st.integers(0, 2**32 - 1))
def test_a_snapshot_restored_on_the_other_backend_resumes_the_run(
        tmp_path_factory, kind, backend, other, seed) -> None:
    rnd = random.Random(seed)
    root = tmp_path_factory.mktemp("run")
    barriers = rnd.randint(1, 3)
    chans = channels(rnd, kind, barriers)
    whole = Run(config(kind, root, backend), root)
    try:
        whole.feed(random.Random(seed + 1), chans, BarrierAligner(len(chans)))
    finally:
        whole.backend.close()
    n = rnd.randint(1, barriers)
    handle, emitted, watermark = whole.acks[n]
    assert handle["checkpoint_id"] == n
    cfg = restored(handle, root, other, config(kind, root, backend))
    # What each channel sends after barrier n (every channel carries every barrier).
    rest = [c[c.index(Barrier(n)) + 1:] for c in chans]
    resumed = Run(cfg, root / "moved", watermark=watermark)
    try:
        resumed.feed(rnd, rest, BarrierAligner(len(chans), last_checkpoint=n))
    finally:
        resumed.backend.close()
    assert sorted(resumed.acks) == list(range(n + 1, barriers + 1))
    combined = whole.rows[:emitted] + resumed.rows
    assert result(kind, combined) == oracle(kind, chans)
    if kind == "window":  # the same windows after barrier n as the uninterrupted run's
        assert Counter(result(kind, resumed.rows)) == Counter(result(kind, whole.rows[emitted:]))


@pytest.mark.parametrize("kind", ["window", "aggregate"])
def test_the_loop_runs_over_an_input_gate_of_flight_channels(tmp_path, kind) -> None:
    """The same loop fed by a real input gate: an Arrow Flight server on 127.0.0.1 whose
    channels senders (threads) fill with records, watermarks, barriers and end of input."""
    import threading

    from streamer.exchange.flight import ExchangeSender, ExchangeServer
    from streamer.exchange.gate import InputGate

    rnd = random.Random(7)
    chans = channels(rnd, kind, 2)
    server = ExchangeServer("127.0.0.1", len(chans), 1 << 16)
    errors: list[BaseException] = []

    def send(channel: int, messages: list[Message]) -> None:
        schema = next(m.payload.schema for m in messages if isinstance(m, Records))
        try:
            with ExchangeSender(server.location, channel, schema, timeout_s=30) as sender:
                for m in messages:
                    if isinstance(m, Records):
                        sender.send(m.payload.combine_chunks().to_batches()[0])
                    elif isinstance(m, Watermark):
                        sender.watermark(m.ms)
                    elif isinstance(m, Barrier):
                        sender.barrier(m.checkpoint)
                    else:
                        sender.end()
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(i, c), daemon=True)
               for i, c in enumerate(chans)]
    run = Run(config(kind, tmp_path, "rocksdb"), tmp_path)
    try:
        for t in threads:
            t.start()
        run.loop.run(InputGate(server, BarrierAligner(len(chans))), timeout_s=1.0)
        for t in threads:
            t.join(30)
    finally:
        run.backend.close()
        server.close()
    assert not errors
    assert result(kind, run.rows) == oracle(kind, chans)
    assert sorted(run.acks) == [1, 2]


@pytest.mark.parametrize("kind", ["window", "aggregate"])
@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_the_epoch_mode_resumes_from_a_continuous_checkpoint(tmp_path, kind, backend) -> None:
    """The format is the epoch mode's: `run_task` restores the subtask from the handle of
    barrier n (`checkpoint.task`, at the handle's version) and takes the rest of the records
    as one last epoch; with the loop's output before n it is the oracle's."""
    from dataclasses import replace

    from streamer.checkpoint.task import TaskCheckpointing
    from streamer.exchange.alignment import MAX_WATERMARK
    from streamer.operators.continuous import combine_partials
    from streamer.operators.keyed import run_task

    rnd = random.Random(11)
    chans = channels(rnd, kind, 2)
    cfg = config(kind, tmp_path / "continuous", backend)
    whole = Run(cfg, tmp_path)
    try:
        whole.feed(rnd, chans, BarrierAligner(len(chans)))
    finally:
        whole.backend.close()
    handle, emitted, watermark = whole.acks[1]
    rest = [m.payload for c in chans for m in c[c.index(Barrier(1)) + 1:]
            if isinstance(m, Records)]
    table = combine_partials(cfg, pa.concat_tables(rest))
    table = table.append_column("__subtask", pa.array([0] * table.num_rows, pa.int32()))
    table = table.append_column("__dummy", pa.array([False] * table.num_rows))
    epoch = handle["version"] + 1
    chk = TaskCheckpointing(url=str(tmp_path / "checkpoints"), local_copy_root=None,
                            first_epoch=epoch, last={0: handle})
    task = replace(cfg, state_root=str(tmp_path / "epoch"), epoch=epoch, fire_up_to=watermark,
                   flush_to=MAX_WATERMARK, checkpointing=chk)
    batches = list(run_task(task, iter(table.to_batches()), 0))
    meta = [r for b in batches for r in b.to_pylist() if r["__kind"] == "meta"]
    assert meta and json.loads(meta[-1]["__meta"]).get("restored") == "remote"
    rows = [r for b in batches for r in b.to_pylist() if r["__kind"] == "out"]
    assert rows and result(kind, whole.rows[:emitted] + rows) == oracle(kind, chans)
