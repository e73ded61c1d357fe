"""Chained keyed operators against a batch oracle (issue 40): random pairs of an upstream
keyed operator (tumbling or session window, dedupe, rolling aggregate, interval join, top-N
with and without a window, OVER window) and a downstream one (a tumbling window or a rolling
aggregate, on the same key or another), on random input with bounded disorder, at
parallelism 1-4, on both backends. The downstream operator must see every upstream result:
on time (a window's results carry its end - 1 ms and the upstream's watermark, a join's the
later of its pair's times), and, over an update stream (a rolling aggregate's, a top-N's
without a window), with each old value taken back. Each example runs a whole job on real
Spark, so the examples are few."""

from __future__ import annotations

import json
import random
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.coordinator import JobRunner, RunOptions

pytestmark = [pytest.mark.spark, pytest.mark.slow]

BASE = 1_767_225_600_000
DISORDER_MS = 3_000

UPSTREAM = {
    "tumbling": "window: {{tumbling: {size}s}}\n    aggregate: {{n: count(), x: sum(v)}}",
    "session": "window: {{session: {{gap: {size}s}}}}\n    aggregate: {{n: count(), x: sum(v)}}",
    "dedupe": "dedupe: {{within: 1h}}",
    "rolling": "aggregate: {{n: count(), x: sum(v)}}",
    "top_n": "top_n: {{n: 2, order_by: [v desc]}}",
    "top_n_window": "window: {{tumbling: {size}s}}\n    top_n: {{n: 2, order_by: [v desc]}}",
    "over": "over: {{rows: 3}}\n    aggregate: {{n: count(), x: sum(v)}}",
    "join": "",  # (an interval join of the even and the odd values: `pipeline`)
}
#: What a downstream operator can read: every upstream but the update streams (a rolling
#: aggregate's, a top-N's without a window) feeds a window too; those are refused there at
#: validate time (tests/pipeline/test_composition.py).
PAIRS = sorted((up, down) for up in UPSTREAM for down in ("tumbling", "rolling")
               if not (down == "tumbling" and up in ("rolling", "top_n")))
#: The upstream operators whose output keeps the input's `v` (the rest aggregate it as `x`).
KEEPS_V = ("dedupe", "top_n", "top_n_window", "join")
JOIN_MS = 1_000  # the interval join's bound: right.ts - left.ts within [-1 s, 1 s]


def make_records(seed: int, count: int, keys: int) -> list[dict]:
    """(k, v, ts) in arrival order: times rise by 0-400 ms, each moved back by up to the
    disorder bound, all distinct (so "first" has one answer)."""
    rng = random.Random(seed)
    now, seen, out = BASE, set(), []
    for _ in range(count):
        now += rng.randrange(0, 400)
        ts = now - rng.randrange(0, DISORDER_MS)
        while ts in seen:
            ts += 1
        seen.add(ts)
        out.append({"k": rng.randrange(keys), "v": rng.randrange(-5, 50), "ts": ts})
    return out


def upstream_rows(kind: str, size_ms: int, records: list[dict]) -> list[dict]:
    """The upstream operator's final rows, each with the value `x` the downstream sums
    and the event time `t` it carries (a window's end - 1 ms, a record's own)."""
    by_key: dict[int, list[dict]] = defaultdict(list)
    for r in records:
        by_key[r["k"]].append(r)
    rows = []
    for k, rs in by_key.items():
        rs = sorted(rs, key=lambda r: r["ts"])
        if kind == "tumbling":
            windows: dict[int, list[dict]] = defaultdict(list)
            for r in rs:
                windows[r["ts"] - r["ts"] % size_ms].append(r)
            rows += [{"k": k, "n": len(w), "x": sum(r["v"] for r in w), "t": s + size_ms - 1}
                     for s, w in windows.items()]
        elif kind == "session":
            session = [rs[0]]
            for r in rs[1:]:
                if r["ts"] >= session[-1]["ts"] + size_ms:
                    rows.append(_session(k, session, size_ms))
                    session = []
                session.append(r)
            rows.append(_session(k, session, size_ms))
        elif kind == "dedupe":
            first = rs[0]
            rows.append({"k": k, "n": 1, "x": first["v"], "t": first["ts"]})
        elif kind == "rolling":  # the key's final value
            rows.append({"k": k, "n": len(rs), "x": sum(r["v"] for r in rs), "t": None})
        elif kind == "top_n":  # the key's final top 2 (ties on v do not change the sum)
            rows += [{"k": k, "n": 1, "x": r["v"], "t": None}
                     for r in sorted(rs, key=lambda r: -r["v"])[:2]]
        elif kind == "top_n_window":
            windows = defaultdict(list)
            for r in rs:
                windows[r["ts"] - r["ts"] % size_ms].append(r)
            rows += [{"k": k, "n": 1, "x": r["v"], "t": s + size_ms - 1}
                     for s, w in windows.items() for r in sorted(w, key=lambda r: -r["v"])[:2]]
        elif kind == "over":  # each record, with the sum of the key's last 3 values
            rows += [{"k": k, "n": min(i + 1, 3), "x": sum(q["v"] for q in rs[max(0, i - 2):i + 1]),
                      "t": r["ts"]} for i, r in enumerate(rs)]
        else:  # join: each even value with each odd one of its key at most 1 s apart
            rows += [{"k": k, "n": 1, "x": left["v"], "t": max(left["ts"], right["ts"])}
                     for left in rs if left["v"] % 2 == 0 for right in rs
                     if right["v"] % 2 != 0 and abs(right["ts"] - left["ts"]) <= JOIN_MS]
    return rows


