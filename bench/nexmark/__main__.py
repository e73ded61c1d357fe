"""The Nexmark benchmark: streamer against Spark Structured Streaming on Q0-Q22.

    .venv/bin/python -m bench.nexmark [--events 200000] [--queries all|q0,q1,...]
        [--files 10] [--files-per-epoch 2] [--repeat 3] [--backend rocksdb] [--keep DIR]

One process, one `local[2]` Spark session (shuffle partitions 2), one data set from
bench/nexmark/generator.py (persons, auctions and bids at 1:3:46 as parquet files). Each query
runs as its pipeline in pipelines/nexmark/ (streamer, through the JobRunner as `streamer run`
does, checkpointing) and, where Spark Structured Streaming can express it, as the same SQL over
streaming views of the same files (`maxFilesPerTrigger` = `--files-per-epoch`, a 4 s watermark,
the HDFS state store, AvailableNow). After a warm-up round, `--repeat` rounds alternate which
engine goes first; the table gives the medians as events/s (all generated events, persons,
auctions and bids, over the run's seconds, Nexmark's measure) and the ratio streamer / SSS.
Both engines' last outputs are checked against the query's batch oracle (Spark SQL over the
same rows): windows that SSS's final watermark did not close are left out of its oracle, since
an AvailableNow run never emits them. A pending query (pipelines/nexmark/pending/) is "n/a"
for streamer; a query SSS cannot run is "n/a" with Spark's reason.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.nexmark import run
from bench.nexmark.generator import Config, write
from bench.nexmark.queries import BY_NAME, QUERIES, Query

TARGET = 2.0


@dataclass
class Result:
    query: Query
    seconds: dict[str, list[float]] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)
    na: dict[str, str] = field(default_factory=dict)
    loads: list[float] = field(default_factory=list)

    def eps(self, engine: str, events: int) -> float | None:
        runs = self.seconds.get(engine)
        return events / statistics.median(runs) if runs else None


def measure(spark, q: Query, root: Path, scratch: Path, args: argparse.Namespace,
            console: Console) -> Result:
    result = Result(q)
    engines: dict[str, object] = {}
    if q.pending:
        result.na["streamer"] = f"pending: needs {q.pending}"
    else:
        engines["streamer"] = lambda: run.run_streamer(spark, q, root, scratch,
                                                       args.files_per_epoch, args.backend)
    if q.sss_na:
        result.na["SSS"] = q.sss_na
    else:
        engines["SSS"] = lambda: run.run_sss(spark, q, root, scratch, args.files_per_epoch)
    last: dict[str, run.Run] = {}
    for i in range(args.repeat + 1):  # round 0 warms up, not counted
        order = list(engines) if i % 2 == 0 else list(reversed(engines))
        for name in order:
            if name in result.na:
                continue
            try:
                r = engines[name]()  # type: ignore[operator]
            except Exception as exc:  # an engine that cannot run the query: n/a, with why
                text = " ".join(str(exc).split())
                text = text.split("terminated with exception: ")[-1]  # Spark's reason
                result.na[name] = ("failed: " if name == "streamer" else "") + text[:160]
                continue
            last[name] = r
            if i:
                result.seconds.setdefault(name, []).append(r.seconds)
                result.loads.append(os.getloadavg()[0])
    for name, r in last.items():
        if name not in result.na:
            result.checks[name] = run.check(spark, q, r, name == "SSS")
    console.print(f"  {q.name}: " + ", ".join(
        f"{n} {statistics.median(s):.1f} s" for n, s in result.seconds.items())
        + f" (load {os.getloadavg()[0]:.1f})", highlight=False)
    return result


def print_table(console: Console, results: list[Result], args: argparse.Namespace) -> None:
    table = Table(title=f"Nexmark, {args.events:,} events, local[2], {args.files} files per "
                        f"kind, {args.files_per_epoch} per epoch, medians of {args.repeat}; "
                        f"events/s = all events / run seconds")
    for col in ("query", "streamer ev/s", "SSS ev/s", "ratio", "streamer correct",
                "SSS correct", "load"):
        table.add_column(col, justify="right" if "ev/s" in col or col in ("ratio", "load")
                         else "left", overflow="fold")
    for r in results:
        mine, theirs = r.eps("streamer", args.events), r.eps("SSS", args.events)
        ratio = (f"{mine / theirs:.2f}x {'met' if mine / theirs >= TARGET else 'MISSED'}"
                 if mine and theirs else "-")
        table.add_row(f"{r.query.name} {r.query.title}",
                      f"{mine:,.0f}" if mine else "n/a", f"{theirs:,.0f}" if theirs else "n/a",
                      ratio, r.checks.get("streamer", r.na.get("streamer", "")),
                      r.checks.get("SSS", "n/a: " + r.na.get("SSS", "")),
                      f"{statistics.mean(r.loads):.1f}" if r.loads else "")
    console.print(table)
    console.print(f"load average now {os.getloadavg()}, {os.cpu_count()} cores; target: "
                  f"streamer >= {TARGET:.0f}x SSS where SSS runs the query", highlight=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--queries", default="all")
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--files-per-epoch", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backend", default="rocksdb", choices=("rocksdb", "memory"))
    parser.add_argument("--keep", type=Path, help="keep the data and outputs in this directory")
    args = parser.parse_args()
    queries = QUERIES if args.queries == "all" else [BY_NAME[n.strip()]
                                                      for n in args.queries.split(",")]
    console = Console(width=None if sys.stdout.isatty() else 200)
    scratch = args.keep or Path(tempfile.mkdtemp(prefix="bench-nexmark-"))
    scratch.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("STREAMER_LOG_DIR", str(scratch / "logs"))
    try:
        started = time.perf_counter()
        counts = write(Config(events=args.events, files=args.files), scratch / "data")
        console.print(f"data: {args.events:,} events {counts} in "
                      f"{time.perf_counter() - started:.1f} s", highlight=False)
        from streamer.runtime.cluster.spark import create_session

        spark = create_session("bench-nexmark", "local[2]",
                               {"spark.sql.shuffle.partitions": "2"}, ui=False)
        run.batch_views(spark, scratch / "data")
        results = [measure(spark, q, scratch / "data", scratch, args, console)
                   for q in queries]
        print_table(console, results, args)
        spark.stop()
    finally:
        if args.keep is None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
