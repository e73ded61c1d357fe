"""Dedupe on every path a keyed stage can take: the subtasks reading the parquet source
themselves, a local epoch's collected rows, the input Spark stages for them, and the
Spark-routed plan all forward the same first records, count the same records, and share one
state layout (a job can switch paths between epochs)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_direct import BASE_MS, committed_rows, run, stop_with_savepoint

pytestmark = pytest.mark.spark

PIPELINE = """
name: {name}
job:
  parallelism: {parallelism}
  max_parallelism: 16
  state: {{backend: {backend}, local_dir: "{state}"}}
  checkpoint: {{interval: 1ms}}
  execution: {{small_epoch_rows: 0, local_rows: {local_rows}, direct_read: {direct},
              staged_input: {staged}}}
sources:
  - id: events
    type: files
    path: "{data}"
    format: {format}
    schema: {{id: bigint, user: string, ts: timestamp, amount: double, tag: string}}
    max_files_per_epoch: 2
    event_time: ts
    watermark: {{max_out_of_orderness: 5s}}
operators:
{prefix}  - id: dd
    input: {input}
    key_by: {keys}
    dedupe: {{within: 20s}}
sinks:
  - id: out
    type: files
    input: dd
    path: "{out}"
    format: jsonl
"""

#: Spark plans every epoch; the subtasks read the files; Spark stages the input.
PATHS = {
    "routed": {"direct": "false", "local_rows": 0, "staged": "false"},
    "direct": {"direct": "true", "local_rows": 0, "staged": "false"},
    "staged": {"direct": "true", "local_rows": 0, "staged": "true"},
}


def write_events(directory: Path, files: int, rows: int, seed: int) -> None:
    """Events whose ids repeat within and across epochs (some null), each at its own
    millisecond (so "first" never depends on arrival order), mostly in order with some
    disorder and some records far behind, and values with nulls; as parquet and JSON lines."""
    rng = random.Random(seed)
    n = files * rows
    slots = list(range(n))
    for start in range(0, n, 8):  # local disorder within 8 records
        chunk = slots[start:start + 8]
        rng.shuffle(chunk)
        slots[start:start + 8] = chunk
    for _ in range(n // 25):  # a few far out of order
        a, b = rng.randrange(n), rng.randrange(n)
        slots[a], slots[b] = slots[b], slots[a]
    for fmt in ("parquet", "jsonl"):
        (directory / fmt).mkdir(parents=True, exist_ok=True)
    for f in range(files):
        part = range(f * rows, (f + 1) * rows)
        table = pa.table({
            "id": pa.array([None if rng.random() < 0.02 else rng.randrange(120) for _ in part],
                           pa.int64()),
            "user": pa.array([None if rng.random() < 0.02 else f"u{rng.randrange(5)}é"
                              for _ in part], pa.string()),
            "ts": pa.array([(BASE_MS + slots[g] * 900) * 1000 for g in part],
                           pa.timestamp("us", tz="UTC")),
            "amount": pa.array([None if rng.random() < 0.1 else rng.randrange(-99, 99) / 4
                                for _ in part], pa.float64()),
            "tag": pa.array([rng.choice(["a", "b", None]) for _ in part], pa.string()),
        })
        pq.write_table(table, directory / "parquet" / f"part-{f:03d}.parquet")
        lines = []
        for row in table.to_pylist():
            row["ts"] = row["ts"].isoformat()
            lines.append(json.dumps(row))
        (directory / "jsonl" / f"part-{f:03d}.jsonl").write_text("\n".join(lines) + "\n")


def run_path(spark, tmp_path: Path, path: str, *, fmt: str, parallelism: int, backend: str,
             keys: str, prefix: bool, name: str | None = None, **options):
    settings = PATHS[path]
    return run(spark, PIPELINE.format(
        name=name or f"dd-{path}", data=tmp_path / "data" / fmt, format=fmt,
        out=tmp_path / f"out-{name or path}", state=tmp_path / f"state-{name or path}",
        parallelism=parallelism, backend=backend, keys=keys,
        prefix="  - {id: keep, input: events, filter: \"tag is null or tag != 'b'\"}\n"
        if prefix else "", input="keep" if prefix else "events", **settings), **options)


def summary(result) -> list[tuple]:
    return [(m.records_in, m.records_out, m.watermark, m.operators) for m in result.metrics]


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "parallelism", "backend", "keys", "paths"), [
    ("parquet", 2, "rocksdb", "[id]", ("direct",)),
    ("parquet", 3, "memory", "[user, id]", ("direct",)),
    ("jsonl", 2, "rocksdb", "[id]", ("staged",)),
])
def test_every_path_forwards_the_routed_plans_records(spark, tmp_path: Path, fmt: str,
                                                      parallelism: int, backend: str,
                                                      keys: str, paths: tuple[str, ...]
                                                      ) -> None:
    write_events(tmp_path / "data", files=5, rows=240, seed=parallelism)
    prefix = fmt == "jsonl"  # (a filter before it: what the staged path is for)
    options = {"fmt": fmt, "parallelism": parallelism, "backend": backend, "keys": keys,
               "prefix": prefix}
    _, reference = run_path(spark, tmp_path, "routed", **options)
    assert reference.status == "finished"
    want = committed_rows(tmp_path / "out-routed")
    ids = [json.loads(r)["id"] for r in want]
    assert len(ids) > len(set(ids)) > 100  # keys came back after they were forgotten
    for path in paths:
        _, result = run_path(spark, tmp_path, path, **options)
        assert result.status == "finished"
        took = {m.epoch: getattr(m, path) for m in result.metrics if m.records_in}
        assert took and all(v == ["dd"] for v in took.values()), (path, took)
        assert committed_rows(tmp_path / f"out-{path}") == want, path
        assert summary(result) == summary(reference), path


@pytest.mark.slow
def test_a_job_switches_between_direct_and_routed_dedupe(spark, tmp_path: Path) -> None:
    """Stopped after two epochs read by the subtasks, resumed with Spark routing the rest
    (and the other way round): the same output as one uninterrupted run, so both paths
    keep the same state (the forgotten and the remembered keys)."""
    write_events(tmp_path / "data", files=6, rows=200, seed=11)
    options = {"fmt": "parquet", "parallelism": 2, "backend": "rocksdb", "keys": "[id]",
               "prefix": False}
    _, whole = run_path(spark, tmp_path, "routed", name="whole", **options)
    assert whole.status == "finished"
    want = committed_rows(tmp_path / "out-whole")
    for first, then in (("direct", "routed"), ("routed", "direct")):
        name = f"{first}-then-{then}"
        chk = {"checkpoints": True, "storage": str(tmp_path / f"chk-{name}")}
        _, part = run_path(spark, tmp_path, first, name=name, max_epochs=2, **options, **chk)
        assert part.status == "stopped"
        assert all(getattr(m, first) == ["dd"] for m in part.metrics) if first != "routed" \
            else not any(m.direct for m in part.metrics)
        _, rest = run_path(spark, tmp_path, then, name=name, **options, **chk)
        assert rest.status == "finished"
        assert committed_rows(tmp_path / f"out-{name}") == want, name


GENERATED = """
name: {name}
job:
  parallelism: 2
  state: {{backend: {backend}}}
  execution: {{small_epoch_rows: 0, local_rows: {local_rows}, staged_input: false}}
