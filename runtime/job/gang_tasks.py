"""The tasks of the continuous mode's gang (issue 36): one Spark barrier stage
(`rdd.barrier().mapPartitions`) whose task i is source subtask i for i < `sources`, and
keyed subtask i - `sources` after them. Every task lives for the whole run.

- The tasks find each other with `BarrierTaskContext.allGather`: each keyed subtask starts
  its `ExchangeServer` on its executor's host and publishes the location; each source
  subtask opens an `ExchangeSender` to every keyed subtask.
- A source subtask reads its files in order (`runtime.continuous.source_splits.FileSplits`), runs
  the fused chain and routes its rows (`runtime.continuous.source_subtask.SourceSubtask`), follows
  the coordinator's barriers and acknowledges each with its position.
- A keyed subtask restores its state from the checkpoint it is given (or a savepoint),
  runs `operators.continuous.ContinuousSubtask` over its input gate, and writes what it
  emits between barrier n-1 and n into the sink's staging directory of checkpoint n
  (`TaskFile`, a file per subtask). At barrier n it publishes that file, snapshots its
  state and acknowledges n with the handle; the coordinator commits the staging once
  `_metadata` of n is written.
- Once its input ended, a task keeps answering barriers on the control plane (a source with
  its final position, a keyed subtask with a snapshot of its final state and the rows its
  last timers emitted), so the run's last checkpoint holds everything; the coordinator
  ends the barrier streams after a checkpoint in which every subtask had ended, and the
  tasks return.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from streamer import failpoints
from streamer.columns import OUT, ROW_KIND
from streamer.connectors.exceptions import DecodeError
from streamer.connectors.files.files_sink import TaskFile, TaskTarget, epoch_staging
from streamer.exchange.alignment import BarrierAligner
from streamer.exchange.coordination import CoordinationClient
from streamer.exchange.flight import ExchangeSender, ExchangeServer
from streamer.exchange.gate import InputGate
from streamer.operators.continuous import SnapshotTarget
from streamer.runtime.continuous.source_splits import FileSplits, KafkaSplits
from streamer.runtime.continuous.source_subtask import KeyedRoute, SourcePlan, SourceSubtask
from streamer.runtime.job.barrier_coordinator import keyed_task, source_task

#: How long a keyed subtask waits for its next input before it looks again (s).
_POLL_S = 0.5


@dataclass(frozen=True)
class FileReads:
    """A source subtask's files, in order."""

    files: tuple[str, ...]

    def open(self, plan: SourcePlan, slice_rows: int) -> FileSplits:
        """The splits of a source subtask over these files."""
        return FileSplits(plan.input, self.files, slice_rows, plan.bad)


@dataclass(frozen=True)
class KafkaReads:
    """A source subtask's Kafka partitions: the next offset of each and, for a bounded
    source, where each ends (None: unbounded)."""

    offsets: dict[str, int]
    stop_at: dict[str, int] | None
    #: How long one poll waits for records (s): the longest a record waits to be sent on.
    poll_s: float

    def open(self, plan: SourcePlan, slice_rows: int) -> KafkaSplits:
        """The splits of a source subtask over these partitions."""
        return KafkaSplits(plan.input, self.offsets, slice_rows, stop_at=self.stop_at,
                           poll_s=self.poll_s, bad=plan.bad)


