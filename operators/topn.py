"""Top-N, the keyed kind (`TopNKind`, see `operators.contract`; its spec: `pipeline.topn_spec`).

Per key (and, with a window, per window) the first n rows by `order_by`, as Flink SQL's
`ROW_NUMBER() OVER (PARTITION BY key ORDER BY ...) <= n`. Ties go to the earlier record
(event time, then arrival: the `SEQUENCE` Spark gives each record, which a replayed epoch
gives again). Null sorts first ascending and last descending, as in Spark SQL.

**Spark's part** (`prepare`): of each epoch's records, only the first n per key (and window)
can be among the first n of all epochs, so Spark keeps just those (`row_number()` over the
epoch's rows) before they are routed.

**State**: per (key group, key, namespace) one value in the state `topn`: the current rows,
best first, each as `[ts_ms, seq, values]` (values in the input's column order). The
namespace is `NS_ROLLING` without a window, the window's start with one.

**Output**:
- without a window, an update stream (`columns.CHANGE`): for each rank whose row changed in
  the epoch, the row it had (`RETRACT`, when it had one) and then its new row (`INSERT` for
  a rank filled for the first time, else `UPDATE`), with the rank in the `rank` column. A
  sink keeps the new rows; a rolling count, sum or avg takes the changes back and forth;
- with a window, each window's rows once, when the watermark (or the clock) passes its end
  plus the allowed lateness, with `window_start`, `window_end` and `__ts` = end - 1 ms.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from streamer import columns as C
from streamer.columns import EVENT_TIME_MS, INSERT, KEY_GROUP, RETRACT, SEQUENCE, UPDATE
from streamer.operators.contract import KeyedKind, Logic, Planning
from streamer.operators.keyed_rows import I64, NS_ROLLING, key_to_bytes, ns_of
from streamer.operators.windows import assign_time_windows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructField, StructType

    from streamer.operators.keyed_config import KeyedConfig
    from streamer.pipeline.spec import OperatorSpec
    from streamer.pipeline.topn_spec import TopNSpec

#: The state of the current rows per key (and window).
TOPN = "topn"


class TopNKind(KeyedKind):
    """Top-N per key, or per key and window (`top_n:`)."""

    name = "top_n"
    capabilities = frozenset()

    def local_refusal(self, op: OperatorSpec) -> str | None:
        """Not declared: every epoch goes through Spark's first-n filter."""
        del op
        return "a top-N operator"

    def output_fields(self, spark: Any, op: OperatorSpec, input_schema: StructType
                      ) -> list[StructField]:
        """The input's columns, the window's bounds (with a window), the rank, and `__ts`
        (with a window) or `__op` (without one: an update stream)."""
        from pyspark.sql.types import IntegerType, StringType, StructField, TimestampType

        del spark
        assert op.top_n is not None
        fields = [f for f in input_schema.fields
                  if f.name not in (C.EVENT_TIME, C.CHANGE, C.GLOBAL_KEY)]
        if op.window is not None:
            fields += [StructField("window_start", TimestampType()),
                       StructField("window_end", TimestampType())]
        fields.append(StructField(op.top_n.rank, IntegerType()))
        if op.window is not None:
            fields.append(StructField(C.EVENT_TIME, TimestampType()))
        else:
            fields.append(StructField(C.CHANGE, StringType()))
        return fields

    def prepare(self, plan: Planning, df: DataFrame, group: list[Any], epoch: int,
                watermark: int, prerouted: bool) -> tuple[DataFrame, DataFrame | None, Any]:
        """The epoch's first n records per key (and window), late ones split off."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        del prerouted
        op = plan.op
        top_n = op.top_n
        assert top_n is not None
        group = list(group)
        late = late_seen = None
        if op.window is not None:
            df, late, late_seen = assign_time_windows(plan, df, epoch, watermark)
            group.append(F.col(C.WINDOW_START))
        order = [(F.col(c).desc_nulls_last() if desc else F.col(c).asc_nulls_first())
                 for c, desc in top_n.order_by]
        ranked = Window.partitionBy(*group).orderBy(*order, F.col(EVENT_TIME_MS),
                                                    F.col(SEQUENCE))
        rows = df.withColumn(C.RANK, F.row_number().over(ranked)).filter(
            F.col(C.RANK) <= F.lit(top_n.n)).drop(C.RANK)
        if late is not None:
            late = late.drop(*[c for c in late.columns if c.startswith(C.HIDDEN_PREFIX)])
        return rows, late, late_seen

    def logic(self, cfg: KeyedConfig) -> Logic:
        """`run_top_n`."""
        return run_top_n


def run_top_n(cfg: KeyedConfig, backend: Any, rows: list[dict[str, Any]], out: Any) -> None:
    """One epoch of a top-N for one subtask: windows due fire, then the epoch's rows (the
    first n per key and window of the epoch) are merged into each key's rows."""
    from streamer.state import StateDescriptor, StateKind

    op = cfg.op
    top_n: TopNSpec = op.top_n
    backend.declare(StateDescriptor(TOPN, StateKind.VALUE))
    columns = [c for c in cfg.record_columns
               if c not in (C.EVENT_TIME, C.CHANGE, C.GLOBAL_KEY)]
    order = _ordering(top_n, columns)
    window = op.window
    size = (window.size_ms or 0) if window is not None else 0
    if window is not None:
        _fire(cfg, backend, top_n, columns, size, out)
    by_cell: dict[tuple[int, bytes, bytes], list[list[Any]]] = {}
    for row in rows:
        key = key_to_bytes([row[k] for k in cfg.keys])
        ns = ns_of(row[C.WINDOW_START]) if window is not None else NS_ROLLING
        by_cell.setdefault((row[KEY_GROUP], key, ns), []).append(
            [row[EVENT_TIME_MS], row[SEQUENCE], [row[c] for c in columns]])
    if not by_cell:
        return
    cells = list(by_cell)
    stored = backend.get_many(TOPN, cells)
    puts = []
    timers = []
    delay = size - 1 + (window.allowed_lateness_ms if window is not None else 0)
    for cell, old in zip(cells, stored, strict=True):
        before = old or []
        now = sorted([*before, *by_cell[cell]], key=order)[:top_n.n]
        puts.append((*cell, now))
        if window is not None:
            if old is None:
                timers.append((cell[0], I64.unpack(cell[2])[0] + delay, cell[1], cell[2]))
            continue
        for rank, row in enumerate(now, 1):
            had = before[rank - 1] if rank <= len(before) else None
            if had is not None and had[:2] == row[:2]:
                continue  # (the same record: unchanged)
            if had is not None:
                out.record(_output(columns, had[2], top_n, rank, RETRACT))
            out.record(_output(columns, row[2], top_n, rank,
                               INSERT if had is None else UPDATE))
    backend.put_many(TOPN, puts)
    if timers:
        backend.add_timers(cfg.domain, timers)


