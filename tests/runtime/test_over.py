"""OVER windows (`over: {rows: n} | {range: d}`, operators/over.py; Nexmark Q6's "average of
the last 10"): every record once, with aggregates over its key's records up to it in
event-time order, checked against a brute-force oracle over the same generated records
(which arrive out of order) on both backends; and what validation refuses.
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
from streamer.runtime.job.coordinator import JobRunner, RunOptions

pytestmark = pytest.mark.spark

BASE = 1_767_225_600_000
LIMIT = 800


def records() -> list[tuple[int, int, int]]:
    """(seller, price, ts): every 7th record arrives 1.5 s late (the watermark allows 2 s);
    records of a seller 100 ms apart, some of two sellers at once."""
    return [(o % 6, o * 13 % 37, BASE + (o // 2) * 100 - (1500 if o % 7 == 3 else 0))
            for o in range(LIMIT)]


def pipeline(out: Path, state: Path, backend: str, parallelism: int, over: str) -> str:
    return textwrap.dedent(f"""\
name: over-windows
job:
  parallelism: {parallelism}
  state: {{backend: {backend}, local_dir: {state}}}
sources:
  - id: sales
    type: datagen
    limit: {LIMIT}
    max_records_per_epoch: 200
    fields:
      seller: "cast(offset % 6 as bigint)"
      price: "cast(offset * 13 % 37 as bigint)"
      ts: "timestamp_millis({BASE} + (offset div 2) * 100 - if(offset % 7 = 3, 1500, 0))"
    event_time: ts
    watermark: {{max_out_of_orderness: 2s}}
operators:
  - id: recent
    input: sales
    key_by: [seller]
    over: {over}
    aggregate: {{avg_price: avg(price), top: max(price), n: count()}}
sinks:
  - {{id: out, type: files, input: recent, path: {out}, format: jsonl}}
""")


def rows_of(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for part in sorted(directory.glob("part-*.jsonl"))
            for line in part.read_text().splitlines() if line.strip()]


def iso(ms: int) -> str:
    from datetime import UTC, datetime

    text = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z").replace(".000Z", "Z")


def expected(rows: int | None = None, range_ms: int | None = None) -> Counter:
    by_seller: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for seller, price, ts in records():
        by_seller[seller].append((ts, price))
    want: Counter = Counter()
    for seller, values in by_seller.items():
        values.sort(key=lambda v: v[0])  # (stable: records of one time in arrival order)
        for i, (ts, price) in enumerate(values):
            # ROWS: the last n in order; RANGE: every record within the range, those of the
            # same time (peers) included.
            window = (values[max(0, i - rows + 1):i + 1] if rows is not None
                      else [v for v in values if ts - (range_ms or 0) <= v[0] <= ts])
            prices = [p for _, p in window]
            want[(seller, price, ts, round(sum(prices) / len(prices), 9), max(prices),
                  len(prices))] += 1
    return want


def got(out: Path) -> Counter:
    from datetime import datetime

    found: Counter = Counter()
    for r in rows_of(out):
        ts = int(datetime.fromisoformat(r["ts"].replace("Z", "+00:00")).timestamp() * 1000)
        found[(r["seller"], r["price"], ts, round(r["avg_price"], 9), r["top"], r["n"])] += 1
    return found


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "parallelism", "over", "rows", "range_ms"), [
    ("rocksdb", 2, "{rows: 3}", 3, None),
    ("memory", 3, "{range: 2s}", None, 2000),
])
def test_an_over_window_aggregates_each_records_predecessors_in_event_time_order(
        spark: Any, tmp_path: Path, backend: str, parallelism: int, over: str,
        rows: int | None, range_ms: int | None) -> None:
    out = tmp_path / "out"
    spec = load_pipeline_text(pipeline(out, tmp_path / "state", backend, parallelism, over))
    result = JobRunner(spec, RunOptions(ui=False), spark=spark).run()
    assert result.status == "finished" and result.late == 0
    assert got(out) == expected(rows, range_ms)


def test_over_window_mistakes_are_found_when_the_file_loads() -> None:
    text = pipeline(Path("/tmp/o"), Path("/tmp/s"), "memory", 1, "{rows: 3}")
    with pytest.raises(PipelineError) as err:
        load_pipeline_text(text.replace("n: count()}", "n: count(), first_price: first(price)}"))
    assert "an OVER window computes count, sum, avg, min, max; first() is not one" in str(
        err.value)
    with pytest.raises(PipelineError) as err:
        load_pipeline_text(text.replace("over: {rows: 3}", "over: {rows: 3, range: 1s}"))
    assert "an OVER window needs exactly one of rows: <n> or range: <duration>" in str(err.value)
    with pytest.raises(PipelineError) as err:
        load_pipeline_text(text.replace("    event_time: ts\n    watermark: "
                                        "{max_out_of_orderness: 2s}\n", ""))
    assert "is an OVER window, which orders each key's records by event time" in str(err.value)
