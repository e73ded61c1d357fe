"""Kafka -> Kafka latency, streamer against Spark 4.3 Real-time Mode, in one run (issue 36).

    .venv/bin/python -m bench.latency_rtm [--rates 1000,100000] [--kinds stateless,rolling]
        [--seconds 20] [--warmup 10] [--repeat 1] [--modes epochs] [--master local[4]]
        [--cluster CORES]

One producer (`bench.latency_kafka.Producer`, in a process of its own so that it shares no
GIL with the meter) writes JSON records `{user, amount,
created}` to a 2-partition topic of a local broker (scripts/kafka_broker.py) at each rate,
`created` being the wall clock (ms) when the record was handed to the producer. Every engine
reads that topic from its end and writes JSON records to a fresh output topic of its own;
an **output meter** (a confluent-kafka consumer thread on that topic, `read_uncommitted` or
`read_committed`) stamps each record with the wall clock when it is consumed. Latency =
consume time - `created` (for an aggregate row, `created` is `max(created)` of its key: the
newest input behind it). Only records created in the measured window count: from `--warmup`
seconds after the engine's first output record, for `--seconds`; the engine then runs on
until its output passed the window (a record created after it came out; at most `--tail`
seconds) and `--grace` seconds more, so a slow engine is measured, not cut off.

Pipelines: **stateless** (filter `amount > 1`) and **rolling** (count per `user`, with
`max(created)`, emitting every update). Engines, alternated within each repeat:

- **Spark RTM**: `readStream.format("kafka")`, `from_json`, the query, `to_json`,
  `writeStream.format("kafka")`, `outputMode("update")`, `trigger(realTime=--rtm-batch)`.
  The real-time batch duration is a checkpoint interval, not a latency target (records flow
  through long-running tasks); its allowlist (`RealTimeModeAllowlist`) takes filters and
  projections and, of the stateful operators, the streaming aggregate (planned as
  `StatefulStreamlineAggregateExec` with the state store), deduplication and
  transformWithState: `groupBy(user).agg(count, max)` in update mode is the closest to a
  rolling count per key. The batch duration defaults to 10 s, the interval of streamer's
  at_least_once checkpoints below: at each batch boundary RTM commits and starts new tasks,
  and the records of that moment wait (measured here: a few hundred ms stateless, about a
  second with state), so a shorter duration raises its p99. Every stage of an RTM query
  runs at once (the shuffle is pipelined), so it needs a slot per source partition plus one
  per shuffle partition: 2 + 2 here, hence `local[4]`: under `local[2]` the rolling query fails with
  `CONCURRENT_SCHEDULER_INSUFFICIENT_SLOT` (it needs 4 concurrent task slots).
- **streamer**: `streamer run` in a subprocess (its own Spark, `--master` as Spark's),
  `type: kafka` source (`start: latest`) and sink, `job.execution.mode` from `--modes`
  (`epochs`; `continuous` once Kafka runs there: the mode is one argument), `epoch: 100ms`,
  parallelism 2, `checkpoint.mode: at_least_once` (every epoch commits its output: the
  low-latency path); and a row with `exactly_once`, a 1 s checkpoint interval and a
  `read_committed` meter (output becomes visible when its checkpoint's transaction commits).

With `--cluster CORES`, each streamer mode also runs (at_least_once) with `--submit` on a
standalone cluster of 2 workers of CORES cores each (`runtime.cluster.standalone`), started
for the run: the continuous mode's gang needs a slot per source and keyed subtask (4 here).

The table has a row per pipeline x rate x engine: medians over `--repeat` runs of p50, p99
and max, the records measured, and the 1-minute load average. The machine is small and
shared: read the figures as a comparison within one run, never as absolute numbers.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

from rich.console import Console
from rich.table import Table

from bench.latency import pct
from bench.latency_kafka import SCHEMA, KafkaBroker, Producer

#: The creation time in an output record's JSON (`created`, or `max_created`).
CREATED = re.compile(rb'"(?:max_)?created"\s*:\s*(-?\d+)')

STREAMER_PIPELINE = """
name: bench-rtm-{kind}-{tag}
job:
  epoch: {epoch}
  parallelism: 2
  checkpoint: {{interval: {interval}, mode: {checkpoint}}}
  execution: {{mode: {mode}}}
