"""The keyed stage of an epoch, as it runs inside a Spark task for one subtask.

The driver (runtime/keyed.py) routes pre-aggregated rows so that Spark partition index ==
subtask index, and calls `run_task` through `mapInArrow`. Per task: open the subtask's state
backend; if this epoch is already committed (a retried task), replay its stored output;
otherwise fire the timers due at the watermark carried into the epoch (the barrier), merge
the epoch's partials into state (one state access per distinct key and window), emit, and
commit state, timers and output atomically under the epoch number.
"""

from __future__ import annotations

import itertools
import json
import pickle
import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from streamer.columns import (
    DUMMY,
    EVENT_TIME,
    EVENT_TIME_MS,
    KEY_GROUP,
    META,
    OUT,
    ROW_KIND,
    ROW_META,
    SEQUENCE,
    SIDE_OUTPUT,
    SUBTASK,
    WINDOW_END,
    WINDOW_START,
    partial,
)
from streamer.operators.aggregates import accumulator
from streamer.pipeline.spec import AggregateSpec
from streamer.state.names import WINDOW_KEYS

NS_ROLLING = b""
_I64 = struct.Struct(">q")


def ns_of(start_ms: int) -> bytes:
    """A window namespace: its start, big-endian so namespaces sort by time."""
    return _I64.pack(start_ms)


@dataclass(frozen=True)
class KeyedConfig:
    """Everything a task needs, as plain picklable data."""

    uid: str
    kind: str  # window | aggregate | dedupe
    keys: tuple[str, ...]
    aggregates: tuple[AggregateSpec, ...]
    window_kind: str | None
    size_ms: int | None
    slide_ms: int | None
    gap_ms: int | None
    count: int | None
    lateness_ms: int
    emit: str
    domain: str  # event | processing
    dedupe_ms: int | None
    record_columns: tuple[str, ...]  # dedupe: the forwarded record's columns
    out_schema: Any  # pyarrow.Schema of the output batches
    backend: str
    state_root: str
    job: str
    parallelism: int
    max_parallelism: int
    epoch: int
    #: Timers at or before this time fire this epoch (watermark, or wall clock).
    fire_up_to: int
    #: process only: the user's KeyedProcessFunction subclass, and the wall clock.
    fn_class: Any = None
    now_ms: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    #: Checkpoint restore/snapshot instructions (`checkpoint.task.TaskCheckpointing`).
    checkpointing: Any = None
    #: On a cluster: keep working state per executor (`operators/executor.py`).
    executor_scoped: bool = False
    #: A small epoch: keep the subtask's state open in the worker for the next task
    #: (`KeyedStateBackend.park`). A big epoch on the Spark path closes it, as its open costs
    #: little next to it; direct-read epochs always park (`KeyedStage.run_direct`).
    park: bool = False
    #: The keyed stage reads this epoch's files itself (`operators.direct.DirectRead`).
    direct: Any = None


