"""Encodings of keyed state: keys, times, windows, values, and the binary layout of stored keys.

**Keys** are tuples of Python scalars (the values of the key columns), encoded by `encode_key`
into a tagged, self-delimiting binary form: one tag byte per element, then a fixed-width or
length-prefixed payload. It is deterministic (equal keys give equal bytes: -0.0 is stored as 0.0
and every NaN as the same NaN, as Spark groups them) and `decode_key` inverts it. Types are part
of the key: `(1,)` and `(1.0,)` differ, as they would in a typed Spark column.

**Times** (`encode_time`) are 8 bytes big-endian with the sign bit flipped, so byte order equals
numeric order: this is what makes timers an ordered state found by one range scan per key group.
`encode_window(start, end)` is the namespace of a time window (ordered by start, then end).

**Values** are pickled (protocol 5). Pickle is the fastest general encoding in CPython (about a
microsecond for a small accumulator), handles any accumulator the caller picks, and keeps the
state backends ignorant of value types. The trade-offs: it is Python-only, not a stable format
across code changes (a renamed class no longer loads), and loading untrusted pickles is unsafe.
That is acceptable for *working* state, which only streamer writes and reads back on the same
job; savepoints, which must outlive code changes and be portable, are re-encoded into their own
canonical format.

**Stored keys** (used by the rocksdb backend, and by snapshots built on it) always start with the
key group as 2 bytes big-endian, so one key group is one contiguous key range:

    state entry:  kg(2) | len(key)(4) | key | len(ns)(4) | ns [| user_key  (map states)]
    timer:        kg(2) | domain(1) | time(8, sign-flipped) | len(key)(4) | key | ns
"""

from __future__ import annotations

import datetime as dt
import math
import pickle
import struct
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

from streamer.state.exceptions import KeyEncodingError

#: A scalar that may appear in a key tuple.
KeyScalar = str | int | float | bool | None | bytes | dt.datetime | dt.date | Decimal

PICKLE_PROTOCOL = 5

_NONE, _FALSE, _TRUE, _INT, _BIGINT, _FLOAT, _STR, _BYTES = range(8)
_DATETIME, _DATETIME_UTC, _DATE, _DECIMAL = range(8, 12)

_SIGN = 1 << 63
_MIN_I64, _MAX_I64 = -(1 << 63), (1 << 63) - 1
_Q = struct.Struct(">Q")
_I = struct.Struct(">I")
_D = struct.Struct(">d")
_NAN = _D.pack(math.nan)
_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_EPOCH_DATE = dt.date(1970, 1, 1)
_MICRO = dt.timedelta(microseconds=1)


# --------------------------------------------------------------------------------- keys
def _encode_one(value: Any, out: list[bytes]) -> None:
    kind = type(value)
    if kind is str:
        data = value.encode("utf-8")
        out.append(bytes((_STR,)) + _I.pack(len(data)) + data)
    elif kind is int:
        if _MIN_I64 <= value <= _MAX_I64:
            out.append(bytes((_INT,)) + _Q.pack(value + _SIGN))
        else:
            data = value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True)
            out.append(bytes((_BIGINT,)) + _I.pack(len(data)) + data)
    elif value is None:
        out.append(bytes((_NONE,)))
    elif kind is bool:
        out.append(bytes((_TRUE if value else _FALSE,)))
    elif kind is float:
        if value != value:
            out.append(bytes((_FLOAT,)) + _NAN)
        else:
            out.append(bytes((_FLOAT,)) + _D.pack(value + 0.0))  # -0.0 + 0.0 == 0.0
    elif kind is bytes:
        out.append(bytes((_BYTES,)) + _I.pack(len(value)) + value)
    elif isinstance(value, dt.datetime):
        if value.tzinfo is None:
            micros = (value - _EPOCH) // _MICRO
            out.append(bytes((_DATETIME,)) + _Q.pack(int(micros) + _SIGN))
        else:
            micros = (value - _EPOCH_UTC) // _MICRO
            out.append(bytes((_DATETIME_UTC,)) + _Q.pack(int(micros) + _SIGN))
    elif isinstance(value, dt.date):
        out.append(bytes((_DATE,)) + _Q.pack(value.toordinal() - _EPOCH_DATE.toordinal() + _SIGN))
    elif isinstance(value, Decimal):
        data = _decimal_text(value).encode("ascii")
        out.append(bytes((_DECIMAL,)) + _I.pack(len(data)) + data)
    elif isinstance(value, int):  # subclasses such as IntEnum
        _encode_one(int.__index__(value), out)
    elif isinstance(value, float):
        _encode_one(float.__float__(value), out)
    elif isinstance(value, str):
        _encode_one(str.__str__(value), out)
    elif isinstance(value, bytes):
        _encode_one(bytes(value), out)
    elif hasattr(value, "item") and callable(value.item):  # numpy / pandas scalars
        item = value.item()
        if type(item) is type(value):
            _unsupported(value)
        _encode_one(item, out)
    else:
        _unsupported(value)


