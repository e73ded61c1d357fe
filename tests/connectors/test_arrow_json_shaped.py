"""The shaped reader of JSON lines against Arrow's JSON reader
(`connectors.arrow.arrow_json_shaped`).

Its promise: where it gives a table, Arrow's JSON reader with the same explicit schema gives
the same table; where it is not sure it says None. Files are generated in one shape and then
edited byte by byte, and the cases below are each of its conditions. (The decode as a whole
against Spark, through this reader where the lines are compact: test_arrow_json.py.)
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.json as pj
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamer.connectors.arrow.arrow_json_shaped import read_shaped

SCHEMA = pa.schema([("a", pa.int64()), ("i", pa.int32()), ("d", pa.float64()),
                    ("s", pa.string()), ("t", pa.string())])


def arrow(data: bytes, schema: Any = SCHEMA) -> Any:
    """Arrow's JSON reader's table (as `arrow_json.decode` calls it), or None if it fails."""
    try:
        return pj.read_json(pa.py_buffer(data), read_options=pj.ReadOptions(use_threads=False),
                            parse_options=pj.ParseOptions(explicit_schema=schema,
                                                          newlines_in_values=False,
                                                          unexpected_field_behavior="ignore"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def agrees(data: bytes, schema: Any = SCHEMA) -> Any:
    """The shaped table, asserted equal to Arrow's where there is one; None where not."""
    got = read_shaped(data, schema)
    if got is not None:
        want = arrow(data, schema)
        assert want is not None, f"shaped read a file Arrow's reader refuses: {data!r}"
        assert got.schema == want.schema, data
        assert got.combine_chunks().equals(want.combine_chunks()), \
            f"{data!r}: {got.to_pylist()} != {want.to_pylist()}"
    return got


def compact(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()


#: Text without what JSON escapes (quotes, backslashes, control characters) or a comma
#: (which gives its row another width: not read, a case below).
PLAIN = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters='",\\',
                              min_codepoint=32), max_size=8)
VALUES = {"a": st.integers(-(2**63), 2**63 - 1), "i": st.integers(-(2**31), 2**31 - 1),
          "d": st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                         st.integers(-(2**70), 2**70)),
          "s": PLAIN, "t": PLAIN, "other": st.one_of(PLAIN, st.integers(), st.floats(
              allow_nan=False, allow_infinity=False))}


@st.composite
def shaped_files(draw: Any) -> tuple[list[str], list[dict[str, Any]]]:
    """Records of one shape: some of the fields, in some order, one kind each."""
    keys = draw(st.lists(st.sampled_from(list(VALUES)), min_size=1, unique=True))
    kinds = {k: draw(VALUES[k]) for k in keys}  # (a first value fixes "other"'s kind)
    rows = []
    for _ in range(draw(st.integers(1, 6))):
        row = {}
        for k in keys:
            value = draw(VALUES[k])
            row[k] = value if type(value) is type(kinds[k]) else kinds[k]
        rows.append(row)
    return keys, rows


SETTINGS = settings(max_examples=1500, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))


@pytest.mark.slow
@SETTINGS
@given(shaped_files(), st.lists(st.tuples(st.integers(0, 400), st.one_of(
    st.sampled_from([c.encode() for c in '",:{} \\\t\n\r-.e0123456789ntu[]']),
    st.binary(min_size=1, max_size=2))), max_size=3))
def test_what_it_reads_is_what_arrows_reader_reads(
        shaped: tuple[list[str], list[dict[str, Any]]],
        edits: list[tuple[int, bytes]]) -> None:
    """A file of one shape is read, and as Arrow reads it; any byte edited anywhere gives
    Arrow's table or None."""
    _keys, rows = shaped
    data = b"\n".join(compact(r) for r in rows) + b"\n"
    assert agrees(data) is not None, data
    for at, byte in edits:
        if at < len(data):
            data = data[:at] + byte + data[at + 1:]
    try:
        data.decode()
    except UnicodeDecodeError:
        return  # (the caller refuses a file that is not UTF-8 before)
    agrees(data)


