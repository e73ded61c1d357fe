"""The interval join, a column at a time (`operators.join.run_join` hands it its epochs).

**State layout.** A side's buffered records live in chunks: Arrow tables (the key columns, the
side's own columns, the event time in ms `__ts_ms` and whether the record has matched
`__matched`), stored as one LZ4-compressed Arrow IPC stream each in the value state
`join.chunks` under (key group, b"", namespace). The namespace is the side (1 byte), the epoch
that wrote the chunk, and the chunk's lowest and highest event time (8 bytes each, big-endian),
so a subtask knows what a chunk holds before it decodes it. One event-time timer per chunk, at
the first time one of its records expires, makes the coordinator run an epoch for it when no
data comes. Everything is per key group, so checkpoints, savepoints and rescaling move chunks
as they move any state entry.

**An epoch** (`run_interval`): the chunks that can hold a partner of the epoch's records (by
their time range) or a record that expires now are decoded; every pair with one record new
this epoch and right ts - left ts in [lower, upper] is found by key codes and sorted search, a
column at a time; then what the watermark `W` carried in has passed expires (a left record
once `W >= ts + upper`, a right one once `W >= ts - lower`), emitted with nulls on the other
side when it never matched and its side is outer. Per (key group, side), the records still
buffered of the chunks that changed (a record expired, or an outer side's record matched) and
the epoch's new records become one new chunk; unchanged chunks stay as they are. A (key group,
side) with more than `MAX_CHUNKS` chunks has them merged into one.

The output is the record-by-record join's (docs/joins.md): whichever of two non-late records
comes second finds the first still buffered, so the pairs do not depend on the epoch cuts.

State written by an earlier version (per key, a list of records in `join.left` and
`join.right`, a timer per record) is moved into chunks the first time a subtask runs
(`_migrate`), so its checkpoints and savepoints restore.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from streamer.columns import EVENT_TIME, EVENT_TIME_MS, JOIN_SIDE, KEY_GROUP
from streamer.operators.keyed_rows import (
    encode_chunk,
    filled,
    key_codes_only,
    key_group_runs,
    normal_key_column,
)
from streamer.state.names import CHUNK_KEYS, JOIN_CHUNKS, JOIN_MATCHED

LEFT, RIGHT = 0, 1
#: The per-key record lists of the record-by-record layout, by side: window and table joins
#: keep them; interval joins had them before `CHUNKS` (`_migrate`).
STATES = ("join.left", "join.right")
#: An interval join's buffered records, a chunk per entry (see the module docstring).
CHUNKS = JOIN_CHUNKS
#: A (key group, side) with more chunks than this has them merged into one.
MAX_CHUNKS = 16
MATCHED = JOIN_MATCHED
_NS = struct.Struct(">Bqqq")  # side, epoch, lowest ts, highest ts
_CHUNK = "__chunk"  # (in memory: which decoded chunk a row came from; -1: new this epoch)


def run_interval(cfg: Any, backend: Any, table: Any, out: Any) -> None:
    """One epoch of an interval join for one subtask: the epoch's records (an Arrow table of
    the stage's input columns; may be empty) matched, buffered and expired."""
    import numpy as np

    from streamer.state import StateDescriptor, StateKind

    backend.declare(StateDescriptor(CHUNKS, StateKind.VALUE))
    join, wm = cfg.join, cfg.fire_up_to
    expiry = (join.upper_ms, -join.lower_ms)  # a record of side s expires at ts + expiry[s]
    schemas = [_chunk_schema(cfg, side) for side in (LEFT, RIGHT)]
    keys = cfg.join_columns.keys
    new = [_new_records(table, schemas[side], side, keys) for side in (LEFT, RIGHT)]
    # The event times a partner of the epoch's records has: left ts + [lower, upper] on the
    # right, right ts - [upper, lower] on the left (None: no new record on the other side).
    wanted: list[tuple[int, int] | None] = [None, None]
    for side, other in ((LEFT, RIGHT), (RIGHT, LEFT)):
        if new[other].num_rows:
            ts = new[other].column(EVENT_TIME_MS).to_numpy()
            lo, hi = (join.lower_ms, join.upper_ms) if other == LEFT else (
                -join.upper_ms, -join.lower_ms)
            wanted[side] = (int(ts.min()) + lo, int(ts.max()) + hi)
    loaded: list[list[Any]] = [[], []]  # per side: the decoded chunks' tables
    # Per side and decoded chunk: (kg, ns, timer time, whether it is rewritten regardless:
    # migrated rows, which have no entry (ns b""), or a key group's chunks being merged).
    chunks: list[list[tuple[int, bytes, int, bool]]] = [[], []]
    migrated = _migrate(cfg, backend, schemas)
    for side in (LEFT, RIGHT):
        if migrated[side] is not None:
            loaded[side].append(migrated[side])
            chunks[side].append((-1, b"", 0, True))
    for kg in backend.key_groups:
        listed = [(ns, value) for _, ns, value in backend.iterate(CHUNKS, kg)]
        for side in (LEFT, RIGHT):
            mine = [(ns, v) for ns, v in listed if ns[0] == side]
            merge = len(mine) > MAX_CHUNKS
            for ns, value in mine:
                _, _, lo, hi = _NS.unpack(ns)
                span = wanted[side]
                if merge or lo + expiry[side] <= wm or (
                        span is not None and lo <= span[1] and hi >= span[0]):
                    loaded[side].append(_decode(value, kg, len(chunks[side])))
                    chunks[side].append((kg, ns, lo + expiry[side], merge))
    sides = [_concat(loaded[side], new[side]) for side in (LEFT, RIGHT)]
    if not any(t.num_rows for t in sides):
        return
    ts = [t.column(EVENT_TIME_MS).to_numpy() for t in sides]
    fresh = [t.column(_CHUNK).to_numpy() < 0 for t in sides]
    lidx, ridx = _pairs(cfg, sides, ts, fresh)
    matched = [t.column(MATCHED).to_numpy(zero_copy_only=False).copy() for t in sides]
    was = [m.copy() for m in matched]
    matched[LEFT][lidx] = True
    matched[RIGHT][ridx] = True
    types = {f.name: f.type for f in cfg.out_schema}
    parts = []
    if len(lidx):
        parts.append(_output(cfg, sides, lidx, ridx, np.maximum(ts[LEFT][lidx],
                                                                ts[RIGHT][ridx]), types))
    expired = [ts[side] + expiry[side] <= wm for side in (LEFT, RIGHT)]
    for side, outer in ((LEFT, join.outer_left), (RIGHT, join.outer_right)):
        lonely = np.flatnonzero(expired[side] & ~matched[side])
        if outer and len(lonely):
            lrows, rrows = (lonely, None) if side == LEFT else (None, lonely)
            parts.append(_output(cfg, sides, lrows, rrows, ts[side][lonely], types))
    if parts:
        import pyarrow as pa

        out.table(pa.concat_tables(parts))
    for side, outer in ((LEFT, join.outer_left), (RIGHT, join.outer_right)):
        _store(cfg, backend, sides[side], side, schemas[side], chunks[side], expired[side],
               matched[side], was[side] if outer else matched[side], expiry[side])


