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
from pathlib import Path
from typing import Any

import pytest
from fragments import (
    CRASH_AGGREGATE,
    click_records,
    job,
    kafka_sink,
    kafka_source,
    section,
    window,
    write_pipeline,
)
from streamer_process import quick_jvm
from test_crash import EPOCHS, Lap, LapJob, checked_campaign, reference_run

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.kafka]

KILLS = int(os.environ.get("STREAMER_TEST_KAFKA_CRASH_KILLS", "8"))
JOB = "kcrash"
PER_PARTITION, PER_EPOCH = 600, 60


def fill_source(kafka: Any) -> str:
    """The input topic: per partition p and offset o, the row datagen's job of test_crash.py
    would generate for split p (user, amount, ts in order within the partition)."""
    name = kafka.create_topic(f"kcrash-in-{uuid.uuid4().hex[:8]}", 2)
    kafka.produce(name, click_records(PER_PARTITION))
    return name


def write_job(root: Path, kafka: Any, source: str) -> tuple[Path, str]:
    """The pipeline file of a lap and its output topic."""
    sink = kafka.create_topic(f"kcrash-out-{uuid.uuid4().hex[:8]}", 2)
    return write_pipeline(root, (
        job(JOB, root, backend="rocksdb", attempts=0)
        + section("sources", kafka_source(kafka.bootstrap, source, per_epoch=PER_EPOCH))
        + section("operators", window("per_window", "clicks", "5s", CRASH_AGGREGATE))
        + section("sinks", kafka_sink("per_window", kafka.bootstrap, sink)) + quick_jvm())), sink


def committed(kafka: Any, topic: str) -> Counter[str]:
    """What a read_committed consumer sees: (key, value) pairs as canonical JSON."""
    return Counter(json.dumps([key, json.loads(value)], sort_keys=True)
                   for key, value, _p, _o in kafka.read(topic, "read_committed"))


def reference_output(root: Path, kafka: Any, source: str) -> Counter[str]:
    """What one uninterrupted run (no checkpoints: the plain producer) writes."""
    path, sink = write_job(root, kafka, source)
    reference_run(path, EPOCHS)
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

    return LapJob(JOB, write, collect, warm=True)


def test_sigkill_kafka_to_windows_to_kafka_then_read_committed_sees_each_record_once(
        kafka: Any, tmp_path: Path) -> None:
    source = fill_source(kafka)
    checked_campaign("kafka", tmp_path, lambda root: reference_output(root, kafka, source),
                     kafka_job(kafka, source), KILLS)
