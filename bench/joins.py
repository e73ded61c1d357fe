"""Joins: streamer's join operator versus Spark Structured Streaming on the same parquet
files, in one process, alternating runs and taking medians.

    .venv/bin/python -m bench.joins [--rows 1000000] [--files 5] [--repeat 3] [--cell all]

`--cell interval`: `--rows` orders (order_id bigint, amount double, ts: one order a
millisecond) and as many payments (order_id, paid, pts = ts + 0..45 s by order_id % 4), each
written as `--files` parquet files; read one file of each side per epoch / trigger. Query:
inner join on order_id where pts - ts is within [0 s, 30 s] (three payments in four match),
watermark 1 s on both sides, parquet output, `local[2]`, parallelism / shuffle partitions 2.

- streamer: `join: {between: [0s, 30s], type: inner}`, rocksdb state.
- Spark Structured Streaming: `withWatermark` on both sides, `join(..., expr(order_id =
  order_id AND pts BETWEEN ts AND ts + 30 seconds))`, append mode, `trigger(availableNow)`,
  the default (HDFS-backed) state store.
Throughput is 2 x rows / wall time of the whole run; both must give 3/4 of the orders.

`--cell table`: table enrichment. `--rows` page views (view_id, user = view_id % `--users`,
ts: one a millisecond) as `--files` parquet files, one per epoch / trigger, and a users table
of `--users` rows (user, country, plan, updated) in one parquet file. Query: each view with
its user's row (inner join on user; every user exists).

- streamer: `join: {table: true}` with the users as a bounded files source (read in the first
  epoch), rocksdb state.
- Spark Structured Streaming: the stream-static join (`views.join(static users, "user")`),
  append mode, `trigger(availableNow)` (its static side has no state).
Throughput is rows / wall time.

Both engines checkpoint every epoch / trigger. Each cell runs one warm-up round, then
`--repeat` rounds alternating which engine goes first; the table shows medians. The state
bytes per buffered record: one more streamer run stopped after half the epochs, its working
RocksDB state kept: the bytes of the join's state and timer keys and values (not the epoch
outputs kept for replays) over the records buffered in it (interval: both sides' records
waiting for a partner; table: the table's rows). Prints a table; not a test.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
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


INTERVAL = """\
name: bench-join
storage: {root}/storage
job: {{parallelism: 2, checkpoint: {{interval: 1ms}},
       state: {{backend: rocksdb, local_dir: {root}/state}}}}
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
"""

TABLE = """\
name: bench-table-join
storage: {root}/storage
job: {{parallelism: 2, checkpoint: {{interval: 1ms}},
       state: {{backend: rocksdb, local_dir: {root}/state}}}}
sources:
  - {{id: views, type: files, path: "{root}/views/*.parquet", format: parquet,
      max_files_per_epoch: 1, event_time: ts, watermark: {{max_out_of_orderness: 1s}}}}
  - {{id: users, type: files, path: "{root}/users/*.parquet", format: parquet,
      event_time: updated}}
operators:
  - id: enriched
    join: {{left: views, right: users, on: [user], table: true}}
sinks:
  - {{id: out, type: files, input: enriched, path: "{root}/out-streamer", format: parquet}}
"""


def run_streamer(spark: Any, root: Path, pipeline: str, max_epochs: int | None = None
                 ) -> tuple[float, int]:
    """(seconds, rows out) of one streamer run of `pipeline` from scratch."""
    from streamer.pipeline.validate import load_pipeline_text
    from streamer.runtime.job.coordinator import JobRunner, RunOptions

    for name in ("storage", "state", "out-streamer"):
        shutil.rmtree(root / name, ignore_errors=True)
    spec = load_pipeline_text(pipeline.format(root=root))
    started = time.perf_counter()
    result = JobRunner(spec, RunOptions(ui=False, checkpoints=True, max_epochs=max_epochs,
                                        keep_state=max_epochs is not None), spark=spark).run()
    return time.perf_counter() - started, result.records_out


def join_state(state: Path) -> tuple[int, int]:
    """(bytes, records): the keys and values of the join's states and timers in the kept
    RocksDB working state of every subtask under `state`, and the records buffered in the
    join's states."""
    import pyarrow as pa
    from rocksdict import AccessType, Options, Rdict

    from streamer.operators.join_interval import CHUNKS
    from streamer.state.codec import decode_value
    from streamer.state.rocksdb_format import unframe

    size = records = 0
    for path in sorted(p for p in state.rglob("subtask-*") if (p / "CURRENT").exists()):
        names = [n for n in Rdict.list_cf(str(path)) if n == "_timers" or n.startswith(
            "state:join.")]
        db = Rdict(str(path), options=Options(raw_mode=True),
                   column_families={n: Options(raw_mode=True) for n in names},
                   access_type=AccessType.read_only())
        try:
            for name in names:
                for key, value in db.get_column_family(name).items():
                    assert isinstance(key, bytes) and isinstance(value, bytes)
                    size += len(key) + len(value)
                    payload = unframe(value, None) if name != "_timers" else None
                    if name == f"state:{CHUNKS}" and payload:  # (a chunk of records)
                        records += pa.ipc.open_stream(decode_value(payload)).read_all().num_rows
                    elif payload:  # (a key's list of records, or a table's row)
                        records += len(decode_value(payload))
        finally:
            db.close()
    return size, records


