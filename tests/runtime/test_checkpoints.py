"""Checkpoints end to end on real Spark, real RocksDB and real files: completion, resume,
exactly-once sink commits, corrupt and incomplete checkpoints, incompatible changes, restarts.
(SIGKILL crash tests are in test_crash.py.)"""

from __future__ import annotations

import json
import socket
import textwrap
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from fragments import clicks, files_sink, job, section, window
from prometheus_client.parser import text_string_to_metric_families
from streamer_process import FilesOutput

from streamer import failpoints
from streamer.checkpoint.checkpoint_metadata import CheckpointError, CheckpointStore
from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.coordinator import JobRunner, RunOptions
from streamer.runtime.observe.metrics import JsonReporter

pytestmark = pytest.mark.spark

def committed(directory: Path) -> Counter[str]:
    """The committed rows as a multiset of canonical JSON lines."""
    return FilesOutput(directory).committed()


class Job:
    """One pipeline with its own storage, local state and output directories."""

    def __init__(self, tmp: Path, backend: str = "rocksdb", interval: str = "1ms",
                 parallelism: int = 2, attempts: int = 0) -> None:
        self.tmp = tmp
        self.storage = tmp / "storage"
        self.out = tmp / "out"
        self.local = tmp / "local"
        self.backend, self.interval, self.parallelism = backend, interval, parallelism
        self.attempts = attempts

    def text(self, *, out: Path | str | None = None, parallelism: int | None = None) -> str:
        """The clicks through 10-second windows into files (`out`, or the job's output)."""
        return (job("chk-test", storage=self.storage, parallelism=parallelism or self.parallelism,
                    checkpoint=f"{{interval: {self.interval}, retain: 2}}", backend=self.backend,
                    local_dir=self.local, attempts=self.attempts)
                + section("sources", clicks(limit=3000, per_epoch=1000))
                + section("operators", window("per_window", "clicks", "10s"))
                + section("sinks", files_sink("per_window", out or self.out)))

    def run(self, spark: object, *, text: str | None = None, on_event=None, **options: object):
        spec = load_pipeline_text(textwrap.dedent(text or self.text()))
        lines: list[str] = []

        class Capture:
            def write(self, s: str) -> None:
                for x in s.splitlines():
                    if x:
                        lines.append(x)
                        if on_event is not None:
                            on_event(json.loads(x))

            def flush(self) -> None:
                pass

        runner = JobRunner(spec, RunOptions(ui=False, checkpoints=True, **options),  # type: ignore[arg-type]
                           spark=spark, reporter=JsonReporter(Capture()))  # type: ignore[arg-type]
        result = runner.run()
        events = [json.loads(x) for x in lines]
        return result, events

    @property
    def store(self) -> CheckpointStore:
        return CheckpointStore(str(self.storage), "chk-test")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def messages(events: list[dict]) -> list[str]:
    return [e["text"] for e in events if e["event"] == "message"]


@pytest.fixture(scope="module")
def expected(spark, tmp_path_factory) -> Counter[str]:
    """The output of one uninterrupted run without checkpoints."""
    job = Job(tmp_path_factory.mktemp("reference"))
    spec = load_pipeline_text(textwrap.dedent(job.text()))
    JobRunner(spec, RunOptions(ui=False), spark=spark).run()
    rows = committed(job.out)
    assert sum(rows.values()) > 50
    return rows


@pytest.mark.slow  # 4 s each
@pytest.mark.parametrize("backend", ["rocksdb", "memory"])
def test_checkpoint_every_epoch_commits_exactly_the_reference_output(
        spark, tmp_path: Path, expected: Counter[str], backend: str) -> None:
    job = Job(tmp_path, backend=backend)
    result, events = job.run(spark)
    assert committed(job.out) == expected
    done = [e for e in events if e["event"] == "checkpoint"]
    assert [e["status"] for e in done] == ["completed"] * len(done)
    assert result.epochs - 1 <= len(done) <= result.epochs  # every epoch after the first
    assert result.epochs >= 4
    listed = job.store.list()
    assert [i.checkpoint_id for i in listed] == [done[-1]["id"], done[-2]["id"]]  # retain 2
    assert all(i.complete for i in listed)
    last = listed[0].meta
    assert last is not None and last.epoch == result.epochs
    assert last.sinks == {} or all(items for items in last.sinks.values())
    op = last.operators["per_window"]
    assert op.parallelism == 2 and len(op.subtasks) == 2
    assert {h["subtask"] for h in op.subtasks} == {0, 1}
    # Only files the retained checkpoints reference are left in shared/.
    shared = {str(p.relative_to(job.storage / "chk-test" / "checkpoints"))
              for p in (job.storage / "chk-test" / "checkpoints" / "shared").rglob("*")
              if p.is_file()}
    referenced = set().union(*(i.meta.referenced() for i in listed if i.meta))
    assert shared <= referenced


