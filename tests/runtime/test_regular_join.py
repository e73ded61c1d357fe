"""Regular joins (`join: {regular: true | {ttl: d}}`, Nexmark Q3 and Q20): every record of
one side joins every record of the other with its key, whatever their times, checked against
a brute-force oracle over the same generated records; late records join too; a ttl forgets a
record that long after its event time; and what validation refuses.
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from streamer.pipeline.exceptions import PipelineError
from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.coordinator import JobRunner, RunOptions

pytestmark = pytest.mark.spark

BASE = 1_767_225_600_000
BIDS, AUCTIONS = 900, 60


def bids() -> list[tuple[int, int, int]]:
    """(auction, price, ts): a bid every 100 ms on auction offset % 60; every 9th bid comes
    20 s late (far behind the 1 s watermark)."""
    return [(o % AUCTIONS, o * 7 % 101, BASE + o * 100 - (20_000 if o % 9 == 4 else 0))
            for o in range(BIDS)]


def auctions() -> list[tuple[int, int, int]]:
    """(id, seller, ts): auction i opens at i * 1.5 s, after many of its bids."""
    return [(i, i % 7, BASE + i * 1500) for i in range(AUCTIONS)]


def pipeline(out: Path, state: Path, backend: str, parallelism: int, regular: str,
             join_type: str = "inner") -> str:
    return textwrap.dedent(f"""\
name: regular-join
job:
  parallelism: {parallelism}
  max_parallelism: 16
  state: {{backend: {backend}, local_dir: {state}}}
sources:
  - id: bids
    type: datagen
    limit: {BIDS}
    max_records_per_epoch: 150
    fields:
      auction: "cast(offset % {AUCTIONS} as bigint)"
      price: "cast(offset * 7 % 101 as bigint)"
      ts: "timestamp_millis({BASE} + offset * 100 - case when offset % 9 = 4 then 20000 else 0 end)"
    event_time: ts
    watermark: {{max_out_of_orderness: 1s}}
  - id: auctions
    type: datagen
    limit: {AUCTIONS}
    max_records_per_epoch: 10
    fields:
      auction: "offset"
      seller: "offset % 7"
      opened: "timestamp_millis({BASE} + offset * 1500)"
    event_time: opened
    watermark: {{max_out_of_orderness: 1s}}
operators:
  - id: joined
    join: {{left: bids, right: auctions, on: [auction], type: {join_type}, regular: {regular}}}
sinks:
  - {{id: out, type: files, input: joined, path: {out}, format: jsonl}}
""")


def rows_of(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for part in sorted(directory.glob("part-*.jsonl"))
            for line in part.read_text().splitlines() if line.strip()]


def run(spark: Any, text: str) -> Any:
    return JobRunner(load_pipeline_text(text), RunOptions(ui=False), spark=spark).run()


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "parallelism"), [("rocksdb", 2), ("memory", 3)])
def test_a_regular_join_pairs_every_record_late_ones_too(
        spark: Any, tmp_path: Path, backend: str, parallelism: int) -> None:
    out = tmp_path / "out"
    result = run(spark, pipeline(out, tmp_path / "state", backend, parallelism, "true"))
    assert result.status == "finished" and result.late == 0
    sellers = {a: s for a, s, _ in auctions()}
    expected = Counter((a, p, sellers[a]) for a, p, _ in bids())
    got = Counter((r["auction"], r["price"], r["seller"]) for r in rows_of(out))
    assert got == expected
    assert sum(got.values()) == BIDS  # (every bid, its auction opened before or after it)


@pytest.mark.slow
def test_a_regular_join_with_a_ttl_forgets_records_that_long_after_their_time(
        spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run(spark, pipeline(out, tmp_path / "state", "rocksdb", 2, "{ttl: 10s}",
                                 join_type="left"))
    assert result.status == "finished"
    opened = {a: ts for a, _, ts in auctions()}
    sellers = {a: s for a, s, _ in auctions()}
    got = Counter((r["auction"], r["price"], r["seller"]) for r in rows_of(out))
    # Every bid in time within 10 s of its auction's opening is joined (each record is kept
    # 10 s of event time past its own time, so the second of such a pair finds the first;
    # a bid 20 s late may find its auction forgotten already) ...
    near = Counter((a, p, sellers[a]) for o, (a, p, ts) in enumerate(bids())
                   if abs(ts - opened[a]) <= 10_000 and o % 9 != 4)
    assert got & near == near
    # ... a bid 30 s or more from it is not (the other side was forgotten, or not yet
    # there and this one forgotten first); a left join emits it once, with nulls.
    far = [(a, p) for a, p, ts in bids() if abs(ts - opened[a]) >= 30_000]
    assert far and all(got[(a, p, sellers[a])] == 0 for a, p in far)
    unmatched = Counter((a, p) for (a, p, seller), n in got.items() if seller is None
                        for _ in range(n))
    assert all(unmatched[(a, p)] >= 1 for a, p in far)
    assert sum(got.values()) == BIDS  # a left join: every bid exactly once


def test_regular_join_mistakes_are_found_when_the_file_loads() -> None:
    text = pipeline(Path("/tmp/o"), Path("/tmp/s"), "memory", 1, "true", join_type="left")
    with pytest.raises(PipelineError) as err:
        load_pipeline_text(text)
    assert "a regular join without a ttl keeps every record forever" in str(err.value)
    text = pipeline(Path("/tmp/o"), Path("/tmp/s"), "memory", 1, "{ttl: 1h}").replace(
        "    join: {", "    late: out\n    join: {")
    with pytest.raises(PipelineError) as err:
        load_pipeline_text(text)
    assert "is a regular join, which takes every record, late ones too; remove late" in str(
        err.value)
    with pytest.raises(PipelineError) as err:
        load_pipeline_text(pipeline(Path("/tmp/o"), Path("/tmp/s"), "memory", 1, "false"))
    assert "must be true (keep every record of both sides) or {ttl: <duration>}" in str(
        err.value)
