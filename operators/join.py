"""Joins of two keyed inputs, as one keyed subtask runs them (`operators.keyed.run_task`).

Both sides arrive in one routed batch: the driver (`runtime.plan.join_plan`) projects each side
onto the join's output columns (the key columns, the left's others, the right's others with
`right_prefix`), tags it with `JOIN_SIDE` and unions them, so the keyed stage routes them by key
group like any keyed operator's rows. An interval join runs a column at a time over chunks of
records (`operators.join_interval`); window and table joins, per subtask and epoch (`run_join`):

1. the epoch's records of each key are matched against the other side's buffered records
   and buffered themselves, in the states `join.left` and `join.right`: per (key group, key),
   the list of that side's records `[ts, seq, values, matched, first window]`;
2. with the watermark `W` the epoch carries in, what can no longer get a partner expires (a
   window join's records when their last window has closed, `W >= last window end - 1`, after
   each closed window joined its records); an expired record that never matched is emitted
   with nulls on the other side when its side is outer (left, right, full). One event-time
   timer per (key, expiry) makes the subtask visit the key then.

A table join (`_Table`) keeps the table's row (or, temporal, its versions) per key in
`join.right` and, temporal only, the left records waiting for the watermark in `join.left`.

A record is late when its event time is at or behind the watermark the epoch carries in (a
window join: when all its windows have closed); the driver sends it to `late:` before it gets
here. With that rule every pair of non-late records meets: whichever comes second finds the
first still buffered (see docs/joins.md), so the output does not depend on how the input is cut
into epochs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamer.columns import (
    EVENT_TIME,
    EVENT_TIME_MS,
    HIDDEN_PREFIX,
    JOIN_SIDE,
    KEY_GROUP,
    OUT,
    ROW_KIND,
    ROW_META,
)
from streamer.columns import SEQUENCE as SEQ
from streamer.operators.contract import (
    COLUMNAR,
    EVERY_RECORD,
    LOCAL_EPOCHS,
    WHOLE_RECORDS,
    KeyedKind,
    Logic,
    Planning,
)
from streamer.operators.join_interval import LEFT, RIGHT, STATES, run_interval
from streamer.pipeline.join_names import WINDOW_COLUMNS, name_clashes

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructField, StructType

    from streamer.operators.keyed_config import KeyedConfig
    from streamer.pipeline.spec import JoinSpec, OperatorSpec

#: A table join's right record that deletes its key's row (a changelog's tombstone).
DELETE = 2
_NS = b""


@dataclass(frozen=True)
class JoinColumns:
    """A join's output columns, by where they come from (all names as in the output)."""

    keys: tuple[str, ...]
    left: tuple[str, ...]  # the left's other columns
    right: tuple[str, ...]  # the right's other columns, with right_prefix
    #: The right side's own names of `right` (without the prefix), and of the keys.
    right_sources: tuple[str, ...]
    right_keys: tuple[str, ...]

    def of_side(self, side: int) -> dict[str, str]:
        """Side `side`'s (LEFT or RIGHT) columns of the join's input: output name -> that
        side's own column name; the other side's columns are null in its records."""
        if side == LEFT:
            return {name: name for name in (*self.keys, *self.left)}
        return {**dict(zip(self.keys, self.right_keys, strict=True)),
                **dict(zip(self.right, self.right_sources, strict=True))}


def join_columns(join: Any, left: Any, right: Any
                 ) -> tuple[JoinColumns, list[tuple[str, str]], list[Any]]:
    """(the columns, problems as (where, message), output StructFields) of `join` over the
    Spark schemas `left` and `right`. `where` is the join key the problem is about:
    "left_key", "right_key", "on" (key types), "right_prefix" or "right" (a name clash)."""
    from pyspark.sql.types import StructField

    problems: list[tuple[str, str]] = []
    lf = {f.name: f for f in left.fields if not f.name.startswith("__")}
    rf = {f.name: f for f in right.fields if not f.name.startswith("__")}
    for side, names, have in (("left", join.left_key, lf), ("right", join.right_key, rf)):
        for name in names:
            if name not in have:
                problems.append((f"{side}_key", f"key column {name!r} is not in the {side} input "
                                 f"{getattr(join, side)!r}, whose columns are "
                                 f"{', '.join(have) or '(none)'}"))
    for lk, rk in zip(join.left_key, join.right_key, strict=True):
        if lk in lf and rk in rf and lf[lk].dataType != rf[rk].dataType:
            problems.append(("on", f"key column {lk!r} is {lf[lk].dataType.simpleString()} on "
                             f"the left but {rk!r} is {rf[rk].dataType.simpleString()} on the "
                             "right; cast one side (with_columns) so both have one type"))
    left_others = [n for n in lf if n not in join.left_key]
    right_others = [n for n in rf if n not in join.right_key]
    problems += name_clashes(join, list(lf), list(rf))
    cols = JoinColumns(tuple(join.left_key), tuple(left_others),
                       tuple(join.right_prefix + n for n in right_others), tuple(right_others),
                       tuple(join.right_key))
    fields = [StructField(n, lf[n].dataType, True) for n in (*cols.keys, *cols.left) if n in lf]
    fields += [StructField(join.right_prefix + n, rf[n].dataType, True) for n in right_others]
    return cols, problems, fields


