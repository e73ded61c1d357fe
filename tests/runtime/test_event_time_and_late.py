"""Two edges of the bad-records rule: an `event_time` expression that Spark's ANSI mode would
fail on for one record (`to_timestamp` of garbage) makes that record a bad record, not a failed
epoch; and the late records a window without a `late:` output drops are counted in `late`, so
records in = what the windows consumed + late, on the Spark path and on a local epoch."""

from __future__ import annotations

import datetime
import json
import textwrap
from pathlib import Path

import pytest

from streamer.connectors.exceptions import DecodeError
from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.coordinator import JobRunner, RunOptions

pytestmark = pytest.mark.spark

BASE_MS = 1767225600000  # 2026-01-01T00:00:00Z
GARBAGE = ("not a time", "2026-13-45 99:00:00")


def run(spark, text: str):
    spec = load_pipeline_text(textwrap.dedent(text))
    return JobRunner(spec, RunOptions(ui=False), spark=spark).run()


def committed(directory: Path) -> list[dict]:
    rows = []
    for part in sorted(directory.glob("part-*.jsonl")):
        rows += [json.loads(line) for line in part.read_text().split("\n") if line.strip()]
    return rows


def stamp(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime(
        "%Y-%m-%d %H:%M:%S")


def pipeline(name: str, data: Path, out: Path, dlq: Path | None, local_rows: int,
             late: str = "") -> str:
    return f"""
        name: {name}
        job: {{parallelism: 2, execution: {{local_rows: {local_rows}}}}}
        sources:
          - id: events
            type: files
            path: {data}
            format: jsonl
            max_files_per_epoch: 1
            schema: {{user: string, t: string}}
            event_time: to_timestamp(t)
            watermark: {{max_out_of_orderness: 5s}}
            {"on_error: dlq" if dlq else ""}
        operators:
          - id: per_10s
            input: events
            key_by: [user]
            window: {{tumbling: 10s{late}}}
            aggregate: {{n: count()}}
        sinks:
          - id: out
            type: files
            input: per_10s
            path: {out}
            format: jsonl
        """ + (f"""
          - id: dlq
            type: files
            path: {dlq}
            format: jsonl
        """ if dlq else "")


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("local_rows", [0, 1000], ids=["spark-path", "local-epoch"])
def test_an_event_time_that_cannot_be_computed_is_a_dead_letter(spark, tmp_path: Path,
                                                                local_rows: int) -> None:
    data, out, dlq = tmp_path / "in", tmp_path / "out", tmp_path / "dlq"
    good = [{"user": f"u{i % 2}", "t": stamp(BASE_MS + i * 1000)} for i in range(6)]
    bad = [{"user": "u0", "t": text} for text in GARBAGE] + [{"user": "u1", "t": None}]
    write(data / "a.jsonl", good[:3] + bad + good[3:])
    result = run(spark, pipeline("ansi-event-time", data, out, dlq, local_rows))
    assert sum(r["n"] for r in committed(out)) == len(good)
    dead = committed(dlq)
    assert sorted(json.loads(r["record"])["t"] or "" for r in dead) == sorted(
        [*GARBAGE, ""])
    assert sorted(r["error"] for r in dead) == sorted(
        f"event time `to_timestamp(t)` is null or cannot be computed (field 't': {value})"
        for value in [*[json.dumps(text) for text in GARBAGE], "null"])
    lines = (data / "a.jsonl").read_text().splitlines()  # each names its line
    assert all(r["source"] == "events" and r["split"].endswith("a.jsonl")
               and lines[int(r["offset"]) - 1] == r["record"] for r in dead), dead
    assert result.dead_letters == 3 and result.records_in == len(good)


def test_without_on_error_it_fails_naming_source_record_and_file(spark, tmp_path) -> None:
    data, out = tmp_path / "in", tmp_path / "out"
    write(data / "a.jsonl", [{"user": "u0", "t": stamp(BASE_MS)},
                             {"user": "u1", "t": GARBAGE[0]}])
    with pytest.raises(DecodeError) as failed:
        run(spark, pipeline("ansi-no-dlq", data, out, None, 0))
    text = str(failed.value)
    assert "source 'events' read a record whose event time is null or cannot be computed " \
           "(`to_timestamp(t)`)" in text, text
    assert "a.jsonl" in text and GARBAGE[0] in text and "on_error" in text, text
    assert "CAST_INVALID_INPUT" not in text and "Traceback" not in text, text
    assert not list(out.glob("part-*")), "a failed epoch must not commit"


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "late-sink"])
def test_late_records_of_a_window_without_a_late_output_are_counted(spark, tmp_path: Path,
                                                                     fmt: str) -> None:
    """Epoch 1 moves the watermark to 55 s; epoch 2 brings 5 records of the window [0, 10 s),
    closed by then (late), and 3 in time. jsonl takes the Spark path; parquet is read by the
    window's subtasks themselves (the direct read, as a local epoch's rows are); late-sink is
    jsonl with a `late:` output. The window's own counts (`operators`) say the same."""
    data, out = tmp_path / "in", tmp_path / "out"
    first = [{"user": f"u{i % 3}", "t": stamp(BASE_MS + i * 1000)} for i in range(61)]
    late = [{"user": f"u{i % 3}", "t": stamp(BASE_MS + i * 1000)} for i in range(1, 6)]
    in_time = [{"user": "u0", "t": stamp(BASE_MS + 70_000)}] * 3
    text = pipeline("late-counted", data, out, None, 0,
                    late=", late: too_late" if fmt == "late-sink" else "")
    if fmt == "late-sink":
        text += f"""
          - id: too_late
            type: files
            path: {tmp_path / "late"}
            format: jsonl
        """
    if fmt in ("jsonl", "late-sink"):
        write(data / "a.jsonl", first)
        write(data / "b.jsonl", late + in_time)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        data.mkdir()
        for name, rows in (("a", first), ("b", late + in_time)):
            pq.write_table(pa.table({
                "user": [r["user"] for r in rows],
                "ts": pa.array([datetime.datetime.fromisoformat(r["t"] + "+00:00")
                                for r in rows], pa.timestamp("us", tz="UTC"))}),
                data / f"{name}.parquet")
        text = text.replace("format: jsonl\n            max", "format: parquet\n            max")
        text = text.replace("schema: {user: string, t: string}", "schema: {user: string, "
                            "ts: timestamp}").replace("to_timestamp(t)", "ts")
    result = run(spark, text)
    assert result.late == len(late)
    assert [m.late for m in result.metrics] == [0, len(late)] + [0] * (len(result.metrics) - 2)
    assert result.metrics[1].to_json()["late"] == len(late)
    # records in = what the windows consumed + late
    consumed = sum(r["n"] for r in committed(out))
    assert result.records_in == consumed + result.late == len(first) + len(late) + len(in_time)
    assert ("per_10s" in result.metrics[1].direct) == (fmt == "parquet")
    # Per operator: the window's late records and the rows it emitted, epoch by epoch.
    assert [m.operators["per_10s"]["late"] for m in result.metrics] == [
        m.late for m in result.metrics]
    assert sum(m.operators["per_10s"]["out"] for m in result.metrics) == len(committed(out))
    assert all(m.operators["per_10s"]["out"] == m.records_out["out"] for m in result.metrics)
    assert result.metrics[1].to_json()["operators"]["per_10s"]["late"] == len(late)
    if fmt == "late-sink":
        assert len(committed(tmp_path / "late")) == len(late)
