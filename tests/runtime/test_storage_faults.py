"""Injected storage faults under a real `streamer run`: checkpoint storage is `faulty://`
(`storage_faults.py`), the local file system with chosen operations failing. A checkpoint
whose upload, `_metadata` write or clean-up fails is declined cleanly or completed, and the job
runs on to the output of an uninterrupted run; a checkpoint that cannot be read back is
reported and an earlier one is used, or the run fails with a one-line error.

Each job runs as a process of its own: Spark's Python workers only see `STREAMER_TEST_FAULTS` when
it is set before the session starts, so the variable names a rules file from the start and a
test arms a fault at a chosen checkpoint by rewriting that file while the job runs.

The scenarios are independent jobs, each paying seconds of JVM start; a module fixture runs
the ones the selected tests need side by side.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fragments import crash_job, files_sink, section
from streamer_process import FilesOutput, Run, Watch, diff, quick_jvm, run_streamer

from streamer.checkpoint.checkpoint_metadata import CheckpointMetadata, CheckpointStore, Listed

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = "faults"
#: 8 epochs of data (a checkpoint after each), the last one also the final one.
LIMIT, PER_EPOCH = 480, 120
EPOCHS = 2 * LIMIT // PER_EPOCH


def pipeline(root: Path, backend: str) -> str:
    """test_crash.py's job (with fewer epochs) on `faulty://` storage, restarted once after
    a failure."""
    return (crash_job(JOB, root, backend=backend, limit=LIMIT, per_epoch=PER_EPOCH,
                      storage=f"faulty://{root}/storage", attempts=1)
            + section("sinks", files_sink("per_window", root / "out")) + quick_jvm())


class FaultyJob:
    """The job in `root`: its pipeline, a rules file for `STREAMER_TEST_FAULTS`, its checkpoints
    (read by the test without faults) and its output."""

    def __init__(self, root: Path, backend: str = "rocksdb") -> None:
        self.root, self.backend = root, backend
        root.mkdir(parents=True, exist_ok=True)
        self.pipeline = root / "job.yaml"
        self.pipeline.write_text(pipeline(root, backend))
        self.rules_file = root / "faults.json"
        self.rules()
        self.store = CheckpointStore(str(root / "storage"), JOB)
        self.output = FilesOutput(root / "out")
        self.runs = 0

    def rules(self, *rules: dict[str, Any]) -> None:
        """Replace the fault rules (a running job sees them at its next storage operation)."""
        tmp = self.rules_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rules": list(rules)}))
        tmp.replace(self.rules_file)

    def run(self, *args: str, watch: Watch | None = None) -> Run:
        """`streamer run` of the job with the fault rules in force."""
        self.runs += 1
        return run_streamer(self.pipeline, *args,
                            env={"STREAMER_TEST_FAULTS": str(self.rules_file)},
                            watch=watch, timeout=600,
                            stderr_file=self.root / f"run-{self.runs}.stderr")

    def copy(self, root: Path) -> FaultyJob:
        """The job with its checkpoints, local state and output copied to `root` (checkpoints
        hold only storage-relative paths, so the copy resumes as the original would)."""
        shutil.copytree(self.root, root, symlinks=True,
                        ignore=shutil.ignore_patterns("job.yaml", "faults.json*", "*.stderr"))
        return FaultyJob(root, self.backend)

    @property
    def checkpoint_dir(self) -> Path:
        return self.root / "storage" / JOB / "checkpoints"

    def shared_files(self) -> set[str]:
        """Storage-relative paths of the files in `shared/`."""
        return {str(p.relative_to(self.checkpoint_dir))
                for p in (self.checkpoint_dir / "shared").rglob("*") if p.is_file()}


@dataclass
class AtFailure:
    """What the checkpoint storage held when the job reported a failed checkpoint."""

    listed: list[Listed] = field(default_factory=list)
    latest: CheckpointMetadata | None = None


def watch_failures(job: FaultyJob, seen: AtFailure,
                   arm: tuple[int, list[dict[str, Any]]] | None = None) -> Watch:
    """A run watcher that lists the checkpoints when the first failed one is reported, and
    with `arm` = (id, rules) sets those rules once checkpoint `id` has completed."""
    def watch(event: dict[str, Any] | None, elapsed: float) -> bool:
        del elapsed
        if event is None or event.get("event") != "checkpoint":
            return False
        if arm is not None and event["status"] == "completed" and event["id"] == arm[0]:
            job.rules(*arm[1])
        if event["status"] == "failed" and not seen.listed:
            seen.listed = job.store.list()
            seen.latest = job.store.latest()
        return False

    return watch


# ------------------------------------------------------------------------------ scenarios
@dataclass
class Outcome:
    """A scenario's job, its runs and what was seen along the way."""

    job: FaultyJob
    runs: list[Run]
    at_failure: AtFailure = field(default_factory=AtFailure)
    #: The newest checkpoint before the faults (a restore scenario's).
    newest: int = 0

    @property
    def last(self) -> Run:
        return self.runs[-1]


