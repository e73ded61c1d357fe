"""The benchmark matrix: streamer against Spark Structured Streaming on every pipeline shape.

    .venv/bin/python -m bench.matrix [--rows 2000000] [--keys 10000] [--files 10]
        [--files-per-epoch 2] [--repeat 3] [--cells default|all|quick|NAME,...]
        [--backend rocksdb] [--sss-configs 4|1]

One process, one `local[2]` Spark session, one data set. Each cell is a pipeline shape,
source · stateless prefix · keyed operator · sink, run by streamer and by Spark Structured
Streaming in its best configuration: the HDFS-backed and the RocksDB state store providers with
2 and 4 shuffle partitions (`--sss-configs 1`: HDFS, 2 partitions only), the fastest of the
four per cell being the baseline. Runs alternate (streamer, the SSS configurations, then the
reverse order), `--repeat` times; the table gives medians and the ratio SSS seconds / streamer
seconds (> 1: streamer is faster). A stateless cell (no keyed operator) is compared with the
same query written as a Spark batch job instead, the issue's yardstick for stateless work.

Data: `--rows` events `{id, user, amount, ts}` over one hour of event time, mostly in order with
up to 3 s of jitter; every event comes twice in a row (same id and values), so `dedupe` has
duplicates to drop; `amount` holds whole numbers, so sums are exact in any order. The same rows
as `--files` parquet, JSON-lines and CSV files (in event-time order across files), and, for
Kafka cells, in a 2-partition topic of JSON values (ts in epoch milliseconds) on a broker
started on 127.0.0.1. Per epoch: `--files-per-epoch` files (SSS: `maxFilesPerTrigger`), or
rows / files * files-per-epoch Kafka records (SSS: `maxOffsetsPerTrigger`).

Shapes: the stateless prefix is `filter: amount >= 10` then `with_columns: {amount: amount * 2
+ 1}`. Keyed: `tumbling` 1-minute windows, `sliding` 1-minute windows every 20 s, `session`
windows with a 30 s gap (each count() and sum(amount) per user, watermark 5 s), `rolling`
count and sum per user (SSS: update mode through foreachBatch), `dedupe` by id within 1 minute
(SSS: `dropDuplicatesWithinWatermark`). Kafka cells run streamer `exactly_once` (transactional
sink, checkpoints every 10 s) and SSS with its Kafka sink.

Checks: every output is compared with the truth, a Spark batch query over the same rows:
windows exactly (SSS: only those its final watermark closed, as a bounded AvailableNow query
never emits the rest), a rolling aggregate's last value per key, dedupe's and stateless
cells' rows as multisets. A cell whose output differs is marked in the table.

The default cells are a representative subset (the full product is 120 cells, over an hour per
repeat here): the keyed kinds on parquet (the fast path), each source with the prefix, each
sink, sessions and dedupe from JSON lines, Kafka end to end, and stateless JSON and Kafka.
`--cells all` runs the whole product; `--cells quick` three cells for a smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

BASE_MS = 1767225600000  # 2026-01-01T00:00:00Z
SPAN_MS = 3_600_000
JITTER_MS = 3_000
PARTITIONS = 2  # Kafka topic partitions and streamer's parallelism
FILTER = "amount >= 10"
DERIVED = "amount * 2 + 1"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
SOURCES = ("parquet", "jsonl", "csv", "kafka")
KEYED = ("tumbling", "sliding", "session", "rolling", "dedupe")
SINKS = ("parquet", "jsonl", "kafka")
WINDOWS = {"tumbling": "{tumbling: 1m}", "sliding": "{sliding: {size: 1m, slide: 20s}}",
           "session": "{session: {gap: 30s}}"}


@dataclass(frozen=True)
class Cell:
    source: str
    prefix: bool
    keyed: str  # one of KEYED, or "none": stateless
    sink: str

    @property
    def name(self) -> str:
        return f"{self.source}·{'filter+with' if self.prefix else '-'}·{self.keyed}·{self.sink}"

    @property
    def windowed(self) -> bool:
        return self.keyed in WINDOWS


def cell(text: str) -> Cell:
    source, prefix, keyed, sink = text.split("·")
    return Cell(source, prefix != "-", keyed, sink)


DEFAULT = [cell(t) for t in (
    "parquet·-·tumbling·parquet", "parquet·-·sliding·parquet", "parquet·-·session·parquet",
    "parquet·-·rolling·parquet", "parquet·-·dedupe·parquet",
    "parquet·filter+with·tumbling·parquet", "jsonl·filter+with·tumbling·jsonl",
    "csv·filter+with·tumbling·jsonl", "parquet·-·tumbling·jsonl",
    "jsonl·filter+with·session·jsonl", "jsonl·-·dedupe·jsonl",
    "kafka·filter+with·tumbling·kafka", "jsonl·filter+with·none·jsonl",
    "kafka·filter+with·none·kafka")]
QUICK = [cell(t) for t in ("parquet·-·tumbling·parquet", "jsonl·filter+with·session·jsonl",
                           "jsonl·filter+with·none·jsonl")]
ALL = [Cell(s, p, k, o) for s, p, k, o in product(SOURCES, (False, True), KEYED, SINKS)]


# --------------------------------------------------------------------------------- data
@dataclass
class Data:
    root: Path
    rows: int
    files: int
    per_epoch: int  # files per epoch
    broker: Any = None
    topic: str = ""

    def path(self, fmt: str) -> Path:
        return self.root / fmt

    @property
    def records_per_epoch(self) -> int:
        return max(1, self.rows * self.per_epoch // self.files)


def write_data(spark: Any, data: Data, keys: int) -> None:
    """The events as parquet files (pyarrow), then each file as JSON lines and CSV (Spark's
    writers, one file each, rows in the same order)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(7)
    events = data.rows // 2
    ids = np.arange(events, dtype=np.int64)
    users = rng.integers(0, keys, events)
    amounts = rng.integers(0, 1000, events).astype(np.float64)
    ts_ms = BASE_MS + ids * SPAN_MS // events - rng.integers(0, JITTER_MS, events)
    twice = np.repeat(np.arange(events), 2)  # each event twice, back to back
    width = len(str(keys - 1))
    bounds = np.linspace(0, twice.size, data.files + 1).astype(np.int64)
    target = data.path("parquet")
    target.mkdir(parents=True)
    for i in range(data.files):
        pick = twice[bounds[i]:bounds[i + 1]]
        pq.write_table(pa.table({
            "id": pa.array(ids[pick]),
            "user": pa.array(np.char.add("u", np.char.zfill(users[pick].astype(str), width))),
            "amount": pa.array(amounts[pick]),
            "ts": pa.array(ts_ms[pick], pa.timestamp("ms", tz="UTC")),
        }), target / f"events-{i:04d}.parquet")
    ts_format = "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"
    for i in range(data.files):  # one Spark write per file keeps each file's rows in order
        one = spark.read.parquet(str(target / f"events-{i:04d}.parquet")).coalesce(1)
        for fmt, writer in (("jsonl", lambda w, p: w.json(p, timestampFormat=ts_format)),
                            ("csv", lambda w, p: w.csv(p, header=True,
                                                       timestampFormat=ts_format))):
            scratch = data.root / f"{fmt}-{i}"
            writer(one.write, str(scratch))
            (part,) = scratch.glob("part-*")
            data.path(fmt).mkdir(exist_ok=True)
            part.rename(data.path(fmt) / f"events-{i:04d}.{fmt}")
            shutil.rmtree(scratch)


