"""Session windows kept in chunks (`operators.sessions`) across a stop with a savepoint:
`savepoint export` shows each open session, and the job restored at another parallelism and
backend commits exactly what an uninterrupted run commits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_dedupe_paths import PATHS, write_events
from test_direct import committed_rows, run, stop_with_savepoint

pytestmark = pytest.mark.spark

PIPELINE = """
name: {name}
storage: "{storage}"
job:
  parallelism: {parallelism}
  max_parallelism: 16
  state: {{backend: {backend}, local_dir: "{state}"}}
  checkpoint: {{interval: 1ms}}
  execution: {{small_epoch_rows: 0, local_rows: 0, direct_read: {direct},
              staged_input: {staged}}}
sources:
  - id: events
    type: files
    path: "{data}"
    format: parquet
    schema: {{id: bigint, user: string, ts: timestamp, amount: double, tag: string}}
    max_files_per_epoch: 2
    event_time: ts
    watermark: {{max_out_of_orderness: 5s}}
operators:
  - id: ss
    input: events
    key_by: [id]
    window: {{session: {{gap: 30s}}, allowed_lateness: 10s}}
    aggregate: {{n: count(), total: sum(amount), hi: max(amount), mean: avg(amount)}}
sinks:
  - id: out
    type: files
    input: ss
    path: "{out}"
    format: jsonl
"""


@pytest.mark.slow
@pytest.mark.parametrize("path", ["direct", "routed"])
def test_savepoint_then_restore_at_another_parallelism_and_backend(spark, tmp_path: Path,
                                                                   path: str) -> None:
    """Stop with a savepoint after the second epoch, sessions open in chunks; export shows
    one row per open session (its start, end and partials); restored at parallelism 3 on
    the memory backend, the job commits exactly what an uninterrupted run does."""
    from streamer.savepoint.export import export_operator
    from streamer.savepoint.savepoint_metadata import read_metadata

    write_events(tmp_path / "data", files=8, rows=240, seed=5)
    storage = tmp_path / "storage"

    def text(name: str, parallelism: int, backend: str) -> str:
        return PIPELINE.format(
            name=name, storage=storage, data=tmp_path / "data" / "parquet",
            out=tmp_path / f"out-{name}", state=tmp_path / f"state-{name}-{backend}",
            parallelism=parallelism, backend=backend, **{
                k: v for k, v in PATHS[path].items() if k != "local_rows"})

    _, reference = run(spark, text("ss-ref", 2, "rocksdb"), checkpoints=True)
    assert reference.status == "finished"
    want = committed_rows(tmp_path / "out-ss-ref")
    assert len(want) > 20

    stopped = stop_with_savepoint(spark, text("ss-sp", 2, "rocksdb"), storage, "ss-sp")
    assert stopped.status == "stopped" and len(stopped.savepoints) == 1
    saved = read_metadata(stopped.savepoints[0]).operators["ss"]
    assert "session.open" in saved["states"]
    exported = tmp_path / "export.jsonl"
    export_operator(stopped.savepoints[0], saved["files"], str(exported), "jsonl")
    rows = [json.loads(line) for line in exported.read_text().splitlines()]
    sessions = [r for r in rows if r["state"] == "session.open"]
    timers = [r for r in rows if r["kind"] == "timer"]
    assert sessions and all(len(r["key"]) == 1 for r in sessions)
    for r in sessions:  # [start, end) of a 30 s gap; count, sum, max, avg's (sum, count)
        assert r["value"]["end_ms"] >= r["window_start_ms"] + 30_000
        assert len(r["value"]["partials"]) == 5 and r["value"]["partials"][0] >= 1
    # One timer per key group with sessions, at its earliest session's end - 1 + lateness.
    by_group: dict[int, int] = {}
    for r in sessions:
        end = r["value"]["end_ms"] - 1 + 10_000
        by_group[r["key_group"]] = min(by_group.get(r["key_group"], end), end)
    assert sorted((t["key_group"], t["time_ms"]) for t in timers) == sorted(by_group.items())
    _, resumed = run(spark, text("ss-sp", 3, "memory"), checkpoints=True,
                     from_savepoint=stopped.savepoints[0])
    assert resumed.status == "finished"
    assert sum(sum(m.records_in.values()) for m in resumed.metrics) > 0
    assert committed_rows(tmp_path / "out-ss-sp") == want
