"""Savepoints of a Kafka -> windows -> Kafka job: the savepoint holds the partitions' offsets,
and a stop-with-savepoint followed by a restore at another parallelism (2 -> 3) writes exactly
what one uninterrupted run writes, as a read_committed consumer sees it."""

from __future__ import annotations

import json
import textwrap
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fragments import click_records, job, kafka_sink, kafka_source, section, window

from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.control import ControlChannel
from streamer.runtime.job.coordinator import JobRunner, RunOptions
from streamer.runtime.observe.metrics import JsonReporter
from streamer.savepoint.savepoint_metadata import read_metadata

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def committed(kafka: Any, topic: str) -> Counter[str]:
    return Counter(json.dumps([k, json.loads(v)], sort_keys=True)
                   for k, v, _p, _o in kafka.read(topic))


def run(spark: Any, text: str, storage: Path, request: dict[str, Any] | None = None,
        **options: Any) -> Any:
    """Run in-process; with `request`, file that control request after epoch 2."""
    filed: list[str] = []

    class Capture:
        def write(self, s: str) -> None:
            for line in s.splitlines():
                event = json.loads(line) if line else {}
                if request and not filed and event.get("event") == "epoch" \
                        and event["epoch"] >= 2:
                    filed.append(ControlChannel(str(storage), "ksp").request(**request))

        def flush(self) -> None:
            pass

    spec = load_pipeline_text(textwrap.dedent(text))
    return JobRunner(spec, RunOptions(ui=False, checkpoints=True, **options), spark=spark,
                     reporter=JsonReporter(Capture())).run()  # type: ignore[arg-type]


def test_stop_with_savepoint_then_restore_at_another_parallelism(
        spark: Any, kafka: Any, tmp_path: Path) -> None:
    source = kafka.create_topic(f"ksp-in-{uuid.uuid4().hex[:8]}", 2)
    kafka.produce(source, click_records(1500))

    def text(storage: Path, sink: str, parallelism: int) -> str:
        return (job("ksp", storage=storage, parallelism=parallelism, checkpoint="{interval: 1h}",
                    backend="rocksdb", local_dir=tmp_path / "local")
                + section("sources", kafka_source(kafka.bootstrap, source, per_epoch=300,
                                                  uid="clicks-v1"))
                + section("operators", window("per_window", "clicks", "10s", uid="per-window-v1"))
                + section("sinks", kafka_sink("per_window", kafka.bootstrap, sink)))

    ref_topic = kafka.create_topic(f"ksp-ref-{uuid.uuid4().hex[:8]}", 2)
    ref_storage = tmp_path / "ref"
    assert run(spark, text(ref_storage, ref_topic, 2), ref_storage).status == "finished"
    reference = committed(kafka, ref_topic)
    assert sum(reference.values()) > 100

    out = kafka.create_topic(f"ksp-out-{uuid.uuid4().hex[:8]}", 2)
    storage = tmp_path / "job"
    stopped = run(spark, text(storage, out, 2), storage,
                  request={"kind": "stop", "savepoint": True, "drain": False})
    assert stopped.status == "stopped" and len(stopped.savepoints) == 1
    meta = read_metadata(stopped.savepoints[0])
    offsets = meta.offsets["clicks-v1"]
    assert set(offsets) == {f"{source}:0", f"{source}:1"}
    assert 0 < offsets[f"{source}:0"] < 1500 and offsets == stopped.offsets["clicks"]
    before = committed(kafka, out)
    assert 0 < sum(before.values()) < sum(reference.values())
    restored = run(spark, text(storage, out, 3), storage, from_savepoint=stopped.savepoints[0])
    assert restored.status == "finished"
    assert committed(kafka, out) == reference