def _chunk_schema(cfg: Any, side: int) -> Any:
    """The Arrow schema of side `side`'s chunks: keys, own columns, ts, matched; its
    metadata names the key columns (for `streamer savepoint export`)."""
    import json

    import pyarrow as pa

    cols = cfg.join_columns
    types = {f.name: f.type for f in cfg.out_schema}
    own = cols.left if side == LEFT else cols.right
    return pa.schema([*((n, types[n]) for n in (*cols.keys, *own)),
                      (EVENT_TIME_MS, pa.int64()), (MATCHED, pa.bool_())],
                     metadata={CHUNK_KEYS: json.dumps(list(cols.keys)).encode()})


def _new_records(table: Any, schema: Any, side: int, keys: Sequence[str]) -> Any:
    """The epoch's records of `side` as chunk rows (with `__kg` and `__chunk` -1), floating
    key columns with -0.0 as 0.0 (`keyed_rows.normal_key_column`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not table.num_rows:
        return _empty(schema)
    mine = table.filter(pc.equal(table.column(JOIN_SIDE), side))
    columns = {f.name: mine.column(f.name).cast(f.type) for f in schema if f.name != MATCHED}
    for key in keys:
        columns[key] = normal_key_column(columns[key])
    columns[MATCHED] = filled(mine.num_rows, pa.bool_(), False)
    columns[KEY_GROUP] = mine.column(KEY_GROUP).cast(pa.int32())
    columns[_CHUNK] = filled(mine.num_rows, pa.int32(), -1)
    return pa.table(columns)


def _empty(schema: Any) -> Any:
    import pyarrow as pa

    return schema.append(pa.field(KEY_GROUP, pa.int32())).append(
        pa.field(_CHUNK, pa.int32())).empty_table()


def _decode(value: bytes, kg: int, index: int) -> Any:
    """A stored chunk as rows of the epoch's side table (`__kg` kg, `__chunk` index)."""
    import pyarrow as pa

    table = pa.ipc.open_stream(value).read_all()
    n = table.num_rows
    return table.append_column(KEY_GROUP, filled(n, pa.int32(), kg)).append_column(
        _CHUNK, filled(n, pa.int32(), index))


