"""The edges of a job's life, with real `streamer run` processes on real Spark: two runs of
one job started at once (one runs, the other is refused naming it), and SIGTERM (a graceful
stop with a final checkpoint, or a cancel past `job.shutdown_timeout`)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from streamer_process import SCRUBBED, STREAMER, FilesOutput, crash, quick_jvm

from streamer.runtime.cluster.standalone import session_members

#: Every test runs `streamer run` in processes of its own (a JVM each).
pytestmark = pytest.mark.slow

PIPELINE = """
name: lifecycle
job:
  epoch: 500ms
  checkpoint: {{interval: {interval}}}
  shutdown_timeout: {shutdown_timeout}
  heartbeat_timeout: {heartbeat_timeout}
  cancel_timeout: {cancel_timeout}
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


def write_job(root: Path, shutdown_timeout: str = "60s", interval: str = "1ms",
              spark: str = "", heartbeat_timeout: str = "30s",
              cancel_timeout: str = "15s") -> Path:
    path = root / "job.yaml"
    path.write_text(PIPELINE.format(root=root, shutdown_timeout=shutdown_timeout,
                                    interval=interval, heartbeat_timeout=heartbeat_timeout,
                                    cancel_timeout=cancel_timeout) + spark)
    return path


class Proc:
    """A `streamer run --json` in a session of its own; its events read from a file."""

    def __init__(self, pipeline: Path, storage: Path, name: str, *args: str,
                 **extra_env: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in SCRUBBED} | extra_env
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


def no_process_left(sid: int, timeout: float = 90) -> bool:
    """Whether every process of the run's session (its JVM too) ended by itself."""
    deadline = time.monotonic() + timeout
    while session_members(sid) and time.monotonic() < deadline:
        time.sleep(0.5)
    return not session_members(sid)


def test_sigterm_stops_at_the_boundary_with_a_final_checkpoint(tmp_path: Path) -> None:
    """SIGTERM to the whole process group, as a service manager sends it: the JVM, in a
    group of its own, must not get it and die under the graceful stop."""
    storage = tmp_path / "storage"
    # Checkpoints an hour apart: the only one is the final one the stop takes.
    run = Proc(write_job(tmp_path, interval="1h"), storage, "run")
    try:
        run.wait_for(lambda events: sum(e.get("event") == "epoch" for e in events) >= 3)
        os.killpg(run.proc.pid, signal.SIGTERM)
        code = run.proc.wait(timeout=180)
        left = no_process_left(run.proc.pid)
    finally:
        crash(run.proc.pid)
    assert code == 0, run.describe()
    assert left, "the run's JVM outlived it"
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
    # The stop's final checkpoint (the only one: an hour apart) stalls far past the timeout.
    run = Proc(write_job(tmp_path, shutdown_timeout="2s", interval="1h"), storage, "run",
               STREAMER_TEST_FAILPOINTS="after-snapshot:0:sleep=600")
    try:
        run.wait_for(lambda events: sum(e.get("event") == "epoch" for e in events) >= 2)
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


def _address(hex_address: str) -> str:
    """An address of /proc/net/tcp{,6} as text (4-byte words in host byte order)."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def listening(pids: set[int]) -> list[tuple[str, int]]:
    """The (address, port) every TCP socket of `pids` listens on."""
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # LISTEN
                address, port = local.split(":")
                found.append((_address(address), int(port, 16)))
    return found


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


AQE_RULE = "org.apache.spark.sql.execution.adaptive.DynamicJoinSelection"


def test_the_driver_listens_on_loopback_only(tmp_path: Path) -> None:
    """The UI (on, as by default), the RPC and block manager, the Py4J gateway, the Python
    workers: every listening socket of the run is on loopback, and the UI has no kill links.
    A `spark:` block's AQE rule exclusions are merged with the one the engine needs."""
    storage = tmp_path / "storage"
    run = Proc(write_job(tmp_path, spark=f"  spark.sql.adaptive.optimizer.excludedRules: "
                                        f"{AQE_RULE}\n"), storage, "run")
    try:
        run.wait_for(lambda events: sum(e.get("event") == "epoch" for e in events) >= 2)
        (started,) = (e for e in run.events() if e.get("event") == "started")
        sockets = listening(session_members(run.proc.pid))
        ui_port = int(started["ui"].rsplit(":", 1)[1].strip("/"))
        base = f"http://127.0.0.1:{ui_port}/api/v1/applications"
        with urllib.request.urlopen(base, timeout=30) as response:
            app = json.load(response)[0]["id"]
        with urllib.request.urlopen(f"{base}/{app}/environment", timeout=30) as response:
            properties = dict(json.load(response)["sparkProperties"])
    finally:
        crash(run.proc.pid)
        run.proc.wait()
    assert ui_port in {port for _, port in sockets}, sockets
    assert len(sockets) >= 3, sockets  # the UI, the driver's RPC, its block manager at least
    assert all(loopback(address) for address, _ in sockets), sockets
    assert properties["spark.ui.killEnabled"] == "false"
    rules = properties["spark.sql.adaptive.optimizer.excludedRules"].split(",")
    assert AQE_RULE in rules
    assert "org.apache.spark.sql.execution.adaptive.AQEPropagateEmptyRelation" in rules


