"""Checkpoint storage on real file systems: local paths, file://, memory:// and faulty://."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamer.exceptions import StreamerError
from streamer.storage import (
    CorruptFileError,
    FileRef,
    MissingFileError,
    Storage,
    StorageError,
    sha256_file,
)


@pytest.fixture(params=["path", "file", "memory", "faulty"])
def storage(request: pytest.FixtureRequest, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Storage]:
    """A fresh storage root on each kind of URL (faulty:// without rules acts as local)."""
    monkeypatch.delenv("STREAMER_TEST_FAULTS", raising=False)
    root = tmp_path / "store"
    if request.param == "memory":
        url = f"memory://chk-test-{uuid.uuid4().hex[:8]}"
    elif request.param == "path":
        url = str(root)
    else:
        url = f"{request.param}://{root}"
    store = Storage(url)
    yield store
    if request.param == "memory":
        store.rm("", recursive=True)


def local_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_small_files_round_trip(storage: Storage) -> None:
    assert not storage.exists("chk-1/_metadata")
    assert storage.info("chk-1/_metadata") is None
    storage.write_atomic("chk-1/_metadata", b"one")
    storage.write_atomic("chk-1/_metadata", b"two!")  # replaces
    assert storage.read_bytes("chk-1/_metadata") == b"two!"
    assert storage.exists("chk-1/_metadata") and storage.exists("chk-1")
    assert storage.info("chk-1/_metadata") == 4
    storage.write_atomic("chk-2/_metadata", b"x")
    assert storage.ls("") == ["chk-1", "chk-2"]
    assert storage.ls("chk-1") == ["_metadata"]
    assert storage.ls("nothing/here") == []
    storage.rm("chk-1", recursive=True)
    storage.rm("chk-1", recursive=True)  # missing is fine
    storage.rm("never/was")
    assert storage.ls("") == ["chk-2"]
    with pytest.raises(MissingFileError, match="chk-1/_metadata"):
        storage.read_bytes("chk-1/_metadata")


def test_the_url_rebuilds_the_same_storage(storage: Storage) -> None:
    storage.write_atomic("a/b", b"data")
    again = Storage(storage.url)
    assert again.root == storage.root
    assert again.read_bytes("a/b") == b"data"
    assert storage.child("a").read_bytes("b") == b"data"
    assert storage.path("a", "b") == storage.root.rstrip("/") + "/a/b"
    with pytest.raises(StorageError, match="leaves the storage root"):
        storage.path("../elsewhere")


def test_relative_local_paths_are_made_absolute(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = Storage("rel/store")
    assert store.root == str(tmp_path / "rel" / "store")
    assert store.url == f"file://{tmp_path}/rel/store"
    store.write_atomic("x", b"1")
    monkeypatch.chdir("/")
    assert Storage(store.url).read_bytes("x") == b"1"


def test_large_files_are_uploaded_with_their_checksum(storage: Storage, tmp_path: Path) -> None:
    data = os.urandom(3 << 20) + b"tail"
    local = tmp_path / "000012.sst"
    local.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    assert sha256_file(local) == sha
    ref = storage.put_file(local, "chk-1/op/subtask-0/000012.sst")
    assert ref == FileRef("chk-1/op/subtask-0/000012.sst", len(data), sha, written=True)
    assert storage.info(ref.path) == len(data)

    out = tmp_path / "down" / "000012.sst"
    storage.get_file(ref, out)
    assert out.read_bytes() == data
    storage.get_file(ref.path, tmp_path / "down" / "again", size=ref.size, sha256=ref.sha256)
    assert sorted(os.listdir(tmp_path / "down")) == ["000012.sst", "again"]


def test_content_named_uploads_never_overwrite(storage: Storage, tmp_path: Path) -> None:
    local = tmp_path / "000007.sst"
    local.write_bytes(b"content A")

    def name(sha: str) -> str:
        return f"000007-{sha[:16]}.sst"

    first = storage.put_file(local, "shared/op/subtask-0", name_from_hash=name, overwrite=False)
    sha_a = hashlib.sha256(b"content A").hexdigest()
    assert first.path == f"shared/op/subtask-0/000007-{sha_a[:16]}.sst" and first.written
    again = storage.put_file(local, "shared/op/subtask-0", name_from_hash=name, overwrite=False)
    assert again == FileRef(first.path, 9, sha_a, written=False)
    local.write_bytes(b"content B")  # the same local name with other content: another file
    other = storage.put_file(local, "shared/op/subtask-0", name_from_hash=name, overwrite=False)
    assert other.path != first.path
    assert storage.read_bytes(first.path) == b"content A"
    assert storage.ls("shared/op/subtask-0") == sorted(
        [first.path.rsplit("/", 1)[1], other.path.rsplit("/", 1)[1]])


def test_a_corrupt_download_is_refused_and_leaves_nothing(storage: Storage,
                                                          tmp_path: Path) -> None:
    local = tmp_path / "f"
    local.write_bytes(b"0123456789")
    ref = storage.put_file(local, "chk-1/f")
    flipped = bytearray(b"0123456789")
    flipped[3] ^= 0xFF
    storage.write_atomic("chk-1/f", bytes(flipped))
    down = tmp_path / "down"
    with pytest.raises(CorruptFileError, match=r"chk-1/f.*is corrupt: sha256 [0-9a-f]+ instead"):
        storage.get_file(ref, down / "f")
    storage.write_atomic("chk-1/f", b"short")
    with pytest.raises(CorruptFileError, match="size 5 instead of 10"):
        storage.get_file(ref, down / "f")
    with pytest.raises(MissingFileError):
        storage.get_file("chk-9/none", down / "g", size=1, sha256="0" * 64)
    assert os.listdir(down) == []  # no temporary file, nothing at the final name
    assert issubclass(CorruptFileError, StreamerError)


def test_local_writes_leave_no_temporary_files(tmp_path: Path) -> None:
    store = Storage(tmp_path / "s")
    store.write_atomic("chk-1/_metadata", b"m")
    (tmp_path / "f").write_bytes(b"f")
    store.put_file(tmp_path / "f", "chk-1/f")
    store.put_file(tmp_path / "f", "shared", name_from_hash=lambda sha: f"f-{sha[:4]}")
    assert local_files(tmp_path / "s") == ["chk-1/_metadata", "chk-1/f",
                                           f"shared/f-{sha256_file(tmp_path / 'f')[:4]}"]


def test_a_spark_worker_like_process_resolves_faulty_urls(tmp_path: Path) -> None:
    """A fresh interpreter has not imported streamer.testing.storage_faults: fsspec finds it
    through the package's `fsspec.specs` entry point (storage.py knows no `faulty` scheme)."""
    url = f"faulty://{tmp_path}/s"
    code = ("import sys; from streamer.storage import Storage; "
            "s = Storage(sys.argv[1]); s.write_atomic('a/b', b'hi'); print(s.fs.protocol)")
    out = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "STREAMER_TEST_FAULTS"},
                         check=True)
    assert out.stdout.strip() == "faulty"
    assert (tmp_path / "s" / "a" / "b").read_bytes() == b"hi"
