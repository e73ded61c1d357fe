"""OVER windows, the keyed kind (`OverKind`, see `operators.contract`; spec:
`pipeline.over_spec`).

Every record comes out once, with each aggregate over its key's records up to it: the last
`rows` of them, or those at most `range` of event time before it, itself included. As in
Flink, a record is emitted once the watermark passes its event time, so the records of a key
are taken in event-time order (then arrival) whatever order they came in; a record at or
behind the watermark when it arrives is late (counted and dropped).

**Spark's part** (`prepare`): late records split off; each aggregate's argument evaluated
into a column `__arg<i>`.

**State**, per (key group, key): `over.pending`, the records waiting for the watermark, each
`[ts_ms, seq, values, args]`; and `over.rows`, the records the next ones' aggregates still
cover, each `[ts_ms, args]`. One event-time timer per key at its earliest waiting record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamer import columns as C
from streamer.columns import EVENT_TIME_MS, KEY_GROUP, SEQUENCE
from streamer.operators.contract import EVERY_RECORD, KeyedKind, Logic, Planning
from streamer.operators.keyed_rows import NS_ROLLING, key_to_bytes

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructField, StructType

    from streamer.operators.keyed_config import KeyedConfig
    from streamer.pipeline.spec import OperatorSpec

PENDING, ROWS = "over.pending", "over.rows"


def arg_column(i: int) -> str:
    """The column of the i-th aggregate's argument."""
    return f"__arg{i}"


class OverKind(KeyedKind):
    """An OVER window per key (`over:` + `aggregate:`)."""

    name = "over"
    capabilities = frozenset({EVERY_RECORD})

    def output_fields(self, spark: Any, op: OperatorSpec, input_schema: StructType
                      ) -> list[StructField]:
        """The input's columns, `__ts` (the record's), then the aggregates."""
        from streamer.operators.windows import aggregate_fields

        fields = [f for f in input_schema.fields
                  if f.name not in (C.CHANGE, C.GLOBAL_KEY) and not f.name.startswith("__arg")]
        return [*fields, *aggregate_fields(spark, op, input_schema)]

    def prepare(self, plan: Planning, df: DataFrame, group: list[Any], epoch: int,
                watermark: int, prerouted: bool) -> tuple[DataFrame, DataFrame | None, Any]:
        """Late records counted and dropped; the aggregates' arguments evaluated."""
        from pyspark.sql import functions as F

        del group, prerouted
        seen = None
        if plan.domain == "event":
            df, seen = plan.count_late(df, F.col(EVENT_TIME_MS) <= F.lit(watermark), epoch)
        args = {arg_column(i): F.expr(agg.arg) if agg.arg else F.lit(1)
                for i, agg in enumerate(plan.op.aggregates)}
        return df.withColumns(args), None, seen

    def logic(self, cfg: KeyedConfig) -> Logic:
        """`run_over`."""
        return run_over


def run_over(cfg: KeyedConfig, backend: Any, rows: list[dict[str, Any]], out: Any) -> None:
    """One epoch of an OVER window for one subtask: the keys whose earliest waiting record
    the watermark passed emit their records up to it, in order; then the epoch's records
    wait."""
    from streamer.state import StateDescriptor, StateKind

    for name in (PENDING, ROWS):
        backend.declare(StateDescriptor(name, StateKind.VALUE))
    op = cfg.op
    n_args = len(op.aggregates)
    columns = [c for c in cfg.record_columns if c not in (C.CHANGE, C.GLOBAL_KEY)
               and not c.startswith("__arg")]
    due = backend.due_timers(cfg.domain, cfg.fire_up_to, remove=True)
    if due:
        _emit_due(cfg, backend, [(t.key_group, t.key, NS_ROLLING) for t in due], columns, out)
    order = [columns.index(c) for c in op.over.order_by]
    by_cell: dict[tuple[int, bytes, bytes], list[list[Any]]] = {}
    for row in rows:
        cell = (row[KEY_GROUP], key_to_bytes([row[k] for k in cfg.keys]), NS_ROLLING)
        by_cell.setdefault(cell, []).append(
            [row[EVENT_TIME_MS], row[SEQUENCE], [row[c] for c in columns],
             [row[arg_column(i)] for i in range(n_args)]])
    if not by_cell:
        return
    cells = list(by_cell)
    stored = backend.get_many(PENDING, cells)
    puts, timers = [], []
    for cell, old in zip(cells, stored, strict=True):
        waiting = sorted([*(old or []), *by_cell[cell]],
                         key=lambda r: (r[0], *(_nulls_first(r[2][i]) for i in order), r[1]))
        puts.append((*cell, waiting))
        if not old or waiting[0][0] < old[0][0]:  # (a new earliest record: its timer)
            timers.append((cell[0], waiting[0][0], cell[1], NS_ROLLING))
    backend.put_many(PENDING, puts)
    backend.add_timers(cfg.domain, timers)


def _emit_due(cfg: KeyedConfig, backend: Any, cells: list[tuple[int, bytes, bytes]],
              columns: list[str], out: Any) -> None:
    """Emit each key's waiting records up to `cfg.fire_up_to`, in (event time, arrival)
    order, each with its aggregates; keep the rest waiting (timer at the earliest)."""
    op = cfg.op
    over = op.over
    cells = list(dict.fromkeys(cells))
    pending = backend.get_many(PENDING, cells)
    history = backend.get_many(ROWS, cells)
    put_pending, put_rows, timers = [], [], []
    for cell, waiting, kept in zip(cells, pending, history, strict=True):
        waiting = waiting or []
        ready = [r for r in waiting if r[0] <= cfg.fire_up_to]
        rest = [r for r in waiting if r[0] > cfg.fire_up_to]
        kept = list(kept or [])
        # ROWS: each record in turn. RANGE: the records of one event time are peers, as in
        # SQL: each sees all of them.
        groups: list[list[Any]] = []
        for r in ready:
            if groups and over.rows is None and groups[-1][0][0] == r[0]:
                groups[-1].append(r)
            else:
                groups.append([r])
        for group in groups:
            ts = group[0][0]
            kept += [[r[0], r[3]] for r in group]
            if over.rows is not None:
                kept = kept[-over.rows:]
            else:
                kept = [r for r in kept if r[0] >= ts - over.range_ms]
            values = [_aggregate(agg.function, [r[1][i] for r in kept])
                      for i, agg in enumerate(op.aggregates)]
            for r in group:
                record = dict(zip(columns, r[2], strict=True))
                record.update((agg.name, v) for agg, v in zip(op.aggregates, values,
                                                               strict=True))
                out.record(record)
        put_pending.append((*cell, rest or None))
        put_rows.append((*cell, kept or None))
        if rest:
            timers.append((cell[0], rest[0][0], cell[1], NS_ROLLING))
    backend.put_many(PENDING, put_pending)
    backend.put_many(ROWS, put_rows)
    if timers:
        backend.add_timers(cfg.domain, timers)


def _nulls_first(value: Any) -> tuple[bool, Any]:
    """A sort key that puts None first, as Spark SQL's ascending order does."""
    return (value is not None, value)


def _aggregate(function: str, values: list[Any]) -> Any:
    """count, sum, avg, min or max of `values`, nulls ignored, as SQL's."""
    present = [v for v in values if v is not None]
    if function == "count":
        return len(present)
    if not present:
        return None
    if function == "sum":
        return sum(present)
    if function == "avg":
        return sum(present) / len(present)
    return min(present) if function == "min" else max(present)
