"""The floor of the per-key join state layout: what buffering records one key each costs in the
RocksDB backend before any matching. Window and table joins keep this layout; interval joins
kept it until they moved to chunks of records (`operators/join_interval.py`), which this
measurement motivated (docs/joins.md#measured).

    .venv/bin/python -m bench.join_state [--records 100000]

One subtask's RocksDB state (128 key groups), `--records` keys with one buffered record each,
in the join's layout (`operators/join.py`: per key a pickled list of `[ts, seq, values,
matched, first window]`), values `[amount double, ts timestamp]`: put and commit, read back,
one event-time timer per record, then firing the timers and deleting the records. Then the
pickling of those records alone, with the timestamp as a Python datetime (today) and as
integer microseconds. Prints a table; not a test.
"""

from __future__ import annotations

import argparse
import datetime as dt
import pickle
import shutil
import tempfile
import time
from typing import Any

BASE_MS = 1767225600000


def measure(records: int) -> list[tuple[str, float, str]]:
    """(step, seconds, note) rows."""
    import numpy as np
    import pyarrow as pa

    from streamer.state import StateDescriptor, StateKind, key_group_range, open_backend
    from streamer.state.codec import encode_key_columns

    root = tempfile.mkdtemp(prefix="bench-join-state-")
    rows: list[tuple[str, float, str]] = []
    try:
        backend = open_backend("rocksdb", root, "bench", "join", 0, key_group_range(0, 1, 128),
                               states=[StateDescriptor("join.left", StateKind.VALUE)])
        keys = encode_key_columns([pa.array(np.arange(records, dtype=np.int64))])
        cells = [(i % 128, key, b"") for i, key in enumerate(keys)]
        stamp = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        buffered: list[Any] = [[[BASE_MS + i, i, [i * 1.0, stamp], False, None]]
                               for i in range(records)]
        began = time.perf_counter()
        backend.put_many("join.left", [(*c, r) for c, r in zip(cells, buffered, strict=True)])
        backend.commit(1)
        rows.append(("put + commit", time.perf_counter() - began, ""))
        began = time.perf_counter()
        backend.get_many("join.left", cells)
        rows.append(("get", time.perf_counter() - began, ""))
        began = time.perf_counter()
        backend.add_timers("event", sorted((kg, BASE_MS + i + 30_000, key, b"")
                                           for i, (kg, key, _) in enumerate(cells)))
        backend.commit(2)
        rows.append(("timers: add + commit", time.perf_counter() - began, ""))
        began = time.perf_counter()
        due = backend.due_timers("event", BASE_MS + 30_000 + records, remove=True)
        backend.delete_many("join.left", [(t.key_group, t.key, b"") for t in due])
        backend.commit(3)
        rows.append(("timers: fire + delete records + commit", time.perf_counter() - began,
                     f"{len(due):,} fired"))
        backend.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    micros: list[Any] = [[[BASE_MS + i, i, [i * 1.0, BASE_MS * 1000], False, None]]
                         for i in range(records)]
    for name, values in (("datetime", buffered), ("int micros", micros)):
        began = time.perf_counter()
        data = [pickle.dumps(v, protocol=5) for v in values]
        dumped = time.perf_counter() - began
        began = time.perf_counter()
        for item in data:
            pickle.loads(item)
        loaded = time.perf_counter() - began
        size = sum(map(len, data)) / records
        rows.append((f"pickle dumps, timestamps as {name}", dumped, f"{size:.0f} B a record"))
        rows.append((f"pickle loads, timestamps as {name}", loaded, ""))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"a join's state layout, {args.records:,} buffered records, one subtask")
    for column in ("step", "seconds", "µs a record", "note"):
        table.add_column(column)
    for step, seconds, note in measure(args.records):
        table.add_row(step, f"{seconds:.2f}", f"{seconds / args.records * 1e6:.1f}", note)
    Console().print(table)


if __name__ == "__main__":
    main()