def output_schema(spark: Any, op: Any, input_schema: Any) -> Any:
    """The Spark schema of a keyed operator's output batches: `__kind`, `__meta`, then for
    windows the keys, window_start, window_end, `__ts` (= window_end - 1 ms, the event time
    of the result, as in Flink) and the aggregates; for rolling aggregates the keys and the
    aggregates; for dedupe the input's columns."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType, TimestampType

    kind = op.keyed_kind
    fields = [StructField(ROW_KIND, StringType()), StructField(ROW_META, StringType())]
    if kind == "process":
        from streamer.operators.process import load_function_class

        fn = load_function_class(op.process, "", op.id)
        declared = StructType.fromDDL(fn.output_schema)
        assert isinstance(declared, StructType)
        return StructType([*fields, StructField(SIDE_OUTPUT, StringType()), *declared.fields,
                           StructField(EVENT_TIME, TimestampType())])
    if kind == "dedupe":
        fields += list(input_schema.fields)
        if EVENT_TIME not in input_schema.fieldNames():
            fields.append(StructField(EVENT_TIME, TimestampType()))
        return StructType(fields)
    empty = spark.createDataFrame([], input_schema)
    fields += [input_schema[k] for k in op.key_by]
    if kind == "window":
        fields += [StructField("window_start", TimestampType()),
                   StructField("window_end", TimestampType()),
                   StructField(EVENT_TIME, TimestampType())]
    for agg in op.aggregates:
        acc = accumulator(agg, "0", "0")
        dtype = empty.select(F.expr(acc.type_sql).alias(agg.name)).schema[0].dataType
        fields.append(StructField(agg.name, dtype))
    return StructType([StructField(f.name, f.dataType, True) for f in fields])


def _partials(cfg: KeyedConfig) -> list[tuple[Any, int]]:
    """(accumulator, number of partial columns) per aggregate, in order."""
    accs = [accumulator(a, EVENT_TIME_MS, SEQUENCE) for a in cfg.aggregates]
    return [(acc, len(acc.sql)) for acc in accs]


class _Emitter:
    """Collects output rows and turns them into one Arrow batch: row by row (`rows`, dicts)
    or, for the columnar operators, a column chunk at a time (`columns`); the batch holds the
    chunks, then the rows, then the meta row."""

    def __init__(self, cfg: KeyedConfig) -> None:
        self.cfg = cfg
        self.rows: list[dict[str, Any]] = []
        self.chunks: list[tuple[int, dict[str, Any]]] = []

    def __len__(self) -> int:
        return len(self.rows) + sum(n for n, _ in self.chunks)

    def columns(self, keys: list[tuple[Any, ...]], values: list[list[Any]],
                starts: list[int] | None = None, size: int = 0) -> None:
        """Output rows of `keys` with the final `values` (one list per aggregate); with
        `starts`, of the windows [start, start + size)."""
        if not keys:
            return
        self.key_columns([[k[i] for k in keys] for i in range(len(self.cfg.keys))], values,
                         starts, size)

    def key_columns(self, keys: list[list[Any]], values: list[list[Any]],
                    starts: list[int] | None = None, size: int = 0) -> None:
        """`columns`, with the keys given a column (list) per key column."""
        n = len(values[0]) if values else len(starts or ())
        if not n:
            return
        cols: dict[str, Any] = dict(zip(self.cfg.keys, keys, strict=True))
        if starts is not None:
            import numpy as np

            micros = np.asarray(starts, dtype=np.int64) * 1000  # (window times in microseconds)
            cols["window_start"] = micros
            cols["window_end"] = micros + size * 1000
            cols[EVENT_TIME] = micros + (size - 1) * 1000
        for agg, column in zip(self.cfg.aggregates, values, strict=True):
            cols[agg.name] = column
        self.chunks.append((n, cols))

    def window(self, key: Sequence[Any], start: int, end: int, values: list[Any]) -> None:
        row: dict[str, Any] = {ROW_KIND: OUT, ROW_META: None}
        row.update(zip(self.cfg.keys, key, strict=True))
        row["window_start"] = start * 1000
        row["window_end"] = end * 1000
        row[EVENT_TIME] = (end - 1) * 1000
        for agg, value in zip(self.cfg.aggregates, values, strict=True):
            row[agg.name] = value
        self.rows.append(row)

    def record(self, record: dict[str, Any]) -> None:
        self.rows.append({ROW_KIND: OUT, ROW_META: None, **record})

    def batch(self, meta: dict[str, Any]) -> Any:
        import pyarrow as pa

        schema = self.cfg.out_schema
        rows = [*self.rows, {ROW_KIND: META, ROW_META: json.dumps(meta)}]
        last = pa.RecordBatch.from_pylist(rows, schema=schema)
        if not self.chunks:
            return last
        parts = []
        for n, cols in self.chunks:
            arrays = []
            for f in schema:
                if f.name in cols:
                    arrays.append(pa.array(cols[f.name], type=f.type))
                elif f.name == ROW_KIND:
                    arrays.append(pa.array([OUT] * n, type=f.type))
                else:
                    arrays.append(pa.nulls(n, type=f.type))
            parts.append(pa.RecordBatch.from_arrays(arrays, schema=schema))
        return pa.concat_batches([*parts, last])


def _finals(accs: list[tuple[Any, int]], state: list[Any]) -> list[Any]:
    return [acc.final(value) for (acc, _), value in zip(accs, state, strict=True)]


def _final_columns(accs: list[tuple[Any, int]], states: list[list[Any]]) -> list[list[Any]]:
    """The final values of many accumulator lists, one list per aggregate."""
    return [acc.final_rows([state[i] for state in states]) for i, (acc, _) in enumerate(accs)]


def _lifted(accs: list[tuple[Any, int]], rows: _Input) -> list[list[Any]]:
    """The mergeable accumulators of every input row, a column (list) per aggregate."""
    per_agg, i = [], 0
    for acc, n in accs:
        per_agg.append(acc.lift_rows([rows.column(partial(i + j)) for j in range(n)]))
        i += n
    return per_agg


def _lift_columns(accs: list[tuple[Any, int]], rows: _Input) -> list[list[Any]]:
    """The mergeable accumulators of every input row (a list per row, like `_lift`)."""
    return [list(values) for values in zip(*_lifted(accs, rows), strict=True)]


class _Input:
    """A subtask's input rows of an epoch (dummy rows removed) as an Arrow table, read into
    Python a column at a time: the columnar operators never build a dict per row."""

    def __init__(self, table: Any) -> None:
        self.table = table
        self._columns: dict[str, list[Any]] = {}

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def column(self, name: str) -> list[Any]:
        """One column as a Python list."""
        values = self._columns.get(name)
        if values is None:
            values = self._columns[name] = self.table.column(name).to_pylist()
        return values

    def keys(self, names: Sequence[str]) -> list[tuple[Any, ...]]:
        """The key tuple of every row."""
        if not names:
            return [()] * len(self)
        return list(zip(*(self.column(k) for k in names), strict=True))


def _encode_keys(keys: list[tuple[Any, ...]]) -> list[bytes]:
    """`encode_key` of every key, once per distinct key.

    A cache by key is safe: equal keys of one column encode alike (a column has one type,
    and encode_key maps -0.0 and 0.0 alike).
    """
    from streamer.state.codec import encode_key

    cache: dict[tuple[Any, ...], bytes] = {}
    out = []
    for key in keys:
        data = cache.get(key)
        if data is None:
            data = cache[key] = encode_key(key)
        out.append(data)
    return out


def _namespaces(starts: list[int]) -> list[bytes]:
    """`ns_of` of every window start, once per distinct start."""
    cache: dict[int, bytes] = {}
    out = []
    for start in starts:
        ns = cache.get(start)
        if ns is None:
            ns = cache[start] = ns_of(start)
        out.append(ns)
    return out


def _lift(accs: list[tuple[Any, int]], row: dict[str, Any]) -> list[Any]:
    out, i = [], 0
    for acc, n in accs:
        out.append(acc.lift([row[partial(i + j)] for j in range(n)]))
        i += n
    return out


def _merge(accs: list[tuple[Any, int]], a: list[Any] | None, b: list[Any]) -> list[Any]:
    if a is None:
        return b
    return [acc.merge(x, y) for (acc, _), x, y in zip(accs, a, b, strict=True)]


def run_task(cfg: KeyedConfig, batches: Iterator[Any], subtask: int) -> Iterator[Any]:
    """Process one subtask's rows of one epoch; yield the output batch (with a meta row)."""
    from streamer.state import StateDescriptor, StateKind, key_group_range, open_backend
    from streamer.state.exceptions import CorruptStateError

    read_info: dict[str, Any] = {}  # (records_in, max_ts, read_ms of a direct read)
    if cfg.direct is not None:  # the task reads the epoch's files itself
        from streamer.operators.direct import read_direct

        for _ in batches:  # (the one row that starts the task)
            pass
        began = time.perf_counter()
        table, read_info = read_direct(cfg, cfg.direct, subtask)
        rows: Any = _Input(table)
        read_info["read_ms"] = round((time.perf_counter() - began) * 1000, 3)
    else:
        rows = _read_input(cfg, batches, subtask)
        began = time.perf_counter()  # after the input arrived: the stage's own work
    if not (cfg.kind == "aggregate" or (cfg.kind == "window"
                                        and cfg.window_kind in ("tumbling", "sliding"))):
        rows = rows.table.to_pylist()  # the operators that work row by row
    from streamer import failpoints
    from streamer.checkpoint import task as checkpointing

    executor = None
    if cfg.executor_scoped:
        from streamer.operators.executor import executor_identity, scoped

        executor = executor_identity()
        cfg = scoped(cfg, executor)

    def open_state() -> Any:
        return open_backend(cfg.backend, cfg.state_root, cfg.job, cfg.uid, subtask,
                            key_group_range(subtask, cfg.parallelism, cfg.max_parallelism),
                            states=[StateDescriptor("acc", StateKind.AGGREGATING)])

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
            yield pickle.loads(stored)
            extra = checkpointing.snapshot_batch(cfg, backend, subtask, restored)
            if extra is not None:
                yield extra
            ok = True
            return
        checkpointing.check_version(cfg, subtask, done)
        out = _Emitter(cfg)
        if cfg.kind == "process":
            from streamer.operators.process import run_process

            out.rows.extend(run_process(cfg.fn_class, cfg.keys, cfg.record_columns, rows,
                                        backend, cfg.fire_up_to, cfg.now_ms))
        elif cfg.kind == "dedupe":
            _dedupe(cfg, backend, rows, out)
        elif cfg.kind == "aggregate":
            _rolling(cfg, backend, rows, out)
        elif cfg.window_kind == "session":
            _sessions(cfg, backend, rows, out)
        elif cfg.window_kind == "count":
            _count_windows(cfg, backend, rows, out)
        else:
            _time_windows(cfg, backend, rows, out)
        meta: dict[str, Any] = {"subtask": subtask, "out": len(out), "executor": executor,
                                "next_event": backend.next_timer("event"),
                                "next_processing": backend.next_timer("processing"),
                                "task_ms": round((time.perf_counter() - began) * 1000, 3),
                                **read_info}
        batch = out.batch(meta)
        failpoints.reached("in-task", cfg.epoch)
        backend.commit(cfg.epoch, pickle.dumps(batch, protocol=5))
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


