"""Broadcast state of keyed process functions on real Spark, RocksDB and files: every subtask
gets every broadcast record before the epoch's keyed records (parallelism 2 and 3, both
backends), and the broadcast state survives a stop and resume from a checkpoint, and a
savepoint restored at another parallelism and backend."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from test_savepoints import JOB_HEAD

from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.control import ControlChannel
from streamer.runtime.job.coordinator import JobRunner, RunOptions
from streamer.runtime.observe.metrics import JsonReporter
from streamer.savepoint.savepoint_metadata import read_metadata

pytestmark = pytest.mark.spark

#: 600 events, 100 per epoch (epochs 1..6); the rules r0, r1, r2 one per epoch (epochs 1..3).
#: The events, the rules and the process operator that reads both (a format string; also
#: the job of tests/runtime/test_broadcast_crash.py).
SOURCES_AND_OPERATOR = """sources:
  - id: events
    type: datagen
    limit: 600
    max_records_per_epoch: 100
    fields:
      k: "cast(offset % 24 as string)"
      n: "offset"
      ts: "timestamp_millis(1767225600000 + offset * 100)"
    event_time: ts
    watermark: {{max_out_of_orderness: 1s}}
  - id: rules
    type: datagen
    limit: 3
    max_records_per_epoch: 1
    fields:
      name: "concat('r', cast(offset as string))"
      value: "offset * 10 + 1"
operators:
  - id: tagged
    uid: tagged-v1
    input: events
    key_by: [k]
    process: "broadcast_process:SeenRules"
    broadcast: rules
"""

PIPELINE = """
name: bc-test
""" + JOB_HEAD + SOURCES_AND_OPERATOR + """sinks:
  - id: out
    type: files
    input: tagged
    path: {out}
    format: jsonl
"""
ALL_RULES = "r0,r1,r2"


class Job:
    def __init__(self, tmp: Path) -> None:
        self.storage, self.local, self.out = tmp / "storage", tmp / "local", tmp / "out"

    def run(self, spark: Any, parallelism: int, backend: str, *, stop_at: int | None = None,
            **options: Any) -> Any:
        """Run; with `stop_at`, stop with a savepoint once that epoch is done."""
        text = PIPELINE.format(storage=self.storage, local=self.local, out=self.out,
                               parallelism=parallelism, backend=backend)
        storage, filed = str(self.storage), []

        class Capture:
            def write(self, s: str) -> None:
                for line in s.splitlines():
                    event = json.loads(line) if line else {}
                    if (stop_at is not None and not filed and event.get("event") == "epoch"
                            and event["epoch"] >= stop_at):
                        filed.append(ControlChannel(storage, "bc-test").request(
                            kind="stop", savepoint=True, drain=False))

            def flush(self) -> None:
                pass

        spec = load_pipeline_text(textwrap.dedent(text))
        return JobRunner(spec, RunOptions(ui=False, checkpoints=True, **options), spark=spark,
                         reporter=JsonReporter(Capture())).run()  # type: ignore[arg-type]

    def rows(self, first_epoch: int = 1) -> list[dict[str, Any]]:
        return [json.loads(line) for part in sorted(self.out.glob("part-*.jsonl"))
                if int(part.name.split("-")[1]) >= first_epoch
                for line in part.read_text().splitlines() if line.strip()]


def subtask_of(row: dict[str, Any], parallelism: int) -> int:
    return int(row["kg"]) * parallelism // 128


def check_rules_in_order(rows: list[dict[str, Any]], parallelism: int) -> None:
    """Each event saw exactly the rules of its epoch and before (rule i comes in epoch i + 1,
    event n in epoch n // 100 + 1), whatever subtask processed it; every subtask had rows."""
    assert rows
    for row in rows:
        upto = min(row["n"] // 100, 2)
        want = ",".join(f"r{i}" for i in range(upto + 1))
        assert (row["rules"], row["total"]) == (want, sum(i * 10 + 1 for i in range(upto + 1))
                                                 ), row
    assert {subtask_of(r, parallelism) for r in rows} == set(range(parallelism))


@pytest.mark.slow
def test_every_subtask_applies_the_broadcast_records_then_a_savepoint_restores_them_all(
        spark: Any, tmp_path: Path) -> None:
    """2 subtasks on rocksdb, stopped with a savepoint after the last rule; restored at 3
    subtasks on memory, every subtask has all the rules though no rule arrives any more (it
    would fail if only subtask 0, or the old subtasks' key groups, had them)."""
    job = Job(tmp_path)
    first = job.run(spark, 2, "rocksdb", stop_at=4)
    assert first.status == "stopped" and len(first.savepoints) == 1, first
    check_rules_in_order(job.rows(), 2)
    meta = read_metadata(first.savepoints[0])
    saved = meta.operators["tagged-v1"]
    assert saved["states"]["broadcast.rules"] == "map"
    assert saved["keys"]["broadcast.rules"] == 3  # one copy, not one per subtask
    assert saved["definition"]["broadcast"] == "rules"
    resumed = job.run(spark, 3, "memory", from_savepoint=first.savepoints[0])
    assert resumed.status == "finished"
    after = job.rows(first_epoch=meta.epoch + 1)
    assert after and {r["rules"] for r in after} == {ALL_RULES}
    assert {subtask_of(r, 3) for r in after} == {0, 1, 2}
    assert sorted(r["n"] for r in job.rows()) == list(range(600))


@pytest.mark.slow
def test_broadcast_state_survives_a_stop_and_resume_from_a_checkpoint(
        spark: Any, tmp_path: Path) -> None:
    """3 subtasks on memory: stopped after epoch 2 (rules r0, r1 applied), resumed from the
    checkpoint: the later epochs' records see r0 and r1 from the restored state."""
    job = Job(tmp_path)
    first = job.run(spark, 3, "memory", max_epochs=2)
    assert first.status == "stopped" and len(first.checkpoints) == 1
    second = job.run(spark, 3, "memory")
    assert second.restored_from == first.checkpoints[0]
    check_rules_in_order(job.rows(), 3)
    assert sorted(r["n"] for r in job.rows()) == list(range(600))
