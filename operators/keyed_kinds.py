"""The state logic of each keyed kind, run by `operators.keyed.run_task` for one subtask and
epoch: time windows (tumbling, sliding), rolling aggregates and count windows (sessions are in
operators/sessions.py, dedupe in operators/dedupe.py). Each merges the epoch's rows into state
and emits into the task's `_Emitter`.
"""

from __future__ import annotations

import itertools
from typing import Any

from streamer.columns import (
    EVENT_TIME_MS,
    INSERT,
    KEY_GROUP,
    RETRACT,
    SEQUENCE,
    UPDATE,
    WINDOW_START,
)
from streamer.operators.keyed_config import KeyedConfig
from streamer.operators.keyed_rows import (
    _I64,
    NS_ROLLING,
    _Emitter,
    _encode_keys,
    _final_columns,
    _finals,
    _Input,
    _key_bytes,
    _lift,
    _lift_columns,
    _lifted,
    _merge,
    _namespaces,
    _partials,
    ns_of,
)
from streamer.state.names import WINDOW_KEYS


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
    if cfg.changelog:  # what each key had, taken back first (Flink's update-before)
        had = [i for i, old in enumerate(stored) if old is not None]
        out.columns([keys[i] for i in had], _final_columns(accs, [stored[i] for i in had]),
                    changes=[RETRACT] * len(had))
    out.columns(keys, _final_columns(accs, merged_all),
                changes=[INSERT if old is None else UPDATE for old in stored])
    backend.put_many("acc", [(*cell, merged)
                             for cell, merged in zip(cells, merged_all, strict=True)])


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
