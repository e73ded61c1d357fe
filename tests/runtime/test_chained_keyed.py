"""Keyed operators that read keyed operators (issue 40): a window over a window, on the same
key and on another one, and a window join of a window's results, checked against a
brute-force oracle over the same generated records, on both backends and at several
parallelisms; and a chained job resumed from its checkpoint.

Before operators had watermarks of their own, the second window judged the first one's
results against the watermark the first had just fired at, and dropped most of them as late
(silently: 7,200 of 12,000 records in the reproduction); a join of a window's output failed
with "key-group routing is broken", since a keyed stage took its subtask from the task's
partition index, which a union offsets.
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from test_keyed import rows_of
from test_keyed import run as run_keyed

from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.watermarks import MIN_WATERMARK, WatermarkTracker, operator_chains

pytestmark = pytest.mark.spark

BASE = 1_767_225_600_000
SPLITS, LIMIT = 2, 1500


def records() -> list[tuple[int, int, int]]:
    """(auction, price, ts ms) of every generated record, as the datagen source makes them."""
    out = []
    for _split in range(SPLITS):
        for offset in range(LIMIT):
            ts = BASE + offset * 100 - (2500 if offset % 7 == 3 else 0)
            out.append((offset % 13, (offset * 31) % 97, ts))
    return out


SOURCE = f"""
sources:
  - id: bids
    type: datagen
    splits: {SPLITS}
    limit: {LIMIT}
    max_records_per_epoch: 500
    fields:
      auction: "cast(offset % 13 as bigint)"
      price: "cast(offset * 31 % 97 as bigint)"
      ts: "timestamp_millis({BASE} + offset * 100 - case when offset % 7 = 3 then 2500 else 0 end)"
    event_time: ts
    watermark: {{max_out_of_orderness: 3s}}
"""


def run(spark, text: str, **options):
    """test_keyed's run, for its result alone."""
    return run_keyed(spark, text, **options)[1]


def iso(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def first_windows() -> dict[tuple[int, int], tuple[int, int]]:
    """(auction, 10 s window start) -> (records, top price)."""
    found: dict[tuple[int, int], list[int]] = defaultdict(list)
    for auction, price, ts in records():
        found[(auction, ts - ts % 10_000)].append(price)
    return {k: (len(v), max(v)) for k, v in found.items()}


def window_over_window_pipeline(out: Path, state: Path, backend: str, parallelism: int,
                                rekey: bool) -> str:
    second_key = "bucket" if rekey else "auction"
    middle = """
  - id: bucketed
    input: per_auction
    with_columns: {bucket: "auction % 3"}
""" if rekey else ""
    return f"""
name: window-over-window
job:
  parallelism: {parallelism}
  max_parallelism: 32
  state: {{backend: {backend}, local_dir: {state}}}
{SOURCE}
operators:
  - id: per_auction
    input: bids
    key_by: [auction]
    window: {{tumbling: 10s}}
    aggregate: {{n: count(), top: max(price)}}
{middle}
  - id: per_minute
    input: {"bucketed" if rekey else "per_auction"}
    key_by: [{second_key}]
    window: {{tumbling: 1m}}
    aggregate: {{windows: count(), n: sum(n), top: max(top)}}
sinks:
  - {{id: out, type: files, input: per_minute, path: {out}, format: jsonl}}
"""


def expected_per_minute(rekey: bool) -> Counter:
    found: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for (auction, start), (n, top) in first_windows().items():
        result_ts = start + 10_000 - 1  # a window's result carries its end - 1 ms
        key = auction % 3 if rekey else auction
        found[(key, result_ts - result_ts % 60_000)].append((n, top))
    return Counter((key, iso(start), len(v), sum(n for n, _ in v), max(t for _, t in v))
                   for (key, start), v in found.items())


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "parallelism", "rekey"), [
    ("memory", 1, False), ("rocksdb", 3, False), ("rocksdb", 2, True), ("memory", 4, True)])
def test_a_window_over_a_window_counts_every_record(spark, tmp_path: Path, backend: str,
                                                    parallelism: int, rekey: bool) -> None:
    out = tmp_path / "out"
    result = run(spark, window_over_window_pipeline(out, tmp_path / "state", backend,
                                                    parallelism, rekey))
    key = "bucket" if rekey else "auction"
    got = Counter((r[key], r["window_start"], r["windows"], r["n"], r["top"])
                  for r in rows_of(out))
    assert sum(n for *_, n, _ in got) == SPLITS * LIMIT
    assert got == expected_per_minute(rekey)
    assert result.late == 0


