"""The oracle properties of `test_window_properties.py`, `test_join_properties.py` and
`test_chained_properties.py` without Spark: the same pipelines, random streams and oracles
(`oracle.py`, `join_oracle.py`), run through `streamer.testing.harness` (the engine's
`run_task` per subtask, as a local epoch runs it, on real memory and RocksDB state), so each
property takes dozens of examples in seconds. The Spark properties stay (the window and
join ones with about half their examples): they check what the harness does not run
(Spark's `prepare` of the other aggregate functions, `late:` outputs, routing, epochs, sinks).

The harness computes count, sum, min, max and avg (`harness.refusal_of`), so these use those;
where the Spark property checks a `late:` output's rows, this checks that as many records
were dropped late as the oracle sends there.
"""

from __future__ import annotations

import datetime as dt
import tempfile
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import join_oracle
import oracle
import pytest
import test_chained_properties as chained
import test_join_properties as join_props
import test_window_properties as spark_props
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracle import Agg

from streamer.testing.harness import HarnessError, OperatorHarness

#: The aggregate functions the harness computes (`harness.refusal_of`), one of each.
AGGS = (Agg("n", "count"), Agg("total", "sum"), Agg("lo", "min"), Agg("hi", "max"),
        Agg("mean", "avg"))
EXAMPLES = 50
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow, HealthCheck.data_too_large])


def harness(tmp_path: Path, operator: str, job: Mapping[str, Any]) -> OperatorHarness:
    """Operator `op` (YAML body `operator`) of the Spark property's pipeline, its state in a
    directory of its own (hypothesis reuses `tmp_path`)."""
    root = Path(tempfile.mkdtemp(dir=tmp_path, prefix="state-"))
    text = spark_props.pipeline_yaml(operator, root=root, **job)
    return OperatorHarness.of(text, "op", root / "state")


def run(h: OperatorHarness, epochs: Sequence[Sequence[Mapping[str, Any]]], ooo: int
        ) -> list[dict[str, Any]]:
    """The epochs through the harness as the job runs them: epoch i with the watermark
    after epoch i - 1 (the newest event time so far less `ooo`), then the end of input.
    Returns the rows as a sink writes them (times as ISO-8601 text)."""
    newest: int | None = None
    for rows in epochs:
        h.process(rows)
        if rows:
            newest = max([*(r["ts"] for r in rows), *([newest] if newest is not None else [])])
            h.advance_watermark(newest - ooo, fire=False)  # (fires at the next epoch's start)
    h.finish()
    h.close()
    return as_written(h.rows)


