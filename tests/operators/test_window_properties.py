"""Keyed windows, rolling aggregates and dedupe on real Spark, checked against the brute-force
reference in `oracle.py` over random keyed event streams cut into random epochs.

Each job reads an `EpochSource` (one slice per epoch, decoded through JSON like the inline
source of `streamer test`) and writes every sink to a `MemorySink`; outputs are compared as
multisets with numbers normalized (`runtime.job.testing.compare_rows`).
"""

from __future__ import annotations

import json
import tempfile
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import oracle
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from oracle import Agg

from streamer.connectors.base import ConnectorContext, Sink, Source, SourceRead, SourceSlice
from streamer.connectors.builtin.memory_sink import MemorySink
from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.coordinator import JobRunner, RunOptions
from streamer.runtime.job.testing import compare_rows

pytestmark = pytest.mark.spark

#: 2026-01-01T00:00:00Z in epoch ms; every generated event time is at or after it.
BASE = 1_767_225_600_000
KEYS = ("a", "b", "c", "d", "e")

#: Every aggregate function, in the order written in the pipeline.
ALL_AGGS = (Agg("n", "count"), Agg("total", "sum"), Agg("lo", "min"), Agg("hi", "max"),
            Agg("mean", "avg"), Agg("fst", "first"), Agg("lst", "last"),
            Agg("vals", "collect_list"), Agg("nd", "count_distinct"))
_AGG_SQL = {"count": "count()", "sum": "sum(v)", "min": "min(v)", "max": "max(v)",
            "avg": "avg(v)", "first": "first(v)", "last": "last(v)",
            "collect_list": "collect_list(v)", "count_distinct": "count_distinct(v)"}

#: Known disagreements with streamer, each pinned by a strict-xfail example test below. While
#: an entry is True the properties skip (hypothesis `assume`) the inputs that trigger it, so
#: that they keep checking everything else; set it to False once settled (the xfail test then
#: XPASSes and fails, as a reminder).
KNOWN_BUGS = {
    # Settled: sessions that touch ([0s, 10s) and [10s, 20s)) merge, in the oracle and in
    # streamer, as in Flink and Spark's session_window; properties draw such inputs again.
    "touching_sessions_merge": False,
}

#: The properties whose kernels `test_harness_properties.py` checks without Spark (200
#: examples each, count, sum, min, max and avg, late records counted) run half the examples
#: here: they check what the harness does not run (Spark's `prepare`, the other aggregate
#: functions, `late:` outputs, routing, epochs and sinks). Count windows have no twin.
PROPERTY = {
    "deadline": None,
    "derandomize": True,
    "database": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                              HealthCheck.data_too_large],
}


# ----------------------------------------------------------------------------- the source
class EpochSource(Source):
    """A bounded source that delivers one given list of rows per epoch (single split
    `inline`; offsets count the epochs read). Rows are decoded through JSON like
    `runtime.job.testing.InlineSource`."""

    def __init__(self, spec: Any, ctx: ConnectorContext, epochs: Sequence[Sequence[Mapping]],
                 schema: Any) -> None:
        super().__init__(spec, ctx)
        self.epochs = [[json.dumps(dict(r)) for r in rows] for rows in epochs]
        self._schema = schema

    @property
    def bounded(self) -> bool:
        return True

    def schema(self) -> Any:
        return self._schema

    def initial_offsets(self) -> dict[str, Any]:
        return {"inline": 0}

    def plan(self, offsets: Mapping[str, Any], now_ms: int) -> SourceSlice | None:
        index = offsets["inline"]
        if index >= len(self.epochs):
            return None
        return SourceSlice(self.spec.id, {"inline": index}, {"inline": index + 1},
                           expected_records=len(self.epochs[index]))

    def read(self, piece: SourceSlice) -> SourceRead:
        from streamer.connectors.formats import decode_json_lines

        index = piece.start["inline"]
        data = [(line, "inline", f"{index}:{i}") for i, line in enumerate(self.epochs[index])]
        df = self.ctx.spark.createDataFrame(data, "value string, split string, offset string")
        return decode_json_lines(self.ctx.spark, df, self._schema, self.spec)

    def exhausted(self, offsets: Mapping[str, Any]) -> bool:
        return bool(offsets["inline"] >= len(self.epochs))


