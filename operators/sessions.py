"""Session windows, a column at a time (`operators.keyed.run_task` hands it its epochs).

**Semantics** (docs/guide/pipeline-file.md, `window: {session: {gap: d}}`): a key's records less
than or exactly `gap` apart share a session [first record, last record + gap); two sessions that
touch or overlap merge, as in Spark's `session_window` and Flink's merging windows. A session
fires (is emitted and forgotten) once the watermark (or, in processing time, the clock) reaches
its end - 1 + allowed lateness; with `emit: updates` every session an epoch changes is emitted
too. The epoch's input are its partial sessions per key, with their partial aggregates (Spark's
`session_window` aggregation, or `operators.direct` where the subtasks read their input); due
sessions fire before the epoch's partials are merged in.

**State layout.** Per key group one chunk in the value state `session.open` under
(key group, b"", b""): an Arrow table of the key group's open sessions (the key columns,
`__start`, `__end` and the partial aggregate columns `__p<i>`), one LZ4-compressed Arrow IPC
stream; and one timer per key group (empty key and namespace) at its earliest session's
firing time. An epoch loads the chunks of the key groups it has records for and of those
whose timer is due, fires what is due, merges the rest with the epoch's partials (sorted by
key and start: a session begins where it starts after every earlier session of its key
ended), and writes each loaded key group's chunk and timer again. Merging partial
aggregates is a grouped Arrow aggregation (count, sum, min, max, avg), a sort (first, last)
or a concatenation of lists (collect_list, count_distinct).

Why (bench/matrix.py, `parquet·-·session·parquet`): the layout before this one kept a list
of sessions per key in an "acc" entry and a timer per session, merged in Python session by
session; py-spy put two thirds of the subtasks' time there. The work per epoch is now
proportional to the open sessions of the key groups the epoch touches, in Arrow, rather than
to its sessions in Python; open sessions are the keys active within a gap (plus lateness and
out-of-orderness) of the watermark.

State written that way is moved into chunks the first time a subtask finds one of its
per-session timers (`_migrate`), so earlier checkpoints and savepoints restore.
"""

from __future__ import annotations

import json
from typing import Any

from streamer.columns import EVENT_TIME, KEY_GROUP, WINDOW_END, WINDOW_START, partial
from streamer.operators.keyed_rows import (
    accumulators_of,
    encode_chunk,
    flagged,
    key_codes_only,
    key_group_runs,
    normal_key_column,
)
from streamer.state.names import CHUNK_KEYS, SESSION_CHUNKS

_TOUCHED = "__touched"  # (in memory: the session got records this epoch)
_ALL_TIMERS = 2**62
#: The canonical field names of a first/last/collect_list partial's (time, arrival, value).
_FIELDS = ("ts", "seq", "value")


