"""The keyed-window benchmark on a 2-worker Spark standalone cluster versus `local[2]`.

    .venv/bin/python -m bench.cluster [--rows 1000000] [--files 20] [--keys 10000]
        [--backend rocksdb] [--empty-epochs 15]

Starts a standalone cluster on 127.0.0.1 (a master and two workers of 1 core and 1 GB, so two
executors, from pyspark's own Spark distribution), and runs every configuration as a real
`streamer run --json` process:

- `local[2]`, checkpoints at the pipeline's interval (10 s);
- `local[2]`, a checkpoint every epoch (what the cluster does; isolates that cost);
- the cluster, through `streamer run --submit` (client mode; a checkpoint every epoch).

Workload 1 (throughput): `--rows` events over one hour of event time in `--files` parquet
files, one file per epoch, keyed by user (`--keys` distinct) into 1-minute tumbling windows
with count and sum, parallelism 2, jsonl sink. Workload 2 (per-epoch overhead): a datagen
source of 20 records per epoch for `--empty-epochs` epochs through the same kind of window,
so an epoch's duration is almost all fixed cost.

Printed per configuration: records/s (input records over the summed epoch durations, and over
the whole process including JVM and cluster application start), median epoch ms, median
checkpoint duration (the subtasks' snapshot uploads included) and upload size, subtask moves
per epoch, restores per epoch and the median restore ms when one happened, and the median
near-empty epoch ms. The outputs of the three configurations are
compared row for row. The load average before and after is printed: the machine has 2 cores
and is shared, so numbers move with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.keyed_windows import write_events
from streamer.runtime.cluster.standalone import StandaloneCluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fragments import TOTAL, files_sink, files_source, job, section, window

STREAMER = Path(sys.executable).with_name("streamer")
EXECUTOR_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

def windows_pipeline(name: str, root: Path, data: Path, backend: str, interval: str) -> str:
    """The parquet events (a file an epoch) through 1-minute windows into jsonl files."""
    schema = "{user: string, amount: double, ts: timestamp}"
    return (job(name, checkpoint=f"{{interval: {interval}}}", backend=backend,
                local_dir=f'"{root}/local"')
            + section("sources", files_source(f'"{data}/*.parquet"', "parquet", schema=schema))
            + section("operators", window("agg", "events", "1m", TOTAL))
            + section("sinks", files_sink("agg", f'"{root}/out"')))


def empty_pipeline(name: str, root: Path, limit: int, backend: str, interval: str) -> str:
    """A datagen of 20 records an epoch (7 users, a second apart) through 10-second windows
    into jsonl files: epochs with next to nothing to do."""
    return (job(name, checkpoint=f"{{interval: {interval}}}", backend=backend,
                local_dir=f'"{root}/local"')
            + section("sources", f"""\
  - id: gen
    type: datagen
    splits: 2
    limit: {limit}
    max_records_per_epoch: 20
    fields:
      user: "concat('u', cast(offset % 7 as string))"
      ts: "timestamp_millis(1767225600000 + offset * 1000)"
    event_time: ts
