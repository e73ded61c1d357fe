"""Source subtasks and the barrier coordinator of the continuous mode (issue 36), without
Spark in the subtasks (the test compiles the stateless chain once with Spark, as the driver
will):

- a source subtask's position at barrier n is exactly the rows it sent before the barrier
  on its channels (real Flight channels, in this process);
- a gang on 127.0.0.1, each subtask a process: 2 source subtasks over parquet files, 2
  keyed subtasks keeping a rolling count per key, a coordinator in this process completing
  checkpoints in the epoch mode's format; everything is killed after a few, every subtask
  restores from one of them (sources from their positions, keyed subtasks from their state
  handles) and runs to the end: the output equals the oracle's, no record counted twice.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import queue
import random
from collections import Counter
from pathlib import Path
from typing import Any

import continuous_peers  # tests/runtime is on sys.path under pytest's default import mode
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamer.checkpoint.checkpoint_metadata import CheckpointStore
from streamer.columns import EVENT_TIME
from streamer.exchange.alignment import Barrier, Records, Watermark
from streamer.exchange.flight import ExchangeSender, ExchangeServer
from streamer.operators.keyed_config import KeyedConfig
from streamer.pipeline.source_spec import SourceSpec, WatermarkSpec
from streamer.pipeline.spec import AggregateSpec, OperatorSpec
from streamer.pipeline.yaml_loader import Path as YamlPath
from streamer.runtime.arrow.arrow_input import ArrowInput
from streamer.runtime.arrow.arrow_sql import Program, compile_ops
from streamer.runtime.continuous.source_splits import FileSplits
from streamer.runtime.continuous.source_subtask import (
    KeyedRoute,
    SourcePlan,
    SourceSubtask,
    split_files,
)
from streamer.runtime.job.barrier_coordinator import (
    BarrierCoordinator,
    GangLayout,
    KeyedLayout,
    keyed_handles,
    source_positions,
)

pytestmark = pytest.mark.spark

CTX = multiprocessing.get_context("spawn")
TS = pa.timestamp("us", tz="UTC")
KEYS = "abcdefg"
MAXP = 16
OOO_MS = 40
COLUMNS = (("k", "string"), ("v", "bigint"), ("ts", "timestamp"))


def write_files(root: Path, files: int, rows: int, seed: int) -> list[str]:
    """`files` parquet files of `rows` rows (k, v, ts): event times rising through the
    files with some disorder, some v negative (the filter drops them)."""
    rnd = random.Random(seed)
    paths = []
    for f in range(files):
        base = f * rows * 10
        table = pa.table({
            "k": pa.array([rnd.choice(KEYS) for _ in range(rows)], pa.string()),
            "v": pa.array([rnd.randint(-3, 20) for _ in range(rows)], pa.int64()),
            "ts": pa.array([(base + i * 10 + rnd.randint(0, OOO_MS)) * 1000
                            for i in range(rows)], pa.int64()).cast(TS)})
        path = root / f"part-{f:02d}.parquet"
        pq.write_table(table, path)
        paths.append(str(path))
    return paths


def rows_of(path: str) -> list[dict[str, Any]]:
    """A file's rows, in order."""
    return pq.read_table(path).to_pylist()


def counts(rows: list[dict[str, Any]]) -> Counter[str]:
    """The oracle: per key, its records that pass the filter (v >= 0)."""
    return Counter(r["k"] for r in rows if r["v"] >= 0)


def keyed_config(root: Path, parallelism: int) -> KeyedConfig:
    """A rolling count per key `k` on rocksdb."""
    schema = pa.schema([("__kind", pa.string()), ("__meta", pa.string()), ("k", pa.string()),
                        ("n", pa.int64()), ("__op", pa.string())])
    return KeyedConfig(
        uid="count", kind="aggregate", keys=("k",), aggregates=(AggregateSpec("n", "count",
                                                                              None),),
        window_kind=None, size_ms=None, slide_ms=None, gap_ms=None, count=None,
        lateness_ms=0, emit="updates", domain="event", dedupe_ms=None, record_columns=("k",),
        out_schema=schema, backend="rocksdb", state_root=str(root), job="gang",
        parallelism=parallelism, max_parallelism=MAXP, epoch=0, fire_up_to=0)


