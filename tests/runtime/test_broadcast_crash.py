"""Broadcast state's exactly-once recovery under SIGKILL, through the CLI: test_crash.py's
campaign on test_broadcast.py's job (a keyed process function with a `broadcast:` input of
rules, r0, r1 and r2 one per epoch in epochs 1-3, and 600 events, 100 per epoch, at
parallelism 2 on the memory backend -> jsonl, a checkpoint every epoch). `streamer run` is
killed, every process at once, at fail points (inside a keyed task, in the middle of a
snapshot upload, between `_metadata` and the sink commit) and at a random moment (seeded:
`STREAMER_TEST_CRASH_SEED` repeats the choices; the seed and every run are in a failure's
message), and run again until a run finishes. Each event's row names the rules its subtask
had and its key group: the committed rows must equal an uninterrupted run's, row for row, so
every subtask applied every rule after each recovery, the restored ones included.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest
from fragments import files_sink, job, section, write_pipeline
from streamer_process import FilesOutput, quick_jvm
from test_broadcast import SOURCES_AND_OPERATOR, check_rules_in_order
from test_crash import LapJob, checked_campaign, collect_files, reference_run

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KILLS = int(os.environ.get("STREAMER_TEST_BROADCAST_CRASH_KILLS", "4"))
KINDS = ("in-task", "mid-upload", "after-metadata", "random")
JOB = "bc-crash"
#: 6 epochs of events (the rules in the first 3); no final epoch (no timers to fire).
EPOCHS = 6
PROCESS = Path(__file__).with_name("broadcast_process.py")


def write_job(root: Path) -> Path:
    """The pipeline file in `root`, with the process function's module next to it."""
    path = write_pipeline(root, job(JOB, root, backend="memory", attempts=0)
                          + SOURCES_AND_OPERATOR.format()
                          + section("sinks", files_sink("tagged", root / "out")) + quick_jvm())
    shutil.copy(PROCESS, root / PROCESS.name)
    return path


def reference_output(root: Path) -> Counter[str]:
    """What one uninterrupted run without checkpoints commits: every event once, with the
    rules of its epoch and before, on both subtasks."""
    reference_run(write_job(root), EPOCHS)
    rows = FilesOutput(root / "out").committed()
    check_rules_in_order([json.loads(row) for row in rows.elements()], 2)
    assert sorted(json.loads(row)["n"] for row in rows.elements()) == list(range(600))
    return rows


def broadcast_job() -> LapJob:
    return LapJob(JOB, write_job, collect_files(), epochs=EPOCHS, kinds=KINDS,
                  warm=True)


def test_sigkill_with_broadcast_state_then_every_subtask_applies_the_restored_rules(
        tmp_path: Path) -> None:
    campaign = checked_campaign("broadcast", tmp_path, reference_output, broadcast_job(), KILLS)
    # A run restored broadcast state holding a rule or more (a checkpoint of epoch 1-5) and
    # went on to process events (each fail point's kill lets an epoch or more complete).
    assert any(1 <= kill.resumed_at < EPOCHS for kill in campaign.kills), campaign.schedule
