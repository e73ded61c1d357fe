"""Job control across processes: a real `streamer run` subprocess is listed, refuses a second
run, takes savepoints on request (waiting and detached), and stops with a savepoint; the
savepoint commands and the restore dry run work on what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from fragments import live_job
from typer.testing import CliRunner

from streamer.cli.main import app
from streamer.runtime.job.control import STALE_AFTER_S, JobAlreadyRunningError, JobRegistry

runner = CliRunner()


def wait_for(predicate: Any, timeout: float = 120, what: str = "") -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_control_a_running_job_from_another_process(spark: Any, tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    path = tmp_path / "p.yaml"
    path.write_text(live_job("live-job", tmp_path, epoch="300ms", rate=400,
                             checkpoint="{interval: 1s}"))
    env = {**os.environ, "STREAMER_STORAGE": str(storage)}
    proc = subprocess.Popen([sys.executable, "-m", "streamer.cli.main", "run", str(path),
                             "--json", "--no-ui"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        epochs = 0
        deadline = time.time() + 180
        while epochs < 2 and time.time() < deadline:
            line = proc.stdout.readline()
            epochs += '"event": "epoch"' in line
        assert epochs == 2, proc.stderr.read() if proc.stderr else ""
        common = ["--storage", str(storage)]

        listed = json.loads(runner.invoke(app, ["list", *common, "--json"]).output)
        assert [(j["job"], j["state"]) for j in listed] == [("live-job", "running")]

        again = runner.invoke(app, ["run", str(path), "--storage", str(storage)])
        assert again.exit_code == 1
        assert "job 'live-job' is already running" in again.output

        result = runner.invoke(app, ["savepoint", "trigger", "live-job", *common])
        assert result.exit_code == 0, result.output
        first = result.output.strip().splitlines()[-1]
        assert (Path(first) / "_metadata").is_file()

        result = runner.invoke(app, ["savepoint", "trigger", "live-job", "--detach", *common])
        rid = result.output.strip()
        status = wait_for(lambda: "completed" in (out := runner.invoke(
            app, ["savepoint", "status", rid, *common]).output) and out, what="detached")
        assert "savepoint-" in status

        result = runner.invoke(app, ["stop", "live-job", "--savepoint", *common])
        assert result.exit_code == 0, result.output
        last = result.output.strip().splitlines()[-1]
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        finished = json.loads(out.strip().splitlines()[-1])
        assert finished["status"] == "stopped" and last in finished["reason"]
    finally:
        if proc.poll() is None:
            proc.kill()
    listed = json.loads(runner.invoke(app, ["list", *common, "--json"]).output)
    assert listed[0]["state"] == "stopped"

    saved = json.loads(runner.invoke(app, ["savepoint", "list", "live-job", *common,
                                           "--json"]).output)
    assert len(saved) == 3 and all(s["ok"] for s in saved)
    inspect = runner.invoke(app, ["savepoint", "inspect", last])
    assert inspect.exit_code == 0 and "per-second-v1" in inspect.output
    export = tmp_path / "state.jsonl"
    result = runner.invoke(app, ["savepoint", "export", last, "--operator", "per-second-v1",
                                 "-o", str(export)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(x) for x in export.read_text().splitlines()]
    entries = [r for r in rows if r["state"] == "acc"]
    assert entries, rows[:5]
    assert {tuple(r["key"]) for r in entries} <= {(f"u{i}",) for i in range(11)}, entries[:5]
    assert all(r["window_start_ms"] is not None and r["value"] for r in entries)

    dry = runner.invoke(app, ["restore", "--dry-run", last, str(path)])
    assert dry.exit_code == 0, dry.output
    assert "restore" in dry.output
    changed = tmp_path / "changed.yaml"
    changed.write_text(path.read_text().replace("tumbling: 1s", "tumbling: 2s"))
    dry = runner.invoke(app, ["restore", "--dry-run", last, str(changed)])
    assert dry.exit_code == 1
    assert "refuse" in dry.output and "the window changed" in dry.output

    result = runner.invoke(app, ["savepoint", "dispose", first])
    assert result.exit_code == 0 and not Path(first).exists()


def test_a_stale_heartbeat_is_taken_over(tmp_path: Path) -> None:
    registry = JobRegistry(str(tmp_path), "job")
    registry.claim("run-a", {})
    with pytest.raises(JobAlreadyRunningError, match="already running"):
        JobRegistry(str(tmp_path), "job").claim("run-b", {})
    record = registry.read()
    assert record is not None
    record["heartbeat_at"] = time.time() - STALE_AFTER_S - 1  # run-a died without cleanup
    (tmp_path / "job" / "job.json").write_text(json.dumps(record))
    listed = json.loads(runner.invoke(app, ["list", "--storage", str(tmp_path), "--json"]
                                      ).output)
    assert listed[0]["state"] == "dead"
    note = JobRegistry(str(tmp_path), "job").claim("run-b", {})
    assert note is not None and "taking over" in note and "run-a" in note


SLOW_START = """\
    name: spq
    job:
      epoch: 500ms
      checkpoint: {interval: 1s}
      state: {backend: rocksdb, local_dir: LOCAL}
    sources:
      - id: gen
        type: datagen
        splits: 2
        limit: 600
        rows_per_second: 300
        fields:
          user: "concat('u', cast((offset * 7 + split) % 13 as string))"
    operators:
      - id: counts
        uid: counts-v1
        input: gen
        key_by: [user]
        aggregate: {n: count()}
    sinks:
      - id: out
        type: files
        input: counts
        path: OUT
        format: jsonl