#: The columns a window join adds to its output: the window each pair met in, as Flink's
#: window join carries `window_start` and `window_end`.
def window_fields(join: Any) -> list[Any]:
    """The StructFields a join adds after its input columns: a window join's window."""
    from pyspark.sql.types import StructField, TimestampType

    if join.mode != "window":
        return []
    return [StructField(name, TimestampType(), True) for name in WINDOW_COLUMNS]


def late_mask(join: Any, ts_ms: Any, watermark: int) -> Any:
    """Which of the event times `ts_ms` (numpy, ms) are late at `watermark`, or None when
    nothing can be: `runtime.plan.join_plan.late_condition`'s rule, for the subtasks' own reads."""
    import numpy as np

    if (join.mode == "table" and join.as_of is None) or join.mode == "regular":
        return None
    if join.mode in ("interval", "table"):
        return ts_ms <= watermark
    window = join.window
    size, slide = window.size_ms or 0, window.slide_ms or window.size_ms or 0
    return ts_ms - np.mod(ts_ms, slide) + (size - 1) <= watermark


class JoinKind(KeyedKind):
    """Interval, window and table joins (`join:`)."""

    name = "join"
    capabilities = frozenset({EVERY_RECORD, COLUMNAR, LOCAL_EPOCHS, WHOLE_RECORDS})

    def local_refusal(self, op: OperatorSpec) -> str | None:
        """A `late:` output is a Spark frame of its own."""
        return "a join with a late: output" if op.join is not None and op.join.late else None

    def output_fields(self, spark: Any, op: OperatorSpec, input_schema: StructType
                      ) -> list[StructField]:
        """The input's columns (the output's, `__ts`), without `__join_side`; a window
        join's window (`window_fields`) after the visible ones."""
        del spark
        assert op.join is not None
        fields = [f for f in input_schema.fields if f.name != JOIN_SIDE]
        visible = [f for f in fields if not f.name.startswith(HIDDEN_PREFIX)]
        return [*visible, *window_fields(op.join),
                *[f for f in fields if f.name.startswith(HIDDEN_PREFIX)]]

    def prepare(self, plan: Planning, df: DataFrame, group: list[Any], epoch: int,
                watermark: int, prerouted: bool) -> tuple[DataFrame, DataFrame | None, Any]:
        """Every record, without the late ones (`late_condition`): to the `late:` output,
        or counted."""
        del group, prerouted
        join = plan.op.join
        assert join is not None
        if join.late:
            return (*split_late(join, df, watermark), None)
        is_late = late_condition(join, watermark)
        if is_late is None:  # (a processing-time table join: nothing is late)
            return df, None, None
        in_time, seen = plan.count_late(df, is_late, epoch)
        return in_time, None, seen

    def logic(self, cfg: KeyedConfig) -> Logic:
        """`run_join`."""
        return run_join


def late_condition(join: JoinSpec, watermark: int) -> Column | None:
    """Whether a record is late: an interval or temporal table join's record at or behind
    `watermark`; a window join's once its last window has closed (`W >= last window end -
    1`); never a processing-time table join's (None: its left records wait for nothing, its
    right records upsert the table whatever their time)."""
    from pyspark.sql import functions as F

    if (join.mode == "table" and join.as_of is None) or join.mode == "regular":
        return None  # (a regular join takes every record, late ones too)
    ts = F.col(EVENT_TIME_MS)
    if join.mode in ("interval", "table"):
        return ts <= F.lit(watermark)
    window = join.window
    assert window is not None
    size, slide = window.size_ms or 0, window.slide_ms or window.size_ms or 0
    return ts - F.expr(f"pmod({EVENT_TIME_MS}, {slide})") + F.lit(size - 1) <= F.lit(watermark)