def _read_input(cfg: KeyedConfig, batches: Iterator[Any], subtask: int) -> _Input:
    """The epoch's rows of this subtask, without the dummy row that makes every subtask run;
    checks that the routing delivered them to the right Spark partition."""
    import pyarrow as pa
    import pyarrow.compute as pc

    received = list(batches)
    if not received:
        return _Input(pa.table({KEY_GROUP: pa.array([], pa.int32())}))
    table = pa.Table.from_batches(received)
    dummy = pc.fill_null(table.column(DUMMY), False)
    routed = set(table.filter(dummy).column(SUBTASK).to_pylist())
    if routed - {subtask}:
        msg = (f"keyed stage of {cfg.uid!r}: rows for subtask {min(routed - {subtask})} "
               f"reached Spark partition {subtask}; key-group routing is broken")
        raise RuntimeError(msg)
    return _Input(table.filter(pc.invert(dummy)))


def _key_bytes(key: Sequence[Any]) -> bytes:
    from streamer.state.codec import encode_key

    return encode_key(tuple(key))


def _fire_time_windows(cfg: KeyedConfig, backend: Any, accs: list[tuple[Any, int]],
                       out: _Emitter) -> None:
    due = backend.due_timers(cfg.domain, cfg.fire_up_to, remove=True)
    if not due:
        return
    from streamer.state.codec import decode_key

    # A timer with a key is the timer of one (key, window), as state written before window
    # key lists had; the others name one epoch's entry of a window in `WINDOW_KEYS`: a tuple
    # (key columns, accumulator columns) of the window's partials (emit: final), or a list
    # of the keys whose accumulators are in "acc" (emit: updates, and older state).
    cells = [(t.key_group, t.key, t.namespace) for t in due if t.key]
    lists = [(t.key_group, t.key, t.namespace) for t in due if not t.key]
    # Columnar partials of a window by (key group, namespace): [(key columns, acc columns)].
    chunks: dict[tuple[int, bytes], list[tuple[Any, Any]]] = {}
    if lists:
        for (kg, _, list_ns), members in zip(lists, backend.get_many(WINDOW_KEYS, lists),
                                              strict=True):
            ns = list_ns[:8]
            if isinstance(members, tuple):
                chunks.setdefault((kg, ns), []).append(members)
            else:
                cells.extend((kg, key_bytes, ns) for key_bytes in members or ())
        backend.delete_many(WINDOW_KEYS, lists)
    if not cells:
        _fire_chunks(cfg, accs, chunks, out)
        return
    partials: dict[tuple[int, bytes, bytes], Any] = {}
    for (kg, ns), parts in chunks.items():  # next to older layouts: merge by key
        for key_bytes, (_, acc) in _merge_by_key(accs, parts).items():
            partials[(kg, key_bytes, ns)] = acc
    keys, starts, states = [], [], []
    decoded: dict[bytes, tuple[Any, ...]] = {}
    start_of: dict[bytes, int] = {}

    def add(key_bytes: bytes, ns: bytes, state: Any) -> None:
        key = decoded.get(key_bytes)
        if key is None:
            key = decoded[key_bytes] = decode_key(key_bytes)
        start = start_of.get(ns)
        if start is None:
            start = start_of[ns] = _I64.unpack(ns)[0]
        keys.append(key)
        starts.append(start)
        states.append(state)

    if cells:
        for cell, state in zip(cells, backend.get_many("acc", cells), strict=True):
            extra = partials.pop(cell, None)
            if extra is not None:
                state = extra if state is None else _merge(accs, state, extra)
            if state is not None:
                add(cell[1], cell[2], state)
        backend.delete_many("acc", cells)
    for (_, key_bytes, ns), state in partials.items():
        add(key_bytes, ns, state)
    out.columns(keys, _final_columns(accs, states), starts, cfg.size_ms or 0)


