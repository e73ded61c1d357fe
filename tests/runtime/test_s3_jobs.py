"""Jobs whose storage and files sink are on a real S3 API server (MinIO on 127.0.0.1, the `s3`
fixture), end to end through the CLI.

- The crash campaign of test_crash.py (SIGKILLs at every fail point once and twice at random
  moments, `STREAMER_TEST_CRASH_KILLS`, default 8) with the job registry, the control channel, the
  checkpoints (incremental RocksDB SSTs) and the jsonl sink on S3: the committed output (what
  the sink's manifests name) equals an uninterrupted local run's, nothing staged, partial or
  unnamed is left in the output, and nothing in the checkpoint storage is unreferenced by the
  retained checkpoints.
- A job on S3 controlled from other processes (`streamer list`, `checkpoint list`, `savepoint
  trigger`, `stop --savepoint`), its savepoint copied to a local directory and restored at
  another parallelism, writing on to the same S3 output: exactly the reference output.

The reference run (test_crash.py's, shared when that module ran first in the session), the
campaign and the controlled job run side by side (each run pays seconds of JVM start). They
are the module's fixture, so a test's "setup" time is theirs. The campaign's runs share a warm
JVM started with S3A's packages (`LapJob.warm`, `warm_jvm.WarmJvm.configure`), killed with
the run at the kills that model a machine crash.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fragments import files_sink, write_pipeline
from streamer_process import STREAMER, FilesOutput, Run, diff, quick_jvm, run_streamer
from test_crash import (
    JOB,
    KILLS,
    KINDS,
    Campaign,
    Lap,
    LapJob,
    check_campaign,
    crash_campaign,
    pipeline,
    reference_output,
)

from streamer.checkpoint.checkpoint_metadata import CheckpointStore

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.s3]


def s3_pipeline(s3: Any, prefix: str, local: Path, *, storage: str | None = None,
                parallelism: int = 2, rate: int | None = None) -> str:
    """test_crash's job with its storage and sink under `s3://streamer/<prefix>` (the
    storage elsewhere if given), reached through a `storage_options:` block."""
    root = f"s3://streamer/{prefix}"
    return pipeline(root, "rocksdb", files_sink("per_window", f"{root}/out"), storage=storage,
                    local_dir=local, parallelism=parallelism, rate=rate,
                    storage_options=s3.storage_options())


def s3_rows(fs: Any, out: str) -> tuple[Counter[str], list[str]]:
    """The rows of the files the manifests under `out` name, and what else is there: files
    no manifest names, staging, temporaries, manifests naming missing or resized files."""
    rows: Counter[str] = Counter()
    named: dict[str, int] = {}
    for path in fs.find(f"{out}/_manifests"):
        for entry in json.loads(fs.cat_file(path))["files"]:
            named[entry["name"]] = entry["size"]
    found = {p.removeprefix(f"{out}/"): info["size"]
             for p, info in fs.find(out, detail=True).items()}
    leftovers = sorted(n for n in found if n not in named and not n.startswith("_manifests/"))
    leftovers += [f"{n} named by a manifest: {found.get(n)} bytes, {size} in the manifest"
                  for n, size in named.items() if found.get(n) != size]
    for name in sorted(named):
        for line in fs.cat_file(f"{out}/{name}").decode().split("\n"):
            if line.strip():
                rows[json.dumps(json.loads(line), sort_keys=True)] += 1
    return rows, leftovers


def unreferenced(fs: Any, storage: str, job: str) -> list[str]:
    """Files of the job's checkpoint storage that no retained checkpoint needs: shared files
    none references, directories of deleted checkpoints, temporaries."""
    store = CheckpointStore(storage, job)
    listed = store.list(check_files=False)
    kept = {item.checkpoint_id: item.meta for item in listed if item.meta is not None}
    referenced = set().union(*(meta.referenced() for meta in kept.values()))
    root = store.storage.path("").rstrip("/")
    extra = []
    for path in fs.find(root):
        rel = path.removeprefix(root + "/")
        top = rel.split("/", 1)[0]
        if (rel.startswith("shared/") and rel not in referenced) or rel.endswith(".tmp") \
                or (top.startswith("chk-") and int(top[4:]) not in kept):
            extra.append(rel)
    return extra


@pytest.fixture(scope="module")
def s3_options(s3: Any) -> Iterator[None]:
    """This process reaches the server through fsspec's config (what `storage_options:` sets
    in a run), not the environment: the runs get nothing but their pipeline file's block, and
    the CLI commands nothing but the `AWS_*` variables (`cli`)."""
    import fsspec
    import s3fs

    from streamer.storage import s3fs_arguments

    saved = dict(fsspec.config.conf.get("s3", {}))
    fsspec.config.conf["s3"] = s3fs_arguments(s3.storage_options())
    s3fs.S3FileSystem.clear_instance_cache()
    yield
    fsspec.config.conf["s3"] = saved
    s3fs.S3FileSystem.clear_instance_cache()


def s3_job(s3: Any, base: str) -> LapJob:
    """The campaign's job: each lap under its own prefix of the bucket."""
    def prefix(root: Path) -> str:
        return f"{base}/{root.parent.name}-{root.name}"

    def write(root: Path) -> Path:
        return write_pipeline(root, s3_pipeline(s3, prefix(root), root / "local"))

    def collect(root: Path, lap: Lap) -> None:
        fs = s3.filesystem()
        lap.rows, lap.leftovers = s3_rows(fs, f"streamer/{prefix(root)}/out")
        lap.leftovers += [f"storage: {p}" for p in
                          unreferenced(fs, f"s3://streamer/{prefix(root)}/storage", JOB)]
        uploads = fs.call_s3("list_multipart_uploads", Bucket="streamer",
                             Prefix=prefix(root)).get("Uploads", [])
        lap.leftovers += [f"unfinished upload {u['Key']}" for u in uploads]

    return LapJob(JOB, write, collect, storage=lambda root: f"s3://streamer/{prefix(root)}/storage",
                  warm=True)


