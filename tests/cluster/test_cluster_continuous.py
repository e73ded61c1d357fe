"""`job.execution.mode: continuous` on the real 2-worker standalone cluster (issue 36): the
gang's source subtask and keyed subtask are one long-running task on each worker, so the
records and barriers between them cross executors over Arrow Flight, as between machines.

- the committed output equals the epoch mode's on `local[*]` for the same pipeline and input;
- a worker SIGKILLed mid-stream (its JVM, executor and Python workers) fails the gang; the job
  restarts it from its last completed checkpoint once the worker is back (as a supervisor
  restarts a dead machine's worker: the gang is scheduled only whole, on one slot a subtask),
  and the committed output is still exactly the reference: nothing lost, nothing twice.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fragments import parquet_kvts_job
from streamer_process import FilesOutput, diff, quick_jvm, run_streamer
from test_cluster_jobs import submit_args

from streamer.runtime.cluster.standalone import StandaloneCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TS = pa.timestamp("us", tz="UTC")
FILES, ROWS = 24, 5000


def write_input(root: Path) -> Path:
    """Parquet files of (k, v, ts), event times rising through the files with some
    disorder; some v negative (the filter drops them)."""
    rnd = random.Random(11)
    directory = root / "in"
    directory.mkdir(parents=True)
    for f in range(FILES):
        base = f * ROWS * 10
        pq.write_table(pa.table({
            "k": pa.array([f"k{rnd.randrange(40)}" for _ in range(ROWS)], pa.string()),
            "v": pa.array([rnd.randint(-3, 20) for _ in range(ROWS)], pa.int64()),
            "ts": pa.array([(base + i * 10 + rnd.randint(0, 40)) * 1000 for i in range(ROWS)],
                           pa.int64()).cast(TS)}), directory / f"part-{f:02d}.parquet")
    return directory


def pipeline(root: Path, mode: str, data: Path) -> Path:
    """A filter and a tumbling window of count and sum per key into a jsonl files sink, at
    parallelism 1: one source and one keyed subtask, a slot each of the two workers."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "job.yaml"
    path.write_text(parquet_kvts_job(
        "cluster-gang", root / "storage", data, root / "out", mode=mode, parallelism=1,
        execution="continuous_batch_rows: 500", restart="{attempts: 3, delay: 1s}")
        + quick_jvm())
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Counter[str]]:
    """The input, and the epoch mode's committed output over it on `local[*]`."""
    root = tmp_path_factory.mktemp("continuous-reference")
    data = write_input(root)
    run = run_streamer(pipeline(root / "epochs", "epochs", data), "--master", "local[*]")
    assert run.returncode == 0 and run.finished, run.describe()
    want = FilesOutput(root / "epochs" / "out").committed()
    assert sum(json.loads(r)["n"] for r in want.elements()) > FILES * ROWS * 0.8
    return data, want


def test_a_continuous_job_on_the_cluster_commits_the_epoch_modes_output(
        standalone: StandaloneCluster, reference: tuple[Path, Counter[str]],
        tmp_path: Path) -> None:
    data, want = reference
    run = run_streamer(pipeline(tmp_path, "continuous", data), *submit_args(standalone),
                       env={"STREAMER_STATE_DIR": str(tmp_path / "local")})
    assert run.returncode == 0 and run.finished and run.finished["status"] == "finished", \
        run.describe()
    assert run.finished["records_in"] == FILES * ROWS
    started = next(e for e in run.events if e.get("event") == "started")
    assert started["master"] == standalone.master_url
    assert len(run.checkpoints("completed")) >= 2
    got = FilesOutput(tmp_path / "out")
    assert got.committed() == want, diff(got.committed(), want)
    assert got.leftovers() == []


def test_a_worker_killed_mid_stream_restarts_the_gang_with_the_same_output(
        standalone: StandaloneCluster, reference: tuple[Path, Counter[str]],
        tmp_path: Path) -> None:
    data, want = reference
    killed: list[float] = []

    def kill_after_checkpoint_1(event: dict[str, Any] | None, elapsed: float) -> bool:
        if (not killed and event is not None and event.get("event") == "checkpoint"
                and event.get("status") == "completed"):
            standalone.kill_worker(1)  # its JVM, executor and Python workers, SIGKILL
            killed.append(elapsed)
            standalone.restart_worker(1)  # (the gang needs both slots again)
        return False

    try:
        run = run_streamer(pipeline(tmp_path, "continuous", data), *submit_args(standalone),
                           env={"STREAMER_STATE_DIR": str(tmp_path / "local")},
                           watch=kill_after_checkpoint_1)
    finally:
        if standalone.worker_procs[1] is None:  # (killed, and its restart failed)
            standalone.restart_worker(1)
    assert killed, "the worker was never killed"
    assert run.returncode == 0 and run.finished and run.finished["status"] == "finished", \
        run.describe()
    started = next(e for e in run.events if e.get("event") == "started")
    assert started["master"] == standalone.master_url
    assert run.finished["restarts"] >= 1, run.finished
    assert any(m.startswith("resuming from checkpoint") for m in run.messages()), \
        run.messages()
    got = FilesOutput(tmp_path / "out")
    assert got.committed() == want, diff(got.committed(), want)
    assert got.leftovers() == []
    print(f"worker killed at {killed[0]:.1f}s; restarts {run.finished['restarts']}; "
          f"messages: {run.messages()}")


def test_a_gang_larger_than_the_cluster_is_refused_with_the_fix(
        standalone: StandaloneCluster, reference: tuple[Path, Counter[str]],
        tmp_path: Path) -> None:
    """Parallelism 2 is 2 source and 2 keyed subtasks: 4 slots, of the cluster's 2; refused
    once they stayed short for `job.slot_timeout`."""
    data, _ = reference
    path = pipeline(tmp_path, "continuous", data)
    path.write_text(path.read_text().replace("  parallelism: 1",
                                             "  parallelism: 2\n  slot_timeout: 3s"))
    run = run_streamer(path, *submit_args(standalone),
                       env={"STREAMER_STATE_DIR": str(tmp_path / "local")})
    assert run.returncode == 2 and run.finished and run.finished["status"] == "failed", \
        run.describe()
    assert ("its gang needs a task slot for each of its 2 source and 2 keyed subtasks (4), "
            "but the executors offer 2; set job.parallelism lower") in run.finished["reason"]
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())