# ----------------------------------------------------------------------------- running jobs
def _schema() -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    return StructType([StructField("k", StringType()), StructField("v", LongType()),
                       StructField("ts", TimestampType())])


def pipeline_yaml(operator: str, *, root: Path, parallelism: int, max_parallelism: int,
                  backend: str, ooo_ms: int, late_sink: bool = False,
                  pre_filter: str | None = None) -> str:
    """A pipeline: source `events` (k, v, ts) -> [filter `pre` when given] -> the keyed
    operator `op` (YAML body given, indented by 4) -> sink `out` (and sink `late_out` when
    asked)."""
    late = ("\n  - id: late_out\n    type: files\n    path: /nonexistent/late\n"
            "    format: jsonl") if late_sink else ""
    head = textwrap.dedent(f"""\
        name: props
        job:
          parallelism: {parallelism}
          max_parallelism: {max_parallelism}
          state: {{backend: {backend}, local_dir: "{root}"}}
        sources:
          - id: events
            type: files
            path: /nonexistent/events/*.jsonl
            format: jsonl
            schema: {{k: string, v: bigint, ts: timestamp}}
            event_time: ts
            watermark: {{max_out_of_orderness: {ooo_ms}ms}}
        operators:
        """)
    if pre_filter:
        head += f"  - id: pre\n    input: events\n    filter: \"{pre_filter}\"\n"
    head += f"  - id: op\n    input: {'pre' if pre_filter else 'events'}\n"
    tail = textwrap.dedent("""\
        sinks:
          - id: out
            type: files
            input: op
            path: /nonexistent/out
            format: jsonl""")
    return head + textwrap.indent(textwrap.dedent(operator).strip("\n"), "    ") + "\n" + tail \
        + late + "\n"


def aggregate_yaml(aggs: Sequence[Agg]) -> str:
    return "aggregate:\n" + "".join(f"  {a.name}: {_AGG_SQL[a.fn]}\n" for a in aggs)


def run_job(spark: Any, text: str, epochs: Sequence[Sequence[Mapping]]
            ) -> dict[str, list[dict[str, Any]]]:
    """Run the pipeline over the epochs (rows with `ts` in ms); every sink's committed rows."""
    spec = load_pipeline_text(text)
    rows = [[{**r, "ts": oracle.iso(r["ts"])} for r in epoch] for epoch in epochs]
    sinks: dict[str, MemorySink] = {}
    schema = _schema()

    def source_factory(s: Any, ctx: ConnectorContext) -> Source:
        return EpochSource(s, ctx, rows, schema)

    def sink_factory(k: Any, ctx: ConnectorContext) -> Sink:
        sinks[k.id] = MemorySink(k, ctx)
        return sinks[k.id]

    JobRunner(spec, RunOptions(ui=False), spark=spark, source_factory=source_factory,
              sink_factory=sink_factory).run()
    return {k: s.committed for k, s in sinks.items()}


def note_coverage(epochs: Sequence[Sequence[Mapping]], job: Mapping[str, Any],
                  **extra: Any) -> None:
    """Hypothesis events (see --hypothesis-show-statistics): what the examples covered."""
    event(f"backend={job['backend']}")
    event(f"parallelism={job['parallelism']}/{job['max_parallelism']}")
    event(f"epochs={len(epochs)}")
    for name, value in extra.items():
        event(f"{name}={value}")


