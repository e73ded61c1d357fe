"""Jobs on a real 2-worker Spark standalone cluster through `streamer run --submit`, compared
with the same pipeline on `local[*]`: the windowed example, a worker SIGKILLed in the middle of
a job, and driver crashes at the checkpoint fail points (exactly-once). The committed output
must be identical, row for row."""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fragments import crash_job, files_sink, section, write_pipeline
from streamer_process import FilesOutput, Run, diff, quick_jvm, run_streamer

from streamer.checkpoint.checkpoint_metadata import CheckpointStore
from streamer.runtime.cluster.standalone import StandaloneCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

EXAMPLE = Path(__file__).parents[2] / "pipelines" / "clicks_per_user.yaml"
#: The executors' JVMs start and run small jobs faster with C1 and the serial GC (as
#: `quick_jvm` does for the driver); it changes speed, not results.
EXECUTOR_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def submit_args(cluster: StandaloneCluster) -> list[str]:
    from streamer.runtime.cluster.spark import DEFAULT_CONF

    executor = f"{DEFAULT_CONF['spark.executor.extraJavaOptions']} {EXECUTOR_JVM}"
    return ["--submit", "--master", cluster.master_url,
            "--conf", f"spark.executor.extraJavaOptions={executor}"]


def epochs(run: Run) -> list[dict[str, Any]]:
    return [e for e in run.events if e.get("event") == "epoch"]


def executors_used(local_dir: Path) -> list[str]:
    """The per-executor local recovery directories left under `local_dir`."""
    return sorted(p.name for p in (local_dir / ".local-recovery").glob("executor-*"))


def test_windowed_example_on_the_cluster_equals_local(standalone: StandaloneCluster,
                                                      tmp_path: Path) -> None:
    def run(mode: str, args: list[str]) -> tuple[Run, Path]:
        root = tmp_path / mode
        root.mkdir()
        pipeline = root / EXAMPLE.name
        shutil.copy(EXAMPLE, pipeline)
        return run_streamer(pipeline, *args, "--storage", str(root / "storage"),
                            env={"STREAMER_STATE_DIR": str(root / "local")}), root

    with ThreadPoolExecutor(2) as pool:
        on_local = pool.submit(run, "local", ["--master", "local[*]"])
        on_cluster = pool.submit(run, "cluster", submit_args(standalone))
        (local, local_root), (cluster, cluster_root) = on_local.result(), on_cluster.result()
    for r in (local, cluster):
        assert r.returncode == 0 and r.finished and r.finished["status"] == "finished", \
            r.describe()
    started = next(e for e in cluster.events if e.get("event") == "started")
    assert started["master"] == standalone.master_url
    for sink in ("clicks_per_user", "clicks_too_late"):
        want = FilesOutput(local_root / "out" / sink).committed()
        got = FilesOutput(cluster_root / "out" / sink).committed()
        assert sum(want.values()) > 50
        assert got == want, f"{sink}: {diff(got, want)}"
    # Both executors ran keyed subtasks (each with its own state directories, removed at
    # the end); on the cluster every epoch is a checkpoint.
    ran_on = {x for e in epochs(cluster) for x in e["executors"]}
    assert len(ran_on) == 2, ran_on
    assert not [e for e in epochs(local) if e["executors"]]
    assert executors_used(cluster_root / "local") == []
    assert all(e["checkpoint_id"] is not None for e in epochs(cluster))
    moved = sum(e["moves"] for e in epochs(cluster))
    restores = sum(e["restores"] for e in epochs(cluster))
    assert restores >= moved  # every subtask that moved restored its state
    print(f"cluster: {len(epochs(cluster))} epochs, {moved} subtask moves, "
          f"{restores} restores")


# ------------------------------------------------------------------------ crash pipeline
JOB = "cluster-crash"
#: 10 epochs of data, the last of which also ends the input (every window fires).
EPOCHS = 10


def write_job(root: Path, backend: str = "rocksdb") -> Path:
    return write_pipeline(root, crash_job(JOB, root, backend=backend, attempts=3) + section(
        "sinks", files_sink("per_window", root / "out")) + quick_jvm())


def local_reference(root: Path) -> Counter[str]:
    """The job's committed output from one uninterrupted run on `local[*]`."""
    run = run_streamer(write_job(root), "--master", "local[*]")
    assert run.returncode == 0 and run.finished, run.describe()
    assert run.finished["epochs"] == EPOCHS, run.finished
    return FilesOutput(root / "out").committed()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Future[Counter[str]]]:
    """The local[*] output of the crash job, computed once, beside the first cluster run."""
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(local_reference, tmp_path_factory.mktemp("local-reference"))