def test_stop_then_resume_gives_the_reference_output_once(
        spark, tmp_path: Path, expected: Counter[str]) -> None:
    job = Job(tmp_path, interval="1h")  # only the stop's and the end's checkpoints
    first, events = job.run(spark, max_epochs=2)
    assert first.status == "stopped"
    assert len(first.checkpoints) == 1
    partial = committed(job.out)
    assert 0 < sum(partial.values()) < sum(expected.values())
    second, events = job.run(spark)
    assert second.restored_from == first.checkpoints[0]
    assert any(m.startswith(f"resuming from checkpoint {first.checkpoints[0]}")
               for m in messages(events))
    assert committed(job.out) == expected
    third, events = job.run(spark)  # a finished job resumes at its end: nothing to do
    assert third.records_in == 0
    assert committed(job.out) == expected


def test_output_waits_for_the_covering_checkpoint(spark, tmp_path: Path) -> None:
    job = Job(tmp_path, interval="1h")
    _, events = job.run(spark)
    ids = [e["id"] for e in events if e["event"] == "checkpoint"]
    assert len(ids) == 1  # only the final one: every epoch's output waited for it
    meta = job.store.read(ids[0])
    staged_epochs = [e for e, _ in meta.sinks["out"]]
    assert staged_epochs == sorted(staged_epochs) and len(staged_epochs) >= 3
    assert not [p for p in (job.out / "_staging").rglob("*") if p.is_file()]


def test_corrupt_metadata_is_reported_and_the_previous_checkpoint_used(
        spark, tmp_path: Path, expected: Counter[str]) -> None:
    job = Job(tmp_path, interval="1h")
    first, _ = job.run(spark, max_epochs=1)
    second, _ = job.run(spark, max_epochs=1)
    assert second.restored_from == first.checkpoints[-1]
    newest = second.checkpoints[-1]
    meta_file = job.storage / "chk-test" / "checkpoints" / f"chk-{newest}" / "_metadata"
    meta_file.write_text(meta_file.read_text().replace('"epoch"', '"epocj"', 1))
    third, events = job.run(spark)
    assert third.restored_from == first.checkpoints[-1]
    assert any(f"checkpoint {newest} cannot be used" in m for m in messages(events))
    # Epochs after the older checkpoint run again and commit under the same file names.
    assert set(committed(job.out)) == set(expected)


@pytest.mark.parametrize("backend", ["rocksdb", "memory"])
def test_corrupt_state_file_falls_back_to_the_previous_checkpoint(
        spark, tmp_path: Path, expected: Counter[str], backend: str) -> None:
    job = Job(tmp_path, backend=backend, interval="1h")
    job.run(spark, max_epochs=1)
    second, _ = job.run(spark, max_epochs=1)
    newest = job.store.read(second.checkpoints[-1])
    victim = next(f for h in newest.operators["per_window"].subtasks for f in h["files"]
                  if f["size"] > 64 and (backend == "memory" or f["name"].endswith(".sst")))
    path = job.storage / "chk-test" / "checkpoints" / victim["path"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))  # same size: only its checksum tells
    import shutil

    shutil.rmtree(job.local / ".local-recovery")  # no intact local copy to fall back on
    third, events = job.run(spark)
    assert any(f"checkpoint {second.checkpoints[-1]} is corrupt" in m for m in messages(events))
    # Reported as the restore of the subtask, not as the stage whose Spark job ran it.
    assert any(f"checkpoint {second.checkpoints[-1]} is corrupt (epoch " in m
               and "failed in restoring operator 'per_window' subtask " in m
               and "writing sink" not in m for m in messages(events)), messages(events)
    assert third.restored_from == second.restored_from
    assert set(committed(job.out)) == set(expected)


@pytest.mark.slow
def test_from_checkpoint_and_fresh(spark, tmp_path: Path, expected: Counter[str]) -> None:
    job = Job(tmp_path, interval="1h")
    first, _ = job.run(spark, max_epochs=1)
    job.run(spark, max_epochs=1)
    third, events = job.run(spark, from_checkpoint=str(first.checkpoints[-1]))
    assert third.restored_from == first.checkpoints[-1]
    assert any("newer than" in m for m in messages(events))
    assert set(committed(job.out)) == set(expected)
    with pytest.raises(CheckpointError, match="names no checkpoint"):
        job.run(spark, from_checkpoint="latest-one")
    fresh, events = job.run(spark, fresh=True)
    assert fresh.restored_from is None and fresh.records_in == 6000
    assert any("--fresh" in m for m in messages(events))


