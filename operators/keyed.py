"""The keyed stage of an epoch, as it runs inside a Spark task for one subtask.

The driver (runtime/plan/keyed_plan.py) routes pre-aggregated rows so that Spark partition index ==
subtask index, and calls `run_task` through `mapInArrow`. Per task: open the subtask's state
backend; if this epoch is already committed (a retried task), replay its stored output;
otherwise fire the timers due at the watermark carried into the epoch (the barrier), merge
the epoch's partials into state (one state access per distinct key and window), emit, and
commit state, timers and output atomically under the epoch number.

The task's config is `keyed_config.KeyedConfig`, its input and output rows are in `keyed_rows`,
and the logic of each keyed kind in the kind's module (`operators.kinds`).
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from streamer.columns import (
    DUMMY,
    KEY_GROUP,
    ROW_KIND,
    ROW_META,
    SUBTASK,
)
from streamer.operators.keyed_config import KeyedConfig
from streamer.operators.keyed_rows import Emitter, Input
from streamer.operators.kinds import kind_of


def output_schema(spark: Any, op: Any, input_schema: Any) -> Any:
    """The Spark schema of a keyed operator's output batches: `__kind`, `__meta`, then its
    kind's columns (`KeyedKind.output_fields`), every one nullable."""
    from pyspark.sql.types import StringType, StructField, StructType

    fields = [StructField(ROW_KIND, StringType()), StructField(ROW_META, StringType()),
              *kind_of(op.keyed_kind).output_fields(spark, op, input_schema)]
    return StructType([StructField(f.name, f.dataType, True) for f in fields])


def run_task(cfg: KeyedConfig, batches: Iterator[Any], subtask: int) -> Iterator[Any]:
    """Process one subtask's rows of one epoch; yield the output batch (with a meta row)."""
    from streamer.state.exceptions import CorruptStateError

    read_info: dict[str, Any] = {}  # (records_in, max_ts, read_ms of a direct read)
    if cfg.direct is not None:  # the task reads the epoch's files itself
        from streamer.operators.direct import read_direct

        for _ in batches:  # (the one row that starts the task)
            pass
        began = time.perf_counter()
        table, read_info = read_direct(cfg, cfg.direct, subtask)
        rows: Any = Input(table)
        read_info["read_ms"] = round((time.perf_counter() - began) * 1000, 3)
    else:
        rows = _read_input(cfg, batches, subtask)
        began = time.perf_counter()  # after the input arrived: the stage's own work
    rows = logic_rows(cfg, rows)
    from streamer import failpoints
    from streamer.checkpoint import task as checkpointing

    executor = None
    if cfg.executor_scoped:
        from streamer.operators.executor import executor_identity, scoped

        executor = executor_identity()
        cfg = scoped(cfg, executor)

    def open_state() -> Any:
        return open_state_of(cfg, subtask)

    restored = checkpointing.prepare(cfg, subtask)
    try:
        backend = open_state()
    except CorruptStateError:
        if not (cfg.executor_scoped and checkpointing.has_checkpoint(cfg, subtask)):
            raise
        # On a cluster the working state is a cache of the checkpoint: a task killed while
        # it wrote (a lost executor's straggler) may have left it damaged; fetch it again.
        restored = checkpointing.prepare(cfg, subtask, replace=True)
        backend = open_state()
    if checkpointing.outdated(cfg, subtask, backend.version()):
        # Left here by an earlier epoch, since run elsewhere: the checkpoint is newer.
        backend.close()
        restored = checkpointing.prepare(cfg, subtask, replace=True)
        backend = open_state()
    ok = False
    try:
        done = backend.version()
        if done is not None and done >= cfg.epoch:
            stored = backend.outputs(cfg.epoch)
            if stored is None:
                msg = (f"state of {cfg.uid!r} subtask {subtask} is at epoch {done}, but epoch "
                       f"{cfg.epoch} was asked and its output is no longer kept")
                raise RuntimeError(msg)
            yield _stored_batch(stored)
            extra = checkpointing.snapshot_batch(cfg, backend, subtask, restored)
            if extra is not None:
                yield extra
            ok = True
            return
        checkpointing.check_version(cfg, subtask, done)
        out = Emitter(cfg)
        operate(cfg, backend, rows, out)
        if cfg.flush_to is not None:
            # The end of input follows the epoch's last records (Flink's MAX_WATERMARK after
            # them): every timer up to it fires, as in an epoch of its own without records.
            fire(cfg, backend, cfg.flush_to, out, rows)
        meta: dict[str, Any] = {"subtask": subtask, "out": len(out), "executor": executor,
                                "next_event": backend.next_timer("event"),
                                "next_processing": backend.next_timer("processing"),
                                "task_ms": round((time.perf_counter() - began) * 1000, 3),
                                **read_info}
        batch = out.batch(meta)
        failpoints.reached("in-task", cfg.epoch)
        backend.commit(cfg.epoch, _stored_bytes(batch))
        yield batch
        extra = checkpointing.snapshot_batch(cfg, backend, subtask, restored)
        if extra is not None:
            yield extra
        ok = True
    finally:
        if ok and cfg.park:
            backend.park()  # rocksdb stays open for this process's next task of the subtask
        else:
            backend.close()