def reference(root: Path) -> Counter[str]:
    """What an uninterrupted run without checkpoints commits."""
    job = FaultyJob(root)
    run = job.run("--no-checkpoints")
    assert run.returncode == 0 and run.finished, run.describe()
    assert run.finished["epochs"] == EPOCHS
    return job.output.committed()


def upload_fails(root: Path, backend: str) -> Outcome:
    """Once checkpoint 2 is done, one snapshot upload fails: a new shared SST (rocksdb) or a
    memory snapshot (a private file)."""
    job = FaultyJob(root, backend)
    target = "shared/*" if backend == "rocksdb" else "chk-*/per_window/*"
    seen = AtFailure()
    rule = {"op": "write", "match": f"*/checkpoints/{target}", "times": 1}
    run = job.run(watch=watch_failures(job, seen, arm=(2, [rule])))
    return Outcome(job, [run], seen)


def metadata_write_fails(root: Path) -> Outcome:
    """Writing `chk-3/_metadata` fails (every time)."""
    job = FaultyJob(root)
    job.rules({"op": "write", "match": "*/checkpoints/chk-3/_metadata"})
    seen = AtFailure()
    run = job.run(watch=watch_failures(job, seen))
    return Outcome(job, [run], seen)


def prune_deletes_fail(root: Path) -> Outcome:
    """Deleting `chk-1` fails once, and so does deleting the first unreferenced shared file."""
    job = FaultyJob(root)
    job.rules({"op": "delete", "match": "*/checkpoints/chk-1", "times": 1},
              {"op": "delete", "match": "*/checkpoints/shared/*", "times": 1})
    return Outcome(job, [job.run()])


#: How the resume after `restore_setup` goes wrong: the rules in force ({n}: the newest
#: checkpoint's id).
RESTORE_FAULTS: dict[str, list[dict[str, Any]]] = {
    # The newest checkpoint's `_metadata` cannot be read.
    "metadata": [{"op": "read", "match": "*/checkpoints/chk-{n}/_metadata"}],
    # One download of the newest checkpoint's state fails, then they work again.
    "state_once": [{"op": "read", "match": "*/checkpoints/chk-{n}/per_window/*", "times": 1}],
    # No file of the newest checkpoint's state can be read.
    "state_always": [{"op": "read", "match": "*/checkpoints/chk-{n}/per_window/*"}],
}


def restore_fails(root: Path) -> dict[str, Outcome]:
    """Run 4 epochs, then resume copies of the job, each with one kind of read fault on its
    newest checkpoint, side by side. Local recovery copies are deleted, so state is
    downloaded. (The first epoch may end before the 1 ms interval has passed since the run
    started, so it may or may not be a checkpoint: 3 or 4 checkpoints, numbered from 1.)"""
    setup = FaultyJob(root / "setup")
    first = setup.run("--max-epochs", "4")
    assert first.returncode == 0, first.describe()
    ids = [e["id"] for e in first.checkpoints()]
    assert ids in ([1, 2, 3], [1, 2, 3, 4]), first.events
    shutil.rmtree(setup.root / "local" / ".local-recovery")

    def resume(name: str) -> Outcome:
        job = setup.copy(root / name)
        job.rules(*({**rule, "match": rule["match"].format(n=ids[-1])}
                    for rule in RESTORE_FAULTS[name]))
        return Outcome(job, [first, job.run()], newest=ids[-1])

    with ThreadPoolExecutor(max_workers=len(RESTORE_FAULTS)) as pool:
        return dict(zip(RESTORE_FAULTS, pool.map(resume, RESTORE_FAULTS), strict=True))