def split_late(join: JoinSpec, df: DataFrame, watermark: int
               ) -> tuple[DataFrame, DataFrame | None]:
    """(the records not behind `watermark` (`late_condition`), the late ones with a
    `join_side` column saying left or right, or None when nothing can be late)."""
    from pyspark.sql import functions as F

    is_late = late_condition(join, watermark)
    if is_late is None:
        return df, None
    late = df.filter(is_late).withColumn(
        "join_side", F.when(F.col(JOIN_SIDE) == 0, F.lit("left")).otherwise(F.lit("right")))
    late = late.drop(*[c for c in late.columns if c.startswith(HIDDEN_PREFIX)])
    return df.filter(~is_late), late


def run_join(cfg: Any, backend: Any, rows: Any, out: Any) -> None:
    """One epoch of a join for one subtask over its input rows (`keyed_rows.Input`): match,
    buffer, fire closed windows, expire (with outer rows), as the module docstring says. A
    processing-time table join works a column at a time (`_upsert_table`, `_lookup_table`);
    everything else goes record by record (`_run_rows`)."""
    from streamer.state import StateDescriptor, StateKind

    join = cfg.join
    table = rows.table
    if join.mode in ("interval", "regular"):  # (a regular join: an interval of +-ttl)
        run_interval(cfg, backend, table, out)
        return
    for name in STATES:  # (the record-by-record layout: window and table joins)
        backend.declare(StateDescriptor(name, StateKind.VALUE))
    if join.mode == "table" and join.as_of is None and len(rows) and not any(
            _floating(table.column(k).type) for k in cfg.join_columns.keys):
        # (floating keys go record by record: there -0.0 joins and comes out as 0.0)
        import pyarrow as pa

        side = table.column(JOIN_SIDE).to_numpy(zero_copy_only=False)
        is_left = side == LEFT
        if (side == DELETE).any():  # (a changelog's deletes: record by record)
            _run_rows(cfg, backend, table.filter(pa.array(~is_left)).to_pylist(), out)
        else:
            _upsert_table(cfg, backend, table.filter(pa.array(~is_left)))
        if is_left.any():
            _lookup_table(cfg, backend, table.filter(pa.array(is_left)), out)
        return
    _run_rows(cfg, backend, table.to_pylist() if len(rows) else [], out)


def _floating(dtype: Any) -> bool:
    """Whether the Arrow type `dtype` is a floating-point type."""
    import pyarrow as pa

    return bool(pa.types.is_floating(dtype))


def _run_rows(cfg: Any, backend: Any, rows: list[dict[str, Any]], out: Any) -> None:
    """`run_join` record by record, over `rows` (dicts) and the keys with due timers."""
    from streamer.state.codec import encode_key

    join, cols = cfg.join, cfg.join_columns
    wm = cfg.fire_up_to
    due = backend.due_timers("event", wm, remove=True)
    by_key: dict[tuple[int, bytes], list[dict[str, Any]]] = {}
    for row in rows:
        kb = encode_key(tuple(row[k] for k in cols.keys))
        by_key.setdefault((row[KEY_GROUP], kb), []).append(row)
    cells = sorted(set(by_key) | {(t.key_group, t.key) for t in due})
    load = cfg.extra.get("table_load") if join.mode == "table" else None
    if cells:
        _run_cells(cfg, backend, cells, by_key, out)
    if load is not None:
        _drop_unloaded(backend, load)


