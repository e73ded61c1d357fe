"""Interval join: streamer's join operator versus Spark Structured Streaming's stream-stream
inner join with watermarks and a time range, on the same parquet files, in one process.

    .venv/bin/python -m bench.joins [--rows 200000] [--files 4] [--keys 0]

Input: `--rows` orders (order_id bigint, amount double, ts: one order a millisecond) and as
many payments (order_id, paid, pts = ts + 0..45 s by order_id % 4), each written as `--files`
parquet files; read one file of each side per epoch / trigger. Query: inner join on order_id
where pts - ts is within [0 s, 30 s] (three payments in four match), watermark 1 s on both
sides, parquet output, `local[2]`, parallelism / shuffle partitions 2.

- streamer: `join: {between: [0s, 30s], type: inner}`, rocksdb state, a bounded run.
- Spark Structured Streaming: `withWatermark` on both sides, `join(..., expr(order_id =
  order_id AND pts BETWEEN ts AND ts + 30 seconds))`, append mode, `trigger(availableNow)`,
  the default (HDFS-backed) state store.
Throughput is 2 x rows / wall time of the whole run. The output row counts are checked (both
must give 3/4 of the orders). Prints a table; not a test.

`--cell table` (or `all`, the default: both cells, one after the other in the same process):
table enrichment. `--rows` page views (view_id, user = view_id % `--users`, ts: one a
millisecond) as `--files` parquet files, one per epoch / trigger, and a users table of `--users`
rows (user, country, plan, updated) in one parquet file. Query: each view with its user's row
(inner join on user; every user exists).

- streamer: `join: {table: true}` with the users as a bounded files source (read in the first
  epoch), rocksdb state, a checkpoint every epoch; the state bytes per buffered record are the
  largest checkpoint's state size over the table's rows.
- Spark Structured Streaming: the stream-static join (`views.join(static users, "user")`),
  append mode, `trigger(availableNow)`, checkpointing (its static side has no state).
Throughput is rows / wall time.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

BASE_MS = 1767225600000  # 2026-01-01T00:00:00Z


def write_inputs(root: Path, rows: int, files: int) -> None:
    """Orders and payments as `files` parquet files each, in event-time order."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    per = rows // files
    for i in range(files):
        ids = np.arange(i * per, (i + 1) * per, dtype=np.int64)
        ts = pa.array((BASE_MS + ids) * 1000, pa.timestamp("us", tz="UTC"))
        pts = pa.array((BASE_MS + ids + (ids % 4) * 15_000) * 1000, pa.timestamp("us", tz="UTC"))
        (root / "orders").mkdir(parents=True, exist_ok=True)
        (root / "payments").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"order_id": ids, "amount": ids % 7 * 1.0, "ts": ts}),
                       root / "orders" / f"part-{i:04d}.parquet")
        pq.write_table(pa.table({"order_id": ids, "paid": ids % 7 * 1.0, "pts": pts}),
                       root / "payments" / f"part-{i:04d}.parquet")


def run_streamer(spark: Any, root: Path) -> tuple[float, int]:
    from streamer.pipeline.validate import load_pipeline_text
    from streamer.runtime.coordinator import JobRunner, RunOptions

    text = textwrap.dedent(f"""\
        name: bench-join
        storage: {root / 'storage'}
        job: {{parallelism: 2, checkpoint: {{interval: 1h}},
               state: {{backend: rocksdb, local_dir: {root / 'state'}}}}}
        sources:
          - {{id: orders, type: files, path: "{root}/orders/*.parquet", format: parquet,
              max_files_per_epoch: 1, event_time: ts, watermark: {{max_out_of_orderness: 1s}}}}
          - {{id: payments, type: files, path: "{root}/payments/*.parquet", format: parquet,
              max_files_per_epoch: 1, event_time: pts, watermark: {{max_out_of_orderness: 1s}}}}
        operators:
          - id: paid
            join: {{left: orders, right: payments, on: [order_id], between: [0s, 30s]}}
        sinks:
          - {{id: out, type: files, input: paid, path: "{root}/out-streamer", format: parquet}}
        """)
    started = time.perf_counter()
    result = JobRunner(load_pipeline_text(text), RunOptions(ui=False), spark=spark).run()
    return time.perf_counter() - started, result.records_out


def run_sss(spark: Any, root: Path) -> tuple[float, int]:
    from pyspark.sql import functions as F

    spark.conf.set("spark.sql.shuffle.partitions", "2")
    started = time.perf_counter()
    orders = (spark.readStream.schema("order_id bigint, amount double, ts timestamp")
              .option("maxFilesPerTrigger", 1).parquet(str(root / "orders"))
              .withWatermark("ts", "1 second"))
    payments = (spark.readStream.schema("order_id bigint, paid double, pts timestamp")
                .option("maxFilesPerTrigger", 1).parquet(str(root / "payments"))
                .withWatermark("pts", "1 second").withColumnRenamed("order_id", "pid"))
    joined = orders.join(payments, F.expr(
        "order_id = pid AND pts BETWEEN ts AND ts + interval 30 seconds"))
    query = (joined.writeStream.format("parquet").option("path", str(root / "out-sss"))
             .option("checkpointLocation", str(root / "chk-sss")).outputMode("append")
             .trigger(availableNow=True).start())
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    return elapsed, spark.read.parquet(str(root / "out-sss")).count()