@dataclass(frozen=True)
class GangTasks:
    """What every task of the gang is given (pickled once, with the stage)."""

    #: Source subtasks (the first tasks); the keyed subtasks follow (none: a stateless
    #: pipeline, whose source subtasks write the sink).
    sources: int
    keyed: int
    #: The source's chain and the route to the keyed operator (its `KeyedConfig`, with
    #: the run's `TaskCheckpointing`).
    plan: SourcePlan
    #: Per source subtask, what it reads (`FileReads` or `KafkaReads`).
    reads: tuple[Any, ...]
    #: Rows a source subtask reads at a time.
    slice_rows: int
    #: The coordinator's control plane.
    coordinator: str
    #: Where snapshots go.
    snapshots: SnapshotTarget
    #: The sink's `TaskTarget` with `directory` its staging root (None: `direct`).
    sink: TaskTarget | None
    #: The sink's epoch of checkpoint n is `sink_epoch_base + n`.
    sink_epoch_base: int
    #: Per source subtask, the position to resume from.
    positions: dict[int, dict[str, Any]]
    #: The checkpoint the run resumes from (0: none), the first one it takes (the
    #: coordinator's ids are consecutive from there), and the watermark.
    last_checkpoint: int
    first_checkpoint: int
    watermark: int
    #: The bound of each exchange channel (bytes), and the keyed subtask's batch (rows).
    channel_bytes: int
    batch_rows: int
    #: The host to serve the exchange on (None: the executor's, from the task's address).
    host: str | None
    #: An at_least_once Kafka sink's producer (`KafkaSink.direct`): the keyed subtasks
    #: produce as they emit, and flush at each barrier; None: they stage for the commit.
    direct: Any = None
    #: The `on_error` sink's `TaskTarget` with `directory` its staging root: the source
    #: subtasks stage their dead letters there per checkpoint (None: no `on_error`).
    dead_letters: TaskTarget | None = None

    def staging(self, root: TaskTarget, checkpoint: int) -> TaskTarget:
        """A sink's target (`root`: the sink's, or the dead letters') for what checkpoint
        `checkpoint` commits."""
        return replace(root, directory=epoch_staging(
            root.directory, self.sink_epoch_base + checkpoint))

    def staged(self, subtask: int) -> _StagedOutput:
        """Subtask `subtask`'s output into the sink's staging of each checkpoint."""
        assert self.sink is not None
        return _StagedOutput(self, self.sink, subtask)

    def dead_output(self, subtask: int) -> _StagedOutput | None:
        """Source subtask `subtask`'s dead letters into the `on_error` sink's staging."""
        if self.dead_letters is None:
            return None
        return _StagedOutput(self, self.dead_letters, subtask)

    def __call__(self, _: Any) -> Any:
        """The body of one task of the barrier stage (`mapPartitions`)."""
        from pyspark import BarrierTaskContext

        context = BarrierTaskContext.get()
        if context.attemptNumber():
            msg = ("a continuous gang's task was retried by Spark; the gang restarts only "
                   "whole, from its last checkpoint (the driver restarts it)")
            raise RuntimeError(msg)
        index = context.partitionId()
        host = self.host or context.getTaskInfos()[index].address.rsplit(":", 1)[0]
        if self.keyed == 0:  # a stateless pipeline: the sources write the sink
            yield run_stateless(self, index)
        elif index < self.sources:
            found = context.allGather("")
            yield run_source(self, index, list(found[self.sources:]))
        else:
            subtask = index - self.sources
            server = ExchangeServer(host, self.sources, self.channel_bytes)
            try:
                context.allGather(server.location)
                yield run_keyed(self, subtask, server)
            finally:
                server.close()


def run_source(tasks: GangTasks, subtask: int, keyed: list[str]) -> str:
    """Source subtask `subtask`: its files to the keyed subtasks at `keyed`, barriers
    acknowledged, until the coordinator ends its barrier stream."""
    plan = tasks.plan
    client = CoordinationClient(tasks.coordinator, source_task(plan.spec.id, subtask))
    schema = plan.out_schema()
    senders = [ExchangeSender(where, subtask, schema) for where in keyed]
    dead = tasks.dead_output(subtask)

    def ack(checkpoint: int, position: dict[str, Any]) -> None:
        if dead is not None:
            dead.publish(checkpoint)
        client.ack(checkpoint, position)

    try:
        src = SourceSubtask(plan, tasks.reads[subtask].open(plan, tasks.slice_rows),
                            senders, ack=ack, position=tasks.positions.get(subtask),
                            dead=None if dead is None else dead.write_table)
        drive(src, client)
        return f"source {subtask}: {src.records} records, {src.dead_letters} dead letters"
    except BaseException as exc:
        if isinstance(exc, DecodeError):  # (the keyed subtasks fail too, losing a channel)
            client.fail(str(exc))
        if dead is not None:
            dead.discard()
        raise
    finally:
        for sender in senders:
            sender.close()
        client.close()


