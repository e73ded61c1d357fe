"""A parquet file whose footer is sound but whose data page is damaged: planning cannot see
it, the epoch's read fails. With `on_error` the run restarts from the last checkpoint with
the file as one dead letter naming it and why (through Spark's scan, and through a window's
subtasks that read the files themselves); without it, one message names the file."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.exceptions import UnreadableFileError
from streamer.runtime.job.coordinator import JobRunner, RunOptions

pytestmark = pytest.mark.spark

BASE = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def write(path: Path, first: int, n: int, damaged: bool = False) -> None:
    """`n` rows (user, ts one second apart from record `first`); `damaged`: the page header
    of the `user` column overwritten, the footer left sound."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"user": [f"u{i % 3}" for i in range(first, first + n)],
                      "ts": pa.array([BASE + datetime.timedelta(seconds=i)
                                      for i in range(first, first + n)],
                                     pa.timestamp("us", tz="UTC"))})
    pq.write_table(table, path, compression="none", use_dictionary=False)
    if damaged:
        start = pq.ParquetFile(path).metadata.row_group(0).column(0).data_page_offset
        data = bytearray(path.read_bytes())
        data[start:start + 8] = b"\x7f" * 8
        path.write_bytes(bytes(data))
        pq.read_metadata(path)  # the footer still reads
        with pytest.raises(OSError):
            pq.read_table(path)


def committed(directory: Path) -> list[dict]:
    rows = []
    for part in sorted(directory.glob("part-*.jsonl")):
        rows += [json.loads(line) for line in part.read_text().split("\n") if line.strip()]
    return rows


def pipeline(data: Path, out: Path, dlq: Path | None, window: bool) -> str:
    lines = ["name: damaged",
             "job: {checkpoint: {interval: 1ms}, execution: {local_rows: 0}}",
             "sources:",
             f"  - {{id: events, type: files, path: '{data}', format: parquet,",
             "     max_files_per_epoch: 1, event_time: ts"
             + (", on_error: dlq}" if dlq else "}")]
    if window:
        lines += ["operators:",
                  "  - {id: per_minute, input: events, key_by: [user],",
                  "     window: {tumbling: 1m}, aggregate: {n: count()}}"]
    lines += ["sinks:",
              f"  - {{id: out, type: files, input: {'per_minute' if window else 'events'},",
              f"     path: '{out}', format: jsonl}}"]
    if dlq:
        lines.append(f"  - {{id: dlq, type: files, path: '{dlq}', format: jsonl}}")
    return "\n".join(lines) + "\n"


@pytest.mark.slow
@pytest.mark.parametrize("window", [False, True], ids=["spark-scan", "subtask-read"])
def test_a_damaged_page_becomes_a_dead_letter_naming_the_file(spark, tmp_path: Path,
                                                              window: bool) -> None:
    data, out, dlq = tmp_path / "in", tmp_path / "out", tmp_path / "dlq"
    write(data / "a.parquet", 0, 40)
    write(data / "b.parquet", 40, 40, damaged=True)
    write(data / "c.parquet", 80, 40)
    spec = load_pipeline_text(pipeline(data, out, dlq, window))
    result = JobRunner(spec, RunOptions(ui=False, checkpoints=True,
                                        storage=str(tmp_path / "storage")), spark=spark).run()
    assert result.status == "finished", result.reason
    rows = committed(out)
    assert (sum(r["n"] for r in rows) if window else len(rows)) == 80
    (dead,) = committed(dlq)
    assert dead["source"] == "events" and dead["split"] == str(data / "b.parquet"), dead
    assert dead["error"].startswith("cannot read a data page ("), dead
    if window:
        assert any("per_minute" in m.direct for m in result.metrics), "no subtask read"


def test_without_on_error_the_failure_names_the_file(spark, tmp_path: Path) -> None:
    data, out = tmp_path / "in", tmp_path / "out"
    write(data / "b.parquet", 0, 40, damaged=True)
    spec = load_pipeline_text(pipeline(data, out, None, False))
    with pytest.raises(UnreadableFileError) as failed:
        JobRunner(spec, RunOptions(ui=False, checkpoints=True,
                                   storage=str(tmp_path / "storage")), spark=spark).run()
    text = str(failed.value)
    assert f"cannot read the file {str(data / 'b.parquet')!r}: " in text, text
    assert "on_error" in text and "An error occurred while calling" not in text, text
    assert not committed(out)
