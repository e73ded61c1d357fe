"""Top-N (`top_n:`, operators/topn.py): per key, and per key and window, checked against a
brute-force oracle over the same generated records, on both backends and at several
parallelisms; a rolling sum over a top-N's updates (retractions); a run resumed from its
checkpoint; a savepoint restored at another parallelism and backend; and what validation
refuses.
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from streamer.pipeline.exceptions import PipelineError
from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.control import ControlChannel
from streamer.runtime.job.coordinator import JobRunner, RunOptions
from streamer.runtime.observe.metrics import JsonReporter
from streamer.savepoint.savepoint_metadata import plan_restore, read_metadata

pytestmark = pytest.mark.spark

BASE = 1_767_225_600_000
SPLITS, LIMIT = 2, 1200


def records() -> list[tuple[int, int, int, int]]:
    """(auction, price, ts ms, split) of every generated record, as the source makes them:
    prices repeat within an auction (ties go to the earlier record), some records arrive
    2.5 s out of order."""
    out = []
    for split in range(SPLITS):
        for offset in range(LIMIT):
            ts = BASE + offset * 100 - (2500 if offset % 7 == 3 else 0)
            out.append((offset % 11, (offset * 31 + split * 17) % 53, ts, split))
    return out


def pipeline(out: Path, state: Path, backend: str, parallelism: int, *,
             storage: Path | None = None, windowed: bool = False) -> str:
    operator = ("""
  - id: top
    input: bids
    key_by: [auction]
    window: {tumbling: 10s}
    top_n: {n: 2, order_by: [price desc]}""" if windowed else """
  - id: top
    input: bids
    key_by: [auction]
    top_n: {n: 3, order_by: [price desc, bidder], rank: place}
  - id: sum_of_top
    input: top
    key_by: [auction]
    aggregate: {total: sum(price), rows: count()}""")
    sinks = "" if windowed else (
        f"\n  - {{id: sums, type: files, input: sum_of_top, path: {out}/sums, format: jsonl}}")
    return textwrap.dedent(f"""\
name: top-n
{f"storage: {storage}" if storage else ""}
job:
  parallelism: {parallelism}
  max_parallelism: 32
  checkpoint: {{interval: 1ms}}
  state: {{backend: {backend}, local_dir: {state}}}
sources:
  - id: bids
    type: datagen
    splits: {SPLITS}
    limit: {LIMIT}
    max_records_per_epoch: 400
    fields:
      auction: "cast(offset % 11 as bigint)"
      price: "cast((offset * 31 + split * 17) % 53 as bigint)"
      bidder: "concat('b', cast(split as string))"
      ts: "timestamp_millis({BASE} + offset * 100 - case when offset % 7 = 3 then 2500 else 0 end)"
    event_time: ts
    watermark: {{max_out_of_orderness: 3s}}
operators:{operator}
sinks:
  - {{id: out, type: files, input: top, path: {out}/top, format: jsonl}}{sinks}
""")


def rows_of(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for part in sorted(directory.glob("part-*.jsonl"))
            for line in part.read_text().splitlines() if line.strip()]


def run(spark: Any, text: str, **options: Any) -> Any:
    spec = load_pipeline_text(text)
    return JobRunner(spec, RunOptions(ui=False, **options), spark=spark).run()


def expected_top(n: int) -> dict[int, list[tuple[int, str, int]]]:
    """auction -> its first n (price, bidder, ts) by price desc, bidder asc, then time."""
    found: dict[int, list[tuple[int, str, int]]] = defaultdict(list)
    for auction, price, ts, split in records():
        found[auction].append((price, f"b{split}", ts))
    return {a: sorted(v, key=lambda r: (-r[0], r[1], r[2]))[:n] for a, v in found.items()}


def iso(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def final_ranks(rows: list[dict[str, Any]]) -> dict[int, list[tuple[int, str]]]:
    """Each auction's rows by rank as a sink that upserts by (key, rank) keeps them."""
    latest: dict[tuple[int, int], tuple[int, str]] = {}
    for r in rows:  # (files in epoch order: a later row of a rank replaces the earlier)
        latest[(r["auction"], r["place"])] = (r["price"], r["bidder"])
    return {a: [latest[(a, k)] for k in sorted(k for b, k in latest if b == a)]
            for a in {a for a, _ in latest}}


def assert_top_and_sums(out: Path) -> None:
    expected = {a: [(p, b) for p, b, _ in top] for a, top in expected_top(3).items()}
    assert final_ranks(rows_of(out / "top")) == expected
    sums = {r["auction"]: (r["total"], r["rows"]) for r in rows_of(out / "sums")}
    assert sums == {a: (sum(p for p, _ in top), 3) for a, top in expected.items()}


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "parallelism"), [("memory", 1), ("rocksdb", 3)])
def test_top_n_per_key_is_an_update_stream_a_rolling_sum_takes_back(
        spark: Any, tmp_path: Path, backend: str, parallelism: int) -> None:
    out = tmp_path / "out"
    result = run(spark, pipeline(out, tmp_path / "state", backend, parallelism))
    assert result.status == "finished"
    assert_top_and_sums(out)
    rows = rows_of(out / "top")
    # Ranks are replaced as better bids come: more rows than 11 auctions x 3 ranks, none of
    # them a retraction (a sink keeps new rows only).
    assert len(rows) > 33 and all("__op" not in r for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "parallelism"), [("rocksdb", 2), ("memory", 4)])
