"""Write the `tests:` block of every runnable Nexmark pipeline: a few inline rows per source,
and the expected rows that the query's batch oracle (bench/nexmark/queries.py) gives on them.

    .venv/bin/python -m bench.nexmark.tests_block

The rows are written by hand to reach each query's cases (ties, bids after an auction's
expiry, a session gap, two days, a URL without a channel id); the expected rows are never
written by hand.
"""

from __future__ import annotations

import json
from typing import Any

from bench.nexmark.queries import QUERIES, Query
from bench.nexmark.run import SCHEMAS

URL = "https://www.nexmark.com/{}/item.htm?query=1"
BIDS = [
    {"auction": 1107, "bidder": 1001, "price": 500, "channel": "Google",
     "url": URL.format("ab/cd_e/fg"), "date_time": "2026-01-01T00:00:00.100Z", "extra": "ccx"},
    {"auction": 1107, "bidder": 1001, "price": 2500000, "channel": "channel-7",
     "url": URL.format("hi/jk/lm") + "&channel_id=234881024",
     "date_time": "2026-01-01T00:00:01.500Z", "extra": "abc"},
    {"auction": 1010, "bidder": 1002, "price": 60000, "channel": "Apple",
     "url": URL.format("no/pq/rs"), "date_time": "2026-01-01T00:00:03Z", "extra": "cc"},
    {"auction": 1010, "bidder": 1001, "price": 60000, "channel": "channel-9",
     "url": URL.format("tu/vw/xy"), "date_time": "2026-01-01T00:00:04Z", "extra": ""},
    {"auction": 1011, "bidder": 1003, "price": 70000000, "channel": "Baidu",
     "url": URL.format("ab/cd_e/fg"), "date_time": "2026-01-01T00:00:09.999Z", "extra": "xyz"},
    {"auction": 1010, "bidder": 1002, "price": 1200000, "channel": "Facebook",
     "url": URL.format("ab/cd_e/fg"), "date_time": "2026-01-01T00:00:12Z", "extra": "c"},
    {"auction": 1011, "bidder": 1003, "price": 900, "channel": "channel-7",
     "url": URL.format("hi/jk/lm") + "&channel_id=234881024",
     "date_time": "2026-01-01T00:00:25Z", "extra": "zz"},
    {"auction": 1010, "bidder": 1001, "price": 3000000, "channel": "Google",
     "url": URL.format("ab/cd_e/fg"), "date_time": "2026-01-01T09:30:00Z", "extra": "ccc"},
    {"auction": 1107, "bidder": 1002, "price": 45000000, "channel": "Apple",
     "url": URL.format("no/pq/rs"), "date_time": "2026-01-01T19:00:00Z", "extra": "c"},
    {"auction": 1010, "bidder": 1001, "price": 7000, "channel": "channel-9",
     "url": URL.format("tu/vw/xy"), "date_time": "2026-01-02T00:00:05Z", "extra": "x"},
]
AUCTIONS = [
    {"id": 1107, "item_name": "lamp", "description": "an old lamp", "initial_bid": 100,
     "reserve": 900, "date_time": "2026-01-01T00:00:00.050Z",
     "expires": "2026-01-01T00:00:01Z", "seller": 1002, "category": 10, "extra": "a"},
    {"id": 1010, "item_name": "desk", "description": "oak", "initial_bid": 5000,
     "reserve": 9000, "date_time": "2026-01-01T00:00:02Z", "expires": "2026-01-01T00:00:05Z",
     "seller": 1001, "category": 10, "extra": "b"},
    {"id": 1011, "item_name": "chair", "description": "", "initial_bid": 700,
     "reserve": 800, "date_time": "2026-01-01T00:00:09Z", "expires": "2026-01-01T00:00:30Z",
     "seller": 1000, "category": 11, "extra": "c"},
]
PERSONS = [
    {"id": 1000, "name": "Kate Smith", "city": "Bend", "state": "CA",
     "date_time": "2026-01-01T00:00:00.500Z"},
    {"id": 1001, "name": "Paul Abrams", "city": "Portland", "state": "OR",
     "date_time": "2026-01-01T00:00:01Z"},
    {"id": 1002, "name": "Luke Jones", "city": "Boise", "state": "ID",
     "date_time": "2026-01-01T00:00:11Z"},
]
SIDE_INPUT = [{"key": 1010, "value": "1010"}, {"key": 1107, "value": "1107"}]
SOURCE_IDS = {"bid": "bids", "auction": "auctions", "person": "persons"}


def inputs(q: Query) -> dict[str, list[dict[str, Any]]]:
    rows = {"bid": BIDS, "auction": AUCTIONS, "person": PERSONS}
    if q.name == "q12":  # processing-time windows: one bid per bidder, whenever it runs
        rows = {"bid": [b for b in BIDS if b["auction"] == 1107]}
    out = {SOURCE_IDS[k]: rows[k] for k in q.kinds}
    if q.name == "q13":
        out["side_input"] = SIDE_INPUT
    return out


def expected(spark: Any, q: Query, case: dict[str, list[dict[str, Any]]]) -> list[dict]:
    from pyspark.sql import functions as F

    from streamer.connectors.formats import json_value

    kinds = {v: k for k, v in SOURCE_IDS.items()}
    for source, rows in case.items():
        kind = kinds.get(source, source)
        if kind == "side_input":
            spark.createDataFrame(rows, "key bigint, value string") \
                .createOrReplaceTempView("side_input")
            continue
        schema = SCHEMAS[kind]
        lines = [json.dumps(r) for r in rows]
        df = spark.read.schema(schema).json(spark.sparkContext.parallelize(lines, 1))
        df = df.withColumn("_seq", F.monotonically_increasing_id())
        df.createOrReplaceTempView(kind)
    return [json_value(r.asDict(recursive=True)) for r in spark.sql(q.oracle).collect()]


def block(q: Query, case: dict[str, list[dict]], want: list[dict]) -> str:
    sink = "per_bidder" if q.name == "q12" else "out"
    lines = ["tests:", f"  - name: Nexmark {q.name} on a few hand-written events "
             "(expected rows from the batch oracle)", "    inputs:"]
    for source, rows in case.items():
        lines.append(f"      {source}:")
        lines += [f"        - {json.dumps(r)}" for r in rows]
    lines += ["    expect:", f"      {sink}:" + ("" if want else " []")]
    lines += [f"        - {json.dumps(r, sort_keys=False)}" for r in want]
    return "\n".join(lines) + "\n"


def main() -> None:
    from streamer.runtime.cluster.spark import create_session

    spark = create_session("nexmark-tests-block", "local[1]",
                           {"spark.sql.shuffle.partitions": "1",
                            "spark.sql.session.timeZone": "UTC"}, ui=False)
    for q in QUERIES:
        if q.pending:
            continue
        case = inputs(q)
        want = expected(spark, q, case)
        text = q.path.read_text()
        text = text.split("\ntests:\n")[0].rstrip("\n") + "\n"
        q.path.write_text(text + block(q, case, want))
        print(f"{q.path.name}: {len(want)} expected rows")
    spark.stop()


if __name__ == "__main__":
    main()
