"""End-to-end latency and the fixed cost of an epoch: streamer versus Spark Structured Streaming.

    .venv/bin/python -m bench.latency [--seconds 20] [--curve] [--quick]

Two pipelines, each from a source at a fixed rate to a sink that records when each result
becomes visible:
- **stateless**: datagen (`ts: generated_at`, the moment the rate admits the row) -> filter
  -> sink;
- **rolling**: the same source -> `key_by: [user]` (10,000 users), `aggregate: {n: count(),
  last: max(ts)}` -> sink (each output row's creation time is the newest record behind it).

The sink collects the creation times of an epoch's rows at `write` and stamps them with the
wall clock at `commit`, when they become visible; latency = arrival - creation. streamer runs
with checkpoints every 10 s in `at_least_once` mode, so sinks commit every epoch (with
`exactly_once`, output waits for its checkpoint and latency is the checkpoint interval, as
with Flink's transactional sinks).

Spark Structured Streaming runs the same queries (rate source, `filter`, or `groupBy(user)`
with `count` and `max(timestamp)` in update mode; `foreachBatch` collecting the creation
times, arrival = when the batch function returns), with its own checkpoint location,
`local[2]`, 2 shuffle partitions, processing-time triggers. Spark's rate source releases a
second's rows only when that second has passed, so its latency is reported from when a row
became available (the end of its second, "since available"), the fair match for datagen's
`generated_at`, and also from its `timestamp` column.

Sections:
1. Near-empty epochs: 4 rows/s, `epoch: 100ms` / trigger 100 ms: median epoch (batch) time,
   and streamer with local epochs off (`STREAMER_LOCAL_ROWS=0`: every epoch runs Spark jobs).
2. Per-epoch breakdown of streamer (planning, Spark job, keyed stage, snapshot, commit).
3. Maximum throughput at `epoch: 100ms`, then latency at 1,000 rows/s and at 50 % of it:
   p50/p90/p99 for both engines (Spark at trigger 0 = as fast as possible, and 100 ms).
4. `--curve`: `job.epoch` from 100 ms to 5 s -> latency at 1,000 rows/s and max throughput.

Everything runs in one SparkSession, one process, so the engines see the same machine; it is
2 cores and noisy, so compare the ratios within one run (the load average is printed).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from streamer.connectors.base import ConnectorContext, Sink

USERS = 10_000
#: Epoch settings of the curve (docs/latency.md, "The knob, with local epochs").
CURVE = ("100ms", "250ms", "500ms", "1s", "2s", "5s")
#: Offered rate when measuring maximum throughput: above what 2 cores can take.
OFFERED = 2_000_000


def pipeline_yaml(kind: str, rate: float, epoch: str, cap: int | None = None) -> str:
    """The streamer pipeline `kind` (stateless | rolling) at `rate` rows/s."""
    op = {
        "stateless": '    filter: "amount > 1"\n',
        "rolling": "    key_by: [user]\n    aggregate: {n: count(), last: max(ts)}\n",
    }[kind]
    cap_line = f"\n    max_records_per_epoch: {cap}" if cap else ""
    return f"""
name: bench-latency-{kind}
job:
  epoch: {epoch}
  parallelism: 2
  checkpoint: {{interval: 10s, mode: at_least_once}}
sources:
  - id: gen
    type: datagen
    splits: 2
    rows_per_second: {rate}{cap_line}
    fields:
      user: "concat('u', cast(offset * 7 % {USERS} as string))"
      amount: "cast(offset % 10 as double)"
      ts: "generated_at"
operators:
  - id: op
    input: gen
{op}sinks:
  - id: out
    type: console
    input: op
