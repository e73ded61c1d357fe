"""A keyed subtask of the continuous mode (issue 36): one long-running loop over the events
of its input (`exchange.gate.InputGate`, or an `exchange.alignment.BarrierAligner` fed by
its channels), free of Spark.

The loop runs the same pieces as the epoch mode's `operators.keyed.run_task`:
- `Deliver`: the records are buffered and applied as one batch, by the kind's logic
  (`keyed.operate`), when the next watermark, barrier or end of input comes or the buffer
  holds `batch_rows` rows. A batch of a kind that `COMBINES` is combined per key group, key
  and window first, as Spark's `combine` does for an epoch (the logic takes each once);
- `AdvanceWatermark`: the event-time timers due fire (`keyed.fire`), as at an epoch's start;
- `TakeSnapshot(n)`: the state is committed and snapshotted for checkpoint n with
  `state.snapshot.take_snapshot` (the epoch mode's format: incremental on RocksDB, the
  handle's version the last commit), and the handle goes to `ack(n, handle)`;
- `InputFinished`: every timer fires (the watermark is +inf) and the loop ends.

The records a `Deliver` carries are the logic's input as an epoch's Spark plan shapes it
(`KeyedKind.prepare`): the partials per key and window of a window or rolling aggregate, a
dedupe's first record per key, a join's records. Each call of the logic is a step with its
own number (`KeyedConfig.epoch`), which the kinds use in their state as the epoch's.

Not here yet (docs/architecture.md, "Continuous execution"): dropping late records (the
epoch mode does it in `prepare`; a source whose watermarks bound its records sends none),
processing-time timers, the upload on a thread off the record path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from streamer.columns import KEY_GROUP, WINDOW_END, WINDOW_START, partial
from streamer.exchange.alignment import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    AdvanceWatermark,
    Deliver,
    Event,
    InputFinished,
    TakeSnapshot,
)
from streamer.exchange.gate import InputGate
from streamer.operators.contract import COMBINES, EVERY_RECORD
from streamer.operators.direct import DIRECT_AGGREGATES, partial_functions
from streamer.operators.keyed import fire, logic_rows, operate
from streamer.operators.keyed_config import KeyedConfig
from streamer.operators.keyed_rows import Emitter, Input
from streamer.operators.kinds import kind_of

#: How partials of each Arrow partial function combine.
_MERGE = {"count": "sum", "sum": "sum", "min": "min", "max": "max"}


@dataclass(frozen=True)
class SnapshotTarget:
    """Where the subtask's snapshots go: the job's checkpoint root (`<storage>/<job>/
    checkpoints`) and the local recovery copies' root (or None)."""

    url: str
    local_copy_root: str | None = None