def fill_kafka(data: Data) -> None:
    from confluent_kafka import Producer

    data.topic = data.broker.create_topic(f"matrix-in-{uuid.uuid4().hex[:6]}", PARTITIONS)
    producer = Producer({"bootstrap.servers": data.broker.bootstrap, "linger.ms": 50,
                         "batch.size": 1_000_000, "compression.type": "lz4"})
    import pyarrow.parquet as pq

    n = 0
    for f in sorted(data.path("parquet").glob("*.parquet")):
        table = pq.read_table(f)
        cols = {c: table.column(c).to_pylist() for c in ("id", "user", "amount")}
        ts = table.column("ts").cast("int64").to_pylist()
        for i in range(table.num_rows):
            value = json.dumps({"id": cols["id"][i], "user": cols["user"][i],
                                "amount": cols["amount"][i], "ts": ts[i]})
            while True:
                try:  # by id: both copies of an event in one partition, in order
                    producer.produce(data.topic, value, partition=cols["id"][i] % PARTITIONS)
                    break
                except BufferError:
                    producer.poll(0.05)
            n += 1
            if n % 20_000 == 0:
                producer.poll(0)
    producer.flush(120)


# ------------------------------------------------------------------------- streamer
def streamer_yaml(c: Cell, data: Data, out: str, scratch: Path, backend: str) -> str:
    tag = uuid.uuid4().hex[:8]
    event = "event_time: ts\n    watermark: {max_out_of_orderness: 5s}"
    if c.source == "kafka":
        source = f"""type: kafka
    bootstrap_servers: {data.broker.bootstrap}
    topic: {data.topic}
    bounded: true
    max_records_per_epoch: {data.records_per_epoch // PARTITIONS}
    schema: {{id: bigint, user: string, amount: double, ts: bigint}}"""
        prefix_ts = "\n  - {id: ts_in, input: events, with_columns: {ts: timestamp_millis(ts)}}"
        event = "event_time: timestamp_millis(ts)\n    watermark: {max_out_of_orderness: 5s}"
    else:
        source = f"""type: files
    path: "{data.path(c.source)}"
    format: {c.source}
    schema: {{id: bigint, user: string, amount: double, ts: timestamp}}
    max_files_per_epoch: {data.per_epoch}"""
        prefix_ts = ""
    ops, last = [], "events"
    if prefix_ts:
        ops.append(prefix_ts.strip())
        last = "ts_in"
    if c.prefix:
        ops.append(f"- {{id: keep, input: {last}, filter: \"{FILTER}\"}}")
        ops.append(f"- {{id: derive, input: keep, with_columns: {{amount: \"{DERIVED}\"}}}}")
        last = "derive"
    if c.keyed != "none":
        body = {"rolling": "aggregate: {n: count(), total: sum(amount)}",
                "dedupe": "dedupe: {within: 1m}"}.get(
            c.keyed, f"window: {WINDOWS.get(c.keyed)}\n    aggregate: {{n: count(), "
                     "total: sum(amount)}")
        keys = "[id]" if c.keyed == "dedupe" else "[user]"
        ops.append(f"- id: keyed\n    input: {last}\n    key_by: {keys}\n    {body}")
        last = "keyed"
    if c.sink == "kafka":
        sink = (f"type: kafka\n    bootstrap_servers: {data.broker.bootstrap}\n"
                f"    topic: {out}")
    else:
        sink = f"type: files\n    path: \"{out}\"\n    format: {c.sink}"
    operators = ("operators:\n  " + "\n  ".join(ops)) if ops else ""
    return textwrap.dedent(f"""\
name: matrix-{tag}
storage: "{scratch / tag}"
job:
  parallelism: {PARTITIONS}
  checkpoint: {{interval: 10s, mode: exactly_once}}
  state: {{backend: {backend}, local_dir: "{scratch / tag / 'state'}"}}
sources:
  - id: events
    {source}
    {event}
{operators}
sinks:
  - id: out
    input: {last}
    {sink}
""")