def _merge_by_key(accs: list[tuple[Any, int]], parts: list[tuple[Any, Any]]
                  ) -> dict[bytes, tuple[tuple[Any, ...], list[Any]]]:
    """Columnar partials of one window (key columns, accumulator columns), from one or more
    epochs, merged per key in the order given: key bytes -> (key, accumulator)."""
    merged: dict[bytes, tuple[tuple[Any, ...], list[Any]]] = {}
    for key_columns, acc_columns in parts:
        for key, acc in zip(zip(*key_columns, strict=True), zip(*acc_columns, strict=True),
                            strict=True):
            key_bytes = _key_bytes(key)
            before = merged.get(key_bytes)
            merged[key_bytes] = (key, list(acc) if before is None
                                 else _merge(accs, before[1], list(acc)))
    return merged


def _fire_chunks(cfg: KeyedConfig, accs: list[tuple[Any, int]],
                 chunks: dict[tuple[int, bytes], list[tuple[Any, Any]]], out: _Emitter) -> None:
    """Emit fired windows stored as columnar partials: a window written in one epoch is
    emitted column by column as it is; one written in several is merged by key first."""
    width = len(cfg.keys)
    keys: list[list[Any]] = [[] for _ in range(width)]
    values: list[list[Any]] = [[] for _ in accs]
    starts: list[int] = []
    for (_, ns), parts in chunks.items():
        if len(parts) > 1:
            rows = list(_merge_by_key(accs, parts).values())
            parts = [([[k[i] for k, _ in rows] for i in range(width)],
                      [[a[j] for _, a in rows] for j in range(len(accs))])]
        key_columns, acc_columns = parts[0]
        for column, part in zip(keys, key_columns, strict=True):
            column.extend(part)
        for column, part in zip(values, acc_columns, strict=True):
            column.extend(part)
        starts.extend([_I64.unpack(ns)[0]] * len(acc_columns[0] if accs else key_columns[0]))
    finals = [acc.final_rows(column) for (acc, _), column in zip(accs, values, strict=True)]
    out.key_columns(keys, finals, starts, cfg.size_ms or 0)


