"""Arrow's decode of JSON lines against Spark's, the definition (`connectors.arrow.arrow_json`).

Every case is decoded both ways: by `connectors.formats.decode_json_lines` in a real Spark
session (what a `files` source does) and by `arrow_json.decode`. The decoder must either
refuse (Spark then decodes the file) or give exactly Spark's records; and it must refuse
every file in which Spark finds a bad record. Cases are the differences found by trying
both readers, and generated lines of mixed values.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamer.connectors.arrow.arrow_json import decode
from streamer.exceptions import ArrowRefused as Refused

pytestmark = pytest.mark.spark

COLUMNS = (("a", "bigint"), ("i", "int"), ("d", "double"), ("s", "string"), ("b", "boolean"),
           ("t", "timestamp"))


def spark_decode(spark: Any, lines: list[bytes]) -> tuple[list[dict[str, Any]], int]:
    """Spark's records of these lines and how many bad records it found."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from streamer.connectors.formats import decode_json_lines
    from streamer.pipeline.spec import SourceSpec

    struct = StructType.fromDDL(", ".join(f"{n} {k}" for n, k in COLUMNS))
    text = spark.createDataFrame([(line.decode("utf-8", "replace"),) for line in lines],
                                 "value string")
    df = text.select("value", F.lit("f").alias("split"), F.lit("0").alias("offset"))
    spec = SourceSpec(id="src", type="files", uid="src", schema=None, event_time=None,
                      watermark=None, on_error="dead", options={}, path=Path("p.yaml"))
    read = decode_json_lines(spark, df, struct, spec)
    assert read.dead_letters is not None
    return read.records.toArrow().to_pylist(), read.dead_letters.count()


def same(left: list[dict[str, Any]], right: list[dict[str, Any]]) -> bool:
    """Row lists equal, NaN equal to NaN, -0.0 told from 0.0, timestamps as instants."""
    if len(left) != len(right):
        return False
    for a, b in zip(left, right, strict=True):
        for name, _ in COLUMNS:
            x, y = a[name], b[name]
            if isinstance(x, float) and isinstance(y, float):
                if not ((x == y and math.copysign(1, x) == math.copysign(1, y))
                        or (math.isnan(x) and math.isnan(y))):
                    return False
            elif hasattr(x, "timestamp") and hasattr(y, "timestamp"):
                if x.timestamp() != y.timestamp() or x.microsecond != y.microsecond:
                    return False
            elif x != y or type(x) is not type(y):
                return False
    return True


def check(spark: Any, lines: list[bytes], *, sep: bytes = b"\n") -> str:
    """Decode both ways; 'refused' or 'same', failing on any other outcome."""
    data = sep.join(lines) + sep
    try:
        table = decode(data, COLUMNS)
    except Refused:
        return "refused"
    rows, bad = spark_decode(spark, [ln for ln in data.split(b"\n") if ln.strip(b" ")]
                             if sep == b"\n" else lines)
    assert bad == 0, f"Arrow took a file in which Spark finds {bad} bad records: {data!r}"
    got = table.to_pylist()
    assert same(got, rows), f"{data!r}: Arrow {got} != Spark {rows}"
    return "same"


