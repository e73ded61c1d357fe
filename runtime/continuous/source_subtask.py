"""A source subtask of the continuous mode (issue 36): it reads its own splits, runs the
fused stateless chain on Arrow, routes each row by key group to the keyed subtasks'
channels, and carries watermarks, barriers and end of input in the data. Free of Spark, so
a barrier task hosts it as it is; the driver compiles its plan (`SourcePlan`).

- **Splits** (`runtime.continuous.source_splits`): its files in order (local parquet, JSON lines
  or CSV, decoded whole as the epoch mode's Arrow tasks decode them, then taken
  `batch_rows` rows at a time: the position is (file, row)), or its Kafka partitions (one
  consumer assigned at their offsets: the position is the next offset per partition, the
  epoch mode's offsets). Input Arrow cannot read as Spark would is an error here, as there
  is no Spark to fall back to: the planner will refuse such a pipeline.
- **A slice**: the event time (`ArrowInput.event_time`) and the chain (`ArrowInput.program`,
  an `runtime.arrow.arrow_sql.Program`), then, per keyed subtask, the rows of its key groups
  shaped as the epoch mode's direct read shapes an epoch's input
  (`operators.direct.read_direct`: key groups with Spark's hash from `state.keygroups`,
  partials per key and window): what `operators.continuous.ContinuousSubtask` applies.
  Records are not dropped as late here: lateness is judged against the keyed subtask's
  watermark, which the source does not know (the keyed loop does not drop them yet either).
- **Watermarks**: as the epoch mode computes them (`runtime.watermarks.WatermarkTracker`:
  per split its maximum event time less the bounded out-of-orderness, the minimum over
  active splits), sent on every channel after the slice that advanced it. Once every split
  had nothing for the source's `idle_timeout`, the channels are told it is idle (the keyed
  subtasks leave it out of their watermark) until it reads records again.
- **Barriers**: `inject(n)` (from the coordinator's barrier stream, any thread) is taken
  between two slices: the subtask records its position, acknowledges n with it, and sends
  barrier n on every channel after the rows of the slices before it. After its end of
  input it still acknowledges barriers, with its final position.
- **Restore**: from a recorded position: the splits resume there (the files before it
  skipped, the file at it read from its row on; the partitions from their offsets), and the
  watermark tracker resumes from the position's.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from streamer import failpoints
from streamer.exchange.alignment import MIN_WATERMARK
from streamer.operators.direct import DirectRead, ipc_bytes, read_direct
from streamer.operators.keyed_config import KeyedConfig
from streamer.pipeline.source_spec import SourceSpec
from streamer.runtime.arrow.arrow_input import ArrowInput
from streamer.runtime.continuous.source_records import BadRecords, Dead
from streamer.runtime.continuous.source_splits import ContinuousSourceError, Slice
from streamer.runtime.watermarks import WatermarkTracker


class Channel(Protocol):
    """One output channel (an `exchange.flight.ExchangeSender`)."""

    def send(self, batch: Any) -> None:
        """Records, in order."""

    def barrier(self, checkpoint: int) -> None:
        """Barrier `checkpoint`, after the records sent so far."""

    def watermark(self, ms: int) -> None:
        """The source's watermark."""

    def idle(self) -> None:
        """The source has nothing to read for now."""

    def end(self) -> None:
        """End of input."""


@dataclass(frozen=True)
class KeyedRoute:
    """Where a source's rows go: the keyed operator (its config: keys, aggregates,
    parallelism, max_parallelism) and how the direct read takes its columns."""

    cfg: KeyedConfig
    #: Spark type names of the key columns (`state.keygroups.PYTHON_HASHED_TYPES`).
    key_types: tuple[str, ...]
    #: The columns the operator reads (name, Arrow type): keys, arguments, event time.
    columns: tuple[tuple[str, Any], ...]
    #: The event-time column, or None (processing time).
    ts_column: str | None

    @property
    def channels(self) -> int:
        """One per keyed subtask."""
        return int(self.cfg.parallelism)

    def shape(self, table: Any, subtask: int) -> Any:
        """The rows of `table` (after the chain) that keyed subtask `subtask` owns, as its
        logic takes them (`read_direct`)."""
        read = DirectRead(files=(), columns=self.columns, key_types=self.key_types,
                          ts_column=self.ts_column, watermark=MIN_WATERMARK,
                          table=ipc_bytes(table))
        rows, _ = read_direct(self.cfg, read, subtask)
        return rows

    def empty(self, table_schema: Any) -> Any:
        """The schema of what `shape` returns (for the channels' senders)."""
        return self.shape(table_schema.empty_table(), 0).schema


