"""JSON lines encoded by Arrow (`connectors.arrow.arrow_json_writer`) against Spark's JSON writer.

Every case is written both ways, byte for byte: by Spark, as a `jsonl` files sink writes
(`timestamps_as_iso`, `ignoreNullFields` off), and by `JsonLines.encode` with the rule of the
JVM Spark runs on. The encoder must give Spark's bytes or refuse.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamer.connectors.arrow.arrow_json_writer import (
    JsonLines,
    java_double,
    jvm_prints_shortest,
    quoted,
    unsupported,
)
from streamer.exceptions import ArrowRefused

pytestmark = pytest.mark.spark

DDL = "s string, n bigint, i int, d double, b boolean, t timestamp"
FIELDS = tuple((part.split()[0], part.split()[1]) for part in DDL.split(", "))
UTC = dt.UTC


def spark_bytes(spark: Any, rows: list[tuple[Any, ...]], ddl: str, where: Path) -> bytes:
    """What Spark's JSON writer writes for `rows`, as a jsonl files sink asks it to."""
    from streamer.connectors.formats import timestamps_as_iso

    shutil.rmtree(where, ignore_errors=True)
    df = spark.createDataFrame(rows, ddl)
    timestamps_as_iso(df).coalesce(1).write.option("ignoreNullFields", False).json(str(where))
    return b"".join(p.read_bytes() for p in sorted(where.glob("part-*")))


def arrow_bytes(spark: Any, rows: list[tuple[Any, ...]], ddl: str,
                fields: tuple[tuple[str, str], ...]) -> bytes:
    table = spark.createDataFrame(rows, ddl).toArrow()
    return JsonLines(fields, jvm_prints_shortest(spark)).encode(table).to_pybytes()


LISTED = [
    ("a\"b\\c", 1, 2, 3.0, True, dt.datetime(2026, 1, 1, 0, 0, 0, 120000, tzinfo=UTC)),
    ("\x00\x01\x08\t\n\x0b\x0c\r\x1f\x7f é \u2028 / \U0001f600", None, None, -0.0, None,
     dt.datetime(1000, 1, 1, tzinfo=UTC)),
    (None, -5, -(2**31), 1e7, False, dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
    ("", 2**63 - 1, 2**31 - 1, 12345678.0, True, None),
    ("x", -(2**63), 0, 9007199254740991.0, True, dt.datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)),
    ("y", 0, 0, 0.1, True, dt.datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=UTC)),
    ("z", 0, 0, float("nan"), True, dt.datetime(1970, 1, 1, tzinfo=UTC)),
    ("w", 0, 0, float("inf"), True, dt.datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=UTC)),
    ("v", 0, 0, -float("inf"), None, None), ("v", 0, 0, 1e-3, True, None),
    ("v", 0, 0, 9999999.0, True, None), ("v", 0, 0, 100.0, True, None),
    ("v", 0, 0, 9999999.75, True, None),
    ("v", 0, 0, -123.456, True, None), ("v", 0, 0, None, True, None),
]


def test_listed_rows_are_spark_bytes(spark: Any, tmp_path: Path) -> None:
    expected = spark_bytes(spark, LISTED, DDL, tmp_path / "spark")
    assert arrow_bytes(spark, LISTED, DDL, FIELDS) == expected
    assert expected.count(b"\n") == len(LISTED)


def test_repeated_timestamps_are_spark_bytes(spark: Any, tmp_path: Path) -> None:
    """Windows' bounds repeat: the encoder formats each distinct value once."""
    bounds = [dt.datetime(2026, 3, 1, 10, m, 0, 250000 * (m % 2), tzinfo=UTC) for m in (1, 2)]
    rows = [("k", i, i, float(i), True, bounds[i % 2] if i % 5 else None) for i in range(12)]
    assert arrow_bytes(spark, rows, DDL, FIELDS) == spark_bytes(spark, rows, DDL,
                                                                tmp_path / "w")


def test_whole_millisecond_timestamps_are_spark_bytes(spark: Any, tmp_path: Path) -> None:
    """Every value in whole milliseconds (the lookup of the clock and millisecond texts),
    before and after 1970, every millisecond digit pattern, every second of a day's ends;
    and with long doubles beside them (on Java 17, their digits are checked)."""
    import random

    rng = random.Random(5)
    stamps = [dt.datetime(1000, 1, 1, tzinfo=UTC), dt.datetime(9999, 12, 31, 23, 59, 59,
                                                               999000, tzinfo=UTC)]
    stamps += [dt.datetime(y, rng.randrange(1, 13), rng.randrange(1, 29), rng.randrange(24),
                           rng.randrange(60), rng.randrange(60), ms * 1000, tzinfo=UTC)
               for y, ms in zip((1969, 1970, 1601, 2026, 2038, 1899) * 40,
                                [0, 1, 10, 100, 120, 999, 500, 7] * 30, strict=False)]
    rows = [("k", i, i, -1234567.12345678 if i % 9 == 0 else float(i), True, t)
            for i, t in enumerate(stamps)]
    assert arrow_bytes(spark, rows, DDL, FIELDS) == spark_bytes(spark, rows, DDL,
                                                                tmp_path / "ms")


def test_field_names_are_quoted_as_spark_quotes_them(spark: Any, tmp_path: Path) -> None:
    ddl = "`we\"ird\\name` string, `tab\tname` bigint, `é` double"
    rows = [("a", 1, 1.5), (None, None, None)]
    fields = (("we\"ird\\name", "string"), ("tab\tname", "bigint"), ("é", "double"))
    assert arrow_bytes(spark, rows, ddl, fields) == spark_bytes(spark, rows, ddl,
                                                                tmp_path / "s")
    assert quoted("a\u0001b") == '"a\\u0001b"'


