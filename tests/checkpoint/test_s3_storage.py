"""Storage on a real S3 API server (MinIO on 127.0.0.1, the `s3` fixture): atomic and verified
transfers, exclusive creation by conditional PUT (the job registry's claims, checkpoints'
`_metadata`), the control channel, and unfinished multipart uploads aborted by pruning."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from streamer.checkpoint.checkpoint_metadata import (
    CheckpointError,
    CheckpointMetadata,
    CheckpointStore,
)
from streamer.runtime.job.control import ControlChannel, JobAlreadyRunningError, JobRegistry
from streamer.storage import CorruptFileError, MissingFileError, Storage

pytestmark = pytest.mark.s3


@pytest.fixture
def url(s3: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh prefix of the test bucket, reached through the `AWS_*` variables."""
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    return f"s3://streamer/{uuid.uuid4().hex[:10]}"


def test_writes_reads_listings_and_verified_transfers(url: str, tmp_path: Path) -> None:
    storage = Storage(url)
    assert storage.url == url
    storage.write_atomic("a/b/one.json", b"1")
    storage.write_atomic("a/b/one.json", b"22")  # replaced whole
    assert storage.read_bytes("a/b/one.json") == b"22"
    assert storage.ls("a") == ["b"] and storage.ls("a/b") == ["one.json"]
    assert storage.info("a/b/one.json") == 2 and storage.info("a/b/none") is None
    with pytest.raises(MissingFileError, match="none"):
        storage.read_bytes("a/b/none")
    local = tmp_path / "sst"
    local.write_bytes(b"x" * 100_000)
    ref = storage.put_file(local, "shared", name_from_hash=lambda digest: f"{digest}.sst")
    again = storage.put_file(local, "shared", name_from_hash=lambda d: f"{d}.sst",
                             overwrite=False)
    assert ref.written and not again.written and again.path == ref.path
    storage.get_file(ref, tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == local.read_bytes()
    with pytest.raises(CorruptFileError, match="sha256"):
        storage.get_file(ref.path, tmp_path / "bad", size=ref.size, sha256="0" * 64)
    assert not (tmp_path / "bad").exists()
    storage.rm("a", recursive=True)
    assert not storage.exists("a/b/one.json")


def test_exclusive_creation_is_a_conditional_put_with_one_winner(url: str) -> None:
    storage = Storage(url)
    assert storage.create_exclusive("claims/1.json", b"a")
    assert not storage.create_exclusive("claims/1.json", b"b")
    assert storage.read_bytes("claims/1.json") == b"a"
    results: list[bool] = []
    barrier = threading.Barrier(6)

    def create(i: int) -> None:
        barrier.wait()
        results.append(Storage(url).create_exclusive("claims/2.json", f"run-{i}".encode()))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 5 + [True]


def test_a_second_run_is_refused_and_requests_reach_the_job(url: str) -> None:
    JobRegistry(url, "job").claim("run-a", {})
    with pytest.raises(JobAlreadyRunningError, match="run-a"):
        JobRegistry(url, "job").claim("run-b", {})
    channel = ControlChannel(url, "job")
    rid = channel.request("savepoint")
    assert [r["id"] for r in ControlChannel(url, "job").pending()] == [rid]
    channel.respond(rid, "completed", path="s3://x")
    assert ControlChannel(url, "job").pending() == []
    assert channel.wait(rid, timeout_s=1)["path"] == "s3://x"


def _meta(checkpoint_id: int, epoch: int) -> CheckpointMetadata:
    return CheckpointMetadata(checkpoint_id=checkpoint_id, job="job", run_id="run",
                              epoch=epoch, created_at=0.0, mode="exactly_once", offsets={},
                              watermark={})


def test_metadata_is_created_once_and_never_replaced_by_another_run(url: str) -> None:
    store = CheckpointStore(url, "job")
    store.write(_meta(1, 5))
    store.write(_meta(1, 5))  # the same bytes again: fine (a retried PUT)
    with pytest.raises(CheckpointError, match="completed by another run"):
        store.write(_meta(1, 6))
    assert store.read(1).epoch == 5


def test_pruning_aborts_unfinished_multipart_uploads(url: str, s3: Any) -> None:
    fs = s3.filesystem()
    prefix = url.removeprefix("s3://streamer/")
    started = fs.call_s3("create_multipart_upload", Bucket="streamer",
                         Key=f"{prefix}/job/checkpoints/shared/op/big.sst")
    fs.call_s3("upload_part", Bucket="streamer", Key=f"{prefix}/job/checkpoints/shared/op/big.sst",
               UploadId=started["UploadId"], PartNumber=1, Body=b"y" * (5 << 20))
    other = fs.call_s3("create_multipart_upload", Bucket="streamer", Key="elsewhere/file")

    def uploads() -> list[str]:
        found = fs.call_s3("list_multipart_uploads", Bucket="streamer").get("Uploads", [])
        return sorted(u["Key"] for u in found)

    assert f"{prefix}/job/checkpoints/shared/op/big.sst" in uploads()
    store = CheckpointStore(url, "job")
    store.write(_meta(1, 1))
    store.prune(1, temporaries_after_s=3600)  # younger than that: maybe still running
    assert f"{prefix}/job/checkpoints/shared/op/big.sst" in uploads()
    store.prune(1, temporaries_after_s=0)
    assert f"{prefix}/job/checkpoints/shared/op/big.sst" not in uploads()
    assert "elsewhere/file" in uploads()  # not under the job's checkpoints: kept
    fs.call_s3("abort_multipart_upload", Bucket="streamer", Key="elsewhere/file",
               UploadId=other["UploadId"])
