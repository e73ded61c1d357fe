"""Throughput of the continuous mode against the epoch mode on the same keyed pipeline
(issue 36: the continuous mode's maximum sustained rate at least 0.5x the epoch mode's).

    .venv/bin/python -m bench.continuous_throughput [--rows 2000000] [--files 8]
        [--keys 10000] [--repeat 3] [--batch-rows 1000,10000]

Input: `--rows` events (`bench.keyed_windows.write_events`: user among `--keys`, amount,
ts over one hour with 3 s of jitter) as `--files` parquet files, written once. Pipeline:
filter `amount >= 0` (keeps every row), key_by user, 1-minute tumbling window of count and
sum(amount), watermark 5 s, parallelism 2, rocksdb, a parquet files sink, checkpoints every
1 s, `local[*]` (the continuous mode sizes its session to a slot per subtask). The input is
all there at the start, so each run goes as fast as the engine can: its rate is its maximum
sustained rate on this machine.

Each `streamer run` is a fresh process; the rows (alternated within each repeat):
- **epochs**: `job.execution.mode: epochs`, one file an epoch (`max_files_per_epoch: 1`);
- **continuous**: `mode: continuous` at each `--batch-rows` (`continuous_batch_rows`, the
  rows a source subtask decodes and routes at once);
- **continuous, no keyed**: the filter alone into the sink, continuous: what the source
  subtasks alone reach (decode, filter, write); the keyed row's shortfall from it is the
  exchange and the keyed subtasks (apply, window timers, snapshots).

Reported per row: medians of the whole run's wall time, of the time from the `started` event
to `finished` (the engine at work, without the JVM's start), input rows per second over the
latter, checkpoints, and the ratio to the epochs row. The output rows of every run are
counted and must be equal across the keyed rows (a run with another count is an error).
Prints a table; not a test. The machine has 2 cores and is shared: the load is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from bench.keyed_windows import write_events


@dataclass
class Result:
    wall: float
    working: float
    checkpoints: int
    out_rows: int
    error: str | None = None
    load: float = field(default_factory=lambda: os.getloadavg()[0])


def pipeline(root: Path, data: Path, mode: str, batch_rows: int, keyed: bool) -> Path:
    keyed_op = """
  - id: agg
    input: keep
    key_by: [user]
    window: {tumbling: 1m}
    aggregate: {n: count(), total: sum(amount)}""" if keyed else ""
    text = f"""\
name: throughput
storage: "{root / 'storage'}"
job:
  parallelism: 2
  checkpoint: {{interval: 1s}}
  state: {{backend: rocksdb}}
  execution: {{mode: {mode}, continuous_batch_rows: {batch_rows}}}
sources:
  - id: events
    type: files
    path: "{data}"
    format: parquet
    schema: {{user: string, amount: double, ts: timestamp}}
    max_files_per_epoch: 1
    event_time: ts
    watermark: {{max_out_of_orderness: 5s}}
operators:
  - {{id: keep, input: events, filter: "amount >= 0"}}{keyed_op}
sinks:
  - {{id: out, type: files, input: {'agg' if keyed else 'keep'}, path: "{root / 'out'}",
     format: parquet}}
"""
    path = root / "pipeline.yaml"
    path.write_text(text)
    return path


def run_once(scratch: Path, data: Path, mode: str, batch_rows: int, keyed: bool) -> Result:
    root = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=scratch))
    path = pipeline(root, data, mode, batch_rows, keyed)
    streamer = Path(sys.executable).with_name("streamer")
    began = time.monotonic()
    started = finished = None
    events = []
    with subprocess.Popen([str(streamer), "run", str(path), "--json", "--no-ui"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          cwd=root) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            events.append(event)
            if event.get("event") == "started":
                started = time.monotonic()
            elif event.get("event") == "finished":
                finished = time.monotonic()
    wall = time.monotonic() - began
    end = next((e for e in events if e.get("event") == "finished"), None)
    error = None
    if proc.returncode or end is None or end.get("status") != "finished":
        error = f"exit {proc.returncode}: {end.get('reason') if end else 'no finished event'}"
    out_rows = sum(pq.ParquetFile(p).metadata.num_rows for p in (root / "out").rglob("*.parquet")
                   if not any(part.startswith((".", "_")) for part in p.relative_to(
                       root / "out").parts))
    checkpoints = sum(1 for e in events if e.get("event") == "checkpoint"
                      and e.get("status") == "completed")
    shutil.rmtree(root, ignore_errors=True)
    working = (finished - started) if started and finished else wall
    return Result(wall, working, checkpoints, out_rows, error)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch-rows", default="1000,10000",
                        help="continuous_batch_rows values, comma-separated")
    args = parser.parse_args(argv)
    console = Console(width=150)
    scratch = Path(tempfile.mkdtemp(prefix="bench-throughput-"))
    try:
        data = scratch / "in"
        write_events(data, args.rows, args.files, args.keys)
        rows: list[tuple[str, str, int, bool]] = [("epochs", "epochs", 1000, True)]
        for n in (int(b) for b in args.batch_rows.split(",")):
            rows.append((f"continuous, batch_rows {n}", "continuous", n, True))
        last = int(args.batch_rows.split(",")[-1])
        rows.append((f"continuous, no keyed, batch_rows {last}", "continuous", last, False))
        results: dict[str, list[Result]] = {label: [] for label, *_ in rows}
        for i in range(args.repeat):
            for label, mode, batch, keyed in rows:
                r = run_once(scratch, data, mode, batch, keyed)
                results[label].append(r)
                console.print(f"[{i + 1}/{args.repeat}] {label}: {r.working:.1f} s at work, "
                              f"{r.wall:.1f} s wall, {r.out_rows:,} rows out, "
                              f"{r.checkpoints} checkpoints, load {r.load:.2f}"
                              f"{', ' + r.error if r.error else ''}")
        report(console, results, args.rows)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def report(console: Console, results: dict[str, list[Result]], rows: int) -> None:
    table = Table(title=f"{rows:,} rows, files -> keyed tumbling window -> files, parallelism "
                        "2, rocksdb, checkpoints every 1 s; medians")
    for col in ("run", "wall s", "at work s", "rows/s at work", "vs epochs", "checkpoints",
                "rows out", "load", "note"):
        table.add_column(col)
    base = None
    keyed_outs = {r.out_rows for label, rs in results.items() if "no keyed" not in label
                  for r in rs if not r.error}
    for label, rs in results.items():
        ok = [r for r in rs if not r.error]
        rate = statistics.median(rows / r.working for r in ok) if ok else 0.0
        base = rate if base is None else base
        note = "; ".join(sorted({r.error for r in rs if r.error}))
        if "no keyed" not in label and len(keyed_outs) > 1:
            note = note or f"output rows differ across runs: {sorted(keyed_outs)}"
        table.add_row(
            label, f"{statistics.median(r.wall for r in ok):.1f}" if ok else "-",
            f"{statistics.median(r.working for r in ok):.1f}" if ok else "-",
            f"{rate:,.0f}", f"{rate / base:.2f}x" if base else "-",
            f"{statistics.median(r.checkpoints for r in ok):.0f}" if ok else "-",
            f"{statistics.median(r.out_rows for r in ok):,.0f}" if ok else "-",
            f"{statistics.median(r.load for r in rs):.2f}", note[:100])
    console.print(table)
    console.print(f"{os.cpu_count()} cores, shared: compare within this run.")


if __name__ == "__main__":
    main()
