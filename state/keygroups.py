"""Key groups: the unit in which keyed state is partitioned, snapshotted and rescaled.

A keyed operator has `max_parallelism` key groups (default 128, at most 32768) and runs as
`parallelism` subtasks (1 <= parallelism <= max_parallelism). Every record belongs to one key
group, computed **in Spark SQL** from the key columns as

    pmod(xxhash64(<key columns>), max_parallelism)

(`key_group_sql` writes that expression). Spark's `xxhash64` is XxHash64 with seed 42 over
Spark's own binary form of the values: it is the same on every platform, every Python and every
executor. Python's built-in `hash()` must never be used for this, because it is salted per
process (PYTHONHASHSEED) and would send a key to different key groups in different workers.

Key groups are assigned to subtasks in contiguous ranges by Flink's rule
`subtask = key_group * parallelism // max_parallelism` (`assign_subtask`, or `subtask_sql` for the
same in Spark SQL); `key_group_range` is its exact inverse. Because every state entry is stored
under its key group, a snapshot can be split per key group and restored at another parallelism;
`max_parallelism` itself is fixed for the life of a job's state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streamer.state.exceptions import KeyGroupError

DEFAULT_MAX_PARALLELISM = 128
#: The largest max_parallelism, so that a key group fits in the 2-byte prefix of every state key.
UPPER_BOUND_MAX_PARALLELISM = 1 << 15


def check_parallelism(parallelism: int, max_parallelism: int) -> None:
    """Raise `KeyGroupError` unless 1 <= parallelism <= max_parallelism <= 32768."""
    if not 1 <= max_parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        msg = (f"max_parallelism {max_parallelism!r} is out of range; use a value between 1 and "
               f"{UPPER_BOUND_MAX_PARALLELISM}")
        raise KeyGroupError(msg)
    if not 1 <= parallelism <= max_parallelism:
        msg = (f"parallelism {parallelism!r} is out of range for max_parallelism "
               f"{max_parallelism}; use a value between 1 and {max_parallelism}")
        raise KeyGroupError(msg)


def assign_subtask(key_group: int, parallelism: int, max_parallelism: int) -> int:
    """The subtask that owns `key_group`: `key_group * parallelism // max_parallelism` (Flink's
    `KeyGroupRangeAssignment.computeOperatorIndexForKeyGroup`).
    """
    if not 0 <= key_group < max_parallelism:
        msg = f"key group {key_group!r} is outside [0, {max_parallelism})"
        raise KeyGroupError(msg)
    return key_group * parallelism // max_parallelism


def key_group_range(subtask: int, parallelism: int, max_parallelism: int) -> range:
    """The contiguous key groups that `assign_subtask` gives to `subtask` (never empty)."""
    check_parallelism(parallelism, max_parallelism)
    if not 0 <= subtask < parallelism:
        msg = f"subtask {subtask!r} is outside [0, {parallelism})"
        raise KeyGroupError(msg)
    start = (subtask * max_parallelism + parallelism - 1) // parallelism
    stop = ((subtask + 1) * max_parallelism + parallelism - 1) // parallelism
    return range(start, stop)


def _quote(column: str) -> str:
    return "`" + column.replace("`", "``") + "`"


def key_group_sql(columns: Sequence[str], max_parallelism: int) -> str:
    """The Spark SQL expression of the key group of a row keyed by `columns` (quoted as
    identifiers): `pmod(xxhash64(c1, c2, ...), max_parallelism)`, an int in [0, max_parallelism).
    """
    if not columns:
        msg = "a key group needs at least one key column"
        raise KeyGroupError(msg)
    check_parallelism(1, max_parallelism)
    cols = ", ".join(_quote(c) for c in columns)
    return f"CAST(pmod(xxhash64({cols}), {max_parallelism}) AS INT)"


def subtask_sql(key_group_expr: str, parallelism: int, max_parallelism: int) -> str:
    """The Spark SQL expression of `assign_subtask` over a key-group expression or column."""
    check_parallelism(parallelism, max_parallelism)
    return f"CAST(({key_group_expr}) * {parallelism} DIV {max_parallelism} AS INT)"


# ------------------------------------------------------------------ key groups in Python
# The same key groups as `key_group_sql`, computed without Spark, for the keyed stages that
# read their input themselves (runtime/direct.py). Spark's xxhash64(c1, c2, ...) starts at
# seed 42 and hashes each non-null value with the previous result as its seed: strings as
# their UTF-8 bytes, byte/short/int/boolean/date as a 4-byte int, bigint as an 8-byte long,
# each with the standard XXH64 algorithm (Spark's `XXH64.hashUnsafeBytes`, `hashInt`,
# `hashLong`). A null leaves the running hash as it is.

_M = (1 << 64) - 1
_P1, _P2, _P3 = 11400714785074694791, 14029467366897019727, 1609587929392839161
_P4, _P5 = 9650029242287828579, 2870177450012600261
SPARK_HASH_SEED = 42
#: Spark types (simpleString) whose values `key_groups` hashes as Spark does.
PYTHON_HASHED_TYPES = ("string", "tinyint", "smallint", "int", "bigint", "boolean", "date")


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M, 31) * _P1) & _M


def _avalanche(h: int) -> int:
    h = ((h ^ (h >> 33)) * _P2) & _M
    h = ((h ^ (h >> 29)) * _P3) & _M
    return h ^ (h >> 32)


def xxhash64(data: bytes, seed: int) -> int:
    """The standard XXH64 of `data` with a 64-bit `seed` (unsigned in, unsigned out)."""
    n, i, seed = len(data), 0, seed & _M
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M, (seed + _P2) & _M, seed, (seed - _P1) & _M]
        while i + 32 <= n:
            for j in range(4):
                v[j] = _round(v[j], int.from_bytes(data[i + 8 * j:i + 8 * j + 8], "little"))
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M
        for lane in v:
            h = ((h ^ _round(0, lane)) * _P1 + _P4) & _M
    else:
        h = (seed + _P5) & _M
    h = (h + n) & _M
    while i + 8 <= n:
        h ^= _round(0, int.from_bytes(data[i:i + 8], "little"))
        h = (_rotl(h, 27) * _P1 + _P4) & _M
        i += 8
    if i + 4 <= n:
        h ^= (int.from_bytes(data[i:i + 4], "little") * _P1) & _M
        h = (_rotl(h, 23) * _P2 + _P3) & _M
        i += 4
    while i < n:
        h ^= (data[i] * _P5) & _M
        h = (_rotl(h, 11) * _P1) & _M
        i += 1
    return _avalanche(h)


def spark_hash_value(value: object, type_name: str, seed: int) -> int:
    """One step of Spark's xxhash64: `value` (of Spark type `type_name`) hashed with `seed`;
    a null returns the seed."""
    if value is None:
        return seed
    if type_name == "string":
        assert isinstance(value, str)
        return xxhash64(value.encode("utf-8", "surrogatepass"), seed)
    if type_name == "bigint":
        assert isinstance(value, int)
        return xxhash64((value & _M).to_bytes(8, "little"), seed)
    if type_name == "date":
        import datetime

        assert isinstance(value, datetime.date)
        value = (value - datetime.date(1970, 1, 1)).days
    if type_name in ("tinyint", "smallint", "int", "boolean", "date"):
        assert isinstance(value, int)
        return xxhash64((int(value) & 0xFFFFFFFF).to_bytes(4, "little"), seed)
    msg = f"no Python key-group hash for Spark type {type_name!r}"
    raise KeyGroupError(msg)


def key_group_of(values: Sequence[object], types: Sequence[str], max_parallelism: int) -> int:
    """The key group `key_group_sql` gives a row whose key columns (Spark types `types`)
    hold `values`."""
    h = SPARK_HASH_SEED
    for value, type_name in zip(values, types, strict=True):
        h = spark_hash_value(value, type_name, h)
    signed = h - (1 << 64) if h >> 63 else h
    return signed % max_parallelism  # Python's % is pmod for a positive divisor


#: Spark types whose values `key_groups_of_columns` hashes a whole column at a time.
INTEGER_HASHED_TYPES = ("tinyint", "smallint", "int", "bigint", "boolean", "date")


def key_groups_of_columns(columns: Sequence[Any], types: Sequence[str],
                          max_parallelism: int) -> Any:
    """`key_group_of` of every row of the Arrow arrays `columns` (Spark types `types`, each
    in `INTEGER_HASHED_TYPES`), as a numpy int32 array: XXH64's 4- and 8-byte cases
    (`hashInt`, `hashLong`) in numpy's wrapping uint64 arithmetic, a column at a time, so a
    million distinct ids cost milliseconds, not a Python call each."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    def rotl(x: Any, r: int) -> Any:
        return (x << np.uint64(r)) | (x >> np.uint64(64 - r))

    p1, p2, p3, p4, p5 = (np.uint64(p) for p in (_P1, _P2, _P3, _P4, _P5))
    n = len(columns[0]) if columns else 0
    h = np.full(n, SPARK_HASH_SEED, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column, type_name in zip(columns, types, strict=True):
            if type_name not in INTEGER_HASHED_TYPES:
                msg = f"no columnar key-group hash for Spark type {type_name!r}"
                raise KeyGroupError(msg)
            array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
            valid = pc.is_valid(array).to_numpy(zero_copy_only=False)
            if type_name == "boolean":
                array = array.cast(pa.int32())
            elif type_name == "date":
                array = array.cast(pa.int32())  # days since the epoch
            values = array.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
            if type_name == "bigint":
                lane = values.view(np.uint64)
                k = rotl(lane * p2, 31) * p1
                step = (h + p5 + np.uint64(8)) ^ k
                step = rotl(step, 27) * p1 + p4
            else:
                word = (values & 0xFFFFFFFF).astype(np.uint64)
                step = (h + p5 + np.uint64(4)) ^ (word * p1)
                step = rotl(step, 23) * p2 + p3
            step = (step ^ (step >> np.uint64(33))) * p2
            step = (step ^ (step >> np.uint64(29))) * p3
            step = step ^ (step >> np.uint64(32))
            h = step if valid.all() else np.where(valid, step, h)  # a null: h stays
    return np.mod(h.view(np.int64), max_parallelism).astype(np.int32)
