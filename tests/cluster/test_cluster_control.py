"""Job control of a job submitted to the standalone cluster, from another process through the
shared storage: `list`, `checkpoint list`, `savepoint trigger` and `stop` on one run, then the
job resumes from its checkpoint on the cluster and is cancelled with `cancel`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fragments import live_job
from streamer_process import run_streamer
from test_cluster_jobs import submit_args
from typer.testing import CliRunner

from streamer.cli.main import app
from streamer.runtime.cluster.standalone import StandaloneCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_list_checkpoints_savepoint_stop_and_cancel_a_submitted_job(
        standalone: StandaloneCluster, tmp_path: Path) -> None:
    runner = CliRunner()
    storage = tmp_path / "storage"
    common = ["--storage", str(storage)]
    path = tmp_path / "live.yaml"
    path.write_text(live_job("live-cluster-job", tmp_path, epoch="500ms", rate=200))
    seen: dict[str, Any] = {}

    def cli(*args: str) -> Any:
        return runner.invoke(app, [*args, *common])

    def control(event: dict[str, Any] | None, elapsed: float) -> bool:
        if event is None or event.get("event") != "epoch" or event["epoch"] < 3 or seen:
            return False
        seen["list"] = json.loads(cli("list", "--json").output)
        seen["checkpoints"] = json.loads(cli("checkpoint", "list", "live-cluster-job",
                                             "--json").output)
        seen["savepoint"] = cli("savepoint", "trigger", "live-cluster-job")
        seen["stop"] = cli("stop", "live-cluster-job")
        return False

    env = {"STREAMER_STORAGE": str(storage)}
    first = run_streamer(path, *submit_args(standalone), watch=control, env=env,
                         timeout=240)
    assert seen, first.describe()
    assert [(j["job"], j["state"]) for j in seen["list"]] == [("live-cluster-job", "running")]
    assert seen["list"][0]["master"] == standalone.master_url
    assert seen["checkpoints"], "no checkpoint listed"
    assert seen["savepoint"].exit_code == 0, seen["savepoint"].output
    savepoint = Path(seen["savepoint"].output.strip().splitlines()[-1])
    assert (savepoint / "_metadata").is_file()
    assert seen["stop"].exit_code == 0, seen["stop"].output
    assert first.returncode == 0 and first.finished and first.finished["status"] == "stopped", \
        first.describe()
    assert json.loads(cli("list", "--json").output)[0]["state"] == "stopped"

    cancelled: dict[str, Any] = {}

    def cancel(event: dict[str, Any] | None, elapsed: float) -> bool:
        if event is not None and event.get("event") == "epoch" and not cancelled:
            cancelled["result"] = cli("cancel", "live-cluster-job")
        return False

    second = run_streamer(path, *submit_args(standalone), watch=cancel, env=env, timeout=240)
    assert cancelled and cancelled["result"].exit_code == 0, cancelled
    assert second.finished and second.finished["status"] == "cancelled", second.describe()
    assert second.finished["restored_from"] is not None  # resumed from the first run's
    assert json.loads(cli("list", "--json").output)[0]["state"] == "cancelled"


def test_a_sigterm_to_a_submitting_streamer_stops_the_driver_and_frees_the_cluster(
        standalone: StandaloneCluster, tmp_path: Path) -> None:
    """A service manager stops `streamer run --submit` with SIGTERM to its own pid: the
    driver below spark-submit gets it and stops gracefully, as a local run does, and the
    application ends (before, the driver ran on and held the cluster's cores)."""
    import os
    import signal
    import subprocess
    import time

    from streamer_process import STREAMER, crash

    path = tmp_path / "live.yaml"
    path.write_text(live_job("sigterm-cluster-job", tmp_path, epoch="500ms", rate=200))
    proc = subprocess.Popen(
        [str(STREAMER), "run", str(path), "--json", "--no-ui", *submit_args(standalone),
         "--storage", str(tmp_path / "storage")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=tmp_path,
        start_new_session=True)
    events = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            event = json.loads(line) if line.startswith("{") else {}
            events.append(event)
            if event.get("event") == "epoch" and event["epoch"] >= 2 and proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)  # this process alone, not its group
                break
        rest = proc.communicate(timeout=120)[0]
        events += [json.loads(x) for x in rest.splitlines() if x.startswith("{")]
    finally:
        crash(proc.pid)
    finished = next((e for e in events if e.get("event") == "finished"), None)
    assert proc.returncode == 0 and finished and finished["status"] == "stopped", events[-3:]
    deadline = time.monotonic() + 30
    while (state := standalone.state()) and [
            a for a in state.get("activeapps", []) if a["name"] == "streamer:sigterm-cluster-job"]:
        assert time.monotonic() < deadline, state["activeapps"]
        time.sleep(0.5)
