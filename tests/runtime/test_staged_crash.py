"""Staged input's exactly-once recovery under SIGKILL, through the CLI: test_crash.py's
campaign on a job whose keyed window reads its input from the local parquet files Spark
stages for it each epoch (`StagedRun`, strategy `spark-staged-files`: JSON lines, a filter,
a 1-minute tumbling window at parallelism 2 on RocksDB -> jsonl, a checkpoint every epoch;
`small_epoch_rows: 0` and `local_rows: 0`, so every epoch stages its input). `streamer run` is
killed, every process at once, right after the staging write (`staged`), inside a subtask
before its state commit (`in-task`), between `_metadata` and the sink commit, and at a random
moment (seeded: `STREAMER_TEST_CRASH_SEED` repeats the choices; the seed and every run are in a
failure's message), and run again until a run finishes. Every lap's committed output must
equal an uninterrupted run's, row for row; nothing staged is left, in the sink or under the
state directory (`_staged`), once a run finishes.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from fragments import KEEP, files_sink, files_source, job, section, write_pipeline
from streamer_process import FilesOutput, quick_jvm
from test_crash import Lap, LapJob, checked_campaign, epochs_that, reference_run
from test_direct import agg
from test_staged import json_events

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KILLS = int(os.environ.get("STREAMER_TEST_STAGED_CRASH_KILLS", "4"))
KINDS = ("staged", "in-task", "after-metadata", "random")
JOB = "staged-crash"
#: One JSON file of 200 events per epoch, the last one also the final epoch.
FILES, ROWS = 6, 200
EPOCHS = FILES


def write_job(root: Path, data: Path) -> Path:
    return write_pipeline(root, (
        job(JOB, root, max_parallelism=16, backend="rocksdb", attempts=0,
            execution="{small_epoch_rows: 0, local_rows: 0}")
        + section("sources", files_source(data))
        + section("operators", KEEP, agg("keep", "[user]", "window: {tumbling: 1m}"))
        + section("sinks", files_sink("agg", root / "out")) + quick_jvm()))


def staged_every_epoch(root: Path) -> list[str]:
    """What is wrong with the runs in `root` (their `--json` events): an epoch with input
    whose window did not read it from staged files."""
    return epochs_that(root, lambda e: bool(e["records_in_total"] and (
        e["staged"] != ["agg"] or e["direct"] or e["local"])))


def reference_output(root: Path, data: Path) -> Counter[str]:
    """What one uninterrupted run without checkpoints commits, every epoch staged."""
    run = reference_run(write_job(root, data), EPOCHS)
    assert staged_every_epoch(root) == []
    assert sum(1 for e in run.events if e.get("event") == "epoch" and e["staged"]) >= FILES
    rows = FilesOutput(root / "out").committed()
    assert sum(rows.values()) > 50
    return rows


def staged_job(data: Path) -> LapJob:
    def collect(root: Path, lap: Lap) -> None:
        output = FilesOutput(root / "out")
        lap.rows = output.committed()
        lap.leftovers = output.leftovers() + [
            str(p.relative_to(root)) for p in (root / "local").rglob("_staged")]
        lap.leftovers += staged_every_epoch(root)

    return LapJob(JOB, lambda root: write_job(root, data), collect, epochs=EPOCHS,
                  kinds=KINDS, warm=True)


def test_sigkill_around_the_staging_write_then_rerun_commits_exactly_the_reference(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    json_events(data, files=FILES, rows=ROWS, seed=11)
    checked_campaign("staged", tmp_path, lambda root: reference_output(root, data / "jsonl"),
                     staged_job(data / "jsonl"), KILLS)