def _fire(cfg: KeyedConfig, backend: Any, top_n: TopNSpec, columns: list[str], size: int,
          out: Any) -> None:
    """Emit the rows of every window whose timer is due, and forget them."""
    due = backend.due_timers(cfg.domain, cfg.fire_up_to, remove=True)
    if not due:
        return
    cells = [(t.key_group, t.key, t.namespace) for t in due]
    for cell, rows in zip(cells, backend.get_many(TOPN, cells), strict=True):
        start = I64.unpack(cell[2])[0]
        for rank, row in enumerate(rows or (), 1):
            record = _output(columns, row[2], top_n, rank, None)
            record["window_start"] = start * 1000  # (timestamps in microseconds)
            record["window_end"] = (start + size) * 1000
            record[C.EVENT_TIME] = (start + size - 1) * 1000
            out.record(record)
    backend.delete_many(TOPN, cells)


def _output(columns: list[str], values: list[Any], top_n: TopNSpec, rank: int,
            change: str | None) -> dict[str, Any]:
    """One output row: the record's columns, its rank and (an update stream's) change."""
    record = dict(zip(columns, values, strict=True))
    record[top_n.rank] = rank
    if change is not None:
        record[C.CHANGE] = change
    return record


def _ordering(top_n: TopNSpec, columns: list[str]) -> Any:
    """A sort key of stored rows `[ts_ms, seq, values]`: `order_by` (nulls first ascending,
    last descending, as Spark), then event time, then arrival."""
    index = [(columns.index(c), desc) for c, desc in top_n.order_by]

    def compare(a: list[Any], b: list[Any]) -> int:
        for i, desc in index:
            x, y = a[2][i], b[2][i]
            if x == y:
                continue
            if x is None or y is None:
                first = x is None  # (None sorts before the other value ascending)
                return (1 if first else -1) if desc else (-1 if first else 1)
            smaller = x < y
            return (1 if smaller else -1) if desc else (-1 if smaller else 1)
        return (a[0] > b[0]) - (a[0] < b[0]) or (a[1] > b[1]) - (a[1] < b[1])

    return functools.cmp_to_key(compare)