""")
            + section("operators", window("agg", "gen", "10s", "{n: count()}"))
            + section("sinks", files_sink("agg", f'"{root}/out"')))


@dataclass
class Result:
    """One `streamer run` of one configuration and workload."""

    label: str
    seconds: float
    events: list[dict[str, Any]] = field(default_factory=list)
    rows: Counter[str] = field(default_factory=Counter)

    @property
    def epochs(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == "epoch"]

    @property
    def records(self) -> int:
        return sum(e["records_in_total"] for e in self.epochs)

    @property
    def epoch_seconds(self) -> float:
        return sum(e["duration_ms"] for e in self.epochs) / 1000

    def median(self, key: str, *, nonzero: bool = False) -> float | None:
        values = [float(e[key]) for e in self.epochs if e.get(key) is not None
                  and (not nonzero or e[key])]
        return statistics.median(values) if values else None

    def checkpoint_median(self, key: str) -> float | None:
        values = [float(e[key]) for e in self.events if e.get("event") == "checkpoint"
                  and e.get("status") == "completed"]
        return statistics.median(values) if values else None

    def per_epoch(self, key: str) -> float:
        return sum(e[key] for e in self.epochs) / max(1, len(self.epochs))


def run(label: str, root: Path, yaml_text: str, args: list[str]) -> Result:
    root.mkdir(parents=True)
    pipeline = root / "job.yaml"
    pipeline.write_text(yaml_text)
    started = time.perf_counter()
    proc = subprocess.run([str(STREAMER), "run", str(pipeline), "--json", "--no-ui",
                           "--storage", str(root / "storage"), *args],
                          capture_output=True, text=True, cwd=root, check=False)
    seconds = time.perf_counter() - started
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0:
        raise SystemExit(f"{label} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows: Counter[str] = Counter()
    for part in sorted((root / "out").glob("part-*.jsonl")):
        for line in part.read_text().splitlines():
            rows[json.dumps(json.loads(line), sort_keys=True)] += 1
    return Result(label, seconds, events, rows)


def fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--backend", default="rocksdb", choices=("rocksdb", "memory"))
    parser.add_argument("--empty-epochs", type=int, default=15)
    args = parser.parse_args()
    console = Console(width=180)
    load_before = os.getloadavg()
    from streamer.runtime.cluster.spark import DEFAULT_CONF

    executor_opts = f"{DEFAULT_CONF['spark.executor.extraJavaOptions']} {EXECUTOR_JVM}"
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        base = Path(tmp)
        data = base / "data"
        write_events(data, args.rows, args.files, args.keys)
        with StandaloneCluster(base / "cluster", workers=2, cores=1, memory="1g") as cluster:
            configs = [
                ("local[2], checkpoint every 10 s", "10s", ["--master", "local[2]"]),
                ("local[2], checkpoint every epoch", "1ms", ["--master", "local[2]"]),
                ("2-worker cluster (--submit)", "10s",
                 ["--submit", "--master", cluster.master_url,
                  "--conf", f"spark.executor.extraJavaOptions={executor_opts}"]),
            ]
            results: list[tuple[Result, Result]] = []
            for i, (label, interval, cli) in enumerate(configs):
                fill = {"backend": args.backend, "interval": interval}
                root = base / f"w{i}"
                windows = run(label, root, windows_pipeline(
                    name=f"bench-windows-{i}", root=root, data=data, **fill), cli)
                root = base / f"e{i}"
                empty = run(label, root, empty_pipeline(
                    name=f"bench-empty-{i}", root=root, limit=10 * args.empty_epochs,
                    **fill), cli)
                results.append((windows, empty))
                console.print(f"done: {label} ({windows.seconds:.0f} s + {empty.seconds:.0f} s)")
    load_after = os.getloadavg()

    table = Table(title=f"keyed windows, {args.rows:,} rows, {args.files} epochs, "
                        f"{args.keys:,} keys, {args.backend}, parallelism 2")
    for col in ("configuration", "records/s (epochs)", "records/s (process)",
                "epoch ms (median)", "checkpoints", "checkpoint ms (median)",
                "uploaded KB (median)", "moves / epoch",
                "restores / epoch", "restore ms (median)", "near-empty epoch ms (median)"):
        table.add_column(col, justify="right" if col != "configuration" else "left")
    for windows, empty in results:
        table.add_row(windows.label, fmt(windows.records / windows.epoch_seconds),
                      fmt(windows.records / windows.seconds), fmt(windows.median("duration_ms")),
                      str(sum(1 for e in windows.epochs if e.get("checkpoint_id") is not None)),
                      fmt(windows.checkpoint_median("duration_ms")),
                      fmt((windows.checkpoint_median("uploaded_bytes") or 0) / 1024),
                      fmt(windows.per_epoch("moves"), ".2f"),
                      fmt(windows.per_epoch("restores"), ".2f"),
                      fmt(windows.median("restore_ms", nonzero=True), ",.1f"),
                      fmt(empty.median("duration_ms")))
    console.print(table)
    same = all(w.rows == results[0][0].rows and e.rows == results[0][1].rows
               for w, e in results)
    console.print(f"outputs identical across configurations: {same} "
                  f"({sum(results[0][0].rows.values()):,} window rows)")
    console.print("load average (1, 5, 15 min) before: "
                  + ", ".join(f"{x:.1f}" for x in load_before)
                  + "; after: " + ", ".join(f"{x:.1f}" for x in load_after)
                  + f"; {os.cpu_count()} cores")
    if not same:
        raise SystemExit("the configurations committed different output")


if __name__ == "__main__":
    main()