SCENARIOS: dict[str, Callable[[Path], Any]] = {
    "reference": reference,
    "upload_fails[rocksdb]": lambda root: upload_fails(root, "rocksdb"),
    "upload_fails[memory]": lambda root: upload_fails(root, "memory"),
    "metadata_write_fails": metadata_write_fails,
    "prune_deletes_fail": prune_deletes_fail,
    "restore_fails": restore_fails,
}


def needs(*names: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Name the scenarios a test reads (`{backend}` and such: the test's parameters)."""
    def mark(test: Callable[..., None]) -> Callable[..., None]:
        test.scenarios = names  # type: ignore[attr-defined]
        return test

    return mark


@pytest.fixture(scope="module")
def scenarios(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[dict[str, Future[Any]]]:
    """The scenarios the selected tests of this module need, started side by side."""
    wanted: set[str] = set()
    for item in request.session.items:
        if getattr(item, "module", None) is request.module:
            params = getattr(getattr(item, "callspec", None), "params", {})
            wanted |= {name.format(**params)
                       for name in getattr(getattr(item, "function", None), "scenarios", ())}
    root = tmp_path_factory.mktemp("faults")
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(SCENARIOS[name], root / name.replace("[", "-").strip("]"))
                   for name in sorted(wanted)}
        yield futures


def assert_reference_output(job: FaultyJob, expected: Counter[str]) -> None:
    got = job.output.committed()
    assert got == expected, diff(got, expected)
    assert job.output.leftovers() == []


def completed(run: Run) -> list[int]:
    return [e["id"] for e in run.checkpoints("completed")]


# ------------------------------------------------------------------------------ the tests
def assert_declined_cleanly(outcome: Outcome, failed_id: int | None, words: list[str],
                            expected: Counter[str]) -> None:
    """One checkpoint failed (reported with `words`), the earlier ones stayed usable, a
    later one completed, and the job finished with the reference output."""
    run = outcome.last
    assert run.returncode == 0 and run.finished and run.finished["status"] == "finished", \
        run.describe()
    failed = run.checkpoints("failed")
    assert len(failed) == 1, failed
    failure = failed[0]
    if failed_id is not None:
        assert failure["id"] == failed_id, failure
    for word in words:
        assert word in failure["reason"], failure
    before = [i for i in completed(run) if i < failure["id"]]
    assert len(before) >= 2, completed(run)
    # When the failure was reported, the newest completed checkpoints were listed and usable;
    # the failed one had no `_metadata`.
    seen = outcome.at_failure
    assert seen.latest is not None and seen.latest.checkpoint_id == before[-1]
    by_id = {item.checkpoint_id: item for item in seen.listed}
    assert [i for i, item in by_id.items() if item.complete] == [before[-1], before[-2]]
    if failure["id"] in by_id:
        assert (by_id[failure["id"]].problem or "").startswith("incomplete")
    # The job went on: later checkpoints completed and every epoch's output was committed.
    assert [i for i in completed(run) if i > failure["id"]], completed(run)
    assert_reference_output(outcome.job, expected)
    final = outcome.job.store.list()
    assert [item.checkpoint_id for item in final] == completed(run)[:-3:-1]
    assert all(item.complete for item in final)


@pytest.mark.parametrize("backend", ["rocksdb", "memory"])
@needs("reference", "upload_fails[{backend}]")
def test_a_failed_snapshot_upload_declines_that_checkpoint_and_the_job_goes_on(
        scenarios: dict[str, Future[Any]], backend: str) -> None:
    outcome = scenarios[f"upload_fails[{backend}]"].result()
    assert_declined_cleanly(outcome, None, ["cannot upload", "injected fault"],
                            scenarios["reference"].result())
    assert outcome.last.checkpoints("failed")[0]["id"] >= 3


@needs("reference", "metadata_write_fails")
def test_a_failed_metadata_write_declines_that_checkpoint_and_the_job_goes_on(
        scenarios: dict[str, Future[Any]]) -> None:
    outcome = scenarios["metadata_write_fails"].result()
    assert_declined_cleanly(outcome, 3, ["_metadata", "injected fault"],
                            scenarios["reference"].result())
    assert not (outcome.job.checkpoint_dir / "chk-3").exists()  # pruned later


@needs("reference", "prune_deletes_fail")
def test_failed_deletes_while_pruning_leave_the_checkpoint_complete_and_clean_up_later(
        scenarios: dict[str, Future[Any]]) -> None:
    outcome = scenarios["prune_deletes_fail"].result()
    run, job = outcome.last, outcome.job
    assert run.returncode == 0 and run.finished and run.finished["status"] == "finished", \
        run.describe()
    assert run.checkpoints("failed") == []
    # A checkpoint after every epoch but maybe the first: the 1 ms interval counts from the
    # run's start, and the first epoch may begin within it.
    assert len(completed(run)) in (EPOCHS - 1, EPOCHS)
    failures = [m for m in run.messages() if "cleaning up older checkpoints failed" in m]
    assert len(failures) == 2, run.messages()
    assert all("injected fault" in m for m in failures)
    assert_reference_output(job, scenarios["reference"].result())
    # Everything the failed deletes left was removed by later prunes.
    final = job.store.list()
    assert [item.checkpoint_id for item in final] == completed(run)[:-3:-1]
    assert sorted(p.name for p in job.checkpoint_dir.iterdir()) == sorted(
        ["shared", *(f"chk-{item.checkpoint_id}" for item in final)])
    referenced = set().union(*(item.meta.referenced() for item in final if item.meta))
    assert job.shared_files() == {path for path in referenced if path.startswith("shared/")}


@needs("reference", "restore_fails")
def test_an_unreadable_newest_metadata_is_reported_and_the_previous_checkpoint_used(
        scenarios: dict[str, Future[Any]]) -> None:
    outcome = scenarios["restore_fails"].result()["metadata"]
    run = outcome.last
    assert run.returncode == 0 and run.finished and run.finished["status"] == "finished", \
        run.describe()
    messages = run.messages()
    newest = outcome.newest
    assert any(m.startswith(f"checkpoint {newest} cannot be used") and "injected fault" in m
               for m in messages), messages
    assert any(m.startswith(f"resuming from checkpoint {newest - 1}") for m in messages), \
        messages
    assert run.finished["restored_from"] == newest - 1
    assert_reference_output(outcome.job, scenarios["reference"].result())


@needs("reference", "restore_fails")
def test_a_failed_state_download_while_restoring_is_retried_by_a_restart(
        scenarios: dict[str, Future[Any]]) -> None:
    outcome = scenarios["restore_fails"].result()["state_once"]
    run = outcome.last
    assert run.returncode == 0 and run.finished and run.finished["status"] == "finished", \
        run.describe()
    assert any("injected fault" in m and "restarting from the last checkpoint" in m
               for m in run.messages()), run.messages()
    assert run.finished["restored_from"] == outcome.newest and run.finished["restarts"] == 1
    assert_reference_output(outcome.job, scenarios["reference"].result())


@needs("restore_fails")
def test_unreadable_state_of_the_newest_checkpoint_fails_the_run_with_one_clear_line(
        scenarios: dict[str, Future[Any]]) -> None:
    outcome = scenarios["restore_fails"].result()["state_always"]
    run = outcome.last
    assert run.returncode == 1, run.describe()
    assert "Traceback" not in run.stderr, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1, run.stderr
    assert f"checkpoint {outcome.newest}" in errors[0] and "injected fault" in errors[0], \
        errors
    assert run.finished and run.finished["status"] == "failed"