def write_table_inputs(root: Path, rows: int, files: int, users: int) -> None:
    """Views as `files` parquet files, the users table as one."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "views").mkdir(parents=True, exist_ok=True)
    (root / "users").mkdir(parents=True, exist_ok=True)
    per = rows // files
    for i in range(files):
        ids = np.arange(i * per, (i + 1) * per, dtype=np.int64)
        ts = pa.array((BASE_MS + ids) * 1000, pa.timestamp("us", tz="UTC"))
        pq.write_table(pa.table({"view_id": ids, "user": ids % users, "ts": ts}),
                       root / "views" / f"part-{i:04d}.parquet")
    uid = np.arange(users, dtype=np.int64)
    pq.write_table(pa.table({
        "user": uid, "country": pa.array([f"c{u % 50}" for u in uid]),
        "plan": pa.array(["free", "pro", "team"][u % 3] for u in uid),
        "updated": pa.array(np.full(users, BASE_MS * 1000), pa.timestamp("us", tz="UTC"))}),
        root / "users" / "users.parquet")


def run_streamer_table(spark: Any, root: Path) -> tuple[float, int, int]:
    """(seconds, rows out, largest checkpoint's state bytes)."""
    import json

    from streamer.pipeline.validate import load_pipeline_text
    from streamer.runtime.coordinator import JobRunner, RunOptions
    from streamer.runtime.metrics import JsonReporter

    text = textwrap.dedent(f"""\
        name: bench-table-join
        storage: {root / 'storage'}
        job: {{parallelism: 2, checkpoint: {{interval: 1ms}},
               state: {{backend: rocksdb, local_dir: {root / 'state'}}}}}
        sources:
          - {{id: views, type: files, path: "{root}/views/*.parquet", format: parquet,
              max_files_per_epoch: 1, event_time: ts, watermark: {{max_out_of_orderness: 1s}}}}
          - {{id: users, type: files, path: "{root}/users/*.parquet", format: parquet,
              event_time: updated}}
        operators:
          - id: enriched
            join: {{left: views, right: users, on: [user], table: true}}
        sinks:
          - {{id: out, type: files, input: enriched, path: "{root}/out-streamer-table",
              format: parquet}}
        """)
    sizes = [0]

    class Sizes:
        def write(self, line: str) -> None:
            for item in filter(None, line.splitlines()):
                event = json.loads(item)
                if event.get("event") == "checkpoint" and event.get("state_size"):
                    sizes.append(int(event["state_size"]))

        def flush(self) -> None:
            pass

    started = time.perf_counter()
    result = JobRunner(load_pipeline_text(text), RunOptions(ui=False, checkpoints=True),
                       spark=spark, reporter=JsonReporter(Sizes())  # type: ignore[arg-type]
                       ).run()
    return time.perf_counter() - started, result.records_out, max(sizes)


def run_sss_table(spark: Any, root: Path) -> tuple[float, int]:
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    started = time.perf_counter()
    users = spark.read.parquet(str(root / "users"))
    views = (spark.readStream.schema("view_id bigint, user bigint, ts timestamp")
             .option("maxFilesPerTrigger", 1).parquet(str(root / "views")))
    query = (views.join(users, "user").writeStream.format("parquet")
             .option("path", str(root / "out-sss-table"))
             .option("checkpointLocation", str(root / "chk-sss-table")).outputMode("append")
             .trigger(availableNow=True).start())
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    return elapsed, spark.read.parquet(str(root / "out-sss-table")).count()


def table_cell(spark: Any, root: Path, rows: int, files: int, users: int) -> Any:
    """The table-enrichment rows: streamer and SSS on the same files."""
    from rich.table import Table

    write_table_inputs(root, rows, files, users)
    table = Table(title=f"table enrichment of {rows:,} views with {users:,} users (local[2])")
    for column in ("engine", "seconds", "events/s", "rows out", "ok", "state B/record"):
        table.add_column(column)
    seconds, out, state = run_streamer_table(spark, root)
    table.add_row("streamer (rocksdb, table: true)", f"{seconds:.1f}", f"{rows / seconds:,.0f}",
                  f"{out:,}", "yes" if out == rows else f"no ({rows:,})",
                  f"{state / users:,.1f}")
    seconds, out = run_sss_table(spark, root)
    table.add_row("Spark SS (stream-static join)", f"{seconds:.1f}", f"{rows / seconds:,.0f}",
                  f"{out:,}", "yes" if out == rows else f"no ({rows:,})", "-")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--cell", choices=("interval", "table", "all"), default="all")
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    from streamer.runtime.spark import create_session

    spark = create_session("bench-joins", "local[2]", {"spark.sql.shuffle.partitions": "2"},
                           ui=False)
    root = Path(tempfile.mkdtemp(prefix="bench-joins-"))
    try:
        if args.cell in ("table", "all"):
            Console().print(table_cell(spark, root, args.rows, args.files, args.users))
        if args.cell == "table":
            return
        write_inputs(root, args.rows, args.files)
        expected = args.rows * 3 // 4
        table = Table(title=f"interval join of 2 x {args.rows:,} events (local[2])")
        for column in ("engine", "seconds", "events/s", "rows out", "ok"):
            table.add_column(column)
        for name, run in (("streamer (rocksdb)", run_streamer),
                          ("Spark SS (HDFS state store)", run_sss)):
            seconds, out = run(spark, root)
            table.add_row(name, f"{seconds:.1f}", f"{2 * args.rows / seconds:,.0f}",
                          f"{out:,}", "yes" if out == expected else f"no ({expected:,})")
        Console().print(table)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