def run_sessions(cfg: Any, backend: Any, table: Any, out: Any) -> None:
    """One epoch of a session window for one subtask: `table` (the epoch's partial sessions:
    `__kg`, the keys, `__start`, `__end`, `__p<i>`; may be empty) merged into the open
    sessions, the due ones fired into `out`."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from streamer.state import StateDescriptor, StateKind

    backend.declare(StateDescriptor(SESSION_CHUNKS, StateKind.VALUE))
    accs = accumulators_of(cfg)
    keys = list(cfg.keys)
    columns = [*keys, WINDOW_START, WINDOW_END, *_partial_names(accs)]
    timers = backend.due_timers(cfg.domain, _ALL_TIMERS)  # one per key group: few
    loaded: list[Any] = []
    migrated = None
    if any(t.key for t in timers):  # per-session timers: the layout before chunks
        migrated = _migrate(cfg, backend, accs, timers)
        timers = [t for t in timers if not t.key]
    new = _canonical(cfg, accs, table, columns) if table.num_rows else None
    wanted = {t.key_group for t in timers if t.time_ms <= cfg.fire_up_to}
    if new is not None:
        wanted |= set(np.unique(new.column(KEY_GROUP).to_numpy()).tolist())
    if migrated is not None:
        wanted |= set(migrated.column(KEY_GROUP).to_pylist())
    groups = sorted(wanted)
    found = [(kg, value) for kg, value in zip(
        groups, backend.get_many(SESSION_CHUNKS, [(kg, b"", b"") for kg in groups]),
        strict=True) if value is not None]
    if found:
        loaded.append(_decoded(found))
    if migrated is not None:
        loaded.append(migrated)
    backend.delete_timers(cfg.domain, [(t.key_group, t.time_ms, t.key, t.namespace)
                                       for t in timers if t.key_group in wanted])
    delay = cfg.lateness_ms - 1
    stored = (flagged(pa.concat_tables(loaded, promote_options="permissive"), _TOUCHED,
                      False) if loaded else None)
    if stored is not None and stored.num_rows:
        due = pc.less_equal(pc.add(stored.column(WINDOW_END), delay), cfg.fire_up_to)
        _emit(cfg, accs, stored.filter(due), out)
        stored = stored.filter(pc.invert(due))
    touched = flagged(new, _TOUCHED, True) if new is not None else None
    parts = [p for p in (stored, touched) if p is not None and p.num_rows]
    sessions = _merged(accs, keys, pa.concat_tables(parts, promote_options="permissive")
                       ) if parts else None
    if sessions is not None and cfg.emit == "updates":
        _emit(cfg, accs, sessions.filter(sessions.column(_TOUCHED)), out)
    entries, timers_out = [], []
    written: set[int] = set()
    if sessions is not None:
        rows, runs = key_group_runs(sessions)
        ends = rows.column(WINDOW_END).to_numpy()
        chunk = rows.select(columns).replace_schema_metadata(
            {CHUNK_KEYS: json.dumps(keys).encode()})
        for kg, a, b in runs:
            entries.append((kg, b"", b"", encode_chunk(chunk.slice(a, b - a))))
            timers_out.append((kg, int(ends[a:b].min()) + delay, b"", b""))
            written.add(kg)
        backend.put_many(SESSION_CHUNKS, entries)
        backend.add_timers(cfg.domain, timers_out)
    gone = [(kg, b"", b"") for kg in groups if kg not in written]
    if gone:
        backend.delete_many(SESSION_CHUNKS, gone)


def _partial_names(accs: list[tuple[Any, int]]) -> list[str]:
    return [partial(i) for i in range(sum(n for _, n in accs))]


def _decoded(found: list[tuple[int, bytes]]) -> Any:
    """Stored chunks [(key group, chunk)] as one table of rows with their key group."""
    import numpy as np
    import pyarrow as pa

    tables = [pa.ipc.open_stream(value).read_all() for _, value in found]
    rows = pa.concat_tables(tables, promote_options="permissive").replace_schema_metadata(None)
    kgs = np.repeat(np.array([kg for kg, _ in found], np.int32), [t.num_rows for t in tables])
    return rows.append_column(KEY_GROUP, pa.array(kgs))


def _canonical(cfg: Any, accs: list[tuple[Any, int]], table: Any, columns: list[str]) -> Any:
    """The epoch's partial sessions as chunk rows: keys with -0.0 as 0.0, times as int64,
    the (time, arrival, value) structs of first/last/collect_list partials with the field
    names `_FIELDS` (Spark names them after their expressions), lists as Arrow names them,
    and `__kg`."""
    import pyarrow as pa

    out: dict[str, Any] = {}
    for name in cfg.keys:
        out[name] = normal_key_column(table.column(name))
    out[WINDOW_START] = table.column(WINDOW_START).cast(pa.int64())
    out[WINDOW_END] = table.column(WINDOW_END).cast(pa.int64())
    i = 0
    for acc, n in accs:
        for j in range(n):
            column = table.column(partial(i + j))
            if acc.spec.function in ("first", "last", "collect_list", "count_distinct"):
                column = _renamed(column.combine_chunks())
            out[partial(i + j)] = column
        i += n
    out[KEY_GROUP] = table.column(KEY_GROUP).cast(pa.int32())
    return pa.table(out).select([*columns, KEY_GROUP])


def _renamed(array: Any) -> Any:
    """A struct array with its fields named `_FIELDS`; a list array with its item field
    named as Arrow names it (Spark: "element"), its structs renamed."""
    import pyarrow as pa

    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        values = array.values
        if pa.types.is_struct(values.type):
            values = _renamed(values)
        mask = array.is_null() if array.null_count else None
        return type(array).from_arrays(array.offsets, values, mask=mask)
    fields = [array.field(i) for i in range(array.type.num_fields)]
    mask = array.is_null() if array.null_count else None
    return pa.StructArray.from_arrays(fields, names=list(_FIELDS), mask=mask)


def _merged(accs: list[tuple[Any, int]], keys: list[str], rows: Any) -> Any:
    """`rows` (sessions of any number of keys, with `_TOUCHED`) with the sessions that touch
    or overlap merged: one row per session, its partials merged, touched if any part was."""
    import numpy as np
    import pyarrow as pa

    code = key_codes_only(rows, tuple(keys))
    start = rows.column(WINDOW_START).to_numpy()
    end = rows.column(WINDOW_END).to_numpy()
    order = np.lexsort((end, start, code))
    code, start, end = code[order], start[order], end[order]
    rows = rows.take(pa.array(order))
    latest = _running_max(code, end)
    head = np.ones(len(code), dtype=bool)
    head[1:] = (code[1:] != code[:-1]) | (start[1:] > latest[:-1])
    if head.all():
        return rows
    first = np.flatnonzero(head)
    group = np.cumsum(head) - 1
    out: dict[str, Any] = {name: rows.column(name).take(pa.array(first))
                           for name in [*keys, KEY_GROUP, WINDOW_START]}
    out[WINDOW_END] = pa.array(np.maximum.reduceat(end, first), pa.int64())
    touched = rows.column(_TOUCHED).to_numpy(zero_copy_only=False)
    out[_TOUCHED] = pa.array(np.logical_or.reduceat(touched, first))
    # Sessions of one part keep their partials; the others are merged, then all are put
    # back in session order.
    sizes = np.diff(np.r_[first, len(code)])
    several = sizes > 1
    parts = np.flatnonzero(several[group])
    merged = _merged_partials(accs, rows.take(pa.array(parts)),
                              np.cumsum(several)[group[parts]] - 1, int(several.sum()))
    alone = first[~several]
    place = np.argsort(np.r_[np.flatnonzero(~several), np.flatnonzero(several)], kind="stable")
    for name, column in merged.items():
        dtype = rows.schema.field(name).type  # (Arrow's sum may widen a decimal)
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        both = pa.chunked_array([rows.column(name).take(pa.array(alone)).combine_chunks(),
                                 column.cast(dtype)])
        out[name] = both.take(pa.array(place))
    return pa.table(out)


def _running_max(code: Any, end: Any) -> Any:
    """Per row (sorted by key code) the latest end of its key's rows so far: a cumulative
    max restarting at each key, as one max over (key, end) encoded in an int64 (key codes
    ascend), ends offset from their minimum or, where that does not fit, ranked."""
    import numpy as np

    if not len(end):
        return end
    low = int(end.min())
    span = int(end.max()) - low + 1
    if (int(code[-1]) + 1) * span < 2**62:
        return np.maximum.accumulate(code * span + (end - low)) - code * span + low
    ranks, rank = np.unique(end, return_inverse=True)
    running = np.maximum.accumulate(code * len(ranks) + rank)
    return ranks[running - code * len(ranks)]


def _merged_partials(accs: list[tuple[Any, int]], rows: Any, group: Any, m: int
                     ) -> dict[str, Any]:
    """The partial columns of `rows` merged per `group` (ascending, 0..m-1)."""
    import numpy as np
    import pyarrow as pa

    out: dict[str, Any] = {}
    summed: list[tuple[str, str]] = []
    i = 0
    for acc, n in accs:
        fn = acc.spec.function
        names = [partial(i + j) for j in range(n)]
        i += n
        if fn in ("count", "sum", "avg"):
            summed += [(name, "sum") for name in names]
        elif fn in ("min", "max"):
            summed.append((names[0], fn))
        elif fn in ("first", "last"):
            out[names[0]] = _by_order(rows.column(names[0]).combine_chunks(), group, m,
                                      fn == "last")
        else:  # collect_list, count_distinct
            out[names[0]] = _concatenated(rows.column(names[0]).combine_chunks(), group, m,
                                          distinct=fn == "count_distinct")
    if summed:
        from streamer.operators.aggregates import check_int_sums

        columns = {"__g": pa.array(group), **{name: rows.column(name) for name, _ in summed}}
        # Integer sums again in floating point: a sum that could have wrapped shows.
        checked = [name for name, fn in summed
                   if fn == "sum" and pa.types.is_integer(columns[name].type)]
        approx = {f"{name}_f": columns[name].cast(pa.float64(), safe=False) for name in checked}
        result = pa.table({**columns, **approx}).group_by("__g", use_threads=False).aggregate(
            [*summed, *[(f, "sum") for f in approx]])
        result = result.take(pa.array(np.argsort(result.column("__g").to_numpy())))
        for name, fn in summed:
            out[name] = result.column(f"{name}_{fn}")
        for name in checked:
            check_int_sums(columns, ["__g"], name, result.column(f"{name}_f_sum"),
                           "a session's sum")
    return out


def _by_order(structs: Any, group: Any, m: int, last: bool) -> Any:
    """Per group the (time, arrival, value) struct with the least (first) or greatest
    (last) (time, arrival), nulls never chosen over a value."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    valid = structs.is_valid().to_numpy(zero_copy_only=False)
    ts = pc.fill_null(structs.field(0), 0).to_numpy()
    seq = pc.fill_null(structs.field(1), 0).to_numpy()
    if last:  # the greatest valid one sorts last in its group
        order = np.lexsort((seq, ts, valid, group))
        pick = np.flatnonzero(np.r_[group[order][1:] != group[order][:-1], True])
    else:  # the least valid one sorts first
        order = np.lexsort((seq, ts, ~valid, group))
        pick = np.flatnonzero(np.r_[True, group[order][1:] != group[order][:-1]])
    assert len(pick) == m
    return structs.take(pa.array(order[pick]))


