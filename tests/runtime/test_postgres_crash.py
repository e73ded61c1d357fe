"""The crash test of test_crash.py into PostgreSQL: `streamer run` is SIGKILLed at the fail
points that put a sink's two-phase commit at risk (`SINK_KINDS`: inside a keyed task, after
the snapshots, between `_metadata` and the sinks' transactions, between the first sink's
transaction and the second's) and twice at random moments, 6 times in one lap
(`STREAMER_TEST_PG_CRASH_KILLS`), restarted each time, and the database then holds exactly the rows
of one uninterrupted run. (The other fail points are about the keyed stage, which
test_crash.py's campaign covers.)

The job is test_crash.py's (datagen, 2 splits x 600 rows at 120 per epoch: 10 epochs of data
and the final one; 5-second tumbling windows per user at parallelism 2, RocksDB state, a
checkpoint every epoch) with two PostgreSQL sinks: `final` appends each window once it
closes, `updates` upserts every window by (user, window_start) after each epoch in which it
changed (`emit: updates`). An epoch appended twice would show as a duplicate row of `final`;
an epoch lost, as a missing one, or a stale value of `updates`. Every lap writes tables of its
own; the marker rows (job, sink) are the job's, shared by the laps one after another (a new
lap is a new lineage, as a `--fresh` run would be).
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fragments import window, write_pipeline
from test_crash import EPOCHS, SINK_KINDS, Lap, LapJob, checked_campaign, pipeline, reference_run

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.postgres]

KILLS = int(os.environ.get("STREAMER_TEST_PG_CRASH_KILLS", "6"))
JOB = "pgcrash"
SINKS = ("final", "updates")

#: The windows again, as an update stream: each epoch's new values of the windows it changed.
UPDATES = window("per_window_updates", "clicks", "5s", emit="updates")
#: The two sinks: `final` appends, `updates` upserts (format fields: dsn, prefix).
SINKS_YAML = """\
  - id: final
    type: postgres
    input: per_window
    dsn: {dsn}
    table: {prefix}_final
  - id: updates
    type: postgres
    input: per_window_updates
    dsn: {dsn}
    table: {prefix}_updates
    mode: upsert
    key: [user, window_start]
"""


def write_job(root: Path, postgres: Any) -> tuple[Path, str]:
    """The pipeline file of a lap and the prefix of its tables."""
    prefix = f"pgcrash_{uuid.uuid4().hex[:8]}"
    sinks = SINKS_YAML.format(dsn=postgres.dsn, prefix=prefix)
    return write_pipeline(root, pipeline(root, "rocksdb", sinks, name=JOB,
                                         extra_operators=UPDATES)), prefix


def committed(postgres: Any, prefix: str) -> Counter[str]:
    """Every row of both tables as canonical JSON, tagged with its sink."""
    rows: Counter[str] = Counter()
    for sink in SINKS:
        rows.update(f"{sink} {text}" for (text,) in postgres.query(
            f"SELECT row_to_json(t)::text FROM {prefix}_{sink} t"))
    return rows


def reference_output(root: Path, postgres: Any) -> Counter[str]:
    """What one uninterrupted run (no checkpoints: rows written at each epoch) leaves."""
    path, prefix = write_job(root, postgres)
    reference_run(path, EPOCHS)
    rows = committed(postgres, prefix)
    assert sum(rows.values()) > 200
    assert sum(1 for r in rows if r.startswith("updates ")) == sum(
        1 for r in rows if r.startswith("final "))  # every window, once, in both
    return rows


def postgres_job(postgres: Any) -> LapJob:
    """This module's job for test_crash.py's campaign: each lap writes tables of its own."""
    prefixes: dict[Path, str] = {}

    def write(root: Path) -> Path:
        path, prefixes[root] = write_job(root, postgres)
        return path

    def collect(root: Path, lap: Lap) -> None:
        lap.rows = committed(postgres, prefixes[root])
        lap.leftovers = []
        for sink in SINKS:
            staged = root / "storage" / JOB / "sinks" / sink
            lap.leftovers += sorted(p.name for p in staged.iterdir()) if staged.exists() else []

    return LapJob(JOB, write, collect, kinds=SINK_KINDS, warm=True)


def test_sigkill_into_postgres_then_the_tables_hold_exactly_the_reference_rows(
        postgres: Any, tmp_path: Path) -> None:
    checked_campaign("postgres", tmp_path, lambda root: reference_output(root, postgres),
                     postgres_job(postgres), KILLS)
