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
