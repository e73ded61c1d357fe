"""Interval, window and table joins on real Spark, checked against the brute-force reference in
`join_oracle.py` over two random keyed streams cut into random epochs, on both state backends
at parallelism 1-4, for every join type; the late output is compared too.

One source carries both streams (`s` = "L" or "R"): two filters split it into the join's left
and right inputs, so the job's watermark is the one the oracle computes. Event times are
mostly in order, some out of order within the bound and some far behind (late).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import join_oracle
import oracle
import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from test_window_properties import BASE, PROPERTY, EpochSource, assert_same, cut, fresh_root

from streamer.connectors.base import ConnectorContext, Sink, Source
from streamer.connectors.builtin.memory_sink import MemorySink
from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.coordinator import JobRunner, RunOptions

pytestmark = pytest.mark.spark

TYPES = ("inner", "left", "right", "full")
#: The properties run about half their examples of before: `test_harness_properties.py`
#: checks each join's kernel without Spark (200 examples each, late records counted); these
#: check Spark's side (the sides' projection, `late:` outputs, routing, epochs, sinks).


def _schema() -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    return StructType([StructField("k", StringType()), StructField("v", LongType()),
                       StructField("s", StringType()), StructField("ts", TimestampType())])


def join_pipeline(join: str, *, root: Path, parallelism: int, max_parallelism: int,
                  backend: str, ooo_ms: int) -> str:
    """events (k, v, s, ts) -> filters `lefts` / `rights` -> join `j` (body given) -> `out`,
    late records -> `late_out` (none for `table: true`, which has no late records)."""
    text = textwrap.dedent(f"""\
        name: join-props
        job:
          parallelism: {parallelism}
          max_parallelism: {max_parallelism}
          state: {{backend: {backend}, local_dir: "{root}"}}
        sources:
          - id: events
            type: files
            path: /nonexistent/events/*.jsonl
            format: jsonl
            schema: {{k: string, v: bigint, s: string, ts: timestamp}}
            event_time: ts
            watermark: {{max_out_of_orderness: {ooo_ms}ms}}
        operators:
          - id: lefts
            input: events
            filter: "s = 'L'"
          - id: rights
            input: events
            filter: "s = 'R'"
          - id: j
            join: {{left: lefts, right: rights, on: [k], right_prefix: r_, {join}}}
            late: late_out
        sinks:
          - id: out
            type: files
            input: j
            path: /nonexistent/out
            format: jsonl
          - id: late_out
            type: files
            path: /nonexistent/late
            format: jsonl
        """)
    if "table: true" in join:
        text = text.replace("    late: late_out\n", "").split("  - id: late_out")[0]
    return text


def run_join(spark: Any, text: str, epochs: Sequence[Sequence[Mapping]]
             ) -> dict[str, list[dict[str, Any]]]:
    """Run the pipeline over the epochs (rows with `ts` in ms); every sink's committed rows."""
    spec = load_pipeline_text(text)
    rows = [[{**r, "ts": oracle.iso(r["ts"])} for r in epoch] for epoch in epochs]
    sinks: dict[str, MemorySink] = {}

    def source_factory(s: Any, ctx: ConnectorContext) -> Source:
        return EpochSource(s, ctx, rows, _schema())

    def sink_factory(k: Any, ctx: ConnectorContext) -> Sink:
        sinks[k.id] = MemorySink(k, ctx)
        return sinks[k.id]

    result = JobRunner(spec, RunOptions(ui=False), spark=spark,
                       source_factory=source_factory, sink_factory=sink_factory).run()
    committed = {k: s.committed for k, s in sinks.items()}
    committed.setdefault("late_out", [])
    # Per operator (EpochMetrics.operators): the join's rows out and late rows are what its
    # sinks received; the two filters split the source's records between them.
    ops = [m.operators for m in result.metrics]
    assert sum(o["j"]["out"] for o in ops) == len(committed["out"])
    assert sum(o["j"].get("late", 0) for o in ops) == len(committed["late_out"])
    assert sum(o[f]["out"] for o in ops for f in ("lefts", "rights") if f in o) == sum(
        map(len, epochs))
    return committed


def describe(epochs: Sequence[Sequence[Mapping]], **params: Any) -> str:
    lines = [f"params: {params}"]
    for i, epoch in enumerate(epochs, 1):
        lines.append(f"epoch {i}: " + ", ".join(
            f"{r['s']}:{r['k']}@{oracle.iso(r['ts'])[11:-1]}={r['v']}" for r in epoch))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- strategies
_JITTER_S = st.one_of(st.just(0), st.integers(-4, 2), st.integers(-40, 3))
_MILLIS = st.sampled_from([0, 0, 0, 1, 999])


@st.composite
def two_streams(draw: Any, max_records: int = 30, span_s: int = 120
                ) -> list[list[dict[str, Any]]]:
    """Random left and right records `{k, v, s, ts(ms)}` of 1-3 keys over two minutes, cut
    into 1..4 epochs, plus stragglers far behind in later epochs."""
    keys = ("a", "b", "c")[:draw(st.integers(1, 3))]
    n = draw(st.integers(4, max_records))
    rows = []
    for i in range(n):
        ts = BASE + max(0, i * span_s // n + draw(_JITTER_S)) * 1000 + draw(_MILLIS)
        rows.append({"k": draw(st.sampled_from(keys)), "v": i,
                     "s": draw(st.sampled_from("LR")), "ts": ts})
    epochs = cut(draw, rows, 4)
    for i in range(1, len(epochs)):
        for j in range(draw(st.integers(0, 2))):
            epochs[i].append({"k": draw(st.sampled_from(keys)), "v": 1000 * i + j,
                              "s": draw(st.sampled_from("LR")),
                              "ts": BASE + draw(st.integers(0, span_s // 2)) * 1000})
    return epochs


JOB = st.fixed_dictionaries({
    "backend": st.sampled_from(["memory", "rocksdb"]),
    "parallelism": st.integers(1, 4),
    "max_parallelism": st.sampled_from([4, 16, 128]),
    "ooo_ms": st.sampled_from([0, 3000, 10000]),
})
#: (lower, upper) in ms: after, around, before, exactly equal, wide.
BOUNDS = st.sampled_from([(0, 10_000), (-5_000, 5_000), (-20_000, -2_000), (0, 0),
                          (-1_000, 60_000)])
#: (size, slide) in ms: tumbling and sliding.
WINDOWS = st.sampled_from([(10_000, 10_000), (30_000, 30_000), (20_000, 10_000),
                           (15_000, 10_000)])


def check_interval(spark: Any, tmp_path: Path, epochs: list[list[dict]], job: dict, *,
                   bounds: tuple[int, int], type: str, in_property: bool = False) -> None:
    lower, upper = bounds
    text = join_pipeline(f"type: {type}, between: [{_d(lower)}, {_d(upper)}]",
                         root=fresh_root(tmp_path), **job)
    got = run_join(spark, text, epochs)
    want, want_late = join_oracle.interval_join(epochs, ooo=job["ooo_ms"], lower=lower,
                                                upper=upper, type=type)
    if in_property:
        note_coverage(epochs, job, want, want_late)
    ctx = describe(epochs, bounds=bounds, type=type, **job)
    assert_same("out", want, got["out"], ctx)
    assert_same("late_out", want_late, got["late_out"], ctx)


def check_window(spark: Any, tmp_path: Path, epochs: list[list[dict]], job: dict, *,
                 window: tuple[int, int], type: str, in_property: bool = False) -> None:
    size, slide = window
    shape = (f"{{tumbling: {size}ms}}" if size == slide
             else f"{{sliding: {{size: {size}ms, slide: {slide}ms}}}}")
    text = join_pipeline(f"type: {type}, window: {shape}", root=fresh_root(tmp_path), **job)
    got = run_join(spark, text, epochs)
    want, want_late = join_oracle.window_join(epochs, ooo=job["ooo_ms"], size=size,
                                              slide=slide, type=type)
    if in_property:
        note_coverage(epochs, job, want, want_late)
    ctx = describe(epochs, window=window, type=type, **job)
    assert_same("out", want, got["out"], ctx)
    assert_same("late_out", want_late, got["late_out"], ctx)


def check_table(spark: Any, tmp_path: Path, epochs: list[list[dict]], job: dict, *,
                temporal: bool, type: str, in_property: bool = False) -> None:
    table = "{as_of: event_time}" if temporal else "true"
    text = join_pipeline(f"type: {type}, table: {table}", root=fresh_root(tmp_path), **job)
    got = run_join(spark, text, epochs)
    want, want_late = join_oracle.table_join(epochs, ooo=job["ooo_ms"], temporal=temporal,
                                             type=type)
    if in_property:
        note_coverage(epochs, job, want, want_late)
    ctx = describe(epochs, temporal=temporal, type=type, **job)
    assert_same("out", want, got["out"], ctx)
    assert_same("late_out", want_late, got["late_out"], ctx)


def note_coverage(epochs: Sequence[Sequence[Mapping]], job: Mapping[str, Any],
                  want: list[dict], want_late: list[dict]) -> None:
    """Hypothesis events (--hypothesis-show-statistics): what the examples covered."""
    event(f"backend={job['backend']} parallelism={job['parallelism']}")
    event(f"epochs={len(epochs)}")
    event(f"late rows: {'yes' if want_late else 'no'}")
    outer = any(r["v"] is None or r["r_v"] is None for r in want)
    pairs = any(r["v"] is not None and r["r_v"] is not None for r in want)
    event(f"pairs: {'yes' if pairs else 'no'}, outer rows: {'yes' if outer else 'no'}")


def _d(ms: int) -> str:
    return f"{ms}ms" if ms >= 0 else f"-{-ms}ms"


# ----------------------------------------------------------------------------- properties
@pytest.mark.slow
@settings(max_examples=4, **PROPERTY)
@given(epochs=two_streams(), job=JOB, bounds=BOUNDS, type=st.sampled_from(TYPES))
@example(  # both sides of a pair in one epoch, at the same instant
    epochs=[[{"k": "a", "v": 1, "s": "L", "ts": BASE}, {"k": "a", "v": 2, "s": "R", "ts": BASE}],
            []],
    job={"backend": "memory", "parallelism": 1, "max_parallelism": 4, "ooo_ms": 0},
    bounds=(0, 0), type="full")
def test_interval_join_matches_oracle(spark, tmp_path, epochs, job, bounds, type) -> None:
    check_interval(spark, tmp_path, epochs, job, bounds=bounds, type=type, in_property=True)


@pytest.mark.slow
@settings(max_examples=3, **PROPERTY)
@given(epochs=two_streams(), job=JOB, window=WINDOWS, type=st.sampled_from(TYPES))
@example(  # rocksdb (the derandomized draws happen to be memory only), a sliding window
    epochs=[[{"k": "a", "v": 1, "s": "L", "ts": BASE}, {"k": "a", "v": 2, "s": "R",
                                                      "ts": BASE + 12_000}],
            [{"k": "a", "v": 3, "s": "R", "ts": BASE + 25_000},
             {"k": "b", "v": 4, "s": "L", "ts": BASE + 1_000}]],
    job={"backend": "rocksdb", "parallelism": 3, "max_parallelism": 16, "ooo_ms": 0},
    window=(20_000, 10_000), type="full")
def test_window_join_matches_oracle(spark, tmp_path, epochs, job, window, type) -> None:
    check_window(spark, tmp_path, epochs, job, window=window, type=type, in_property=True)


@pytest.mark.slow
@settings(max_examples=3, **PROPERTY)
@given(epochs=two_streams(), job=JOB, temporal=st.booleans(),
       type=st.sampled_from(("inner", "left")))
@example(  # a row and its update in one epoch, the update first; a left record at each
    epochs=[[{"k": "a", "v": 1, "s": "R", "ts": BASE + 5_000},
             {"k": "a", "v": 2, "s": "R", "ts": BASE},
             {"k": "a", "v": 3, "s": "L", "ts": BASE + 2_000},
             {"k": "b", "v": 4, "s": "L", "ts": BASE + 1_000}],
            [{"k": "a", "v": 5, "s": "L", "ts": BASE + 9_000},
             {"k": "a", "v": 6, "s": "R", "ts": BASE + 5_000}]],
    job={"backend": "rocksdb", "parallelism": 2, "max_parallelism": 16, "ooo_ms": 0},
    temporal=True, type="left")
def test_table_join_matches_oracle(spark, tmp_path, epochs, job, temporal, type) -> None:
    check_table(spark, tmp_path, epochs, job, temporal=temporal, type=type, in_property=True)


# ----------------------------------------------------------------------------- examples
def _rec(s: str, k: str, seconds: float, v: int) -> dict[str, Any]:
    return {"k": k, "v": v, "s": s, "ts": BASE + int(seconds * 1000)}


@pytest.mark.slow
@pytest.mark.parametrize("type", ["left", "full"])
def test_outer_joins_across_epochs_with_a_late_record(spark, tmp_path, type) -> None:
    """Pairs made across epochs and within one, outer rows once the watermark passes the
    bound, and a record at the watermark going to late_out."""
    epochs = [
        [_rec("L", "a", 0, 1), _rec("R", "a", 3, 2), _rec("L", "b", 1, 3)],
        [_rec("R", "a", 8, 4), _rec("R", "c", 9, 5), _rec("L", "a", 20, 6)],
        [_rec("L", "a", 9, 7), _rec("R", "b", 40, 8)],  # L a@9 is at the watermark: late
    ]
    job = {"backend": "rocksdb", "parallelism": 2, "max_parallelism": 16, "ooo_ms": 11_000}
    check_interval(spark, tmp_path, epochs, job, bounds=(0, 10_000), type=type)


def test_the_oracle_itself_on_a_small_case() -> None:
    epochs = [[_rec("L", "a", 0, 1), _rec("R", "a", 5, 2), _rec("R", "a", 15, 3)]]
    out, late = join_oracle.interval_join(epochs, ooo=0, lower=0, upper=10_000, type="full")
    assert sorted(json.dumps(r, sort_keys=True) for r in out) == sorted(json.dumps(
        r, sort_keys=True) for r in [
        {"k": "a", "v": 1, "s": "L", "ts": "2026-01-01T00:00:00Z", "r_v": 2, "r_s": "R",
         "r_ts": "2026-01-01T00:00:05Z"},
        {"k": "a", "v": None, "s": None, "ts": None, "r_v": 3, "r_s": "R",
         "r_ts": "2026-01-01T00:00:15Z"}])
    assert late == []