@dataclass(frozen=True)
class SinkRoute:
    """Where a stateless pipeline's rows go: straight to its sink, on one channel (the
    sink's columns, in order)."""

    names: tuple[str, ...]

    @property
    def channels(self) -> int:
        """One: the sink."""
        return 1

    def shape(self, table: Any, subtask: int) -> Any:
        """The sink's columns of `table`."""
        return table.select(list(self.names))

    def empty(self, table_schema: Any) -> Any:
        """The schema of the rows it sends."""
        import pyarrow as pa

        return pa.schema([table_schema.field(name) for name in self.names])


@dataclass(frozen=True)
class SourcePlan:
    """What every subtask of one source runs (picklable; compiled on the driver)."""

    spec: SourceSpec
    input: ArrowInput
    route: KeyedRoute | SinkRoute
    #: How its bad records are treated (`runtime.continuous.source_records`); None: they fail it.
    bad: BadRecords | None = None

    def out_schema(self) -> Any:
        """The schema of the rows on every channel."""
        import pyarrow as pa

        from streamer.runtime.arrow.arrow_sql import arrow_type

        decoded = pa.schema([(n, arrow_type(k)) for n, k in self.input.columns])
        table = decoded.empty_table()
        if self.input.event_time is not None:
            table, _ = self.input.event_time.run(table)
        table, _ = self.input.program.run(table)
        return self.route.empty(table.schema)


class Splits(Protocol):
    """What a source subtask reads (`runtime.continuous.source_splits`: files or Kafka
    partitions)."""

    def next_slice(self) -> Slice | None:
        """The next rows (advancing the position), or None at the end of the input."""

    def position(self) -> dict[str, Any]:
        """Where it is (JSON)."""

    def epoch_offsets(self) -> dict[str, Any]:
        """Its position as the epoch mode's source records offsets."""

    def resume(self, position: Mapping[str, Any]) -> None:
        """Continue from a recorded position."""

    def where(self) -> str:
        """What it reads now (for messages)."""

    def close(self) -> None:
        """Release its readers."""


