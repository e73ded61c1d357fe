"""The crash test of test_crash.py into Delta tables: `streamer run` is SIGKILLed at the fail
points that put a sink's two-phase commit at risk (`SINK_KINDS`: inside a keyed task, after
the snapshots, between `_metadata` and the Delta commits, between the commits of the job's two
sinks) and twice at random moments, 6 times in one lap (`STREAMER_TEST_DELTA_CRASH_KILLS`),
restarted each time, and the tables then hold exactly what one uninterrupted run writes: the
appended windows each once, and the merged rolling totals at their last value per key. (The
other fail points are about the keyed stage, which test_crash.py's campaign covers.)

The job is test_crash.py's datagen job (10 epochs of data and the final one) with two delta
sinks: its event-time windows appended to one table, and a rolling aggregate per user
(`aggregate:` alone, which emits updates) merged by key into another. The tables are read
back with delta-rs, without Spark.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable
from fragments import delta_sink, totals, write_pipeline
from test_crash import EPOCHS, SINK_KINDS, Lap, LapJob, checked_campaign, pipeline, reference_run

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KILLS = int(os.environ.get("STREAMER_TEST_DELTA_CRASH_KILLS", "6"))
JOB = "dcrash"
SINKS = {"windows": "windows", "totals_table": "totals"}  # sink id -> table directory

def write_job(root: Path) -> Path:
    """The pipeline file of a lap (its storage, state and tables in `root`)."""
    sinks = (delta_sink("per_window", root / "windows", id="windows")
             + delta_sink("totals", root / "totals", id="totals_table", merge_key="[user]"))
    return write_pipeline(root, pipeline(root, "rocksdb", sinks, name=JOB,
                                         extra_operators=totals()))


def tables(root: Path) -> Counter[str]:
    """Both tables' rows, read with delta-rs, as canonical JSON tagged with the table."""
    rows: Counter[str] = Counter()
    for name in SINKS.values():
        for row in DeltaTable(str(root / name)).to_pyarrow_table().to_pylist():
            rows[json.dumps([name, row], sort_keys=True, default=str)] += 1
    return rows


def reference_output(root: Path) -> Counter[str]:
    """What one uninterrupted run without checkpoints commits (each epoch at once)."""
    reference_run(write_job(root), EPOCHS)
    rows = tables(root)
    assert sum(rows.values()) > 100
    assert sum(1 for row in rows if row.startswith('["totals"')) == 13  # one row per user
    return rows


def delta_job() -> LapJob:
    """This module's job for test_crash.py's campaign: each lap writes tables of its own."""

    def collect(root: Path, lap: Lap) -> None:
        lap.rows = tables(root)
        staged = root / "storage" / JOB / "sinks"
        lap.leftovers = sorted(str(p.relative_to(staged)) for p in staged.rglob("*")
                               if p.is_file())

    return LapJob(JOB, write_job, collect, kinds=SINK_KINDS, warm=True)


def test_sigkill_into_delta_tables_then_they_hold_the_uninterrupted_runs_rows(
        tmp_path: Path) -> None:
    checked_campaign("delta", tmp_path, reference_output, delta_job(), KILLS)
