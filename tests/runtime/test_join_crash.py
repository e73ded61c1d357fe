"""Joins' exactly-once recovery under SIGKILL, through the CLI: a bounded job with an interval
join and a table join after it (three datagen sources -> left interval join -> inner table join
with a customers table, at parallelism 2 -> jsonl, a checkpoint every epoch) is
killed at a fail point (`failpoints.py`), every process at once, then run again to its end; the
committed output must equal an uninterrupted run's, row for row, with nothing staged left
behind. (The random-moment campaign of test_crash.py covers the keyed stage with windows.)"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from streamer_process import FilesOutput, diff, quick_jvm, run_streamer

pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: Orders one a second; payment i for order i, 0/15/30/45 s after it: a left join within
#: [0s, 30s] pairs three in four. 4 epochs of data (60 records per source each), then the end.
#: Each order's customer (order_id % 8) is enriched from a table of customers 0-6 read in the
#: first epoch (an inner table join): customer 7's 30 orders are not output.
PIPELINE = """\
name: join-crash
storage: {root}/storage
job:
  parallelism: 2
  checkpoint: {{interval: 1ms, retain: 2}}
  state: {{backend: {backend}, local_dir: {root}/local}}
  restart: {{attempts: 0, delay: 0s}}
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
sinks:
  - id: out
    type: files
    input: tiered
    path: {root}/out
    format: jsonl
""" + quick_jvm().replace("{", "{{").replace("}", "}}")


def write_job(root: Path, backend: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "job.yaml"
    path.write_text(PIPELINE.format(root=root, backend=backend))
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Counter[str]:
    root = tmp_path_factory.mktemp("reference")
    run = run_streamer(write_job(root, "rocksdb"), "--no-checkpoints")
    assert run.returncode == 0 and run.finished, run.describe()
    rows = FilesOutput(root / "out").committed()
    assert sum(rows.values()) == 210  # every order of customers 0-6 once, paid or not
    assert {(r["customer"], r["tier"]) for r in map(json.loads, rows)} == {
        (c, f"t{c % 3}") for c in range(7)}
    return rows


@pytest.mark.parametrize(("point", "backend"), [
    ("in-task:3", "rocksdb"), ("mid-upload:2", "rocksdb"), ("after-metadata:2", "memory"),
])
def test_killed_at_a_fail_point_then_rerun_commits_exactly_the_reference(
        tmp_path: Path, reference: Counter[str], point: str, backend: str) -> None:
    job = write_job(tmp_path, backend)
    killed = run_streamer(job, env={"STREAMER_FAILPOINTS": point})
    assert killed.killed, killed.describe()
    again = run_streamer(job)
    assert again.returncode == 0 and again.finished, again.describe()
    assert again.finished["restored_from"] is not None, again.describe()  # (it resumed)
    out = FilesOutput(tmp_path / "out")
    got = out.committed()
    assert got == reference, diff(got, reference)
    assert out.leftovers() == []