def _time_windows(cfg: KeyedConfig, backend: Any, rows: _Input, out: _Emitter) -> None:
    """Tumbling and sliding windows. Firing goes by window, not by key: per key group,
    window and epoch, one timer and one `WINDOW_KEYS` entry, so a subtask registers and
    scans hundreds of timers per epoch instead of one per (key, window). With `emit: final`
    that entry holds the epoch's partials of the window by key (merged when it fires); with
    `emit: updates`, whose every epoch emits the merged value, each (key, window) has an
    accumulator entry and the `WINDOW_KEYS` entry lists the keys the window got that
    epoch."""
    from streamer.state import StateDescriptor, StateKind

    backend.declare(StateDescriptor(WINDOW_KEYS, StateKind.VALUE))
    accs = _partials(cfg)
    _fire_time_windows(cfg, backend, accs, out)
    if not len(rows):
        return
    size = cfg.size_ms or 0
    delay = size - 1 + cfg.lateness_ms
    epoch = _I64.pack(cfg.epoch)
    if cfg.emit == "final":
        # Nothing is emitted before the window fires, so nothing needs the stored value now:
        # the epoch's partials of each (key group, window) go into one `WINDOW_KEYS` entry
        # as columns (keys, accumulators), merged when the window fires. No reads, and one
        # write per window instead of a read and a write per (key, window).
        _window_chunks(cfg, backend, accs, rows, epoch, delay)
        return
    keys = rows.keys(cfg.keys)
    starts = rows.column(WINDOW_START)
    cells = list(zip(rows.column(KEY_GROUP), _encode_keys(keys), _namespaces(starts), strict=True))
    stored = backend.get_many("acc", cells)
    updates, merged_all = [], []
    fresh: dict[tuple[int, bytes], list[bytes]] = {}
    for cell, old, new in zip(cells, stored, _lift_columns(accs, rows), strict=True):
        # The stored value is just the accumulators: key and window are in the state key.
        merged = _merge(accs, old, new)
        updates.append((*cell, merged))
        merged_all.append(merged)
        if old is None:
            fresh.setdefault((cell[0], cell[2]), []).append(cell[1])
    if cfg.emit == "updates":
        out.columns(keys, _final_columns(accs, merged_all), starts, size)
    backend.put_many("acc", updates)
    if fresh:
        backend.put_many(WINDOW_KEYS, [(kg, b"", ns + epoch, members)
                                       for (kg, ns), members in fresh.items()])
        backend.add_timers(cfg.domain, [(kg, _I64.unpack(ns)[0] + delay, b"", ns + epoch)
                                        for kg, ns in fresh])


