"""Running one Nexmark query: its batch oracle, streamer (the pipeline in pipelines/nexmark/
through the JobRunner, as `streamer run` would), Spark Structured Streaming, and the check of
an engine's output against the oracle."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.nexmark.generator import read
from bench.nexmark.queries import Query

WATERMARK = "4 seconds"
SCHEMAS = {
    "person": "id bigint, name string, email_address string, credit_card string, city string, "
              "state string, date_time timestamp, extra string",
    "auction": "id bigint, item_name string, description string, initial_bid bigint, "
               "reserve bigint, date_time timestamp, expires timestamp, seller bigint, "
               "category bigint, extra string",
    "bid": "auction bigint, bidder bigint, price bigint, channel string, url string, "
           "date_time timestamp, extra string",
}


@dataclass
class Run:
    seconds: float
    out: str
    extra: dict[str, Any] = field(default_factory=dict)


#: The oracle's views (SSS replaces them with streaming views while it plans a query).
BATCH: dict[str, Any] = {}


def batch_views(spark: Any, root: Path) -> None:
    """The generated events as the oracle's views, with `_seq` (emission order)."""
    BATCH.clear()
    for kind in SCHEMAS:
        BATCH[kind] = spark.createDataFrame(read(root, kind)).cache()
    BATCH["side_input"] = spark.read.parquet(str(root / "side_input"))
    _register()


def _register() -> None:
    for name, df in BATCH.items():
        df.createOrReplaceTempView(name)


def oracle(spark: Any, q: Query) -> Any:
    return spark.sql(q.oracle)


def run_streamer(spark: Any, q: Query, root: Path, scratch: Path, files_per_epoch: int,
                 backend: str = "rocksdb") -> Run:
    """The query's pipeline file, reading `root` and writing under `scratch`."""
    from streamer.pipeline.validate import load_pipeline
    from streamer.runtime.job.coordinator import JobRunner, RunOptions

    out = scratch / f"streamer-{q.name}-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "NEXMARK_DATA": str(root), "NEXMARK_OUT": str(out),
           "NEXMARK_FILES_PER_EPOCH": str(files_per_epoch)}
    spec = load_pipeline(str(q.path), env)
    storage = str(scratch / f"storage-{uuid.uuid4().hex[:8]}")
    from dataclasses import replace

    spec = replace(spec, job=replace(spec.job, state_backend=backend))
    started = time.perf_counter()
    result = JobRunner(spec, RunOptions(ui=False, checkpoints=True, storage=storage),
                       spark=spark).run()
    return Run(time.perf_counter() - started, str(out / q.name), {"epochs": result.epochs})


def run_sss(spark: Any, q: Query, root: Path, scratch: Path, files_per_epoch: int) -> Run:
    """The query in Spark Structured Streaming over streaming views of the same files."""
    for kind in q.kinds:
        (spark.readStream.schema(SCHEMAS[kind]).option("maxFilesPerTrigger", files_per_epoch)
         .parquet(str(root / kind)).withWatermark("date_time", WATERMARK)
         .createOrReplaceTempView(kind))
    spark.read.parquet(str(root / "side_input")).createOrReplaceTempView("side_input")
    out = str(scratch / f"sss-{q.name}-{uuid.uuid4().hex[:8]}")
    checkpoint = str(scratch / f"sss-chk-{uuid.uuid4().hex[:8]}")
    started = time.perf_counter()
    try:
        df = spark.sql(q.sss_sql or q.oracle)
    finally:
        _register()
    if q.sss_mode == "update":
        writer = df.writeStream.foreachBatch(
            lambda batch, batch_id: batch.write.parquet(f"{out}/batch={batch_id}"))
    else:
        writer = df.writeStream.format("parquet").option("path", out)
    query = (writer.option("checkpointLocation", checkpoint).outputMode(q.sss_mode)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    progress = query.recentProgress
    watermark = progress[-1]["eventTime"].get("watermark") if progress else None
    return Run(seconds, out, {"watermark": watermark, "batches": len(progress)})


def _latest(df: Any, keys: tuple[str, ...]) -> Any:
    """The last row per key of an update stream (`_order`: the epoch or batch it came in)."""
    from pyspark.sql import functions as F

    others = [c for c in df.columns if c not in (*keys, "_order")]
    latest = df.groupBy(*keys).agg(
        F.max_by(F.struct(*others), "_order").alias("_row"))
    return latest.select(*keys, *[F.col(f"_row.{c}").alias(c) for c in others])


def output(spark: Any, q: Query, run: Run, sss: bool) -> Any:
    """An engine's answer: its rows, or for an update stream its last row per key."""
    from pyspark.sql import functions as F

    path = run.out + ("_counts" if q.name == "q12" and not sss else "")
    if not Path(path).exists() or not any(Path(path).rglob("*.parquet")):
        return None
    df = spark.read.option("basePath", path).parquet(path)
    if sss and q.sss_mode == "update":
        df = df.withColumn("_order", F.col("batch").cast("long")).drop("batch")
        keys = ("bidder", "starttime") if q.name == "q12" else q.keys
        df = _latest(df, keys) if keys else df.drop("_order")
    elif q.keys:
        df = _latest(df.withColumn("_order", F.regexp_extract(
            F.input_file_name(), r"part-(\d+)-", 1).cast("long")), q.keys)
    if q.name == "q12":
        df = df.groupBy("bidder").agg(F.sum("bid_count").alias("bid_count"))
    return df


def check(spark: Any, q: Query, run: Run, sss: bool) -> str:
    """'yes (n rows)', or how the engine's answer differs from the oracle's."""
    from pyspark.sql import functions as F

    truth = oracle(spark, q)
    if sss and q.window_end and run.extra.get("watermark"):
        truth = truth.filter(F.expr(q.window_end)
                             <= F.lit(run.extra["watermark"]).cast("timestamp"))
    got = output(spark, q, run, sss)
    if got is None:
        got = spark.createDataFrame([], truth.schema)
    missing_cols = [f.name for f in truth.schema.fields if f.name not in got.columns]
    if missing_cols:
        return f"no: columns {missing_cols} missing"
    got = got.select(*[F.col(f.name).cast(f.dataType) for f in truth.schema.fields])
    missing, extra = truth.exceptAll(got).count(), got.exceptAll(truth).count()
    rows = truth.count()
    return f"yes ({rows:,} rows)" if missing == extra == 0 else (
        f"no: {missing:,} of {rows:,} missing, {extra:,} extra")