def _upsert_table(cfg: Any, backend: Any, right: Any) -> None:
    """A processing-time table join's right records (an Arrow table of the stage's input
    columns, no deletes), a column at a time: each key's newest record of the epoch (by
    load, event time, arrival) replaces the key's stored row unless that is newer, as
    `_Table.add` does record by record; with a `reload:` load, the rows of earlier loads
    the load does not have are deleted (`_drop_unloaded`)."""
    import numpy as np
    import pyarrow as pa

    from streamer.operators.keyed_rows import key_cells, key_codes_only

    cols, load = cfg.join_columns, cfg.extra.get("table_load")
    if right.num_rows:
        ts = right.column(EVENT_TIME_MS).to_numpy(zero_copy_only=False)
        seq = right.column(SEQ).to_numpy(zero_copy_only=False)
        code = key_codes_only(right, cols.keys)
        order = np.lexsort((seq, ts, code))
        last = np.ones(len(order), dtype=bool)
        last[:-1] = code[order][1:] != code[order][:-1]
        at = pa.array(order[last], pa.int64())
        newest = right.take(at)
        cells = key_cells(newest, cols.keys, _NS)
        values = zip(*[newest.column(c).to_pylist() for c in cols.right], strict=True) \
            if cols.right else iter([()] * len(cells))
        puts = []
        for cell, stored, t, s, row in zip(cells, backend.get_many_shared(STATES[RIGHT], cells),
                                           ts[order[last]].tolist(), seq[order[last]].tolist(),
                                           values, strict=True):
            old = stored[0] if stored else None
            if old is None or (_load_of(old), old[0], old[1]) <= (load or 0, t, s):
                puts.append((*cell, [[t, s, list(row), False, load]]))
        if puts:
            backend.put_many(STATES[RIGHT], puts)
    if load is not None:
        _drop_unloaded(backend, load)


def _lookup_table(cfg: Any, backend: Any, left: Any, out: Any) -> None:
    """A processing-time table join's left records (an Arrow table of the stage's input
    columns), a column at a time: each distinct key's row looked up once (after the epoch's
    upserts: `_run_rows` ran them), the right columns taken from it for every record, one
    output chunk. The same rows `_Table.add` would emit record by record: a record joins its
    key's current row (none when deleted, or of an earlier `reload:` load), and without a
    row is emitted with nulls on the right only when the join is left outer."""
    import numpy as np
    import pyarrow as pa

    from streamer.operators.keyed_rows import key_cells, key_codes_only

    cols, load = cfg.join_columns, cfg.extra.get("table_load")
    code = key_codes_only(left, cols.keys)
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    firsts = left.select([KEY_GROUP, *cols.keys]).take(pa.array(first, pa.int64()))
    found = backend.get_many_shared(STATES[RIGHT], key_cells(firsts, cols.keys, _NS))
    rows: list[list[Any] | None] = []
    for versions in found:
        row = versions[0] if versions else None
        if row is not None and (row[2] is None or (load is not None and _load_of(row) < load)):
            row = None  # (deleted, or a row the load no longer has: `_drop_unloaded`)
        rows.append(row[2] if row is not None else None)
    has_row = np.array([r is not None for r in rows], dtype=bool)
    picked = np.arange(left.num_rows) if cfg.join.outer_left else np.flatnonzero(
        has_row[inverse])
    if not len(picked):
        return
    at = pa.array(inverse[picked], pa.int64())
    take = pa.array(picked, pa.int64())
    types = {f.name: f.type for f in cfg.out_schema}
    columns: dict[str, Any] = {name: left.column(name).take(take)
                               for name in (*cols.keys, *cols.left)}
    for j, name in enumerate(cols.right):
        values = pa.array([r[j] if r is not None else None for r in rows], types[name])
        columns[name] = values.take(at)
    ts = left.column(EVENT_TIME_MS).take(take).to_numpy(zero_copy_only=False)
    columns[EVENT_TIME] = pa.array(ts * 1000, pa.int64()).cast(types[EVENT_TIME])
    out.table(pa.table(columns))


def _drop_unloaded(backend: Any, load: int) -> None:
    """A table's load `load` replaced it: delete the rows of earlier loads (of keys the load
    no longer has) in the subtask's key groups."""
    stale = [(kg, kb, ns) for kg in backend.key_groups
             for kb, ns, row in backend.iterate(STATES[RIGHT], kg)
             if row and _load_of(row[0]) < load]
    if stale:
        backend.delete_many(STATES[RIGHT], stale)


def _load_of(record: list[Any]) -> int:
    """The load of a table row (`reload:`): its record's last field (0: none)."""
    return int(record[4] or 0)