def run_streamer(spark: Any, c: Cell, data: Data, scratch: Path, backend: str) -> Run:
    from streamer.pipeline.validate import load_pipeline_text
    from streamer.runtime.job.coordinator import JobRunner, RunOptions

    out = (data.broker.create_topic(f"matrix-out-{uuid.uuid4().hex[:8]}", PARTITIONS)
           if c.sink == "kafka" else str(scratch / f"out-{uuid.uuid4().hex[:8]}"))
    spec = load_pipeline_text(streamer_yaml(c, data, out, scratch, backend))
    started = time.perf_counter()
    result = JobRunner(spec, RunOptions(ui=False, checkpoints=True), spark=spark).run()
    return Run(time.perf_counter() - started, out, {"epochs": result.epochs})


# ------------------------------------------------------------ Spark Structured Streaming
@dataclass
class Run:
    seconds: float
    out: str
    extra: dict[str, Any] = field(default_factory=dict)


def _stream_source(spark: Any, c: Cell, data: Data) -> Any:
    from pyspark.sql import functions as F

    if c.source == "kafka":
        raw = (spark.readStream.format("kafka")
               .option("kafka.bootstrap.servers", data.broker.bootstrap)
               .option("subscribe", data.topic).option("startingOffsets", "earliest")
               .option("maxOffsetsPerTrigger", data.records_per_epoch).load())
        return raw.select(F.from_json(F.col("value").cast("string"),
                                      "id bigint, user string, amount double, ts bigint")
                          .alias("r")).select("r.id", "r.user", "r.amount",
                                              F.timestamp_millis("r.ts").alias("ts"))
    reader = (spark.readStream.schema("id bigint, user string, amount double, ts timestamp")
              .option("maxFilesPerTrigger", data.per_epoch))
    if c.source == "parquet":
        return reader.parquet(str(data.path("parquet")))
    if c.source == "csv":
        return reader.option("header", True).csv(str(data.path("csv")))
    return reader.json(str(data.path("jsonl")))


