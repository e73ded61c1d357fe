"""Keyed stages that read their parquet input themselves (operators/direct.py) compute
exactly what the Spark plan computes, share its state layout, and fall back to it per epoch."""

from __future__ import annotations

import datetime
import json
import random
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fragments import files_sink, files_source, job, section

from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.exceptions import JobFailedError
from streamer.runtime.job.coordinator import JobRunner, RunOptions
from streamer.state.keygroups import key_group_of, key_groups_of_columns

pytestmark = pytest.mark.spark

BASE_MS = 1767225600000


def committed_rows(directory: Path) -> list[str]:
    rows = []
    for part in sorted(directory.glob("part-*.jsonl")):
        rows += [line for line in part.read_text().splitlines() if line.strip()]
    return sorted(json.dumps(json.loads(r), sort_keys=True) for r in rows)


def run(spark, text: str, **options):
    spec = load_pipeline_text(textwrap.dedent(text))
    runner = JobRunner(spec, RunOptions(ui=False, **options), spark=spark)
    return runner, runner.run()


def stop_with_savepoint(spark, text: str, storage: Path, job: str, after_epoch: int = 2):
    """Run the pipeline `text` (job name `job`, `storage:` at `storage`) with checkpoints and
    ask for a stop with a savepoint (no drain) once epoch `after_epoch` has been reported;
    the run's result."""
    from streamer.runtime.job.control import ControlChannel
    from streamer.runtime.observe.metrics import JsonReporter

    filed: list[str] = []

    class StopAfterEpoch:
        def write(self, s: str) -> None:
            for line in s.splitlines():
                event = json.loads(line) if line else {}
                if not filed and event.get("event") == "epoch" \
                        and event["epoch"] >= after_epoch:
                    filed.append(ControlChannel(str(storage), job).request(
                        kind="stop", savepoint=True, drain=False))

        def flush(self) -> None:
            pass

    return JobRunner(load_pipeline_text(text), RunOptions(ui=False, checkpoints=True),
                     spark=spark, reporter=JsonReporter(StopAfterEpoch())).run()  # type: ignore[arg-type]


def write_events(directory: Path, files: int, rows: int, seed: int, *,
                 zoned: bool = True) -> None:
    """Events with string and int keys (some null), out-of-order timestamps (some beyond the
    5 s bound, so late; never null: a record without event time is a bad record, see
    test_bad_records.py), and int and double values (some null)."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        users, groups, ts, amount, qty = [], [], [], [], []
        for i in range(rows):
            users.append(None if rng.random() < 0.02 else f"u{rng.randrange(40)}é")
            groups.append(None if rng.random() < 0.02 else rng.randrange(-3, 3))
            base = BASE_MS + (f * rows + i) * 700
            # Mostly within the 5 s bound; a quarter anywhere up to 2 minutes back (late).
            back = rng.randrange(5_000) if rng.random() < 0.75 else rng.randrange(120_000)
            rng.random()  # (drew a null event time once; kept so the rest stays the same)
            ts.append((base - back) * 1000)
            amount.append(None if rng.random() < 0.05 else rng.randrange(-500, 500) / 4)
            qty.append(rng.randrange(-5, 50))
        table = pa.table({
            "user": pa.array(users, pa.string()),
            "grp": pa.array(groups, pa.int32()),
            "ts": pa.array(ts, pa.timestamp("us", tz="UTC" if zoned else None)),
            "amount": pa.array(amount, pa.float64()),
            "qty": pa.array(qty, pa.int64()),
        })
        pq.write_table(table, directory / f"part-{f:03d}.parquet")


def source(data: Path | str, fmt: str = "parquet") -> str:
    """The events of `write_events` as a files source, 2 files per epoch."""
    return section("sources", files_source(data, fmt, files_per_epoch=2))


#: The keyed operator's keys, window and aggregates (format fields: keys, window), also the
#: operator of tests/runtime/test_staged.py.
AGGREGATE = """\
    key_by: {keys}
    {window}
    aggregate:
      n: count()
      total: sum(amount)
      units: sum(qty)
      low: min(qty)
      high: max(amount)
      mean: avg(qty)