def cli(s3: Any, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`streamer <args>` from another process, reaching the server through the `AWS_*`
    variables."""
    return subprocess.run([str(STREAMER), *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env={**os.environ, **s3.env()})


def controlled_job(s3: Any, root: Path, base: str) -> dict[str, Any]:
    """Run the job (rate-limited, so it is still running) on S3 and control it from other
    processes; then restore its stop savepoint from a local copy at parallelism 3."""
    storage = f"s3://streamer/{base}/control/storage"
    pipeline = root / "job.yaml"
    root.mkdir(parents=True, exist_ok=True)
    pipeline.write_text(s3_pipeline(s3, f"{base}/control", root / "local", rate=20))
    completed = threading.Event()

    def watch(event: dict[str, Any] | None, elapsed: float) -> bool:
        if event and event.get("event") == "checkpoint" and event.get("status") == "completed":
            completed.set()
        return False

    out: dict[str, Any] = {}
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(run_streamer, pipeline, watch=watch,
                              stderr_file=root / "run.stderr")
        assert completed.wait(240), "no checkpoint completed"
        out["list"] = cli(s3, "list", "--storage", storage, "--json")
        out["checkpoints"] = cli(s3, "checkpoint", "list", JOB, "--storage", storage, "--json")
        out["trigger"] = cli(s3, "savepoint", "trigger", JOB, "--storage", storage)
        out["stop"] = cli(s3, "stop", JOB, "--savepoint", "--storage", storage)
        out["run"] = running.result()
    fs = s3.filesystem()
    savepoint = out["stop"].stdout.strip()
    if out["stop"].returncode != 0 or not savepoint.startswith("s3://"):
        return out  # (the test names the step that failed, with its output)
    local = root / "savepoint-copy"
    fs.get(savepoint.removeprefix("s3://").rstrip("/") + "/", str(local), recursive=True)
    out["copied"] = sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file())
    fs.rm(savepoint.removeprefix("s3://"), recursive=True)  # the copy is all that is left
    restored = root / "restore.yaml"
    restored.write_text(s3_pipeline(s3, f"{base}/control", root / "local-3",
                                    storage=str(root / "storage-3"), parallelism=3))
    out["restore"] = run_streamer(restored, "--from-savepoint", str(local),
                                  stderr_file=root / "restore.stderr")
    out["rows"], out["leftovers"] = s3_rows(fs, f"streamer/{base}/control/out")
    return out


@pytest.fixture(scope="module")
def runs(s3: Any, s3_options: None, tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[Future[Counter[str]], Future[Campaign], Future[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("s3-jobs")
    base = f"jobs-{uuid.uuid4().hex[:8]}"
    with ThreadPoolExecutor(3) as pool:
        reference = pool.submit(reference_output, root / "reference", "jsonl")
        campaign = pool.submit(crash_campaign, "s3", root / "campaign", s3_job(s3, base))
        control = pool.submit(controlled_job, s3, root / "control", base)
    return reference, campaign, control


def test_sigkills_with_storage_and_sink_on_s3_commit_exactly_the_reference_output(
        runs: tuple[Future[Counter[str]], Future[Campaign], Future[dict[str, Any]]]) -> None:
    reference, campaign = runs[0].result(), runs[1].result()
    check_campaign(campaign, reference, KILLS, kinds=KINDS)


def test_a_job_on_s3_is_controlled_from_other_processes_and_restored_from_a_local_copy(
        runs: tuple[Future[Counter[str]], Future[Campaign], Future[dict[str, Any]]]) -> None:
    reference, out = runs[0].result(), runs[2].result()
    for step in ("list", "checkpoints", "trigger", "stop"):
        assert out[step].returncode == 0, f"{step}: {out[step].stdout}{out[step].stderr}"
    jobs = json.loads(out["list"].stdout)
    assert [(j["job"], j["state"]) for j in jobs] == [(JOB, "running")], jobs
    assert json.loads(out["checkpoints"].stdout), out["checkpoints"].stdout
    assert out["trigger"].stdout.strip().startswith("s3://streamer/"), out["trigger"].stderr
    assert out["stop"].stdout.strip().startswith("s3://streamer/"), out["stop"].stderr
    run: Run = out["run"]
    assert run.finished and run.finished["status"] == "stopped", run.describe()
    assert "_metadata" in out["copied"], out["copied"]
    restore: Run = out["restore"]
    assert restore.returncode == 0 and restore.finished, restore.describe()
    assert restore.finished["status"] == "finished", restore.describe()
    assert out["rows"] == reference, diff(out["rows"], reference)
    assert out["leftovers"] == [], out["leftovers"]



SOURCE_PIPELINE = """\
name: from-s3
storage: {root}/storage
storage_options:
{options}sources:
  - id: orders
    type: files
    path: s3://streamer/{prefix}/in/*.jsonl
    format: jsonl
    schema: {{order_id: bigint, amount: double}}
    on_error: bad
operators:
  - id: big
    input: orders
    filter: "amount >= 10"
sinks:
  - {{id: out, type: files, input: big, path: {root}/out, format: jsonl}}
  - {{id: bad, type: files, path: {root}/bad, format: jsonl}}
""" + quick_jvm().replace("{", "{{").replace("}", "}}")


def test_a_files_source_reads_s3_through_storage_options(s3: Any, tmp_path: Path) -> None:
    fs = s3.filesystem()
    prefix = f"source-{uuid.uuid4().hex[:8]}"
    for n in range(3):
        lines = [json.dumps({"order_id": n * 10 + i, "amount": float(i * 5)}) for i in range(4)]
        fs.pipe_file(f"streamer/{prefix}/in/orders-{n}.jsonl", ("\n".join(lines) + "\n").encode())
    fs.pipe_file(f"streamer/{prefix}/in/orders-3.jsonl", b"not json\n")
    fs.pipe_file(f"streamer/{prefix}/in/_staging.jsonl", b'{"order_id": 99, "amount": 99}\n')
    options = "".join(f"  {k}: {v}\n" for k, v in s3.storage_options().items())
    pipeline = tmp_path / "job.yaml"
    pipeline.write_text(SOURCE_PIPELINE.format(root=tmp_path, prefix=prefix, options=options))
    run = run_streamer(pipeline, "--no-checkpoints")
    assert run.returncode == 0 and run.finished, run.describe()
    rows = FilesOutput(tmp_path / "out").committed()
    assert sorted(json.loads(r)["order_id"] for r in rows.elements()) == [2, 3, 12, 13, 22, 23]
    bad = [json.loads(r) for r in FilesOutput(tmp_path / "bad").committed().elements()]
    assert [(b["split"], b["record"]) for b in bad] == [
        (f"s3://streamer/{prefix}/in/orders-3.jsonl", "not json")]
