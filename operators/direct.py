"""A keyed stage that reads its own input: the task side of `runtime.plan.keyed_plan.DirectRead`.

When a keyed operator reads a parquet `files` source directly (nothing in between, and the
shapes listed in `runtime/plan/keyed_plan.py`), Spark does not scan, pre-aggregate and shuffle the
records. Each subtask's task reads the epoch's files with pyarrow, computes every row's key
group with Spark's own hash (`state.keygroups`: integer-like keys a column at a time, others
once per distinct key, cached), keeps its own key groups, drops late records, assigns windows
and pre-aggregates by (key, window) in Arrow; for a dedupe it hands on its rows as they are
(`__kg`, the record's columns, `__ts_ms`). A local epoch's input (`runtime.plan.local`) takes the
same path: the driver collects its few rows without a job and hands them to every task in
place of files. What it hands to the
keyed operator is exactly what the Spark plan of `KeyedStage._prepare` would have
delivered: `__kg`, the keys, `__start`, `__p<i>`, so both paths share state, checkpoints
and savepoints, and an epoch may take either.

Every subtask reads all of the epoch's rows (and keeps its share), so it also reports the
epoch's record count and maximum event time, which the driver uses for metrics and the
watermark in place of the source scan's observation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamer.columns import (
    EPOCH_SEQ,
    EVENT_TIME,
    EVENT_TIME_MS,
    JOIN_SIDE,
    KEY_GROUP,
    SEQUENCE,
    WINDOW_END,
    WINDOW_START,
    partial,
)
from streamer.operators.contract import EVERY_RECORD, WHOLE_RECORDS
from streamer.operators.keyed_rows import key_codes, key_codes_only
from streamer.operators.kinds import kind_of
from streamer.spark_errors import UNREADABLE_FILE

#: Per worker process: (key types, max_parallelism) -> key -> key group.
_KEY_GROUPS: dict[tuple[tuple[str, ...], int], dict[Any, int]] = {}
_KEY_GROUP_CACHE_LIMIT = 2_000_000


@dataclass(frozen=True)
class DirectRead:
    """One epoch's input of a keyed stage that reads it itself (plain picklable data)."""

    #: Local parquet files, in the source's order.
    files: tuple[str, ...]
    #: Column name wanted -> Arrow type to cast to (keys, aggregate arguments, event time).
    columns: tuple[tuple[str, Any], ...]
    #: Spark type names of the key columns (`state.keygroups.PYTHON_HASHED_TYPES`).
    key_types: tuple[str, ...]
    #: The event-time column (a timestamp), or None for processing time.
    ts_column: str | None
    #: The watermark at the epoch's start: what decides lateness.
    watermark: int
    #: A local epoch's rows instead of files (an Arrow IPC stream, collected on the driver:
    #: `runtime.plan.local`), or None.
    table: bytes | None = None
    #: A join reading both its sources' files: each side's files and column mapping (its
    #: rows are the stage's input columns, `columns`, with `__ts` and `__join_side`).
    sides: tuple[JoinSide, ...] = ()


@dataclass(frozen=True)
class JoinSide:
    """One input of a join whose subtasks read both sources' parquet files themselves: the
    stage's input columns of its records (the keys under the left's names, the left's other
    columns, the right's with `right_prefix`), as `runtime.plan.join_plan.project_sides` projects
    them in Spark."""

    #: Local parquet files of the epoch, in the source's order.
    files: tuple[str, ...]
    #: Per column of `DirectRead.columns`: the source's column it is read from, or None (a
    #: column of the other side, `__ts` and `__join_side`: filled in here).
    sources: tuple[str | None, ...]
    #: The source's event-time column (a timestamp), or None (processing time).
    ts_column: str | None


def ipc_bytes(data: Any) -> bytes:
    """An Arrow table or record batch as one IPC stream."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write(data)
    return bytes(sink.getvalue().to_pybytes())


def _read(d: DirectRead) -> Any:
    """The wanted columns of every file, cast to their types (names matched without case,
    as Spark does)."""
    import pyarrow as pa

    schema = pa.schema([pa.field(name, dtype) for name, dtype in d.columns])
    if d.table is not None:
        table = pa.ipc.open_stream(d.table).read_all()
        return table.select([name for name, _ in d.columns]).cast(schema)
    if d.sides:
        return pa.concat_tables([_read_side(d, i, side, schema)
                                 for i, side in enumerate(d.sides)])
    tables = [_read_file(path, d.columns, schema) for path in d.files]
    if not tables:
        return schema.empty_table()
    return pa.concat_tables(tables)


def _read_file(path: str, columns: Any, schema: Any) -> Any:
    """`columns` ((name, Arrow type) pairs) of the local parquet file `path` as `schema`
    (names matched without case, as Spark does)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    found = pq.ParquetFile(path).schema_arrow.names
    by_lower = {n.lower(): n for n in found}
    names = [by_lower[name.lower()] for name, _ in columns]
    try:
        table = pq.read_table(path, columns=names)
    except (OSError, pa.ArrowException) as exc:  # a damaged page: name the file
        reason = " ".join(str(exc).split())
        msg = f"{UNREADABLE_FILE}{path!r}: {type(exc).__name__}: {reason}"
        raise OSError(msg) from exc
    return table.rename_columns([n for n, _ in columns]).cast(schema)


