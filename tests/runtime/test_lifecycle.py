"""The edges of a job's life, with real `streamer run` processes on real Spark: two runs of
one job started at once (one runs, the other is refused naming it), and SIGTERM (a graceful
stop with a final checkpoint, or a cancel past `job.shutdown_timeout`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from streamer_process import SCRUBBED, STREAMER, FilesOutput, crash, quick_jvm

PIPELINE = """
name: lifecycle
job:
  epoch: 500ms
  checkpoint: {{interval: {interval}}}
  shutdown_timeout: {shutdown_timeout}
sources:
  - id: ticks
    type: datagen
    splits: 2
    rows_per_second: 40
    fields: {{s: "split", o: "offset"}}
sinks:
  - id: out
    type: files
    input: ticks
    path: {root}/out
    format: jsonl
""" + quick_jvm().replace("{", "{{").replace("}", "}}")


def write_job(root: Path, shutdown_timeout: str = "60s", interval: str = "1ms") -> Path:
    path = root / "job.yaml"
    path.write_text(PIPELINE.format(root=root, shutdown_timeout=shutdown_timeout,
                                    interval=interval))
    return path


class Proc:
    """A `streamer run --json` in a session of its own; its events read from a file."""

    def __init__(self, pipeline: Path, storage: Path, name: str, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
        self.out = pipeline.parent / f"{name}.jsonl"
        self.err = pipeline.parent / f"{name}.stderr"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [str(STREAMER), "run", str(pipeline), "--json", "--storage", str(storage),
                 *args], stdout=out, stderr=err, cwd=pipeline.parent, env=env,
                start_new_session=True)

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.read_text().splitlines()
                if line.startswith("{")]

    def wait_for(self, check: Any, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not check(self.events()):
            assert self.proc.poll() is None, self.describe()
            assert time.monotonic() < deadline, self.describe()
            time.sleep(0.2)

    def describe(self) -> str:
        return f"exit {self.proc.poll()}; stderr:\n{self.err.read_text()[-3000:]}"

    def end(self, timeout: float = 180) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            crash(self.proc.pid)  # nothing of the run outlives the test


def completed(n: int) -> Any:
    return lambda events: sum(e.get("event") == "checkpoint" and e.get("status") == "completed"
                              for e in events) >= n


def listed(storage: Path) -> dict[str, Any]:
    out = subprocess.run([str(STREAMER), "list", "--storage", str(storage), "--json"],
                         capture_output=True, text=True, check=True)
    (job,) = json.loads(out.stdout)
    return job


def newest_checkpoint(storage: Path) -> tuple[int, dict[str, Any]]:
    root = storage / "lifecycle" / "checkpoints"
    done = [int(p.parent.name.removeprefix("chk-")) for p in root.glob("chk-*/_metadata")]
    newest = max(done)
    return newest, json.loads((root / f"chk-{newest}" / "_metadata").read_text())["metadata"]


def test_sigterm_stops_at_the_boundary_with_a_final_checkpoint(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    # Checkpoints an hour apart: the only one is the final one the stop takes.
    run = Proc(write_job(tmp_path, interval="1h"), storage, "run")
    try:
        run.wait_for(lambda events: sum(e.get("event") == "epoch" for e in events) >= 3)
        run.proc.send_signal(signal.SIGTERM)
        code = run.end()
    finally:
        crash(run.proc.pid)
    assert code == 0, run.describe()
    finished = [e for e in run.events() if e.get("event") == "finished"]
    assert finished and finished[-1]["status"] == "stopped", run.events()[-3:]
    assert listed(storage)["state"] == "stopped"
    _, metadata = newest_checkpoint(storage)
    epochs = [e["epoch"] for e in run.events() if e.get("event") == "epoch"]
    assert metadata["epoch"] == max(epochs) >= 4  # the stop's own checkpoint, at the end
    assert any("SIGTERM" in e.get("text", "") for e in run.events())
    (offsets,) = metadata["offsets"].values()
    want = Counter(json.dumps({"o": o, "s": int(split)}, sort_keys=True)
                   for split, end in offsets.items() for o in range(int(end)))
    output = FilesOutput(tmp_path / "out")
    assert output.committed() == want  # exactly what the final checkpoint covers
    assert sum(want.values()) > 0 and output.leftovers() == []


def test_sigterm_cancels_past_the_shutdown_timeout(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    run = Proc(write_job(tmp_path, shutdown_timeout="1ms"), storage, "run")
    try:
        run.wait_for(completed(1))
        run.proc.send_signal(signal.SIGTERM)
        code = run.end()
    finally:
        crash(run.proc.pid)
    assert code == 143, run.describe()
    job = listed(storage)
    assert job["state"] == "cancelled" and "shutdown_timeout" in job["reason"], job


def test_two_runs_started_at_once_one_runs(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    pipeline = write_job(tmp_path)
    runs = [Proc(pipeline, storage, f"run-{i}") for i in range(2)]
    try:
        refused = None
        deadline = time.monotonic() + 240
        while refused is None:
            refused = next((r for r in runs if r.proc.poll() is not None), None)
            assert time.monotonic() < deadline, [r.describe() for r in runs]
            time.sleep(0.1)
        (winner,) = (r for r in runs if r is not refused)
        assert refused.proc.returncode == 1, refused.describe()
        winner.wait_for(lambda events: any(e.get("event") == "epoch" for e in events))
        holder = listed(storage)
        message = refused.err.read_text()
        assert "already running" in message and holder["run_id"] in message, message
        assert f"pid {winner.proc.pid}" in message, message
        assert holder["pid"] == winner.proc.pid and holder["state"] == "running"
    finally:
        for run in runs:
            crash(run.proc.pid)
            run.proc.wait()
