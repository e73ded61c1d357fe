"""A source subtask of the continuous mode (issue 36): it reads its own splits, runs the
fused stateless chain on Arrow, routes each row by key group to the keyed subtasks'
channels, and carries watermarks, barriers and end of input in the data. Free of Spark, so
a barrier task hosts it as it is; the driver compiles its plan (`SourcePlan`).

- **Splits**: its files, in order (a local parquet, JSON-lines or CSV source: what
  `runtime.arrow_input.decode_unit` reads as Spark would; a file it refuses is an error
  here, as there is no Spark to fall back to: the planner will refuse such a pipeline).
  Each file is decoded whole, then taken `batch_rows` rows at a time, so the position
  between two slices is (file, row).
- **A slice**: the event time (`ArrowInput.event_time`) and the chain (`ArrowInput.program`,
  an `operators.arrow_sql.Program`), then, per keyed subtask, the rows of its key groups
  shaped as the epoch mode's direct read shapes an epoch's input
  (`operators.direct.read_direct`: key groups with Spark's hash from `state.keygroups`,
  partials per key and window): what `operators.continuous.ContinuousSubtask` applies.
  Records are not dropped as late here: lateness is judged against the keyed subtask's
  watermark, which the source does not know (the keyed loop does not drop them yet either).
- **Watermarks**: as the epoch mode computes them (`runtime.watermarks.WatermarkTracker`:
  per split its maximum event time less the bounded out-of-orderness, the minimum over
  active splits), sent on every channel after the slice that advanced it.
- **Barriers**: `inject(n)` (from the coordinator's barrier stream, any thread) is taken
  between two slices: the subtask records its position, acknowledges n with it, and sends
  barrier n on every channel after the rows of the slices before it. After its end of
  input it still acknowledges barriers, with its final position.
- **Restore**: from a recorded position: the files before it are skipped, the file at it is
  read from its row on, and the watermark tracker resumes from the position's.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from streamer.exceptions import StreamerError
from streamer.exchange.alignment import MIN_WATERMARK
from streamer.operators.direct import DirectRead, ipc_bytes, read_direct
from streamer.operators.keyed_config import KeyedConfig
from streamer.pipeline.source_spec import SourceSpec
from streamer.runtime.arrow_input import ArrowInput, decode_unit
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
class SourcePlan:
    """What every subtask of one source runs (picklable; compiled on the driver)."""

    spec: SourceSpec
    input: ArrowInput
    route: KeyedRoute

    def out_schema(self) -> Any:
        """The schema of the rows on every channel."""
        import pyarrow as pa

        from streamer.operators.arrow_sql import arrow_type

        decoded = pa.schema([(n, arrow_type(k)) for n, k in self.input.columns])
        table = decoded.empty_table()
        if self.input.event_time is not None:
            table, _ = self.input.event_time.run(table)
        table, _ = self.input.program.run(table)
        return self.route.empty(table.schema)


class ContinuousSourceError(StreamerError):
    """A source subtask met input it cannot read as Spark would (the continuous mode has no
    Spark to fall back to): the message names the file and why."""


class SourceSubtask:
    """One source subtask over its `files` (in order), sending to `channels` (channel i
    goes to keyed subtask i). `ack(n, position)` acknowledges barrier n; `position` is a
    recorded one to resume from (`position()`'s JSON), or None for the start."""

    def __init__(self, plan: SourcePlan, files: Sequence[str], channels: Sequence[Channel], *,
                 ack: Callable[[int, dict[str, Any]], None],
                 position: dict[str, Any] | None = None, batch_rows: int = 1_000,
                 clock: Callable[[], float] = time.time) -> None:
        if len(channels) != plan.route.cfg.parallelism:
            msg = (f"{len(channels)} channels for {plan.route.cfg.parallelism} keyed "
                   "subtasks")
            raise ValueError(msg)
        self.plan = plan
        self.files = list(files)
        self.channels = list(channels)
        self.ack = ack
        self.batch_rows = batch_rows
        self.clock = clock
        self.tracker = WatermarkTracker({plan.spec.id: plan.spec})
        self.file = 0  # the index of the file being read
        self.row = 0  # rows of it sent
        self.records = 0  # rows read in all (before the chain)
        self.sent_watermark = MIN_WATERMARK
        self.ended = False
        self._barriers: queue.Queue[int] = queue.Queue()
        self._table: Any = None  # the file being read, decoded
        self._split = ""
        self._schema = plan.out_schema()
        if position is not None:
            self._resume(position)

    # ------------------------------------------------------------------ positions
    def position(self) -> dict[str, Any]:
        """Where the subtask is: the files done, the file being read and its rows sent, the
        rows read in all, and the watermark tracker (JSON)."""
        current = self.files[self.file] if self.file < len(self.files) else None
        return {"done": self.files[:self.file], "file": current, "row": self.row,
                "records": self.records, "watermark": self.tracker.to_json()}

    def _resume(self, position: dict[str, Any]) -> None:
        done = set(position.get("done", []))
        unknown = done - set(self.files)
        if unknown:
            msg = f"the position names files this subtask does not read: {sorted(unknown)}"
            raise ValueError(msg)
        current = position.get("file")
        self.file = self.files.index(current) if current is not None else len(self.files)
        if set(self.files[:self.file]) != done:
            msg = "the position's files done are not the ones before its file"
            raise ValueError(msg)
        self.row = int(position.get("row", 0))
        self.records = int(position.get("records", 0))
        self.tracker.restore(position.get("watermark", {}), int(self.clock() * 1000))
        self.sent_watermark = self.tracker.current

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
        table = self._next_slice()
        if table is None:
            for channel in self.channels:
                channel.end()
            self.ended = True
            self.barriers()
            return False
        self._emit(table)
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

    def _next_slice(self) -> Any:
        """The next `batch_rows` rows of the files (advancing the position), or None."""
        from streamer.exceptions import ArrowRefused

        while self.file < len(self.files):
            if self._table is None:
                name = self.files[self.file]
                try:
                    self._table, self._split = decode_unit(self.plan.input, name)
                except ArrowRefused as exc:
                    msg = f"source {self.plan.spec.id!r}: cannot read {name!r} with Arrow: {exc}"
                    raise ContinuousSourceError(msg) from exc
            if self.row < self._table.num_rows:
                table = self._table.slice(self.row, self.batch_rows)
                self.row += table.num_rows
                self.records += table.num_rows
                return table
            self.file += 1
            self.row = 0
            self._table = None
        return None

    def _emit(self, table: Any) -> None:
        """A slice through the chain to the keyed subtasks, then the watermark."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from streamer.columns import EVENT_TIME

        max_ts = None
        if self.plan.input.event_time is not None:
            table, _ = self.plan.input.event_time.run(table)
            ts = table.column(EVENT_TIME)
            if ts.null_count:
                msg = (f"source {self.plan.spec.id!r}: a record of "
                       f"{self.files[self.file]!r} has no event time")
                raise ContinuousSourceError(msg)
            if table.num_rows:
                max_ts = pc.max(ts).cast(pa.int64()).as_py() // 1000
        table, _ = self.plan.input.program.run(table)
        for subtask, channel in enumerate(self.channels):
            rows = self.plan.route.shape(table, subtask).cast(self._schema)
            if rows.num_rows:
                for batch in rows.combine_chunks().to_batches():
                    channel.send(batch)
        self._watermark({self._split: max_ts})

    def _watermark(self, maxima: dict[str, int | None]) -> None:
        now = int(self.clock() * 1000)
        self.tracker.observe(self.plan.spec.id, maxima, now)
        current = self.tracker.advance(now)
        if current > self.sent_watermark:
            self.sent_watermark = current
            for channel in self.channels:
                channel.watermark(current)


def split_files(files: Sequence[str], subtasks: int) -> list[list[str]]:
    """The files each of `subtasks` source subtasks reads, in order: file i goes to subtask
    i mod `subtasks` (sorted by name first, as the files source orders them)."""
    ordered = sorted(files)
    return [ordered[i::subtasks] for i in range(subtasks)]