sources:
  - id: src
    type: kafka
    bootstrap_servers: {bootstrap}
    topic: {source}
    start: latest
    format: json
    schema: {{user: string, amount: double, created: bigint}}
operators:
  - id: op
    input: src
{op}sinks:
  - id: out
    type: kafka
    input: op
    bootstrap_servers: {bootstrap}
    topic: {sink}
{key}"""

OPS = {
    "stateless": '    filter: "amount > 1"\n',
    "rolling": "    key_by: [user]\n    aggregate: {n: count(), created: max(created)}\n",
}


def produce(bootstrap: str, topic: str, rate: float, stop: Any, sent: Any) -> None:
    """`bench.latency_kafka.Producer` in a process of its own, so that neither it nor the
    output meter waits for the other's GIL; `sent` follows its count."""
    producer = Producer(SimpleNamespace(bootstrap=bootstrap), topic, rate)
    producer.start()
    while not stop.wait(0.2):
        sent.value = producer.sent
    producer.stopped.set()
    producer.join(60)
    sent.value = producer.sent


class ProducerProcess:
    """Starts `produce` in a spawned process; `sent` is its count so far."""

    def __init__(self, bootstrap: str, topic: str, rate: float) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.stop_event, self.count = ctx.Event(), ctx.Value("q", 0)
        self.proc = ctx.Process(target=produce, daemon=True,
                                args=(bootstrap, topic, rate, self.stop_event, self.count))
        self.proc.start()

    @property
    def sent(self) -> int:
        return int(self.count.value)

    def stop(self) -> None:
        self.stop_event.set()
        self.proc.join(90)
        if self.proc.is_alive():
            self.proc.kill()


class OutputMeter(threading.Thread):
    """Consumes an output topic from its start and keeps, per record, (created ms, consumed
    ms): the wall clock when the consumer handed the record over."""

    def __init__(self, bootstrap: str, topic: str, isolation: str = "read_uncommitted"
                 ) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Consumer

        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"meter-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "isolation.level": isolation,
            # Return what the broker has at once: the default waits up to 500 ms for more.
            "fetch.wait.max.ms": 5, "fetch.min.bytes": 1})
        self.consumer.subscribe([topic])
        self.stopped = threading.Event()
        self.first = threading.Event()
        self.first_at = 0.0  # wall clock (s) of the first output record
        self.created: list[int] = []
        self.consumed: list[float] = []
        self.unparsed = 0

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                batch = self.consumer.consume(num_messages=2000, timeout=0.05)
                now = time.time() * 1000
                for m in batch:
                    if m.error():
                        continue
                    found = CREATED.search(m.value() or b"")
                    if found is None:
                        self.unparsed += 1
                        continue
                    self.created.append(int(found.group(1)))
                    self.consumed.append(now)
                if self.created and not self.first.is_set():
                    self.first_at = now / 1000
                    self.first.set()
        finally:
            self.consumer.close()

    def passed(self, until: float, timeout: float) -> bool:
        """Wait until a record created at or after `until` (wall clock, s) was consumed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.created and max(self.created[-2000:]) >= until * 1000:
                return True
            time.sleep(0.1)
        return False

    def latencies(self, since: float, until: float) -> list[float]:
        """Latencies (ms) of the records created in [since, until) (wall clock, s)."""
        lo, hi = since * 1000, until * 1000
        return [t - c for c, t in zip(self.created, self.consumed, strict=False)
                if lo <= c < hi]

    def stop(self) -> None:
        self.stopped.set()
        self.join(30)


class Engine(Protocol):
    """One engine running one pipeline from the input topic to an output topic."""

    def start(self) -> None: ...
    def failure(self) -> str | None: ...
    def stop(self) -> None: ...


@dataclass
class Variant:
    """An engine configuration: a row label, the meter's isolation and how to start it."""

    label: str
    isolation: str
    make: Any  # (kind, in_topic, out_topic, scratch) -> Engine