def _run_cells(cfg: Any, backend: Any, cells: list[tuple[int, bytes]],
               by_key: dict[tuple[int, bytes], list[dict[str, Any]]], out: Any) -> None:
    """`run_join` over the keys that have records or timers this epoch."""
    from streamer.state.codec import decode_key

    join, cols, wm = cfg.join, cfg.join_columns, cfg.fire_up_to
    addresses = [(kg, kb, _NS) for kg, kb in cells]
    stored = [backend.get_many(name, addresses) for name in STATES]
    puts: list[list[Any]] = [[], []]
    deletes: list[list[Any]] = [[], []]
    timers: set[tuple[int, int, bytes, bytes]] = set()
    logic: Any = {"window": _Windowed, "table": _Table}[join.mode](join, wm)
    if join.mode == "table":
        logic.load = cfg.extra.get("table_load")
    for i, (kg, kb) in enumerate(cells):
        buffers = (list(stored[0][i] or ()), list(stored[1][i] or ()))
        emit = _Rows(out, decode_key(kb), cols)
        for row in sorted(by_key.get((kg, kb), ()), key=logic.order):
            side = row[JOIN_SIDE]  # (LEFT, RIGHT, or DELETE: a table's right side)
            own = cols.left if side == LEFT else cols.right
            record = [row[EVENT_TIME_MS], row[SEQ], [row[c] for c in own], False, None]
            for expiry in logic.add(record, side, buffers, emit):
                timers.add((kg, expiry, kb, _NS))
        logic.fire(buffers, emit)
        for side in (LEFT, RIGHT):
            kept = [r for r in buffers[side] if logic.expiry(r, side) > wm]
            if kept:
                if join.mode != "table" or kept != stored[side][i]:  # (a table's unchanged
                    puts[side].append((kg, kb, _NS, kept))  # row or versions: no write)
            elif stored[side][i] is not None:
                deletes[side].append((kg, kb, _NS))
    for side, name in enumerate(STATES):
        if puts[side]:
            backend.put_many(name, puts[side])
        if deletes[side]:
            backend.delete_many(name, deletes[side])
    if timers:
        backend.add_timers("event", sorted(timers))


class _Rows:
    """Output rows of one key: a left and a right record (either may be None: an outer row)."""

    def __init__(self, out: Any, key: Sequence[Any], cols: JoinColumns) -> None:
        self.out, self.key, self.cols = out, key, cols

    def pair(self, left: list[Any] | None, right: list[Any] | None, ts_ms: int,
             window: tuple[int, int] | None = None) -> None:
        """The output row of `left` and `right` at event time `ts_ms`; a window join's
        carries the window [start, end) (ms) the pair met in."""
        row: dict[str, Any] = {ROW_KIND: OUT, ROW_META: None}
        if window is not None:
            row["window_start"], row["window_end"] = window[0] * 1000, window[1] * 1000
        row.update(zip(self.cols.keys, self.key, strict=True))
        row.update(zip(self.cols.left, left[2] if left else [None] * len(self.cols.left),
                       strict=True))
        row.update(zip(self.cols.right, right[2] if right else [None] * len(self.cols.right),
                       strict=True))
        row[EVENT_TIME] = ts_ms * 1000
        self.out.rows.append(row)


class _Windowed:
    """Window join: a closed window joins the records of both sides that had it open."""

    def __init__(self, join: Any, wm: int) -> None:
        window = join.window
        self.size = window.size_ms
        self.slide = window.slide_ms or window.size_ms
        self.wm = wm
        self.outer = (join.outer_left, join.outer_right)

    @staticmethod
    def order(row: dict[str, Any]) -> tuple[int, ...]:
        """The order in which an epoch's records of one key are added: event time, arrival."""
        return (row[EVENT_TIME_MS], row[SEQ])

    def last_start(self, ts: int) -> int:
        """The start of the last window that holds `ts`."""
        return int(ts - ts % self.slide)

    def expiry(self, record: list[Any], side: int) -> int:
        """The watermark at which `record`'s last window closes."""
        return self.last_start(record[0]) + self.size - 1

    def add(self, record: list[Any], side: int, buffers: tuple[list[Any], list[Any]],
            emit: _Rows) -> list[int]:
        """Buffer `record` with its first window still open; a timer per open window."""
        last = self.last_start(record[0])
        first = last
        while first - self.slide + self.size > record[0] and \
                first - self.slide + self.size - 1 > self.wm:
            first -= self.slide
        record[4] = first
        buffers[side].append(record)
        return list(range(first + self.size - 1, last + self.size, self.slide))

    def fire(self, buffers: tuple[list[Any], list[Any]], emit: _Rows) -> None:
        """Join each closed window's records; outer rows for a window with one side only."""
        starts: set[int] = set()
        for side in (LEFT, RIGHT):
            for r in buffers[side]:
                s = r[4]
                while s <= self.last_start(r[0]) and s + self.size - 1 <= self.wm:
                    starts.add(s)
                    s += self.slide
        for start in sorted(starts):
            end_ts = start + self.size - 1
            window = (start, start + self.size)
            inside = [[r for r in buffers[side] if r[4] <= start <= r[0] < start + self.size]
                      for side in (LEFT, RIGHT)]
            for left in inside[LEFT]:
                for right in inside[RIGHT]:
                    emit.pair(left, right, end_ts, window)
            for side in (LEFT, RIGHT):
                if self.outer[side] and not inside[1 - side]:
                    for r in inside[side]:
                        emit.pair(r if side == LEFT else None, r if side == RIGHT else None,
                                  end_ts, window)
            for side in (LEFT, RIGHT):  # the window is done: the records' next one is first
                for r in inside[side]:
                    r[4] = start + self.slide