@pytest.mark.slow
def test_a_window_join_of_a_windows_results_matches_every_record(spark, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run(spark, f"""
name: join-of-window
job:
  parallelism: 2
  max_parallelism: 32
  state: {{backend: rocksdb, local_dir: {tmp_path / "state"}}}
{SOURCE}
operators:
  - id: per_auction
    input: bids
    key_by: [auction]
    window: {{tumbling: 10s}}
    aggregate: {{top: max(price)}}
  - id: best
    join:
      left: bids
      right: per_auction
      on: [auction]
      window: {{tumbling: 10s}}
      right_prefix: w_    # (per_auction's own window_start and window_end, apart from the join's)
sinks:
  - {{id: out, type: files, input: best, path: {out}, format: jsonl}}
""")
    rows = rows_of(out)
    tops = first_windows()
    expected = Counter()
    for auction, price, ts in records():
        start = ts - ts % 10_000
        expected[(auction, price, iso(start), tops[(auction, start)][1])] += 1
    got = Counter((r["auction"], r["price"], r["window_start"], r["w_top"]) for r in rows)
    assert all(r["w_window_start"] == r["window_start"] for r in rows)  # the same window
    assert got == expected


def test_a_chained_job_resumed_from_its_checkpoint_loses_and_repeats_nothing(
        spark, tmp_path: Path) -> None:
    out, storage = tmp_path / "out", tmp_path / "storage"
    text = window_over_window_pipeline(out, tmp_path / "state", "rocksdb", 2, True).replace(
        "name: window-over-window",
        f"name: window-over-window\nstorage: {storage}")
    text = text.replace("  max_parallelism: 32",
                        "  max_parallelism: 32\n  checkpoint: {interval: 1ms}")
    first = run(spark, text, checkpoints=True, max_epochs=3)
    assert first.epochs == 3
    run(spark, text, checkpoints=True)
    got = Counter((r["bucket"], r["window_start"], r["windows"], r["n"], r["top"])
                  for r in rows_of(out))
    assert got == expected_per_minute(True)


def test_operator_watermarks_follow_their_inputs_and_survive_a_checkpoint() -> None:
    spec = load_pipeline_text(textwrap.dedent(window_over_window_pipeline(
        Path("/tmp/o"), Path("/tmp/s"), "memory", 1, True)).replace(
        "window: {tumbling: 10s}", "window: {tumbling: 10s, allowed_lateness: 2s}"))
    chains = operator_chains(spec)
    assert chains["per_auction"].upstream == () and chains["per_auction"].from_sources
    assert chains["per_minute"].upstream == ("per_auction",)
    assert not chains["per_minute"].from_sources
    assert chains["per_auction"].hold_ms == 2000
    tracker = WatermarkTracker({s.id: s for s in spec.sources}, chains=chains)
    tracker.current = 50_000
    marks = tracker.for_operators()
    # Nothing ran yet: the downstream window judges nothing late.
    assert marks == {"per_auction": 50_000, "per_minute": MIN_WATERMARK}
    tracker.operators_ran(marks)
    tracker.current = 60_000
    # The upstream ran at 50 s and may still emit 2 s behind it.
    assert tracker.for_operators() == {"per_auction": 60_000, "per_minute": 48_000}
    saved = tracker.to_json()
    again = WatermarkTracker({s.id: s for s in spec.sources}, chains=chains)
    again.restore(json.loads(json.dumps(saved)), 0)
    assert again.for_operators() == tracker.for_operators()


@pytest.mark.slow
def test_a_window_over_a_process_functions_output_is_an_event_time_window(
        spark, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run(spark, f"""
name: window-over-process
job:
  parallelism: 2
  max_parallelism: 32
  state: {{backend: memory}}
{SOURCE}
operators:
  - id: forwarded
    input: bids
    key_by: [auction]
    process: "chained_process:Forward"
  - id: per_minute
    input: forwarded
    key_by: [auction]
    window: {{tumbling: 1m}}
    aggregate: {{n: count(), top: max(price)}}
sinks:
  - {{id: out, type: files, input: per_minute, path: {out}, format: jsonl}}
""")
    found: dict[tuple[int, int], list[int]] = defaultdict(list)
    for auction, price, ts in records():
        found[(auction, ts - ts % 60_000)].append(price)
    expected = Counter((a, iso(start), len(p), max(p)) for (a, start), p in found.items())
    got = Counter((r["auction"], r["window_start"], r["n"], r["top"]) for r in rows_of(out))
    assert got == expected


def rolling_over_rolling(out: Path, backend: str, parallelism: int) -> str:
    return f"""
name: rolling-over-rolling
job:
  parallelism: {parallelism}
  max_parallelism: 32
  state: {{backend: {backend}}}
{SOURCE}
operators:
  - id: categorized
    input: bids
    with_columns: {{category: "auction % 4"}}
  - id: max_price
    input: categorized
    key_by: [auction, category]
    aggregate: {{top: max(price)}}
  - id: cheap_or_not
    input: max_price
    filter: "top >= 10"
  - id: per_category
    input: cheap_or_not
    key_by: [category]
    aggregate: {{auctions: count(), total: sum(top), avg_top: avg(top)}}
sinks:
  - {{id: out, type: files, input: per_category, path: {out}, format: jsonl}}
  - {{id: maxima, type: files, input: max_price, path: {out}-maxima, format: jsonl}}
"""


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "parallelism"), [("rocksdb", 3), ("memory", 2)])
def test_an_aggregate_over_a_rolling_aggregates_updates_takes_back_the_old_values(
        spark, tmp_path: Path, backend: str, parallelism: int) -> None:
    """Nexmark Q4's shape: the average of per-auction maxima per category. Each epoch
    raises some auctions' maxima; the per-category aggregate takes each old maximum back
    before it adds the new one, so its last update per category is exact."""
    out = tmp_path / "out"
    run(spark, rolling_over_rolling(out, backend, parallelism))
    maxima: dict[int, int] = {}
    for auction, price, _ in records():
        maxima[auction] = max(maxima.get(auction, price), price)
    per_category: dict[int, list[int]] = defaultdict(list)
    for auction, top in maxima.items():
        if top >= 10:
            per_category[auction % 4].append(top)
    rows = rows_of(out)
    last = {}
    for row in rows:  # the files are in epoch order; within an epoch one row per key
        last[row["category"]] = row
    assert {c: (r["auctions"], r["total"]) for c, r in last.items()} == {
        c: (len(v), sum(v)) for c, v in per_category.items()}
    for c, r in last.items():
        assert r["avg_top"] == pytest.approx(sum(per_category[c]) / len(per_category[c]))
    # the sinks never see a retraction, and the updates reached them epoch by epoch
    assert len(rows) > len(last)
    maxima_rows = rows_of(Path(f"{out}-maxima"))
    assert {r["auction"]: r["top"] for r in maxima_rows} == maxima
    assert all(set(r) == {"auction", "category", "top"} for r in maxima_rows)