@dataclass
class Run:
    latencies: list[float] = field(default_factory=list)
    error: str | None = None
    load: float = 0.0


class RtmEngine:
    """The pipeline as a Spark Real-time Mode query in this process's session."""

    def __init__(self, spark: Any, bootstrap: str, kind: str, source: str, sink: str,
                 batch: str, checkpoint: Path) -> None:
        self.spark, self.bootstrap, self.kind = spark, bootstrap, kind
        self.source, self.sink, self.batch, self.checkpoint = source, sink, batch, checkpoint
        self.query: Any = None

    def start(self) -> None:
        from pyspark.sql import functions as F

        events = (self.spark.readStream.format("kafka")
                  .option("kafka.bootstrap.servers", self.bootstrap)
                  .option("subscribe", self.source).option("startingOffsets", "latest")
                  .load()
                  .select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("r"))
                  .select("r.*"))
        if self.kind == "stateless":
            out = events.filter("amount > 1").select(
                F.to_json(F.struct("user", "amount", "created")).alias("value"))
        else:
            out = (events.groupBy("user")
                   .agg(F.count(F.lit(1)).alias("n"), F.max("created").alias("created"))
                   .select(F.col("user").alias("key"),
                           F.to_json(F.struct("user", "n", "created")).alias("value")))
        self.query = (out.writeStream.format("kafka")
                      .option("kafka.bootstrap.servers", self.bootstrap)
                      .option("topic", self.sink)
                      .option("checkpointLocation", str(self.checkpoint))
                      .outputMode("update").trigger(realTime=self.batch).start())

    def failure(self) -> str | None:
        if self.query is None or self.query.isActive:
            return None
        exc = self.query.exception()
        return "query stopped" if exc is None else f"{exc}".splitlines()[0]

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()


class StreamerEngine:
    """The pipeline as `streamer run` in a subprocess; SIGTERM stops it after a last
    checkpoint."""

    def __init__(self, bootstrap: str, kind: str, source: str, sink: str, scratch: Path,
                 mode: str, checkpoint: str, interval: str, master: str) -> None:
        tag = uuid.uuid4().hex[:6]
        self.dir = scratch / f"streamer-{tag}"
        self.dir.mkdir(parents=True)
        self.file = self.dir / "pipeline.yaml"
        self.file.write_text(textwrap.dedent(STREAMER_PIPELINE.format(
            kind=kind, tag=tag, epoch="100ms", interval=interval, checkpoint=checkpoint,
            mode=mode, bootstrap=bootstrap, source=source, sink=sink, op=OPS[kind],
            key="    key: user\n" if kind == "rolling" else "")))
        self.master = master
        #: `streamer run --submit --master <master>` (a standalone cluster's URL) when true.
        self.submit = master.startswith("spark://")
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.dir / "run.log"

    def start(self) -> None:
        streamer = Path(sys.executable).with_name("streamer")
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [str(streamer), "run", str(self.file), "--json", "--no-ui", "--fresh",
                 *(["--submit"] if self.submit else []),
                 "--master", self.master, "--storage", str(self.dir / "storage")],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)

    def failure(self) -> str | None:
        if self.proc is None or self.proc.poll() is None:
            return None
        lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
        # `streamer` prints a refusal as "error FILE:LINE:COL: ..." then a count of problems.
        errors = [ln for ln in lines if ln.startswith("error")] or lines[-1:] or ["no output"]
        return f"exit {self.proc.returncode}: {errors[0].replace(str(self.dir) + '/', '')}"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


