"""Windows, the keyed kind (`WindowKind`, see `operators.contract`): tumbling, sliding,
session and count windows of aggregates per key, in event or processing time.

Spark combines each epoch's rows into partial aggregates per key and window (`combine`, which
rolling aggregates share); a subtask merges them into state and fires a window when the
watermark (or the wall clock) passes its end plus the allowed lateness. Time windows are
here, sessions in operators/sessions.py; each merges the epoch's rows into state and emits
into the task's `Emitter`.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from streamer import columns as C
from streamer.columns import EVENT_TIME_MS, KEY_GROUP, SEQUENCE, WINDOW_START
from streamer.operators.contract import COLUMNAR, COMBINES, LOCAL_EPOCHS, KeyedKind, Logic, Planning
from streamer.operators.keyed_config import KeyedConfig
from streamer.operators.keyed_rows import (
    I64,
    NS_ROLLING,
    Emitter,
    Input,
    accumulators_of,
    encode_keys,
    final_columns,
    final_values,
    key_to_bytes,
    lift_columns,
    lift_row,
    lifted_columns,
    merge_accumulators,
    ns_of,
    window_namespaces,
)
from streamer.state.names import WINDOW_KEYS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructField, StructType

    from streamer.pipeline.spec import OperatorSpec


class WindowKind(KeyedKind):
    """Tumbling, sliding, session and count windows (`window:`)."""

    name = "window"
    capabilities = frozenset({COMBINES, COLUMNAR, LOCAL_EPOCHS})

    def local_refusal(self, op: OperatorSpec) -> str | None:
        """Count windows go record by record in order, and a `late:` output is a Spark
        frame of its own: neither takes local epochs."""
        window = op.window
        if window is not None and (window.kind in ("count", "until") or window.late):
            return "a count or until window, or a late: output"
        return None

    def row_input(self, cfg: KeyedConfig) -> bool:
        """A count window takes its records as dicts, in order."""
        return cfg.window_kind == "count"

    def output_fields(self, spark: Any, op: OperatorSpec, input_schema: StructType
                      ) -> list[StructField]:
        """The keys, `window_start`, `window_end`, `__ts` (the end - 1 ms: the result's
        event time, as in Flink) and the aggregates."""
        from pyspark.sql.types import StructField, TimestampType

        return [*(input_schema[k] for k in op.key_by),
                StructField("window_start", TimestampType()),
                StructField("window_end", TimestampType()),
                StructField(C.EVENT_TIME, TimestampType()),
                *aggregate_fields(spark, op, input_schema)]

    def prepare(self, plan: Planning, df: DataFrame, group: list[Any], epoch: int,
                watermark: int, prerouted: bool) -> tuple[DataFrame, DataFrame | None, Any]:
        """Late records split off, each record assigned its windows, then combined per key
        and window (`combine`)."""
        from pyspark.sql import functions as F

        window = plan.op.window
        assert window is not None
        late = late_seen = None
        lateness = window.allowed_lateness_ms
        event = plan.domain == "event"
        ms = F.col(EVENT_TIME_MS)
        group = list(group)
        if window.kind in ("tumbling", "sliding"):
            df, late, late_seen = assign_time_windows(plan, df, epoch, watermark)
            group.append(F.col(WINDOW_START))
        elif window.kind == "until":  # a window per key and close time, ending there
            close = F.expr(f"unix_millis(`{window.until}`)")
            if event:  # (a null close time is a bad record: the keyed stage took it out)
                df, late, late_seen = plan.split_late(
                    df, close + F.lit(lateness - 1) <= F.lit(watermark), epoch,
                    bool(window.late))
            df = df.withColumn(WINDOW_START, close)
            group.append(F.col(WINDOW_START))
        elif window.kind == "session":
            gap = window.gap_ms or 0
            if event:
                df, late, late_seen = plan.split_late(
                    df, ms + F.lit(gap - 1 + lateness) <= F.lit(watermark), epoch,
                    bool(window.late))
            session = F.session_window(F.timestamp_millis(ms), f"{gap} milliseconds")
            group.append(session.alias(C.SESSION))
        else:  # count: one partial per record, in order
            group += [ms, F.col(SEQUENCE)]
        rows = combine(plan, df, group, prerouted)
        if window.kind == "session":
            rows = rows.withColumns({
                WINDOW_START: F.expr(f"unix_millis({C.SESSION}.start)"),
                C.WINDOW_END: F.expr(f"unix_millis({C.SESSION}.end)")}).drop(C.SESSION)
        if late is not None:
            late = late.drop(*[c for c in late.columns if c.startswith(C.HIDDEN_PREFIX)])
        return rows, late, late_seen

    def logic(self, cfg: KeyedConfig) -> Logic:
        """Sessions, count windows or time windows."""
        if cfg.window_kind == "session":
            from streamer.operators.sessions import run_sessions

            return lambda cfg, backend, rows, out: run_sessions(cfg, backend, rows.table, out)
        return _count_windows if cfg.window_kind == "count" else _time_windows


def assign_time_windows(plan: Planning, df: DataFrame, epoch: int, watermark: int
                        ) -> tuple[DataFrame, DataFrame | None, Any]:
    """`df` with each record's tumbling or sliding windows of `plan.op.window` (a row per
    window, its start in `WINDOW_START`), late records split off in event time (for a
    `late:` output, or counted): (rows, late rows or None, what counts the late)."""
    from pyspark.sql import functions as F

    window = plan.op.window
    assert window is not None
    late = late_seen = None
    lateness = window.allowed_lateness_ms
    event = plan.domain == "event"
    ms = F.col(EVENT_TIME_MS)
    size, slide = window.size_ms or 0, window.slide_ms or window.size_ms or 0
    last = ms - F.expr(f"pmod({EVENT_TIME_MS}, {slide})")
    if event:
        df, late, late_seen = plan.split_late(
            df, last + F.lit(size - 1 + lateness) <= F.lit(watermark), epoch,
            bool(window.late))
    # Window starts are multiples of the slide: the last one at or before ts, back to the
    # first whose window still contains ts (filtered below when size % slide).
    back = ((size - 1) // slide) * slide
    # One window per record (tumbling, or a slide not below the size) needs no array and
    # explode per record.
    starts = last if back == 0 else F.explode(F.expr(
        f"sequence({EVENT_TIME_MS} - pmod({EVENT_TIME_MS}, {slide}) - {back}, "
        f"{EVENT_TIME_MS} - pmod({EVENT_TIME_MS}, {slide}), {slide})"))
    df = df.withColumn(WINDOW_START, starts).filter(F.col(WINDOW_START) + F.lit(size) > ms)
    if event:
        df = df.filter(F.col(WINDOW_START) + F.lit(size - 1 + lateness) > F.lit(watermark))
    return df, late, late_seen


def aggregate_fields(spark: Any, op: OperatorSpec, input_schema: StructType
                     ) -> list[StructField]:
    """The output column of each of `op`'s aggregates, typed as Spark types its final
    value over `input_schema`. Without a session (`spark` None: `streamer.testing.harness`)
    only the aggregates Arrow computes are typed (`arrow_typed_aggregate`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField

    from streamer.frames import empty_frame
    from streamer.operators.aggregates import accumulator

    if spark is None:
        return [StructField(agg.name, arrow_typed_aggregate(agg, input_schema))
                for agg in op.aggregates]
    empty = empty_frame(spark, input_schema)
    fields = []
    for agg in op.aggregates:
        acc = accumulator(agg, "0", "0")
        dtype = empty.select(F.expr(acc.type_sql).alias(agg.name)).schema[0].dataType
        fields.append(StructField(agg.name, dtype))
    return fields


def arrow_typed_aggregate(agg: Any, input_schema: StructType) -> Any:
    """The Spark type of aggregate `agg`'s final value, without a session, for the functions
    whose partials Arrow computes (`operators.direct.DIRECT_AGGREGATES`) over the columns a
    direct read takes (integers, floating point; min and max of timestamps too), as Spark's
    analyzer types them (tests/operators/test_harness_types.py checks it does)."""
    from pyspark.sql.types import DoubleType, FloatType, LongType

    if agg.function == "count":
        return LongType()
    if agg.function not in ("sum", "min", "max", "avg") or agg.filter is not None \
            or agg.arg is None or agg.arg not in input_schema.fieldNames():
        msg = (f"aggregate {agg.name!r} ({agg.function}({agg.arg or ''})"
               f"{' with a filter' if agg.filter else ''}) is typed by Spark's analyzer "
               f"only: without a session, count, sum, min, max and avg of a column are")
        raise ValueError(msg)
    dtype = input_schema[agg.arg].dataType
    name = dtype.simpleString()
    if agg.function in ("min", "max") and name in (*_INTEGRAL, "float", "double", "timestamp"):
        return dtype
    if name in _INTEGRAL:
        return LongType() if agg.function == "sum" else DoubleType()
    if isinstance(dtype, FloatType) or name == "double":
        return DoubleType()
    msg = f"aggregate {agg.name!r}: {agg.function} of a {name} column needs Spark's analyzer"
    raise ValueError(msg)


_INTEGRAL = ("tinyint", "smallint", "int", "bigint")


def combine(plan: Planning, df: DataFrame, group: list[Any], prerouted: bool) -> DataFrame:
    """The epoch's partial aggregates of `plan.op` per `group` (an update stream's rows add
    their values, or, retractions, take them back: signed partials). `prerouted`: the rows
    go to their subtask's partition first and are combined there."""
    from pyspark.sql import functions as F

    from streamer.operators.aggregates import accumulator

    sign = (f"if({C.CHANGE} = '{C.RETRACT}', -1, 1)" if C.CHANGE in df.columns else None)
    partials = []
    for agg in plan.op.aggregates:
        acc = accumulator(agg, EVENT_TIME_MS, SEQUENCE, sign)
        partials += [F.expr(sql) for sql in acc.sql]
    if prerouted:
        df, group = plan.routed(df), [F.col(C.ROUTE), *group]
    return df.groupBy(*group).agg(*[c.alias(C.partial(i)) for i, c in enumerate(partials)])


def _fire_time_windows(cfg: KeyedConfig, backend: Any, accs: list[tuple[Any, int]],
                       out: Emitter) -> None:
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
            start = start_of[ns] = I64.unpack(ns)[0]
        keys.append(key)
        starts.append(start)
        states.append(state)

    if cells:
        for cell, state in zip(cells, backend.get_many("acc", cells), strict=True):
            extra = partials.pop(cell, None)
            if extra is not None:
                state = extra if state is None else merge_accumulators(accs, state, extra)
            if state is not None:
                add(cell[1], cell[2], state)
        backend.delete_many("acc", cells)
    for (_, key_bytes, ns), state in partials.items():
        add(key_bytes, ns, state)
    out.columns(keys, final_columns(accs, states), starts, cfg.size_ms or 0)


def _merge_by_key(accs: list[tuple[Any, int]], parts: list[tuple[Any, Any]]
                  ) -> dict[bytes, tuple[tuple[Any, ...], list[Any]]]:
    """Columnar partials of one window (key columns, accumulator columns), from one or more
    epochs, merged per key in the order given: key bytes -> (key, accumulator)."""
    merged: dict[bytes, tuple[tuple[Any, ...], list[Any]]] = {}
    for key_columns, acc_columns in parts:
        for key, acc in zip(zip(*key_columns, strict=True), zip(*acc_columns, strict=True),
                            strict=True):
            key_bytes = key_to_bytes(key)
            before = merged.get(key_bytes)
            merged[key_bytes] = (key, list(acc) if before is None
                                 else merge_accumulators(accs, before[1], list(acc)))
    return merged


def _fire_chunks(cfg: KeyedConfig, accs: list[tuple[Any, int]],
                 chunks: dict[tuple[int, bytes], list[tuple[Any, Any]]], out: Emitter) -> None:
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
        starts.extend([I64.unpack(ns)[0]] * len(acc_columns[0] if accs else key_columns[0]))
    finals = [acc.final_rows(column) for (acc, _), column in zip(accs, values, strict=True)]
    out.key_columns(keys, finals, starts, cfg.size_ms or 0)


def _time_windows(cfg: KeyedConfig, backend: Any, rows: Input, out: Emitter) -> None:
    """Tumbling and sliding windows. Firing goes by window, not by key: per key group,
    window and epoch, one timer and one `WINDOW_KEYS` entry, so a subtask registers and
    scans hundreds of timers per epoch instead of one per (key, window). With `emit: final`
    that entry holds the epoch's partials of the window by key (merged when it fires); with
    `emit: updates`, whose every epoch emits the merged value, each (key, window) has an
    accumulator entry and the `WINDOW_KEYS` entry lists the keys the window got that
    epoch."""
    from streamer.state import StateDescriptor, StateKind

    backend.declare(StateDescriptor(WINDOW_KEYS, StateKind.VALUE))
    accs = accumulators_of(cfg)
    _fire_time_windows(cfg, backend, accs, out)
    if not len(rows):
        return
    size = cfg.size_ms or 0
    delay = size - 1 + cfg.lateness_ms
    epoch = I64.pack(cfg.epoch)
    if cfg.emit == "final":
        # Nothing is emitted before the window fires, so nothing needs the stored value now:
        # the epoch's partials of each (key group, window) go into one `WINDOW_KEYS` entry
        # as columns (keys, accumulators), merged when the window fires. No reads, and one
        # write per window instead of a read and a write per (key, window).
        _window_chunks(cfg, backend, accs, rows, epoch, delay)
        return
    keys = rows.keys(cfg.keys)
    starts = rows.column(WINDOW_START)
    cells = list(zip(rows.column(KEY_GROUP), encode_keys(keys), window_namespaces(starts),
                     strict=True))
    stored = backend.get_many("acc", cells)
    updates, merged_all = [], []
    fresh: dict[tuple[int, bytes], list[bytes]] = {}
    for cell, old, new in zip(cells, stored, lift_columns(accs, rows), strict=True):
        # The stored value is just the accumulators: key and window are in the state key.
        merged = merge_accumulators(accs, old, new)
        updates.append((*cell, merged))
        merged_all.append(merged)
        if old is None:
            fresh.setdefault((cell[0], cell[2]), []).append(cell[1])
    if cfg.emit == "updates":
        out.columns(keys, final_columns(accs, merged_all), starts, size)
    backend.put_many("acc", updates)
    if fresh:
        backend.put_many(WINDOW_KEYS, [(kg, b"", ns + epoch, members)
                                       for (kg, ns), members in fresh.items()])
        backend.add_timers(cfg.domain, [(kg, I64.unpack(ns)[0] + delay, b"", ns + epoch)
                                        for kg, ns in fresh])


def _window_chunks(cfg: KeyedConfig, backend: Any, accs: list[tuple[Any, int]], rows: Input,
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
    acc_lists = lifted_columns(accs, Input(table))
    entries, timers = [], []
    for a, b in itertools.pairwise(bounds):
        kg, start = int(kgs[a]), int(starts[a])
        ns = ns_of(start) + epoch
        entries.append((kg, b"", ns, ([k[a:b] for k in key_lists],
                                      [c[a:b] for c in acc_lists])))
        timers.append((kg, start + delay, b"", ns))
    backend.put_many(WINDOW_KEYS, entries)
    backend.add_timers(cfg.domain, timers)


def _count_windows(cfg: KeyedConfig, backend: Any, rows: list[dict[str, Any]],
                   out: Emitter) -> None:
    """A window per key of `count` records in event-time (then arrival) order; one partial
    per record arrives here. A partial window at the end of input is not emitted (as in
    Flink's count windows)."""
    accs = accumulators_of(cfg)
    limit = cfg.count or 1
    rows = sorted(rows, key=lambda r: (r[KEY_GROUP], key_to_bytes([r[k] for k in cfg.keys]),
                                       r[EVENT_TIME_MS], r[SEQUENCE]))
    by_key: dict[tuple[int, bytes], list[dict[str, Any]]] = {}
    for row in rows:
        cell = (row[KEY_GROUP], key_to_bytes([row[k] for k in cfg.keys]))
        by_key.setdefault(cell, []).append(row)
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
            state = merge_accumulators(accs, state, lift_row(accs, row))
            first = row[EVENT_TIME_MS] if first is None else first
            last = row[EVENT_TIME_MS]
            n += 1
            if n == limit:
                out.window(key, first, last, final_values(accs, state))
                n, first, last, state = 0, None, None, None
        if n:
            puts.append((kg, kb, NS_ROLLING, (key, None, None, (n, first, last, state))))
        else:
            deletes.append((kg, kb, NS_ROLLING))
    if puts:
        backend.put_many("acc", puts)
    if deletes:
        backend.delete_many("acc", deletes)
