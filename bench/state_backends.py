"""State backend micro-benchmark: the per-epoch costs of the `memory` and `rocksdb` backends.

    .venv/bin/python -m bench.state_backends [--batch 100000] [--keys 1000000] [--repeat 3]

For each backend, on a temporary local directory, it measures (median of --repeat runs):
put_many / get_many of `--batch` accumulators (keys pre-encoded; encode_key is timed apart),
commit and close of that batch, open of an existing subtask holding `--keys` keys (memory: from
files with a cold process cache, and from a warm cache), a whole epoch over `--batch` keys
(open, get_many, put_many, commit, close; median and worst of 5), the memory backend's full
snapshot write, an empty epoch, and due_timers over 10 k timers.
Prints a table; not a test.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from streamer.state import BackendOptions, KeyedStateBackend, StateDescriptor, open_backend
from streamer.state.codec import encode_key, encode_window
from streamer.state.memory_files import drop_process_cache

MAX_PARALLELISM = 128
STATES = [StateDescriptor("acc", "aggregating")]
EPOCHS = 5
NS = encode_window(0, 60_000)


def _open(kind: str, root: Path) -> KeyedStateBackend:
    return open_backend(kind, str(root), "bench", "op", 0, range(MAX_PARALLELISM), states=STATES,
                        options=BackendOptions())


def _keys(start: int, count: int) -> list[tuple[int, bytes, bytes]]:
    return [(i % MAX_PARALLELISM, encode_key((f"user-{i}",)), NS)
            for i in range(start, start + count)]


def _timed(fn: Callable[..., object], *args: object) -> float:
    gc.collect()  # a cyclic-GC pass landing inside a timing would blur it
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


def bench_backend(kind: str, batch: int, total: int, workdir: Path) -> dict[str, float]:
    """One run of every measurement for one backend; seconds per measurement."""
    out: dict[str, float] = {}
    root = workdir / kind
    shutil.rmtree(root, ignore_errors=True)
    drop_process_cache()

    # Build a subtask with `total` keys in epochs of `batch` writes.
    epochs = max(1, total // batch)
    for epoch in range(epochs):
        keys = _keys(epoch * batch, batch)
        with _open(kind, root) as backend:
            backend.put_many("acc", [(kg, k, ns, (1, float(i))) for i, (kg, k, ns) in
                                     enumerate(keys)])
            backend.commit(epoch + 1)

    del backend  # it pins the committed dicts of the memory backend

    # Open of the existing subtask: cold (files) and, for memory, from the warm process cache.
    drop_process_cache()
    out["open existing, cold"] = _timed(lambda: _open(kind, root).close())
    out["open existing, warm cache"] = _timed(lambda: _open(kind, root).close())

    # Epochs over `batch` existing keys, step by step; commit costs vary (memory materializes
    # a full snapshot now and then), so report the median and the worst of several epochs.
    keys = _keys(0, batch)
    version = epochs
    steps: dict[str, list[float]] = {}
    for _ in range(EPOCHS):
        version += 1
        gc.collect()
        started = time.perf_counter()
        backend = _open(kind, root)
        steps.setdefault("epoch: open", []).append(time.perf_counter() - started)
        gc.collect()
        started = time.perf_counter()
        current = backend.get_many("acc", keys)
        steps.setdefault("get_many hits", []).append(time.perf_counter() - started)
        merged = [(kg, k, ns, (c[0] + 1, c[1] + 1.0))
                  for (kg, k, ns), c in zip(keys, current, strict=True)]
        steps.setdefault("put_many", []).append(_timed(backend.put_many, "acc", merged))
        steps.setdefault("commit", []).append(_timed(backend.commit, version))
        steps.setdefault("close after commit", []).append(_timed(backend.close))
        del backend, current, merged
    totals = [sum(values) for values in zip(*steps.values(), strict=True)]
    out.update({name: statistics.median(values) for name, values in steps.items()})
    out["commit, worst epoch"] = max(steps["commit"])
    out["epoch: total"] = statistics.median(totals)
    out["epoch: total, worst"] = max(totals)

    # The memory backend writes a full snapshot once its deltas outweigh the last one.
    if kind == "memory":
        with _open(kind, root) as backend:
            out["memory: full snapshot write"] = _timed(backend._materialize)  # internal step

    # Misses (new windows) and an empty epoch.
    misses = [(kg, k, encode_window(60_000, 120_000)) for kg, k, _ in keys]
    with _open(kind, root) as backend:
        out["get_many misses"] = _timed(lambda: backend.get_many("acc", misses))
        backend.add_timers("event", [(kg, 60_000 + (i % 7) * 1000, k, b"")
                                     for i, (kg, k, _) in enumerate(keys[:10_000])])
        backend.commit(version + 1)
    with _open(kind, root) as backend:
        out["due_timers (10k timers)"] = _timed(lambda: backend.due_timers("event", 63_000))
        out["next_timer"] = _timed(lambda: backend.next_timer("event"))

    def empty_epoch() -> None:
        with _open(kind, root) as b:
            b.commit((b.version() or 0) + 1)

    out["empty epoch (open+commit+close)"] = _timed(empty_epoch)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    encode = min(_timed(lambda: _keys(0, args.batch)) for _ in range(args.repeat))
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="streamer-bench-state-") as tmp:
        for _ in range(args.repeat):
            for kind in ("memory", "rocksdb"):
                for name, seconds in bench_backend(kind, args.batch, args.keys,
                                                   Path(tmp)).items():
                    results.setdefault(name, {}).setdefault(kind, []).append(seconds)

    table = Table(title=f"state backends: batch {args.batch:,} accumulators, existing subtask "
                        f"{args.keys:,} keys, median of {args.repeat} (ms)")
    table.add_column("measurement")
    table.add_column("memory", justify="right")
    table.add_column("rocksdb", justify="right")
    for name, by_kind in results.items():
        table.add_row(name, *(f"{statistics.median(by_kind[k]) * 1000:,.1f}" if k in by_kind
                              else "-" for k in ("memory", "rocksdb")))
    table.add_row(f"encode_key x {args.batch:,} (both)", f"{encode * 1000:,.1f}",
                  f"{encode * 1000:,.1f}")
    Console().print(table)


if __name__ == "__main__":
    main()