class SourceSubtask:
    """One source subtask over its `splits`, sending to `channels` (channel i goes to keyed
    subtask i). `ack(n, position)` acknowledges barrier n; `position` is a recorded one to
    resume from (`position()`'s JSON), or None for the start."""

    def __init__(self, plan: SourcePlan, splits: Splits, channels: Sequence[Channel], *,
                 ack: Callable[[int, dict[str, Any]], None],
                 position: dict[str, Any] | None = None,
                 clock: Callable[[], float] = time.time,
                 dead: Callable[[Any], None] | None = None) -> None:
        if len(channels) != plan.route.channels:
            msg = f"{len(channels)} channels for {plan.route.channels} subtasks"
            raise ValueError(msg)
        self.plan = plan
        self.splits = splits
        self.channels = list(channels)
        self.ack = ack
        self.clock = clock
        self.dead = dead  # writes dead-letter rows (the `on_error` sink's staging)
        self.dead_letters = 0
        self.tracker = WatermarkTracker({plan.spec.id: plan.spec})
        self.records = 0  # rows read in all (before the chain)
        self.slices = 0  # slices sent on by this run (the `source-slice` fail point's number)
        self.sent_watermark = MIN_WATERMARK
        self.idle = False  # whether the channels were told it is idle
        self.ended = False
        self._barriers: queue.Queue[int] = queue.Queue()
        self._schema = plan.out_schema()
        if position is not None:
            splits.resume(position)
            self.records = int(position.get("records", 0))
            self.tracker.restore(position.get("watermark", {}), int(self.clock() * 1000))
            self.sent_watermark = self.tracker.current

    def position(self) -> dict[str, Any]:
        """Where the subtask is: its splits' position, their epoch-mode offsets, the rows
        read in all, whether its input ended, and the watermark tracker (JSON)."""
        return {**self.splits.position(), "epoch_offsets": self.splits.epoch_offsets(),
                "records": self.records, "ended": self.ended,
                "watermark": self.tracker.to_json()}

    # ------------------------------------------------------------------ the loop
    def inject(self, checkpoint: int) -> None:
        """Barrier `checkpoint` is injected: it goes out before the next slice (thread-safe)."""
        self._barriers.put(checkpoint)

    def run(self) -> None:
        """Read every split to its end, then send end of input."""
        while self.step():
            pass

    def step(self) -> bool:
        """Emit the injected barriers, then one slice; at the end of the input, end of input
        on every channel. Whether there is more to read."""
        self.barriers()
        if self.ended:
            return False
        piece = self.splits.next_slice()
        if piece is None:
            for channel in self.channels:
                channel.end()
            self.ended = True
            self.splits.close()
            self.barriers()
            return False
        maxima: dict[str, int | None] = dict.fromkeys(piece.polled)
        if piece.dead:
            self._dead_letters(piece.dead)
        if piece.table.num_rows:
            self.records += piece.table.num_rows
            maxima.update(self._emit(piece))
            self.slices += 1
            failpoints.reached("source-slice", self.slices)
        self._watermark(maxima)
        return True

    def barriers(self) -> None:
        """Acknowledge every injected barrier with the position now and, before the end of
        input, send it on every channel."""
        while True:
            try:
                checkpoint = self._barriers.get_nowait()
            except queue.Empty:
                return
            self.ack(checkpoint, self.position())
            if not self.ended:
                for channel in self.channels:
                    channel.barrier(checkpoint)

    def _emit(self, piece: Slice) -> dict[str, int | None]:
        """A slice through the chain to the keyed subtasks; its newest event time per split."""
        from streamer.columns import EVENT_TIME

        table = piece.table
        maxima: dict[str, int | None] = {}
        if self.plan.input.event_time is not None:
            table, _ = self.plan.input.event_time.run(table)
            splits = piece.splits
            if table.column(EVENT_TIME).null_count:
                table, splits = self._without_time(table, piece)
            maxima = newest_per_split(table.column(EVENT_TIME), splits)
        table, _ = self.plan.input.program.run(table)
        for subtask, channel in enumerate(self.channels):
            rows = self.plan.route.shape(table, subtask).cast(self._schema)
            if rows.num_rows:
                for batch in rows.combine_chunks().to_batches():
                    channel.send(batch)
        return maxima

    def _without_time(self, table: Any, piece: Slice) -> tuple[Any, str | list[str]]:
        """`table` without its records whose event time is null, which become dead letters
        (the error of the first without `on_error`), and the split of each row left."""
        import pyarrow.compute as pc

        from streamer.columns import EVENT_TIME

        if self.plan.bad is None or piece.where is None:
            msg = (f"source {self.plan.spec.id!r}: a record of {self.splits.where()} has "
                   "no event time")
            raise ContinuousSourceError(msg)
        valid = pc.is_valid(table.column(EVENT_TIME))
        keep = valid.to_pylist()
        rows = [i for i, ok in enumerate(keep) if not ok]
        self._dead_letters(self.plan.bad.null_times(table, rows, piece.where))
        splits = piece.splits if isinstance(piece.splits, str) else [
            s for s, ok in zip(piece.splits, keep, strict=True) if ok]
        return table.filter(valid), splits

    def _dead_letters(self, dead: list[Dead]) -> None:
        """Write dead letters to the `on_error` sink's staging."""
        if self.plan.bad is None or self.dead is None:
            msg = f"source {self.plan.spec.id!r}: dead letters, but no output for them"
            raise ContinuousSourceError(msg)
        self.dead(self.plan.bad.table(dead))
        self.dead_letters += len(dead)

    def _watermark(self, maxima: dict[str, int | None]) -> None:
        """Advance the watermark (sent on every channel when it moved); tell the channels
        when every split went idle (`watermark.idle_timeout`), as the tracker judges it."""
        now = int(self.clock() * 1000)
        self.tracker.observe(self.plan.spec.id, maxima, now)
        current = self.tracker.advance(now)
        if any(ts is not None for ts in maxima.values()):
            self.idle = False
        elif not self.idle and self._all_idle(now):
            self.idle = True
            for channel in self.channels:
                channel.idle()
        if current > self.sent_watermark:
            self.sent_watermark = current
            for channel in self.channels:
                channel.watermark(current)

    def _all_idle(self, now: int) -> bool:
        spec = self.plan.spec.watermark
        if spec is None or spec.idle_timeout_ms is None or not self.tracker.splits:
            return False
        return all(now - s.last_active_ms >= spec.idle_timeout_ms
                   for s in self.tracker.splits.values())


def newest_per_split(ts: Any, splits: str | list[str]) -> dict[str, int | None]:
    """The newest event time (epoch ms) of the rows of each split: `splits` names one for
    all of `ts`, or the split of each row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    micros = ts.cast(pa.int64())
    if isinstance(splits, str):
        return {splits: pc.max(micros).as_py() // 1000} if len(ts) else {}
    grouped = pa.table({"split": pa.array(splits, pa.string()), "ts": micros}).group_by(
        "split", use_threads=False).aggregate([("ts", "max")])
    return {s: m // 1000 for s, m in zip(grouped.column("split").to_pylist(),
                                         grouped.column("ts_max").to_pylist(), strict=True)}


def split_files(files: Sequence[str], subtasks: int) -> list[list[str]]:
    """The files each of `subtasks` source subtasks reads, in order: file i goes to subtask
    i mod `subtasks` (sorted by name first, as the files source orders them)."""
    ordered = sorted(files)
    return [ordered[i::subtasks] for i in range(subtasks)]