def open_state_of(cfg: KeyedConfig, subtask: int) -> Any:
    """Open the working state of `subtask` of the operator (its key groups, its `acc`
    state declared), as every mode's subtask does."""
    from streamer.state import StateDescriptor, StateKind, key_group_range, open_backend

    return open_backend(cfg.backend, cfg.state_root, cfg.job, cfg.uid, subtask,
                        key_group_range(subtask, cfg.parallelism, cfg.max_parallelism),
                        states=[StateDescriptor("acc", StateKind.AGGREGATING)])


def logic_rows(cfg: KeyedConfig, rows: Input) -> Any:
    """`rows` as the kind's logic takes them: the `Input`, or a list of dicts for the
    operators that work row by row."""
    if kind_of(cfg.kind).row_input(cfg):
        return rows.table.to_pylist()
    return rows


def operate(cfg: KeyedConfig, backend: Any, rows: Any, out: Emitter) -> None:
    """The operator's work on one subtask's `rows` (as `logic_rows` gives them): timers up
    to `cfg.fire_up_to` fire, the rows are processed. The epoch mode calls it once per
    epoch, the continuous mode (`operators.continuous`) once per record batch."""
    kind_of(cfg.kind).logic(cfg)(cfg, backend, rows, out)


def fire(cfg: KeyedConfig, backend: Any, up_to: int, out: Emitter, like: Any) -> None:
    """Every timer up to `up_to` fires, in a pass without records (`like`: rows of the
    shape the logic takes, of which none is passed): the end of input in an epoch, a
    watermark advance in the continuous mode."""
    none: Any = [] if isinstance(like, list) else Input(like.table.slice(0, 0))
    operate(replace(cfg, fire_up_to=up_to), backend, none, out)


def _stored_bytes(batch: Any) -> bytes:
    """The epoch's output batch as the backend keeps it for a retried task: one Arrow IPC
    stream, LZ4-compressed (half the bytes of a pickle at the same cost, and every
    checkpoint uploads them)."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def _stored_batch(data: bytes) -> Any:
    """The output batch `_stored_bytes` kept (or, kept by an earlier version, pickled)."""
    if data[:2] == b"\x80\x05":  # (a pickle, protocol 5)
        return pickle.loads(data)
    import pyarrow as pa

    return pa.ipc.open_stream(data).read_next_batch()


def _read_input(cfg: KeyedConfig, batches: Iterator[Any], subtask: int) -> Input:
    """The epoch's rows of this subtask, without the dummy row that makes every subtask run;
    checks that the routing delivered them to the right Spark partition."""
    import pyarrow as pa
    import pyarrow.compute as pc

    received = list(batches)
    if not received:
        return Input(pa.table({KEY_GROUP: pa.array([], pa.int32())}))
    table = pa.Table.from_batches(received)
    dummy = pc.fill_null(table.column(DUMMY), False)
    routed = set(table.filter(dummy).column(SUBTASK).to_pylist())
    if routed - {subtask}:
        msg = (f"keyed stage of {cfg.uid!r}: rows for subtask {min(routed - {subtask})} "
               f"reached Spark partition {subtask}; key-group routing is broken")
        raise RuntimeError(msg)
    return Input(table.filter(pc.invert(dummy)))
