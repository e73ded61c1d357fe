"""The job registry: a second run of a live job is refused; a dead one is taken over, at once
when its process on this machine is gone (a killed run is restarted without waiting for its
heartbeat to go stale)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from streamer.runtime.job.control import JobAlreadyRunningError, JobRegistry, state_of

CLAIM = """
import sys, time
from streamer.runtime.job.control import JobRegistry
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


@pytest.mark.slow  # (it waits 2.5 s for heartbeats)
def test_the_run_s_heartbeat_timeout_decides_when_it_is_dead(tmp_path: Path) -> None:
    """`job.heartbeat_timeout` travels in the record: a reader without the pipeline file (the
    CLI, a new run) judges each run by its own bound; the heartbeat beats within it."""
    registry = JobRegistry(str(tmp_path), "job", heartbeat_timeout_s=1.5)
    registry.claim("run-a", {})
    record = registry.read()
    assert record is not None and record["heartbeat_timeout_s"] == 1.5
    registry.start_heartbeat()
    try:
        time.sleep(2.5)  # past the bound: only the heartbeat (every 0.5 s) keeps it alive
        record = registry.read()
        assert record is not None and state_of(record) == "running"
    finally:
        registry.close("stopped")
    record.update(host="elsewhere")  # (its process cannot be checked from here)
    assert state_of(record, now=record["heartbeat_at"] + 1.4) == "running"
    assert state_of(record, now=record["heartbeat_at"] + 1.6) == "dead"
    del record["heartbeat_timeout_s"]  # a record from before the setting: the default, 30 s
    assert state_of(record, now=record["heartbeat_at"] + 29) == "running"
    assert state_of(record, now=record["heartbeat_at"] + 31) == "dead"


def _race(storage: str, contenders: int, round_: int) -> tuple[list[str], list[str]]:
    """`contenders` threads claim the job at once; the run ids that won and the refusals."""
    barrier = threading.Barrier(contenders)
    done = threading.Barrier(contenders)
    won: list[str] = []
    refused: list[str] = []

    def contend(i: int) -> None:
        run_id = f"run-{round_}-{i}"
        registry = JobRegistry(storage, "job")
        barrier.wait()
        try:
            registry.claim(run_id, {})
        except JobAlreadyRunningError as exc:
            refused.append(str(exc))
            done.wait()
        else:
            won.append(run_id)
            done.wait()  # still running while the others claim
            registry.close("finished")  # the next round may claim it again

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return won, refused


def test_simultaneous_claims_have_exactly_one_winner(tmp_path: Path) -> None:
    for round_ in range(8):
        won, refused = _race(str(tmp_path), 4, round_)
        assert len(won) == 1, f"round {round_}: {won} all claimed the job"
        assert len(refused) == 3
        # The refused name the winner, even when it had not written job.json yet.
        assert all(won[0] in text and str(os.getpid()) in text for text in refused), refused
    claims = sorted(p.name for p in (tmp_path / "job" / "claims").iterdir())
    assert len(claims) == 3, claims  # older generations are pruned


CONTEND = """
import sys, time
from streamer.runtime.job.control import JobAlreadyRunningError, JobRegistry
registry = JobRegistry(sys.argv[1], "job")
while time.time() < float(sys.argv[2]):
    pass
try:
    registry.claim(sys.argv[3], {})
except JobAlreadyRunningError as exc:
    print("refused", exc, flush=True)
else:
    print("claimed", flush=True)
    time.sleep(float(sys.argv[2]) + 3 - time.time())
"""


@pytest.mark.slow
def test_simultaneous_claims_from_processes_have_one_winner(tmp_path: Path) -> None:
    for round_ in range(3):
        start = time.time() + 1.5  # every process spins until then, then claims
        children = [subprocess.Popen([sys.executable, "-c", CONTEND, str(tmp_path),
                                      str(start), f"run-{round_}-{i}"],
                                     stdout=subprocess.PIPE, text=True) for i in range(4)]
        outputs = [child.communicate(timeout=60)[0] for child in children]
        claimed = [out for out in outputs if out.startswith("claimed")]
        assert len(claimed) == 1, outputs
        assert sum(out.startswith("refused") for out in outputs) == 3, outputs
        # The winner exited without closing: the next round takes it over (pid gone).


def test_exclusive_creation_on_a_non_local_store() -> None:
    from streamer.storage import Storage

    storage = Storage(f"memory://claims-{uuid.uuid4().hex}")
    assert storage.create_exclusive("claims/1.json", b"a")
    assert not storage.create_exclusive("claims/1.json", b"b")
    assert storage.read_bytes("claims/1.json") == b"a"


def test_a_client_waiting_on_a_job_that_dies_hears_it_at_once(tmp_path: Path) -> None:
    """A request the job never takes (its process was killed) is not waited for until the
    timeout: the client says the job died, and while it lived, that it was starting."""
    from streamer.runtime.job.control import ControlChannel, JobControlError

    child = subprocess.Popen([sys.executable, "-c", CLAIM, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    channel = ControlChannel(str(tmp_path), "job")
    seen: list[str] = []
    try:
        assert child.stdout is not None and child.stdout.readline() == "claimed\n"
        rid = channel.request("savepoint", generation=1, run_id="run-a")
        assert channel.wait(rid, timeout_s=0.5, poll_s=0.1, progress=seen.append) is None
        assert seen == ["starting"]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    started = time.monotonic()
    with pytest.raises(JobControlError, match=r"job 'job' died \(run run-a .*before request "
                       r".* was taken; send it again"):
        channel.wait(rid, timeout_s=60)
    assert time.monotonic() - started < 5
