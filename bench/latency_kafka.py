"""End-to-end latency with one Kafka topic feeding both engines: streamer versus Spark
Structured Streaming, in one run.

    .venv/bin/python -m bench.latency_kafka [--rate 1000] [--seconds 20] [--warmup 4]

`bench/latency.py` feeds each engine its own generator (datagen; Spark's rate source, which
releases a second's rows only when that second is over), so its end-to-end figures compare
sources as much as engines. Here one producer thread writes JSON records `{user, amount,
created}` to a 2-partition topic of a local broker (scripts/kafka_broker.py) at `--rate`
records/s, in bursts every 10 ms, with `created` = the wall clock (ms) when the record was
handed to the producer (`linger.ms` 0). Both engines read the same topic from its end:

- **streamer**: `type: kafka` (confluent client), `epoch: 100ms`, checkpoints every 10 s in
  `at_least_once` mode (sinks commit every epoch), parallelism 2;
- **Spark SS**: `readStream.format("kafka")` (`startingOffsets: latest`), `from_json`, the
  same query, `foreachBatch`, its own checkpoint location, processing-time triggers 0 (as fast
  as possible) and 100 ms.

Pipelines: **stateless** (filter `amount > 1`) and **rolling** (`key_by user`, `count()` and
`max(created)`; an output row's creation time is the newest record behind it). A sink collects
the creation times of an epoch's (batch's) rows and stamps them with the wall clock when they
become visible (streamer: the sink's commit; Spark: when the batch function returns). Only
records created after `--warmup` seconds count. One session, `local[2]`, 2 shuffle partitions;
the machine is 2 cores and noisy, so compare within one run (the load average is printed).
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
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.latency import ArrivalSink, Outcome, pct, run_pipeline, run_query

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from kafka_broker import KafkaBroker

USERS = 10_000
SCHEMA = "user string, amount double, created bigint"

PIPELINE = """
name: bench-kafka-latency-{kind}-{tag}
storage: {storage}
job:
  epoch: 100ms
  parallelism: 2
  checkpoint: {{interval: 10s, mode: at_least_once}}
sources:
  - id: src
    type: kafka
    bootstrap_servers: {bootstrap}
    topic: {topic}
    start: latest
    schema: {{user: string, amount: double, created: bigint}}
operators:
  - id: op
    input: src
{op}sinks:
  - id: out
    type: console
    input: op
