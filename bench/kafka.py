"""Kafka end to end: the source's two clients on one topic, and streamer's Kafka -> keyed
windows -> Kafka job against the same query in Spark Structured Streaming, in one run.

    .venv/bin/python -m bench.kafka [--rows 1000000] [--keys 1000] [--partitions 2]
        [--per-epoch 250000] [--repeat 2]

A broker (scripts/kafka_broker.py: Kafka 4, KRaft, one node, 512 MB heap) runs on 127.0.0.1 of
this machine. The input topic holds `--rows` JSON records `{user, amount, ts}` (`--keys`
distinct users, ts over one hour in order per partition), produced once. Spark is `local[2]`
with 2 shuffle partitions, one session with Spark's Kafka connector on `spark.jars.packages`.

1. Source read: the whole topic as one planned slice, decoded (JSON against the schema), and
   aggregated (count, sum(amount)) with one Spark action, per client (`confluent`: confluent-
   kafka consumers in Python tasks via mapInArrow; `spark`: Spark's `spark-sql-kafka-0-10`
   batch read by offset range). Runs interleaved, `--repeat` times, median.
2. Kafka -> windows -> Kafka: per user, 1-minute tumbling event-time windows, count and
   sum(amount), watermark 5 s, output as JSON keyed by user to a fresh topic.
   - streamer, `exactly_once` with checkpoints every 10 s (transactional sink), and
     `at_least_once` (producers in the tasks), bounded source, `--per-epoch` records per
     partition per epoch, rocksdb state, parallelism 2, each client.
   - Spark Structured Streaming: `readStream.format("kafka")` with `maxOffsetsPerTrigger` equal
     to streamer's records per epoch, `from_json`, `withWatermark`, `groupBy(window, user)`,
     append mode, `writeStream.format("kafka")`, `trigger(availableNow=True)`, HDFS-backed state
     store (Spark's default), a fresh checkpoint per run.
   Throughput = input records / wall time of the run (job start to end, the session is warm).
   Output records are counted with a read_committed consumer. A bounded AvailableNow run never
   emits the windows its final watermark has not passed; streamer's bounded run emits them all,
   so streamer writes a few more windows.

The machine has 2 cores shared with other work: the load average is printed with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fragments import TOTAL, job, kafka_sink, kafka_source, section, window
from kafka_broker import KafkaBroker

BASE_MS = 1767225600000
SPAN_MS = 3_600_000


def fill(broker: KafkaBroker, topic: str, rows: int, keys: int, partitions: int) -> float:
    """Produce the input; returns seconds taken."""
    from confluent_kafka import Producer

    t0 = time.monotonic()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 50,
                         "batch.size": 1_000_000, "compression.type": "lz4"})
    per_part = rows // partitions
    for o in range(per_part):
        ts = BASE_MS + o * SPAN_MS // per_part
        for p in range(partitions):
            i = o * partitions + p
            value = json.dumps({"user": f"u{(i * 7919) % keys}", "amount": float(i % 100),
                                "ts": ts})
            while True:
                try:
                    producer.produce(topic, value, partition=p)
                    break
                except BufferError:
                    producer.poll(0.05)
        if o % 10_000 == 0:
            producer.poll(0)
    producer.flush(120)
    return time.monotonic() - t0


def source_read(spark: Any, broker: KafkaBroker, topic: str, client: str) -> tuple[float, int]:
    """Read + decode + aggregate the whole topic with one client: (seconds, records)."""
    import yaml
    from pyspark.sql import functions as F

    from streamer.connectors.base import ConnectorContext
    from streamer.connectors.kafka.kafka_source import KafkaSource
    from streamer.pipeline.validate import load_pipeline_text

    doc = {"name": "bench", "sources": [{
        "id": "src", "type": "kafka", "bootstrap_servers": broker.bootstrap, "topic": topic,
        "client": client, "bounded": True, "max_records_per_epoch": 10**9,
        "schema": {"user": "string", "amount": "double", "ts": "bigint"}}],
        "sinks": [{"id": "out", "type": "console", "input": "src"}]}
    spec = load_pipeline_text(yaml.safe_dump(doc, sort_keys=False))
    source = KafkaSource(spec.sources[0], ConnectorContext(spark, "bench"))
    t0 = time.monotonic()
    piece = source.plan(source.initial_offsets(), 0)
    assert piece is not None
    row = source.read(piece).records.agg(F.count(F.lit(1)), F.sum("amount")).collect()[0]
    return time.monotonic() - t0, int(row[0])


def pipeline(tag: str, storage: Path, mode: str, client: str, bootstrap: str, source: str,
             per_epoch: int, sink: str) -> str:
    """The topic `source` through 1-minute windows per user into the topic `sink`."""
    return (job(f"bench-kafka-{tag}", storage=storage,
                checkpoint=f"{{interval: 10s, mode: {mode}}}", backend="rocksdb")
            + section("sources", kafka_source(bootstrap, source, per_epoch=per_epoch,
                                              id="events", out_of_orderness="5s",
                                              client=client))
            + section("operators", window("per_minute", "events", "1m", TOTAL))
            + section("sinks", kafka_sink("per_minute", bootstrap, sink)))


def count_records(broker: KafkaBroker, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "bench-count",
                         "isolation.level": "read_committed"})
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        total = 0
        for p in meta.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30,
                                                       cached=False)
            total += high - low  # includes transaction markers: an upper bound
        return total
    finally:
        consumer.close()


def streamer_job(spark: Any, broker: KafkaBroker, topic: str, client: str, mode: str,
                 per_epoch: int, scratch: Path) -> tuple[float, int, int]:
    """(seconds, epochs, output records read back) of one streamer run."""
    from streamer.pipeline.validate import load_pipeline_text
    from streamer.runtime.job.coordinator import JobRunner, RunOptions

    sink = broker.create_topic(f"bench-out-{uuid.uuid4().hex[:8]}", 2)
    tag = uuid.uuid4().hex[:6]
    spec = load_pipeline_text(pipeline(tag=tag, storage=scratch / tag, mode=mode, client=client,
                                       bootstrap=broker.bootstrap, source=topic,
                                       per_epoch=per_epoch, sink=sink))
    t0 = time.monotonic()
    result = JobRunner(spec, RunOptions(ui=False, checkpoints=True), spark=spark).run()
    seconds = time.monotonic() - t0
    return seconds, result.epochs, len(broker.read(sink, timeout=120))


def sss_job(spark: Any, broker: KafkaBroker, topic: str, per_trigger: int,
            scratch: Path) -> tuple[float, int, int]:
    """(seconds, micro-batches, output records) of the same query in Structured Streaming."""
    from pyspark.sql import functions as F

    sink = broker.create_topic(f"bench-sss-{uuid.uuid4().hex[:8]}", 2)
    checkpoint = scratch / f"sss-{uuid.uuid4().hex[:6]}"
    t0 = time.monotonic()
    events = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", broker.bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", per_trigger).load()
              .select(F.from_json(F.col("value").cast("string"),
                                  "user string, amount double, ts bigint").alias("r"))
              .select("r.user", "r.amount",
                      F.timestamp_millis(F.col("r.ts")).alias("ts")))
    windows = (events.withWatermark("ts", "5 seconds")
               .groupBy(F.window("ts", "1 minute"), "user")
               .agg(F.count(F.lit(1)).alias("n"), F.sum("amount").alias("total")))
    out = windows.select(F.col("user").alias("key"), F.to_json(F.struct(
        "user", F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"), "n", "total")).alias("value"))
    query = (out.writeStream.format("kafka")
             .option("kafka.bootstrap.servers", broker.bootstrap).option("topic", sink)
             .option("checkpointLocation", str(checkpoint)).outputMode("append")
             .trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.monotonic() - t0
    batches = len(query.recentProgress)
    return seconds, batches, len(broker.read(sink, "read_uncommitted", timeout=120))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--per-epoch", type=int, default=250_000,
                        help="records per partition per epoch (SSS: per trigger, in total)")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    console = Console(width=150)
    from streamer.connectors.maven import packages_conf, spark_kafka_packages
    from streamer.runtime.cluster.spark import create_session

    scratch = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    broker = KafkaBroker(scratch / "broker").start()
    try:
        spark = create_session("bench-kafka", "local[2]", ui=False, conf={
            "spark.sql.shuffle.partitions": "2", **packages_conf({}, spark_kafka_packages())})
        topic = broker.create_topic("bench-in", args.partitions)
        took = fill(broker, topic, args.rows, args.keys, args.partitions)
        console.print(f"produced {args.rows:,} records in {took:.1f}s "
                      f"({args.rows / took:,.0f}/s); load {os.getloadavg()}")
        loads = [os.getloadavg()[0]]

        reads: dict[str, list[float]] = {"confluent": [], "spark": []}
        for _ in range(args.repeat):
            for client in reads:
                seconds, n = source_read(spark, broker, topic, client)
                assert n == args.rows, (client, n)
                reads[client].append(seconds)
                loads.append(os.getloadavg()[0])
        table = Table(title=f"1. Source read + JSON decode + aggregate, {args.rows:,} records, "
                            f"{args.partitions} partitions (median of {args.repeat})")
        for col in ("client", "seconds", "records/s", "runs (s)"):
            table.add_column(col)
        for client, times in reads.items():
            med = statistics.median(times)
            table.add_row(client, f"{med:.1f}", f"{args.rows / med:,.0f}",
                          ", ".join(f"{t:.1f}" for t in times))
        console.print(table)

        configs = [("streamer exactly_once, confluent", "confluent", "exactly_once"),
                   ("streamer exactly_once, spark client", "spark", "exactly_once"),
                   ("streamer at_least_once, confluent", "confluent", "at_least_once"),
                   ("Spark Structured Streaming", None, None)]
        results: dict[str, list[tuple[float, int, int]]] = {c[0]: [] for c in configs}
        for _ in range(args.repeat):
            for name, client, mode in configs:
                if client is None:
                    results[name].append(sss_job(spark, broker, topic,
                                                 args.per_epoch * args.partitions, scratch))
                else:
                    assert mode is not None
                    results[name].append(streamer_job(spark, broker, topic, client, mode,
                                                      args.per_epoch, scratch))
                loads.append(os.getloadavg()[0])
        table = Table(title="2. Kafka -> 1-minute tumbling windows per user -> Kafka "
                            f"(median of {args.repeat})")
        for col in ("job", "seconds", "records/s", "vs SSS", "epochs/batches", "output",
                    "runs (s)"):
            table.add_column(col)
        sss = statistics.median(r[0] for r in results["Spark Structured Streaming"])
        for name, runs in results.items():
            med = statistics.median(r[0] for r in runs)
            table.add_row(name, f"{med:.1f}", f"{args.rows / med:,.0f}", f"{sss / med:.2f}x",
                          str(runs[0][1]), f"{runs[0][2]:,}",
                          ", ".join(f"{r[0]:.1f}" for r in runs))
        console.print(table)
        console.print(f"load average (1 min) during the runs: min {min(loads):.1f}, "
                      f"max {max(loads):.1f}; now {os.getloadavg()}; {os.cpu_count()} cores")
        spark.stop()
    finally:
        broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