def test_an_empty_batch_is_no_bytes(spark: Any) -> None:
    assert arrow_bytes(spark, [], DDL, FIELDS) == b""


def test_years_outside_four_digits_are_refused(spark: Any) -> None:
    for year in (999, 1):
        rows = [("a", 1, 1, 1.0, True, dt.datetime(year, 6, 1, tzinfo=UTC))]
        with pytest.raises(ArrowRefused, match="1000-9999"):
            arrow_bytes(spark, rows, DDL, FIELDS)


def test_java_17_rule_refuses_what_it_cannot_be_sure_of() -> None:
    """Java 17 prints 4.6566128730773926E-10 for 2^-31 (shortest: ...393E-10) and
    9.999999999999999E22 for 1e23; under its rule such doubles are refused."""
    for value in (2.0 ** -31, 1e23, 0.30000000000000004, 0.000999, 2.0 ** 53 + 2, 5e-324):
        with pytest.raises(ArrowRefused):
            java_double(value, shortest=False)
    assert java_double(2.0 ** -31) == "4.656612873077393E-10"
    assert java_double(1e23) == "1.0E23"
    assert java_double(-0.0, shortest=False) == "-0.0"
    assert java_double(12345678.0, shortest=False) == "1.2345678E7"


def test_other_arrow_string_types_and_arrow_errors() -> None:
    """Large or view strings are encoded as strings; an Arrow error (here a struct where a
    string was declared) is a refusal, never a failed task."""
    import pyarrow as pa

    fields = (("s", "string"), ("n", "bigint"))
    for kind in (pa.large_string(), pa.string_view()):
        table = pa.table({"s": pa.array(["a", 'b"'], kind), "n": pa.array([1, None])})
        assert JsonLines(fields, False).encode(table).to_pybytes() == \
            b'{"s":"a","n":1}\n{"s":"b\\"","n":null}\n'
    odd = pa.table({"s": pa.array([{"a": 1}]), "n": pa.array([1])})
    with pytest.raises(ArrowRefused, match="could not render"):
        JsonLines(fields, False).encode(odd)


def test_other_types_are_named() -> None:
    assert unsupported(FIELDS) is None
    why = unsupported((("a", "string"), ("m", "map<string,int>")))
    assert why is not None
    assert "'m'" in why


ROWS = st.lists(st.tuples(
    st.one_of(st.none(), st.text(max_size=6)),
    st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
    st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)),
    st.one_of(st.none(), st.floats(), st.integers(-10**6, 10**6).map(lambda v: v / 100),
              st.integers(-2**53, 2**53).map(float)),
    st.one_of(st.none(), st.booleans()),
    st.one_of(st.none(), st.datetimes(dt.datetime(1000, 1, 1), dt.datetime(9999, 12, 31))
              .map(lambda v: v.replace(tzinfo=UTC)))), min_size=1, max_size=8)


@pytest.mark.slow
def test_generated_rows_are_spark_bytes_or_refused(spark: Any, tmp_path: Path) -> None:
    outcomes: list[str] = []

    @settings(max_examples=40, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(ROWS)
    def check(rows: list[tuple[Any, ...]]) -> None:
        try:
            got = arrow_bytes(spark, rows, DDL, FIELDS)
        except ArrowRefused:
            outcomes.append("refused")
            return
        assert got == spark_bytes(spark, rows, DDL, tmp_path / "g"), rows
        outcomes.append("same")

    check()
    assert outcomes.count("same") >= 20, outcomes


def doubles(count: int) -> list[float]:
    """Doubles as sinks see them: amounts with cents and their sums, whole numbers, means,
    values of every magnitude, powers of two and ten and their neighbours."""
    rng = random.Random(18)
    out: list[float] = []
    for _ in range(count):
        cents = [rng.randint(-10**6, 10**6) / 100 for _ in range(rng.randint(1, 30))]
        out += [cents[0], sum(cents), sum(cents) / len(cents), float(rng.randint(0, 2**53)),
                rng.uniform(-1e9, 1e9), rng.random() * 10.0 ** rng.randint(-12, 30),
                float(rng.randint(1, 99)) * 10.0 ** rng.randint(-8, 25)]
    for k in range(-40, 80):
        for v in (2.0 ** k, 10.0 ** (k // 2)):
            out += [v, math.nextafter(v, 0), math.nextafter(v, math.inf)]
    return out


def test_doubles_are_what_this_jvm_prints_or_refused(spark: Any, tmp_path: Path) -> None:
    """A campaign of 140,000 doubles written by Spark: each is printed as Spark printed it,
    or refused; amounts with cents and whole numbers are never refused."""
    values = doubles(20000)
    where = tmp_path / "doubles"
    spark.createDataFrame([(i, v) for i, v in enumerate(values)], "i bigint, d double") \
        .coalesce(1).write.json(str(where))
    jvm_shortest = jvm_prints_shortest(spark)
    printed, refused = 0, set()
    for part in sorted(where.glob("part-*")):
        for line in part.read_text().splitlines():
            index = int(line[5:line.index(",")])
            text = line[line.index('"d":') + 4:-1]
            try:
                mine = java_double(values[index], jvm_shortest)
            except ArrowRefused:
                refused.add(index)
                continue
            assert mine == text, (values[index], text, mine)
            printed += 1
    assert printed + len(refused) == len(values)
    plain = [i for i in range(20000 * 7) if i % 7 in (0, 3)]  # (cents, whole numbers)
    assert not refused.intersection(plain)
    assert printed > len(values) // 3, (printed, len(refused))
