"""Stateless throughput: streamer's epoch runtime versus the same job hand-written in Spark.

    .venv/bin/python -m bench.stateless [--rows 5000000] [--repeat 3]

Pipeline: datagen -> filter -> select -> files sink (jsonl), bounded. The hand-written job is
`spark.range` with the same expressions and `df.write.json`, in the same SparkSession, same
run, alternating order. Prints a table of medians and the ratio (target: streamer <= 1.3x).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

FIELDS = {
    "user": "concat('u', cast(offset % 10000 as string))",
    "amount": "cast(offset % 997 as double) * 0.5",
    "kind": "element_at(array('view', 'click', 'buy'), cast(offset % 3 + 1 as int))",
    "ts": "timestamp_millis(1767225600000 + offset * 10)",
}
FILTER = "kind <> 'view' and amount > 10"
SELECT = {"user": "upper(user)", "amount": "round(amount * 1.2, 2)", "kind": "kind", "ts": "ts"}


def pipeline_yaml(rows: int, splits: int, out: str, per_epoch: int | None) -> str:
    fields = "\n".join(f'      {k}: "{v}"' for k, v in FIELDS.items())
    select = "\n".join(f'      {k}: "{v}"' for k, v in SELECT.items())
    cap = f"\n    max_records_per_epoch: {per_epoch}" if per_epoch else ""
    return f"""
name: bench-stateless
sources:
  - id: gen
    type: datagen
    splits: {splits}
    limit: {rows // splits}{cap}
    fields:
{fields}
operators:
  - id: keep
    input: gen
    filter: "{FILTER}"
  - id: shape
    input: keep
    select:
{select}
sinks:
  - id: out
    type: files
    input: shape
    path: {out}
    format: jsonl
"""


def run_streamer(spark, rows: int, splits: int, out: str,
                 per_epoch: int | None) -> tuple[float, int]:
    from streamer.pipeline.validate import load_pipeline_text
    from streamer.runtime.job.coordinator import JobRunner, RunOptions

    spec = load_pipeline_text(pipeline_yaml(rows, splits, out, per_epoch))
    t = time.perf_counter()
    result = JobRunner(spec, RunOptions(ui=False), spark=spark).run()
    return time.perf_counter() - t, result.epochs


def run_spark(spark, rows: int, splits: int, out: str) -> float:
    from pyspark.sql import functions as F

    from streamer.connectors.formats import timestamps_as_iso

    t = time.perf_counter()
    df = spark.range(0, rows, 1, splits).withColumnRenamed("id", "offset")
    df = df.select(*[F.expr(e).alias(k) for k, e in FIELDS.items()])
    df = df.filter(F.expr(FILTER)).select(*[F.expr(e).alias(k) for k, e in SELECT.items()])
    timestamps_as_iso(df).write.mode("overwrite").json(out)
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--splits", type=int, default=2)
    args = parser.parse_args()

    from streamer.runtime.cluster.spark import create_session

    spark = create_session("bench-stateless", "local[2]", {"spark.sql.shuffle.partitions": "2"},
                           ui=False)
    tmp = Path(tempfile.mkdtemp(prefix="bench-stateless-"))
    times: dict[str, list[float]] = {"spark": [], "streamer": [], "streamer-5-epochs": []}
    epochs: dict[str, int] = {}
    try:
        # Warm-up: JIT, Python workers, file system caches.
        run_spark(spark, 200_000, args.splits, str(tmp / "warm-spark"))
        run_streamer(spark, 200_000, args.splits, str(tmp / "warm-streamer"), None)
        for i in range(args.repeat):
            order = ["spark", "streamer", "streamer-5-epochs"]
            if i % 2:
                order.reverse()
            for name in order:
                out = str(tmp / f"{name}-{i}")
                if name == "spark":
                    times[name].append(run_spark(spark, args.rows, args.splits, out))
                else:
                    cap = args.rows // 5 if name == "streamer-5-epochs" else None
                    seconds, n = run_streamer(spark, args.rows, args.splits, out, cap)
                    times[name].append(seconds)
                    epochs[name] = n
                shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        spark.stop()

    base = statistics.median(times["spark"])
    table = Table(title=f"stateless throughput, {args.rows:,} rows, local[2], "
                        f"median of {args.repeat}")
    for col in ("job", "epochs", "median s", "rows/s", "vs hand-written Spark"):
        table.add_column(col, justify="right")
    for name, values in times.items():
        med = statistics.median(values)
        table.add_row(name, str(epochs.get(name, "-")), f"{med:.2f}",
                      f"{args.rows / med:,.0f}", f"{med / base:.2f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