def test_changed_parallelism_is_refused_with_a_clear_message(spark, tmp_path: Path) -> None:
    job = Job(tmp_path, interval="1h")
    job.run(spark, max_epochs=1)
    with pytest.raises(CheckpointError, match=r"parallelism 2.*now says 3.*--fresh"):
        job.run(spark, text=job.text(parallelism=3))


def test_local_recovery_copy_is_used_when_intact(spark, tmp_path: Path,
                                                 expected: Counter[str]) -> None:
    job = Job(tmp_path, interval="1h")
    job.run(spark, max_epochs=1)
    _, events = job.run(spark, max_epochs=1)
    assert any("restored 2 subtasks from local copies and 0 from checkpoint storage" in m
               for m in messages(events))
    import shutil

    shutil.rmtree(job.local / ".local-recovery")
    _, events = job.run(spark)
    assert any("restored 0 subtasks from local copies and 2 from checkpoint storage" in m
               for m in messages(events))
    assert committed(job.out) == expected


@pytest.mark.slow
@pytest.mark.slow
@pytest.mark.parametrize("point", ["epoch-start:3", "after-snapshot:2", "after-metadata:2",
                                   "mid-commit:2"])
def test_a_run_aborted_at_a_fail_point_resumes_in_the_same_process_exactly_once(
        spark, tmp_path: Path, expected: Counter[str], monkeypatch: pytest.MonkeyPatch,
        point: str) -> None:
    """A fail point armed with `raise` aborts the run inside the driver (Bytewax's `ABORT`:
    no SIGKILL, so no fresh JVM); the next run, in the same process on the same Spark session,
    resumes from the last checkpoint and commits every row exactly once, whichever side of
    `_metadata` or the sink commit the first one stopped on. test_crash.py SIGKILLs at the
    same points, which also proves that nothing depends on the driver's clean-up."""
    monkeypatch.setattr(failpoints, "_raised", set())
    monkeypatch.setenv(failpoints.ENV, f"{point}:raise")
    monkeypatch.setenv(failpoints.DRIVER_PID_ENV, "")  # (the run sets it: undo it after)
    job = Job(tmp_path, interval="1ms")
    with pytest.raises(failpoints.FailPointError, match=point.split(":")[0]):
        job.run(spark)
    latest = job.store.latest()
    assert latest is not None
    assert sum(committed(job.out).values()) < sum(expected.values())
    monkeypatch.delenv(failpoints.ENV)
    result, events = job.run(spark)
    assert result.status == "finished" and result.restored_from == latest.checkpoint_id
    assert any(m.startswith(f"resuming from checkpoint {latest.checkpoint_id}")
               for m in messages(events))
    assert committed(job.out) == expected


