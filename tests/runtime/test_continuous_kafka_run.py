"""`job.execution.mode: continuous` from Kafka to Kafka (issue 36), on the real broker:
a bounded 2-partition topic of JSON clicks, a filter, a rolling count per user, and a Kafka
sink keyed by user, run as one barrier stage of long-running subtasks.

- exactly_once: the keyed subtasks stage the sink's records for each checkpoint and the
  driver commits them in one transaction after `_metadata`; a `read_committed` reader sees
  each user's updates counting up by the records that passed the filter, none twice, the
  last one the user's total;
- at_least_once: the keyed subtasks produce as they emit (the low-latency path) and flush
  at each barrier; the records are there before the run ends, with the same totals.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from fragments import CLICKS_SCHEMA, click_records, kafka_sink, section
from streamer_process import quick_jvm, run_streamer

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

PER_PARTITION = 1500


def pipeline(root: Path, bootstrap: str, topic: str, out: str, mode: str) -> Path:
    """Kafka clicks -> amount >= 2 -> count per user -> Kafka, continuously."""
    text = f"""\
name: kafka-gang
storage: {root / 'storage'}
job:
  parallelism: 2
  checkpoint: {{interval: 300ms, mode: {mode}}}
  execution: {{mode: continuous}}
sources:
  - id: clicks
    type: kafka
    bootstrap_servers: {bootstrap}
    topic: {topic}
    bounded: true
    schema: {CLICKS_SCHEMA}
    event_time: timestamp_millis(ts)
    watermark: {{max_out_of_orderness: 1s}}
operators:
  - {{id: paid, input: clicks, filter: "amount >= 2"}}
  - {{id: per_user, input: paid, key_by: [user], aggregate: {{n: count()}}}}
{section("sinks")}{kafka_sink("per_user", bootstrap, out)}{quick_jvm()}"""
    path = root / "kafka-gang.yaml"
    path.write_text(text)
    return path


def expected() -> Counter[str]:
    """Per user, the clicks that pass the filter."""
    return Counter(value["user"] for _, value, _ in click_records(PER_PARTITION)
                   if value["amount"] >= 2)


def updates(rows: list[tuple[Any, Any, int, int]]) -> dict[str, list[int]]:
    """Per user, the counts its update records carry, in the order of their partition."""
    found: dict[str, list[int]] = defaultdict(list)
    for _key, value, _partition, _offset in rows:
        record = json.loads(value)
        found[record["user"]].append(record["n"])
    return found


@pytest.mark.parametrize("mode", ["exactly_once", "at_least_once"])
def test_kafka_to_a_rolling_count_to_kafka_runs_continuously(
        tmp_path: Path, kafka: Any, mode: str) -> None:
    topic = kafka.create_topic(f"clicks-{uuid.uuid4().hex[:8]}", partitions=2)
    out = kafka.create_topic(f"counts-{uuid.uuid4().hex[:8]}", partitions=2)
    kafka.produce(topic, click_records(PER_PARTITION))
    run = run_streamer(pipeline(tmp_path, kafka.bootstrap, topic, out, mode))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.finished is not None and run.finished["records_in"] == 2 * PER_PARTITION
    assert len(run.checkpoints("completed")) >= 2
    want = expected()
    got = updates(kafka.read(out, isolation="read_committed"))
    assert {user: counts[-1] for user, counts in got.items()} == dict(want)
    for user, counts in got.items():  # a user's records are in one partition, in order
        assert counts == sorted(set(counts)), f"{user}: {counts}"
