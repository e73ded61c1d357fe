"""A dead letter of a `files` source names the file, the line and the field, exactly, even
for identical bad lines spread over the several Spark partitions (file blocks) of one large
file: real files, a real pipeline run, each dead letter checked against the line numbers
the test wrote (`connectors.dead_letters`)."""

from __future__ import annotations

import datetime
import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.coordinator import JobRunner, RunOptions

pytestmark = pytest.mark.spark

LINES = 40_000
#: Spark's largest file block in these tests: the files (1.4 to 2.4 MB) are read as 6 or more.
BLOCK = "256k"
BASE = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


@pytest.fixture
def small_blocks(spark) -> Iterator[None]:
    key = "spark.sql.files.maxPartitionBytes"
    before = spark.conf.get(key)
    spark.conf.set(key, BLOCK)
    yield
    spark.conf.set(key, before)


def committed(directory: Path) -> list[dict]:
    return [json.loads(line) for part in sorted(directory.glob("part-*.jsonl"))
            for line in part.read_text().splitlines() if line.strip()]


def run(spark, data: Path, fmt: str, tmp_path: Path) -> list[dict]:
    out, dlq = tmp_path / "out", tmp_path / "dlq"
    spec = load_pipeline_text(textwrap.dedent(f"""
        name: dead-letter-lines-{fmt}
        sources:
          - id: events
            type: files
            path: {data}
            format: {fmt}
            schema: {{user: string, n: int, ts: timestamp}}
            event_time: ts
            watermark: {{max_out_of_orderness: 5s}}
            on_error: dlq
        sinks:
          - {{id: out, type: files, input: events, path: {out}, format: jsonl}}
          - {{id: dlq, type: files, path: {dlq}, format: jsonl}}
        """))
    file = next(data.iterdir())
    assert spark.read.text(str(file)).rdd.getNumPartitions() >= 4  # the blocks are real
    JobRunner(spec, RunOptions(ui=False), spark=spark).run()
    assert len(committed(out)) > LINES * 0.9
    return committed(dlq)


def bad_at(every: int, kinds: int) -> dict[int, int]:
    """Line number -> which kind of bad line, every `every` lines, kinds in turn."""
    return {number: i % kinds for i, number in enumerate(range(every, LINES, every))}


def test_jsonl_dead_letters_name_file_line_and_field(spark, small_blocks, tmp_path) -> None:
    bad_lines = ['{"user": "u1", "n": "lots", "ts": "2026-01-01T00:00:00Z"}',
                 '{"user": "u1", "n": 1, "ts": null}',
                 "{broken"]
    errors = ["field 'n': \"lots\" is not an int", "field 'ts': null event time",
              "not JSON: Expecting property name enclosed in double quotes: line 1 column 2 "
              "(char 1)"]
    bad = bad_at(997, len(bad_lines))
    lines = [bad_lines[bad[n]] if n in bad else json.dumps(
        {"user": f"u{n % 7}", "n": n, "ts": (BASE + datetime.timedelta(seconds=n)).isoformat()})
        for n in range(1, LINES + 1)]
    data = tmp_path / "in"
    data.mkdir()
    (data / "a.jsonl").write_text("\n".join(lines) + "\n")
    dead = run(spark, data, "jsonl", tmp_path)
    got = sorted((r["split"], int(r["offset"]), r["error"], r["record"]) for r in dead)
    assert got == sorted((str(data / "a.jsonl"), n, errors[kind], bad_lines[kind])
                         for n, kind in bad.items())


def test_csv_dead_letters_name_file_line_and_field(spark, small_blocks, tmp_path) -> None:
    bad_lines = ["u1,lots,2026-01-01T00:00:00Z", "u1,5,", "u1,5"]
    errors = ["field 'n': \"lots\" is not an int", "field 'ts': null event time",
              "has 2 fields, the schema has 3 (user, n, ts)"]
    bad = bad_at(1009, len(bad_lines))
    lines = ["user,n,ts", *[bad_lines[bad[n]] if n in bad else
                            f"u{n % 7},{n},{(BASE + datetime.timedelta(seconds=n)).isoformat()}"
                            for n in range(2, LINES + 1)]]
    data = tmp_path / "in"
    data.mkdir()
    (data / "a.csv").write_text("\n".join(lines) + "\n")
    dead = run(spark, data, "csv", tmp_path)
    got = sorted((r["split"], int(r["offset"]), r["error"]) for r in dead)
    assert got == sorted((str(data / "a.csv"), n, errors[kind]) for n, kind in bad.items())
    assert {json.loads(r["record"])["n"] for r in dead if "event time" in r["error"]} == {5}