def _read_side(d: DirectRead, index: int, side: JoinSide, schema: Any) -> Any:
    """Join side `index`'s records of the epoch as the stage's input columns (`schema`):
    its own columns read, the other side's null, `__ts` its event time, `__join_side`
    `index`."""
    import numpy as np
    import pyarrow as pa

    types = dict(d.columns)
    wanted = {source: types[name] for (name, _), source in zip(d.columns, side.sources,
                                                                strict=True) if source}
    if side.ts_column is not None:
        wanted[side.ts_column] = pa.timestamp("us", tz="UTC")
    own = pa.schema([pa.field(name, dtype) for name, dtype in wanted.items()])
    parts = [_read_file(path, tuple(wanted.items()), own) for path in side.files]
    read = pa.concat_tables(parts) if parts else own.empty_table()
    n = read.num_rows
    columns = []
    for (name, dtype), source in zip(d.columns, side.sources, strict=True):
        if source is not None:
            columns.append(read.column(source).cast(dtype))
        elif name == EVENT_TIME and side.ts_column is not None:
            columns.append(read.column(side.ts_column).cast(dtype))
        elif name == JOIN_SIDE:
            columns.append(pa.array(np.full(n, index, dtype=np.int32)).cast(dtype))
        else:
            columns.append(pa.nulls(n, dtype))
    return pa.Table.from_arrays(columns, schema=schema)


def _row_key_groups(table: Any, keys: tuple[str, ...], key_types: tuple[str, ...],
                    max_parallelism: int) -> tuple[Any, Any]:
    """(the key group of every row of `table`, its distinct key's code from `key_codes` or
    None): integer keys hashed a column at a time (no codes), others once per distinct key
    (cached per worker)."""
    from streamer.state.keygroups import INTEGER_HASHED_TYPES, key_groups_of_columns

    if keys and all(t in INTEGER_HASHED_TYPES for t in key_types):
        return key_groups_of_columns([table.column(k) for k in keys], key_types,
                                     max_parallelism), None
    code, distinct = key_codes(table, keys)
    return _key_groups(distinct, key_types, max_parallelism)[code], code


def _session_rows(cfg: Any, d: DirectRead, table: Any, keep: Any, valid: Any, ts_ms: Any,
                  info: dict[str, Any], codes: Any) -> tuple[Any, Any, Any]:
    """(rows, their session's start, their own time + gap) of a session window's kept rows:
    the epoch's partial sessions, as Spark's `session_window` aggregation gives them. Rows
    of a key sorted by time; a session breaks where the next record comes more than `gap`
    after the one before (records exactly `gap` apart touch, so they share a session, as
    `operators.sessions` merges them). Late records (their session would end
    at or before the watermark) are dropped and counted. `codes`: every row's key code, if
    the key groups needed them (else they are computed here, of the kept rows)."""
    import numpy as np
    import pyarrow as pa

    gap = cfg.gap_ms or 0
    if cfg.domain == "event":
        in_time = ts_ms + (gap - 1 + cfg.lateness_ms) > d.watermark
        info["late"] = int(np.count_nonzero(valid & ~in_time))  # all rows: every subtask's
        keep = keep & in_time
    rows = np.flatnonzero(keep)
    code = codes[rows] if codes is not None else key_codes_only(
        table.take(pa.array(rows, pa.int64())), cfg.keys)
    times = ts_ms[rows]
    order = np.lexsort((times, code))
    rows, code, times = rows[order], code[order], times[order]
    head = np.ones(len(rows), dtype=bool)
    head[1:] = (code[1:] != code[:-1]) | (times[1:] - times[:-1] > gap)
    session = np.cumsum(head) - 1
    return rows, times[head][session], times + gap


