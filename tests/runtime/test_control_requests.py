"""Every control request a running or starting job accepts is honoured once, at its next
epoch boundary, or refused with a reason (issue 39), whatever the job is doing when it
arrives. A `pause=` fail point holds the job at each moment (before its first epoch,
resuming from a checkpoint, restoring in a restart under `job.restart`, between epochs,
inside a checkpoint); the request is filed while it is held, as `streamer savepoint trigger`,
`stop [--savepoint]` and `cancel` file theirs (addressed to the run the registry shows).

The job is a rate-limited bounded datagen, so its first boundary plans no rows: a savepoint
taken there must not wait for data (the bug: it was accepted, then dropped)."""

from __future__ import annotations

import json
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from streamer_process import FilesOutput

from streamer import failpoints
from streamer.pipeline.validate import load_pipeline_text
from streamer.runtime.job.control import ControlChannel, JobControlError, JobRegistry
from streamer.runtime.job.coordinator import JobResult, JobRunner, RunOptions
from streamer.runtime.observe.metrics import JsonReporter
from streamer.savepoint.savepoint_metadata import list_savepoints, read_metadata

pytestmark = pytest.mark.spark

NAME = "ctl"
PIPELINE = """
name: ctl
storage: {storage}
{options}job:
  parallelism: 1
  epoch: 200ms
  checkpoint: {{interval: 1ms}}
  restart: {{attempts: 1, delay: 0s}}
  state: {{backend: memory, local_dir: {local}}}
sources:
  - id: gen
    type: datagen
    splits: 2
    limit: {limit}
    rows_per_second: {rate}
    max_records_per_epoch: 200
    fields:
      user: "concat('u', cast((offset * 7 + split) % 13 as string))"
operators:
  - id: per_user
    uid: per-user-v1
    input: gen
    key_by: [user]
    aggregate: {{n: count()}}
sinks:
  - id: out
    type: files
    input: per_user
    path: {out}
    format: jsonl
"""

REQUESTS = {"savepoint": {"kind": "savepoint"}, "stop": {"kind": "stop"},
            "stop-savepoint": {"kind": "stop", "savepoint": True},
            "cancel": {"kind": "cancel"}}


class Held:
    """A job run in this process with a `pause=` fail point armed: a thread waits until the
    job is held there, files the request, then lets the job go on."""

    def __init__(self, tmp: Path, storage: str | None = None, options: str = "") -> None:
        self.tmp = tmp
        self.storage = storage or str(tmp / "storage")
        self.options = options
        self.out = tmp / "out"
        self.gate = tmp / "gate"
        self.rid: str | None = None
        self.held: Any = None  # the registry record seen while the job was held

    def text(self, *, limit: int = 400, rate: int = 1000, out: str | None = None) -> str:
        return PIPELINE.format(storage=self.storage, options=self.options, local=self.tmp /
                               "local", out=out or self.out, limit=limit, rate=rate)

    def run(self, spark: Any, monkeypatch: pytest.MonkeyPatch, *, point: str | None = None,
            request: dict[str, Any] | None = None, text: str | None = None,
            **options: Any) -> JobResult:
        if point is not None:
            self.gate.unlink(missing_ok=True)
            Path(f"{self.gate}.reached").unlink(missing_ok=True)
            monkeypatch.setenv(failpoints.DRIVER_PID_ENV, "")  # (the run sets it: undo it)
            monkeypatch.setenv(failpoints.ENV, f"{point}:pause={self.gate}")
        else:
            monkeypatch.delenv(failpoints.ENV, raising=False)
        filer = threading.Thread(target=self._file, args=(request,), daemon=True)
        if request is not None:
            filer.start()
        try:
            spec = load_pipeline_text(textwrap.dedent(text or self.text()))
            runner = JobRunner(spec, RunOptions(ui=False, checkpoints=True, **options),
                               spark=spark, reporter=JsonReporter(_Null()))  # type: ignore[arg-type]
            return runner.run()
        finally:
            self.gate.touch()  # never leave a run held
            if request is not None:
                filer.join(timeout=30)

    def _file(self, request: dict[str, Any] | None) -> None:
        reached = Path(f"{self.gate}.reached")
        deadline = time.monotonic() + 300
        while not reached.exists() and not self.gate.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert request is not None
        if reached.exists() and not self.gate.exists():
            record = JobRegistry(self.storage, NAME).read() or {}
            self.held = record
            self.rid = ControlChannel(self.storage, NAME).request(
                generation=record.get("generation"), run_id=record.get("run_id"), **request)
        self.gate.touch()

    def answer(self) -> dict[str, Any]:
        assert self.rid is not None, "the job was never held at the fail point"
        found = ControlChannel(self.storage, NAME).response(self.rid)
        assert found is not None, f"request {self.rid} was never answered"
        return found

    def savepoints(self) -> list[str]:
        return [url.removeprefix("file://") for url, _, _ in list_savepoints(self.storage, NAME)]