def measure(engine: Engine, meter: OutputMeter, args: argparse.Namespace) -> Run:
    """Start `engine`, wait for its first output, measure the window, stop it."""
    meter.start()
    engine.start()
    try:
        deadline = time.monotonic() + args.startup
        while not meter.first.wait(0.5):
            error = engine.failure()
            if error is not None:
                return Run(error=error, load=os.getloadavg()[0])
            if time.monotonic() > deadline:
                return Run(error=f"no output within {args.startup:g} s",
                           load=os.getloadavg()[0])
        since = meter.first_at + args.warmup
        until = since + args.seconds
        time.sleep(max(0.0, until - time.time()))
        # Run on until the output has passed the window (a record created after it came
        # out), or for at most --tail seconds: an engine behind is measured, not cut off.
        behind = not meter.passed(until, args.tail)
        time.sleep(args.grace)
        load = os.getloadavg()[0]
        error = engine.failure() or (
            f"behind: output had not passed the window {args.tail:g} s after it "
            "(the window's slowest records are missing)" if behind else None)
        return Run(meter.latencies(since, until), error, load)
    finally:
        engine.stop()
        meter.stop()


def variants(spark: Any, broker: KafkaBroker, args: argparse.Namespace,
             cluster: str | None = None) -> list[Variant]:
    """The engine configurations of one pipeline, in the order they alternate (with a
    standalone cluster's URL, streamer's on that cluster too)."""
    out = [Variant(f"Spark RTM, realTime {args.rtm_batch}", "read_uncommitted",
                   lambda kind, src, sink, scratch: RtmEngine(
                       spark, broker.bootstrap, kind, src, sink, args.rtm_batch,
                       scratch / f"rtm-{uuid.uuid4().hex[:6]}"))]
    for mode in args.modes.split(","):
        out.append(Variant(f"streamer {mode}, at_least_once", "read_uncommitted",
                           lambda kind, src, sink, scratch, mode=mode: StreamerEngine(
                               broker.bootstrap, kind, src, sink, scratch, mode,
                               "at_least_once", "10s", args.master)))
        if args.exactly_once:
            out.append(Variant(f"streamer {mode}, exactly_once 1s, read_committed",
                               "read_committed",
                               lambda kind, src, sink, scratch, mode=mode: StreamerEngine(
                                   broker.bootstrap, kind, src, sink, scratch, mode,
                                   "exactly_once", "1s", args.master)))
        if cluster is not None:
            out.append(Variant(f"streamer {mode}, at_least_once, --submit to the cluster",
                               "read_uncommitted",
                               lambda kind, src, sink, scratch, mode=mode: StreamerEngine(
                                   broker.bootstrap, kind, src, sink, scratch, mode,
                                   "at_least_once", "10s", cluster)))
    return out


def median_of(values: list[float]) -> str:
    return f"{statistics.median(values):,.1f}" if values else "-"


