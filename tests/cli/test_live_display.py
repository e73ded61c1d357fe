"""The live display as a user sees it: `streamer run` in a real terminal (tmux), its screen
captured while the job runs.

A bounded job of two files, one epoch each, whose `with_columns` sleeps 200 ms per record in
the JVM (`reflect('java.lang.Thread', 'sleep', ...)`), so each epoch takes a few seconds; one
record of each file cannot be decoded and goes to a dead-letter sink. The screen must say
"starting Spark" before any epoch, show the running epoch's clock moving, give each sink its
own column with the dead letters apart, and count with the right plurals.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent

PIPELINE = """\
name: live-display
job:
  epoch: 1s
sources:
  - id: events
    type: files
    path: ./in/*.jsonl
    format: jsonl
    schema: {n: bigint, kind: string}
    max_files_per_epoch: 1
    on_error: bad
operators:
  - id: kept
    input: events
    filter: "kind = 'keep'"
  - id: slow
    input: kept
    with_columns:
      waited: "reflect('java.lang.Thread', 'sleep', cast(200 as bigint))"
sinks:
  - id: out
    type: files
    input: slow
    path: ./out
    format: jsonl
  - id: shown
    type: console
    input: kept
    max_rows: 2
  - id: bad
    type: files
    path: ./dead
    format: jsonl
"""


def write_inputs(root: Path) -> None:
    """Two files of 12 records: 8 kept, 3 filtered out, 1 that cannot be decoded."""
    (root / "in").mkdir()
    for f in range(2):
        lines = [f'{{"n": {f * 100 + i}, "kind": "{"skip" if i % 4 == 0 else "keep"}"}}'
                 for i in range(11)]
        lines.append('{"n": "not a number", "kind": "keep"}')
        (root / "in" / f"part-{f}.jsonl").write_text("\n".join(lines) + "\n")


class Terminal:
    """A terminal of a fixed size (a tmux server of its own) running one command;
    `screen()` is what it shows."""

    def __init__(self, command: str, cwd: Path) -> None:
        self.tmux = ["tmux", "-L", f"streamer-test-{uuid.uuid4().hex[:8]}"]
        # (COLUMNS or LINES from the test's environment would override the terminal's size)
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TMUX")}
        subprocess.run([*self.tmux, "new-session", "-d", "-x", "150", "-y", "50",
                        "-c", str(cwd), f"{command}; echo EXIT=$?; sleep 600"], check=True,
                       env=env)

    def screen(self) -> str:
        return subprocess.run([*self.tmux, "capture-pane", "-p"], capture_output=True,
                              text=True, check=True).stdout

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)


def test_the_live_display_in_a_terminal(tmp_path: Path) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (.ci/run installs it: apt-get install tmux)")
    (tmp_path / "pipeline.yaml").write_text(PIPELINE)
    write_inputs(tmp_path)
    term = Terminal(f"{BIN / 'streamer'} run pipeline.yaml --no-ui", tmp_path)
    screens: list[tuple[float, str]] = []
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            screens.append((time.monotonic(), term.screen()))
            if "EXIT=" in screens[-1][1]:
                break
            time.sleep(0.3)
    finally:
        term.close()
    last = screens[-1][1]
    assert "EXIT=0" in last, last

    # 1. "starting Spark" from the first screen with anything on it, before any epoch
    shown = [(t, s) for t, s in screens if s.strip()]
    assert "starting Spark" in shown[0][1], shown[0][1]
    first_epoch = next(i for i, (_, s) in enumerate(shown) if "epoch 1 running" in s)
    assert first_epoch > 0
    assert all("epoch 1 running" not in s and "epoch ms" not in s
               for _, s in shown[:first_epoch])
    assert any("starting Spark" in s for _, s in shown[:first_epoch])

    # 2. the running epoch's clock moves between two captures of the same epoch
    clocks: dict[int, set[str]] = {}
    for _, s in shown:
        for epoch, clock in re.findall(r"epoch (\d+) running\s+(\S+)", s):
            clocks.setdefault(int(epoch), set()).add(clock)
    assert any(len(seen) >= 2 for seen in clocks.values()), clocks
    # ...and so does the clock while Spark starts
    starting = {m for _, s in shown for m in re.findall(r"starting Spark…\s+(\S+)", s)}
    assert len(starting) >= 2, starting

    # 3. each sink with an input has its column; the dead letters have theirs
    header = next((line for line in last.splitlines() if "epoch ms" in line), last)
    assert re.search(r"→ out\s+→ shown\s+filtered\s+late\s+dead letters", header), header
    assert "→ bad" not in last
    rows = [line.split() for line in last.splitlines() if re.match(r"\s+[12]\s+\d", line)]
    assert [r[:7] for r in rows] == [["1", "11", "8", "8", "3", "0", "1"],
                                     ["2", "11", "8", "8", "3", "0", "1"]], last
    assert "2 epochs · 22 in · 32 out · 6 filtered · 0 late · 2 dead letters" in last

    # 4. plurals, in every count the screens showed
    assert any("1 epoch · 11 in" in s and "1 dead letter ·" in s for _, s in shown)
    counts = [(int(n.replace(",", "")), noun) for _, s in shown
              for n, noun in re.findall(r"([\d,]+) (epochs?|checkpoints?|dead letters?)\b", s)]
    assert counts
    assert all(noun.endswith("s") == (n != 1) for n, noun in counts), counts
    assert "finished: all sources are exhausted after 2 epochs" in last
