"""Spark's own reads and writes on S3 through S3A (`connectors/files/s3a.py`), against a real MinIO
(the `s3` fixture): a parquet `files` source on `s3://` read by Spark with a filter, a jsonl
one whose file name Hadoop quotes (its dead letter names the file as listed), and
`files` sinks on `s3://` in jsonl and parquet that Spark writes straight into their staging
prefixes, committed with the manifests (test_s3_jobs.py covers a jsonl source and the crash
campaign). One streamer process, so one JVM.
"""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from streamer_process import FilesOutput, quick_jvm, run_streamer

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.s3]

PIPELINE = """\
name: s3a-job
storage: {root}/storage
storage_options:
{options}sources:
  - id: orders
    type: files
    path: s3://streamer/{prefix}/in
    format: parquet
    schema: {{order_id: bigint, amount: double, note: string}}
    max_files_per_epoch: 2
  - id: raw
    type: files
    path: s3://streamer/{prefix}/raw/*.jsonl
    format: jsonl
    schema: {{order_id: bigint}}
    on_error: bad
operators:
  - id: big
    input: orders
    filter: "amount >= 10"
sinks:
  - {{id: as_json, type: files, input: big, path: s3://streamer/{prefix}/json, format: jsonl}}
  - {{id: as_parquet, type: files, input: big, path: s3://streamer/{prefix}/pq,
      format: parquet}}
  - {{id: raw_out, type: files, input: raw, path: {root}/raw_out, format: jsonl}}
  - {{id: bad, type: files, path: {root}/bad, format: jsonl}}
""" + quick_jvm().replace("{", "{{").replace("}", "}}")


def committed(fs: Any, out: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of the files the sink's manifests name (in manifest order), and every other
    file under `out` (staging, Spark's markers, unnamed parts)."""
    named: list[str] = []
    for path in sorted(fs.find(f"{out}/_manifests")):
        named += [entry["name"] for entry in json.loads(fs.cat_file(path))["files"]]
    rows: list[dict[str, Any]] = []
    for name in named:
        data = fs.cat_file(f"{out}/{name}")
        if name.endswith(".parquet"):
            rows += pq.read_table(io.BytesIO(data)).to_pylist()
        else:
            rows += [json.loads(line) for line in data.decode().splitlines() if line.strip()]
    others = [p.removeprefix(f"{out}/") for p in fs.find(out)]
    return rows, [p for p in others if p not in named and not p.startswith("_manifests/")]


def test_spark_reads_and_writes_s3_through_s3a(s3: Any, tmp_path: Path) -> None:
    fs = s3.filesystem()
    prefix = f"s3a-{uuid.uuid4().hex[:8]}"
    expected = []
    for n in range(3):
        rows = [{"order_id": n * 10 + i, "amount": float(i * 5), "note": f"n{n}"}
                for i in range(5)]
        expected += [r for r in rows if r["amount"] >= 10]
        buffer = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), buffer)
        fs.pipe_file(f"streamer/{prefix}/in/orders-{n}.parquet", buffer.getvalue())
    # A name Hadoop quotes in its URLs: the dead letter still names the file as listed.
    odd = f"streamer/{prefix}/raw/a b ü.jsonl"
    fs.pipe_file(odd, b'{"order_id": 7}\nnot json\n')
    options = "".join(f"  {k}: {v}\n" for k, v in s3.storage_options().items())
    pipeline = tmp_path / "job.yaml"
    pipeline.write_text(PIPELINE.format(root=tmp_path, prefix=prefix, options=options))

    run = run_streamer(pipeline, "--no-checkpoints")
    assert run.returncode == 0 and run.finished, run.describe()
    key = sorted((r["order_id"], r["amount"], r["note"]) for r in expected)
    for sink in ("json", "pq"):
        rows, others = committed(fs, f"streamer/{prefix}/{sink}")
        assert sorted((r["order_id"], r["amount"], r["note"]) for r in rows) == key, sink
        assert others == [], others
        # Two epochs (2 files, then 1): one manifest each, naming deterministic part names.
        assert len(fs.find(f"streamer/{prefix}/{sink}/_manifests")) == 2
    raw = [json.loads(r) for r in FilesOutput(tmp_path / "raw_out").committed().elements()]
    assert raw == [{"order_id": 7}]
    bad = [json.loads(r) for r in FilesOutput(tmp_path / "bad").committed().elements()]
    assert [(b["split"], b["record"]) for b in bad] == [(f"s3://{odd}", "not json")]
