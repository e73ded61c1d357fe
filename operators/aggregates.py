"""The spec's aggregate functions as mergeable accumulators.

Each aggregate has three faces: partial columns computed by Spark SQL per epoch before the
shuffle (so Python sees one row per key and window per epoch), a Python merge of two
partials (epoch partial into stored accumulator, or session into session), and a final
value. `first`/`last` are by event time (then by arrival), as in Flink's windows, so results
do not depend on how an epoch was cut.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from streamer.pipeline.spec import AggregateSpec

Partial = tuple[Any, ...]


def _t(value: Any) -> tuple[Any, ...]:
    """A struct from Arrow (a dict in field order) as a tuple."""
    return tuple(value.values()) if isinstance(value, dict) else tuple(value)


def _add(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _sum_merge(what: str) -> Callable[[Any, Any], Any]:
    """`_add` for a sum, which raises `sum_overflow(what)` where integers pass 64 bits (state
    kept across epochs is merged as Python integers, which do not wrap, and Arrow would fail
    to take the result with a bare OverflowError)."""
    def merge(a: Any, b: Any) -> Any:
        if a is None:
            return b
        if b is None:
            return a
        total = a + b
        if type(total) is int and not -(2**63) <= total < 2**63:
            raise sum_overflow(what)
        return total

    return merge


def _min(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else min(a, b)


def _max(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)


def _first(a: Any, b: Any) -> Any:  # (ts, seq, value); smaller (ts, seq) wins
    if a is None:
        return b
    if b is None:
        return a
    return a if (a[0], a[1]) <= (b[0], b[1]) else b


def _last(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return b if (b[0], b[1]) >= (a[0], a[1]) else a


def _by(largest: bool) -> Callable[[Any, Any], Any]:
    """The merge of `max_by` (`largest`) or `min_by` partials, (order, ts, seq, value): the
    largest (smallest) order wins; among equal orders the earliest record (by event time,
    then arrival), so results do not depend on how epochs were cut."""
    def merge(a: Any, b: Any) -> Any:
        if a is None:
            return b
        if b is None:
            return a
        if a[0] != b[0]:
            return a if (a[0] > b[0]) == largest else b
        return a if (a[1], a[2]) <= (b[1], b[2]) else b

    return merge


def _concat(a: Any, b: Any) -> Any:
    return (a or []) + (b or [])


def _union(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return a | b


def sum_overflow(what: str) -> ArithmeticError:
    """The error of a bigint sum past 64 bits (`what` overflowed), as Spark's ANSI sum fails:
    where Arrow sums integers (it wraps around) streamer checks and raises this."""
    return ArithmeticError(
        f"[ARITHMETIC_OVERFLOW] {what} overflows bigint (64-bit integers), as Spark's sum "
        "does; to sum past it, cast the column to a decimal before the window (with_columns)")


def check_int_sums(columns: dict[str, Any], group: list[str], name: str, approx: Any,
                   what: str) -> None:
    """Raise `sum_overflow(what)` where an integer column's grouped sum is past 64 bits.
    Arrow's grouped sum of integers wraps around, where Spark's (ANSI) sum and the Python
    accumulators fail: `approx` are the same sums in floating point (per group, any order).
    Sums below 2**62 there cannot have wrapped; otherwise the column `name` of `columns`
    (grouped by the columns `group`) is summed again exactly, as decimals."""
    import pyarrow as pa
    import pyarrow.compute as pc

    largest = pc.max(pc.abs(approx)).as_py()
    if largest is None or largest < 2.0**62:
        return
    exact = pa.table({**{k: columns[k] for k in group},
                      name: columns[name].cast(pa.decimal128(38, 0))}).group_by(
        group, use_threads=False).aggregate([(name, "sum")]).column(f"{name}_sum")
    high = pa.scalar(2**63 - 1, pa.decimal128(38, 0))
    low = pa.scalar(-(2**63), pa.decimal128(38, 0))
    if pc.any(pc.or_(pc.greater(exact, high), pc.less(exact, low))).as_py():
        raise sum_overflow(what)


@dataclass(frozen=True)
class Accumulator:
    """How one aggregate is computed: partial SQL, merge and final value."""

    spec: AggregateSpec
    #: Spark SQL aggregate expressions producing the partial's components.
    sql: tuple[str, ...]
    merge: Callable[[Any, Any], Any]
    #: Turn the partial's components (as Spark returns them) into the mergeable value.
    lift: Callable[[Sequence[Any]], Any]
    final: Callable[[Any], Any]
    #: Spark SQL expression (over the input) whose type is the output type.
    type_sql: str
    #: `lift` / `final` over a whole column at once, where a list comprehension (or nothing:
    #: the values as they are) does the same work faster than one call per row.
    lift_column: Callable[[list[Any]], list[Any]] | None = None
    final_column: Callable[[list[Any]], list[Any]] | None = None

    def lift_rows(self, columns: Sequence[list[Any]]) -> list[Any]:
        """`lift` of every row, given the partial's columns (as Arrow's `to_pylist` gives
        them): the mergeable value per row."""
        if self.lift_column is not None:
            return self.lift_column(columns[0])
        lift = self.lift
        return [lift(p) for p in zip(*columns, strict=True)]

    def final_rows(self, values: list[Any]) -> list[Any]:
        """`final` of every accumulator in `values`."""
        if self.final_column is not None:
            return self.final_column(values)
        final = self.final
        return [final(v) for v in values]


def _same(values: list[Any]) -> list[Any]:
    return values


def _zero_for_null(values: list[Any]) -> list[Any]:
    return [v or 0 for v in values]


def _avg_final(acc: Any) -> Any:
    if acc is None or not acc[1]:
        return None
    return acc[0] / acc[1]


def accumulator(spec: AggregateSpec, ts: str, seq: str, sign: str | None = None
                ) -> Accumulator:
    """The accumulator of one aggregate; `ts`/`seq` are the event-time (ms) and arrival-order
    columns used to order `first`, `last` and `collect_list`. `sign` (an expression of 1 or
    -1): the input is an update stream whose rows of -1 take their values back; only the
    aggregates of `pipeline.spec.RETRACTABLE` take it (their partials are then signed sums,
    which the same merges add). An aggregate's `filter` applies to its partials' SQL."""
    acc = _signed(spec, sign) if sign is not None else _plain(spec, ts, seq)
    if spec.filter is None:
        return acc
    # Flink's and Spark's `agg(...) filter (where c)`: the partial sees only the rows where c
    # holds (not where it is false or null), so the merges and finals are unchanged.
    return replace(acc, sql=tuple(f"{sql} filter (where {spec.filter})" for sql in acc.sql))


def _plain(spec: AggregateSpec, ts: str, seq: str) -> Accumulator:
    """`accumulator` over an append-only input, without the filter."""
    fn, x = spec.function, spec.arg
    if fn == "count":
        return Accumulator(spec, ("count(1)",), _add, lambda p: p[0] or 0, lambda a: a or 0,
                           "count(1)", _zero_for_null, _zero_for_null)
    assert x is not None
    if fn == "sum":
        return Accumulator(spec, (f"sum({x})",), _sum_merge(f"sum({x})"), lambda p: p[0],
                           lambda a: a, f"sum({x})", _same, _same)
    if fn == "min":
        return Accumulator(spec, (f"min({x})",), _min, lambda p: p[0], lambda a: a, f"min({x})",
                           _same, _same)
    if fn == "max":
        return Accumulator(spec, (f"max({x})",), _max, lambda p: p[0], lambda a: a, f"max({x})",
                           _same, _same)
    if fn == "avg":
        return Accumulator(
            spec, (f"sum(cast({x} as double))", f"count({x})"),
            lambda a, b: (_add(a[0], b[0]), a[1] + b[1]) if a and b else (a or b),
            lambda p: (p[0], p[1] or 0), _avg_final, f"avg({x})")
    if fn == "first":
        return Accumulator(
            spec, (f"min_by(struct({ts}, {seq}, {x}), struct({ts}, {seq}))",), _first,
            lambda p: _t(p[0]) if p[0] is not None else None,
            lambda a: a[2] if a else None, f"first({x})")
    if fn == "last":
        return Accumulator(
            spec, (f"max_by(struct({ts}, {seq}, {x}), struct({ts}, {seq}))",), _last,
            lambda p: _t(p[0]) if p[0] is not None else None,
            lambda a: a[2] if a else None, f"last({x})")
    if fn == "collect_list":
        return Accumulator(
            spec, (f"collect_list(struct({ts}, {seq}, {x}))",), _concat,
            lambda p: [t for t in map(_t, p[0] or []) if t[2] is not None],
            lambda a: [v[2] for v in sorted(a or [], key=lambda t: (t[0], t[1]))],
            f"collect_list({x})")
    if fn in ("max_by", "min_by"):
        value, order = spec.args
        # Spark's own max_by/min_by pick any row among equal orders: the partial takes the
        # earliest by making it the largest (smallest) of (order, -ts, -seq) ((order, ts,
        # seq) for min_by); a null order is skipped, as Spark skips it.
        sign = "-" if fn == "max_by" else ""
        return Accumulator(
            spec, (f"{fn}(named_struct('o', {order}, 't', {ts}, 's', {seq}, 'v', {value}), "
                   f"struct({order}, {sign}{ts}, {sign}{seq}))",),
            _by(fn == "max_by"), lambda p: _t(p[0]) if p[0] is not None else None,
            lambda a: a[3] if a else None, f"{fn}({value}, {order})")
    if fn == "count_distinct" and len(spec.args) > 1:
        # As SQL's count(distinct a, b): the combinations in which no value is null.
        nulls = " or ".join(f"({a}) is null" for a in spec.args)
        return Accumulator(spec, (f"collect_set(if({nulls}, null, struct({x})))",), _union,
                           lambda p: frozenset(map(_t, p[0] or ())), lambda a: len(a or ()),
                           f"count(distinct {x})")
    if fn == "count_distinct":
        return Accumulator(spec, (f"collect_set({x})",), _union,
                           lambda p: frozenset(p[0] or ()), lambda a: len(a or ()),
                           f"count(distinct {x})")
    msg = f"unknown aggregate {fn!r}"
    raise ValueError(msg)


def _signed(spec: AggregateSpec, sign: str) -> Accumulator:
    """`accumulator` over an update stream: the partials add each row's value times its
    sign, so a retracted value is subtracted from the key's total, count and average."""
    fn, x = spec.function, spec.arg
    if fn == "count":
        return Accumulator(spec, (f"sum({sign})",), _add, lambda p: p[0] or 0,
                           lambda a: a or 0, "count(1)", _zero_for_null, _zero_for_null)
    if fn == "sum":
        return Accumulator(spec, (f"sum({sign} * ({x}))",), _sum_merge(f"sum({x})"),
                           lambda p: p[0], lambda a: a, f"sum({x})", _same, _same)
    if fn == "avg":
        return Accumulator(
            spec, (f"sum({sign} * cast({x} as double))",
                   f"sum(if(({x}) is null, 0, {sign}))"),
            lambda a, b: (_add(a[0], b[0]), a[1] + b[1]) if a and b else (a or b),
            lambda p: (p[0], p[1] or 0), _avg_final, f"avg({x})")
    msg = f"{fn}() cannot take values back (an update stream's retractions)"
    raise ValueError(msg)