def _window_chunks(cfg: KeyedConfig, backend: Any, accs: list[tuple[Any, int]], rows: _Input,
                   epoch: bytes, delay: int) -> None:
    """Store the epoch's partials as one columnar entry per (key group, window)."""
    import numpy as np
    import pyarrow.compute as pc

    table = rows.table
    order = pc.sort_indices(table, [(KEY_GROUP, "ascending"), (WINDOW_START, "ascending")])
    table = table.take(order)
    kgs = table.column(KEY_GROUP).to_numpy()
    starts = table.column(WINDOW_START).to_numpy()
    bounds = [0, *(np.flatnonzero((kgs[1:] != kgs[:-1]) | (starts[1:] != starts[:-1])) + 1)
              .tolist(), len(kgs)]
    key_lists = [table.column(k).to_pylist() for k in cfg.keys]
    acc_lists = _lifted(accs, _Input(table))
    entries, timers = [], []
    for a, b in itertools.pairwise(bounds):
        kg, start = int(kgs[a]), int(starts[a])
        ns = ns_of(start) + epoch
        entries.append((kg, b"", ns, ([k[a:b] for k in key_lists],
                                      [c[a:b] for c in acc_lists])))
        timers.append((kg, start + delay, b"", ns))
    backend.put_many(WINDOW_KEYS, entries)
    backend.add_timers(cfg.domain, timers)


