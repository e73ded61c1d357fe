"""The job registry: a second run of a live job is refused; a dead one is taken over, at once
when its process on this machine is gone (a killed run is restarted without waiting for its
heartbeat to go stale)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamer.runtime.control import JobAlreadyRunningError, JobRegistry, state_of

CLAIM = """
import sys, time
from streamer.runtime.control import JobRegistry
JobRegistry(sys.argv[1], "job").claim("run-a", {})
print("claimed", flush=True)
time.sleep(600)
"""


def test_a_killed_run_on_this_machine_is_taken_over_at_once(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", CLAIM, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "claimed\n"
        with pytest.raises(JobAlreadyRunningError, match="already running"):
            JobRegistry(str(tmp_path), "job").claim("run-b", {})
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    record = JobRegistry(str(tmp_path), "job").read()
    assert record is not None and time.time() - record["heartbeat_at"] < 30  # still fresh
    assert state_of(record) == "dead"
    note = JobRegistry(str(tmp_path), "job").claim("run-b", {})
    assert note is not None and "taking over" in note and "run-a" in note


@pytest.mark.parametrize("where", [{"host": "elsewhere"}, {"pid_namespace": "pid:[1]"}])
def test_a_fresh_run_whose_process_cannot_be_checked_here_is_alive(
        tmp_path: Path, where: dict[str, str]) -> None:
    registry = JobRegistry(str(tmp_path), "job")
    registry.claim("run-a", {})
    record = registry.read()
    assert record is not None and record["host"] == socket.gethostname()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    record.update(pid=int(gone.stdout), **where)  # a pid that no process here has
    (tmp_path / "job" / "job.json").write_text(json.dumps(record))
    assert state_of(record) == "running"
    with pytest.raises(JobAlreadyRunningError, match="already running"):
        JobRegistry(str(tmp_path), "job").claim("run-b", {})