def _concatenated(lists: Any, group: Any, m: int, distinct: bool) -> Any:
    """Per group the concatenation of its lists in row order (null lists as empty), each
    value once with `distinct` (a set's members: nulls dropped, -0.0 as 0.0)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    values = pc.list_flatten(lists)
    owner = group[pc.list_parent_indices(lists).to_numpy()]
    if distinct:
        pairs = pa.table({"__g": pa.array(owner), "v": normal_key_column(values)})
        pairs = pairs.filter(pc.is_valid(pairs.column("v")))
        pairs = pairs.group_by(["__g", "v"], use_threads=False).aggregate([])
        owner, values = pairs.column("__g").to_numpy(), pairs.column("v").combine_chunks()
    order = np.argsort(owner, kind="stable")
    offsets = np.zeros(m + 1, dtype=np.int32)
    np.cumsum(np.bincount(owner, minlength=m), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), values.take(pa.array(order)))


def _emit(cfg: Any, accs: list[tuple[Any, int]], sessions: Any, out: Any) -> None:
    """Emit `sessions` (chunk rows) as window results: keys, window bounds, final values."""
    import pyarrow as pa

    if not sessions.num_rows:
        return
    start = sessions.column(WINDOW_START).to_numpy() * 1000  # (microseconds)
    end = sessions.column(WINDOW_END).to_numpy() * 1000
    columns: dict[str, Any] = {k: sessions.column(k) for k in cfg.keys}
    columns["window_start"] = pa.array(start)
    columns["window_end"] = pa.array(end)
    columns[EVENT_TIME] = pa.array(end - 1000)
    i = 0
    for acc, n in accs:
        columns[acc.spec.name] = _final(acc, [sessions.column(partial(i + j))
                                              for j in range(n)])
        i += n
    out.table(pa.table(columns))


def _final(acc: Any, parts: list[Any]) -> Any:
    """An aggregate's final values from its partial columns."""
    import pyarrow as pa
    import pyarrow.compute as pc

    fn = acc.spec.function
    if fn == "count":
        return pc.fill_null(parts[0], 0)
    if fn in ("sum", "min", "max"):
        return parts[0]
    if fn == "avg":
        total, count = parts[0].cast(pa.float64()), parts[1]
        return pc.if_else(pc.greater(count, 0), pc.divide(total, count.cast(pa.float64())),
                          pa.scalar(None, pa.float64()))
    if fn in ("first", "last"):
        return pc.struct_field(parts[0], [2])
    if fn == "count_distinct":
        return pc.fill_null(pc.list_value_length(parts[0]), 0)
    # collect_list: the values by (time, arrival), per session in Python (lists are small)
    return pa.array([acc.final(acc.lift([value])) for value in parts[0].to_pylist()])


