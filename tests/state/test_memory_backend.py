"""What is particular to the memory backend: the process cache, delta files and snapshots."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from streamer.state import (
    BackendOptions,
    StateDescriptor,
    memory_files,
    open_backend,
)
from streamer.state.codec import encode_key
from streamer.state.exceptions import CorruptStateError, StateError
from streamer.state.memory_backend import MemoryBackend

STATES = [StateDescriptor("acc", "aggregating"), StateDescriptor("seen", "map")]
K = encode_key(("k",))


@pytest.fixture
def open_memory(tmp_path: Path) -> Any:
    """A factory of memory backends of subtask 0 under tmp_path (the process cache is reset)."""
    opened: list[Any] = []

    def factory(**options: Any) -> MemoryBackend:
        backend = open_backend("memory", str(tmp_path), "job", "op", 0, range(4), states=STATES,
                               options=BackendOptions(**{"lock_timeout_s": 0.05, **options}))
        opened.append(backend)
        assert isinstance(backend, MemoryBackend)
        return backend

    memory_files.drop_process_cache()
    yield factory
    for backend in opened:
        backend.close()
    memory_files.drop_process_cache()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the state files read from now on."""
    seen: list[str] = []
    original = memory_files._read_record

    def spy(file: Path, kind: str) -> dict[str, Any]:
        seen.append(file.name)
        return original(file, kind)

    monkeypatch.setattr(memory_files, "_read_record", spy)
    return seen


def files(tmp_path: Path) -> list[str]:
    return sorted(f for f in os.listdir(tmp_path / "job" / "op" / "subtask-0") if f != "LOCK")


def commit_epochs(open_memory: Any, first: int, count: int, size: int = 10) -> None:
    for epoch in range(first, first + count):
        with open_memory() as backend:
            backend.put_many("acc", [(i % 4, encode_key((i,)), b"", epoch) for i in range(size)])
            backend.commit(epoch, f"out-{epoch}".encode())


def test_a_later_task_in_the_same_process_reuses_the_dicts(open_memory: Any,
                                                           reads: list[str]) -> None:
    commit_epochs(open_memory, 1, 3)
    with open_memory() as backend:
        assert backend.get("acc", 1, encode_key((5,))) == 3
    assert reads == []  # no file was read: the cached copy was at the latest version


def test_a_process_with_an_older_copy_applies_only_newer_deltas(open_memory: Any,
                                                                reads: list[str]) -> None:
    commit_epochs(open_memory, 1, 1)
    stale = memory_files._PROCESS_CACHE.copy()  # this "process" saw version 1 ...
    memory_files.drop_process_cache()
    commit_epochs(open_memory, 2, 2)  # ... then "another process" committed 2 and 3
    memory_files._PROCESS_CACHE.update(stale)
    reads.clear()
    with open_memory() as backend:
        assert backend.version() == 3
        assert backend.outputs(3) == b"out-3"
        assert backend.get("acc", 1, encode_key((5,))) == 3
    assert reads == ["delta-00000000000000000002.pkl", "delta-00000000000000000003.pkl"]


def test_snapshots_are_written_once_deltas_outweigh_them(open_memory: Any, tmp_path: Path,
                                                         reads: list[str]) -> None:
    commit_epochs(open_memory, 1, 1, size=20_000)  # > 64 KiB: the first commit materializes
    assert files(tmp_path) == ["snapshot-00000000000000000001.pkl"]
    commit_epochs(open_memory, 2, 1, size=10)  # small: only a delta
    assert files(tmp_path) == ["delta-00000000000000000002.pkl",
                               "snapshot-00000000000000000001.pkl"]
    memory_files.drop_process_cache()
    reads.clear()
    with open_memory() as backend:
        assert backend.version() == 2
        assert backend.get("acc", 3, encode_key((19_999,))) == 1
        assert backend.get("acc", 3, encode_key((3,))) == 2
    assert reads == ["snapshot-00000000000000000001.pkl", "delta-00000000000000000002.pkl"]


def test_a_broken_delta_chain_is_reported(open_memory: Any, tmp_path: Path) -> None:
    commit_epochs(open_memory, 1, 3)
    (tmp_path / "job" / "op" / "subtask-0" / "delta-00000000000000000002.pkl").unlink()
    memory_files.drop_process_cache()
    with pytest.raises(CorruptStateError, match="does not follow version 1"):
        open_memory()


def test_a_corrupt_file_is_reported(open_memory: Any, tmp_path: Path) -> None:
    commit_epochs(open_memory, 1, 2)
    (tmp_path / "job" / "op" / "subtask-0" / "delta-00000000000000000002.pkl").write_bytes(b"x")
    memory_files.drop_process_cache()
    with pytest.raises(CorruptStateError, match="restore from a checkpoint"):
        open_memory()
    with pytest.raises(CorruptStateError):  # not StateLockedError: the failed open let go
        open_memory(lock_timeout_s=0.0)