"""


class ArrivalSink(Sink):
    """Stages the creation times (`column`, epoch ms) of an epoch's rows at `write`; at
    `commit`, when they become visible, records arrival - creation for each."""

    def __init__(self, spec: Any, ctx: ConnectorContext, column: str) -> None:
        super().__init__(spec, ctx)
        self.column = column
        self.staged: dict[int, list[int]] = {}
        #: (creation ms, latency ms) of every committed row
        self.seen: list[tuple[int, float]] = []

    def write(self, epoch: int, df: Any) -> dict[str, int]:
        return self.write_table(epoch, self.table_of(df).toArrow())

    @property
    def takes_tables(self) -> bool:
        return True

    def table_of(self, df: Any) -> Any:
        return df.selectExpr(f"unix_millis({self.column}) AS c")

    def write_table(self, epoch: int, table: Any) -> dict[str, int]:
        created = table.column("c").to_pylist()
        self.staged[epoch] = created
        return {"rows": len(created)}

    def commit(self, epoch: int, handle: Any) -> None:
        now = time.time() * 1000
        self.seen.extend((c, now - c) for c in self.staged.pop(epoch, []) if c is not None)


@dataclass
class Outcome:
    """One measured run: per-row latencies after the warm-up, rows, seconds, epoch times."""

    latencies: list[float]
    rows: int
    seconds: float
    epochs: list[Any] = field(default_factory=list)  # EpochMetrics (streamer) or progress
    since_timestamp: list[float] = field(default_factory=list)  # Spark only

    @property
    def throughput(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank; nan when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def run_streamer(spark: Any, kind: str, rate: float, epoch: str, seconds: float,
                 warmup: float, cap: int | None = None) -> Outcome:
    """Run the streamer pipeline for `seconds`, then stop it (with its final checkpoint)."""
    column = "ts" if kind == "stateless" else "last"
    return run_pipeline(spark, pipeline_yaml(kind, rate, epoch, cap),
                        lambda spec, ctx: ArrivalSink(spec, ctx, column), seconds, warmup)


def run_pipeline(spark: Any, text: str, make_sink: Any, seconds: float,
                 warmup: float) -> Outcome:
    """Run the pipeline `text` with its one sink made by `make_sink(spec, ctx)` (an
    `ArrivalSink`) for `seconds`, then stop it (with its final checkpoint); the latencies
    of rows created after `warmup` seconds."""
    from streamer.pipeline.validate import load_pipeline_text
    from streamer.runtime.job.coordinator import JobRunner, RunOptions

    sinks: list[ArrivalSink] = []

    def sink_factory(spec: Any, ctx: ConnectorContext) -> Sink:
        sinks.append(make_sink(spec, ctx))
        return sinks[-1]

    spec = load_pipeline_text(text)
    runner = JobRunner(spec, RunOptions(ui=False, checkpoints=True, fresh=True), spark=spark,
                       sink_factory=sink_factory)
    timer = threading.Timer(seconds, runner.request_stop)
    started = time.time()
    timer.start()
    try:
        result = runner.run()
    finally:
        timer.cancel()
    wall = time.time() - started
    cutoff = started * 1000 + warmup * 1000
    latencies = [lat for c, lat in sinks[0].seen if c >= cutoff]
    return Outcome(latencies, result.records_in, wall, list(result.metrics))


def run_spark(spark: Any, kind: str, rate: float, trigger: str, seconds: float,
              warmup: float, root: Path) -> Outcome:
    """The same query in Spark Structured Streaming, for `seconds`."""
    from pyspark.sql import functions as F

    name = f"{kind}-{rate}-{trigger.replace(' ', '')}-{time.time_ns()}"
    df = (spark.readStream.format("rate").option("rowsPerSecond", max(1, int(rate)))
          .option("numPartitions", 2).load()
          .withColumn("user", F.concat(F.lit("u"), (F.col("value") * 7 % USERS)
                                       .cast("string")))
          .withColumn("amount", (F.col("value") % 10).cast("double")))
    if kind == "stateless":
        out = df.filter("amount > 1").select("value", F.col("timestamp").alias("created"))
        mode = "append"
    else:
        out = df.groupBy("user").agg(F.count(F.lit(1)).alias("n"),
                                     F.max("timestamp").alias("created"),
                                     F.max("value").alias("value"))
        mode = "update"
    seen: list[tuple[int, int, float]] = []  # (value, created ms, arrival ms)

    def batch(frame: Any, batch_id: int) -> None:
        table = frame.selectExpr("value", "unix_millis(created) AS c").toArrow()
        now = time.time() * 1000
        seen.extend((v, c, now) for v, c in zip(table.column("value").to_pylist(),
                                                 table.column("c").to_pylist(), strict=True))

    started, wall, progress, rows = run_query(out, mode, batch, root / name, trigger, seconds)
    # The rate source stamps value v with start + v * 1000 / R and releases the rows of its
    # second v // R when that second is over.
    per_second = max(1, int(rate))
    origin = (statistics.median(c - v * 1000 / per_second for v, c, _ in seen)
              if seen else 0.0)
    cutoff = started * 1000 + warmup * 1000
    available, stamped = [], []
    for v, c, arrived in seen:
        if c < cutoff:
            continue
        stamped.append(arrived - c)
        released = origin + (v // per_second + 1) * 1000
        available.append(max(0.0, arrived - released))
    return Outcome(available, rows, wall, progress, since_timestamp=stamped)


def run_query(out: Any, mode: str, batch: Any, checkpoint: Path, trigger: str,
              seconds: float) -> tuple[float, float, list[Any], int]:
    """Run the streaming DataFrame `out` into `foreachBatch(batch)` for `seconds` with a
    processing-time `trigger` ("0": as fast as possible); (start time, wall seconds,
    progress reports, input rows)."""
    writer = (out.writeStream.outputMode(mode).foreachBatch(batch)
              .option("checkpointLocation", str(checkpoint)))
    if trigger != "0":
        writer = writer.trigger(processingTime=trigger)
    started = time.time()
    query = writer.start()
    time.sleep(seconds)
    query.stop()
    wall = time.time() - started
    progress = list(query.recentProgress)
    return started, wall, progress, sum(int(p.get("numInputRows") or 0) for p in progress)


def median_of(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _fmt(ms: float) -> str:
    return "-" if ms != ms else f"{ms:,.0f}"  # nan -> "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each run")
    parser.add_argument("--warmup", type=float, default=4.0,
                        help="rows created in the first seconds of a run are not counted")
    parser.add_argument("--curve", action="store_true", help="also the epoch curve")
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.warmup = 8.0, 2.0

    from streamer.runtime.cluster.spark import create_session

    spark = create_session("bench-latency", "local[2]", {"spark.sql.shuffle.partitions": "2"},
                           ui=False)
    root = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    os.environ["STREAMER_STORAGE"] = str(root / "storage")
    console = Console(width=150)
    load = os.getloadavg()
    try:
        _main(spark, args, root, console)
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    console.print(f"load average at start {load[0]:.1f}, at end {os.getloadavg()[0]:.1f} "
                  f"(2 cores)")


def _main(spark: Any, args: Any, root: Path, console: Console) -> None:
    secs, warm = args.seconds, args.warmup
    # Warm-up: JIT, Python workers, both engines' code paths.
    for kind in ("stateless", "rolling"):
        run_streamer(spark, kind, 1000, "100ms", 5, 0)
        run_spark(spark, kind, 1000, "0", 5, 0, root)

    # 1. near-empty epochs
    table = Table(title="1. near-empty epochs (4 rows/s; epoch 100ms / trigger 100 ms): "
                        "median ms per epoch (streamer) or micro-batch (Spark)")
    for col in ("pipeline", "streamer", "Spark SS", "streamer / Spark",
                "streamer, local epochs off"):
        table.add_column(col, justify="right")
    breakdown: dict[str, list[Any]] = {}
    for kind in ("stateless", "rolling"):
        ours = run_streamer(spark, kind, 4, "100ms", secs, warm)
        theirs = run_spark(spark, kind, 4, "100 milliseconds", secs, warm, root)
        os.environ["STREAMER_LOCAL_ROWS"] = "0"  # every epoch runs Spark jobs (small-epoch mode)
        try:
            before = run_streamer(spark, kind, 4, "100ms", secs, warm)
        finally:
            del os.environ["STREAMER_LOCAL_ROWS"]
        mine = median_of([m.duration_ms for m in ours.epochs[2:]])
        spark_ms = median_of([float(p["durationMs"].get("triggerExecution", 0))
                              for p in theirs.epochs[2:] if p.get("numInputRows")])
        table.add_row(kind, _fmt(mine), _fmt(spark_ms), f"{mine / spark_ms:.2f}x",
                      _fmt(median_of([m.duration_ms for m in before.epochs[2:]])))
        breakdown[f"{kind}, near-empty"] = ours.epochs[2:]
    console.print(table)

    # 3. throughput and latency at epoch 100ms
    maxima = {}
    for kind in ("stateless", "rolling"):
        full = run_streamer(spark, kind, OFFERED, "100ms", secs, warm, cap=OFFERED // 10)
        maxima[kind] = full.throughput
        breakdown[f"{kind}, saturated"] = full.epochs[2:]
    lat = Table(title="3. end-to-end latency, ms (arrival at the sink - creation); streamer "
                      "epoch 100ms")
    for col in ("pipeline", "rate rows/s", "engine", "p50", "p90", "p99", "rows/s done"):
        lat.add_column(col, justify="right")
    for kind in ("stateless", "rolling"):
        for rate in (1000, max(1000, int(maxima[kind] * 0.5))):
            ours = run_streamer(spark, kind, rate, "100ms", secs, warm)
            if rate == 1000:
                breakdown[f"{kind}, 1k rows/s"] = ours.epochs[2:]
            lat.add_row(kind, f"{rate:,}", "streamer",
                        *[_fmt(pct(ours.latencies, q)) for q in (50, 90, 99)],
                        f"{ours.throughput:,.0f}")
            for trigger in ("0", "100 milliseconds"):
                theirs = run_spark(spark, kind, rate, trigger, secs, warm, root)
                label = f"Spark SS, trigger {trigger if trigger != '0' else '0 (ASAP)'}"
                lat.add_row("", "", label,
                            *[_fmt(pct(theirs.latencies, q)) for q in (50, 90, 99)],
                            f"{theirs.throughput:,.0f}")
                lat.add_row("", "", "  (since its timestamp)",
                            *[_fmt(pct(theirs.since_timestamp, q)) for q in (50, 90, 99)], "")
    console.print(lat)
    console.print(f"maximum throughput at epoch 100ms (offered {OFFERED:,} rows/s, at most "
                  f"{OFFERED // 10:,} per epoch): " + ", ".join(
                      f"{k} {v:,.0f} rows/s" for k, v in maxima.items()))

    # 2. breakdown
    parts = Table(title="2. streamer per-epoch breakdown, median ms (Spark job = the epoch's "
                        "Spark actions without the keyed stage's own work)")
    for col in ("run", "epochs", "total", "planning", "Spark job", "keyed stage", "snapshot",
                "commit + checkpoint"):
        parts.add_column(col, justify="right")
    for name, epochs in breakdown.items():
        if not epochs:
            continue
        keyed = [m.keyed_ms for m in epochs if m.keyed_ms is not None]
        snaps = [m.snapshot_ms for m in epochs if m.snapshot_ms is not None]
        job = [m.run_ms - (m.keyed_ms or 0) - (m.snapshot_ms or 0) for m in epochs]
        parts.add_row(name, str(len(epochs)), _fmt(median_of([m.duration_ms for m in epochs])),
                      _fmt(median_of([m.plan_ms for m in epochs])), _fmt(median_of(job)),
                      _fmt(median_of(keyed)), _fmt(median_of(snaps)),
                      _fmt(median_of([m.commit_ms for m in epochs])))
    console.print(parts)

    if not args.curve:
        return
    curve = Table(title="4. job.epoch -> latency at 1,000 rows/s (ms) and maximum throughput")
    for col in ("epoch", "pipeline", "p50", "p90", "p99", "max rows/s"):
        curve.add_column(col, justify="right")
    from streamer.pipeline.units import parse_duration_ms

    for epoch in CURVE:
        epoch_s = (parse_duration_ms(epoch) or 0) / 1000
        per_epoch = int(OFFERED * epoch_s)
        for kind in ("stateless", "rolling"):
            ours = run_streamer(spark, kind, 1000, epoch, max(secs, 4 * epoch_s + warm), warm)
            full = run_streamer(spark, kind, OFFERED, epoch, max(secs, 3 * epoch_s + warm),
                                warm, cap=per_epoch)
            curve.add_row(epoch, kind, *[_fmt(pct(ours.latencies, q)) for q in (50, 90, 99)],
                          f"{full.throughput:,.0f}")
    console.print(curve)


if __name__ == "__main__":
    main()
