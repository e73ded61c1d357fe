"""`streamer` with tracemalloc on: the soak's driver, when it looks for what grows.

    python -m bench.traced DIR SECONDS <streamer arguments...>

Starts tracemalloc (4 frames) before streamer is imported and writes a snapshot
(`DIR/snap-<n>.tracemalloc`, `tracemalloc.Snapshot.dump`) every SECONDS from a daemon thread,
then runs the CLI with the remaining arguments. `bench.soak --tracemalloc` uses it and compares
the snapshot after warm-up with the last one (`compare`). A benchmark aid only: tracemalloc
slows allocation and adds its own memory, so its RSS figures are not the plain run's.
"""

from __future__ import annotations

import sys
import threading
import time
import tracemalloc
from pathlib import Path

FRAMES = 4


def _dump_every(out: Path, seconds: float) -> None:
    n = 0
    while True:
        time.sleep(seconds)
        snap = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)])
        snap.dump(str(out / f"snap-{n:04d}.tracemalloc"))
        n += 1


def snapshots(out: Path) -> list[Path]:
    """The snapshots written so far, oldest first."""
    return sorted(out.glob("snap-*.tracemalloc"))


def compare(first: Path, last: Path, top: int = 12) -> list[str]:
    """The `top` allocation sites (by traceback's innermost streamer or pyspark frame, else
    its innermost frame) whose size grew most from `first` to `last`, one line each."""
    old = tracemalloc.Snapshot.load(str(first))
    new = tracemalloc.Snapshot.load(str(last))
    total = (sum(s.size for s in new.statistics("filename"))
             - sum(s.size for s in old.statistics("filename")))
    lines = [f"traced Python heap {total / 2**20:+.2f} MB from {first.name} to {last.name}"]
    for stat in new.compare_to(old, "lineno")[:top]:
        frame = stat.traceback[0]
        lines.append(f"{stat.size_diff / 1024:+9.1f} KB {stat.count_diff:+7d} blocks  "
                     f"{frame.filename}:{frame.lineno}")
    return lines


def main() -> None:
    """Trace, then hand the rest of the command line to streamer."""
    out, seconds = Path(sys.argv[1]), float(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(FRAMES)
    threading.Thread(target=_dump_every, args=(out, seconds), daemon=True).start()
    sys.argv = ["streamer", *sys.argv[3:]]
    from streamer.cli.main import main as cli

    cli()


if __name__ == "__main__":
    main()
