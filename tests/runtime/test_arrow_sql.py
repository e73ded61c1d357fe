"""Stateless operators on Arrow (`runtime.arrow.arrow_sql`) against Spark, the definition.

Each case compiles a chain of filters and derived columns with Spark's analyzer and runs it
both ways over generated rows (nulls, NaN, -0.0, the integer limits): the program either
refuses the rows or gives exactly Spark's result; expressions it cannot translate are named.
"""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from streamer.exceptions import ArrowRefused as Refused
from streamer.pipeline.spec import OperatorSpec
from streamer.runtime.arrow.arrow_sql import Program, compile_ops

pytestmark = pytest.mark.spark

DDL = "id bigint, n int, amount double, user string, ok boolean, ts timestamp"


def op(kind: str, text: str | dict[str, str], index: int = 0) -> OperatorSpec:
    """A filter (`text` its condition) or with_columns/select (`text` name -> expression)."""
    if kind == "filter":
        assert isinstance(text, str)
        return OperatorSpec(id=f"op{index}", inputs=("src",), kind=kind, path=Path("p.yaml"),
                            uid=f"op{index}", filter=text)
    assert isinstance(text, dict)
    return OperatorSpec(id=f"op{index}", inputs=("src",), kind=kind, path=Path("p.yaml"),
                        uid=f"op{index}", columns=tuple(text.items()))


CHAINS = [
    [op("filter", "amount >= 10"), op("with_columns", {"amount": "amount * 2 + 1"}, 1)],
    [op("filter", "n > 3 AND user IS NOT NULL OR NOT ok")],
    [op("with_columns", {"m": "id + n", "k": "n * n - 7", "neg": "-amount", "q": "amount / 4"})],
    [op("with_columns", {"big": "id * 3"}), op("filter", "big <> 0 OR amount <=> 1.5", 1)],
    [op("filter", "user = 'u1' OR user < 'u' OR ts IS NULL")],
    [op("select", {"user": "user", "twice": "amount + amount", "idd": "CAST(n AS DOUBLE) / id"})],
    [op("filter", "amount = amount AND -n < 5 AND ok <=> true")],
    [op("with_columns", {"t": "timestamp_millis(id)", "u": "timestamp_micros(n)"}),
     op("filter", "t > timestamp_millis(0) OR u IS NULL", 1)],
    [op("with_columns", {"r": "id % n", "s": "n % 3", "t": "id % -1", "u": "-7 % n"}),
     op("filter", "r <> 0 OR s = 1", 1)],
    [op("with_columns", {"d": "0.908 * id", "e": "0.5 * n + 1.25", "f": "CAST(n AS DECIMAL(12,2))",
                         "g": "-(0.908 * id) - 1"}),
     op("filter", "d > 1000000 OR e < 0 OR f = 2.00", 1)],
    [op("select", {"a": "get(split(user, '/'), 1)", "b": "get(split(user, '/'), n)",
                   "c": "get(split(user, 'u'), 0)", "n": "n"})],
    [op("with_columns", {
        "h": "hour(ts)", "w": "CASE WHEN n > 1 THEN n END", "e": "replace(user, '', 'x')",
        "part": "CASE WHEN hour(ts) >= 8 AND hour(ts) <= 18 THEN 'day' WHEN hour(ts) <= 6 "
                "OR ok THEN 'night' ELSE 'other' END",
        "c": "length(user) - length(replace(user, 'u', ''))", "r": "replace(user, '/', 'é/')"}),
     op("filter", "part <> 'other' OR c > 0", 1)],
]
#: Times of day on either side of the CASE's hours (UTC, the session's zone).
TIMES = [datetime.datetime(2026, 11, 29, h, 30, tzinfo=datetime.UTC) for h in (0, 6, 7, 8, 18, 19)]

ROWS = st.lists(st.fixed_dictionaries({
    "id": st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.integers(-5, 5)),
    "n": st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1), st.integers(-5, 5)),
    "amount": st.one_of(st.none(), st.floats(), st.sampled_from([0.0, -0.0, 1.5, 10.0])),
    "user": st.one_of(st.none(), st.sampled_from(["u1", "u2", "", "é", "a", "/a//u/", "x/é"])),
    "ok": st.one_of(st.none(), st.booleans()),
    "ts": st.one_of(st.none(), st.sampled_from(TIMES))}), max_size=12)
#: Rows no chain overflows or divides by zero on.
SMALL = [{"id": 3, "n": 2, "amount": 12.5, "user": "u1", "ok": True, "ts": None},
         {"id": -4, "n": 5, "amount": None, "user": None, "ok": False, "ts": None}]


def spark_result(spark: Any, rows: list[dict[str, Any]], ops: list[OperatorSpec]) -> Any:
    """Spark's result of the chain over `rows`, or the exception it raised."""
    from streamer.operators.stateless import apply_stateless

    names = [part.split()[0] for part in DDL.split(", ")]
    df = spark.createDataFrame([tuple(r[c] for c in names) for r in rows], DDL)
    for one in ops:
        df = apply_stateless(one, df)
    try:
        return df.toArrow()
    except Exception as exc:  # (an ANSI overflow or division by zero)
        return exc