def run_sss(spark: Any, root: Path) -> tuple[float, int]:
    from pyspark.sql import functions as F

    spark.conf.set("spark.sql.shuffle.partitions", "2")
    for name in ("out-sss", "chk-sss"):
        shutil.rmtree(root / name, ignore_errors=True)
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


def run_sss_table(spark: Any, root: Path) -> tuple[float, int]:
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    for name in ("out-sss-table", "chk-sss-table"):
        shutil.rmtree(root / name, ignore_errors=True)
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


def cell(spark: Any, root: Path, title: str, events: int, expected: int, pipeline: str,
         sss: Any, sss_name: str, files: int, repeat: int) -> Any:
    """One cell: a warm-up round, `repeat` alternating rounds, medians; then the state
    measurement run."""
    import statistics

    from rich.table import Table

    runs: dict[str, list[tuple[float, int]]] = {"streamer": [], "sss": []}
    engines = {"streamer": lambda: run_streamer(spark, root, pipeline),
               "sss": lambda: sss(spark, root)}
    for round_ in range(repeat + 1):
        order = ("streamer", "sss") if round_ % 2 == 0 else ("sss", "streamer")
        for name in order:
            result = engines[name]()
            if round_:  # (round 0 warms both up)
                runs[name].append(result)
    run_streamer(spark, root, pipeline, max_epochs=max(1, files // 2))
    size, records = join_state(root / "state")
    table = Table(title=f"{title} (local[2], median of {repeat} alternating runs)")
    for column in ("engine", "seconds", "events/s", "rows out", "ok", "vs SSS",
                   "state B/record"):
        table.add_column(column)
    medians = {name: statistics.median(t for t, _ in results) for name, results in runs.items()}
    for name, label in (("streamer", "streamer (rocksdb)"), ("sss", sss_name)):
        outs = {out for _, out in runs[name]}
        ok = "yes" if outs == {expected} else f"no ({sorted(outs)} != {expected:,})"
        table.add_row(label, f"{medians[name]:.1f}", f"{events / medians[name]:,.0f}",
                      f"{max(outs):,}", ok,
                      f"{medians['sss'] / medians[name]:.2f}x" if name == "streamer" else "1x",
                      f"{size / records:,.1f} ({records:,} records)"
                      if name == "streamer" and records else "-")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=5)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cell", choices=("interval", "table", "all"), default="all")
    args = parser.parse_args()
    from rich.console import Console

    from streamer.runtime.cluster.spark import create_session

    # A 4 GB driver heap (the default is 1 GB): Spark SS's HDFS state store keeps the state of
    # finished queries in the JVM until its maintenance unloads them, and its third
    # stream-stream run in one process ran out of a 1 GB heap (measured; streamer's runs
    # need little JVM memory, so this only helps Spark).
    spark = create_session("bench-joins", "local[2]", {"spark.sql.shuffle.partitions": "2",
                                                       "spark.driver.memory": "4g"}, ui=False)
    root = Path(tempfile.mkdtemp(prefix="bench-joins-"))
    try:
        if args.cell in ("table", "all"):
            write_table_inputs(root, args.rows, args.files, args.users)
            Console().print(cell(
                spark, root, f"table enrichment of {args.rows:,} views with {args.users:,} "
                "users", args.rows, args.rows, TABLE, run_sss_table,
                "Spark SS (stream-static join)", args.files, args.repeat))
        if args.cell in ("interval", "all"):
            write_inputs(root, args.rows, args.files)
            Console().print(cell(
                spark, root, f"interval join of 2 x {args.rows:,} events", 2 * args.rows,
                args.rows * 3 // 4, INTERVAL, run_sss, "Spark SS (HDFS state store)",
                args.files, args.repeat))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