def test_a_failed_commit_leaves_the_last_version(open_memory: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    commit_epochs(open_memory, 1, 1)
    backend = open_memory()
    backend.put("acc", 0, K, b"", "lost")

    def disk_full(*_: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(memory_files, "write_atomic", disk_full)
    with pytest.raises(StateError, match="No space left"):
        backend.commit(2)
    with pytest.raises(StateError, match="failed after an error"):
        backend.get("acc", 0, K)
    backend.close()
    monkeypatch.undo()
    with open_memory() as again:
        assert again.version() == 1
        assert again.get("acc", 0, K) is None


def test_the_process_cache_can_be_turned_off(open_memory: Any, reads: list[str]) -> None:
    commit_epochs(open_memory, 1, 2)
    memory_files.drop_process_cache()
    for _ in range(2):
        with open_memory(process_cache=False) as backend:
            assert backend.version() == 2
    assert len(reads) == 4


def test_the_process_cache_frees_subtasks_of_ended_runs(tmp_path: Path) -> None:
    """A Python worker outlives runs: copies of subtasks whose working state was removed (the
    run ended) are freed when the next task closes, and at most MAX_CACHED are kept."""
    import shutil

    memory_files.drop_process_cache()

    def run_task(root: Path, subtask: int) -> str:
        backend = open_backend("memory", str(root), "job", "op", subtask, range(4),
                               states=STATES)
        backend.put_many("acc", [(0, K, b"", 1)])
        backend.commit(1)
        path = os.path.abspath(backend.path)
        backend.close()
        return path

    try:
        ended = run_task(tmp_path / "run-1", 0)
        assert ended in memory_files._PROCESS_CACHE
        shutil.rmtree(tmp_path / "run-1")  # the run ended
        live = run_task(tmp_path / "run-2", 0)
        assert set(memory_files._PROCESS_CACHE) == {live}
        paths = [run_task(tmp_path / "run-2", i) for i in range(1, memory_files.MAX_CACHED + 2)]
        assert len(memory_files._PROCESS_CACHE) == memory_files.MAX_CACHED
        assert live not in memory_files._PROCESS_CACHE
        assert paths[0] not in memory_files._PROCESS_CACHE
        assert paths[-1] in memory_files._PROCESS_CACHE
    finally:
        memory_files.drop_process_cache()


def test_files_written_before_the_split_by_concept_still_load(tmp_path: Path) -> None:
    """A subtask directory written by commit 0038b52, whose pickles name
    `streamer.state.memory._Changes`, `_MapChange`, `_Expiring` and `_TOMBSTONE`, opens with
    every value, expiry, deletion and output it committed, and takes the next epoch."""
    fixture = Path(__file__).parent / "fixtures" / "memory-0038b52" / "subtask-0"
    target = tmp_path / "job" / "op" / "subtask-0"
    shutil.copytree(fixture, target)
    for name in os.listdir(target):
        assert b"streamer.state.memory\x94" in (target / name).read_bytes()  # the old names
    states = [StateDescriptor("acc", "value"), StateDescriptor("seen", "map"),
              StateDescriptor("log", "list")]
    later = 4_000_000_000_000

    def key(n: int) -> bytes:
        return encode_key((f"k{n}",))

    memory_files.drop_process_cache()
    with open_backend("memory", str(tmp_path), "job", "op", 0, range(4), states=states) as b:
        assert b.version() == 3 and b.outputs(3) == b"out-3"
        assert b.get_many("acc", [(0, key(1), b""), (1, key(2), b""), (3, key(3), b""),
                                  (2, key(4), b"")], now_ms=0) == [10, None, 3, 4]
        assert b.map_items("seen", 0, key(1), now_ms=0) == [(b"a", 1), (b"c", 3)]
        assert b.get("log", 0, key(1)) == ["x", "y"]
        expiries = {e.key: e.expires_at_ms for e in b.entries_of_key_group(0) if e.state == "acc"}
        assert expiries == {key(1): later}
        b.put_many("acc", [(3, key(3), b"", 30)])
        b.commit(4, b"out-4")
    memory_files.drop_process_cache()
    with open_backend("memory", str(tmp_path), "job", "op", 0, range(4), states=states) as b:
        assert b.version() == 4 and b.get("acc", 3, key(3)) == 30 and b.get("acc", 0, key(1)) == 10
    assert b"streamer.state.memory_values" in (target / f"delta-{4:020d}.pkl").read_bytes()