def assert_same(name: str, expected: list[dict], actual: list[dict], context: str) -> None:
    missing, unexpected = compare_rows(expected, actual)
    if missing or unexpected:
        pytest.fail(f"{name}: rows differ from the oracle\n{context}\n"
                    f"missing (oracle has, streamer lacks): {json.dumps(missing)}\n"
                    f"unexpected (streamer has, oracle lacks): {json.dumps(unexpected)}",
                    pytrace=False)


def describe(epochs: Sequence[Sequence[Mapping]], **params: Any) -> str:
    lines = [f"params: {params}"]
    for i, epoch in enumerate(epochs, 1):
        lines.append(f"epoch {i}: " + ", ".join(
            f"{r['k']}@{oracle.iso(r['ts'])[11:-1]}={r['v']}" for r in epoch))
    return "\n".join(lines)


def fresh_root(tmp_path: Path) -> Path:
    """A state directory of its own for one job (hypothesis reuses `tmp_path`)."""
    return Path(tempfile.mkdtemp(dir=tmp_path, prefix="state-"))


# ----------------------------------------------------------------------------- strategies
#: Jitter of an event time around the stream's clock, in seconds: mostly in order, some
#: slightly out of order (within a few seconds of the bound), some far behind.
_JITTER_S = st.one_of(st.just(0), st.integers(-4, 2), st.integers(-40, 3),
                      st.integers(-60, -15))
#: Sub-second part: whole seconds mostly, and ms next to boundaries.
_MILLIS = st.sampled_from([0, 0, 0, 0, 1, 500, 999])