def test_top_n_per_window_emits_each_windows_rows_once(
        spark: Any, tmp_path: Path, backend: str, parallelism: int) -> None:
    out = tmp_path / "out"
    result = run(spark, pipeline(out, tmp_path / "state", backend, parallelism, windowed=True))
    assert result.status == "finished" and result.late == 0
    found: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for auction, price, ts, _ in records():
        found[(auction, ts - ts % 10_000)].append((price, ts))
    expected = Counter()
    for (auction, start), values in found.items():
        for rank, (price, _) in enumerate(sorted(values, key=lambda v: (-v[0], v[1]))[:2], 1):
            expected[(auction, iso(start), iso(start + 10_000), rank, price)] += 1
    got = Counter((r["auction"], r["window_start"], r["window_end"], r["rank"], r["price"])
                  for r in rows_of(out / "top"))
    assert got == expected


@pytest.mark.slow
def test_a_top_n_resumed_from_its_checkpoint_loses_and_repeats_nothing(
        spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    text = pipeline(out, tmp_path / "state", "rocksdb", 2, storage=tmp_path / "storage")
    first = run(spark, text, checkpoints=True, max_epochs=2)
    assert first.epochs == 2
    run(spark, text, checkpoints=True)
    assert_top_and_sums(out)


@pytest.mark.slow
def test_a_top_n_savepoint_restores_at_another_parallelism_and_backend(
        spark: Any, tmp_path: Path) -> None:
    out, storage = tmp_path / "out", tmp_path / "storage"
    filed: list[Any] = []

    class Capture:
        def write(self, s: str) -> None:
            for line in s.splitlines():
                event = json.loads(line) if line else {}
                if not filed and event.get("event") == "epoch" and event["epoch"] >= 2:
                    filed.append(ControlChannel(str(storage), "top-n").request(
                        kind="stop", savepoint=True, drain=False))

        def flush(self) -> None:
            pass

    text = pipeline(out, tmp_path / "state", "rocksdb", 2, storage=storage)
    stopped = JobRunner(load_pipeline_text(text), RunOptions(ui=False, checkpoints=True),
                        spark=spark, reporter=JsonReporter(Capture())).run()  # type: ignore[arg-type]
    assert stopped.status == "stopped" and len(stopped.savepoints) == 1
    resumed = pipeline(out, tmp_path / "state2", "memory", 3, storage=storage)
    result = run(spark, resumed, checkpoints=True, from_savepoint=stopped.savepoints[0])
    assert result.status == "finished"
    assert_top_and_sums(out)
    # A changed n or order would rank rows the savepoint no longer has: refused.
    meta = read_metadata(stopped.savepoints[0])
    for old, new in (("n: 3,", "n: 4,"), ("[price desc, bidder]", "[price, bidder]")):
        decisions = plan_restore(meta, load_pipeline_text(resumed.replace(old, new)))
        assert [(d.operator, d.action) for d in decisions if d.operator == "top"] == [
            ("top", "refuse")], old


def test_top_n_mistakes_are_found_when_the_file_loads() -> None:
    text = pipeline(Path("/tmp/o"), Path("/tmp/s"), "memory", 1)
    with pytest.raises(PipelineError) as err:
        load_pipeline_text(text.replace("[price desc, bidder]", "[nope desc]"))
    assert "order_by column 'nope' of operator 'top' is not in its input" in str(err.value)
    with pytest.raises(PipelineError) as err:
        load_pipeline_text(text.replace("    key_by: [auction]\n    top_n:",
                                        "    key_by: [auction]\n    window: {session: {gap: 1s}}"
                                        "\n    top_n:"))
    assert "a top-N per window needs a tumbling or sliding window" in str(err.value)
    with pytest.raises(PipelineError) as err:
        load_pipeline_text(text.replace("n: 3,", "n: 0,"))
    assert "'n' must be at least 1, got 0" in str(err.value)


def test_a_max_over_a_top_ns_updates_is_refused_with_the_fix() -> None:
    text = pipeline(Path("/tmp/o"), Path("/tmp/s"), "memory", 1).replace(
        "aggregate: {total: sum(price), rows: count()}", "aggregate: {best: max(price)}")
    with pytest.raises(PipelineError) as err:
        load_pipeline_text(text)
    assert "reads the updates of 'top', a top-N without a window" in str(err.value)
    assert "cannot take an old value back" in str(err.value)
