"""Joins' exactly-once recovery under SIGKILL, through the CLI: test_crash.py's campaign on a
bounded job with an interval join and a table join after it (three datagen sources -> left
interval join -> inner table join with a customers table, at parallelism 2 -> jsonl, a
checkpoint every epoch). `streamer run` is killed, every process at once, at fail points
(`failpoints.py`: inside a keyed task, in the middle of a snapshot upload, between a
checkpoint's `_metadata` and the sink commit) and at random moments (seeded: the seed and
every run are printed and repeated in a failure's message; `STREAMER_TEST_CRASH_SEED` repeats the
choices), and run again until a run finishes; every lap's committed output must equal an
uninterrupted run's, row for row, with nothing staged left behind. The laps alternate the
state backends (rocksdb, then memory).

Kills: `STREAMER_TEST_JOIN_CRASH_KILLS` (default 5: each of the three fail points once, two random
kills), at most 3 per lap of the job's 5 epochs (so two laps).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from fragments import files_sink, job, section, write_pipeline
from streamer_process import FilesOutput, quick_jvm
from test_crash import LapJob, alternating_backends, checked_campaign, collect_files, reference_run

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KILLS = int(os.environ.get("STREAMER_TEST_JOIN_CRASH_KILLS", "5"))
KINDS = ("in-task", "mid-upload", "after-metadata", "random", "random")
JOB = "join-crash"
#: 4 epochs of data, the last one also the final one.
EPOCHS = 4

#: Orders one a second; payment i for order i, 0/15/30/45 s after it: a left join within
#: [0s, 30s] pairs three in four. 4 epochs of data (60 records per source each), then the end.
#: Each order's customer (order_id % 8) is enriched from a table of customers 0-6 read in the
#: first epoch (an inner table join): customer 7's 30 orders are not output.
SOURCES_AND_OPERATORS = """\
sources:
  - id: orders
    type: datagen
    limit: 240
    max_records_per_epoch: 60
    fields:
      order_id: "offset"
      customer: "offset % 8"
      ts: "timestamp_millis(1767225600000 + offset * 1000)"
    event_time: ts
  - id: payments
    type: datagen
    limit: 240
    max_records_per_epoch: 60
    fields:
      order_id: "offset"
      pts: "timestamp_millis(1767225600000 + offset * 1000 + (offset % 4) * 15000)"
    event_time: pts
  - id: customers
    type: datagen
    limit: 7
    fields: {{customer: "offset", tier: "concat('t', cast(offset % 3 as string))",
              since: "timestamp_millis(1767225600000)"}}
    event_time: since
operators:
  - id: paid
    join: {{left: orders, right: payments, on: [order_id], type: left, between: [0s, 30s]}}
  - id: tiered
    join: {{left: paid, right: customers, on: [customer], table: true}}
"""


def write_job(root: Path, backend: str) -> Path:
    return write_pipeline(root, job(JOB, root, backend=backend, attempts=0)
                          + SOURCES_AND_OPERATORS.format()
                          + section("sinks", files_sink("tiered", root / "out")) + quick_jvm())


def reference_output(root: Path) -> Counter[str]:
    """What one uninterrupted run without checkpoints commits."""
    reference_run(write_job(root, "rocksdb"), EPOCHS)
    rows = FilesOutput(root / "out").committed()
    assert sum(rows.values()) == 210  # every order of customers 0-6 once, paid or not
    assert {(r["customer"], r["tier"]) for r in map(json.loads, rows)} == {
        (c, f"t{c % 3}") for c in range(7)}
    assert sum(1 for r in map(json.loads, rows) if r.get("pts") is None) > 0  # unpaid too
    return rows


def join_job() -> LapJob:
    """The join job for test_crash.py's campaign: lap n on `BACKENDS[(n - 1) % 2]`."""
    return LapJob(JOB, alternating_backends(write_job), collect_files(), epochs=EPOCHS,
                  kinds=KINDS, warm=True)


def test_sigkill_at_fail_points_and_random_moments_then_rerun_commits_exactly_the_reference(
        tmp_path: Path) -> None:
    campaign = checked_campaign("join", tmp_path, reference_output, join_job(), KILLS, per_lap=3)
    assert len(campaign.laps) >= 2, campaign.schedule  # both backends