class _Null:
    def write(self, s: str) -> None:
        pass

    def flush(self) -> None:
        pass


def committed(directory: Path) -> Counter[str]:
    return FilesOutput(directory).committed()


def check_honoured(job: Held, kind: str, result: JobResult) -> None:
    """The request was honoured exactly once, and answered so."""
    answer = job.answer()
    assert answer["status"] == "completed", answer
    if kind in ("savepoint", "stop-savepoint"):
        assert result.savepoints == [answer["path"]], (result.savepoints, answer)
        assert job.savepoints() == [answer["path"]]
        meta = read_metadata(answer["path"])
        assert meta.epoch == answer["epoch"] and "per-user-v1" in meta.operators
    else:
        assert result.savepoints == [] and job.savepoints() == []
    assert result.status == {"savepoint": "finished", "stop": "stopped",
                             "stop-savepoint": "stopped", "cancel": "cancelled"}[kind], result


#: Where the job is held: before its first epoch (claimed, Spark not yet started), between
#: epochs (before epoch 2's work; the boundary after epoch 1 has passed), inside checkpoint 2
#: (snapshots uploaded, `_metadata` not yet written).
MOMENTS = {"starting": "starting:0", "between-epochs": "epoch-start:2",
           "in-a-checkpoint": "after-snapshot:2"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(REQUESTS))
@pytest.mark.parametrize("moment", list(MOMENTS))
def test_a_request_is_honoured_once_whenever_it_arrives(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moment: str,
        kind: str) -> None:
    job = Held(tmp_path)
    result = job.run(spark, monkeypatch, point=MOMENTS[moment], request=REQUESTS[kind])
    check_honoured(job, kind, result)
    if moment == "starting":  # taken at the first boundary, which plans no rows
        assert job.held["phase"] == "starting" and "epoch" not in job.held
        assert job.answer().get("epoch", 1) == 1
        assert kind == "savepoint" or result.epochs <= 1, result
    else:
        assert job.held["phase"] == "running"