def compiled_chain(spark: Any, columns: tuple[tuple[str, str], ...], ts: str
                   ) -> tuple[Program, Program]:
    """The event time (`__ts` = the expression `ts`) and the filter `v >= 0` over rows of
    `columns`, compiled by Spark's analyzer."""
    from pyspark.sql.types import StructField, StructType, TimestampType

    from streamer.frames import lenient

    where = YamlPath("p.yaml")
    decoded = StructType(list(StructType.fromDDL(
        ", ".join(f"{n} {t}" for n, t in columns)).fields))
    with lenient(spark):
        event_time = compile_ops(spark, decoded, [OperatorSpec(
            id="events event_time", inputs=("events",), kind="with_columns", path=where,
            uid="events.event_time", columns=((EVENT_TIME, ts),))])
    timed = StructType([*decoded.fields, StructField(EVENT_TIME, TimestampType())])
    program = compile_ops(spark, timed, [OperatorSpec(
        id="keep", inputs=("events",), kind="filter", path=where, uid="keep",
        filter="v >= 0")])
    assert isinstance(event_time, Program) and isinstance(program, Program)
    return event_time, program


@pytest.fixture(scope="module")
def chain(spark: Any) -> tuple[Program, Program]:
    """The event time (`__ts` = ts) and the filter `v >= 0`, compiled by Spark's analyzer."""
    return compiled_chain(spark, COLUMNS, "ts")


def source_plan(chain: tuple[Program, Program], cfg: KeyedConfig) -> SourcePlan:
    """The plan every source subtask runs."""
    event_time, program = chain
    spec = SourceSpec(id="events", type="files", uid="events-uid", schema=COLUMNS,
                      event_time="ts", watermark=WatermarkSpec(OOO_MS, None), on_error=None,
                      options={}, path=YamlPath("p.yaml"))
    arrow = ArrowInput("events", "parquet", ("keep",), COLUMNS, event_time, program, ())
    route = KeyedRoute(cfg, ("string",), (("k", pa.string()), (EVENT_TIME, TS)), EVENT_TIME)
    return SourcePlan(spec, arrow, route)


# ---------------------------------------------------------------------- one source, in process
def close_channels(senders: list[ExchangeSender], servers: list[ExchangeServer]) -> None:
    """End each sender's stream if its source did not (a test that failed half-way: an
    abandoned stream would hold its close), then close them and their servers."""
    for sender in senders:
        with contextlib.suppress(Exception):
            sender.end()
        sender.close()
    for server in servers:
        server.close()


def drain(server: ExchangeServer, channel: int) -> list[Any]:
    """Every message `channel` holds now."""
    out = []
    while server.buffered_bytes(channel):
        out.append(server.take(channel))
    return out


