"""What `streamer validate` costs: each example under pipelines/ checked without Spark
(`--no-spark`: structure, references, columns, types and event time from the declared
schemas) and, with `--spark`, also with Spark's analyzer (every expression), as the user
runs them: a fresh `streamer` process each time, wall clock.

    .venv/bin/python -m bench.validate [--spark] [--repeat 3]

Prints one row per example: the median seconds of each mode, and what the Spark-free checks
themselves take in this process (load, validate, type check, import the process functions;
the rest of --no-spark is the interpreter's start). Target: --no-spark under 2 s.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STREAMER = Path(sys.executable).parent / "streamer"


def _time(args: list[str]) -> tuple[float, int]:
    """Seconds and exit code of one `streamer` process."""
    start = time.perf_counter()
    done = subprocess.run([str(STREAMER), *args], cwd=ROOT, capture_output=True, check=False)
    return time.perf_counter() - start, done.returncode


def main() -> None:
    """Time validate on every example and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spark", action="store_true",
                        help="also time validate with Spark's analyzer (slow)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode (median)")
    args = parser.parse_args()
    examples = sorted((ROOT / "pipelines").glob("*.yaml"))
    modes = {"--no-spark": ["validate", "--no-spark"]}
    if args.spark:
        modes["analyzer"] = ["validate"]
    from streamer.pipeline.validate import load_pipeline
    from streamer.runtime.job.checks import check_user_code

    print(f"{'example':<32}" + "".join(f"{m:>14}" for m in modes) + f"{'checks':>10}  exit")
    for path in examples:
        cells, codes = [], set()
        for command in modes.values():
            runs = [_time([*command, str(path.relative_to(ROOT))]) for _ in range(args.repeat)]
            cells.append(statistics.median(s for s, _ in runs))
            codes |= {code for _, code in runs}
        start = time.perf_counter()
        check_user_code(load_pipeline(str(path)))
        checks_ms = (time.perf_counter() - start) * 1000
        print(f"{path.name:<32}" + "".join(f"{c:>13.2f}s" for c in cells)
              + f"{checks_ms:>8.0f}ms  {','.join(map(str, sorted(codes)))}")


if __name__ == "__main__":
    main()
