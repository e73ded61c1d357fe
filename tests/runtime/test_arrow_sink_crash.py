"""Exactly once for a stateless chain whose sink's staging the Arrow tasks write
(`ArrowDecodeSource` -> `ArrowWrittenSink`), under SIGKILL, through the CLI: test_crash.py's
campaign on JSON lines -> a filter and a derived column -> a jsonl files sink, a checkpoint
every epoch (`small_epoch_rows: 0`, `local_rows: 0`, so every epoch takes the tasks' path;
one file per epoch holds bad lines, so Spark writes its rows beside the tasks' files).
`streamer run` is killed, every process at once, before an epoch's job (`epoch-start`),
right after the tasks wrote the staging (`arrow-written`), between `_metadata` and the
sink's commit, and at a random moment (seeded: `STREAMER_TEST_CRASH_SEED`), then run again until
a run finishes. Every lap's committed output must equal an uninterrupted run's, row for row,
and nothing staged may be left once a run finishes.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from fragments import files_sink, files_source, job, section, write_pipeline
from streamer_process import FilesOutput, quick_jvm
from test_arrow_input import PREFIX
from test_crash import Lap, LapJob, checked_campaign, epochs_that, reference_run
from test_staged import json_events

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KILLS = int(os.environ.get("STREAMER_TEST_ARROW_SINK_CRASH_KILLS", "4"))
KINDS = ("epoch-start", "arrow-written", "after-metadata", "random")
JOB = "arrow-sink-crash"
#: One JSON file of 200 events per epoch, the last one also the final epoch.
FILES, ROWS = 6, 200
EPOCHS = FILES


def write_job(root: Path, data: Path) -> Path:
    return write_pipeline(root, (
        job(JOB, root, attempts=0, execution="{small_epoch_rows: 0, local_rows: 0}")
        + section("sources", files_source(data, on_error="dead"))
        + section("operators", PREFIX)
        + section("sinks", files_sink("derive", root / "out"),
                  files_sink(None, root / "dead", id="dead"))
        + quick_jvm()))


def arrow_every_epoch(root: Path) -> list[str]:
    """What is wrong with the runs in `root` (their `--json` events): an epoch with input
    that the Arrow tasks did not decode."""
    return epochs_that(root, lambda e: bool(
        e["records_in_total"] and e["arrow_decoded"] != {"events": 1} and not e["arrow_refused"]))


def committed(root: Path) -> Counter[str]:
    """The output and the dead letters, told apart."""
    rows: Counter[str] = Counter()
    for sink in ("out", "dead"):
        rows.update({f"{sink} {row}": n for row, n in FilesOutput(root / sink).committed().items()})
    return rows


def reference_output(root: Path, data: Path) -> Counter[str]:
    """What one uninterrupted run without checkpoints commits."""
    reference_run(write_job(root, data), EPOCHS)
    assert arrow_every_epoch(root) == []
    rows = committed(root)
    assert sum(n for r, n in rows.items() if r.startswith("dead ")) == 1
    assert sum(rows.values()) > 500
    return rows


def arrow_job(data: Path) -> LapJob:
    def collect(root: Path, lap: Lap) -> None:
        lap.rows = committed(root)
        lap.leftovers = FilesOutput(root / "out").leftovers() + FilesOutput(
            root / "dead").leftovers() + arrow_every_epoch(root)

    return LapJob(JOB, lambda root: write_job(root, data), collect, epochs=EPOCHS,
                  kinds=KINDS, warm=True)


def test_sigkill_around_the_arrow_tasks_writes_then_rerun_commits_exactly_the_reference(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    json_events(data, files=FILES, rows=ROWS, seed=13)
    bad = data / "jsonl" / "part-002.jsonl"  # (Spark reads it: its rows beside the tasks')
    lines = bad.read_text().splitlines()
    lines[7] = lines[7][:15]
    bad.write_text("\n".join(lines) + "\n")
    checked_campaign("arrow-sink", tmp_path, lambda root: reference_output(root, data / "jsonl"),
                     arrow_job(data / "jsonl"), KILLS)