def _concat(loaded: list[Any], new: Any) -> Any:
    import pyarrow as pa

    if not loaded:
        return new
    return pa.concat_tables([*loaded, new]).combine_chunks()


def _pairs(cfg: Any, sides: list[Any], ts: list[Any], fresh: list[Any]) -> tuple[Any, Any]:
    """(left rows, right rows) of every pair of the same key with right ts - left ts in
    [lower, upper] and at least one record new this epoch (older pairs were emitted when
    the second of them came), sorted by left row then right row."""
    import numpy as np
    import pyarrow as pa

    keys = cfg.join_columns.keys
    n_left = sides[LEFT].num_rows
    both = pa.concat_tables([sides[LEFT].select(list(keys)), sides[RIGHT].select(list(keys))])
    code = key_codes_only(both, keys)
    codes = (code[:n_left], code[n_left:])
    found_l, found_r = [], []
    for lsel, rsel in ((np.flatnonzero(fresh[LEFT]), np.arange(len(codes[RIGHT]))),
                       (np.flatnonzero(~fresh[LEFT]), np.flatnonzero(fresh[RIGHT]))):
        if not len(lsel) or not len(rsel):
            continue
        order = rsel[np.argsort(codes[RIGHT][rsel], kind="stable")]
        sorted_codes = codes[RIGHT][order]
        lo = np.searchsorted(sorted_codes, codes[LEFT][lsel], "left")
        hi = np.searchsorted(sorted_codes, codes[LEFT][lsel], "right")
        count = hi - lo
        total = int(count.sum())
        if not total:
            continue
        left = np.repeat(lsel, count)
        offset = np.arange(total) - np.repeat(np.cumsum(count) - count, count)
        right = order[np.repeat(lo, count) + offset]
        diff = ts[RIGHT][right] - ts[LEFT][left]
        keep = (diff >= cfg.join.lower_ms) & (diff <= cfg.join.upper_ms)
        found_l.append(left[keep])
        found_r.append(right[keep])
    if not found_l:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    left, right = np.concatenate(found_l), np.concatenate(found_r)
    order = np.lexsort((right, left))
    return left[order], right[order]


def _output(cfg: Any, sides: list[Any], lrows: Any, rrows: Any, ts_ms: Any,
            types: dict[str, Any]) -> Any:
    """Output rows: left rows `lrows` with right rows `rrows` (either None: an outer row,
    nulls on that side), event time `ts_ms`."""
    import pyarrow as pa

    cols = cfg.join_columns
    n = len(ts_ms)
    keyed = sides[LEFT] if lrows is not None else sides[RIGHT]
    key_rows = pa.array(lrows if lrows is not None else rrows, pa.int64())
    columns: dict[str, Any] = {k: keyed.column(k).take(key_rows) for k in cols.keys}
    for side, rows, names in ((LEFT, lrows, cols.left), (RIGHT, rrows, cols.right)):
        at = None if rows is None else pa.array(rows, pa.int64())
        for name in names:
            columns[name] = (pa.nulls(n, types[name]) if at is None
                             else sides[side].column(name).take(at))
    columns[EVENT_TIME] = pa.array(ts_ms * 1000, pa.int64()).cast(types[EVENT_TIME])
    return pa.table(columns)