def drive(src: SourceSubtask, client: CoordinationClient) -> None:
    """Run a source subtask to the end of its input, taking the barriers injected on the
    control plane; then answer every later barrier with its final position until the
    coordinator ends the stream."""
    client.follow_barriers(src.inject)
    while src.step():
        pass
    while client.following():
        src.barriers()
        time.sleep(0.01)
    src.barriers()
    if client.error is not None:
        raise RuntimeError(client.error)


def run_stateless(tasks: GangTasks, subtask: int) -> str:
    """Source subtask `subtask` of a stateless pipeline: its rows, through the chain, go
    straight to the sink (staged for each checkpoint's commit, or produced at once); at
    barrier n it publishes (or flushes) what came before, then acknowledges n."""
    plan = tasks.plan
    client = CoordinationClient(tasks.coordinator, source_task(plan.spec.id, subtask))
    output: Any = (tasks.staged(subtask) if tasks.direct is None
                   else _DirectOutput(tasks.direct, tasks.first_checkpoint))
    dead = tasks.dead_output(subtask)

    def ack(checkpoint: int, position: dict[str, Any]) -> None:
        failpoints.reached("in-task", checkpoint)
        output.publish(checkpoint)
        if dead is not None:
            dead.publish(checkpoint)
        client.ack(checkpoint, {**position, "rows_out": output.rows})

    try:
        src = SourceSubtask(plan, tasks.reads[subtask].open(plan, tasks.slice_rows),
                            [_SinkChannel(output)], ack=ack,
                            position=tasks.positions.get(subtask),
                            dead=None if dead is None else dead.write_table)
        drive(src, client)
        return f"source {subtask}: {src.records} records, {output.rows} rows out"
    except BaseException as exc:
        if isinstance(exc, DecodeError):
            client.fail(str(exc))
        output.discard()
        if dead is not None:
            dead.discard()
        raise
    finally:
        client.close()


class _SinkChannel:
    """A stateless source subtask's one channel: the sink (`runtime.continuous.source_subtask.
    Channel`); barriers, watermarks and idleness mean nothing to it."""

    def __init__(self, output: Any) -> None:
        self.output = output

    def send(self, batch: Any) -> None:
        self.output.write_rows(batch)

    def barrier(self, checkpoint: int) -> None:
        """Nothing: the subtask's acknowledgement publishes the output first."""

    def watermark(self, ms: int) -> None:
        """Nothing: no operator here waits for time."""

    def idle(self) -> None:
        """Nothing: no operator here waits for time."""

    def end(self) -> None:
        """Nothing: the last checkpoint publishes the rest."""


class _StagedOutput:
    """A subtask's output into a sink's staging directory of the next checkpoint (`root`:
    the sink's target, or the `on_error` sink's for a source subtask's dead letters)."""

    def __init__(self, tasks: GangTasks, root: TaskTarget, subtask: int) -> None:
        self.tasks = tasks
        self.root = root
        self.subtask = subtask
        self.rows = 0
        self._file: TaskFile | None = None
        self._next = tasks.first_checkpoint

    def write(self, batch: Any) -> None:
        """Write the output rows of a keyed subtask's batch."""
        self._open().take(batch)

    def write_rows(self, batch: Any) -> None:
        """Write every row of `batch` (the sink's columns: a stateless pipeline's)."""
        import pyarrow as pa

        self._open().write_rows(pa.Table.from_batches([batch]))

    def write_table(self, table: Any) -> None:
        """Write every row of `table` (the sink's columns: dead letters)."""
        self._open().write_rows(table)

    def _open(self) -> TaskFile:
        if self._file is None:
            target = self.tasks.staging(self.root, self._next)
            os.makedirs(target.directory, exist_ok=True)
            self._file = TaskFile(target, self.subtask, ROW_KIND, OUT)
        return self._file

    def publish(self, checkpoint: int) -> None:
        """Publish what goes with checkpoint `checkpoint`; later rows go with the next."""
        if checkpoint != self._next:
            msg = (f"keyed subtask {self.subtask} wrote rows for checkpoint {self._next}, "
                   f"but checkpoint {checkpoint} came")
            raise RuntimeError(msg)
        if self._file is not None:
            self.rows += self._file.close()
            self._file = None
        self._next = checkpoint + 1

    @property
    def last(self) -> int:
        """The last checkpoint published (below the first: none yet)."""
        return self._next - 1

    def discard(self) -> None:
        if self._file is not None:
            self._file.discard()