def _rolling(cfg: KeyedConfig, backend: Any, rows: _Input, out: _Emitter) -> None:
    accs = _partials(cfg)
    if not len(rows):
        return
    keys = rows.keys(cfg.keys)
    cells = [(kg, key, NS_ROLLING)
             for kg, key in zip(rows.column(KEY_GROUP), _encode_keys(keys), strict=True)]
    stored = backend.get_many("acc", cells)
    merged_all = [_merge(accs, old, new)
                  for old, new in zip(stored, _lift_columns(accs, rows), strict=True)]
    out.columns(keys, _final_columns(accs, merged_all))
    backend.put_many("acc", [(*cell, merged)
                             for cell, merged in zip(cells, merged_all, strict=True)])


def _sessions(cfg: KeyedConfig, backend: Any, rows: list[dict[str, Any]],
              out: _Emitter) -> None:
    """Session windows: the epoch's sessions (from Spark's session_window) are merged with
    the key's stored sessions; each session has a timer at end - 1 + lateness."""
    accs = _partials(cfg)
    due = backend.due_timers(cfg.domain, cfg.fire_up_to, remove=True)
    fired_keys = {(t.key_group, t.key) for t in due}
    by_key: dict[tuple[int, bytes], list[dict[str, Any]]] = {}
    for row in rows:
        by_key.setdefault((row[KEY_GROUP], _key_bytes([row[k] for k in cfg.keys])), []).append(row)
    cells = sorted(fired_keys | set(by_key))
    if not cells:
        return
    stored = backend.get_many("acc", [(kg, kb, NS_ROLLING) for kg, kb in cells])
    puts, deletes = [], []
    stale: list[tuple[int, int, bytes, bytes]] = []
    fresh: list[tuple[int, int, bytes, bytes]] = []
    for (kg, kb), value in zip(cells, stored, strict=True):
        key = value[0] if value else None
        # The watermark arrives before the epoch's records: due sessions fire first.
        sessions: list[list[Any]] = []  # [start, end, accumulators, touched this epoch]
        for start, end, state in (value[3] if value else []):
            if end - 1 + cfg.lateness_ms <= cfg.fire_up_to:
                out.window(key or (), start, end, _finals(accs, state))
            else:
                sessions.append([start, end, state, False])
        before = {(s[0], s[1]) for s in sessions}
        for row in by_key.get((kg, kb), []):
            key = tuple(row[k] for k in cfg.keys)
            sessions.append([row[WINDOW_START], row[WINDOW_END], _lift(accs, row), True])
        sessions.sort(key=lambda s: (s[0], s[1]))
        merged: list[list[Any]] = []
        for s in sessions:
            # Sessions that touch merge (an event exactly `gap` after the last one belongs to
            # the same session), as in Spark's session_window and Flink's TimeWindow.
            if merged and s[0] <= merged[-1][1]:
                last = merged[-1]
                last[1] = max(last[1], s[1])
                last[2] = _merge(accs, last[2], s[2])
                last[3] = last[3] or s[3]
            else:
                merged.append(list(s))
        after = {(s[0], s[1]) for s in merged}
        stale.extend((kg, end - 1 + cfg.lateness_ms, kb, ns_of(start))
                     for start, end in before - after)
        for start, end, state, touched in merged:
            if (start, end) not in before:
                fresh.append((kg, end - 1 + cfg.lateness_ms, kb, ns_of(start)))
            if touched and cfg.emit == "updates":
                out.window(key or (), start, end, _finals(accs, state))
        if merged:
            puts.append((kg, kb, NS_ROLLING, (key, None, None,
                                              [tuple(m[:3]) for m in merged])))
        else:
            deletes.append((kg, kb, NS_ROLLING))
    if stale:
        backend.delete_timers(cfg.domain, stale)
    if fresh:
        backend.add_timers(cfg.domain, fresh)
    if puts:
        backend.put_many("acc", puts)
    if deletes:
        backend.delete_many("acc", deletes)