def _query(df: Any, c: Cell, batch: bool = False) -> tuple[Any, str]:
    """The cell's query on a streaming (or, `batch`, a batch) DataFrame, and its output
    mode."""
    from pyspark.sql import functions as F

    if c.prefix:
        df = df.filter(F.expr(FILTER)).withColumn("amount", F.expr(DERIVED))
    aggs = (F.count(F.lit(1)).alias("n"), F.sum("amount").alias("total"))
    if c.windowed:
        window = {"tumbling": F.window("ts", "1 minute"),
                  "sliding": F.window("ts", "1 minute", "20 seconds"),
                  "session": F.session_window("ts", "30 seconds")}[c.keyed]
        name = "session_window" if c.keyed == "session" else "window"
        grouped = df.withWatermark("ts", "5 seconds").groupBy(window, "user").agg(*aggs)
        return grouped.select("user", F.col(f"{name}.start").alias("window_start"),
                              F.col(f"{name}.end").alias("window_end"), "n", "total"), "append"
    if c.keyed == "rolling":
        return df.groupBy("user").agg(*aggs), "update"
    if c.keyed == "dedupe":  # (a batch has no watermark: both copies of an event are alike)
        if batch:
            return df.dropDuplicates(["id"]), "append"
        return df.withWatermark("ts", "1 minute").dropDuplicatesWithinWatermark(["id"]), "append"
    return df, "append"