class _DirectOutput:
    """A keyed subtask's output produced at once (`GangTasks.direct`); at each barrier
    everything produced before it is flushed, so the checkpoint covers it (at least once)."""

    def __init__(self, producer: Any, first_checkpoint: int) -> None:
        self.producer = producer
        self.last = first_checkpoint - 1

    @property
    def rows(self) -> int:
        return int(self.producer.rows)

    def write(self, batch: Any) -> None:
        """Produce the output rows of a keyed subtask's batch."""
        self.producer.write(batch, ROW_KIND, OUT)

    def write_rows(self, batch: Any) -> None:
        """Produce every row of `batch` (a stateless pipeline's)."""
        self.producer.write(batch)

    def publish(self, checkpoint: int) -> None:
        self.producer.flush()
        self.last = checkpoint

    def discard(self) -> None:
        """Nothing to undo: produced records stay (at least once)."""


def open_keyed(tasks: GangTasks, subtask: int) -> tuple[Any, Any]:
    """The keyed subtask's config and open state: restored from the run's checkpoint (or
    savepoint) over whatever a failed attempt left, or fresh."""
    from streamer.checkpoint.task import prepare
    from streamer.operators.keyed import open_state_of
    from streamer.state import SubtaskLocation

    route = tasks.plan.route
    assert isinstance(route, KeyedRoute)
    cfg = route.cfg
    location = SubtaskLocation(cfg.state_root, cfg.job, cfg.uid, subtask)
    if location.path.exists():  # a failed attempt's state is ahead of the checkpoint
        shutil.rmtree(location.path)
    prepare(cfg, subtask, replace=True)
    return cfg, open_state_of(cfg, subtask)


def run_keyed(tasks: GangTasks, subtask: int, server: ExchangeServer) -> str:
    """Keyed subtask `subtask` over the channels `server` serves (module docstring)."""
    from streamer.operators.continuous import ContinuousSubtask

    cfg, backend = open_keyed(tasks, subtask)
    client = CoordinationClient(tasks.coordinator, keyed_task(cfg.op.id, subtask))
    output: Any = (tasks.staged(subtask) if tasks.direct is None
                   else _DirectOutput(tasks.direct, tasks.first_checkpoint))
    checkpointing = cfg.checkpointing
    base = checkpointing.last.get(subtask) if checkpointing is not None else None

    def ack(checkpoint: int, snapshot: dict[str, Any]) -> None:
        failpoints.reached("in-task", checkpoint)
        output.publish(checkpoint)
        client.ack(checkpoint, {"snapshot": snapshot, "ended": loop.finished,
                                "rows_out": output.rows})

    loop = ContinuousSubtask(cfg, backend, out=output.write, ack=ack,
                             snapshots=tasks.snapshots, base=base,
                             watermark=tasks.watermark, batch_rows=tasks.batch_rows)
    try:
        loop.run(InputGate(server, BarrierAligner(
            tasks.sources, last_checkpoint=tasks.last_checkpoint,
            watermark=tasks.watermark)), timeout_s=_POLL_S)
        answered = _Answered(output.last)
        client.follow_barriers(answered.put)
        while client.following() or answered.waiting():
            checkpoint = answered.take(0.05)
            if checkpoint is not None:
                loop.snapshot(checkpoint)
        if client.error is not None:
            raise RuntimeError(client.error)
        return f"keyed {subtask}: {output.rows} rows"
    except BaseException:
        output.discard()
        raise
    finally:
        backend.close()
        client.close()


class _Answered:
    """The barriers a keyed subtask answers after its input ended: those above its last
    snapshot (the earlier ones reached it in its input)."""

    def __init__(self, last: int) -> None:
        self._last = last
        self._pending: list[int] = []
        self._cond = threading.Condition()

    def put(self, checkpoint: int) -> None:
        with self._cond:
            if checkpoint > self._last:
                self._last = checkpoint
                self._pending.append(checkpoint)
                self._cond.notify_all()

    def waiting(self) -> bool:
        with self._cond:
            return bool(self._pending)

    def take(self, timeout_s: float) -> int | None:
        with self._cond:
            if not self._pending:
                self._cond.wait(timeout_s)
            return self._pending.pop(0) if self._pending else None