def test_a_barrier_position_is_the_rows_sent_before_it(tmp_path: Path, chain: Any) -> None:
    files = write_files(tmp_path, 3, 90, seed=3)
    cfg = keyed_config(tmp_path / "state", 2)
    plan = source_plan(chain, cfg)
    servers = [ExchangeServer("127.0.0.1", 1, 16 << 20) for _ in range(2)]
    acks: dict[int, dict[str, Any]] = {}
    senders = [ExchangeSender(s.location, 0, plan.out_schema()) for s in servers]
    try:
        src = SourceSubtask(plan, FileSplits(plan.input, files, 25), senders,
                            ack=acks.__setitem__)
        # Barriers at the start, mid-file, two in a row, at a file's end, and after the end.
        at = {0, 2, 5, 6, 8, 11}
        checkpoint, step = 0, 0
        while True:
            if step in at:
                checkpoint += 1
                src.inject(checkpoint)
            step += 1
            if not src.step():
                break
        checkpoint += 1
        src.inject(checkpoint)
        src.barriers()
        messages = [drain(s, 0) for s in servers]
    finally:
        close_channels(senders, servers)
    assert checkpoint == 7 and sorted(acks) == list(range(1, checkpoint + 1))
    for n, position in acks.items():
        done = [r for f in position["done"] for r in rows_of(f)]
        current = rows_of(position["file"])[:position["row"]] if position["file"] else []
        assert position["records"] == len(done) + len(current)
        sent: Counter[str] = Counter()
        for channel in messages:
            before = channel[:channel.index(Barrier(n))] if Barrier(n) in channel else channel
            for m in before:
                if isinstance(m, Records):
                    for r in m.payload.to_pylist():
                        sent[r["k"]] += r["__p0"]
        assert sent == counts(done + current), f"barrier {n} at {position}"
        # The watermark sent before the barrier is the position's (max event time - bound).
        cut = messages[0].index(Barrier(n)) if Barrier(n) in messages[0] else None
        marks = [m.ms for m in messages[0][:cut] if isinstance(m, Watermark)]
        if done or current:
            newest = max(int(r["ts"].timestamp() * 1000) for r in done + current)
            assert marks and marks[-1] == newest - OOO_MS == position["watermark"]["current"]
    # Resumed from barrier 3's position (mid-file), it sends exactly the rows after it.
    position = acks[3]
    assert 0 < position["row"] < 90
    resumed = sent_after(plan, files, position)
    before = counts([r for f in position["done"] for r in rows_of(f)]
                    + rows_of(position["file"])[:position["row"]])
    assert resumed == counts([r for f in files for r in rows_of(f)]) - before
    # A barrier after the end: acknowledged at the final position, not sent.
    assert acks[checkpoint]["file"] is None and acks[checkpoint]["records"] == 270
    assert all(Barrier(checkpoint) not in c and Barrier(checkpoint - 1) in c for c in messages)


def sent_after(plan: SourcePlan, files: list[str], position: dict[str, Any]) -> Counter[str]:
    """Per key, the records a source subtask resumed at `position` sends to the end."""
    servers = [ExchangeServer("127.0.0.1", 1, 16 << 20) for _ in range(2)]
    senders = [ExchangeSender(s.location, 0, plan.out_schema()) for s in servers]
    try:
        src = SourceSubtask(plan, FileSplits(plan.input, files, 25), senders,
                            ack=lambda n, p: None, position=position)
        assert src.tracker.current == position["watermark"]["current"]
        src.run()
        sent: Counter[str] = Counter()
        for server in servers:
            for m in drain(server, 0):
                if isinstance(m, Records):
                    for r in m.payload.to_pylist():
                        sent[r["k"]] += r["__p0"]
        return sent
    finally:
        close_channels(senders, servers)