def run_sss(spark: Any, c: Cell, data: Data, scratch: Path, provider: str,
            partitions: int) -> Run:
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    spark.conf.set(PROVIDER_CONF, provider)
    checkpoint = str(scratch / f"sss-chk-{uuid.uuid4().hex[:8]}")
    try:
        started = time.perf_counter()
        df, mode = _query(_stream_source(spark, c, data), c)
        if c.sink == "kafka":
            from pyspark.sql import functions as F

            out = data.broker.create_topic(f"matrix-sss-{uuid.uuid4().hex[:8]}", PARTITIONS)
            writer = (df.select(F.to_json(F.struct(*df.columns)).alias("value")).writeStream
                      .format("kafka").option("kafka.bootstrap.servers", data.broker.bootstrap)
                      .option("topic", out))
        elif mode == "update":  # the file sink appends only: each batch's updates, appended
            out = str(scratch / f"sss-out-{uuid.uuid4().hex[:8]}")
            fmt = "json" if c.sink == "jsonl" else "parquet"
            writer = df.writeStream.foreachBatch(
                lambda batch, _id: batch.write.mode("append").format(fmt).save(out))
        else:
            out = str(scratch / f"sss-out-{uuid.uuid4().hex[:8]}")
            writer = (df.writeStream.format("json" if c.sink == "jsonl" else "parquet")
                      .option("path", out))
        query = (writer.option("checkpointLocation", checkpoint).outputMode(mode)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        seconds = time.perf_counter() - started
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", str(PARTITIONS))
        spark.conf.unset(PROVIDER_CONF)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    progress = query.recentProgress
    watermark = progress[-1]["eventTime"].get("watermark") if progress else None
    return Run(seconds, out, {"watermark": watermark, "batches": len(progress)})


def run_batch(spark: Any, c: Cell, data: Data, scratch: Path) -> Run:
    """A stateless cell as a hand-written Spark batch job (the yardstick for stateless work)."""
    from pyspark.sql import functions as F

    started = time.perf_counter()
    df, _ = _query(_batch_source(spark, c, data), c, batch=True)
    if c.sink == "kafka":
        out = data.broker.create_topic(f"matrix-batch-{uuid.uuid4().hex[:8]}", PARTITIONS)
        (df.select(F.to_json(F.struct(*df.columns)).alias("value")).write.format("kafka")
         .option("kafka.bootstrap.servers", data.broker.bootstrap).option("topic", out).save())
    else:
        out = str(scratch / f"batch-out-{uuid.uuid4().hex[:8]}")
        df.write.format("json" if c.sink == "jsonl" else "parquet").save(out)
    return Run(time.perf_counter() - started, out)


def _batch_source(spark: Any, c: Cell, data: Data) -> Any:
    from pyspark.sql import functions as F

    if c.source == "kafka":
        raw = (spark.read.format("kafka").option("kafka.bootstrap.servers",
                                                 data.broker.bootstrap)
               .option("subscribe", data.topic).option("startingOffsets", "earliest").load())
        return raw.select(F.from_json(F.col("value").cast("string"),
                                      "id bigint, user string, amount double, ts bigint")
                          .alias("r")).select("r.id", "r.user", "r.amount",
                                              F.timestamp_millis("r.ts").alias("ts"))
    return spark.read.parquet(str(data.path("parquet")))  # the same rows, whatever the format


# --------------------------------------------------------------------------- checks
def _read(spark: Any, data: Data, c: Cell, out: str, schema: Any) -> Any:
    from pyspark.sql import functions as F

    if c.sink == "kafka":
        values = [v for _, v, _, _ in data.broker.read(out, timeout=120) if v]
        rows = spark.read.json(spark.sparkContext.parallelize(values, 2), schema=schema) \
            if values else spark.createDataFrame([], schema)
    elif c.sink == "jsonl":
        rows = spark.read.schema(schema).json(out)
    else:
        rows = spark.read.parquet(out)
    rows = rows.select(*[F.col(f.name).cast(f.dataType) for f in schema.fields])
    if c.keyed == "rolling":  # the last value per key: counts only grow
        rows = rows.groupBy("user").agg(F.max_by(F.struct("n", "total"), "n").alias("v")) \
            .select("user", "v.n", "v.total")
    return rows


def check(spark: Any, c: Cell, data: Data, run: Run, sss: bool) -> str:
    """'ok', or how the output differs from the truth (a batch query over the same rows)."""
    from pyspark.sql import functions as F

    truth, _ = _query(_batch_source(spark, c, data), c, batch=True)  # (no watermarks)
    schema = truth.schema
    got = _read(spark, data, c, run.out, schema)
    truth = truth.select(*[F.col(f.name) for f in schema.fields])
    if sss and c.windowed and run.extra.get("watermark"):
        truth = truth.filter(F.col("window_end") <= F.lit(run.extra["watermark"])
                             .cast("timestamp"))
    missing, extra = truth.exceptAll(got).count(), got.exceptAll(truth).count()
    return "ok" if missing == extra == 0 else f"{missing} missing, {extra} extra"


# ----------------------------------------------------------------------------- main
def rocksdb_provider(spark: Any) -> str:
    from bench.keyed_windows import rocksdb_provider as find

    return find(spark)


def broker_module() -> Any:
    for where in ("scripts", "tests"):
        path = Path(__file__).resolve().parent.parent / where / "kafka_broker.py"
        if path.exists():
            sys.path.insert(0, str(path.parent))
            import kafka_broker

            return kafka_broker
    msg = "kafka_broker.py not found in scripts/ or tests/"
    raise RuntimeError(msg)


def parse_cells(text: str) -> list[Cell]:
    named = {"default": DEFAULT, "all": ALL, "quick": QUICK}
    if text in named:
        return named[text]
    return [cell(t.strip()) for t in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--files-per-epoch", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cells", default="default")
    parser.add_argument("--backend", default="rocksdb", choices=("rocksdb", "memory"))
    parser.add_argument("--sss-configs", type=int, default=4, choices=(1, 4))
    args = parser.parse_args()
    cells = parse_cells(args.cells)
    console = Console(width=None if sys.stdout.isatty() else 160)
    scratch = Path(tempfile.mkdtemp(prefix="bench-matrix-"))
    os.environ.setdefault("STREAMER_LOG_DIR", str(scratch / "logs"))
    broker = None
    try:
        conf = {"spark.sql.shuffle.partitions": str(PARTITIONS)}
        if any("kafka" in (c.source, c.sink) for c in cells):
            from streamer.connectors.maven import packages_conf, spark_kafka_packages

            conf.update(packages_conf(conf, spark_kafka_packages()))
            broker = broker_module().KafkaBroker(scratch / "broker").start()
        from streamer.runtime.cluster.spark import create_session

        spark = create_session("bench-matrix", "local[2]", conf, ui=False)
        data = Data(scratch / "data", args.rows, args.files, args.files_per_epoch, broker)
        started = time.perf_counter()
        write_data(spark, data, args.keys)
        if broker is not None:
            fill_kafka(data)
        console.print(f"data: {args.rows:,} rows ({args.rows // 2:,} events twice), "
                      f"{args.keys:,} keys, {args.files} files per format"
                      f"{', a Kafka topic' if broker else ''}, in "
                      f"{time.perf_counter() - started:.0f} s")
        results = measure(spark, cells, data, scratch, args, console)
        print_table(console, results, args)
        spark.stop()
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)