class ContinuousSubtask:
    """One keyed subtask's loop (module docstring). `backend` is its open state (restored
    or fresh); `base` the handle of the checkpoint it was restored from (the base of the
    next incremental snapshot); `watermark` the one its timers fired up to."""

    def __init__(self, cfg: KeyedConfig, backend: Any, *, out: Callable[[Any], None],
                 ack: Callable[[int, dict[str, Any]], None], snapshots: SnapshotTarget,
                 base: dict[str, Any] | None = None, watermark: int = MIN_WATERMARK,
                 batch_rows: int = 10_000) -> None:
        self.cfg = cfg
        self.backend = backend
        self.out = out
        self.ack = ack
        self.snapshots = snapshots
        self.base = base
        self.watermark = watermark
        self.batch_rows = batch_rows
        self.step = backend.version() or 0
        self.finished = False
        self._buffer: list[Any] = []
        self._buffered = 0
        self._like: Any = None  # an empty table of the records' shape
        kind = kind_of(cfg.kind)
        self._concatenates = kind.has(EVERY_RECORD)
        self._combines = kind.has(COMBINES) and combinable(cfg)

    # ------------------------------------------------------------------ the loop
    def run(self, gate: InputGate, timeout_s: float | None = None) -> None:
        """Take the gate's events until the input finished. Whenever the gate has nothing
        ready, the buffered records are applied before it waits: under load they are
        applied in batches of up to `batch_rows`, and an idle input never holds them."""
        while not self.finished:
            events = gate.poll(0)
            if not events:
                self.flush()
                events = gate.poll(timeout_s)
            self.handle(events)

    def handle(self, events: list[Event]) -> None:
        """Act on `events` in their order (what `BarrierAligner.receive` returned)."""
        for event in events:
            if isinstance(event, Deliver):
                self._deliver(event.payload)
            elif isinstance(event, AdvanceWatermark):
                self.flush()
                self._fire(event.ms)
            elif isinstance(event, TakeSnapshot):
                self.flush()
                self.snapshot(event.checkpoint)
            elif isinstance(event, InputFinished):
                self.flush()
                self._fire(MAX_WATERMARK)
                self.finished = True

    def _deliver(self, payload: Any) -> None:
        import pyarrow as pa

        table = payload if isinstance(payload, pa.Table) else pa.Table.from_batches([payload])
        if self._like is None:
            self._like = table.slice(0, 0)
        self._buffer.append(table)
        self._buffered += table.num_rows
        if self._buffered >= self.batch_rows:
            self.flush()

    def flush(self) -> None:
        """Apply the buffered records: in one batch when the kind allows (module docstring),
        else a batch per delivery."""
        import pyarrow as pa

        buffered, self._buffer, self._buffered = self._buffer, [], 0
        if not buffered:
            return
        if self._combines:
            batches = [combine_partials(self.cfg, pa.concat_tables(buffered))]
        elif self._concatenates:
            batches = [pa.concat_tables(buffered)]
        else:
            batches = buffered
        for table in batches:
            self._apply(logic_rows(self.cfg, Input(table)), None)

    def _fire(self, up_to: int) -> None:
        import pyarrow as pa

        self.watermark = max(self.watermark, up_to)
        like = self._like if self._like is not None else pa.table(
            {KEY_GROUP: pa.array([], pa.int32())})
        self._apply(logic_rows(self.cfg, Input(like)), self.watermark)

    def _apply(self, rows: Any, fire_up_to: int | None) -> None:
        """One step: the logic on `rows` (records) or, with `fire_up_to`, the timers due."""
        self.step += 1
        cfg = replace(self.cfg, epoch=self.step, fire_up_to=self.watermark)
        out = Emitter(cfg)
        if fire_up_to is None:
            operate(cfg, self.backend, rows, out)
        else:
            fire(cfg, self.backend, fire_up_to, out, rows)
        if len(out):
            batch = out.batch({})
            self.out(batch.slice(0, batch.num_rows - 1))  # (without the meta row)

    # ------------------------------------------------------------------ checkpoints
    def snapshot(self, checkpoint: int) -> dict[str, Any]:
        """Commit the state and snapshot it for `checkpoint`; acknowledge it with the handle."""
        from streamer.state.snapshot import take_snapshot

        self.step += 1
        self.backend.commit(self.step)
        handle = take_snapshot(self.backend, self.snapshots.url, checkpoint, base=self.base,
                               local_copy_root=self.snapshots.local_copy_root)
        self.base = handle
        self.ack(checkpoint, handle)
        return handle


def combinable(cfg: KeyedConfig) -> bool:
    """Whether Arrow can combine this operator's partials (`combine_partials`): a rolling
    aggregate or tumbling / sliding window of count, sum, min, max and avg."""
    if cfg.kind == "window" and cfg.window_kind not in ("tumbling", "sliding"):
        return False
    return cfg.kind in ("window", "aggregate") and all(
        a.function in DIRECT_AGGREGATES for a in cfg.aggregates)


def combine_partials(cfg: KeyedConfig, table: Any) -> Any:
    """`table`'s partials combined per key group, key and window (as Spark's `combine`
    leaves an epoch's): counts and sums add up, minimums and maximums stay."""
    merges = [_MERGE[fn] for a in cfg.aggregates for fn, _ in partial_functions(a.function, a.arg)]
    group = [KEY_GROUP, *cfg.keys, WINDOW_START]
    aggregations: list[tuple[str, str]] = [(partial(i), m) for i, m in enumerate(merges)]
    if WINDOW_END in table.column_names:
        aggregations.append((WINDOW_END, "max"))
    result = table.group_by(group, use_threads=False).aggregate(aggregations)
    columns = {name: result.column(name) for name in group}
    for name, how in aggregations:
        columns[name] = result.column(f"{name}_{how}")
    import pyarrow as pa

    return pa.table(columns)
