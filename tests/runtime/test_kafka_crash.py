"""The crash test of test_crash.py on Kafka -> keyed windows -> Kafka: `streamer run` is
SIGKILLed at every fail point once (between `_metadata` and the Kafka transaction's commit
among them) and twice at random moments, 8 times in one lap (`STREAMER_TEST_KAFKA_CRASH_KILLS`),
restarted each time, and a `read_committed` consumer of the output topic then sees exactly the
records of one uninterrupted run, each once.

The job reads a bounded topic of 2 partitions x 600 JSON records at 60 records per partition
per epoch: 10 epochs of data and the final one, as the datagen job of test_crash.py, whose kill
planner this test uses. Every lap writes to a topic of its own; the marker group and
transactional id are the job's, shared by the laps one after another (a new lap is a new
lineage, as a `--fresh` run would be).
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from streamer_process import quick_jvm, run_streamer
from test_crash import EPOCHS, KINDS, SEED, Lap, LapJob, check_campaign, crash_campaign

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.kafka]

KILLS = int(os.environ.get("STREAMER_TEST_KAFKA_CRASH_KILLS", "8"))
JOB = "kcrash"
PER_PARTITION, PER_EPOCH = 600, 60
BASE_MS = 1767225600000

PIPELINE = """\
name: {job}
storage: {root}/storage
job:
  parallelism: 2
  checkpoint: {{interval: 1ms, retain: 2}}
  state: {{backend: rocksdb, local_dir: {root}/local}}
  restart: {{attempts: 0, delay: 0s}}
sources:
  - id: clicks
    type: kafka
    bootstrap_servers: {bootstrap}
    topic: {source}
    bounded: true
    max_records_per_epoch: {per_epoch}
    schema: {{user: string, amount: double, ts: bigint}}
    event_time: timestamp_millis(ts)
    watermark: {{max_out_of_orderness: 1s}}
operators:
  - id: per_window
    input: clicks
    key_by: [user]
    window: {{tumbling: 5s}}
    aggregate: {{n: count(), spent: sum(amount), first: min(ts), last: max(ts)}}
sinks:
  - id: out
    type: kafka
    input: per_window
    bootstrap_servers: {bootstrap}
    topic: {sink}
    key: user
""" + quick_jvm().replace("{", "{{").replace("}", "}}")


def fill_source(kafka: Any) -> str:
    """The input topic: per partition p and offset o, the row datagen's job of test_crash.py
    would generate for split p (user, amount, ts in order within the partition)."""
    name = kafka.create_topic(f"kcrash-in-{uuid.uuid4().hex[:8]}", 2)
    kafka.produce(name, [
        (None, {"user": f"u{(o * 7 + p) % 13}", "amount": float(o % 10),
                "ts": BASE_MS + o * 100}, p)
        for o in range(PER_PARTITION) for p in (0, 1)])
    return name


def write_job(root: Path, kafka: Any, source: str) -> tuple[Path, str]:
    """The pipeline file of a lap and its output topic."""
    root.mkdir(parents=True, exist_ok=True)
    sink = kafka.create_topic(f"kcrash-out-{uuid.uuid4().hex[:8]}", 2)
    path = root / "job.yaml"
    path.write_text(PIPELINE.format(job=JOB, root=root, bootstrap=kafka.bootstrap, source=source,
                                    sink=sink, per_epoch=PER_EPOCH))
    return path, sink


def committed(kafka: Any, topic: str) -> Counter[str]:
    """What a read_committed consumer sees: (key, value) pairs as canonical JSON."""
    return Counter(json.dumps([key, json.loads(value)], sort_keys=True)
                   for key, value, _p, _o in kafka.read(topic, "read_committed"))


def reference_output(root: Path, kafka: Any, source: str) -> Counter[str]:
    """What one uninterrupted run (no checkpoints: the plain producer) writes."""
    path, sink = write_job(root, kafka, source)
    run = run_streamer(path, "--no-checkpoints")
    assert run.returncode == 0 and run.finished, run.describe()
    assert run.finished["epochs"] == EPOCHS, run.finished
    rows = committed(kafka, sink)
    assert sum(rows.values()) > 100
    return rows


def kafka_job(kafka: Any, source: str) -> LapJob:
    """This module's job for test_crash.py's campaign: each lap writes a topic of its own."""
    sinks: dict[Path, str] = {}

    def write(root: Path) -> Path:
        path, sinks[root] = write_job(root, kafka, source)
        return path

    def collect(root: Path, lap: Lap) -> None:
        lap.rows = committed(kafka, sinks[root])
        staged = root / "storage" / JOB / "sinks" / "out"
        lap.leftovers = sorted(p.name for p in staged.iterdir()) if staged.exists() else []

    return LapJob(JOB, write, collect)


def test_sigkill_kafka_to_windows_to_kafka_then_read_committed_sees_each_record_once(
        kafka: Any, tmp_path: Path) -> None:
    source = fill_source(kafka)
    print(f"kafka crash test seed {SEED} (STREAMER_TEST_CRASH_SEED), {KILLS} kills in {tmp_path}")
    with ThreadPoolExecutor(max_workers=2) as pool:
        reference_f = pool.submit(reference_output, tmp_path / "reference", kafka, source)
        campaign_f = pool.submit(crash_campaign, "kafka", tmp_path / "kafka",
                                 kafka_job(kafka, source), KILLS)
        reference, campaign = reference_f.result(), campaign_f.result()
    check_campaign(campaign, reference, KILLS, kinds=KINDS)