"""



def keyed_head(name: str, parallelism: int, backend: str, state: Path | str,
               execution: str | None = None, checkpoint: str | None = None) -> str:
    """The job head of this module's pipelines and test_staged.py's and test_arrow_input.py's:
    `max_parallelism: 16`, the state in `state`."""
    return job(name, parallelism=parallelism, max_parallelism=16, checkpoint=checkpoint,
               backend=backend, local_dir=state, execution=execution)


def agg(input: str, keys: str, window: str) -> str:
    """The keyed operator `agg` of `AGGREGATE` reading `input`."""
    return f"  - id: agg\n    input: {input}\n" + AGGREGATE.format(keys=keys, window=window)


def pipeline(name: str, data: Path, out: Path, state: Path, parallelism: int, backend: str,
             keys: str, window: str) -> str:
    """The parquet events through `agg` (its `keys` and `window`) into jsonl files."""
    return (keyed_head(name, parallelism, backend, state) + source(data)
            + section("operators", agg("events", keys, window))
            + section("sinks", files_sink("agg", out)))


CASES = {  # name: (parallelism, backend, keys, window)
    "tumbling-rocksdb-p3": (3, "rocksdb", "[user]", "window: {tumbling: 1m}"),
    "sliding-lateness-memory-p2": (
        2, "memory", "[user, grp]",
        "window: {sliding: {size: 1m, slide: 20s}, allowed_lateness: 30s}"),
    "tumbling-updates-rocksdb-p1": (1, "rocksdb", "[grp]",
                                    "window: {tumbling: 30s, emit: updates}"),
    "rolling-memory-p4": (4, "memory", "[grp, user]", ""),
    "session-rocksdb-p2": (2, "rocksdb", "[user]", "window: {session: {gap: 20s}}"),
    "session-lateness-updates-memory-p3": (
        3, "memory", "[user, grp]",
        "window: {session: {gap: 30s}, allowed_lateness: 20s, emit: updates}"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_direct_read_gives_the_spark_plans_output(spark, tmp_path: Path, monkeypatch,
                                                  case: str) -> None:
    data = tmp_path / "data"
    write_events(data, files=5, rows=400, seed=len(case))
    outputs, metrics = {}, {}
    for mode in ("0", "1"):
        monkeypatch.setenv("STREAMER_DIRECT_READ", mode)
        out = tmp_path / f"out-{mode}"
        runner, result = run(spark, pipeline(
            name=f"direct-{mode}", data=data, out=out, state=tmp_path / f"state-{mode}",
            **dict(zip(("parallelism", "backend", "keys", "window"), CASES[case],
                       strict=True))))
        assert result.status == "finished"
        assert (runner.keyed["agg"].direct is not None) == (mode == "1")
        reading = [m for m in result.metrics if m.records_in]
        assert [m.direct for m in reading] == [["agg"] if mode == "1" else []] * 3
        # The end-of-input epoch (no files, only timers) runs without a Spark plan as well.
        assert result.metrics[-1].direct == (["agg"] if mode == "1" else [])
        outputs[mode] = committed_rows(out)
        metrics[mode] = [(m.records_in, m.records_out, m.watermark) for m in result.metrics]
    assert outputs["0"], "the pipeline produced nothing to compare"
    assert outputs["1"] == outputs["0"]
    # Record counts and watermarks come from the tasks' metadata in the direct read.
    assert metrics["1"] == metrics["0"]


@pytest.mark.slow
def test_epochs_whose_files_have_no_time_zone_are_read_by_spark(spark, tmp_path: Path,
                                                                monkeypatch) -> None:
    """A file whose timestamps carry no zone is read by Spark (which gives them its session
    zone); the other epochs read directly; state passes between the two kinds of epoch."""
    data = tmp_path / "data"
    write_events(data, files=4, rows=300, seed=3)
    (data / "part-001.parquet").unlink()
    write_events(tmp_path / "naive", files=2, rows=300, seed=4, zoned=False)
    (tmp_path / "naive" / "part-001.parquet").rename(data / "part-001.parquet")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    outputs = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("STREAMER_DIRECT_READ", mode)
        out = tmp_path / f"out-{mode}"
        _, result = run(spark, pipeline(
            name=f"mixed-{mode}", data=data, out=out, state=tmp_path / f"state-{mode}",
            parallelism=2, backend="rocksdb", keys="[user]", window="window: {tumbling: 1m}"))
        assert result.status == "finished"
        reading = [m for m in result.metrics if m.records_in]
        assert [bool(m.direct) for m in reading] == [False, mode == "1"]
        outputs[mode] = committed_rows(out)
    assert outputs["0"] and outputs["1"] == outputs["0"]


@pytest.mark.slow
def test_a_checkpointed_job_can_switch_between_direct_and_spark_reads(
        spark, tmp_path: Path, monkeypatch) -> None:
    """Resume a job stopped after direct epochs with direct reads off: same output as one
    uninterrupted run (both paths share key groups and state layout)."""
    data = tmp_path / "data"
    write_events(data, files=6, rows=300, seed=9)
    text = pipeline(name="switch", data=data, out=tmp_path / "out",
                           state=tmp_path / "state", parallelism=2, backend="rocksdb",
                           keys="[user]", window="window: {tumbling: 1m}")
    text = text.replace("job:\n", "job:\n  checkpoint: {interval: 1ms}\n")
    options = {"checkpoints": True, "storage": str(tmp_path / "chk")}
    monkeypatch.setenv("STREAMER_DIRECT_READ", "1")
    _, first = run(spark, text, max_epochs=2, **options)
    assert first.status == "stopped"
    monkeypatch.setenv("STREAMER_DIRECT_READ", "0")
    _, second = run(spark, text, **options)
    assert second.status == "finished"
    reference = pipeline(name="reference", data=data, out=tmp_path / "ref",
                                state=tmp_path / "ref-state", parallelism=2, backend="rocksdb",
                                keys="[user]", window="window: {tumbling: 1m}")
    _, ref = run(spark, reference)
    assert ref.status == "finished"
    assert committed_rows(tmp_path / "ref")
    assert committed_rows(tmp_path / "out") == committed_rows(tmp_path / "ref")


def test_python_key_groups_agree_with_spark(spark) -> None:
    """`key_group_of` (and `key_groups_of_columns` for integer-like keys) is Spark's
    pmod(xxhash64(...)) for every type it accepts: strings of
    every length class of XXH64 (0-3, 4-7, 8-31, 32+ bytes, multi-byte UTF-8), ints of every
    width, bigints, booleans, dates, nulls, and several columns."""
    rng = random.Random(5)
    alphabet = "abcXYZ019é中😀-_ "
    rows = []
    for i in range(400):
        length = rng.choice([0, 1, 3, 4, 7, 8, 15, 31, 32, 33, 64, 100])
        text = "".join(rng.choice(alphabet) for _ in range(length))
        rows.append((
            None if i % 37 == 0 else text,
            None if i % 41 == 0 else rng.randrange(-2**31, 2**31),
            rng.randrange(-2**63, 2**63),
            rng.randrange(-128, 128), rng.randrange(-2**15, 2**15), i % 3 == 0,
            datetime.date(1960, 1, 1) + datetime.timedelta(days=rng.randrange(40000)),
        ))
    df = spark.createDataFrame(rows, "s string, i int, l bigint, b tinyint, h smallint, "
                                     "f boolean, d date")
    types = {"s": "string", "i": "int", "l": "bigint", "b": "tinyint", "h": "smallint",
             "f": "boolean", "d": "date"}
    combos = [["s"], ["i"], ["l"], ["b"], ["h"], ["f"], ["d"], ["s", "i"], ["i", "s", "l", "d"]]
    for mp in (128, 32768, 7):
        exprs = [f"pmod(xxhash64({', '.join(c)}), {mp}) AS k{n}" for n, c in enumerate(combos)]
        got = df.selectExpr("*", *exprs).collect()
        for row in got:
            for n, cols in enumerate(combos):
                mine = key_group_of([row[c] for c in cols], [types[c] for c in cols], mp)
                assert mine == row[f"k{n}"], (cols, [row[c] for c in cols], mp)
        # Integer-like keys, a whole column at a time (what direct reads use for them).
        table = df.selectExpr("*", *exprs).toArrow()
        for n, cols in enumerate(combos):
            if "s" not in cols:
                columnar = key_groups_of_columns([table.column(c) for c in cols],
                                                 [types[c] for c in cols], mp)
                assert columnar.tolist() == table.column(f"k{n}").to_pylist(), (cols, mp)


@pytest.mark.slow  # 4-8 s each
@pytest.mark.parametrize("window", ["window: {tumbling: 1m}", "window: {session: {gap: 20s}}",
                                    ""])
def test_a_bigint_sum_past_64_bits_fails_as_sparks_does(spark, tmp_path: Path, monkeypatch,
                                                        window: str) -> None:
    """Arrow's grouped sum would wrap around; the direct read fails the epoch as the Spark
    plan's ANSI sum does (ARITHMETIC_OVERFLOW), and a sum of exactly -2**63 still fits."""
    data = tmp_path / "data"
    data.mkdir()
    ts = pa.array([(BASE_MS + s * 1000) * 1000 for s in (1, 2, 3, 4)],
                  pa.timestamp("us", tz="UTC"))
    pq.write_table(pa.table({
        "user": ["a", "a", "b", "b"], "grp": pa.array([1, 1, 2, 2], pa.int32()), "ts": ts,
        "amount": [1.0, 2.0, 3.0, 4.0],
        "qty": pa.array([2**62, 2**62, -(2**62), -(2**62)], pa.int64())}),
        data / "part-000.parquet")
    for mode in ("0", "1"):
        monkeypatch.setenv("STREAMER_DIRECT_READ", mode)
        text = pipeline(name=f"ovf-{mode}", data=data, out=tmp_path / f"out-{mode}",
                               state=tmp_path / f"state-{mode}", parallelism=1,
                               backend="memory", keys="[user]", window=window)
        with pytest.raises(JobFailedError, match="ARITHMETIC_OVERFLOW"):
            run(spark, text)
    # Without user "a": b's sum is exactly -2**63, which fits.
    pq.write_table(pq.read_table(data / "part-000.parquet").slice(2), data / "part-000.parquet")
    monkeypatch.setenv("STREAMER_DIRECT_READ", "1")
    _, result = run(spark, pipeline(
        name="ovf-fits", data=data, out=tmp_path / "out-fits", state=tmp_path / "state-fits",
        parallelism=1, backend="memory", keys="[user]", window=window))
    assert result.status == "finished"
    assert [json.loads(r)["units"] for r in committed_rows(tmp_path / "out-fits")] == [-(2**63)]