def _records(cfg: Any, d: DirectRead, table: Any, rows: Any, kg: Any, ts_ms: Any) -> Any:
    """A dedupe's (and, with `__seq` added, a join's) input: the `rows` of `table` (this
    subtask's, in arrival order) with their key group, the record's columns (its event time
    as `__ts`) and `__ts_ms`."""
    import pyarrow as pa

    picked = table.take(pa.array(rows, pa.int64()))
    columns: dict[str, Any] = {KEY_GROUP: pa.array(kg[rows], pa.int32())}
    for name in cfg.record_columns:
        source = d.ts_column if name == EVENT_TIME and d.ts_column else name
        columns[name] = picked.column(source)
    columns[EVENT_TIME_MS] = pa.array(ts_ms[rows], pa.int64())
    return pa.table(columns)


def _side_info(table: Any, valid: Any, ts_ms: Any, sides: int) -> list[dict[str, Any]]:
    """Per join side, its records in the epoch and their newest event time (or None)."""
    import numpy as np

    side = table.column(JOIN_SIDE).to_numpy(zero_copy_only=False)
    out = []
    for i in range(sides):
        mine = side == i
        timed = mine & valid
        out.append({"records_in": int(np.count_nonzero(mine)),
                    "max_ts": int(ts_ms[timed].max()) if timed.any() else None})
    return out


def _key_groups(distinct: list[tuple[Any, ...]], key_types: tuple[str, ...],
                max_parallelism: int) -> Any:
    import numpy as np

    from streamer.state.keygroups import key_group_of

    cache = _KEY_GROUPS.setdefault((key_types, max_parallelism), {})
    if len(cache) > _KEY_GROUP_CACHE_LIMIT:
        cache.clear()
    out = np.empty(len(distinct), dtype=np.int32)
    for i, key in enumerate(distinct):
        kg = cache.get(key)
        if kg is None:
            kg = cache[key] = key_group_of(key, key_types, max_parallelism)
        out[i] = kg
    return out