def as_written(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` with their timestamps as the sinks write them (`oracle.iso`)."""
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return [{k: oracle.iso((v - epoch) // dt.timedelta(milliseconds=1))
             if isinstance(v, dt.datetime) else v for k, v in r.items()} for r in rows]


def window(text: str, lateness: int, emit: str) -> str:
    return (f"key_by: [k]\nwindow: {{{text}, allowed_lateness: {lateness}ms, emit: {emit}}}\n"
            + spark_props.aggregate_yaml(AGGS))


def check(name: str, want: list[dict[str, Any]], got: list[dict[str, Any]],
          epochs: Sequence[Sequence[Mapping[str, Any]]], **params: Any) -> None:
    spark_props.assert_same(name, want, got, spark_props.describe(epochs, **params))


# ----------------------------------------------------------------------------- properties
@PROPERTY
@given(epochs=spark_props.streams(), job=spark_props.JOB,
       shape=st.sampled_from([(10_000, 10_000), (30_000, 30_000), (60_000, 60_000),
                              (30_000, 10_000), (60_000, 20_000), (20_000, 5_000),
                              (25_000, 10_000)]),
       lateness=st.sampled_from([0, 3000, 15_000]), emit=st.sampled_from(["final", "updates"]))
def test_tumbling_and_sliding_windows_match_oracle(tmp_path, epochs, job, shape, lateness,
                                                   emit) -> None:
    size, slide = shape
    text = f"tumbling: {size}ms" if size == slide else \
        f"sliding: {{size: {size}ms, slide: {slide}ms}}"
    h = harness(tmp_path, window(text, lateness, emit), job)
    got = run(h, epochs, job["ooo_ms"])
    want, late = oracle.time_windows(oracle.records(epochs), size=size, slide=slide,
                                     ooo=job["ooo_ms"], lateness=lateness, aggs=AGGS, emit=emit)
    check("out", want, got, epochs, size=size, slide=slide, lateness=lateness, emit=emit, **job)
    assert h.late_dropped == len(late)


@PROPERTY
@given(epochs=spark_props.streams(max_records=30), job=spark_props.JOB,
       gap=spark_props.SESSION_GAPS, lateness=st.sampled_from([0, 3000, 15_000]),
       emit=spark_props.SESSION_EMITS)
def test_session_windows_match_oracle(tmp_path, epochs, job, gap, lateness, emit) -> None:
    h = harness(tmp_path, window(f"session: {{gap: {gap}ms}}", lateness, emit), job)
    got = run(h, epochs, job["ooo_ms"])
    want, late = oracle.sessions(oracle.records(epochs), gap=gap, ooo=job["ooo_ms"],
                                 lateness=lateness, aggs=AGGS, emit=emit)
    check("out", want, got, epochs, gap=gap, lateness=lateness, emit=emit, **job)
    assert h.late_dropped == len(late)


@PROPERTY
@given(case=spark_props.bridged_sessions(), job=spark_props.JOB,
       lateness=st.sampled_from([0, 3000, 15_000]), emit=spark_props.SESSION_EMITS,
       slack=st.sampled_from([0, 60_000]))
def test_sessions_bridged_in_a_later_epoch_match_oracle(tmp_path, case, job, lateness, emit,
                                                        slack) -> None:
    epochs, gap = case
    ooo = job["ooo_ms"] + slack
    h = harness(tmp_path, window(f"session: {{gap: {gap}ms}}", lateness, emit), job)
    got = run(h, epochs, ooo)
    want, late = oracle.sessions(oracle.records(epochs), gap=gap, ooo=ooo, lateness=lateness,
                                 aggs=AGGS, emit=emit)
    check("out", want, got, epochs, gap=gap, lateness=lateness, emit=emit, **job)
    assert h.late_dropped == len(late)


@PROPERTY
@given(epochs=spark_props.streams(max_records=30), job=spark_props.JOB)
def test_rolling_aggregate_matches_oracle(tmp_path, epochs, job) -> None:
    h = harness(tmp_path, "key_by: [k]\n" + spark_props.aggregate_yaml(AGGS), job)
    got = run(h, epochs, job["ooo_ms"])
    check("out", oracle.rolling(oracle.records(epochs), aggs=AGGS), got, epochs, **job)


@PROPERTY
@given(epochs=spark_props.streams(max_records=30), job=spark_props.JOB,
       within_s=st.sampled_from([5, 20, 60]))
def test_dedupe_matches_oracle(tmp_path, epochs, job, within_s) -> None:
    h = harness(tmp_path, f"key_by: [k]\ndedupe: {{within: {within_s}s}}", job)
    got = run(h, epochs, job["ooo_ms"])
    want = oracle.dedupe(oracle.records(epochs), within=within_s * 1000, ooo=job["ooo_ms"])
    check("out", want, got, epochs, within_s=within_s, **job)


OPERATORS = st.sampled_from([
    window("tumbling: 10s", 3000, "final"), window("sliding: {size: 30s, slide: 10s}", 0,
                                                   "updates"),
    window("session: {gap: 10s}", 0, "final"), "key_by: [k]\n" + spark_props.aggregate_yaml(AGGS),
    "key_by: [k]\ndedupe: {within: 20s}"])


@pytest.mark.slow  # 8-16 s
@PROPERTY
@given(epochs=spark_props.streams(max_epochs=4), job=spark_props.JOB, operator=OPERATORS,
       data=st.data())
def test_a_snapshot_restored_on_another_backend_and_parallelism_goes_on_alike(
        tmp_path, epochs, job, operator, data) -> None:
    """Snapshot after a random epoch, restored on the other backend at another parallelism
    (its key groups re-split): the rows before plus the restored harness's after are the
    rows of a run without a snapshot."""
    whole = harness(tmp_path, operator, job)
    want = run(whole, epochs, job["ooo_ms"])
    cut = data.draw(st.integers(0, len(epochs)), label="cut")
    other = "memory" if job["backend"] == "rocksdb" else "rocksdb"
    parallelism = data.draw(st.integers(1, 4), label="parallelism")
    first = harness(tmp_path, operator, job)
    run_part(first, epochs[:cut], job["ooo_ms"], None)
    saved = first.snapshot(Path(tempfile.mkdtemp(dir=tmp_path)) / "savepoint")
    first.close()
    resumed = first.restore(saved, Path(tempfile.mkdtemp(dir=tmp_path)) / "state",
                            backend=other, parallelism=parallelism)
    newest = max((r["ts"] for e in epochs[:cut] for r in e), default=None)
    run_part(resumed, epochs[cut:], job["ooo_ms"], newest)
    resumed.finish()
    resumed.close()
    check("out", want, as_written(first.rows) + as_written(resumed.rows), epochs, cut=cut,
          restored_on=other, restored_parallelism=parallelism, **job)


def run_part(h: OperatorHarness, epochs: Sequence[Sequence[Mapping[str, Any]]], ooo: int,
             newest: int | None) -> None:
    """`run` without the end of input, from `newest` (the newest event time before)."""
    for rows in epochs:
        h.process(rows)
        if rows:
            newest = max([*(r["ts"] for r in rows), *([newest] if newest is not None else [])])
            h.advance_watermark(newest - ooo, fire=False)


# ----------------------------------------------------------------------------- what it refuses
@pytest.mark.parametrize(("operator", "reason"), [
    ("key_by: [k]\nwindow: {count: 3}\naggregate: {n: count()}", "a count or until window"),
    ("key_by: [k]\naggregate: {f: first(v)}", "first(), whose partials are Spark SQL"),
    ("key_by: [k]\nwindow: {tumbling: 10s, late: late_out}\naggregate: {n: count()}",
     "a late: output"),
])
def test_what_needs_spark_is_refused_with_the_reason(tmp_path, operator, reason) -> None:
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    text = spark_props.pipeline_yaml(operator, root=root, parallelism=1, max_parallelism=4,
                                     backend="memory", ooo_ms=0, late_sink="late:" in operator)
    with pytest.raises(HarnessError, match="needs Spark") as caught:
        OperatorHarness.of(text, "op", root)
    assert reason in str(caught.value)


# ----------------------------------------------------------------------------- chained
#: The upstream kinds of `test_chained_properties.py` a harness drives (append-only output),
#: each with every downstream kind.
CHAINED = [(up, down) for up, down in chained.PAIRS if up in ("tumbling", "session", "dedupe")]
#: The pairs the fast tier runs (4-8 s each); the others run in the whole suite.
CHAINED_FAST = (("tumbling", "tumbling"), ("session", "rolling"))


@pytest.mark.parametrize("pair", [
    pytest.param(pair, id="-".join(pair), marks=() if pair in CHAINED_FAST else pytest.mark.slow)
    for pair in CHAINED])
@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), size_s=st.sampled_from([5, 10, 20]), rekey=st.booleans(),
       parallelism=st.integers(1, 4), backend=st.sampled_from(["memory", "rocksdb"]),
       epochs=st.integers(1, 4))
def test_a_keyed_operator_over_a_keyed_operator_equals_the_batch_oracle(
        tmp_path, pair, seed, size_s, rekey, parallelism, backend, epochs) -> None:
    """The chained property's pipelines (`test_chained_properties.py`), the two operators
    in two harnesses: the downstream takes the upstream's rows of each epoch (with `g`, the
    stateless `with_columns` between them, when re-keyed) and runs each epoch with the
    upstream's output watermark after the epoch before, as `runtime.watermarks` has it."""
    up_kind, down_kind = pair
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    text = textwrap.dedent(chained.pipeline(root / "data", root / "out", up_kind, down_kind,
                                            size_s, rekey, parallelism, backend))
    up = OperatorHarness.of(text, "up", root / "up", schema={
        "k": "bigint", "v": "bigint", "__ts": "timestamp"})
    fields = {**up.output_schema, **({"g": "bigint"} if rekey else {})}
    down = OperatorHarness.of(text, "down", root / "down", schema=fields)
    records = chained.make_records(seed, 400, 6)
    per = -(-len(records) // epochs)
    cuts = [records[i * per:(i + 1) * per] for i in range(epochs)]
    newest: int | None = None
    for i, part in enumerate(cuts):
        down.advance_watermark(up.output_watermark, fire=False)
        rows = [{"k": r["k"], "v": r["v"], "__ts": r["ts"]} for r in part]
        out = after(up, lambda rows=rows: up.process(rows))
        if i == len(cuts) - 1:  # the end of input: the upstream's last rows, this epoch
            out += after(up, up.finish)
        down.process([{**r, "g": r["k"] % 2} for r in out])
        newest = max([*(r["ts"] for r in part), *([newest] if newest is not None else [])])
        up.advance_watermark(newest - chained.DISORDER_MS, fire=False)
    down.finish()
    up.close()
    down.close()
    assert up.late_dropped == 0 and down.late_dropped == 0
    expected = chained.downstream_rows(down_kind, 2 * size_s * 1000, rekey,
                                       chained.upstream_rows(up_kind, size_s * 1000, records))
    got: dict[tuple[Any, ...], tuple[int, int]] = {}
    key = "g" if rekey else "k"
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    for row in down.rows:  # a rolling aggregate's last update wins
        start = (row["window_start"] - epoch) // dt.timedelta(milliseconds=1) \
            if down_kind == "tumbling" else None
        got[(row[key], start)] = (row["c"], row["t"])
    assert got == expected, (up_kind, down_kind, size_s, rekey, parallelism, backend, epochs)


def after(h: OperatorHarness, step: Any) -> list[dict[str, Any]]:
    """The rows (hidden columns too) that `step` of `h` emits."""
    before = len(h.emitted)
    step()
    return h.emitted[before:]


# ----------------------------------------------------------------------------- the docs
DOCS_PIPELINE = textwrap.dedent("""\
    name: demo
    job: {parallelism: 1, max_parallelism: 16, state: {backend: memory}}
    sources:
      - {id: events, type: files, path: /x/*.jsonl, format: jsonl,
         schema: {k: string, v: bigint, ts: timestamp}, event_time: ts}
    operators:
      - {id: counts, input: events, key_by: [k], window: {tumbling: 10s},
         aggregate: {n: count(), total: sum(v)}}
    sinks:
      - {id: out, type: files, input: counts, path: /x/out, format: jsonl}
    """)


def test_the_use_docs_architecture_shows_runs(tmp_path) -> None:
    """The harness's example in docs/architecture.md, run as it is written."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    section = text.split("### Testing an operator without Spark", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/architecture.md", "exec"),
         {"PIPELINE": DOCS_PIPELINE, "tmp_path": tmp_path})


# ----------------------------------------------------------------------------- joins
def join_harness(tmp_path: Path, join: str, job: Mapping[str, Any]) -> OperatorHarness:
    """Join `j` of the join property's pipeline, without its `late:` output (a local epoch
    drops and counts the late records instead)."""
    root = Path(tempfile.mkdtemp(dir=tmp_path, prefix="state-"))
    text = join_props.join_pipeline(join, root=root, **job)
    text = text.replace("    late: late_out\n", "").split("  - id: late_out")[0]
    return OperatorHarness.of(text, "j", root / "state")


def run_join(h: OperatorHarness, epochs: Sequence[Sequence[Mapping[str, Any]]], ooo: int
             ) -> list[dict[str, Any]]:
    """`run` for a join: each epoch's records go to the side their `s` names (the two
    filters of the pipeline)."""
    newest: int | None = None
    for rows in epochs:
        h.process([r for r in rows if r["s"] == "L"], right=[r for r in rows if r["s"] == "R"])
        if rows:
            newest = max([*(r["ts"] for r in rows), *([newest] if newest is not None else [])])
            h.advance_watermark(newest - ooo, fire=False)
    h.finish()
    h.close()
    return as_written(h.rows)


@PROPERTY
@given(epochs=join_props.two_streams(), job=join_props.JOB, bounds=join_props.BOUNDS,
       type=st.sampled_from(join_props.TYPES))
def test_interval_join_matches_oracle(tmp_path, epochs, job, bounds, type) -> None:
    lower, upper = bounds
    h = join_harness(tmp_path, f"type: {type}, between: [{join_props._d(lower)}, "
                               f"{join_props._d(upper)}]", job)
    got = run_join(h, epochs, job["ooo_ms"])
    want, late = join_oracle.interval_join(epochs, ooo=job["ooo_ms"], lower=lower,
                                           upper=upper, type=type)
    spark_props.assert_same("out", want, got, join_props.describe(
        epochs, bounds=bounds, type=type, **job))
    assert h.late_dropped == len(late)


@PROPERTY
@given(epochs=join_props.two_streams(), job=join_props.JOB, window=join_props.WINDOWS,
       type=st.sampled_from(join_props.TYPES))
def test_window_join_matches_oracle(tmp_path, epochs, job, window, type) -> None:
    size, slide = window
    shape = (f"{{tumbling: {size}ms}}" if size == slide
             else f"{{sliding: {{size: {size}ms, slide: {slide}ms}}}}")
    h = join_harness(tmp_path, f"type: {type}, window: {shape}", job)
    got = run_join(h, epochs, job["ooo_ms"])
    want, late = join_oracle.window_join(epochs, ooo=job["ooo_ms"], size=size, slide=slide,
                                         type=type)
    spark_props.assert_same("out", want, got, join_props.describe(
        epochs, window=window, type=type, **job))
    assert h.late_dropped == len(late)


@PROPERTY
@given(epochs=join_props.two_streams(), job=join_props.JOB, temporal=st.booleans(),
       type=st.sampled_from(("inner", "left")))
def test_table_join_matches_oracle(tmp_path, epochs, job, temporal, type) -> None:
    table = "{as_of: event_time}" if temporal else "true"
    h = join_harness(tmp_path, f"type: {type}, table: {table}", job)
    got = run_join(h, epochs, job["ooo_ms"])
    want, late = join_oracle.table_join(epochs, ooo=job["ooo_ms"], temporal=temporal,
                                        type=type)
    spark_props.assert_same("out", want, got, join_props.describe(
        epochs, temporal=temporal, type=type, **job))
    assert h.late_dropped == len(late)


def test_mistakes_get_a_clear_error(tmp_path) -> None:
    """An operator that is not there or not keyed, input columns it cannot find, and a
    restore into a directory that holds something: a `HarnessError` saying what to do."""
    with pytest.raises(HarnessError, match="no keyed operator 'nope'"):
        OperatorHarness.of(DOCS_PIPELINE, "nope", tmp_path / "a")
    chained_text = textwrap.dedent(chained.pipeline(tmp_path, tmp_path, "dedupe", "rolling",
                                                    5, True, 1, "memory"))
    with pytest.raises(HarnessError, match=r"give the harness its input columns \(schema=\)"):
        OperatorHarness.of(chained_text, "down", tmp_path / "b")
    with pytest.raises(HarnessError, match="needs Spark: its input is an update stream"):
        OperatorHarness.of(chained_text, "down", tmp_path / "b", schema={
            "k": "bigint", "g": "bigint", "x": "bigint", "__ts": "timestamp",
            "__op": "string"})
    with OperatorHarness.of(DOCS_PIPELINE, "counts", tmp_path / "c") as h:
        saved = h.snapshot(tmp_path / "savepoint")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep.txt").write_text("mine")
    with pytest.raises(HarnessError, match="is not empty"):
        h.restore(saved, tmp_path / "d")
    assert (tmp_path / "d" / "keep.txt").read_text() == "mine"
