"""Digest of the committed output of every example pipeline, to show that a change of the
engine leaves what users get byte for byte the same.

    python -m bench.outputs --streamer .venv/bin/streamer            # print digests
    python -m bench.outputs --streamer A/.venv/bin/streamer --compare B/.venv/bin/streamer

Each example (pipelines/*.yaml but the Kafka ones, which need a broker) runs from the
start in a scratch copy of pipelines/ with fresh checkpoint storage. What is compared is
each sink directory's committed records, byte for byte: the lines of its JSON-lines and CSV
files, the rows of its parquet files (as JSON), sorted, since how rows fall into files and
epochs varies from run to run of the same engine (a rate-limited source's epochs follow the
clock; Spark's writer splits an epoch's rows over its tasks). Hidden and staging files are
excluded.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def examples() -> list[Path]:
    return sorted(p for p in (ROOT / "pipelines").glob("*.yaml")
                  if not p.name.startswith("kafka"))


def records(path: Path) -> list[str]:
    """The records of one committed output file, each as text."""
    if path.suffix == ".parquet":
        import json

        import pyarrow.parquet as pq

        return [json.dumps(row, sort_keys=True, default=str)
                for row in pq.read_table(path).to_pylist()]
    return [line for line in path.read_text().splitlines() if line.strip()]


def digest(streamer: str, example: Path) -> dict[str, str]:
    """Sink directory -> sha256 of its sorted committed records, for one run of `example`."""
    with tempfile.TemporaryDirectory(prefix="streamer-outputs-") as scratch:
        work = Path(scratch)
        shutil.copytree(ROOT / "pipelines", work / "pipelines")
        cmd = [streamer, "run", f"pipelines/{example.name}", "--quiet", "--no-ui",
               "--storage", str(work / "storage")]
        env = {**os.environ, "STREAMER_STATE_DIR": str(work / "state")}
        done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=env,
                              timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"{example.name}: exit {done.returncode}\n{done.stderr[-2000:]}")
        found: dict[str, list[str]] = {}
        for path in sorted((work / "out").rglob("*")):
            rel = path.relative_to(work / "out")
            if path.is_file() and not any(p.startswith((".", "_")) for p in rel.parts):
                found.setdefault(str(rel.parent), []).extend(records(path))
        return {sink: hashlib.sha256("\n".join(sorted(rows)).encode()).hexdigest()
                for sink, rows in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streamer", required=True, help="the streamer command to run")
    parser.add_argument("--compare", help="a second streamer command; outputs must match")
    args = parser.parse_args()
    failed = False
    print(f"{'example':<28} {'sinks':>5}  {'digest':<16}  {'same':<5}")
    for example in examples():
        first = digest(args.streamer, example)
        total = hashlib.sha256(repr(sorted(first.items())).encode()).hexdigest()[:16]
        same = ""
        if args.compare:
            second = digest(args.compare, example)
            same = "yes" if second == first else "NO"
            failed |= second != first
        print(f"{example.name:<28} {len(first):>5}  {total:<16}  {same:<5}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