@pytest.mark.slow  # 4-9 s
def test_a_failed_epoch_restarts_from_the_last_checkpoint(
        spark, tmp_path: Path, expected: Counter[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import streamer.testing.storage_faults  # noqa: F401 - registers faulty:// in this process

    rules = tmp_path / "faults.json"
    # The third epoch's staged upload fails once (the sink stages in the driver).
    rules.write_text(json.dumps({"rules": [
        {"op": "write", "match": "*/_staging/epoch-00000003/*", "times": 1}]}))
    monkeypatch.setenv("STREAMER_TEST_FAULTS", str(rules))
    job = Job(tmp_path, interval="1ms", attempts=2)
    text = job.text(out=f"faulty://{job.out}")
    port = free_port()
    scrapes: list[dict[str, float]] = []

    def scrape(event: dict) -> None:  # the Prometheus endpoint, as each epoch is reported
        if event["event"] == "epoch":
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as response:
                scrapes.append({s.name: s.value for f in text_string_to_metric_families(
                    response.read().decode()) for s in f.samples})

    result, events = job.run(spark, text=text, on_event=scrape, metrics_port=port)
    assert result.status == "finished" and result.restarts == 1
    assert any("restarting from the last checkpoint" in m and "attempt 1 of 2" in m
               for m in messages(events))
    assert committed(job.out) == expected
    assert [s["streamer_restarts_total"] for s in scrapes[:2]] == [0, 0]
    assert scrapes[-1]["streamer_restarts_total"] == 1
    sizes = [e["state_size"] for e in events if e["event"] == "checkpoint"]
    assert scrapes[-1]["streamer_checkpoint_size_bytes"] == sizes[-1]
    assert max(s.get("streamer_checkpoint_size_bytes", 0) for s in scrapes) == max(sizes) > 0


def test_without_restart_attempts_a_failed_epoch_fails_the_run(
        spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import streamer.testing.storage_faults  # noqa: F401
    from streamer.runtime.exceptions import JobFailedError

    rules = tmp_path / "faults.json"
    rules.write_text(json.dumps({"rules": [
        {"op": "write", "match": "*/_staging/epoch-00000003/*"}]}))
    monkeypatch.setenv("STREAMER_TEST_FAULTS", str(rules))
    job = Job(tmp_path, interval="1ms", attempts=0)
    with pytest.raises(JobFailedError, match="epoch 3 failed in writing sink 'out'"):
        job.run(spark, text=job.text(out=f"faulty://{job.out}"))
    assert job.store.latest() is not None  # epoch 2's checkpoint stands; a rerun resumes


@pytest.mark.parametrize(("interval", "how"), [
    ("1ms", "restored 1 subtasks from local copies"),
    ("1h", "lost its state since the last checkpoint")])
def test_a_subtask_that_lost_its_working_state_recovers(
        spark, tmp_path: Path, expected: Counter[str], interval: str, how: str) -> None:
    """As when Spark runs a subtask on an executor that does not have its state: with a
    checkpoint at the previous epoch it restores and goes on, otherwise the job restarts
    from the last checkpoint (sources rewind), which costs no restart attempt."""
    import shutil

    job = Job(tmp_path, interval=interval)

    lost: list[int] = []

    def lose_state(event: dict) -> None:
        if event["event"] == "epoch" and event["epoch"] == 3 and not lost:
            lost.append(3)
            for subtask in (job.local / "chk-test").glob("*/chk-test/per_window/subtask-0"):
                shutil.rmtree(subtask)

    result, events = job.run(spark, on_event=lose_state)
    assert any(how in m for m in messages(events)), messages(events)
    assert result.restarts == 0
    assert committed(job.out) == expected


def test_a_checkpoint_over_its_timeout_is_declined_and_the_run_says_why(
        spark, tmp_path: Path) -> None:
    from streamer.runtime.exceptions import JobFailedError

    job = Job(tmp_path, interval="1ms")
    text = job.text().replace("retain: 2}", "retain: 2, timeout: 1ms}")
    failed: list[dict] = []
    with pytest.raises(JobFailedError, match="final checkpoint of job 'chk-test' failed 3 times"):
        job.run(spark, text=text, on_event=lambda e: failed.append(e)
                if e["event"] == "checkpoint" else None)
    assert failed and all(e["status"] == "failed" for e in failed)
    assert any("timeout" in e["reason"].lower() for e in failed), failed
    assert job.store.latest() is None
    assert not list(job.out.glob("part-*"))  # exactly-once: nothing committed without one


def test_at_least_once_commits_every_epoch(spark, tmp_path: Path,
                                           expected: Counter[str]) -> None:
    job = Job(tmp_path, interval="1h")
    text = job.text().replace("retain: 2}", "retain: 2, mode: at_least_once}")
    seen: list[int] = []

    def count_parts(event: dict) -> None:
        if event["event"] == "epoch":
            seen.append(len(list(job.out.glob("part-*"))))

    job.run(spark, text=text, on_event=count_parts)
    assert seen[1] > 0  # committed before any checkpoint
    assert job.store.read(job.store.ids()[-1]).sinks == {}
    assert committed(job.out) == expected


def test_a_checkpoint_removes_temporary_files_of_killed_uploads(spark, tmp_path: Path) -> None:
    """An upload killed midway leaves its hidden temporary file: the next checkpoint's prune
    deletes those older than the checkpoint timeout (a younger one may be a live upload)."""
    import os
    import time

    job = Job(tmp_path)
    root = job.storage / "chk-test" / "checkpoints"
    stale = root / "shared" / "per_window" / "subtask-0" / ".000012.sst.0123456789ab.tmp"
    young = root / "shared" / "per_window" / "subtask-1" / ".000013.sst.ba9876543210.tmp"
    other = root / "shared" / "per_window" / "subtask-0" / ".keep-me"  # not a temporary name
    for path in (stale, young, other):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"partial")
    hour_ago = time.time() - 3600
    os.utime(stale, (hour_ago, hour_ago))
    os.utime(other, (hour_ago, hour_ago))
    text = job.text().replace("retain: 2}", "retain: 2, timeout: 10m}")
    _, events = job.run(spark, text=text)
    assert [e["status"] for e in events if e["event"] == "checkpoint"][-1] == "completed"
    assert not stale.exists()
    assert young.exists() and other.exists()