"""


def final_counts(directory: Path) -> dict[str, int]:
    """Per user, the largest count the sink received (the count of every row)."""
    final: dict[str, int] = {}
    for part in directory.glob("part-*.jsonl"):
        for line in part.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                final[row["user"]] = max(final.get(row["user"], 0), row["n"])
    return final


@pytest.mark.slow
def test_a_trigger_sent_as_a_slow_job_starts_returns_a_savepoint_that_restores(
        tmp_path: Path) -> None:
    """Issue 39's acceptance run: `streamer savepoint trigger` 1 s after `streamer run`, on
    a job held 8 s in start-up (the `starting` fail point sleeps) whose rate-limited source
    has no row at its first boundary, returns a savepoint, having said the job was starting;
    restored into another output, it counts every row exactly once."""
    from collections import Counter

    storage = tmp_path / "storage"
    path = tmp_path / "p.yaml"
    text = textwrap.dedent(SLOW_START).replace("LOCAL", str(tmp_path / "local"))
    path.write_text(text.replace("OUT", str(tmp_path / "out")))
    env = {**os.environ, "STREAMER_STORAGE": str(storage),
           "STREAMER_TEST_FAILPOINTS": "starting:0:sleep=8"}
    proc = subprocess.Popen([sys.executable, "-m", "streamer.cli.main", "run", str(path),
                             "--json", "--no-ui"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    common = ["--storage", str(storage)]
    try:
        time.sleep(1)
        # (on a loaded machine the CLI may take longer than 1 s to claim the job)
        wait_for(lambda: JobRegistry(str(storage), "spq").read(), 30, "the job's claim")
        result = runner.invoke(app, ["savepoint", "trigger", "spq", *common, "--timeout",
                                     "300"])
        assert result.exit_code == 0, result.output
        assert "job spq: starting; waiting for it to take the savepoint" in result.output
        saved = result.stdout.strip().splitlines()[-1]
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
    finished = json.loads(out.strip().splitlines()[-1])
    assert finished["status"] == "finished" and finished["savepoints"] == [saved], finished
    want = dict(Counter(f"u{(o * 7 + s) % 13}" for s in range(2) for o in range(600)))
    assert final_counts(tmp_path / "out") == want

    path.write_text(text.replace("OUT", str(tmp_path / "restored")))
    restored = subprocess.run([sys.executable, "-m", "streamer.cli.main", "restore", saved,
                               str(path), "--json", "--no-ui"], capture_output=True,
                              text=True, env={**env, "STREAMER_TEST_FAILPOINTS": ""},
                              cwd=tmp_path, timeout=300, check=False)
    assert restored.returncode == 0, restored.stderr
    assert final_counts(tmp_path / "restored") == want
