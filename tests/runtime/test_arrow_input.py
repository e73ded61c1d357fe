"""A keyed stage's JSON-lines input computed by Arrow tasks (`runtime.arrow.arrow_input`,
`job.execution.arrow_input`) gives exactly what Spark's staging gives: the same output,
records, filter counts, late records and watermarks; a file Arrow cannot certainly decode
as Spark does is read by Spark in the same epoch, its bad records dead letters as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fragments import KEEP, derive, files_sink, files_source, kafka_source, section, window
from test_direct import committed_rows, keyed_head, run
from test_staged import json_events

pytestmark = pytest.mark.spark



def pipeline(name: str, data: Path, out: Path, dead: Path, state: Path, arrow: str,
             parallelism: int, backend: str, keys: str, body: str, prefix: str, last: str,
             fmt: str = "jsonl") -> str:
    """The events (`fmt` files, bad records to `dead`) through the stateless `prefix` and
    the keyed operator `keyed` (`keys`, `body`) reading `last`, with arrow_input on or off
    (`arrow`) and never a local epoch."""
    return (keyed_head(name, parallelism, backend, state, execution=(
                f"{{small_epoch_rows: 0, local_rows: 0, arrow_input: {arrow}}}"))
            + section("sources", files_source(data, fmt, files_per_epoch=2, on_error="dead"))
            + section("operators", prefix, f"  - id: keyed\n    input: {last}\n"
                                           f"    key_by: {keys}\n    {body}\n")
            + section("sinks", files_sink("keyed", out), files_sink(None, dead, id="dead")))


#: The filter and the derived columns before the keyed operator (test_arrow_sink_crash.py's).
PREFIX = KEEP + derive('{qty: "qty * 2 + 1", half: "amount / 2"}')
WINDOW = "aggregate: {n: count(), total: sum(qty), high: max(amount), mean: avg(half)}"
CASES = {  # name: (parallelism, backend, prefix, keys, body)
    "tumbling-rocksdb-p3": (3, "rocksdb", True, "[user]",
                            "window: {tumbling: 1m}\n    " + WINDOW),
    "session-memory-p2": (2, "memory", True, "[user, grp]",
                          "window: {session: {gap: 20s}}\n    " + WINDOW),
    "rolling-rocksdb-p2": (2, "rocksdb", False, "[grp]",
                           "aggregate: {n: count(), total: sum(qty)}"),
    "dedupe-rocksdb-p2": (2, "rocksdb", True, "[user, grp]", "dedupe: {within: 30s}"),
}


def epoch_metrics(result) -> list[tuple]:
    """Per epoch what both paths must agree on: records in and out, watermark, late,
    filtered and dead-letter counts, per-operator counts. (A dead-letter sink that got no
    frame at all is not in records_out: 0 either way.)"""
    return [(m.records_in, {k: v for k, v in m.records_out.items() if v}, m.watermark,
             m.late, m.filtered, m.dead_letters, m.operators) for m in result.metrics]


def run_both(spark, tmp_path: Path, data: Path, case: str, *, extra: str = ""):
    """The pipeline of `case` with arrow_input off and on: per mode (its committed output,
    its dead letters, per-epoch metrics, the run's result)."""
    parallelism, backend, prefix, keys, body = CASES[case]
    found = {}
    for arrow in ("false", "true"):
        out, dead = tmp_path / f"out-{arrow}", tmp_path / f"dead-{arrow}"
        _, result = run(spark, pipeline(
            name=f"arrow-{arrow}", data=data, out=out, dead=dead, state=tmp_path / f"st-{arrow}",
            arrow=arrow, parallelism=parallelism, backend=backend, keys=keys, body=body,
            prefix=(PREFIX if prefix else "") + extra,
            last="derive" if prefix else "events"))
        assert result.status == "finished", result
        found[arrow] = (committed_rows(out), committed_rows(dead) if dead.exists() else [],
                        epoch_metrics(result), result)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_arrow_tasks_give_the_staged_output(spark, tmp_path: Path, monkeypatch,
                                            case: str) -> None:
    monkeypatch.delenv("STREAMER_ARROW_INPUT", raising=False)
    json_events(tmp_path / "data", files=5, rows=400, seed=len(case) + 7)
    found = run_both(spark, tmp_path, tmp_path / "data" / "jsonl", case)
    off, on = found["false"], found["true"]
    assert off[0], "the pipeline produced nothing to compare"
    assert on[0] == off[0]
    assert on[2] == off[2]  # records, filter counts, late records, watermarks
    reading = [m for m in on[3].metrics if m.records_in]
    assert [m.arrow_decoded for m in reading] == [{"events": 2}, {"events": 2}, {"events": 1}]
    assert all(m.staged == ["keyed"] and not m.arrow_refused for m in reading)
    assert all(not m.arrow_decoded for m in off[3].metrics)


@pytest.mark.slow
def test_files_arrow_refuses_are_read_by_spark_in_the_same_epoch(spark, tmp_path: Path,
                                                                 monkeypatch) -> None:
    """One file with undecodable lines and one with a record without event time: both go
    to Spark (dead letters as before); the others are decoded by Arrow; same output."""
    monkeypatch.delenv("STREAMER_ARROW_INPUT", raising=False)
    json_events(tmp_path / "data", files=5, rows=300, seed=5)
    data = tmp_path / "data" / "jsonl"
    bad = data / "part-001.jsonl"
    lines = bad.read_text().splitlines()
    lines[10] = lines[10][:20]  # cut short
    lines[20] = '{"user": "x", "grp": 1.5, "ts": "2026-01-01T00:00:01Z"}'  # not an int
    bad.write_text("\n".join(lines) + "\n")
    untimed = data / "part-003.jsonl"
    lines = untimed.read_text().splitlines()
    row = json.loads(lines[5])
    row["ts"] = None
    lines[5] = json.dumps(row)
    untimed.write_text("\n".join(lines) + "\n")

    found = run_both(spark, tmp_path, data, "tumbling-rocksdb-p3")
    off, on = found["false"], found["true"]
    assert on[0] == off[0] and on[0]
    assert on[1] == off[1] and len(on[1]) == 3  # the three bad records, as dead letters
    assert on[2] == off[2]
    refused = {}
    for m in on[3].metrics:
        refused.update(m.arrow_refused)
    assert sorted(refused) == [str(bad), str(untimed)], refused
    assert "without event time" in refused[str(untimed)]
    reading = [m for m in on[3].metrics if m.records_in]
    assert [m.arrow_decoded for m in reading] == [{"events": 1}, {"events": 1}, {"events": 1}]


@pytest.mark.slow
def test_an_expression_arrow_does_not_take_keeps_sparks_staging(spark, tmp_path: Path,
                                                                monkeypatch) -> None:
    """`upper()` is not translated: the plan says so and Spark stages every epoch."""
    from streamer.pipeline.validate import load_pipeline_text
    from streamer.runtime.job.checks import physical_plan

    monkeypatch.delenv("STREAMER_ARROW_INPUT", raising=False)
    json_events(tmp_path / "data", files=3, rows=100, seed=2)
    extra = '  - {id: loud, input: derive, with_columns: {user: "upper(user)"}}\n'
    parallelism, backend, _, keys, body = CASES["tumbling-rocksdb-p3"]
    text = pipeline(
        name="upper", data=tmp_path / "data" / "jsonl", out=tmp_path / "out",
        dead=tmp_path / "dead", state=tmp_path / "st", arrow="true", parallelism=parallelism,
        backend=backend, keys=keys, body=body, prefix=PREFIX + extra, last="loud")
    described = [s.describe() for s in physical_plan(load_pipeline_text(text), spark).stages]
    keyed = next(s for s in described if s["stage"] == "keyed")
    why = {n["name"]: n["why"] for n in keyed.get("not_used", [])}
    assert "upper" in why["arrow-tasks"], why
    assert next(s for s in described if s["stage"] == "events")["strategy"] == "spark-scan"
    _, result = run(spark, text)
    assert result.status == "finished"
    reading = [m for m in result.metrics if m.records_in]
    assert reading and all(m.staged == ["keyed"] and not m.arrow_decoded for m in reading)


def test_staged_directories_of_ended_epochs_go(tmp_path: Path) -> None:
    from streamer.runtime.arrow.arrow_input import clear_other_epochs

    for name in ("epoch-1", "epoch-1-arrow", "epoch-2", "epoch-12-arrow"):
        (tmp_path / name).mkdir()
    clear_other_epochs(str(tmp_path), "epoch-2-arrow")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-2"]


def kafka_events(bootstrap: str, topic: str, per_epoch: int, time_column: str) -> str:
    """The Kafka events (id, user, amount, ts in ms; bad values to `dead`) and the stateless
    `keep` and `derive` after them (`time_column` the event time as a timestamp), up to the
    operators that follow (also test_arrow_sink.py's)."""
    return (section("sources", kafka_source(
                bootstrap, topic, per_epoch=per_epoch, id="events", out_of_orderness="5s",
                schema="{id: bigint, user: string, amount: double, ts: bigint}", on_error="dead"))
            + section("operators", '  - {id: keep, input: events, filter: "amount >= 10"}\n',
                      "  - id: derive\n    input: keep\n    with_columns: {amount: "
                      f'"amount * 2 + 1", {time_column}: "timestamp_millis(ts)"}}\n'))


def kafka_pipeline(name: str, state: Path, arrow: str, bootstrap: str, topic: str, out: Path,
                   dead: Path) -> str:
    """The Kafka events through 1-minute windows into jsonl files, arrow_input on or off."""
    return (keyed_head(name, 2, "rocksdb", state, execution=(
                f"{{small_epoch_rows: 0, local_rows: 0, arrow_input: {arrow}}}"))
            + kafka_events(bootstrap, topic, 600, "ts")
            + window("keyed", "derive", "1m", "{n: count(), total: sum(amount), last: max(ts)}")
            + section("sinks", files_sink("keyed", out), files_sink(None, dead, id="dead")))


@pytest.mark.kafka
def test_kafka_ranges_decoded_by_arrow_tasks(spark, kafka, tmp_path: Path,
                                             monkeypatch) -> None:
    """JSON values from a 2-partition topic: partition 0's ranges all go to the Arrow tasks;
    partition 1 holds a bad value, a tombstone and a value without event time in its first
    range, which Spark reads (dead letters as before). Same output as Spark's staging."""
    import random
    import uuid

    monkeypatch.delenv("STREAMER_ARROW_INPUT", raising=False)
    topic = kafka.create_topic(f"arrow-{uuid.uuid4().hex[:8]}", 2)
    rng = random.Random(4)
    records = []
    for i in range(3000):
        value = {"id": i, "user": f"u{rng.randrange(30)}", "amount": float(rng.randrange(40)),
                 "ts": 1767225600000 + i * 150 - rng.randrange(4000)}
        records.append((None, value, i % 2))
    records[701] = (None, "{not json", 1)
    records[703] = (None, None, 1)
    records[705] = (None, {"id": 705, "user": "u1", "amount": 12.0, "ts": None}, 1)
    kafka.produce(topic, records)
    found = {}
    for arrow in ("false", "true"):
        out, dead = tmp_path / f"out-{arrow}", tmp_path / f"dead-{arrow}"
        _, result = run(spark, kafka_pipeline(
            name=f"kafka-arrow-{arrow}", state=tmp_path / f"st-{arrow}", arrow=arrow,
            bootstrap=kafka.bootstrap, topic=topic, out=out, dead=dead))
        assert result.status == "finished", result
        found[arrow] = (committed_rows(out), committed_rows(dead), epoch_metrics(result),
                        result)
    off, on = found["false"], found["true"]
    assert off[0] and on[0] == off[0]
    assert len(on[1]) == 3 and on[1] == off[1]
    assert on[2] == off[2]
    refused = {}
    for m in on[3].metrics:
        refused.update(m.arrow_refused)
    assert list(refused) == [f"{topic}:1[0, 600)"], refused  # (600 per partition and epoch)
    reading = [m for m in on[3].metrics if m.records_in]
    assert [m.arrow_decoded for m in reading] == [{"events": 1}, {"events": 2},
                                                  {"events": 2}]


@pytest.mark.slow
def test_parquet_with_operators_goes_through_arrow_tasks(spark, tmp_path: Path,
                                                         monkeypatch) -> None:
    """A parquet source with a filter and derived columns: Arrow tasks read each file whose
    column types are Spark's; a file with zone-less timestamps is read by Spark."""
    from test_direct import write_events

    monkeypatch.delenv("STREAMER_ARROW_INPUT", raising=False)
    data = tmp_path / "data"
    write_events(data, files=4, rows=300, seed=8)
    write_events(tmp_path / "naive", files=2, rows=300, seed=9, zoned=False)
    (data / "part-002.parquet").unlink()
    (tmp_path / "naive" / "part-001.parquet").rename(data / "part-002.parquet")
    found = {}
    for arrow in ("false", "true"):
        out = tmp_path / f"out-{arrow}"
        _, result = run(spark, pipeline(
            fmt="parquet", name=f"pq-{arrow}", data=data, out=out, dead=tmp_path / f"dead-{arrow}",
            state=tmp_path / f"st-{arrow}", arrow=arrow, parallelism=2, backend="rocksdb",
            keys="[user]", body="window: {tumbling: 1m}\n    " + WINDOW, prefix=PREFIX,
            last="derive"))
        assert result.status == "finished", result
        found[arrow] = (committed_rows(out), epoch_metrics(result), result)
    assert found["false"][0] and found["true"][0] == found["false"][0]
    assert found["true"][1] == found["false"][1]
    metrics = found["true"][2].metrics
    refused = {k: v for m in metrics for k, v in m.arrow_refused.items()}
    assert list(refused) == [str(data / "part-002.parquet")], refused
    assert [m.arrow_decoded for m in metrics if m.records_in] == [{"events": 2},
                                                                  {"events": 1}]


def csv_events(directory: Path, files: int, rows: int, seed: int) -> Path:
    """`write_events`' events as CSV files with a header (a null as an empty field); their
    directory."""
    import pyarrow.parquet as pq
    from test_direct import write_events

    write_events(directory / "parquet", files=files, rows=rows, seed=seed)
    names = ("user", "grp", "ts", "amount", "qty")
    (directory / "csv").mkdir()
    for part in sorted((directory / "parquet").glob("*.parquet")):
        lines = [",".join(names)]
        for row in pq.read_table(part).to_pylist():
            row["ts"] = row["ts"].isoformat() if row["ts"] is not None else None
            row["amount"] = repr(row["amount"]) if row["amount"] is not None else None
            lines.append(",".join("" if row[n] is None else str(row[n]) for n in names))
        (directory / "csv" / f"{part.stem}.csv").write_text("\n".join(lines) + "\n")
    return directory / "csv"


@pytest.mark.slow
def test_csv_files_go_through_arrow_tasks(spark, tmp_path: Path, monkeypatch) -> None:
    """CSV files, decoded by Arrow where that is certainly Spark's reading: the same output,
    records, counts and dead letters as Spark's staging; a file with a short line (a bad
    record) and one with a quoted field are read by Spark in the same epoch."""
    monkeypatch.delenv("STREAMER_ARROW_INPUT", raising=False)
    data = csv_events(tmp_path / "data", files=5, rows=400, seed=11)
    short = data / "part-001.csv"
    lines = short.read_text().splitlines()
    lines[10] = lines[10].rsplit(",", 2)[0]  # two fields short: a bad record to Spark
    short.write_text("\n".join(lines) + "\n")
    quoted = data / "part-003.csv"
    lines = quoted.read_text().splitlines()
    user, rest = lines[5].split(",", 1)
    lines[5] = f'"{user}",{rest}'  # the same value, quoted: Spark's to read
    quoted.write_text("\n".join(lines) + "\n")
    found = {}
    for arrow in ("false", "true"):
        out, dead = tmp_path / f"out-{arrow}", tmp_path / f"dead-{arrow}"
        _, result = run(spark, pipeline(
            fmt="csv", name=f"csv-{arrow}", data=data, out=out, dead=dead,
            state=tmp_path / f"st-{arrow}", arrow=arrow, parallelism=2, backend="rocksdb",
            keys="[user]", body="window: {tumbling: 1m}\n    " + WINDOW, prefix=PREFIX,
            last="derive"))
        assert result.status == "finished", result
        found[arrow] = (committed_rows(out), committed_rows(dead) if dead.exists() else [],
                        epoch_metrics(result), result)
    off, on = found["false"], found["true"]
    assert off[0] and on[0] == off[0]
    assert len(off[1]) == 1 and on[1] == off[1]  # the short line, a dead letter either way
    assert on[2] == off[2]
    metrics = on[3].metrics
    refused = {k: v for m in metrics for k, v in m.arrow_refused.items()}
    assert sorted(refused) == [str(short), str(quoted)], refused
    assert "quote" in refused[str(quoted)]
    assert [m.arrow_decoded for m in metrics if m.records_in] == [{"events": 1},
                                                                  {"events": 1},
                                                                  {"events": 1}]
    assert all(not m.arrow_decoded for m in off[3].metrics)