@st.composite
def streams(draw: Any, min_records: int = 5, max_records: int = 40, span_s: int = 180,
            max_epochs: int = 4) -> list[list[dict[str, Any]]]:
    """Random keyed records `{k, v, ts(ms)}` over a few minutes, cut into 1..4 epochs, plus
    a few stragglers (event times anywhere in the past) in later epochs."""
    keys = KEYS[:draw(st.integers(2, 5))]
    n = draw(st.integers(min_records, max_records))
    rows = []
    for i in range(n):
        clock_s = i * span_s // n
        ts = BASE + max(0, clock_s + draw(_JITTER_S)) * 1000 + draw(_MILLIS)
        rows.append({"k": draw(st.sampled_from(keys)), "v": draw(st.integers(-5, 20)),
                     "ts": ts})
    epochs = cut(draw, rows, max_epochs)
    for i in range(1, len(epochs)):
        before = [r["ts"] for epoch in epochs[:i] for r in epoch]
        if not before:
            continue
        for _ in range(draw(st.integers(0, 2))):
            epochs[i].insert(draw(st.integers(0, len(epochs[i]))), {
                "k": draw(st.sampled_from(keys)), "v": draw(st.integers(-5, 20)),
                "ts": BASE + draw(st.integers(0, (max(before) - BASE) // 1000)) * 1000
                + draw(_MILLIS)})
    return epochs


def cut(draw: Any, rows: list[dict[str, Any]], max_epochs: int) -> list[list[dict[str, Any]]]:
    """`rows` cut into 1..max_epochs epochs (some may be empty)."""
    count = draw(st.sampled_from([2, 3, 4, 1][:max_epochs]))
    cuts = sorted(draw(st.lists(st.integers(0, len(rows)), min_size=count - 1,
                                max_size=count - 1)))
    bounds = [0, *cuts, len(rows)]
    return [rows[bounds[i]:bounds[i + 1]] for i in range(count)]


JOB = st.fixed_dictionaries({
    "backend": st.sampled_from(["memory", "rocksdb"]),
    "parallelism": st.integers(1, 4),
    "max_parallelism": st.sampled_from([4, 16, 128]),  # always >= parallelism
    "ooo_ms": st.sampled_from([0, 2000, 5000]),
})

# ----------------------------------------------------------------------------- known bugs
def records_exactly_gap_apart(epochs: list[list[dict]], gap: int) -> bool:
    """Whether two records of one key are exactly `gap` apart (so that their sessions could
    touch: session bounds are always a record's ts or ts + gap)."""
    seen = {(r["k"], r["ts"]) for epoch in epochs for r in epoch}
    return any((k, ts + gap) in seen for k, ts in seen)


#: Session gaps in ms: whole seconds (records at whole seconds are then often exactly a gap
#: apart, so sessions touch) and not (they seldom do).
SESSION_GAPS = st.sampled_from([3_000, 10_000, 10_250, 30_000])
SESSION_EMITS = st.sampled_from(["final", "updates"])


# ----------------------------------------------------------------------------- helpers
def window_yaml(window: str, *, lateness_ms: int, emit: str, aggs: Sequence[Agg] = ALL_AGGS,
                late: bool = True) -> str:
    extra = f", allowed_lateness: {lateness_ms}ms, emit: {emit}"
    if late:
        extra += ", late: late_out"
    return f"key_by: [k]\nwindow: {{{window}{extra}}}\n" + aggregate_yaml(aggs)


def check_time_windows(spark: Any, tmp_path: Path, epochs: list[list[dict]], job: dict, *,
                       size: int, slide: int, lateness: int, emit: str,
                       in_property: bool = False) -> None:
    window = (f"tumbling: {size}ms" if size == slide
              else f"sliding: {{size: {size}ms, slide: {slide}ms}}")
    text = pipeline_yaml(window_yaml(window, lateness_ms=lateness, emit=emit),
                         root=fresh_root(tmp_path), late_sink=True, **job)
    got = run_job(spark, text, epochs)
    if in_property:
        note_coverage(epochs, job, emit=emit, lateness=lateness,
                      late_rows=bool(got["late_out"]))
    want, want_late = oracle.time_windows(oracle.records(epochs), size=size, slide=slide,
                                          ooo=job["ooo_ms"], lateness=lateness, aggs=ALL_AGGS,
                                          emit=emit)
    ctx = describe(epochs, size=size, slide=slide, lateness=lateness, emit=emit, **job)
    assert_same("out", want, got["out"], ctx)
    assert_same("late_out", want_late, got["late_out"], ctx)


def check_sessions(spark: Any, tmp_path: Path, epochs: list[list[dict]], job: dict, *,
                   gap: int, lateness: int, emit: str, in_property: bool = False) -> None:
    if in_property and KNOWN_BUGS["touching_sessions_merge"]:
        assume(not records_exactly_gap_apart(epochs, gap))
    text = pipeline_yaml(window_yaml(f"session: {{gap: {gap}ms}}", lateness_ms=lateness,
                                     emit=emit),
                         root=fresh_root(tmp_path), late_sink=True, **job)
    got = run_job(spark, text, epochs)
    if in_property:
        note_coverage(epochs, job, emit=emit, lateness=lateness,
                      late_rows=bool(got["late_out"]),
                      touching=records_exactly_gap_apart(epochs, gap))
    want, want_late = oracle.sessions(oracle.records(epochs), gap=gap, ooo=job["ooo_ms"],
                                      lateness=lateness, aggs=ALL_AGGS, emit=emit)
    ctx = describe(epochs, gap=gap, lateness=lateness, emit=emit, **job)
    assert_same("out", want, got["out"], ctx)
    assert_same("late_out", want_late, got["late_out"], ctx)


def job_of(backend: str = "memory", parallelism: int = 2, max_parallelism: int = 16,
           ooo_ms: int = 0) -> dict[str, Any]:
    return {"backend": backend, "parallelism": parallelism,
            "max_parallelism": max(max_parallelism, parallelism), "ooo_ms": ooo_ms}


def ms(seconds: float) -> int:
    return BASE + round(seconds * 1000)


def rec(k: str, seconds: float, v: int = 1) -> dict[str, Any]:
    return {"k": k, "v": v, "ts": ms(seconds)}


# ----------------------------------------------------------------------------- properties
@pytest.mark.slow
@settings(max_examples=6, **PROPERTY)
@given(epochs=streams(), job=JOB, size_s=st.sampled_from([10, 30, 60]),
       lateness=st.sampled_from([0, 3000, 15_000]), emit=st.sampled_from(["final", "updates"]))
def test_tumbling_windows_match_oracle(spark, tmp_path, epochs, job, size_s, lateness,
                                       emit) -> None:
    check_time_windows(spark, tmp_path, epochs, job, size=size_s * 1000,
                       slide=size_s * 1000, lateness=lateness, emit=emit, in_property=True)


@pytest.mark.slow
@settings(max_examples=6, **PROPERTY)
@given(epochs=streams(), job=JOB,
       shape=st.sampled_from([(30_000, 10_000), (60_000, 20_000), (20_000, 5_000),
                              (10_000, 10_000)]),
       lateness=st.sampled_from([0, 3000, 15_000]), emit=st.sampled_from(["final", "updates"]))
def test_sliding_windows_match_oracle(spark, tmp_path, epochs, job, shape, lateness,
                                      emit) -> None:
    size, slide = shape
    check_time_windows(spark, tmp_path, epochs, job, size=size,
                       slide=slide, lateness=lateness, emit=emit, in_property=True)


@pytest.mark.slow
@settings(max_examples=6, **PROPERTY)
@given(epochs=streams(max_records=30), job=JOB, gap=SESSION_GAPS,
       lateness=st.sampled_from([0, 3000, 15_000]), emit=SESSION_EMITS)
def test_session_windows_match_oracle(spark, tmp_path, epochs, job, gap, lateness,
                                      emit) -> None:
    check_sessions(spark, tmp_path, epochs, job, gap=gap,
                   lateness=lateness, emit=emit, in_property=True)


@st.composite
def bridged_sessions(draw: Any) -> tuple[list[list[dict[str, Any]]], int]:
    """Per key, clusters of records (each a session) separated by more than the gap, and
    records falling between two clusters (bridging them) delivered in a later epoch."""
    gap = draw(st.sampled_from([5_000, 10_000, 20_250]))
    keys = KEYS[:draw(st.integers(2, 4))]
    early: list[dict[str, Any]] = []
    bridges: list[dict[str, Any]] = []
    for key in keys:
        start = draw(st.integers(0, 30)) * 1000
        for _ in range(draw(st.integers(1, 3))):
            at = start
            for _ in range(draw(st.integers(1, 3))):  # steps shorter than the gap: one session
                early.append({"k": key, "v": draw(st.integers(-5, 20)), "ts": BASE + at})
                at += draw(st.integers(0, gap // 1000 - 1)) * 1000
            end = max(r["ts"] for r in early if r["k"] == key) - BASE + gap
            space = draw(st.integers(1, 3 * gap // 1000)) * 1000
            if draw(st.booleans()):  # a bridge somewhere in the space between the clusters
                at = end - gap + draw(st.integers(1, (gap + space) // 1000)) * 1000
                bridges.append({"k": key, "v": draw(st.integers(-5, 20)), "ts": BASE + at})
            start = end + space
    if not bridges:
        bridges.append({"k": keys[0], "v": 0, "ts": BASE + draw(st.integers(0, 60)) * 1000})
    order = draw(st.permutations(early))
    epochs = cut(draw, list(order), 2)
    epochs.append(list(draw(st.permutations(bridges))))
    return epochs, gap


@pytest.mark.slow
@settings(max_examples=5, **PROPERTY)
@given(case=bridged_sessions(), job=JOB, lateness=st.sampled_from([0, 3000, 15_000]),
       emit=SESSION_EMITS, slack=st.sampled_from([0, 60_000]))
def test_sessions_bridged_in_a_later_epoch_match_oracle(spark, tmp_path, case, job, lateness,
                                                        emit, slack) -> None:
    epochs, gap = case
    # ooo: sometimes large enough that every bridge is on time, else as drawn
    job = {**job, "ooo_ms": job["ooo_ms"] + slack}
    check_sessions(spark, tmp_path, epochs, job, gap=gap, lateness=lateness, emit=emit,
                   in_property=True)


@st.composite
def distinct_ts_streams(draw: Any) -> list[list[dict[str, Any]]]:
    """Like `streams`, with no two records of one key at the same event time."""
    epochs = draw(streams(max_records=30))
    seen: set[tuple[str, int]] = set()
    for epoch in epochs:
        for r in epoch:
            while (r["k"], r["ts"]) in seen:
                r["ts"] += 1
            seen.add((r["k"], r["ts"]))
    return epochs


@pytest.mark.slow
@settings(max_examples=10, **PROPERTY)
@given(epochs=distinct_ts_streams(), job=JOB, count=st.integers(1, 4))
def test_count_windows_match_oracle(spark, tmp_path, epochs, job, count) -> None:
    text = pipeline_yaml(f"key_by: [k]\nwindow: {{count: {count}}}\n" + aggregate_yaml(ALL_AGGS),
                         root=fresh_root(tmp_path), **job)
    got = run_job(spark, text, epochs)
    note_coverage(epochs, job)
    want = oracle.count_windows(oracle.records(epochs), count=count, aggs=ALL_AGGS)
    assert_same("out", want, got["out"], describe(epochs, count=count, **job))


@pytest.mark.slow
@settings(max_examples=5, **PROPERTY)
@given(epochs=streams(max_records=30), job=JOB)
def test_rolling_aggregate_matches_oracle(spark, tmp_path, epochs, job) -> None:
    text = pipeline_yaml("key_by: [k]\n" + aggregate_yaml(ALL_AGGS), root=fresh_root(tmp_path),
                         **job)
    got = run_job(spark, text, epochs)
    note_coverage(epochs, job)
    want = oracle.rolling(oracle.records(epochs), aggs=ALL_AGGS)
    assert_same("out", want, got["out"], describe(epochs, **job))


@pytest.mark.slow
@settings(max_examples=5, **PROPERTY)
@given(epochs=streams(max_records=30), job=JOB, within_s=st.sampled_from([5, 20, 60]))
def test_dedupe_matches_oracle(spark, tmp_path, epochs, job, within_s) -> None:
    text = pipeline_yaml(f"key_by: [k]\ndedupe: {{within: {within_s}s}}",
                         root=fresh_root(tmp_path), **job)
    got = run_job(spark, text, epochs)
    note_coverage(epochs, job)
    want = oracle.dedupe(oracle.records(epochs), within=within_s * 1000, ooo=job["ooo_ms"])
    assert_same("out", want, got["out"], describe(epochs, within_s=within_s, **job))


# ----------------------------------------------------------------------------- examples
def test_a_record_bridging_two_sessions_merges_them(spark, tmp_path) -> None:
    epochs = [[rec("a", 0, 1), rec("a", 15, 2), rec("b", 1, 5)],
              [rec("a", 8, 3)]]
    check_sessions(spark, tmp_path, epochs, job_of(ooo_ms=30_000), gap=10_000, lateness=0,
                   emit="final")
    want, _ = oracle.sessions(oracle.records(epochs), gap=10_000, ooo=30_000, lateness=0,
                              aggs=ALL_AGGS)
    assert {(r["k"], r["window_start"], r["window_end"], r["n"]) for r in want} == {
        ("a", "2026-01-01T00:00:00Z", "2026-01-01T00:00:25Z", 3),
        ("b", "2026-01-01T00:00:01Z", "2026-01-01T00:00:11Z", 1)}


@pytest.mark.parametrize("same_epoch", [True, False])
def test_sessions_that_touch_merge(spark, tmp_path, same_epoch) -> None:
    """[0s, 10s) and [10s, 20s) touch: one session, as in Flink and Spark's session_window,
    whether the two records arrive in one epoch or in two."""
    rows = [rec("a", 0, 1), rec("a", 10, 2)]
    epochs = [rows] if same_epoch else [rows[:1], rows[1:]]
    check_sessions(spark, tmp_path, epochs, job_of(ooo_ms=30_000), gap=10_000, lateness=0,
                   emit="final")


def test_session_updates_emit_only_the_sessions_that_changed(spark, tmp_path) -> None:
    """emit: updates re-emits a session only in epochs in which it received a record."""
    epochs = [[rec("a", 0, 1)], [rec("a", 100, 2)]]
    check_sessions(spark, tmp_path, epochs, job_of(ooo_ms=300_000), gap=10_000, lateness=0,
                   emit="updates")


@pytest.mark.parametrize(("kind", "size", "slide"), [
    ("tumbling", 10_000, 10_000), ("sliding", 20_000, 10_000)])
def test_a_record_exactly_at_a_window_boundary(spark, tmp_path, kind, size, slide) -> None:
    """A record at t belongs to [s, s + size) with s <= t < s + size: the window ending at t
    does not get it."""
    epochs = [[rec("a", 0, 1), rec("a", 9.999, 2), rec("a", 10, 4), rec("a", 20, 8),
               rec("b", 19.999, 16)]]
    check_time_windows(spark, tmp_path, epochs, job_of(), size=size, slide=slide, lateness=0,
                       emit="final")


@pytest.mark.slow
@pytest.mark.parametrize("behind_ms", [0, 1])
@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_lateness_boundary(spark, tmp_path, behind_ms, backend) -> None:
    """Window [0s, 10s) with allowed lateness 2s is due when W == 10s - 1ms + 2s = 11.999s:
    then a record for it is late; with W one ms earlier it is still counted."""
    ooo = 1000
    w1 = ms(11.999) - behind_ms  # W_1 = max ts of epoch 1 - ooo
    epochs = [[rec("a", 1, 1), {"k": "b", "v": 2, "ts": w1 + ooo}],
              [rec("a", 5, 4), rec("b", 9.999, 8), rec("c", 30, 16)]]
    check_time_windows(spark, tmp_path, epochs, job_of(backend=backend, ooo_ms=ooo),
                       size=10_000, slide=10_000, lateness=2000, emit="final")
    _, late = oracle.time_windows(oracle.records(epochs), size=10_000, slide=10_000, ooo=ooo,
                                  lateness=2000, aggs=ALL_AGGS)
    assert len(late) == (2 if behind_ms == 0 else 0)


def test_session_lateness_boundary(spark, tmp_path) -> None:
    """A session record at ts is late iff ts + gap - 1 + L <= W."""
    ooo, gap, lateness = 1000, 10_000, 2000
    epochs = [[rec("z", 30, 0)],  # W_1 = 29s
              [rec("a", 17.001, 1),  # 17.001 + 10 - 0.001 + 2 = 29.000: late
               rec("b", 17.002, 2)]]  # 29.001 > 29: on time
    check_sessions(spark, tmp_path, epochs, job_of(ooo_ms=ooo), gap=gap, lateness=lateness,
                   emit="final")
    _, late = oracle.sessions(oracle.records(epochs), gap=gap, ooo=ooo, lateness=lateness,
                              aggs=ALL_AGGS)
    assert [r["k"] for r in late] == ["a"]


def test_sliding_windows_whose_size_is_not_a_multiple_of_the_slide(spark, tmp_path) -> None:
    """Window starts are multiples of the slide, whatever the size: with size 25s and slide
    10s a record at 27s is in [10s, 35s) and [20s, 45s)."""
    epochs = [[rec("a", 27, 1), rec("a", 3, 2)]]
    check_time_windows(spark, tmp_path, epochs, job_of(), size=25_000, slide=10_000,
                       lateness=0, emit="final")


def test_dedupe_forgets_a_key_when_the_watermark_reaches_first_ts_plus_within(
        spark, tmp_path) -> None:
    """within 10s, first a at 0s: W == 10s forgets it (a is forwarded again), W == 9.999s
    does not."""
    job = job_of(ooo_ms=0)
    epochs = [[rec("a", 0, 1), rec("b", 9.999, 2)],  # W_1 = 9.999s
              [rec("a", 1, 3), rec("c", 10, 4)],  # a remembered: dropped; W_2 = 10s
              [rec("a", 2, 5)]]  # a forgotten at the start of epoch 3: forwarded
    text = pipeline_yaml("key_by: [k]\ndedupe: {within: 10s}", root=fresh_root(tmp_path), **job)
    got = run_job(spark, text, epochs)
    want = oracle.dedupe(oracle.records(epochs), within=10_000, ooo=0)
    assert sorted((r["k"], r["v"]) for r in want) == [("a", 1), ("a", 5), ("b", 2), ("c", 4)]
    assert_same("out", want, got["out"], describe(epochs, **job))


def test_emit_updates_of_tumbling_windows(spark, tmp_path) -> None:
    epochs = [[rec("a", 1, 1), rec("a", 2, 2), rec("b", 3, 3)],
              [rec("a", 4, 4), rec("a", 12, 5)],
              [rec("b", 25, 6)]]
    check_time_windows(spark, tmp_path, epochs, job_of(ooo_ms=5000), size=10_000,
                       slide=10_000, lateness=0, emit="updates")


def test_an_epoch_whose_records_are_all_late(spark, tmp_path) -> None:
    """The keyed stage gets no record in epoch 2 (Spark may then drop the source's observed
    metrics): the job goes on, the record goes to the late output."""
    epochs = [[rec("a", 13, 1)], [rec("a", 5, 2)]]  # W_1 = 13s: [0s, 10s) is due
    check_time_windows(spark, tmp_path, epochs, job_of(), size=10_000, slide=10_000,
                       lateness=0, emit="final")


def test_an_epoch_without_records(spark, tmp_path) -> None:
    """An epoch that reads nothing changes nothing."""
    epochs = [[rec("a", 1, 1)], [], [rec("a", 2, 2)]]
    job = job_of()
    text = pipeline_yaml("key_by: [k]\n" + aggregate_yaml(ALL_AGGS), root=fresh_root(tmp_path),
                         **job)
    got = run_job(spark, text, epochs)
    want = oracle.rolling(oracle.records(epochs), aggs=ALL_AGGS)
    assert_same("out", want, got["out"], describe(epochs, **job))


@pytest.mark.slow
def test_records_filtered_out_before_a_window_still_move_the_watermark(spark, tmp_path) -> None:
    """The watermark is the source's: an epoch whose records a filter drops before the window
    still advances it, so a later record for a passed window is late."""
    job = job_of()
    epochs = [[rec("a", 1, 1)],
              [rec("b", 30, -1)],  # dropped by the filter; W_2 = 30s
              [rec("a", 2, 1), rec("a", 40, 1)]]  # a@2s: [0s, 10s) is due, late
    text = pipeline_yaml(window_yaml("tumbling: 10s", lateness_ms=0, emit="final"),
                         root=fresh_root(tmp_path), late_sink=True, pre_filter="v >= 0", **job)
    got = run_job(spark, text, epochs)
    want, want_late = oracle.time_windows(oracle.records(epochs), size=10_000, slide=10_000,
                                          ooo=0, lateness=0, aggs=ALL_AGGS,
                                          keep=lambda r: r.v >= 0)
    assert [r["ts"] for r in want_late] == ["2026-01-01T00:00:02Z"]
    ctx = describe(epochs, filter="v >= 0", **job)
    assert_same("out", want, got["out"], ctx)
    assert_same("late_out", want_late, got["late_out"], ctx)