def _session(k: int, session: list[dict], gap: int) -> dict:
    return {"k": k, "n": len(session), "x": sum(r["v"] for r in session),
            "t": session[-1]["ts"] + gap - 1}


def downstream_rows(kind: str, size_ms: int, rekey: bool, rows: list[dict]) -> dict:
    """The downstream operator's final value per key (and window)."""
    out: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        g = r["k"] % 2 if rekey else r["k"]
        key = (g, r["t"] - r["t"] % size_ms) if kind == "tumbling" else (g, None)
        out[key][0] += 1
        out[key][1] += r["x"]
    return {k: tuple(v) for k, v in out.items()}


def pipeline(data: Path, out: Path, up: str, down: str, size_s: int, rekey: bool,
             parallelism: int, backend: str) -> str:
    key = "g" if rekey else "k"
    middle = ("""
  - id: rekeyed
    input: up
    with_columns: {g: "k % 2"}""" if rekey else "")
    value = "v" if up in KEEPS_V else "x"
    window = f"window: {{tumbling: {2 * size_s}s}}\n    " if down == "tumbling" else ""
    upstream = f"""
  - id: up
    input: records
    key_by: [k]
    {UPSTREAM[up].format(size=size_s)}"""
    if up == "join":
        upstream = f"""
  - id: evens
    input: records
    filter: "v % 2 = 0"
  - id: odds
    input: records
    filter: "v % 2 <> 0"
  - id: up
    join: {{left: evens, right: odds, on: [k], right_prefix: r_,
           between: [-{JOIN_MS}ms, {JOIN_MS}ms]}}"""
    return f"""
name: chained-properties
job: {{parallelism: {parallelism}, max_parallelism: 16, state: {{backend: {backend}}}}}
sources:
  - id: records
    type: files
    path: {data}
    format: jsonl
    max_files_per_epoch: 1
    schema: {{k: bigint, v: bigint, ts_ms: bigint}}
    event_time: timestamp_millis(ts_ms)
    watermark: {{max_out_of_orderness: {DISORDER_MS // 1000}s}}
operators:{upstream}{middle}
  - id: down
    input: {"rekeyed" if rekey else "up"}
    key_by: [{key}]
    {window}aggregate: {{c: count(), t: sum({value})}}
sinks:
  - {{id: out, type: files, input: down, path: {out}, format: jsonl}}
"""


def rows_of(directory: Path) -> list[dict]:
    return [json.loads(line) for part in sorted(directory.glob("part-*.jsonl"))
            for line in part.read_text().splitlines() if line.strip()]


def iso_ms(text: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


@pytest.mark.parametrize("pair", PAIRS, ids=["-".join(p) for p in PAIRS])
@settings(max_examples=2, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), size_s=st.sampled_from([5, 10, 20]), rekey=st.booleans(),
       parallelism=st.integers(1, 4), backend=st.sampled_from(["memory", "rocksdb"]),
       files=st.integers(1, 4))
def test_a_keyed_operator_over_a_keyed_operator_equals_the_batch_oracle(
        spark, tmp_path_factory, seed, pair, size_s, rekey, parallelism, backend,
        files) -> None:
    up, down = pair
    tmp = tmp_path_factory.mktemp("chain")
    data, out = tmp / "data", tmp / "out"
    data.mkdir()
    records = make_records(seed, 400, 6)
    per_file = -(-len(records) // files)
    for i in range(files):
        with open(data / f"part-{i:02d}.jsonl", "w") as handle:
            for r in records[i * per_file:(i + 1) * per_file]:
                handle.write(json.dumps({"k": r["k"], "v": r["v"], "ts_ms": r["ts"]}) + "\n")
    text = pipeline(data, out, up, down, size_s, rekey, parallelism, backend)
    spec = load_pipeline_text(textwrap.dedent(text))
    result = JobRunner(spec, RunOptions(ui=False), spark=spark).run()
    assert result.late == 0
    expected = downstream_rows(down, 2 * size_s * 1000, rekey,
                               upstream_rows(up, size_s * 1000, records))
    got: dict[tuple, tuple[int, int]] = {}
    key = "g" if rekey else "k"
    for row in rows_of(out):  # epoch order: a rolling aggregate's last update wins
        start = iso_ms(row["window_start"]) if down == "tumbling" else None
        got[(row[key], start)] = (row["c"], row["t"])
    assert got == expected, (up, down, size_s, rekey, parallelism, backend, files)