@pytest.mark.parametrize("kind", list(REQUESTS))
def test_a_request_sent_while_resuming_from_a_checkpoint_is_honoured(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    job = Held(tmp_path)
    first = job.run(spark, monkeypatch, max_epochs=2)
    assert first.status == "stopped" and first.checkpoints, first
    result = job.run(spark, monkeypatch, point="recovering:0", request=REQUESTS[kind])
    assert result.restored_from == first.checkpoints[-1]
    check_honoured(job, kind, result)


@pytest.mark.parametrize("kind", list(REQUESTS))
def test_a_request_sent_during_a_restart_is_honoured(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Epoch 3's staged output fails once: the job restarts (`job.restart`) from checkpoint
    2, and is held while it restores it."""
    import streamer.testing.storage_faults  # noqa: F401 - registers faulty:// in this process

    rules = tmp_path / "faults.json"
    rules.write_text(json.dumps({"rules": [
        {"op": "write", "match": "*/_staging/epoch-00000003/*", "times": 1}]}))
    monkeypatch.setenv("STREAMER_TEST_FAULTS", str(rules))
    job = Held(tmp_path)
    result = job.run(spark, monkeypatch, point="recovering:2", request=REQUESTS[kind],
                     text=job.text(out=f"faulty://{job.out}"))
    assert result.restarts == 1, result
    assert job.held["phase"] == "restarting"
    check_honoured(job, kind, result)


def test_a_savepoint_accepted_before_a_failed_epoch_is_written_after_the_restart(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The request is taken at the boundary after epoch 2; epoch 3, which would write it,
    fails; the restarted job writes it (it stays owed), and it restores exactly."""
    import streamer.testing.storage_faults  # noqa: F401

    rules = tmp_path / "faults.json"
    rules.write_text(json.dumps({"rules": [
        {"op": "write", "match": "*/_staging/epoch-00000003/*", "times": 1}]}))
    monkeypatch.setenv("STREAMER_TEST_FAULTS", str(rules))
    job = Held(tmp_path)
    result = job.run(spark, monkeypatch, point="epoch-start:2", request=REQUESTS["savepoint"],
                     text=job.text(out=f"faulty://{job.out}"))
    assert result.restarts == 1, result
    check_honoured(job, "savepoint", result)
    assert read_metadata(result.savepoints[0]).epoch >= 3


def test_requests_answered_when_the_job_ends_first(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request filed after the last boundary of a run that then ends (here: held in its
    final checkpoint) is answered with how and why the run ended; a later run refuses a
    request still addressed to an earlier one; the waiting client hears it at once."""
    job = Held(tmp_path)
    result = job.run(spark, monkeypatch, point="after-snapshot:2", max_epochs=2,
                     request=REQUESTS["savepoint"])
    assert result.status == "stopped" and result.savepoints == []
    answer = job.answer()
    assert answer["status"] == "failed", answer
    assert "the job ended (stopped: reached --max-epochs 2)" in answer["reason"]

    channel = ControlChannel(job.storage, NAME)
    stale = channel.request("stop", generation=job.held["generation"],
                            run_id=job.held["run_id"])
    with pytest.raises(JobControlError, match=r"job 'ctl' ended \(stopped: reached --max-ep"):
        channel.wait(stale, timeout_s=5)
    again = job.run(spark, monkeypatch, max_epochs=1)
    assert again.status == "stopped", again  # the stale stop did not stop it
    refused = channel.response(stale)
    assert refused is not None and refused["status"] == "failed", refused
    assert "sent to run" in refused["reason"] and "send the request again" in refused["reason"]


def counts(directory: Path) -> dict[str, int]:
    """The final count per user: the largest `n` the sink received for it."""
    final: dict[str, int] = {}
    for row in committed(directory):
        user, n = json.loads(row)["user"], json.loads(row)["n"]
        final[user] = max(final.get(user, 0), n)
    return final


def expected_counts(limit: int = 400) -> dict[str, int]:
    """What the pipeline's datagen makes: per user, how many rows."""
    return dict(Counter(f"u{(offset * 7 + split) % 13}" for split in range(2)
                        for offset in range(limit)))


def test_a_savepoint_taken_on_request_restores_exactly(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped with a savepoint asked for between epochs, the job restores into a run that
    counts every row once."""
    job = Held(tmp_path)
    result = job.run(spark, monkeypatch, point="epoch-start:2",
                     request=REQUESTS["stop-savepoint"])
    check_honoured(job, "stop-savepoint", result)
    assert read_metadata(result.savepoints[0]).operators["per-user-v1"]["keys"]
    restored_out = tmp_path / "restored"
    restored = job.run(spark, monkeypatch, from_savepoint=result.savepoints[0],
                       text=job.text(out=str(restored_out)))
    assert restored.status == "finished", restored
    assert counts(restored_out) == expected_counts()


@pytest.fixture
def s3_job(s3: Any, tmp_path: Path) -> Iterator[Held]:
    import uuid

    prefix = f"control-{uuid.uuid4().hex[:8]}"
    options = "storage_options:\n" + "".join(
        f"  {k}: {v}\n" for k, v in s3.storage_options().items())
    yield Held(tmp_path, storage=f"s3://streamer/{prefix}/storage", options=options)


@pytest.mark.s3
@pytest.mark.parametrize("kind", ["savepoint", "stop-savepoint"])
def test_on_s3_a_request_sent_during_start_up_is_honoured(
        spark: Any, s3_job: Held, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    result = s3_job.run(spark, monkeypatch, point="starting:0", request=REQUESTS[kind])
    check_honoured(s3_job, kind, result)
    assert result.savepoints[0].startswith("s3://streamer/")
