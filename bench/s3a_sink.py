"""A jsonl `files` sink on S3 (MinIO on 127.0.0.1, tests/s3_server.py): epoch times of
2 x 1 M rows from `streamer run --json` (docs/object-storage.md, "Spark's reads and writes").

    .venv/bin/python -m bench.s3a_sink [--rows 1000000] [--epochs 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per epoch")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    from s3_server import S3Server

    server = S3Server(tempfile.mkdtemp(prefix="bench-minio-")).start()
    server.create_bucket("streamer")
    try:
        work = Path(tempfile.mkdtemp(prefix="bench-s3a-"))
        options = "".join(f"  {k}: {v}\n" for k, v in server.storage_options().items())
        (work / "job.yaml").write_text(f"""name: bench-s3a
storage: {work}/storage
storage_options:
{options}sources:
  - id: gen
    type: datagen
    splits: 2
    limit: {args.rows * args.epochs // 2}
    max_records_per_epoch: {args.rows}
    fields:
      user: "concat('u', cast(offset % 1000 as string))"
      amount: "cast(offset % 97 as double)"
sinks:
  - {{id: out, type: files, input: gen, path: s3://streamer/bench/out, format: jsonl}}
""")
        streamer = ROOT / ".venv" / "bin" / "streamer"
        proc = subprocess.run([str(streamer), "run", str(work / "job.yaml"), "--json", "--no-ui",
                               "--no-checkpoints"], capture_output=True, text=True, cwd=work,
                              check=False)
        for line in proc.stdout.splitlines():
            event = json.loads(line)
            if event.get("event") == "epoch":
                print(f"epoch {event['epoch']}: {event['records_in_total']} rows, "
                      f"{event['duration_ms']:.0f} ms (commit {event['commit_ms']:.0f} ms)")
        if proc.returncode:
            print(proc.stderr[-3000:])
    finally:
        server.stop()


if __name__ == "__main__":
    main()