CASES: list[tuple[list[bytes], str]] = [
    ([b'{"a": 1, "i": 2, "d": 1.5, "s": "x", "b": true, "t": "2026-01-01T00:00:00Z"}'], "same"),
    ([b'{"a": -9223372036854775808, "i": -2147483648, "d": -0.0, "s": "", "b": false}'],
     "same"),
    ([b'{"d": NaN}', b'{"d": Infinity}', b'{"d": -Infinity}', b'{"d": 1e-400}'], "same"),
    ([b'{"d": 1}', b'{"d": 123456789012345678901234567890}', b'{"d": 0.1}'], "same"),
    ([b'{"d": 1.7976931348623157e308}', b'{"d": 4.9e-324}', b'{"d": 2.2250738585072011e-308}'],
     "same"),
    ([b'{"t": "2026-01-01 00:00:00"}', b'{"t": "2026-01-01T00:00:00.5"}',
      b'{"t": "2026-02-28T23:59:59.999999+05:30"}', b'{"t": "1999-12-31T23:59:59-08:00"}'],
     "same"),
    ([b'{"s": "a\\u0000b\\n\\"\\u00e9\\ud83d\\ude00"}', b'{"s": "\xc3\xa9"}'], "same"),
    ([b'{"x": [1, {"y": 2}], "z": null, "a": 3}', b'{}', b'{"A": 1, "a": 2}'], "same"),
    ([b'  {"a": 1}  ', b'\t{"a": 2}\t', b'    ', b'{"a": 3}'], "same"),
    ([b'{"a": null, "s": null, "t": null, "b": null}'], "same"),
    # Spark finds a bad record in each of these (or reads it differently): refused
    ([b'{"a": 1.0}'], "refused"), ([b'{"a": 1e2}'], "refused"), ([b'{"a": "1"}'], "refused"),
    ([b'{"a": 9223372036854775808}'], "refused"), ([b'{"i": 2147483648}'], "refused"),
    ([b'{"s": 5}'], "refused"), ([b'{"s": {"x": 1}}'], "refused"), ([b'{"b": 1}'], "refused"),
    ([b'{"b": "true"}'], "refused"), ([b'{"d": "NaN"}'], "refused"), ([b'{"d": 1e400}'], "refused"),
    ([b'null'], "refused"), ([b'5'], "refused"), ([b'[{"a": 1}]'], "refused"),
    ([b'{"a": 1}{"a": 2}'], "refused"), ([b'{"a": 1} {"a": 2}'], "refused"),
    ([b'{"x": "}{"}'], "refused"), ([b'{"a": 1,}'], "refused"), ([b"{'a': 1}"], "refused"),
    ([b'{"a": 01}'], "refused"), ([b'{"a": 1, "a": 2}'], "refused"), ([b'{"a": 1'], "refused"),
    ([b'{"a": 1} x'], "refused"), ([b'\t'], "refused"), ([b'{"s": "\xff"}'], "refused"),
    ([b'{"x": [{}', b'{}]}', b'{"a": 1}{"a": 2}'], "refused"),
    ([b'{"t": "2026-02-30T00:00:00Z"}'], "refused"), ([b'{"t": "2026-01-01"}'], "refused"),
    ([b'{"t": "2026-01-01T24:00:00Z"}'], "refused"), ([b'{"t": 1767225600}'], "refused"),
    ([b'{"t": "2026-01-01T00:00:00.1234567Z"}'], "refused"),
    ([b'{"t": "2026-01-01T00:00:00 UTC"}'], "refused"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("lines", "outcome"), CASES)
def test_arrow_decodes_as_spark_does_or_refuses(spark: Any, lines: list[bytes],
                                                outcome: str) -> None:
    assert check(spark, lines) == outcome


@pytest.mark.parametrize(("lines", "outcome"), CASES)
def test_compact_lines_decode_as_spark_does_or_refuse(spark: Any, lines: list[bytes],
                                                      outcome: str) -> None:
    """The cases without blanks between tokens, the form the shaped reader takes
    (`arrow_json_shaped`): Spark's records or refused, as before."""
    compact = [ln.replace(b'": ', b'":').replace(b', "', b',"') for ln in lines]
    assert check(spark, compact) in (outcome, "same" if outcome == "refused" else outcome)


def test_line_ends(spark: Any) -> None:
    lines = [b'{"a": 1}', b'{"a": 2}']
    assert check(spark, lines, sep=b"\r\n") == "same"
    assert decode(b'{"a": 1}\r\n\r\n  \r\n{"a": 2}', COLUMNS).num_rows == 2
    with pytest.raises(Refused):
        decode(b'{"a": 1}\r{"a": 2}\r', COLUMNS)
    assert decode(b"", COLUMNS).num_rows == 0
    assert decode(b"\n\n   \n", COLUMNS).num_rows == 0


JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**64), 2**64),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6),
    st.sampled_from(["2026-01-01T00:00:00Z", "2026-03-01 12:30:00.25", "2026-13-01T00:00:00Z",
                     "2026-01-01T00:00:00+01:30", "x"]))


#: Values of each column's own JSON type (floats with NaN and infinities, which `json.dumps`
#: writes as Arrow and Spark both read them).
TYPED = {"a": st.integers(-(2**63), 2**63 - 1), "i": st.integers(-(2**31), 2**31 - 1),
         "d": st.one_of(st.floats(), st.integers(-(2**70), 2**70)), "s": st.text(max_size=8),
         "b": st.booleans(),
         "t": st.tuples(st.datetimes(), st.sampled_from(["T", " "]),
                        st.sampled_from(["Z", "", "+05:30", "-08:00"])).map(
             lambda p: p[0].isoformat(sep=p[1]) + p[2])}
SETTINGS = settings(max_examples=25, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))


@pytest.mark.slow
@SETTINGS
@given(st.lists(st.fixed_dictionaries({}, optional={n: st.one_of(st.none(), TYPED[n])
                                                    for n, _ in COLUMNS}),
                min_size=1, max_size=6))
def test_generated_typed_lines(spark: Any, records: list[dict[str, Any]]) -> None:
    """Lines of values of each column's type: Arrow's decode is Spark's."""
    outcome = check(spark, [json.dumps(r).encode() for r in records])
    years = [r["t"][:4] for r in records if r.get("t")]
    assert outcome == "same" or any(y < "1000" for y in years), records


