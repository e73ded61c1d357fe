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

import json
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from streamer_process import FilesOutput, quick_jvm, run_streamer
from test_crash import SEED, Lap, LapJob, check_campaign, crash_campaign
from test_staged import json_events

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KILLS = int(os.environ.get("STREAMER_TEST_ARROW_SINK_CRASH_KILLS", "4"))
KINDS = ("epoch-start", "arrow-written", "after-metadata", "random")
JOB = "arrow-sink-crash"
#: One JSON file of 200 events per epoch, the last one also the final epoch.
FILES, ROWS = 6, 200
EPOCHS = FILES

PIPELINE = """\
name: {job}
storage: {root}/storage
job:
  parallelism: 2
  checkpoint: {{interval: 1ms, retain: 2}}
  restart: {{attempts: 0, delay: 0s}}
  execution: {{small_epoch_rows: 0, local_rows: 0}}
sources:
  - id: events
    type: files
    path: {data}
    format: jsonl
    schema: {{user: string, grp: int, ts: timestamp, amount: double, qty: bigint}}
    max_files_per_epoch: 1
    event_time: ts
    watermark: {{max_out_of_orderness: 5s}}
    on_error: dead
operators:
  - {{id: keep, input: events, filter: "qty >= 0 or amount is null"}}
  - {{id: derive, input: keep, with_columns: {{qty: "qty * 2 + 1", half: "amount / 2"}}}}
sinks:
  - id: out
    type: files
    input: derive
    path: {root}/out
    format: jsonl
  - id: dead
    type: files
    path: {root}/dead
    format: jsonl
""" + quick_jvm().replace("{", "{{").replace("}", "}}")


def write_job(root: Path, data: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "job.yaml"
    path.write_text(PIPELINE.format(job=JOB, root=root, data=data))
    return path


def arrow_every_epoch(root: Path) -> list[str]:
    """What is wrong with the runs in `root` (their `--json` events): an epoch with input
    that the Arrow tasks did not decode."""
    wrong = []
    for events in sorted(root.glob("*.jsonl")):
        for line in events.read_text().splitlines():
            event = json.loads(line)
            if event.get("event") == "epoch" and event["records_in_total"] and \
                    event["arrow_decoded"] != {"events": 1} and not event["arrow_refused"]:
                wrong.append(f"{events.name}: epoch {event['epoch']} ran {event}")
    return wrong


def committed(root: Path) -> Counter[str]:
    """The output and the dead letters, told apart."""
    rows: Counter[str] = Counter()
    for sink in ("out", "dead"):
        rows.update({f"{sink} {row}": n for row, n in FilesOutput(root / sink).committed().items()})
    return rows


def reference_output(root: Path, data: Path) -> Counter[str]:
    """What one uninterrupted run without checkpoints commits."""
    run = run_streamer(write_job(root, data), "--no-checkpoints")
    assert run.returncode == 0 and run.finished, run.describe()
    assert run.finished["epochs"] == EPOCHS, run.finished
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
                  kinds=KINDS)


def test_sigkill_around_the_arrow_tasks_writes_then_rerun_commits_exactly_the_reference(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    json_events(data, files=FILES, rows=ROWS, seed=13)
    bad = data / "jsonl" / "part-002.jsonl"  # (Spark reads it: its rows beside the tasks')
    lines = bad.read_text().splitlines()
    lines[7] = lines[7][:15]
    bad.write_text("\n".join(lines) + "\n")
    print(f"arrow sink crash test seed {SEED} (STREAMER_TEST_CRASH_SEED), {KILLS} kills in "
          f"{tmp_path}")
    with ThreadPoolExecutor(max_workers=2) as pool:
        reference_f = pool.submit(reference_output, tmp_path / "reference", data / "jsonl")
        campaign_f = pool.submit(crash_campaign, "arrow-sink", tmp_path / "arrow-sink",
                                 arrow_job(data / "jsonl"), KILLS)
        reference, campaign = reference_f.result(), campaign_f.result()
    check_campaign(campaign, reference, KILLS, EPOCHS, kinds=KINDS)
