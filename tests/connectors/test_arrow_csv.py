"""Arrow's decode of CSV files against Spark's, the definition (`connectors.arrow.arrow_csv`).

Every case is written as a file and read both ways: by Spark's CSV reader with the options a
`files` source gives it (`connectors.files.files_source`: the schema plus a corrupt-record column,
PERMISSIVE, `header`, `sep`) and by `arrow_csv.decode`. The decoder must either refuse (Spark
then reads the file) or give exactly Spark's records; and it must refuse every file in which
Spark finds a bad record. Cases are the differences found by trying both readers, and
generated files of mixed values.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_arrow_json import COLUMNS, same

from streamer.connectors.arrow.arrow_csv import decode
from streamer.exceptions import ArrowRefused as Refused

pytestmark = pytest.mark.spark

HEADER = ",".join(name for name, _ in COLUMNS).encode()


def spark_read(spark: Any, path: Path, header: bool, sep: str) -> tuple[list[dict[str, Any]], int]:
    """Spark's records of the file and how many bad records it found, read as
    `FilesSource.read` reads CSV."""
    from pyspark.sql.types import StringType, StructField, StructType

    struct = StructType.fromDDL(", ".join(f"{n} {k}" for n, k in COLUMNS))
    schema = StructType([*struct.fields, StructField("_corrupt", StringType())])
    df = (spark.read.schema(schema).option("header", header).option("sep", sep)
          .option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", "_corrupt")
          .csv(str(path)))
    rows = [r.asDict() for r in df.collect()]
    bad = sum(1 for r in rows if r.pop("_corrupt") is not None)
    return rows, bad


def check(spark: Any, tmp_path: Path, lines: list[bytes], *, header: bool = True,
          sep: str = ",", raw: bytes | None = None) -> str:
    """Read `lines` (after a header line, with `header`) both ways; 'refused' or 'same',
    failing on any other outcome."""
    data = raw if raw is not None else b"".join(
        line + b"\n" for line in ([HEADER] if header else []) + lines)
    path = tmp_path / f"case-{len(list(tmp_path.iterdir()))}.csv"
    path.write_bytes(data)
    try:
        table = decode(data, COLUMNS, header=header, delimiter=sep)
    except Refused:
        return "refused"
    rows, bad = spark_read(spark, path, header, sep)
    assert bad == 0, f"Arrow took a file in which Spark finds {bad} bad records: {data!r}"
    got = table.to_pylist()
    assert same(got, rows), f"{data!r}: Arrow {got} != Spark {rows}"
    return "same"


CASES: list[tuple[list[bytes], str]] = [
    ([b"1,2,1.5,x,true,2026-01-01T00:00:00Z"], "same"),
    ([b"-9223372036854775808,-2147483648,-0.0,,false,2026-01-01T00:00:00.000Z"], "same"),
    ([b"9223372036854775807,2147483647,-0,  spaced  ,true,1999-12-31T23:59:59-08:00"], "same"),
    ([b",,,,,"], "same"),
    ([b"0,0,NaN,a,true,", b"0,0,Infinity,b,false,", b"0,0,-Infinity,c,true,",
      b"0,0,Inf,d,true,", b"0,0,-Inf,e,true,"], "same"),
    ([b"0,0,1.0E7,x,true,", b"0,0,1e-400,x,true,", b"0,0,4.9E-324,x,true,",
      b"0,0,1.7976931348623157E308,x,true,", b"0,0,123456789012345678901234567890,x,true,",
      b"0,0,0.1,x,true,", b"0,0,007,x,true,", b"0,0,1e400,x,true,"], "same"),
    ([b"0,0,0,x,true,2026-01-01 00:00:00", b"0,0,0,x,true,2026-01-01T00:00:00.5",
      b"0,0,0,x,true,2026-02-28T23:59:59.999999+05:30", b"00,-0,0,x,true,"], "same"),
    ([b"0,0,0,\xc3\xa9 \xf0\x9f\x98\x80 ;|\t,true,"], "same"),
    ([b"1,1,1,x,true,", b"", b"", b"2,2,2,y,false,"], "same"),
    # Spark finds a bad record in each of these, reads it differently, or may: refused
    ([b"1.0,0,0,x,true,"], "refused"), ([b"1e2,0,0,x,true,"], "refused"),
    ([b"+1,0,0,x,true,"], "refused"), ([b" 1,0,0,x,true,"], "refused"),
    ([b"9223372036854775808,0,0,x,true,"], "refused"), ([b"0,2147483648,0,x,true,"], "refused"),
    ([b"0,0, 1.5,x,true,"], "refused"), ([b"0,0,1.,x,true,"], "refused"),
    ([b"0,0,.5,x,true,"], "refused"), ([b"0,0,0x1p3,x,true,"], "refused"),
    ([b"0,0,1d,x,true,"], "refused"), ([b"0,0,nan,x,true,"], "refused"),
    ([b"0,0,0,x,TRUE,"], "refused"), ([b"0,0,0,x,1,"], "refused"),
    ([b'0,0,0,"x",true,'], "refused"), ([b"0,0,0,x\\,y,true,"], "refused"),
    ([b"0,0,0,x,true"], "refused"), ([b"0,0,0,x,true,,"], "refused"),
    ([b"0,0,0,x,true,2026-02-30T00:00:00Z"], "refused"),
    ([b"0,0,0,x,true,2026-01-01"], "refused"),
    ([b"0,0,0,x,true,2026-01-01T00:00:00 UTC"], "refused"),
    ([b"0,0,0,\xff,true,"], "refused"), ([b"1,1,1,x,true,", b"   "], "refused"),
    ([b"1,1,1,x,true,", b"\x00,1,1,x,true,"], "refused"),
]


@pytest.mark.parametrize(("lines", "outcome"), CASES)
def test_arrow_reads_as_spark_does_or_refuses(spark: Any, tmp_path: Path, lines: list[bytes],
                                              outcome: str) -> None:
    assert check(spark, tmp_path, lines) == outcome


@pytest.mark.slow
def test_header_delimiters_and_line_ends(spark: Any, tmp_path: Path) -> None:
    row = b"1,2,1.5,x,true,2026-01-01T00:00:00Z"
    # Without a header every line is a record; with one, the first non-empty line is not.
    assert check(spark, tmp_path, [row, row], header=False) == "same"
    assert check(spark, tmp_path, [], raw=b"\n\n" + HEADER + b"\n" + row) == "same"
    assert check(spark, tmp_path, [], raw=HEADER) == "same"
    assert check(spark, tmp_path, [], raw=b"") == "same"
    assert check(spark, tmp_path, [], raw=HEADER + b"\n" + row + b"\n\n") == "same"
    for sep in (";", "|", "\t"):
        lines = [row.replace(b",", sep.encode())]
        head = HEADER.replace(b",", sep.encode())
        assert check(spark, tmp_path, [], sep=sep, raw=head + b"\n" + lines[0]) == "same"
    # A carriage return, a byte order mark, another delimiter: Spark's to read.
    assert check(spark, tmp_path, [], raw=HEADER + b"\r\n" + row + b"\r\n") == "refused"
    assert check(spark, tmp_path, [], raw=b"\xef\xbb\xbf" + HEADER + b"\n" + row) == "refused"
    assert check(spark, tmp_path, [], sep=":", raw=row.replace(b",", b":")) == "refused"


#: Per type, text in the forms the decoder takes (every file of it must be read alike)...
CLEAN = {
    "bigint": st.one_of(st.integers(-(2**63), 2**63 - 1).map(str), st.just("")),
    "int": st.integers(-(2**31), 2**31 - 1).map(str),
    "double": st.one_of(st.floats(allow_nan=False, allow_infinity=False).map(repr),
                        st.floats(width=32, allow_nan=False, allow_infinity=False).map(str),
                        st.integers().map(str),
                        st.sampled_from(["NaN", "Infinity", "-Infinity", "Inf", "-Inf",
                                         "1.0E7", "-0.0", "1e400", "4.9E-324", ""])),
    "string": st.text(st.characters(blacklist_categories=("Cs",),
                                    blacklist_characters=',\n\r"\\\x00'), max_size=8),
    "boolean": st.sampled_from(["true", "false", ""]),
    "timestamp": st.one_of(
        st.datetimes(min_value=datetime(1000, 1, 1)).map(lambda d: d.isoformat()),
        st.datetimes(min_value=datetime(1000, 1, 1)).map(lambda d: d.isoformat(" ") + "Z"),
        st.sampled_from(["2026-01-01 00:00:00.123+01:00", ""])),
}
#: ... and mixed with text it refuses (Spark's to read, rightly or not).
MIXED = {
    "bigint": st.one_of(CLEAN["bigint"], st.sampled_from(
        ["1.0", "+1", "9223372036854775808", " 1", "1e3"])),
    "int": st.one_of(CLEAN["int"], st.sampled_from(["2147483648", "", "-0", "01"])),
    "double": st.one_of(CLEAN["double"], st.floats().map(repr),
                        st.sampled_from(["1.", ".5", "nan", "inf", " 1"])),
    "string": st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters=",\n"),
                      max_size=8),
    "boolean": st.sampled_from(["true", "false", "TRUE", "1", ""]),
    "timestamp": st.one_of(CLEAN["timestamp"], st.sampled_from(
        ["2026-01-01", "2026-13-01T00:00:00Z", "2026-01-01T00:00:00 UTC"])),
}
SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def rows_of(kinds: dict[str, Any]) -> Any:
    return st.lists(st.tuples(*[kinds[kind] for _, kind in COLUMNS]), min_size=1, max_size=6)


@pytest.mark.slow
@SETTINGS
@given(rows_of(CLEAN))
def test_generated_clean_files_are_read_alike(spark: Any, tmp_path: Path,
                                              rows: list[tuple[str, ...]]) -> None:
    assert check(spark, tmp_path, [",".join(row).encode() for row in rows]) == "same"


@SETTINGS
@given(rows_of(MIXED))
def test_generated_mixed_files(spark: Any, tmp_path: Path, rows: list[tuple[str, ...]]) -> None:
    check(spark, tmp_path, [",".join(row).encode() for row in rows])