def _store(cfg: Any, backend: Any, rows: Any, side: int, schema: Any,
           chunks: list[tuple[int, bytes, int, bool]], expired: Any, matched: Any, was: Any,
           expiry: int) -> None:
    """Write side `side`'s buffer back (chunks of `schema`): the decoded chunks that changed
    or must be rewritten are replaced, with the epoch's new records, by one chunk per key
    group; the others stay as they are."""
    import numpy as np
    import pyarrow as pa

    chunk = rows.column(_CHUNK).to_numpy()
    if not len(chunk):
        return
    # Per decoded chunk, then the new records (always written; a new record's `__chunk` is
    # -1, which indexes that last place).
    changed = np.array([*(rewrite for _, _, _, rewrite in chunks), True], bool)
    changed[chunk[expired | (matched != was)]] = True
    gone = [(kg, ns, at) for (kg, ns, at, _), flag in zip(chunks, changed[:-1], strict=True)
            if flag and ns]
    if gone:
        backend.delete_many(CHUNKS, [(kg, b"", ns) for kg, ns, _ in gone])
        backend.delete_timers("event", [(kg, at, b"", ns) for kg, ns, at in gone])
    keep = changed[chunk] & ~expired
    if not keep.any():
        return
    kept = rows.filter(pa.array(keep))
    kept = kept.set_column(kept.schema.get_field_index(MATCHED), MATCHED,
                           pa.array(matched[keep]))
    kept, runs = key_group_runs(kept)
    ts = kept.column(EVENT_TIME_MS).to_numpy()
    names = schema.names
    entries, timers = [], []
    for kg, a, b in runs:
        lo, hi = int(ts[a:b].min()), int(ts[a:b].max())
        ns = _NS.pack(side, cfg.epoch, lo, hi)
        chunk = kept.slice(a, b - a).select(names).replace_schema_metadata(schema.metadata)
        entries.append((kg, b"", ns, encode_chunk(chunk)))
        timers.append((kg, lo + expiry, b"", ns))
    backend.put_many(CHUNKS, entries)
    backend.add_timers("event", timers)


def _migrate(cfg: Any, backend: Any, schemas: Sequence[Any]) -> list[Any]:
    """Per side, the records an earlier version buffered per key (`STATES`) as chunk rows
    (`__chunk` = the index the caller gives them), their entries and timers deleted; None
    for a side without any."""
    import pyarrow as pa

    from streamer.state.codec import decode_key

    declared = backend.states()
    found: list[Any] = [None, None]
    if not any(name in declared for name in STATES):
        return found
    cols = cfg.join_columns
    for side, name in enumerate(STATES):
        if name not in declared:
            continue
        own = cols.left if side == LEFT else cols.right
        records: list[tuple[int, tuple[Any, ...], list[Any]]] = []
        addresses: list[tuple[int, bytes, bytes]] = []
        for kg in backend.key_groups:
            for kb, ns, buffered in backend.iterate(name, kg):
                addresses.append((kg, kb, ns))
                key = decode_key(kb)
                records.extend((kg, key, r) for r in buffered or ())
        if not addresses:
            continue
        backend.delete_many(name, addresses)
        columns: dict[str, Any] = {}
        schema = schemas[side]
        for i, k in enumerate(cols.keys):
            columns[k] = pa.array([key[i] for _, key, _ in records], schema.field(k).type)
        for j, n in enumerate(own):
            columns[n] = pa.array([r[2][j] for _, _, r in records], schema.field(n).type)
        columns[EVENT_TIME_MS] = pa.array([r[0] for _, _, r in records], pa.int64())
        columns[MATCHED] = pa.array([bool(r[3]) for _, _, r in records], pa.bool_())
        columns[KEY_GROUP] = pa.array([kg for kg, _, _ in records], pa.int32())
        columns[_CHUNK] = filled(len(records), pa.int32(), 0)  # (the first chunk: see caller)
        found[side] = pa.table(columns)
    if any(t is not None for t in found):
        backend.due_timers("event", 2**62, remove=True)  # (the per-record timers)
    return found