def report(console: Console, results: dict[tuple[str, float, str], list[Run]],
           args: argparse.Namespace, produced: dict[float, float]) -> None:
    table = Table(title=f"Kafka -> Kafka latency (consumed - created), ms; medians of "
                        f"{args.repeat} run(s) of {args.seconds:g} s after {args.warmup:g} s "
                        f"warm-up; master {args.master}")
    for col in ("pipeline", "rate/s (produced)", "engine", "p50", "p99", "max", "count",
                "load avg", "note"):
        table.add_column(col)
    for (kind, rate, label), runs in results.items():
        ok = [r for r in runs if r.latencies]
        errors = "; ".join(sorted({r.error for r in runs if r.error}))
        table.add_row(
            kind, f"{rate:,.0f} ({produced.get(rate, 0):,.0f})", label,
            median_of([pct(r.latencies, 50) for r in ok]),
            median_of([pct(r.latencies, 99) for r in ok]),
            median_of([max(r.latencies) for r in ok]),
            median_of([float(len(r.latencies)) for r in ok]).removesuffix(".0"),
            median_of([r.load for r in runs]), errors[:120])
    console.print(table)
    console.print(f"{os.cpu_count()} cores, shared with other jobs: compare within this run.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="1000,100000", help="records/s, comma-separated")
    parser.add_argument("--kinds", default="stateless,rolling",
                        help="pipelines: stateless, rolling")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window, s")
    parser.add_argument("--warmup", type=float, default=10.0,
                        help="seconds after an engine's first output before the window (both "
                             "drain what arrived while they started for 3-8 s here)")
    parser.add_argument("--tail", type=float, default=60.0,
                        help="at most this many seconds for the output to pass the window")
    parser.add_argument("--grace", type=float, default=1.0,
                        help="seconds an engine runs on once its output passed the window")
    parser.add_argument("--startup", type=float, default=180.0,
                        help="how long an engine may take to its first output")
    parser.add_argument("--repeat", type=int, default=1, help="runs per row (medians)")
    parser.add_argument("--engines", default="rtm,streamer", help="rtm, streamer")
    parser.add_argument("--modes", default="epochs",
                        help="streamer's job.execution.mode values, comma-separated")
    parser.add_argument("--no-exactly-once", dest="exactly_once", action="store_false",
                        help="leave out the exactly_once / read_committed row")
    parser.add_argument("--rtm-batch", default="10 seconds",
                        help="Real-time Mode's batch duration (its checkpoint interval)")
    parser.add_argument("--cluster", type=int, default=0, metavar="CORES",
                        help="also run streamer with --submit on a standalone cluster of 2 "
                             "workers of CORES cores each (0: not)")
    parser.add_argument("--master", default="local[4]",
                        help="Spark master of both engines (RTM needs a slot per source "
                             "partition and per shuffle partition)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    console = Console(width=160)
    from streamer.connectors.maven import packages_conf, spark_kafka_packages
    from streamer.runtime.cluster.spark import create_session
    from streamer.runtime.cluster.standalone import StandaloneCluster

    scratch = Path(tempfile.mkdtemp(prefix="bench-rtm-"))
    broker = KafkaBroker(scratch / "broker").start()
    engines = set(args.engines.split(","))
    results: dict[tuple[str, float, str], list[Run]] = {}
    produced: dict[float, float] = {}
    cluster = None
    if args.cluster:
        cluster = StandaloneCluster(scratch / "cluster", workers=2, cores=args.cluster,
                                    memory="1g").start()
    try:
        spark = create_session("bench-rtm", args.master, ui=False, conf={
            "spark.sql.shuffle.partitions": "2",
            **packages_conf({}, spark_kafka_packages())})
        chosen = [v for v in variants(spark, broker, args,
                                      cluster.master_url if cluster else None)
                  if ("rtm" if v.label.startswith("Spark") else "streamer") in engines]
        for rate in (float(r) for r in args.rates.split(",")):
            source = broker.create_topic(f"rtm-in-{rate:.0f}", 2)
            producer = ProducerProcess(broker.bootstrap, source, rate)
            began, sent = time.monotonic(), producer.sent
            try:
                for kind in args.kinds.split(","):
                    for _ in range(args.repeat):
                        for v in chosen:
                            sink = broker.create_topic(f"rtm-out-{uuid.uuid4().hex[:8]}", 2)
                            meter = OutputMeter(broker.bootstrap, sink, v.isolation)
                            run = measure(v.make(kind, source, sink, scratch), meter, args)
                            results.setdefault((kind, rate, v.label), []).append(run)
                            console.print(f"{kind} {rate:,.0f}/s {v.label}: "
                                          f"{len(run.latencies):,} measured, p99 "
                                          f"{pct(run.latencies, 99) if run.latencies else '-'}"
                                          f"{', ' + run.error if run.error else ''}")
            finally:
                produced[rate] = (producer.sent - sent) / (time.monotonic() - began)
                producer.stop()
        report(console, results, args, produced)
        spark.stop()
    finally:
        if cluster is not None:
            cluster.stop()
        broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