sources:
  - id: gen
    type: datagen
    limit: 600
    max_records_per_epoch: 150
    fields:
      id: "if(pmod(offset, 23) = 0, null, pmod(offset * 7919, 61))"
      seen: "offset"
      # each at its own second, shuffled within blocks of 8
      ts: "timestamp_millis({base} + (offset - pmod(offset, 8) + pmod(offset * 5, 8)) * 1000)"
    {event_time}
operators:
  - id: dd
    input: gen
    key_by: [id]
    dedupe: {{within: {within}}}
sinks:
  - id: out
    type: files
    input: dd
    path: "{out}"
    format: jsonl
"""


@pytest.mark.parametrize(("backend", "domain"), [("rocksdb", "event"),
                                                 ("memory", "processing")])
def test_local_epochs_forward_the_routed_plans_records(spark, tmp_path: Path, backend: str,
                                                       domain: str) -> None:
    """A datagen slice small enough is a local relation: its dedupe runs in the driver."""
    event = domain == "event"
    outputs = {}
    for path, local_rows in (("routed", 0), ("local", 10_000)):
        _, result = run(spark, GENERATED.format(
            name=f"gen-{path}", backend=backend, local_rows=local_rows, base=BASE_MS,
            event_time="event_time: ts\n    watermark: {max_out_of_orderness: 5s}"
            if event else "", within="30s" if event else "1h", out=tmp_path / path))
        assert result.status == "finished"
        reading = [m for m in result.metrics if m.records_in]
        assert len(reading) == 4
        assert all(("dd" in m.local) == (path == "local") for m in reading), path
        assert not any(m.staged or m.direct for m in result.metrics)
        outputs[path] = committed_rows(tmp_path / path)
    ids = [json.loads(r)["id"] for r in outputs["routed"]]
    assert len(set(ids)) == 62  # 61 ids and null
    assert (len(ids) > 62) == event  # event time: forgotten after 30 s, then forwarded again
    assert outputs["local"] == outputs["routed"]


def test_savepoint_then_restore_at_another_parallelism_and_backend(spark, tmp_path: Path
                                                                   ) -> None:
    """Stop with a savepoint mid-run, with keys remembered in chunks; `savepoint export`
    shows each remembered key and its expiry; restored at parallelism 3 on the memory
    backend, the job commits exactly what an uninterrupted run commits."""
    from streamer.savepoint.export import export_operator
    from streamer.savepoint.savepoint_metadata import read_metadata

    write_events(tmp_path / "data", files=8, rows=240, seed=11)
    storage = tmp_path / "storage"

    def text(name: str, parallelism: int, backend: str) -> str:
        # (within 1h: the data's far out-of-order records move the watermark ahead early, and
        # keys must still be remembered when the savepoint is taken)
        return PIPELINE.format(
            name=name, data=tmp_path / "data" / "parquet", format="parquet",
            out=tmp_path / f"out-{name}", state=tmp_path / f"state-{name}-{backend}",
            parallelism=parallelism, backend=backend, keys="[id]", prefix="",
            input="events", **PATHS["direct"]).replace(
            "job:", f'storage: "{storage}"\njob:', 1).replace("within: 20s", "within: 1h")

    _, reference = run(spark, text("dd-ref", 2, "rocksdb"), checkpoints=True)
    assert reference.status == "finished"
    want = committed_rows(tmp_path / "out-dd-ref")

    stopped = stop_with_savepoint(spark, text("dd-sp", 2, "rocksdb"), storage, "dd-sp")
    assert stopped.status == "stopped" and len(stopped.savepoints) == 1
    saved = read_metadata(stopped.savepoints[0]).operators["dd"]
    assert "dedupe.seen" in saved["states"]
    exported = tmp_path / "export.jsonl"
    export_operator(stopped.savepoints[0], saved["files"], str(exported), "jsonl")
    seen = [json.loads(line) for line in exported.read_text().splitlines()]
    seen = [r for r in seen if r["state"] == "dedupe.seen"]
    assert seen and all(r["kind"] != "timer" for r in seen)
    assert all(len(r["key"]) == 1 and set(r["value"]) == {"expires_ms"} for r in seen)
    assert len({json.dumps(r["key"]) for r in seen}) == len(seen)  # each key once
    _, resumed = run(spark, text("dd-sp", 3, "memory"), checkpoints=True,
                     from_savepoint=stopped.savepoints[0])
    assert resumed.status == "finished"
    # The resumed run read the rest, whose ids the savepoint remembers: none came out again.
    assert sum(sum(m.records_in.values()) for m in resumed.metrics) > 0
    assert committed_rows(tmp_path / "out-dd-sp") == want
