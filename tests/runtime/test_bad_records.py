"""Every bad record is accounted for: a record that cannot be decoded, or whose event time
is null, reaches its source's `on_error` sink with the reason and where it was, whatever
operator reads the source (windows, dedupe, process functions, the parquet direct read);
without `on_error` the epoch fails with one message naming the source and the record. The
epoch's counts add up: records read = records out + dead letters + late + filtered."""

from __future__ import annotations

import datetime
import json
import random
import textwrap
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamer.connectors.exceptions import DecodeError
from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.coordinator import JobRunner, RunOptions

pytestmark = pytest.mark.spark

BASE_MS = 1767225600000  # 2026-01-01T00:00:00Z
LINES, FILES = 20_000, 4
#: The kinds of bad line, 50 of each, and what their dead letters say.
KINDS = ("truncated", "not json", "string for int", "null ts")


def committed(directory: Path) -> list[dict]:
    rows = []
    for part in sorted(directory.glob("part-*.jsonl")):
        rows += [json.loads(line) for line in part.read_text().splitlines() if line.strip()]
    return rows


def run(spark, text: str, **options):
    spec = load_pipeline_text(textwrap.dedent(text))
    runner = JobRunner(spec, RunOptions(ui=False, **options), spark=spark)
    return runner.run()


def iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ")


def write_lines(directory: Path, seed: int = 7) -> tuple[list[dict], dict[str, str]]:
    """20,000 jsonl lines in 4 files, 200 of them bad (50 of each of `KINDS`); some good
    ones have a null key. Returns the good records and, per bad line's text, its kind."""
    rng = random.Random(seed)
    bad_at = rng.sample(range(LINES), 200)
    kind_of = {i: KINDS[j % 4] for j, i in enumerate(bad_at)}
    directory.mkdir(parents=True)
    good, bad = [], {}
    per_file = LINES // FILES
    for f in range(FILES):
        lines = []
        for i in range(f * per_file, (f + 1) * per_file):
            user = f"u{rng.randrange(30)}"
            # A null key is a key (SQL's rule), for every keyed operator.
            record = {"user": None if i % 499 == 0 else user, "n": i,
                      "ts": iso(BASE_MS + i * 100)}
            kind = kind_of.get(i)
            if kind is None:
                good.append(record)
                line = json.dumps(record)
            elif kind == "truncated":
                line = json.dumps(record)[:-7]
            elif kind == "not json":
                line = f"line {i} is not json"
            elif kind == "string for int":
                line = json.dumps({**record, "n": f"n{i}"})
            else:
                line = json.dumps({**record, "ts": None})
            if kind is not None:
                bad[line] = kind
            lines.append(line)
        (directory / f"part-{f}.jsonl").write_text("\n".join(lines) + "\n")
    return good, bad


def source(data: Path, on_error: bool = True) -> str:
    return f"""
        sources:
          - id: events
            type: files
            path: {data}
            format: jsonl
            max_files_per_epoch: 2
            schema: {{user: string, n: int, ts: timestamp}}
            event_time: ts
            watermark: {{max_out_of_orderness: 5s}}
            {"on_error: dlq" if on_error else ""}"""


def sinks(out: Path, dlq: Path, input_id: str) -> str:
    return f"""
        sinks:
          - id: out
            type: files
            input: {input_id}
            path: {out}
            format: jsonl
          - id: dlq
            type: files
            path: {dlq}
            format: jsonl"""


def check_dead_letters(dlq: Path, bad: dict[str, str], data: Path) -> None:
    """200 dead letters: every bad line once, each with its reason and its file."""
    dead = committed(dlq)
    assert len(dead) == 200
    assert {r["source"] for r in dead} == {"events"}
    assert all(r["split"].startswith(str(data)) and r["split"].endswith(".jsonl")
               for r in dead), dead[:3]
    by_reason = Counter("null" if r["error"] == "field 'ts': null event time" else "decode"
                        for r in dead)
    assert by_reason == {"null": 50, "decode": 150}
    null_records = [json.loads(r["record"]) for r in dead if r["error"].endswith("event time")]
    expected_null = [json.loads(line) for line, kind in bad.items() if kind == "null ts"]
    assert sorted(r["n"] for r in null_records) == sorted(r["n"] for r in expected_null)
    for r in dead:  # a dead letter's offset is its line in the file
        lines = Path(r["split"]).read_text().splitlines()
        assert lines[int(r["offset"]) - 1] == r["record"], r
        assert r["error"].startswith(("field '", "not JSON", "not a JSON object")), r
    decoded = sorted(r["record"] for r in dead if not r["error"].endswith("event time"))
    assert decoded == sorted(line for line, kind in bad.items() if kind != "null ts")


