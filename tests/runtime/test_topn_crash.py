"""Top-N and distinct counts' exactly-once recovery under SIGKILL, through the CLI (issue 40):
test_crash.py's campaign on one bounded job with both (a datagen of bids -> the 3 highest
bids per auction, an update stream, summed by a rolling aggregate that takes each replaced
row back -> jsonl; and per auction and 10 s window the distinct bidders, and the distinct
bidders of bids over 50, -> jsonl; at parallelism 2, a checkpoint every epoch). `streamer run`
is killed, every process at once, at fail points (`failpoints.py`: inside a keyed task, in
the middle of a snapshot upload, between a checkpoint's `_metadata` and the sink commit) and
at random moments (seeded: the seed and every run are printed and repeated in a failure's
message; `STREAMER_TEST_CRASH_SEED` repeats the choices), and run again until a run
finishes; every lap's committed output of both sinks must equal an uninterrupted run's, row
for row, with nothing staged left behind. The laps alternate the state backends (rocksdb,
then memory).

Kills: `STREAMER_TEST_TOPN_CRASH_KILLS` (default 5: each of the three fail points once, two
random kills), at most 3 per lap of the job's 4 epochs (so two laps).
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from fragments import files_sink, job, section, write_pipeline
from streamer_process import FilesOutput, quick_jvm
from test_crash import Lap, LapJob, alternating_backends, checked_campaign, reference_run

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KILLS = int(os.environ.get("STREAMER_TEST_TOPN_CRASH_KILLS", "5"))
KINDS = ("in-task", "mid-upload", "after-metadata", "random", "random")
JOB = "topn-crash"
#: 4 epochs of data, the last one also the final one.
EPOCHS = 4
BASE_MS = 1_767_225_600_000
BIDS = 240

#: Bid i: auction i % 5, bidder i % 7, price (i * 37) % 101, at BASE + i * 500 ms.
SOURCES_AND_OPERATORS = """\
sources:
  - id: bids
    type: datagen
    limit: {bids}
    max_records_per_epoch: 60
    fields:
      auction: "offset % 5"
      bidder: "offset % 7"
      price: "(offset * 37) % 101"
      ts: "timestamp_millis({base} + offset * 500)"
    event_time: ts
    watermark: {{max_out_of_orderness: 1s}}
operators:
  - id: top3
    input: bids
    key_by: [auction]
    top_n: {{n: 3, order_by: [price desc], rank: place}}
  - id: top3_sum
    input: top3
    key_by: [auction]
    aggregate: {{top_sum: sum(price), rows: count()}}
  - id: bidders
    input: bids
    key_by: [auction]
    window: {{tumbling: 10s}}
    aggregate:
      bidders: count(distinct bidder)
      high_bidders: count(distinct bidder) filter (where price > 50)
"""


def write_job(root: Path, backend: str) -> Path:
    sinks = section("sinks", files_sink("top3_sum", root / "out/sums", id="sums"),
                    files_sink("bidders", root / "out/distinct", id="distinct"))
    return write_pipeline(root, job(JOB, root, backend=backend, attempts=0)
                          + SOURCES_AND_OPERATORS.format(bids=BIDS, base=BASE_MS) + sinks
                          + quick_jvm())


def committed(root: Path) -> tuple[Counter[str], list[str]]:
    """Both sinks' committed rows (each tagged with its sink), and what they left staged."""
    rows: Counter[str] = Counter()
    leftovers: list[str] = []
    for sink in ("sums", "distinct"):
        output = FilesOutput(root / "out" / sink)
        rows.update({f"{sink} {row}": n for row, n in output.committed().items()})
        leftovers += [f"{sink}/{p}" for p in output.leftovers()]
    return rows, leftovers


def reference_output(root: Path) -> Counter[str]:
    """What one uninterrupted run without checkpoints commits; its final values are the
    batch answer."""
    reference_run(write_job(root, "rocksdb"), EPOCHS)
    rows, _ = committed(root)
    bids = [{"auction": i % 5, "bidder": i % 7, "price": (i * 37) % 101, "ts": BASE_MS + i * 500}
            for i in range(BIDS)]
    last: dict[int, tuple[int, int]] = {}  # the rolling sum's final value per auction:
    for line in (r.partition(" ")[2] for r in rows if r.startswith("sums ")):  # (it only
        row = json.loads(line)  # grows, so its final update is its largest)
        last[row["auction"]] = max(last.get(row["auction"], (0, 0)),
                                   (row["top_sum"], row["rows"]))
    by_auction = defaultdict(list)
    for b in bids:
        by_auction[b["auction"]].append(b["price"])
    assert last == {a: (sum(sorted(p)[-3:]), 3) for a, p in by_auction.items()}
    windows = defaultdict(list)
    for b in bids:
        windows[(b["auction"], b["ts"] - b["ts"] % 10_000)].append(b)
    got = {(row["auction"], row["window_start"]): (row["bidders"], row["high_bidders"])
           for row in (json.loads(r.partition(" ")[2]) for r in rows if r.startswith("distinct "))}
    assert len(got) == len(windows)
    assert sorted(got.values()) == sorted(
        (len({b["bidder"] for b in w}), len({b["bidder"] for b in w if b["price"] > 50}))
        for w in windows.values())
    return rows


def topn_job() -> LapJob:
    """The job for test_crash.py's campaign: lap n on `BACKENDS[(n - 1) % 2]`."""
    def collect(root: Path, lap: Lap) -> None:
        lap.rows, lap.leftovers = committed(root)

    return LapJob(JOB, alternating_backends(write_job), collect, epochs=EPOCHS, kinds=KINDS,
                  warm=True)


def test_sigkill_with_top_n_and_distinct_counts_then_rerun_commits_exactly_the_reference(
        tmp_path: Path) -> None:
    campaign = checked_campaign("topn", tmp_path, reference_output, topn_job(), KILLS, per_lap=3)
    assert len(campaign.laps) >= 2, campaign.schedule  # both backends