"""

OPS = {
    "stateless": '    filter: "amount > 1"\n',
    "rolling": "    key_by: [user]\n    aggregate: {n: count(), created: max(created)}\n",
}


class CreatedSink(ArrivalSink):
    """`ArrivalSink` over a `created` column that is already epoch ms."""

    def table_of(self, df: Any) -> Any:
        return df.selectExpr("created AS c")


class Producer(threading.Thread):
    """Writes `rate` records/s to `topic` until stopped, each stamped with its creation."""

    def __init__(self, broker: KafkaBroker, topic: str, rate: float) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer as KafkaProducer

        self.topic, self.rate = topic, rate
        self.producer = KafkaProducer({"bootstrap.servers": broker.bootstrap,
                                       "linger.ms": 0, "acks": 1})
        self.stopped = threading.Event()
        self.sent = 0

    def run(self) -> None:
        start = time.monotonic()
        while not self.stopped.is_set():
            due = int((time.monotonic() - start) * self.rate)
            while self.sent < due:
                i = self.sent
                value = json.dumps({"user": f"u{i * 7 % USERS}", "amount": float(i % 10),
                                    "created": int(time.time() * 1000)})
                try:
                    self.producer.produce(self.topic, value.encode(), partition=i % 2)
                except BufferError:  # the client's queue is full: let it drain, then retry
                    self.producer.poll(0.01)
                    continue
                self.sent += 1
            self.producer.poll(0)
            time.sleep(0.01)
        self.producer.flush(30)


def run_streamer(spark: Any, broker: KafkaBroker, topic: str, kind: str, seconds: float,
                 warmup: float, scratch: Path) -> Outcome:
    tag = uuid.uuid4().hex[:6]
    text = textwrap.dedent(PIPELINE.format(
        kind=kind, tag=tag, storage=scratch / tag, bootstrap=broker.bootstrap, topic=topic,
        op=OPS[kind]))
    return run_pipeline(spark, text, lambda spec, ctx: CreatedSink(spec, ctx, "created"),
                        seconds, warmup)


def run_spark(spark: Any, broker: KafkaBroker, topic: str, kind: str, trigger: str,
              seconds: float, warmup: float, scratch: Path) -> Outcome:
    from pyspark.sql import functions as F

    events = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", broker.bootstrap)
              .option("subscribe", topic).option("startingOffsets", "latest").load()
              .select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("r"))
              .select("r.*"))
    if kind == "stateless":
        out, mode = events.filter("amount > 1").select("created"), "append"
    else:
        out = events.groupBy("user").agg(F.count(F.lit(1)).alias("n"),
                                         F.max("created").alias("created"))
        mode = "update"
    seen: list[tuple[int, float]] = []

    def batch(frame: Any, batch_id: int) -> None:
        created = frame.select("created").toArrow().column(0).to_pylist()
        now = time.time() * 1000
        seen.extend((c, now - c) for c in created if c is not None)

    started, wall, progress, rows = run_query(
        out, mode, batch, scratch / f"sss-{uuid.uuid4().hex[:6]}", trigger, seconds)
    cutoff = (started + warmup) * 1000
    return Outcome([lat for c, lat in seen if c >= cutoff], rows, wall, progress)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="records/s produced")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each run")
    parser.add_argument("--warmup", type=float, default=4.0)
    parser.add_argument("--kinds", default="stateless,rolling")
    args = parser.parse_args()
    console = Console(width=150)
    from streamer.connectors.maven import packages_conf, spark_kafka_packages
    from streamer.runtime.cluster.spark import create_session

    scratch = Path(tempfile.mkdtemp(prefix="bench-kafka-latency-"))
    broker = KafkaBroker(scratch / "broker").start()
    producer = None
    try:
        spark = create_session("bench-kafka-latency", "local[2]", ui=False, conf={
            "spark.sql.shuffle.partitions": "2", **packages_conf({}, spark_kafka_packages())})
        topic = broker.create_topic("latency-in", 2)
        producer = Producer(broker, topic, args.rate)
        producer.start()
        loads = [os.getloadavg()[0]]
        table = Table(title=f"End-to-end latency (arrival - creation), ms, {args.rate:,.0f} "
                            f"records/s through one Kafka topic, {args.seconds:g} s runs")
        for col in ("pipeline", "engine", "p50", "p90", "p99", "rows measured",
                    "median epoch / batch ms", "p99 vs Spark SS trigger 0"):
            table.add_column(col)
        for kind in args.kinds.split(","):
            runs: dict[str, Outcome] = {}
            # A short warm-up run of each (the session's first Kafka queries are slow).
            run_streamer(spark, broker, topic, kind, 3, 0, scratch)
            run_spark(spark, broker, topic, kind, "0", 3, 0, scratch)
            runs["streamer, epoch 100ms"] = run_streamer(spark, broker, topic, kind,
                                                         args.seconds, args.warmup, scratch)
            loads.append(os.getloadavg()[0])
            for trigger in ("0", "100 milliseconds"):
                runs[f"Spark SS, trigger {trigger.replace(' milliseconds', ' ms')}"] = run_spark(
                    spark, broker, topic, kind, trigger, args.seconds, args.warmup, scratch)
                loads.append(os.getloadavg()[0])
            base = pct(runs["Spark SS, trigger 0"].latencies, 99)
            for engine, outcome in runs.items():
                if engine.startswith("streamer"):
                    times = [m.duration_ms for m in outcome.epochs[2:] if m.records_in]
                    local = sum(1 for m in outcome.epochs if m.local)
                    per = (f"{statistics.median(times):,.0f} ({local} of "
                           f"{len(outcome.epochs)} local)" if times else "-")
                else:
                    times = [float(p["durationMs"].get("triggerExecution", 0))
                             for p in outcome.epochs[2:] if p.get("numInputRows")]
                    per = f"{statistics.median(times):,.0f}" if times else "-"
                p99 = pct(outcome.latencies, 99)
                table.add_row(kind, engine, *(f"{pct(outcome.latencies, q):,.0f}"
                                              for q in (50, 90, 99)),
                              f"{len(outcome.latencies):,}", per, f"{p99 / base:.2f}x")
        console.print(table)
        console.print(f"load average (1 min) during the runs: min {min(loads):.1f}, "
                      f"max {max(loads):.1f}; {os.cpu_count()} cores; "
                      f"{producer.sent:,} records produced")
        spark.stop()
    finally:
        if producer is not None:
            producer.stopped.set()
            producer.join(60)
        broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