@dataclass
class Result:
    cell: Cell
    runs: dict[str, list[Run]] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)

    def median(self, name: str) -> float:
        return statistics.median(r.seconds for r in self.runs[name])

    def peer(self) -> str:
        """The fastest configuration of the peer (SSS, or Spark batch for stateless)."""
        return min((n for n in self.runs if n != "streamer"), key=self.median)


def configs(spark: Any, c: Cell, data: Data, scratch: Path,
            args: argparse.Namespace) -> dict[str, Callable[[], Run]]:
    runs: dict[str, Callable[[], Run]] = {
        "streamer": lambda: run_streamer(spark, c, data, scratch, args.backend)}
    if c.keyed == "none":
        runs["Spark batch"] = lambda: run_batch(spark, c, data, scratch)
        return runs
    providers = [("hdfs", HDFS), ("rocksdb", rocksdb_provider(spark))]
    for (label, provider), parts in product(providers, (2, 4)):
        if args.sss_configs == 1 and (label, parts) != ("hdfs", 2):
            continue
        runs[f"SSS {label} {parts}"] = (
            lambda provider=provider, parts=parts: run_sss(spark, c, data, scratch, provider,
                                                           parts))
    return runs


#: How long one output check may take before it is abandoned (its Spark jobs cancelled).
CHECK_SECONDS = 300


def timed_check(spark: Any, c: Cell, data: Data, run: Run, sss: bool) -> str:
    """`check`, or 'check timed out' after `CHECK_SECONDS` (once, a Spark count in a check
    hung with no task running, and the whole table was lost)."""
    import threading

    found: list[str] = []
    worker = threading.Thread(target=lambda: found.append(check(spark, c, data, run, sss)),
                              daemon=True)
    worker.start()
    worker.join(CHECK_SECONDS)
    if worker.is_alive():
        spark.sparkContext.cancelAllJobs()
        return f"check timed out after {CHECK_SECONDS} s"
    return found[0] if found else "check failed"


def measure(spark: Any, cells: list[Cell], data: Data, scratch: Path, args: argparse.Namespace,
            console: Console) -> list[Result]:
    results = []
    for c in cells:
        result = Result(c)
        todo = configs(spark, c, data, scratch, args)
        try:
            for i in range(args.repeat + 1):  # round 0 warms this shape up, not counted
                order = list(todo) if i % 2 == 0 else list(reversed(todo))
                for name in order:
                    run = todo[name]()
                    if i:
                        result.runs.setdefault(name, []).append(run)
            for name, runs in result.runs.items():
                result.checks[name] = timed_check(spark, c, data, runs[-1],
                                                  name.startswith("SSS"))
        except Exception as exc:  # one broken cell does not lose the others' results
            console.print(f"  {c.name}: FAILED {type(exc).__name__}: "
                          f"{' '.join(str(exc).split())[:300]}", highlight=False)
            continue
        peer = result.peer()
        console.print(f"  {c.name}: streamer {result.median('streamer'):.1f} s, {peer} "
                      f"{result.median(peer):.1f} s, load {os.getloadavg()[0]:.1f}",
                      highlight=False)
        results.append(result)
    return results


def print_table(console: Console, results: list[Result], args: argparse.Namespace) -> None:
    table = Table(title=f"streamer ({args.backend}) vs Spark Structured Streaming's best "
                        f"configuration, {args.rows:,} rows, local[2], medians of "
                        f"{args.repeat}; ratio = peer s / streamer s")
    for col in ("source", "prefix", "keyed", "sink", "streamer s", "peer", "peer s", "ratio",
                "target", "outputs"):
        table.add_column(col, justify="right" if col.endswith(" s") or col == "ratio"
                         else "left")
    for r in results:
        c, peer = r.cell, r.peer()
        ratio = r.median(peer) / r.median("streamer")
        target = (1.0 / 1.1 if c.keyed == "none" else 1.5 if "kafka" in (c.source, c.sink)
                  else 2.0)
        bad = [f"{n}: {v}" for n, v in r.checks.items() if v != "ok"]
        table.add_row(c.source, "filter+with" if c.prefix else "-", c.keyed, c.sink,
                      f"{r.median('streamer'):.1f}", peer, f"{r.median(peer):.1f}",
                      f"{ratio:.2f}x", f"{'met' if ratio >= target else 'MISSED'} "
                      f"(>= {target:.2f}x)", "; ".join(bad) or "agree")
    console.print(table)
    console.print(f"load average now {os.getloadavg()}, {os.cpu_count()} cores", highlight=False)


if __name__ == "__main__":
    main()