@pytest.mark.slow
@SETTINGS
@given(st.lists(st.fixed_dictionaries({n: TYPED[n] for n, _ in COLUMNS if n != "b"}),
                min_size=1, max_size=6))
def test_generated_lines_of_one_shape(spark: Any, records: list[dict[str, Any]]) -> None:
    """Compact lines, every field in one order (what the shaped reader takes): Spark's."""
    lines = [json.dumps(r, separators=(",", ":")).encode() for r in records]
    outcome = check(spark, lines)
    assert outcome == "same" or any(r["t"][:4] < "1000" for r in records), records


@pytest.mark.slow
@SETTINGS
@given(st.lists(st.dictionaries(st.sampled_from([n for n, _ in COLUMNS] + ["other"]),
                                JSON_VALUES, max_size=4), min_size=1, max_size=6))
def test_generated_mixed_lines(spark: Any, records: list[dict[str, Any]]) -> None:
    """Lines of values of any type: each file is refused or decoded as Spark decodes it."""
    check(spark, [json.dumps(r).encode() for r in records])


#: Timestamps written by one writer: one form, one width (what `_fixed_iso` takes).
FORMS = st.tuples(st.sampled_from(["T", " "]), st.integers(0, 6), st.booleans())


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(FORMS, st.lists(st.datetimes(min_value=__import__("datetime").datetime(1000, 1, 1)),
                       min_size=1, max_size=5),
       st.lists(st.tuples(st.integers(0, 4), st.integers(0, 26), st.one_of(
           st.sampled_from([c.encode() for c in "0123569TZ :-.+"]),
           st.binary(min_size=1, max_size=1))), max_size=2))
def test_the_byte_check_of_timestamps_never_passes_what_the_pattern_refuses(
        form: tuple[str, int, bool], stamps: list[Any],
        edits: list[tuple[int, int, bytes]]) -> None:
    """`_fixed_iso` (the fast check) says yes only where `ISO` matches every value, and says
    yes to every unedited column of one form; a byte edited anywhere is caught by one of
    them."""
    import re

    import pyarrow as pa

    from streamer.connectors.arrow.arrow_json import ISO, _fixed_iso

    sep, digits, zone = form
    texts = [s.strftime(f"%Y-%m-%d{sep}%H:%M:%S") + (
        f".{s.microsecond:06d}"[:digits + 1] if digits else "") + ("Z" if zone else "")
        for s in stamps]
    column = pa.array(texts, pa.string())
    assert _fixed_iso(column), texts
    raw = [t.encode() for t in texts]
    for row, at, byte in edits:
        if row < len(raw) and at < len(raw[row]):
            raw[row] = raw[row][:at] + byte + raw[row][at + 1:]
    try:
        edited = [r.decode() for r in raw]
    except UnicodeDecodeError:
        return
    fast = _fixed_iso(pa.array(edited, pa.string()))
    pattern = all(re.match(ISO, t) for t in edited)
    assert not fast or pattern, edited
    if len(edited) > 1:  # (a slice: the array's offset into its buffers)
        sliced = _fixed_iso(pa.array(edited, pa.string()).slice(1))
        assert not sliced or all(re.match(ISO, t) for t in edited[1:]), edited


@pytest.mark.parametrize("bad", [
    "2026-00-01T00:00:00.000Z", "2026-13-01T00:00:00.000Z", "2026-01-00T00:00:00.000Z",
    "2026-01-32T00:00:00.000Z", "2026-01-01T24:00:00.000Z", "2026-01-01T00:60:00.000Z",
    "2026-01-01T00:00:60.000Z", "0999-01-01T00:00:00.000Z", "2026-01-01t00:00:00.000Z",
    "2026/01-01T00:00:00.000Z", "2026-01-01T00-00:00.000Z", "2026-01-01T00:00:00,000Z",
    "2026-01-01T00:00:00.00aZ", "2026-01-01T00:00:00.000z", "+026-01-01T00:00:00.000Z"])
def test_the_byte_check_refuses_each_field_out_of_its_range(bad: str) -> None:
    """A column of one width with one value `ISO` refuses: the fast check says no (so the
    pattern decides, and refuses the file)."""
    import re

    import pyarrow as pa

    from streamer.connectors.arrow.arrow_json import ISO, _fixed_iso

    assert not re.match(ISO, bad)
    good = "2026-01-01T12:34:56.789Z"
    assert _fixed_iso(pa.array([good, good], pa.string()))
    assert not _fixed_iso(pa.array([good, bad], pa.string()))
    assert not _fixed_iso(pa.array([bad, good], pa.string()))