def same(a: Any, b: Any) -> bool:
    if a.column_names != b.column_names or a.num_rows != b.num_rows:
        return False
    import pyarrow as pa

    for x, y in zip(a.schema.types, b.schema.types, strict=True):
        # (a decimal's type is part of its value: its scale; an int is not a bigint)
        if any(f(t) for f in (pa.types.is_decimal, pa.types.is_integer) for t in (x, y)) \
                and x != y:
            return False
    for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True):
        for key in x:
            u, v = x[key], y[key]
            if isinstance(u, float) and isinstance(v, float):
                if not ((math.isnan(u) and math.isnan(v))
                        or (u == v and math.copysign(1, u) == math.copysign(1, v))):
                    return False
            elif u != v:
                return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("chain", range(len(CHAINS)))
def test_programs_compute_what_spark_computes(spark: Any, chain: int) -> None:
    from pyspark.sql.types import StructType

    ops = CHAINS[chain]
    program = compile_ops(spark, StructType.fromDDL(DDL), ops)
    assert isinstance(program, Program), program
    outcomes: list[str] = []

    @settings(max_examples=30, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(ROWS)
    @example(SMALL)
    def check(rows: list[dict[str, Any]]) -> None:
        import pyarrow as pa

        expected = spark_result(spark, rows, ops)
        table = pa.Table.from_pylist(rows, schema=spark.createDataFrame([], DDL).toArrow()
                                     .schema)
        try:
            got, counts = program.run(table)
        except Refused:
            outcomes.append("refused")
            return
        assert not isinstance(expected, Exception), f"Spark failed: {expected}; Arrow {got}"
        assert same(got, expected), f"{rows}: Arrow {got.to_pylist()} != Spark " \
                                    f"{expected.to_pylist()}"
        for one in ops:
            if one.kind == "filter":
                assert counts[one.id][1] <= counts[one.id][0]
        outcomes.append("same")

    check()
    # Not vacuous: small values are Arrow's to compute, and so are many generated row sets
    # (those with an integer near its limits are refused, in some chains most of them).
    assert outcomes[0] == "same", outcomes
    assert outcomes.count("same") >= 5, outcomes


@pytest.mark.parametrize(("text", "why"), [
    ("upper(user) = 'U1'", "upper"), ("CAST(amount AS DECIMAL(10,2)) > 0", "decimal"),
    ("CAST(user AS INT) > 1", "cast from string"), ("ts > '2026-01-01'", "cast from string"),
    ("CAST(id AS DECIMAL(38,0)) * 1.5 > 0", "decimal arithmetic that spark rounds"),
    ("id / 1.5 > 0", "decimal"), ("get(split(user, '.'), 0) = 'a'", "regular expression"),
    ("get(split(user, '/', 2), 0) = 'a'", "a limit"), ("amount % 2 > 0", "remainder")])
def test_what_is_not_translated_is_named(spark: Any, text: str, why: str) -> None:
    from pyspark.sql.types import StructType

    found = compile_ops(spark, StructType.fromDDL(DDL), [op("filter", text)])
    assert isinstance(found, str)
    assert why in found.lower(), found


def test_overflow_and_division_by_zero_are_refused(spark: Any) -> None:
    import pyarrow as pa
    from pyspark.sql.types import StructType

    table = pa.table({"id": pa.array([2**62, None], pa.int64()), "n": pa.array([1, 2], pa.int32()),
                      "amount": [1.0, 0.0], "user": ["a", "b"], "ok": [True, False],
                      "ts": pa.array([None, None], pa.timestamp("us", tz="UTC"))})

    def program(expr: str) -> Program:
        found = compile_ops(spark, StructType.fromDDL(DDL), [op("with_columns", {"x": expr})])
        assert isinstance(found, Program), found
        return found

    for expr in ("id * 2", "1.0D / amount", "CAST(id AS DECIMAL(5,0))"):
        with pytest.raises(Refused):
            program(expr).run(table)
    with pytest.raises(Refused, match="division by zero"):
        program("id % (n - 1)").run(table)
    nulls = program("id + 1")  # a null slot holding garbage does not overflow
    got, _ = nulls.run(table.set_column(0, "id", pa.array([1, None], pa.int64())))
    assert got.column("x").to_pylist() == [2, None]


def test_an_hour_in_a_session_zone_that_is_not_utc_is_left_to_spark(spark: Any) -> None:
    from pyspark.sql.types import StructType

    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        found = compile_ops(spark, StructType.fromDDL(DDL), [op("filter", "hour(ts) > 3")])
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    assert isinstance(found, str)
    assert "hour(ts)" in found, found
    assert isinstance(compile_ops(spark, StructType.fromDDL(DDL), [op("filter", "hour(ts) > 3")]),
                      Program)
