"""Exact distinct counts and conditional aggregates (Nexmark Q15-Q17, issue 40):
`count(distinct x)`, `count(distinct x, y)` and `agg(...) filter (where ...)` in tumbling,
sliding, session and count windows and rolling aggregates, on both backends, against Spark
batch SQL over the same records (the oracle); resumed from a checkpoint in the middle, and
restored from a savepoint at another parallelism and backend."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.control import ControlChannel
from streamer.runtime.job.coordinator import JobRunner, RunOptions
from streamer.runtime.observe.metrics import JsonReporter

pytestmark = pytest.mark.spark

BASE = 1_767_225_600_000
SPLITS, LIMIT = 2, 900

#: The aggregates of every operator (a session window cannot count pairs yet).
AGGREGATES = {
    "n": "count(*)",
    "bidders": "count(distinct bidder)",
    "pairs": "count(distinct bidder, channel)",
    "cheap": "count(*) filter (where price < 30)",
    "cheap_sum": "sum(price) filter (where price < 30)",
    "cheap_bidders": "count(distinct bidder) filter (where price < 30)",
    "rich_max": "max(price) FILTER (WHERE price >= 60 and channel <> 'c0')",
}
OPERATORS = {  # id -> window (None: a rolling aggregate), as YAML
    "tumbling": "{tumbling: 10s}",
    "sliding": "{sliding: {size: 20s, slide: 10s}}",
    "session": "{session: {gap: 5s}}",
    "counted": "{count: 7}",
    "rolling": None,
}


def records() -> list[dict[str, Any]]:
    """The generated records, as the datagen source below makes them: each auction is one
    split's, in event-time order; a pause of 10 s every 50 records ends its sessions."""
    out = []
    for split in range(SPLITS):
        for o in range(LIMIT):
            channel = None if o % 17 == 5 else f"c{(o * 3 + split) % 4}"
            out.append({"auction": o % 5 + 5 * split, "bidder": (o * 7 + split) % 11,
                        "channel": channel, "price": (o * 31) % 97,
                        "ts": BASE + o * 200 + (o // 50) * 10_000, "seq": o})
    return out


def pipeline(tmp: Path, backend: str, parallelism: int = 2) -> str:
    ops, sinks = [], []
    for op, window in OPERATORS.items():
        aggs = {k: v for k, v in AGGREGATES.items() if not (op == "session" and k == "pairs")}
        listed = ", ".join(f'{k}: "{v}"' for k, v in aggs.items())
        keyed = f"\n    window: {window}" if window else ""
        ops.append(f"""
  - id: {op}
    input: bids
    key_by: [auction]{keyed}
    aggregate: {{{listed}}}""")
        sinks.append(f"\n  - {{id: {op}_out, type: files, input: {op}, "
                     f"path: {tmp / 'out' / op}, format: jsonl}}")
    channel = "case when offset % 17 = 5 then null else concat('c', (offset * 3 + split) % 4) end"
    return f"""
name: distinct-counts
storage: {tmp / 'storage'}
job:
  parallelism: {parallelism}
  max_parallelism: 32
  checkpoint: {{interval: 1ms}}
  state: {{backend: {backend}, local_dir: {tmp / 'state'}}}
sources:
  - id: bids
    type: datagen
    splits: {SPLITS}
    limit: {LIMIT}
    max_records_per_epoch: 150
    fields:
      auction: "cast(offset % 5 + 5 * split as bigint)"
      bidder: "cast((offset * 7 + split) % 11 as bigint)"
      channel: "{channel}"
      price: "cast(offset * 31 % 97 as bigint)"
      ts: "timestamp_millis({BASE} + offset * 200 + (offset div 50) * 10000)"
    event_time: ts
    watermark: {{max_out_of_orderness: 2s}}
operators:{''.join(ops)}
sinks:{''.join(sinks)}
"""


def oracle(spark: Any) -> dict[str, Counter]:
    """Each operator's results by Spark batch SQL over the same records."""
    from pyspark.sql import functions as F

    rows = records()
    df = spark.createDataFrame(rows).withColumn("ts", F.timestamp_millis("ts"))
    df.createOrReplaceTempView("bids")
    count_ids = ("(row_number() over (partition by auction order by ts) - 1) div 7")
    spark.sql(f"select *, {count_ids} as cw, count(*) over (partition by auction, "
              f"{count_ids}) as cw_n from bids").createOrReplaceTempView("counted")
    selects = {  # op -> (window grouped by, its start, the view, a condition)
        "tumbling": ("window(ts, '10 seconds')", "window.start", "bids", ""),
        "sliding": ("window(ts, '20 seconds', '10 seconds')", "window.start", "bids", ""),
        "session": ("session_window(ts, '5 seconds')", "session_window.start", "bids", ""),
        "counted": ("cw", "min(ts)", "counted", "where cw_n = 7"),
        "rolling": (None, "null", "bids", ""),
    }
    out = {}
    for op, (window, start, view, where) in selects.items():
        aggs = ", ".join(f"{v} as {k}" for k, v in AGGREGATES.items()
                         if not (op == "session" and k == "pairs"))
        group = "auction" + (f", {window}" if window else "")
        sql = f"select auction, {start} as start, {aggs} from {view} {where} group by {group}"
        out[op] = Counter(_row(r.asDict()) for r in spark.sql(sql).collect())
    return out


def _row(r: dict[str, Any]) -> str:
    start = r.pop("start", None)
    ms = None if start is None else int(start.timestamp() * 1000) if isinstance(
        start, datetime) else start
    return json.dumps({**r, "start": ms}, sort_keys=True)


def results(tmp: Path, op: str) -> Counter:
    """An operator's output: every window's row; a rolling aggregate's last row per key."""
    rows = [json.loads(line) for part in sorted((tmp / "out" / op).glob("part-*.jsonl"))
            for line in part.read_text().splitlines() if line.strip()]
    if op == "rolling":
        rows = list({r["auction"]: r for r in rows}.values())
    out: Counter = Counter()
    for r in rows:
        start = r.pop("window_start", None)
        r.pop("window_end", None)
        r["start"] = None if start is None else int(datetime.fromisoformat(
            start.replace("Z", "+00:00")).timestamp() * 1000)
        out[json.dumps(r, sort_keys=True)] += 1
    return out


def run(spark: Any, text: str, **options: Any) -> Any:
    spec = load_pipeline_text(textwrap.dedent(text))
    return JobRunner(spec, RunOptions(ui=False, checkpoints=True, **options),
                     spark=spark).run()


@pytest.fixture(scope="module")
def expected(spark: Any) -> dict[str, Counter]:
    return oracle(spark)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_distinct_counts_and_filters_resumed_from_a_checkpoint_equal_the_oracle(
        spark: Any, tmp_path: Path, backend: str, expected: dict[str, Counter]) -> None:
    text = pipeline(tmp_path, backend)
    first = run(spark, text, max_epochs=3)
    assert first.epochs == 3
    run(spark, text)  # resumes from the checkpoint of epoch 3
    for op in OPERATORS:
        assert results(tmp_path, op) == expected[op], op


@pytest.mark.slow
def test_a_savepoint_restores_the_sets_at_another_parallelism_and_backend(
        spark: Any, tmp_path: Path, expected: dict[str, Counter]) -> None:
    """Stop with a savepoint at 2 subtasks on rocksdb; restore it at 3 on memory: the sets
    move with their key groups, so every count stays exact."""
    storage, filed = str(tmp_path / "storage"), []

    class StopAfterEpoch2:
        def write(self, s: str) -> None:
            for line in filter(None, s.splitlines()):
                event = json.loads(line)
                if not filed and event["event"] == "epoch" and event["epoch"] >= 2:
                    filed.append(ControlChannel(storage, "distinct-counts").request(
                        kind="stop", savepoint=True, drain=False))

        def flush(self) -> None:
            pass

    spec = load_pipeline_text(textwrap.dedent(pipeline(tmp_path, "rocksdb", 2)))
    stopped = JobRunner(spec, RunOptions(ui=False, checkpoints=True), spark=spark,
                        reporter=JsonReporter(StopAfterEpoch2())).run()  # type: ignore[arg-type]
    assert stopped.status == "stopped" and len(stopped.savepoints) == 1
    restored = run(spark, pipeline(tmp_path, "memory", 3), from_savepoint=stopped.savepoints[0])
    assert restored.status == "finished"
    for op in OPERATORS:
        assert results(tmp_path, op) == expected[op], op


@pytest.mark.slow
def test_filtered_aggregates_over_updates_take_back_the_old_values(
        spark: Any, tmp_path: Path) -> None:
    """A filter over a rolling aggregate's changelog: a key's old value is taken back only
    where it passed the filter, its new value added only where that passes (Nexmark Q4's
    shape, with Q15's filters)."""
    text = pipeline(tmp_path, "rocksdb")
    head, _, _ = text.partition("operators:")
    text = head + f"""operators:
  - id: top
    input: bids
    key_by: [auction, bidder]
    aggregate: {{top: max(price)}}
  - id: per_auction
    input: top
    key_by: [auction]
    aggregate: {{high: "count(*) filter (where top >= 80)",
                 high_sum: "sum(top) filter (where top >= 80)",
                 low_avg: "avg(top) filter (where top < 80 and bidder % 2 = 0)"}}
sinks:
  - {{id: out, type: files, input: per_auction, path: {tmp_path / 'out' / 'rolling'},
      format: jsonl}}
"""
    run(spark, text)
    from pyspark.sql import functions as F

    spark.createDataFrame(records()).withColumn("ts", F.timestamp_millis("ts")) \
        .createOrReplaceTempView("bids")
    want = Counter(_row({**r.asDict(), "start": None}) for r in spark.sql("""
        select auction, count(*) filter (where top >= 80) as high,
               sum(top) filter (where top >= 80) as high_sum,
               avg(top) filter (where top < 80 and bidder % 2 = 0) as low_avg
        from (select auction, bidder, max(price) as top from bids group by auction, bidder)
        group by auction""").collect())
    assert results(tmp_path, "rolling") == want
