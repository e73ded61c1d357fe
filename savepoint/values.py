"""The savepoint value encoding, "tagged-json-1": a state value as compact UTF-8 JSON.

**Values** (`encode_value` / `decode_value`) are compact UTF-8 JSON, so that any tool can read
them and no Python class is needed to load them. None, bool, str, int (any size), finite float
and list map to JSON itself (a float always keeps its `.0` or exponent, so ints and floats stay
apart; a str holding lone surrogates, which only Python can make, is written with UTF-8's
`surrogatepass`: exact, but not valid UTF-8). Every other type is a one-key object whose key
starts with `$`:

    {"$tuple": [...]}             {"$bytes": "<base64>"}         {"$float": "nan"|"inf"|"-inf"}
    {"$set": [...]}               {"$frozenset": [...]}          (elements sorted by their JSON)
    {"$dict": [[k, v], ...]}      a dict with a key that is not a str or that starts with "$"
    {"$decimal": "1.50"}          {"$date": "2024-05-01"}        {"$time": "12:30:00.5"}
    {"$datetime": "<ISO 8601>"}   naive or fixed-offset; a zoneinfo zone as ["<ISO>", "<zone>"]
    {"$timedelta": [days, seconds, microseconds]}
    {"$pickle": "<base64>"}       any other object, pickled (protocol 5)

A dict whose keys are all str not starting with `$` is a plain JSON object. This covers every
value the built-in operators keep (accumulator lists of numbers, strings, None, (time, seq,
value) tuples, frozensets, Decimals and datetimes from Arrow; session and count-window tuples;
window key lists of bytes, and per-window columns of keys and accumulators). Only objects of
other types (a process function's own classes,
numpy scalars, subclasses such as named tuples) fall back to pickle, which is Python-only and
needs the class at restore time; a handle counts them in `pickled_values` so the caller can warn.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import pickle
import zoneinfo
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

#: The name of this encoding, kept in every state file's metadata.
VALUE_ENCODING = "tagged-json-1"

#: Types that JSON itself keeps apart and round-trips (floats only when finite).
_JSON_SCALARS = frozenset({str, int, float, bool, type(None)})


def _sorted_items(values: Any, exact: bool) -> list[Any]:
    """The tagged elements of a set, sorted by their JSON text (canonical, hash-seed free)."""
    tagged = [_tag(v, exact) for v in values]
    return sorted(tagged, key=lambda t: json.dumps(t, sort_keys=True))


def _tag(value: Any, exact: bool = False) -> Any:
    """The JSON-able tagged form of `value` (see the module docstring). Without `exact`, a list
    of JSON scalars is returned as it is, even if it holds a NaN or an infinity: the encoder
    refuses those (ValueError), and `encode_value` then tags again with `exact`.
    """
    kind = type(value)
    if kind in _JSON_SCALARS:
        if kind is float and not math.isfinite(value):
            return {"$float": repr(value)}
        return value
    if kind is list:
        if not exact and all(type(v) in _JSON_SCALARS for v in value):
            return value
        return [_tag(v, exact) for v in value]
    if kind is tuple:
        return {"$tuple": [_tag(v, exact) for v in value]}
    if kind is dict:
        if all(type(k) is str and not k.startswith("$") for k in value):
            return {k: _tag(v, exact) for k, v in value.items()}
        return {"$dict": [[_tag(k, exact), _tag(v, exact)] for k, v in value.items()]}
    if kind is bytes:
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    if kind is frozenset:
        return {"$frozenset": _sorted_items(value, exact)}
    if kind is set:
        return {"$set": _sorted_items(value, exact)}
    if kind is Decimal:
        return {"$decimal": str(value)}
    if kind is dt.datetime:
        tz = value.tzinfo
        if tz is None or type(tz) is dt.timezone:
            return {"$datetime": value.isoformat()}
        if type(tz) is zoneinfo.ZoneInfo and value.utcoffset() is not None:
            return {"$datetime": [value.isoformat(), tz.key]}
    elif kind is dt.date:
        return {"$date": value.isoformat()}
    elif kind is dt.time:
        if value.tzinfo is None or type(value.tzinfo) is dt.timezone:
            return {"$time": value.isoformat()}
    elif kind is dt.timedelta:
        return {"$timedelta": [value.days, value.seconds, value.microseconds]}
    return {"$pickle": base64.b64encode(pickle.dumps(value, protocol=5)).decode("ascii")}


def _datetime(arg: Any) -> dt.datetime:
    if isinstance(arg, list):
        text, zone = arg
        return dt.datetime.fromisoformat(text).astimezone(zoneinfo.ZoneInfo(zone))
    return dt.datetime.fromisoformat(arg)


def _float(arg: Any) -> float:
    if arg not in ("nan", "inf", "-inf"):
        msg = f"not a non-finite float: {arg!r}"
        raise ValueError(msg)
    return float(arg)


_UNTAG: dict[str, Any] = {
    "$tuple": tuple,
    "$bytes": lambda a: base64.b64decode(a, validate=True),
    "$float": _float,
    "$set": set,
    "$frozenset": frozenset,
    "$dict": dict,
    "$decimal": Decimal,
    "$datetime": _datetime,
    "$date": dt.date.fromisoformat,
    "$time": dt.time.fromisoformat,
    "$timedelta": lambda a: dt.timedelta(days=a[0], seconds=a[1], microseconds=a[2]),
    "$pickle": lambda a: pickle.loads(base64.b64decode(a, validate=True)),
}


def _untag(obj: dict[str, Any]) -> Any:
    if len(obj) == 1:
        ((name, arg),) = obj.items()
        if name[:1] == "$":
            decode = _UNTAG.get(name)
            if decode is None:
                msg = f"unknown value tag {name!r}"
                raise ValueError(msg)
            return decode(arg)
    return obj


def _not_json(value: Any) -> Any:
    msg = f"{type(value).__name__} is not JSON"
    raise TypeError(msg)


def _make_encoder() -> Callable[[Any], str]:
    """A compact JSON encoder of tagged values. CPython's C encoder is built once and reused:
    `json.dumps` would build one per call, which costs more than encoding a small value.
    """
    c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
    if c_make_encoder is None:  # not CPython
        return json.JSONEncoder(separators=(",", ":"), allow_nan=False,
                                ensure_ascii=False).encode
    encode_chunks = c_make_encoder(None, _not_json, json.encoder.encode_basestring, None,
                                   ":", ",", False, False, False)
    return lambda value: "".join(encode_chunks(value, 0))


_encode_json = _make_encoder()


def encode_value(value: Any) -> bytes:
    """A state value in the savepoint's tagged JSON encoding (UTF-8)."""
    try:
        text = _encode_json(_tag(value))
    except ValueError:  # a NaN or infinity in a list of scalars: tag every element
        text = _encode_json(_tag(value, exact=True))
    return text.encode("utf-8", "surrogatepass")


def decode_value(data: bytes) -> Any:
    """The value `encode_value` encoded; raises ValueError on text it did not write."""
    return json.loads(data.decode("utf-8", "surrogatepass"), object_hook=_untag)


def decode_values(values: Sequence[bytes]) -> list[Any]:
    """`decode_value` of many values at once (one JSON parse of all of them: much faster)."""
    text = (b"[" + b",".join(values) + b"]").decode("utf-8", "surrogatepass")
    decoded = json.loads(text, object_hook=_untag)
    if len(decoded) != len(values):
        msg = f"{len(values)} encoded values decoded as {len(decoded)}"
        raise ValueError(msg)
    return list(decoded)


def is_pickled(data: bytes) -> bool:
    """Whether an encoded value fell back to pickle (Python-only; counted in `pickled_values`)."""
    return b'{"$pickle":' in data