def test_windows_over_good_records_are_exact_and_every_bad_record_is_a_dead_letter(
        spark, tmp_path: Path) -> None:
    data, out, dlq = tmp_path / "in", tmp_path / "out", tmp_path / "dlq"
    good, bad = write_lines(data)
    result = run(spark, f"""
        name: bad-windows
        job: {{parallelism: 2}}{source(data)}
        operators:
          - id: per_minute
            input: events
            key_by: [user]
            window: {{tumbling: 1m}}
            aggregate: {{n: count()}}{sinks(out, dlq, "per_minute")}
        """)
    expected = Counter((r["user"], (BASE_MS + r["n"] * 100) // 60_000 * 60_000) for r in good)
    got = {(r.get("user"), int(datetime.datetime.fromisoformat(r["window_start"]).timestamp()
                           * 1000)): r["n"] for r in committed(out)}
    assert got == dict(expected)
    check_dead_letters(dlq, bad, data)
    assert result.dead_letters == 200
    assert result.records_in == len(good)  # the records that entered the dataflow
    assert sum(m.total_read for m in result.metrics) == LINES


def test_counts_add_up_without_keyed_operators(spark, tmp_path: Path) -> None:
    data, out, dlq = tmp_path / "in", tmp_path / "out", tmp_path / "dlq"
    good, bad = write_lines(data)
    result = run(spark, f"""
        name: bad-filter
        {source(data)}
        operators:
          - id: odd
            input: events
            filter: "n % 2 = 1"
          - id: named
            input: odd
            with_columns: {{tag: "upper(user)"}}{sinks(out, dlq, "named")}
        """)
    kept = [r for r in good if r["n"] % 2 == 1]
    assert sorted(r["n"] for r in committed(out)) == sorted(r["n"] for r in kept)
    check_dead_letters(dlq, bad, data)
    assert (result.dead_letters, result.filtered, result.late) == (200, len(good) - len(kept), 0)
    for m in result.metrics:  # records read = records out + dead letters + late + filtered
        out_rows = m.total_out - m.dead_letters - m.late
        assert m.total_read == out_rows + m.dead_letters + m.late + m.filtered
        line = m.to_json()
        assert {"dead_letters", "late", "filtered", "records_read_total"} <= set(line)
        # The filter's own counts: what it read (the source's records), kept and removed.
        assert line["operators"] == {"odd": {"in": m.total_in, "out": m.total_in - m.filtered,
                                             "filtered": m.filtered}}
    assert sum(m.total_read for m in result.metrics) == LINES


def test_dedupe_sends_null_event_times_to_dead_letters(spark, tmp_path: Path) -> None:
    """dedupe crashed on these records (a TypeError on the null event time)."""
    data, out, dlq = tmp_path / "in", tmp_path / "out", tmp_path / "dlq"
    good, bad = write_lines(data)
    result = run(spark, f"""
        name: bad-dedupe
        job: {{parallelism: 2}}{source(data)}
        operators:
          - id: first_per_user
            input: events
            key_by: [user]
            dedupe: {{within: 1d}}{sinks(out, dlq, "first_per_user")}
        """)
    first: dict[str, int] = {}
    for r in good:
        first[r["user"]] = min(first.get(r["user"], r["n"]), r["n"])
    assert {r.get("user"): r["n"] for r in committed(out)} == first
    check_dead_letters(dlq, bad, data)
    assert result.dead_letters == 200


def test_process_function_gets_only_records_with_event_time(spark, tmp_path: Path) -> None:
    data, out, dlq = tmp_path / "in", tmp_path / "out", tmp_path / "dlq"
    good, bad = write_lines(data)
    result = run(spark, f"""
        name: bad-process
        job: {{parallelism: 2}}{source(data)}
        operators:
          - id: counted
            input: events
            key_by: [user]
            process: "bad_records_process:CountPerKey"{sinks(out, dlq, "counted")}
        """)
    rows = committed(out)
    assert len(rows) == len(good) and all(r["at"] is not None for r in rows)
    most: dict[str, int] = {}
    for r in rows:
        most[r.get("user")] = max(most.get(r.get("user"), 0), r["seen"])
    assert most == dict(Counter(r["user"] for r in good))
    check_dead_letters(dlq, bad, data)
    assert result.dead_letters == 200


def write_parquet(directory: Path) -> tuple[list[dict], list[tuple[str, int]]]:
    """4 parquet files of 1,000 rows; files 1 and 3 have 20 null event times each. Returns
    the good rows and (file, row index) of each null one."""
    rng = random.Random(3)
    directory.mkdir(parents=True)
    good, nulls = [], []
    for f in range(4):
        users, ts = [], []
        for i in range(1000):
            user, at = f"u{rng.randrange(20)}", BASE_MS + (f * 1000 + i) * 100
            users.append(user)
            if f % 2 == 1 and i % 50 == 7:
                ts.append(None)
                nulls.append((str(directory / f"part-{f}.parquet"), i))
            else:
                ts.append(at * 1000)
                good.append({"user": user, "ms": at})
        pq.write_table(pa.table({"user": pa.array(users, pa.string()),
                                 "ts": pa.array(ts, pa.timestamp("us", tz="UTC"))}),
                       directory / f"part-{f}.parquet")
    return good, nulls


def test_parquet_read_by_the_keyed_subtasks_with_null_event_times(spark, tmp_path) -> None:
    """Files whose footer says the event time has nulls go through Spark's scan, which sends
    those records to `on_error` with their file and row index; the others are still read by
    the keyed subtasks themselves."""
    data, out, dlq = tmp_path / "in", tmp_path / "out", tmp_path / "dlq"
    good, nulls = write_parquet(data)
    result = run(spark, f"""
        name: bad-parquet
        job: {{parallelism: 2}}
        sources:
          - id: events
            type: files
            path: {data}
            format: parquet
            max_files_per_epoch: 1
            schema: {{user: string, ts: timestamp}}
            event_time: ts
            watermark: {{max_out_of_orderness: 5s}}
            on_error: dlq
        operators:
          - id: per_minute
            input: events
            key_by: [user]
            window: {{tumbling: 1m}}
            aggregate: {{n: count()}}{sinks(out, dlq, "per_minute")}
        """)
    expected = Counter((r["user"], r["ms"] // 60_000 * 60_000) for r in good)
    got = {(r.get("user"), int(datetime.datetime.fromisoformat(r["window_start"]).timestamp()
                           * 1000)): r["n"] for r in committed(out)}
    assert got == dict(expected)
    dead = committed(dlq)
    assert sorted((r["split"], int(r["offset"])) for r in dead) == sorted(nulls)
    assert {r["error"] for r in dead} == {"field 'ts': null event time"}
    assert all(json.loads(r["record"])["ts"] is None for r in dead)
    assert [bool(m.direct) for m in result.metrics[:4]] == [True, False, True, False]
    assert sum(m.total_read for m in result.metrics) == 4000


def test_without_on_error_a_null_event_time_fails_the_run_naming_source_and_record(
        spark, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from streamer.cli.main import app

    data = tmp_path / "in"
    data.mkdir()
    (data / "a.jsonl").write_text(
        '{"user": "a", "n": 1, "ts": "2026-01-01T00:00:01Z"}\n'
        '{"user": "b", "n": 2, "ts": null}\n')
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(textwrap.dedent(f"""
        name: no-dlq
        {source(data, on_error=False)}
        operators:
          - id: first_per_user
            input: events
            key_by: [user]
            dedupe: {{within: 1h}}
        sinks:
          - id: out
            type: files
            input: first_per_user
            path: {tmp_path / 'out'}
            format: jsonl
        """))
    result = CliRunner().invoke(app, ["run", str(pipeline), "--quiet", "--no-ui"])
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "source 'events'" in text and "event time is null (`ts`)" in text, text
    assert "a.jsonl" in text and '"user": "b"' in text and "on_error" in text, text  # its line
    assert "Traceback" not in result.output
    assert not list((tmp_path / "out").glob("part-*")), "a failed epoch must not commit"

    with pytest.raises(DecodeError, match="source 'events' read a record whose event time"):
        run(spark, pipeline.read_text())


def test_a_key_column_that_cannot_be_hashed_is_refused_before_the_run(spark, tmp_path) -> None:
    from streamer.exceptions import StreamerError

    with pytest.raises(StreamerError, match=r"key_by column 'tags' of operator 'per_tags' is "
                       r"array<string>, which cannot be a key"):
        run(spark, f"""
            name: array-key
            sources:
              - id: gen
                type: datagen
                limit: 10
                fields: {{tags: "array(cast(offset as string))"}}
            operators:
              - id: per_tags
                input: gen
                key_by: [tags]
                aggregate: {{n: count()}}
            sinks:
              - id: out
                type: files
                input: per_tags
                path: {tmp_path / 'out'}
                format: jsonl
            """)