def _decimal_text(value: Decimal) -> str:
    """The exact canonical text of a Decimal: equal values (1.0 and 1.00, 0 and -0) give the
    same text; `Decimal.normalize` would round to the context's 28 digits instead.
    """
    if not value.is_finite():
        return str(value)
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    while len(digits) > 1 and digits[-1] == 0:
        digits, exponent = digits[:-1], exponent + 1
    if digits == (0,):
        sign, exponent = 0, 0
    return ("-" if sign else "") + "".join(map(str, digits)) + f"E{exponent}"


def _unsupported(value: Any) -> None:
    msg = (f"cannot encode a key value of type {type(value).__name__!r} ({value!r}); key columns "
           "must be str, int, float, bool, None, bytes, date, datetime or Decimal")
    raise KeyEncodingError(msg)


def encode_key_columns(columns: Sequence[Any]) -> list[bytes]:
    """`encode_key` of every row of the Arrow arrays `columns` (the key columns): 64-bit and
    narrower integer columns a column at a time in numpy, the others a value at a time."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    parts: list[list[bytes]] = []
    for column in columns:
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        if not (pa.types.is_signed_integer(array.type) or pa.types.is_uint8(array.type)
                or pa.types.is_uint16(array.type) or pa.types.is_uint32(array.type)):
            parts.append([encode_key((value,)) for value in array.to_pylist()])
            continue
        values = array.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        raw = (values.view(np.uint64) ^ np.uint64(_SIGN)).astype(">u8").tobytes()
        head = bytes((_INT,))
        encoded = [head + raw[i:i + 8] for i in range(0, len(raw), 8)]
        if array.null_count:
            none = bytes((_NONE,))
            for i in np.flatnonzero(~pc.is_valid(array).to_numpy(zero_copy_only=False)).tolist():
                encoded[i] = none
        parts.append(encoded)
    if len(parts) == 1:
        return parts[0]
    return [b"".join(row) for row in zip(*parts, strict=True)]


def encode_key(key: Iterable[Any]) -> bytes:
    """Encode a key tuple (the values of the key columns) as deterministic bytes."""
    out: list[bytes] = []
    for value in key:
        _encode_one(value, out)
    return b"".join(out)


def decode_key(data: bytes) -> tuple[Any, ...]:
    """Decode bytes written by `encode_key` back into the key tuple."""
    values: list[Any] = []
    pos, end = 0, len(data)
    try:
        while pos < end:
            tag = data[pos]
            pos += 1
            if tag in (_STR, _BYTES, _BIGINT, _DECIMAL):
                (size,) = _I.unpack_from(data, pos)
                pos += 4
                raw = data[pos:pos + size]
                if len(raw) != size:
                    problem = "truncated"
                    raise ValueError(problem)
                pos += size
                if tag == _STR:
                    values.append(raw.decode("utf-8"))
                elif tag == _BYTES:
                    values.append(bytes(raw))
                elif tag == _BIGINT:
                    values.append(int.from_bytes(raw, "big", signed=True))
                else:
                    values.append(Decimal(raw.decode("ascii")))
            elif tag == _NONE:
                values.append(None)
            elif tag in (_FALSE, _TRUE):
                values.append(tag == _TRUE)
            elif tag in (_INT, _FLOAT, _DATETIME, _DATETIME_UTC, _DATE):
                if tag == _FLOAT:
                    (number,) = _D.unpack_from(data, pos)
                    values.append(number)
                else:
                    (raw_int,) = _Q.unpack_from(data, pos)
                    n = raw_int - _SIGN
                    if tag == _INT:
                        values.append(n)
                    elif tag == _DATETIME:
                        values.append(_EPOCH + n * _MICRO)
                    elif tag == _DATETIME_UTC:
                        values.append(_EPOCH_UTC + n * _MICRO)
                    else:
                        values.append(dt.date.fromordinal(n + _EPOCH_DATE.toordinal()))
                pos += 8
            else:
                problem = f"unknown tag {tag}"
                raise ValueError(problem)
    except (ValueError, struct.error, OverflowError, UnicodeDecodeError) as exc:
        msg = (f"cannot decode key bytes {data[:32]!r}: {exc}; the bytes were not written by "
               "encode_key")
        raise KeyEncodingError(msg) from exc
    return tuple(values)


# --------------------------------------------------------------------------------- times
def encode_time(time_ms: int) -> bytes:
    """8 bytes whose byte order is the numeric order of `time_ms` (a signed 64-bit int)."""
    try:
        return _Q.pack(time_ms + _SIGN)
    except (struct.error, TypeError) as exc:
        msg = f"time {time_ms!r} is not a 64-bit integer of milliseconds"
        raise KeyEncodingError(msg) from exc


def decode_time(data: bytes, offset: int = 0) -> int:
    """The inverse of `encode_time`, reading 8 bytes at `offset`."""
    (raw,) = _Q.unpack_from(data, offset)
    return int(raw) - _SIGN


def encode_window(start_ms: int, end_ms: int) -> bytes:
    """The namespace of the time window [start_ms, end_ms), ordered by start then end."""
    return encode_time(start_ms) + encode_time(end_ms)


def decode_window(data: bytes) -> tuple[int, int]:
    """The (start_ms, end_ms) of a namespace written by `encode_window`."""
    if len(data) != 16:
        msg = f"a window namespace has 16 bytes, got {len(data)}"
        raise KeyEncodingError(msg)
    return decode_time(data, 0), decode_time(data, 8)


# --------------------------------------------------------------------------------- values
def encode_value(value: Any) -> bytes:
    """Pickle a state value (protocol 5; see the module docstring for the trade-off)."""
    return pickle.dumps(value, protocol=PICKLE_PROTOCOL)


def decode_value(data: bytes) -> Any:
    """Unpickle a state value written by `encode_value`."""
    return pickle.loads(data)


# --------------------------------------------------------------------------------- stored keys
_KG = struct.Struct(">H")
_KG_LEN = struct.Struct(">HI")
_TIMER_HEAD = struct.Struct(">HBQI")
#: The one-byte codes of the time domains in timer keys.
DOMAIN_CODES = {"event": 0, "processing": 1}


def key_group_prefix(key_group: int) -> bytes:
    """The 2-byte prefix every stored key of `key_group` starts with."""
    return _KG.pack(key_group)


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest byte string above every string that starts with `prefix` (None: no bound)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes((trimmed[-1] + 1,))


def state_key(key_group: int, key: bytes, namespace: bytes) -> bytes:
    """The stored key of (key group, key, namespace); a map entry appends its user key."""
    return _KG_LEN.pack(key_group, len(key)) + key + _I.pack(len(namespace)) + namespace


def split_state_key(data: bytes) -> tuple[int, bytes, bytes, bytes]:
    """The (key group, key, namespace, user key) of a stored state key (user key b"" if none)."""
    key_group, key_len = _KG_LEN.unpack_from(data, 0)
    key_end = 6 + key_len
    (ns_len,) = _I.unpack_from(data, key_end)
    ns_end = key_end + 4 + ns_len
    return key_group, data[6:key_end], data[key_end + 4:ns_end], data[ns_end:]


def timer_key(key_group: int, domain_code: int, time_ms: int, key: bytes,
              namespace: bytes) -> bytes:
    """The stored key of a timer: ordered by key group, domain, then time."""
    try:
        return _TIMER_HEAD.pack(key_group, domain_code, time_ms + _SIGN, len(key)) + key + namespace
    except (struct.error, TypeError) as exc:
        msg = f"timer time {time_ms!r} is not a 64-bit integer of milliseconds"
        raise KeyEncodingError(msg) from exc


def timer_prefix(key_group: int, domain_code: int) -> bytes:
    """The prefix of all timers of one domain in one key group."""
    return _KG.pack(key_group) + bytes((domain_code,))


def split_timer_key(data: bytes) -> tuple[int, int, int, bytes, bytes]:
    """The (key group, domain code, time, key, namespace) of a stored timer key."""
    key_group, domain_code, raw_time, key_len = _TIMER_HEAD.unpack_from(data, 0)
    key_end = 15 + key_len
    return key_group, domain_code, raw_time - _SIGN, data[15:key_end], data[key_end:]
