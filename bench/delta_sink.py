"""What the delta sink costs per epoch, on the driver: staging an epoch's rows (a Parquet file
under the job's storage) and committing them to the table with the epoch's `txn`.

    python -m bench.delta_sink [--rows 1000000] [--small 100] [--repeat 5] [--spark]

- a big epoch appended (`--rows`; rows/s of write_table + commit, exactly-once path),
- small epochs appended and merged into that table (`--small` rows; ms per commit, median),
- with `--spark`, also the collection of a `--rows` DataFrame on the driver (`toArrow`),
  which is how `write` gets an epoch's rows when the epoch ran as a Spark job.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from streamer.connectors.base import ConnectorContext
from streamer.connectors.delta.delta_sink import DeltaSink
from streamer.pipeline.validate import load_pipeline_text


def make_sink(root: Path, mode: str) -> DeltaSink:
    text = (f"name: bench\nsources: [{{id: g, type: datagen, fields: {{k: offset}}}}]\n"
            f"sinks: [{{id: out, type: delta, input: g, path: '{root}/table', mode: {mode}"
            + (", key: [k]" if mode == "merge" else "") + "}]\n")
    ctx = ConnectorContext(None, "bench", storage_url=str(root / "storage"),  # type: ignore[arg-type]
                           exactly_once=True)
    sink = DeltaSink(load_pipeline_text(text).sinks[0], ctx)
    sink.open()
    return sink


def rows(n: int, start: int = 0) -> pa.Table:
    ts = pa.array(range(start, start + n), pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    return pa.table({"k": pa.array(range(start, start + n), pa.int64()),
                     "user": pa.array([f"u{i % 1000}" for i in range(start, start + n)]),
                     "amount": pa.array([float(i % 100) for i in range(start, start + n)]),
                     "ts": ts})


def epoch(sink: DeltaSink, n: int, table: pa.Table) -> float:
    """Seconds to stage and commit `table` as epoch `n`."""
    t0 = time.perf_counter()
    sink.commit(n, sink.write_table(n, table))
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--spark", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        big = rows(args.rows)
        append = make_sink(root, "append")
        seconds = epoch(append, 1, big)
        print(f"append {args.rows:,} rows in one epoch: {seconds:.2f} s, "
              f"{args.rows / seconds:,.0f} rows/s")
        small: list[float] = [epoch(append, 2 + i, rows(args.small, args.rows + i * args.small))
                              for i in range(args.repeat)]
        print(f"append {args.small} rows: median {statistics.median(small) * 1000:.1f} ms "
              f"(min {min(small) * 1000:.1f}, max {max(small) * 1000:.1f})")
        merge = make_sink(root, "merge")
        merges: list[float] = [epoch(merge, 100 + i, rows(args.small, i * 7919))
                               for i in range(args.repeat)]
        from deltalake import DeltaTable

        total = DeltaTable(str(root / "table")).count()
        print(f"merge {args.small} rows into {total:,}: median "
              f"{statistics.median(merges) * 1000:.1f} ms (min {min(merges) * 1000:.1f}, "
              f"max {max(merges) * 1000:.1f})")
        if args.spark:
            spark_collect(args.rows)


def spark_collect(n: int) -> None:
    from streamer.runtime.cluster.spark import create_session

    spark: Any = create_session("bench-delta", master="local[2]", ui=False,
                                conf={"spark.sql.shuffle.partitions": "2"})
    df = spark.range(n).selectExpr("id as k", "concat('u', id % 1000) as user",
                                   "cast(id % 100 as double) as amount",
                                   "timestamp_micros(id) as ts")
    df.toArrow()  # warm up
    t0 = time.perf_counter()
    table = df.toArrow()
    seconds = time.perf_counter() - t0
    print(f"Spark toArrow of {table.num_rows:,} rows: {seconds:.2f} s, "
          f"{table.num_rows / seconds:,.0f} rows/s")
    spark.stop()


if __name__ == "__main__":
    main()