def test_listing_a_non_loopback_ui_is_seen(tmp_path: Path) -> None:
    """The check above can fail: a socket on every address is not loopback."""
    assert not loopback(_address("00000000"))
    assert loopback(_address("0100007F"))
    assert loopback(_address("00000000000000000000000001000000"))  # ::1


def test_a_run_taken_over_stops_without_committing(tmp_path: Path) -> None:
    """A run paused past its `job.heartbeat_timeout` (SIGSTOP) is taken over by a newer claim;
    resumed, it must notice, write nothing more to the registry, commit no checkpoint and
    exit 1. Before the timeout the paused run still counts as alive and is not taken over."""
    from streamer.runtime.job.control import JobAlreadyRunningError, JobRegistry

    storage = tmp_path / "storage"
    # Checkpoint every epoch; epoch 3 waits 20 s at its start, where the pause finds it.
    run = Proc(write_job(tmp_path, heartbeat_timeout="4s"), storage, "run",
               STREAMER_TEST_FAILPOINTS="epoch-start:3:sleep=20")
    try:
        run.wait_for(lambda events: any(e.get("event") == "epoch" and e.get("epoch", 0) >= 2
                                        for e in events))
        os.kill(run.proc.pid, signal.SIGSTOP)  # its heartbeat thread stops with it
        taker = JobRegistry(str(storage), "lifecycle")
        with pytest.raises(JobAlreadyRunningError, match="wait 4 s after it died"):
            taker.claim("run-b", {"file": "elsewhere.yaml"})
        time.sleep(4 + 1)
        before, _ = newest_checkpoint(storage)
        note = taker.claim("run-b", {"file": "elsewhere.yaml"})
        assert note and "taking over" in note, note
        os.kill(run.proc.pid, signal.SIGCONT)
        code = run.end()
    finally:
        crash(run.proc.pid)
    assert code == 1, run.describe()
    message = " ".join(run.err.read_text().split())
    assert "lost its claim" in message and "run-b" in message, message
    assert "Traceback" not in message
    assert newest_checkpoint(storage)[0] == before  # nothing committed after the takeover
    record = taker.read()
    assert record is not None and record["run_id"] == "run-b" and record["status"] == "running"


def test_sigterm_during_start_up_stops_cleanly(tmp_path: Path) -> None:
    """SIGTERM (to the group) once the job is claimed, while Spark starts: a clear message,
    no epoch, the job `stopped`, no traceback and no JVM left behind."""
    storage = tmp_path / "storage"
    run = Proc(write_job(tmp_path, shutdown_timeout="300s"), storage, "run")
    try:
        deadline = time.monotonic() + 120
        while not (storage / "lifecycle" / "job.json").exists():
            assert run.proc.poll() is None and time.monotonic() < deadline, run.describe()
            time.sleep(0.05)
        os.killpg(run.proc.pid, signal.SIGTERM)
        code = run.proc.wait(timeout=240)
        left = no_process_left(run.proc.pid)
    finally:
        crash(run.proc.pid)
    assert code == 0, run.describe()
    texts = " ".join(e.get("text", "") for e in run.events())
    assert "during start-up" in texts, run.events()
    assert not [e for e in run.events() if e.get("event") == "epoch"]
    assert "Traceback" not in run.err.read_text()
    assert listed(storage)["state"] == "stopped"
    assert left, "the run's JVM outlived it"


def test_a_cancel_that_hangs_exits_143_at_once(tmp_path: Path) -> None:
    """The stop stalls past job.shutdown_timeout, and the cancel after it stalls too: the
    process exits 143 by itself once `job.cancel_timeout` (here 3 s) passed."""
    cancel_timeout = 3
    storage = tmp_path / "storage"
    run = Proc(write_job(tmp_path, shutdown_timeout="2s", interval="1h",
                         cancel_timeout=f"{cancel_timeout}s"), storage, "run",
               STREAMER_TEST_FAILPOINTS="after-snapshot:0:sleep=600,cancelling:0:sleep=600")
    try:
        run.wait_for(lambda events: sum(e.get("event") == "epoch" for e in events) >= 2)
        began = time.monotonic()
        run.proc.send_signal(signal.SIGTERM)
        code = run.proc.wait(timeout=180)
        took = time.monotonic() - began
        left = no_process_left(run.proc.pid)
    finally:
        crash(run.proc.pid)
    assert code == 143, run.describe()
    assert 2 + cancel_timeout <= took < 2 + cancel_timeout + 60, took
    message = run.err.read_text()
    assert f"did not end within {cancel_timeout} s (job.cancel_timeout)" in message, message
    assert "Traceback" not in message
    assert listed(storage)["state"] == "cancelled"
    assert left, "the run's JVM outlived it"