#: Files read (the usual ones, and odd ones that are still one shape).
READ = [
    b'{"a":1,"s":"x"}\n{"a":2,"s":"y"}\n',           # the usual file
    b'{"a":1,"s":"x"}\n\n{"a":2,"s":"y"}',           # empty lines, no final line break
    b'{"s":"","a":-0}\n',                            # an empty string; -0
    b'{"other":"x","a":1}\n',                        # a field the schema does not name
    b'{"d":-1E+2,"a":9223372036854775807}\n', b'{"s":"}{"}\n', b'{"":1,"a":2}\n',
    b'{"\xc3\xa9":1,"s":"\xe2\x82\xac"}\n',
]
#: Files not read: each breaks one condition (Arrow's reader decides them).
NOT_READ = [
    b'{"s":"a,b"}\n', b'{"s":"\xc3\xa9"}\n{"s":","}\n',  # a comma in a string
    b'{"other":true,"a":1}\n',                       # not a number or a string
    b'{"d":1e400}\n', b'{"a":9223372036854775808}\n', b'{"i":2147483648}\n',
    b'{"a":1.0}\n', b'{"a":01}\n', b'{"d":.5}\n', b'{"d":5.}\n', b'{"d":NaN}\n', b'{"d":+1}\n',
    b'{"a":"1"}\n', b'{"s":1}\n', b'{"s":null}\n', b'{"s":"x\\"y"}\n', b'{"s":"x\ty"}\n',
    b'{"a":1}\r\n', b'{"a": 1}\n', b'{"a":1 }\n', b' {"a":1}\n', b'{"a":1}\n{"s":"x"}\n',
    b'{"a":1,"s":"x"}\n{"s":"x","a":1}\n', b'{"a":1,"a":2}\n', b'{"a":1}{"a":2}\n',
    b'{"s":"x"}\n{"s":"\n', b'{"s":"x","t":"}\n{"s":"x"\n', b'{}\n', b'{"a":[1]}\n',
    b'{"a":{"b":1}}\n', b'{"s":"x"}\n{"s":"""}\n', b'{"s":"x"}\n{"s":"}\n',
    b'{"s":"}\n{"s":"a"b"}\n',  # (one row a quote short, one a quote over)
    b'{"s":"x\\\\y"}\n', b'{"s":"a\\nb"}\n', b'{"s":"\\u0041"}\n',  # escapes
]


@pytest.mark.parametrize("data", READ + NOT_READ)
def test_each_condition(data: bytes) -> None:
    """Each case is Arrow's table (the first list) or None (the second)."""
    assert (agrees(data) is not None) == (data in READ), data


def test_a_column_no_field_names_is_null_and_other_types_are_not_taken() -> None:
    got = agrees(b'{"a":1}\n{"a":2}\n')
    assert got.column("s").null_count == 2 and got.column("a").to_pylist() == [1, 2]
    boolean = pa.schema([("b", pa.bool_()), ("a", pa.int64())])
    assert read_shaped(b'{"b":1,"a":1}\n', boolean) is None
    assert agrees(b'{"a":1}\n', boolean) is not None  # (b: no field names it)


@pytest.mark.parametrize("line", [
    b'{"other":1.0687096616247354e416,"a":1}\n',  # found by the property test above
    b'{"other":1e400,"a":1}\n',
    b'{"other":-1234567890123456789012345678901234567890e380,"a":1}\n',
])
def test_a_number_arrow_refuses_in_a_field_the_schema_does_not_name_is_not_read(line) -> None:
    assert arrow(line * 3, pa.schema([("a", pa.int64())])) is None
    assert agrees(line * 3, pa.schema([("a", pa.int64())])) is None


def test_an_integer_past_64_bits_in_a_field_the_schema_does_not_name_is_read() -> None:
    line = b'{"other":123456789012345678901234567890,"a":1}\n'
    assert agrees(line * 3, pa.schema([("a", pa.int64())])) is not None