def _migrate(cfg: Any, backend: Any, accs: list[tuple[Any, int]], timers: list[Any]) -> Any:
    """The sessions an earlier version kept per key ("acc" under `NS_ROLLING`: the key and
    a list of (start, end, accumulators)) and timed per session, as chunk rows with their
    key group; those entries and timers deleted."""
    import pyarrow as pa

    from streamer.operators.keyed_rows import NS_ROLLING

    old = sorted({(t.key_group, t.key) for t in timers if t.key})
    backend.delete_timers(cfg.domain, [(t.key_group, t.time_ms, t.key, t.namespace)
                                       for t in timers if t.key])
    addresses = [(kg, kb, NS_ROLLING) for kg, kb in old]
    found: list[tuple[int, tuple[Any, ...], int, int, list[Any]]] = []
    for (kg, _), value in zip(old, backend.get_many("acc", addresses), strict=True):
        for start, end, state in (value[3] if value else ()):
            found.append((kg, tuple(value[0]), start, end, state))
    backend.delete_many("acc", addresses)
    types = {f.name: f.type for f in cfg.out_schema}
    columns: dict[str, Any] = {}
    for i, k in enumerate(cfg.keys):
        columns[k] = normal_key_column(pa.array([s[1][i] for s in found], types.get(k)))
    columns[WINDOW_START] = pa.array([s[2] for s in found], pa.int64())
    columns[WINDOW_END] = pa.array([s[3] for s in found], pa.int64())
    i = 0
    for a, (acc, n) in enumerate(accs):
        parts = [_unlift(acc.spec.function, s[4][a]) for s in found]
        out_type = types.get(acc.spec.name)
        for j in range(n):
            columns[partial(i + j)] = pa.array([p[j] for p in parts],
                                               _partial_type(acc.spec.function, j, out_type))
        i += n
    columns[KEY_GROUP] = pa.array([s[0] for s in found], pa.int32())
    return pa.table(columns)


def _unlift(function: str, value: Any) -> list[Any]:
    """A Python accumulator (`operators.aggregates`) as the partial's components."""
    if function == "avg":
        return [value[0], value[1]] if value else [None, 0]
    if function in ("first", "last"):
        return [None if value is None else dict(zip(_FIELDS, value, strict=True))]
    if function == "collect_list":
        return [[dict(zip(_FIELDS, t, strict=True)) for t in value or ()]]
    if function == "count_distinct":
        return [list(value or ())]
    return [value]


def _partial_type(function: str, j: int, out_type: Any) -> Any:
    """The Arrow type of a partial's component `j`, given the aggregate's output type (None:
    inferred from the values)."""
    import pyarrow as pa

    if function == "count" or (function == "avg" and j == 1):
        return pa.int64()
    if function == "avg":
        return pa.float64()
    if function in ("sum", "min", "max"):
        return out_type
    if function in ("first", "last") and out_type is not None:
        return pa.struct([("ts", pa.int64()), ("seq", pa.int64()), ("value", out_type)])
    if function == "collect_list" and out_type is not None:
        return pa.list_(pa.struct([("ts", pa.int64()), ("seq", pa.int64()),
                                   ("value", out_type.value_type)]))
    return None