def test_a_killed_worker_is_recovered_with_the_same_output(
        standalone: StandaloneCluster, reference: Future[Counter[str]], tmp_path: Path) -> None:
    killed: list[float] = []
    armed: list[float] = []

    def kill_during_epoch_4(event: dict[str, Any] | None, elapsed: float) -> bool:
        if (not armed and event is not None and event.get("event") == "checkpoint"
                and event.get("status") == "completed" and event["id"] >= 3):
            armed.append(elapsed)
        # Epochs take 1-2 s here: 0.6 s after checkpoint 3, epoch 4's Spark jobs run.
        if armed and not killed and elapsed >= armed[0] + 0.6:
            standalone.kill_worker(1)  # its JVM, executor and Python workers, SIGKILL
            killed.append(elapsed)
        return False

    try:
        run = run_streamer(write_job(tmp_path / "cluster"), *submit_args(standalone),
                           watch=kill_during_epoch_4)
    finally:
        standalone.restart_worker(1)
    want = reference.result()
    assert killed, "the worker was never killed"
    assert run.returncode == 0 and run.finished and run.finished["status"] == "finished", \
        run.describe()
    got = FilesOutput(tmp_path / "cluster" / "out")
    assert got.committed() == want, diff(got.committed(), want)
    assert got.leftovers() == []
    after = [e for e in epochs(run) if e["epoch"] > 3]
    assert any(len(e["executors"]) == 1 for e in after), "no epoch ran without the worker"
    assert sum(e["restores"] for e in after) >= 1, \
        "the subtask of the lost executor did not restore its state elsewhere"
    print(f"worker killed at {killed[0]:.1f}s; restarts {run.finished['restarts']}; "
          f"messages: {run.messages()}")


#: Driver crashes (SIGKILL of the Python driver at a fail point) in one lap of the job; the
#: executors' own fail points cannot be armed through spark-submit (the worker-kill test
#: covers executors dying).
#: (`epoch-start` kills, where no checkpoint is in flight, are left to tests/runtime.)
KILLS = ("after-snapshot:3", "after-metadata:5", "mid-commit:7")


def test_driver_crashes_on_the_cluster_keep_exactly_once(
        standalone: StandaloneCluster, reference: Future[Counter[str]], tmp_path: Path) -> None:
    root = tmp_path / "cluster"
    pipeline = write_job(root)
    store = CheckpointStore(str(root / "storage"), JOB)
    log = []
    for point in (*KILLS, None):
        env = {"STREAMER_TEST_FAILPOINTS": point} if point else {}
        run = run_streamer(pipeline, *submit_args(standalone), env=env,
                           stderr_file=root / f"run-{len(log)}.stderr")
        latest = store.latest()
        log.append(f"{point or 'last run'}: exit {run.returncode}, resumable from "
                   f"epoch {latest.epoch if latest else 0}")
        if point:
            # The driver died of SIGKILL; spark-submit reports it as its exit code.
            assert run.returncode != 0 and run.finished is None, "\n".join(log)
    want = reference.result()
    assert run.returncode == 0 and run.finished and run.finished["status"] == "finished", \
        "\n".join(log) + "\n" + run.describe()
    assert run.finished["restored_from"] is not None, run.finished
    got = FilesOutput(root / "out")
    assert got.committed() == want, "\n".join(log) + "\n" + diff(got.committed(), want)
    assert got.leftovers() == []
    print("\n".join(log))


@pytest.mark.kafka
def test_a_spark_kafka_source_on_the_cluster_reads_with_the_shipped_connector(
        standalone: StandaloneCluster, kafka: Any, tmp_path: Path) -> None:
    """`client: spark` under spark-submit: spark-submit resolves the connector from
    `spark.jars.packages` (the Ivy cache) and the executors, which run the Kafka reads, get
    its jars from the driver."""
    import json
    import uuid

    source = kafka.create_topic(f"t-{uuid.uuid4().hex[:10]}", 2)
    records = [{"user": f"u{i % 5}", "n": i} for i in range(3000)]
    kafka.produce(source, [(None, r, i % 2) for i, r in enumerate(records)])
    pipeline = tmp_path / "kafka.yaml"
    pipeline.write_text(f"""\
name: cluster-kafka
storage: {tmp_path / "storage"}
sources:
  - {{id: clicks, type: kafka, client: spark, bootstrap_servers: "{kafka.bootstrap}",
     topic: {source}, bounded: true, max_records_per_epoch: 1500,
     schema: {{user: string, n: bigint}}}}
sinks:
  - {{id: out, type: files, input: clicks, path: {tmp_path / "out"}, format: jsonl}}
""" + quick_jvm())
    run = run_streamer(pipeline, *submit_args(standalone))
    assert run.returncode == 0 and run.finished and run.finished["status"] == "finished", \
        run.describe()
    rows = [json.loads(r) for r in FilesOutput(tmp_path / "out").committed().elements()]
    assert sorted(rows, key=lambda r: r["n"]) == records
