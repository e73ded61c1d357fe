"""Rows per second the `type: postgres` sink writes, on a real PostgreSQL server started here
(tests/postgres_server.py, fsync and synchronous commit ON unless --fast).

    python -m bench.postgres [--rows 1000000] [--repeat 3] [--fast]

One epoch of `--rows` window-like rows (user, window_start, window_end, n, spent) built by
Spark, written to a fresh table per run in each mode:
- exactly_once append: `write` (collect through Arrow, stage a parquet file) and `commit`
  (COPY into the table + the marker row, one transaction), timed apart;
- exactly_once upsert by (user, window_start): the same, the commit being COPY into a
  temporary table and INSERT ... ON CONFLICT DO UPDATE; a second epoch updates every row;
- at_least_once append: `write` loads the rows straight away.
Prints seconds and rows/s per phase, medians over `--repeat` runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def make_sink(spark: Any, dsn: str, table: str, storage: str, *, exactly_once: bool,
              upsert: bool) -> Any:
    from streamer.connectors.base import ConnectorContext
    from streamer.connectors.postgres.postgres_sink import PostgresSink
    from streamer.pipeline.validate import load_pipeline_text

    options: dict[str, Any] = {"mode": "upsert", "key": ["user", "window_start"]} if upsert \
        else {}
    doc = {"name": "bench", "sources": [{"id": "g", "type": "datagen", "limit": 1,
                                         "fields": {"x": "offset"}}],
           "sinks": [{"id": "out", "type": "postgres", "input": "g", "dsn": dsn,
                      "table": table, **options}]}
    spec = load_pipeline_text(yaml.safe_dump(doc, sort_keys=False), env={})
    sink = PostgresSink(spec.sinks[0], ConnectorContext(spark, "bench", storage_url=storage,
                                                        exactly_once=exactly_once))
    sink.open()
    return sink


def frame(spark: Any, rows: int, bump: int = 0) -> Any:
    """`rows` distinct (user, window_start) rows; `bump` changes their values."""
    return spark.sql(f"""
        SELECT concat('u', cast(id % 10000 AS string)) AS user,
               timestamp_millis(1767225600000 + (id DIV 10000) * 60000) AS window_start,
               timestamp_millis(1767225660000 + (id DIV 10000) * 60000) AS window_end,
               id % 97 + {bump} AS n, CAST(id % 1000 AS double) / 7 + {bump} AS spent
        FROM range({rows})""").cache()


def one_run(spark: Any, dsn: str, rows: int, mode: str, frames: list[Any]) -> dict[str, float]:
    """Seconds per phase of one run of `mode`."""
    table = f"bench_{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="streamer-bench-pg-") as storage:
        sink = make_sink(spark, dsn, table, storage, exactly_once=mode != "at_least_once",
                         upsert=mode == "upsert")
        sink.write(0, frames[0].limit(1))  # creates the table, outside the timings
        out: dict[str, float] = {}
        epochs = frames if mode == "upsert" else frames[:1]
        for epoch, df in enumerate(epochs, start=1):
            started = time.perf_counter()
            handle = sink.write(epoch, df)
            wrote = time.perf_counter()
            sink.commit(epoch, handle)
            done = time.perf_counter()
            label = "" if epoch == 1 else " (update)"
            out[f"write{label}"] = wrote - started
            if mode != "at_least_once":
                out[f"commit{label}"] = done - wrote
            assert handle["records"] == rows, handle
        sink.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fast", action="store_true",
                        help="fsync and synchronous commit off (as in the tests)")
    args = parser.parse_args()
    from postgres_server import PostgresServer

    from streamer.runtime.cluster.spark import create_session

    spark = create_session("bench-postgres", master="local[2]", ui=False,
                           conf={"spark.sql.shuffle.partitions": "2"})
    server = PostgresServer(durable=not args.fast).start()
    try:
        frames = [frame(spark, args.rows), frame(spark, args.rows, bump=1)]
        for f in frames:
            f.count()
        results: dict[str, dict[str, list[float]]] = {}
        for _ in range(args.repeat):  # interleaved, so load changes hit every mode alike
            for mode in ("append", "upsert", "at_least_once"):
                for phase, seconds in one_run(spark, server.dsn, args.rows, mode,
                                              frames).items():
                    results.setdefault(mode, {}).setdefault(phase, []).append(seconds)
    finally:
        server.stop()
    print(f"{args.rows:,} rows per epoch, median of {args.repeat} "
          f"({'fsync off' if args.fast else 'fsync on'}):")
    print("| mode | phase | seconds | rows/s | runs (s) |")
    print("| --- | --- | --- | --- | --- |")
    for mode, phases in results.items():
        for phase, runs in phases.items():
            median = statistics.median(runs)
            print(f"| {mode} | {phase} | {median:.2f} | {args.rows / median:,.0f} | "
                  f"{', '.join(f'{r:.2f}' for r in runs)} |")


if __name__ == "__main__":
    main()