def _count_windows(cfg: KeyedConfig, backend: Any, rows: list[dict[str, Any]],
                   out: _Emitter) -> None:
    """A window per key of `count` records in event-time (then arrival) order; one partial
    per record arrives here. A partial window at the end of input is not emitted (as in
    Flink's count windows)."""
    accs = _partials(cfg)
    limit = cfg.count or 1
    rows = sorted(rows, key=lambda r: (r[KEY_GROUP], _key_bytes([r[k] for k in cfg.keys]),
                                       r[EVENT_TIME_MS], r[SEQUENCE]))
    by_key: dict[tuple[int, bytes], list[dict[str, Any]]] = {}
    for row in rows:
        by_key.setdefault((row[KEY_GROUP], _key_bytes([row[k] for k in cfg.keys])), []).append(row)
    cells = list(by_key)
    if not cells:
        return
    stored = backend.get_many("acc", [(kg, kb, NS_ROLLING) for kg, kb in cells])
    puts, deletes = [], []
    for (kg, kb), value in zip(cells, stored, strict=True):
        n, first, last, state = (value[3] if value else (0, None, None, None))
        key = None
        for row in by_key[(kg, kb)]:
            key = tuple(row[k] for k in cfg.keys)
            state = _merge(accs, state, _lift(accs, row))
            first = row[EVENT_TIME_MS] if first is None else first
            last = row[EVENT_TIME_MS]
            n += 1
            if n == limit:
                out.window(key, first, last, _finals(accs, state))
                n, first, last, state = 0, None, None, None
        if n:
            puts.append((kg, kb, NS_ROLLING, (key, None, None, (n, first, last, state))))
        else:
            deletes.append((kg, kb, NS_ROLLING))
    if puts:
        backend.put_many("acc", puts)
    if deletes:
        backend.delete_many("acc", deletes)


def _dedupe(cfg: KeyedConfig, backend: Any, rows: list[dict[str, Any]], out: _Emitter) -> None:
    """Forward the first record per key; forget the key `within` after that record."""
    due = backend.due_timers(cfg.domain, cfg.fire_up_to, remove=True)
    if due:
        backend.delete_many("acc", [(t.key_group, t.key, NS_ROLLING) for t in due])
    if not rows:
        return
    cells = [(r[KEY_GROUP], _key_bytes([r[k] for k in cfg.keys]), NS_ROLLING) for r in rows]
    seen = backend.get_many("acc", cells)
    puts, timers = [], []
    for row, cell, old in zip(rows, cells, seen, strict=True):
        if old is not None:
            continue
        record = {c: row[c] for c in cfg.record_columns}
        out.record(record)
        expiry = row[EVENT_TIME_MS] + (cfg.dedupe_ms or 0)
        puts.append((*cell, (None, None, None, expiry)))
        timers.append((cell[0], expiry, cell[1], NS_ROLLING))
    if puts:
        backend.put_many("acc", puts)
        backend.add_timers(cfg.domain, timers)