@pytest.mark.slow
@pytest.mark.parametrize("window", ["window: {tumbling: 1m}", "window: {session: {gap: 20s}}",
                                    ""])
def test_a_bigint_sum_past_64_bits_across_epochs_fails_as_sparks_does(
        spark, tmp_path: Path, monkeypatch, window: str) -> None:
    """Each epoch's sum fits, the sum kept in state does not: merged across epochs as Python
    integers, it fails with ARITHMETIC_OVERFLOW (Spark's state would hold a bigint), not with
    a bare OverflowError from Arrow."""
    data = tmp_path / "data"
    data.mkdir()
    for i, (user, qty) in enumerate([("a", 2**62), ("b", 1), ("a", 2**62)]):  # 2 files/epoch
        pq.write_table(pa.table({
            "user": [user], "grp": pa.array([1], pa.int32()), "amount": [1.0],
            "ts": pa.array([(BASE_MS + (i + 1) * 1000) * 1000], pa.timestamp("us", tz="UTC")),
            "qty": pa.array([qty], pa.int64())}), data / f"part-{i:03d}.parquet")
    for mode in ("0", "1"):
        monkeypatch.setenv("STREAMER_DIRECT_READ", mode)
        text = pipeline(name=f"ovf-{mode}", data=data, out=tmp_path / f"out-{mode}",
                               state=tmp_path / f"state-{mode}", parallelism=1,
                               backend="memory", keys="[user]", window=window)
        with pytest.raises(JobFailedError, match=r"epoch 2 .*\[ARITHMETIC_OVERFLOW\]"):
            run(spark, text)