# ---------------------------------------------------------------------- the gang
class Gang:
    """Subtask processes around one coordinator."""

    def __init__(self, root: Path, plan: SourcePlan, cfg: KeyedConfig,
                 shares: list[list[str]], store: CheckpointStore, run_id: str) -> None:
        self.root, self.plan, self.cfg, self.shares = root, plan, cfg, shares
        layout = GangLayout("gang", {"events": ("events-uid", len(shares))},
                            {"count": KeyedLayout("count", cfg.backend, cfg.parallelism,
                                                  MAXP)})
        self.coordinator = BarrierCoordinator(layout, store, run_id=run_id)
        self.results: Any = CTX.Queue()
        self.processes: list[Any] = []

    def start(self, *, handles: dict[int, Any] | None = None, watermark: int | None = None,
              positions: dict[int, Any] | None = None, pace_s: float = 0.0,
              stall_after: int | None = None) -> None:
        locations: Any = CTX.Queue()
        extra = {} if watermark is None else {"watermark": watermark}
        for j in range(self.cfg.parallelism):
            self._spawn(continuous_peers.keyed, j, len(self.shares), self.cfg,
                        self.coordinator.location, self.coordinator.store.url, str(self.root),
                        locations, self.results, (handles or {}).get(j), **extra)
        found = dict(locations.get(timeout=120) for _ in range(self.cfg.parallelism))
        where = [found[j] for j in range(self.cfg.parallelism)]
        for i, files in enumerate(self.shares):
            self._spawn(continuous_peers.source, i, files, self.plan, where,
                        self.coordinator.location, self.results, (positions or {}).get(i),
                        pace_s, stall_after)

    def _spawn(self, target: Any, *args: Any, **kwargs: Any) -> None:
        process = CTX.Process(target=target, args=args, kwargs=kwargs, daemon=True)
        process.start()
        self.processes.append(process)

    def report(self, timeout_s: float) -> Any:
        """The next report of a subtask, (kind, subtask, what, detail); its errors fail the
        test."""
        found = self.results.get(timeout=timeout_s)
        assert found[2] != "error", found
        return found

    def kill(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join(30)
        self.coordinator.close()


def output(root: Path, name: str, parallelism: int) -> list[list[Any]]:
    """What every keyed subtask wrote to `<name>-<j>...`."""
    out = []
    for j in range(parallelism):
        out += json.loads((root / name.format(j=j)).read_text())
    return out


@pytest.mark.slow
def test_a_gang_restores_from_a_checkpoint_and_ends_with_the_oracles_counts(
        tmp_path: Path, chain: Any) -> None:
    files = write_files(tmp_path, 6, 300, seed=8)
    shares = split_files(files, 2)
    store = CheckpointStore(str(tmp_path / "storage"), "gang")
    first = Gang(tmp_path, source_plan(chain, keyed_config(tmp_path / "state-1", 2)),
                 keyed_config(tmp_path / "state-1", 2), shares, store, "run-1")
    completed = []
    try:
        first.start(pace_s=0.04, stall_after=600)
        stalled: set[int] = set()
        while len(stalled) < 2 or len(completed) < 4:
            completed.append(first.coordinator.wait(first.coordinator.trigger(), 120))
            try:
                while True:
                    kind, subtask, what, _ = first.report(0.05)
                    assert (kind, what) == ("source", "stalled")
                    stalled.add(subtask)
            except queue.Empty:
                pass
    finally:
        first.kill()
    # The checkpoints are in the epoch mode's format: the store lists and reads them.
    assert [c.checkpoint_id for c in completed] == store.ids()
    # Restore from one taken mid-file if there is one (the load decides), else the middle.
    inside = [c for c in completed if any(0 < p["row"] < 300 for p in source_positions(
        c, "events-uid").values())]
    middle = inside[-1] if inside else completed[len(completed) // 2]
    meta = store.read(middle.checkpoint_id)
    assert meta.offsets["events-uid"]["continuous"] and meta.operators["count"].parallelism == 2
    assert 0 < meta.records["events-uid"] < 1800
    handles = keyed_handles(meta, "count")
    positions = source_positions(meta, "events-uid")
    assert sorted(handles) == [0, 1] and sorted(positions) == [0, 1]

    cfg = keyed_config(tmp_path / "state-2", 2)  # (another machine: no working state)
    second = Gang(tmp_path, source_plan(chain, cfg), cfg, shares, store, "run-2")
    try:
        second.start(handles=handles, positions=positions,
                     watermark=int(meta.watermark["current"]))
        ended = [second.report(180) for _ in range(4)]
    finally:
        second.kill()
    assert sorted((k, s, w) for k, s, w, _ in ended) == [
        ("keyed", 0, "ended"), ("keyed", 1, "ended"), ("source", 0, "ended"),
        ("source", 1, "ended")]
    before = output(tmp_path, f"out-{{j}}-chk-{middle.checkpoint_id}.json", 2)
    after = output(tmp_path, "final-{j}.json", 2)
    oracle = counts([r for f in files for r in rows_of(f)])
    last: dict[str, int] = {}
    for k, n in before + after:  # (per key, every update comes from one subtask, in order)
        assert n > last.get(k, 0), f"key {k!r}: {n} after {last.get(k)}"
        last[k] = n
    assert last == dict(oracle)