def read_direct(cfg: Any, d: DirectRead, subtask: int) -> tuple[Any, dict[str, Any]]:
    """The pre-aggregated rows of `subtask` in the epoch (what `operators.keyed_rows.Input`
    wraps) and the epoch's `records_in`, `max_ts` (ms, or None) and, for an event-time
    window, `late` (the late records it dropped, of all rows, so any subtask's is the
    epoch's)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from streamer.operators.aggregates import accumulator, check_int_sums

    table = _read(d)
    n = table.num_rows
    info: dict[str, Any] = {"records_in": n, "max_ts": None}
    if d.ts_column is not None:
        micros = table.column(d.ts_column).cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
        valid = pc.is_valid(micros).to_numpy(zero_copy_only=False)
        ts_ms = micros.fill_null(0).to_numpy() // 1000  # floor, as Spark's unix_millis
        if valid.any():
            info["max_ts"] = int(ts_ms[valid].max())
    else:
        valid = np.ones(n, dtype=bool)
        ts_ms = np.full(n, cfg.now_ms, dtype=np.int64)
    kg, codes = _row_key_groups(table, cfg.keys, d.key_types, cfg.max_parallelism)
    owner = kg.astype(np.int64) * cfg.parallelism // cfg.max_parallelism
    keep = owner == subtask
    event = cfg.domain == "event"
    if d.sides:  # a join reading both sources: each source's records in and newest time
        info["sides"] = _side_info(table, valid, ts_ms, len(d.sides))
    kind = kind_of(cfg.kind)
    if kind.has(WHOLE_RECORDS):
        if event:  # (the source made a row without event time a dead letter)
            keep &= valid
        if not kind.has(EVERY_RECORD):  # (dedupe: each key's first record)
            return _records(cfg, d, table, np.flatnonzero(keep), kg, ts_ms), info
        from streamer.operators.join import late_mask

        late = late_mask(cfg.join, ts_ms, d.watermark) if event else None
        if late is not None:  # dropped and counted (a join with `late:` is routed)
            info["late"] = int(np.count_nonzero(valid & late))  # all rows: every subtask's
            keep &= ~late
        rows = np.flatnonzero(keep)
        records = _records(cfg, d, table, rows, kg, ts_ms)
        return records.append_column(SEQUENCE, pa.array(cfg.epoch * EPOCH_SEQ + rows)), info
    ends = None
    if cfg.kind == "window" and cfg.window_kind == "session":
        rows, starts, ends = _session_rows(cfg, d, table, keep & valid if event else keep,
                                           valid, ts_ms, info, codes)
    elif cfg.kind == "window":
        if event:  # a row without event time has no window (the Spark plan drops it too)
            keep &= valid
        size, slide = cfg.size_ms or 0, cfg.slide_ms or cfg.size_ms or 0
        last = ts_ms - np.mod(ts_ms, slide)
        if event:
            in_time = last + (size - 1 + cfg.lateness_ms) > d.watermark
            info["late"] = int(np.count_nonzero(valid & ~in_time))  # all rows: every subtask's
            keep &= in_time
        rows = np.flatnonzero(keep)
        back = ((size - 1) // slide) * slide
        copies = back // slide + 1
        if copies > 1:
            rows = np.repeat(rows, copies)
            starts = last[rows] - np.tile(np.arange(copies - 1, -1, -1, dtype=np.int64) * slide,
                                          len(rows) // copies)
            fits = starts + size > ts_ms[rows]
            if event:
                fits &= starts + (size - 1 + cfg.lateness_ms) > d.watermark
            rows, starts = rows[fits], starts[fits]
        else:
            starts = last[rows]
    else:
        rows = np.flatnonzero(keep)
        starts = np.zeros(len(rows), dtype=np.int64)
    picked = table.take(pa.array(rows, pa.int64()))
    columns: dict[str, Any] = {KEY_GROUP: pa.array(kg[rows], pa.int32())}
    for name in cfg.keys:
        columns[name] = picked.column(name)
    columns[WINDOW_START] = pa.array(starts, pa.int64())
    aggregations: list[tuple[Any, ...]] = []
    if ends is not None:  # a session's end: its last record's time + gap
        columns[WINDOW_END] = pa.array(ends, pa.int64())
        aggregations.append((WINDOW_END, "max"))
    j = 0
    for spec in cfg.aggregates:
        if spec.filter is not None:  # (the planner reads these with Spark: `direct_shape`)
            msg = f"direct read of {cfg.uid!r}: aggregate {spec.name!r} has a filter"
            raise RuntimeError(msg)
        for fn, arg in partial_functions(spec.function, spec.arg):
            name = f"__in{j}"
            if arg is None:
                columns[name] = columns[KEY_GROUP]
                aggregations.append((name, "count", pc.CountOptions(mode="all")))
            else:
                values = picked.column(arg)
                if fn == "sum" and (spec.function == "avg" or pa.types.is_floating(values.type)):
                    values = values.cast(pa.float64(), safe=False)  # as Spark: double sums
                aggregations.append((name, fn))
                columns[name] = values
            j += 1
    if j != sum(len(accumulator(a, "0", "0").sql) for a in cfg.aggregates):
        msg = f"direct read of {cfg.uid!r}: partials do not match the accumulators"
        raise RuntimeError(msg)
    # Integer sums again in floating point: a sum that could have wrapped past 64 bits shows.
    checked = [a[0] for a in aggregations
               if a[1] == "sum" and pa.types.is_integer(columns[a[0]].type)]
    for name in checked:
        columns[f"{name}_f"] = columns[name].cast(pa.float64(), safe=False)
    group = [KEY_GROUP, *cfg.keys, WINDOW_START]
    result = pa.table(columns).group_by(group, use_threads=False).aggregate(
        [*aggregations, *[(f"{name}_f", "sum") for name in checked]])
    for name in checked:
        check_int_sums(columns, group, name, result.column(f"{name}_f_sum"),
                       f"a sum in operator {cfg.uid!r}")
    out = {KEY_GROUP: result.column(KEY_GROUP)}
    for name in cfg.keys:
        out[name] = result.column(name)
    out[WINDOW_START] = result.column(WINDOW_START)
    if ends is not None:
        out[WINDOW_END] = result.column(f"{WINDOW_END}_max")
        aggregations = aggregations[1:]
    for i, agg in enumerate(aggregations):
        out[partial(i)] = result.column(f"{agg[0]}_{agg[1]}")
    return pa.table(out), info


#: Aggregate functions whose partials Arrow computes: function -> [(Arrow function, argument
#: or None for count of rows)], in the order of `operators.aggregates.accumulator`'s SQL.
DIRECT_AGGREGATES = ("count", "sum", "min", "max", "avg")


def partial_functions(function: str, arg: str | None) -> list[tuple[str, str | None]]:
    """The partials of an aggregate `function` of `arg`: [(Arrow function, argument)]."""
    if function == "count":
        return [("count", None)]
    if function == "avg":
        return [("sum", arg), ("count", arg)]
    return [(function, arg)]