#: A table join's buffered records never expire (they leave the state in `_Table.fire`).
_NEVER = 2**62


class _Table:
    """Table join: the right side's records are upserts of their key's row (the latest by
    event time, then arrival). Processing time (`as_of` None): the right buffer is that one
    row, each left record joins it as it is added, the epoch's right records first, and is not
    buffered. Temporal (`as_of: event_time`): the right buffer is the key's versions in
    (ts, seq) order; a left record waits in the left buffer until the watermark reaches its ts,
    then joins the newest version at or before its ts; versions older than the newest at or
    before the watermark can serve no future left record and are dropped."""

    def __init__(self, join: Any, wm: int) -> None:
        self.wm, self.temporal, self.outer = wm, join.as_of is not None, join.outer_left
        #: A `reload:` table's load read this epoch (None: none): its rows replace every
        #: row of an earlier load, whatever their times; the others are deleted.
        self.load: int | None = None

    def order(self, row: dict[str, Any]) -> tuple[int, ...]:
        """Right records before left ones (processing time), then event time, arrival."""
        first = 0 if self.temporal else int(row[JOIN_SIDE] == LEFT)
        return (first, row[EVENT_TIME_MS], row[SEQ])

    def expiry(self, record: list[Any], side: int) -> int:
        """Never: `fire` takes the records that are done out of the buffers."""
        return _NEVER

    def add(self, record: list[Any], side: int, buffers: tuple[list[Any], list[Any]],
            emit: _Rows) -> list[int]:
        """Upsert a right record (delete: a tombstone); join or buffer a left one (its
        timer: its ts). A tombstone is a version without a row (temporal), or, processing
        time, deletes the row unless the row is newer."""
        versions = buffers[RIGHT]
        if side == DELETE:
            record[2] = None
        if self.load is not None:  # (processing time only: validation)
            if side == RIGHT:
                record[4] = self.load
            elif versions and _load_of(versions[0]) < self.load:
                versions[:] = []  # a row the load no longer has
        if side != LEFT:
            if not self.temporal:
                if not versions or (_load_of(versions[0]), versions[0][0], versions[0][1]) <= (
                        _load_of(record), record[0], record[1]):
                    versions[:] = [record] if side == RIGHT else []
                return []
            at = len(versions)
            while at and (versions[at - 1][0], versions[at - 1][1]) > (record[0], record[1]):
                at -= 1
            versions.insert(at, record)
            return []
        if not self.temporal:
            self._join(record, versions[0] if versions else None, emit)
            return []
        buffers[LEFT].append(record)
        return [record[0]]

    def _join(self, left: list[Any], right: list[Any] | None, emit: _Rows) -> None:
        if right is not None and right[2] is None:  # a deleted row: none
            right = None
        if right is not None or self.outer:
            emit.pair(left, right, left[0])

    def fire(self, buffers: tuple[list[Any], list[Any]], emit: _Rows) -> None:
        """Temporal: join the left records the watermark has reached (in ts, seq order) with
        their version, then drop the versions no left record can need any more."""
        if not self.temporal:
            return
        lefts, versions = buffers
        for left in sorted((r for r in lefts if r[0] <= self.wm), key=lambda r: (r[0], r[1])):
            match = None
            for version in versions:
                if version[0] > left[0]:
                    break
                match = version
            self._join(left, match, emit)
        lefts[:] = [r for r in lefts if r[0] > self.wm]
        current = sum(1 for v in versions if v[0] <= self.wm)
        if current > 1:
            del versions[:current - 1]
        if versions and versions[0][2] is None and versions[0][0] <= self.wm:
            del versions[0]  # (a deletion no left record can need: as no version at all)
