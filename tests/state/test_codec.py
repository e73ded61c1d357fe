"""State encodings: keys round-trip and are deterministic, times keep their order."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from enum import IntEnum
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamer.state.codec import (
    decode_key,
    decode_time,
    decode_value,
    decode_window,
    encode_key,
    encode_key_columns,
    encode_time,
    encode_value,
    encode_window,
    prefix_end,
    split_state_key,
    split_timer_key,
    state_key,
    timer_key,
)
from streamer.state.exceptions import KeyEncodingError

I64 = st.integers(-(1 << 63), (1 << 63) - 1)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), I64, st.floats(allow_nan=False),
    st.text(), st.binary(),
    st.datetimes(), st.datetimes(timezones=st.just(dt.UTC)), st.dates(),
    st.decimals(allow_nan=False, allow_infinity=False),
)
KEYS = st.lists(SCALARS, max_size=6).map(tuple)


def same(a: Any, b: Any) -> bool:
    """Equal and of the same type (so 1 and 1.0, or True and 1, do not pass for each other)."""
    return type(a) is type(b) and a == b


@given(KEYS)
def test_keys_round_trip(key: tuple[Any, ...]) -> None:
    decoded = decode_key(encode_key(key))
    assert len(decoded) == len(key)
    assert all(same(a, b) for a, b in zip(decoded, key, strict=True))


@given(KEYS, KEYS)
def test_keys_encode_equal_exactly_when_equal(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    typed_equal = len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    assert (encode_key(a) == encode_key(b)) == typed_equal


@given(KEYS)
def test_key_tuples_are_self_delimiting(key: tuple[Any, ...]) -> None:
    # concatenating encodings encodes the concatenated tuple: no element swallows another
    assert encode_key(key + key) == encode_key(key) + encode_key(key)


def test_floats_are_normalized_like_spark_grouping() -> None:
    assert encode_key((-0.0,)) == encode_key((0.0,))
    assert encode_key((math.nan,)) == encode_key((float("-nan"),))
    assert math.isnan(decode_key(encode_key((math.nan,)))[0])


def test_types_are_part_of_the_key() -> None:
    assert len({encode_key((1,)), encode_key((1.0,)), encode_key((True,)), encode_key(("1",)),
                encode_key((b"1",)), encode_key((Decimal(1),))}) == 6


def test_subclasses_and_numpy_scalars_encode_as_their_base_type() -> None:
    np = pytest.importorskip("numpy")

    class Level(IntEnum):
        HIGH = 3

    assert encode_key((Level.HIGH,)) == encode_key((3,))
    assert encode_key((np.int64(7), np.float64(0.5), np.str_("x"))) == encode_key((7, 0.5, "x"))


def test_aware_datetimes_are_instants() -> None:
    plus2 = dt.timezone(dt.timedelta(hours=2))
    assert encode_key((dt.datetime(2024, 1, 1, 2, tzinfo=plus2),)) == \
        encode_key((dt.datetime(2024, 1, 1, tzinfo=dt.UTC),))


@pytest.mark.parametrize("bad", [object(), [1], {"a": 1}, 1j])
def test_unsupported_key_types_are_refused(bad: Any) -> None:
    with pytest.raises(KeyEncodingError, match="cannot encode a key value"):
        encode_key((bad,))


@pytest.mark.parametrize("data", [b"\x63", b"\x06\x00\x00\x00\x09abc", b"\x03\x00"])
def test_garbage_is_refused(data: bytes) -> None:
    with pytest.raises(KeyEncodingError, match="cannot decode key bytes"):
        decode_key(data)


@given(I64, I64)
def test_time_encoding_keeps_numeric_order(a: int, b: int) -> None:
    assert decode_time(encode_time(a)) == a
    assert (encode_time(a) < encode_time(b)) == (a < b)


@given(I64, I64, I64, I64)
def test_windows_round_trip_and_order_by_start_then_end(s1: int, e1: int, s2: int,
                                                        e2: int) -> None:
    assert decode_window(encode_window(s1, e1)) == (s1, e1)
    assert (encode_window(s1, e1) < encode_window(s2, e2)) == ((s1, e1) < (s2, e2))


def test_times_outside_64_bits_are_refused() -> None:
    with pytest.raises(KeyEncodingError):
        encode_time(1 << 63)
    with pytest.raises(KeyEncodingError):
        timer_key(0, 0, -(1 << 63) - 1, b"k", b"")


@given(st.integers(0, (1 << 15) - 1), st.binary(), st.binary(), st.binary())
def test_state_keys_start_with_the_key_group_and_split_back(kg: int, key: bytes, ns: bytes,
                                                            user_key: bytes) -> None:
    stored = state_key(kg, key, ns) + user_key
    assert stored[:2] == kg.to_bytes(2, "big")
    assert split_state_key(stored) == (kg, key, ns, user_key)
    end = prefix_end(kg.to_bytes(2, "big"))
    assert end is not None and stored < end


@given(st.integers(0, (1 << 15) - 1), st.sampled_from([0, 1]), I64, I64, st.binary(),
       st.binary())
def test_timer_keys_order_by_key_group_domain_then_time(kg: int, domain: int, t1: int, t2: int,
                                                        key: bytes, ns: bytes) -> None:
    a, b = timer_key(kg, domain, t1, key, ns), timer_key(kg, domain, t2, key, ns)
    assert a[:2] == kg.to_bytes(2, "big")
    assert split_timer_key(a) == (kg, domain, t1, key, ns)
    if t1 < t2:
        assert a < b


def test_prefix_end() -> None:
    assert prefix_end(b"\x00\x01") == b"\x00\x02"
    assert prefix_end(b"\x00\xff") == b"\x01"
    assert prefix_end(b"\xff\xff") is None


@given(st.recursive(SCALARS, lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner)
                    | st.tuples(inner, inner), max_leaves=10))
def test_values_round_trip(value: Any) -> None:
    assert decode_value(encode_value(value)) == value


def test_key_columns_encode_as_their_rows_do() -> None:
    """`encode_key_columns` (integer columns a column at a time) gives each row's
    `encode_key`: every integer width at its extremes, nulls, chunked arrays, and integer
    columns mixed with others."""
    import random

    import pyarrow as pa

    rng = random.Random(8)
    n = 600
    extremes = {pa.int8(): 7, pa.int16(): 15, pa.int32(): 31, pa.int64(): 63}
    columns, values = [], []
    for dtype, bits in extremes.items():
        column = [None if rng.random() < 0.1 else rng.choice(
            [-(1 << bits), (1 << bits) - 1, 0, rng.randrange(-(1 << bits), 1 << bits)])
            for _ in range(n)]
        values.append(column)
        columns.append(pa.array(column, dtype))
    values.append([None if rng.random() < 0.2 else f"k{rng.randrange(50)}é" for _ in range(n)])
    columns.append(pa.array(values[-1], pa.string()))
    rows = list(zip(*values, strict=True))
    assert encode_key_columns(columns) == [encode_key(r) for r in rows]
    for i, column in enumerate(columns):
        chunked = pa.chunked_array([column[:100], column[100:]])
        assert encode_key_columns([chunked]) == [encode_key((v,)) for v in values[i]]
