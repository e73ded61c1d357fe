"""Checkpoint snapshots of a subtask's state and restores from them, against both backends:
real RocksDB and real files, local storage and faulty:// storage.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from streamer.state import (
    KeyedStateBackend,
    StateDescriptor,
    SubtaskLocation,
    Timer,
    memory_files,
    open_backend,
)
from streamer.state.codec import encode_key, encode_window
from streamer.state.exceptions import (
    CorruptSnapshotError,
    SnapshotError,
    SnapshotTimeoutError,
    StateError,
)
from streamer.state.snapshot import (
    local_copy_dir,
    prune_local_copies,
    referenced_files,
    restore_snapshot,
    take_snapshot,
)
from streamer.storage import Storage, sha256_file
from streamer.testing.storage_faults import FAULTS_ENV

STATES = (StateDescriptor("value", "value"), StateDescriptor("acc", "aggregating"),
          StateDescriptor("items", "list"), StateDescriptor("attrs", "map"))
KG = range(8)


class Env:
    """Paths of one test: the working state root, the checkpoint storage, local copies."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.tmp = tmp_path
        self.state_root = tmp_path / "state"
        self.storage = tmp_path / "checkpoints"
        self.url = str(self.storage)
        self.local = str(tmp_path / "local")
        self.opened: list[KeyedStateBackend] = []

    def open(self, root: Path | None = None) -> KeyedStateBackend:
        backend = open_backend(self.kind, str(root or self.state_root), "job", "op", 0, KG,
                               states=STATES)
        self.opened.append(backend)
        return backend

    def location(self, root: Path | None = None) -> SubtaskLocation:
        return SubtaskLocation(str(root or self.state_root), "job", "op", 0)

    def snapshot(self, backend: KeyedStateBackend, cid: int, base: dict[str, Any] | None,
                 **kwargs: Any) -> dict[str, Any]:
        kwargs.setdefault("local_copy_root", self.local)
        return take_snapshot(backend, kwargs.pop("url", self.url), cid, base=base, **kwargs)

    def restored(self, handle: dict[str, Any], *, local: bool = True,
                 url: str | None = None) -> tuple[str, dict[str, Any]]:
        """Restore `handle` into a fresh root; how it was restored, and what the state holds."""
        root = self.tmp / f"restored-{time.monotonic_ns()}"
        how = restore_snapshot(handle, url or self.url, self.location(root),
                               local_copy_root=self.local if local else None)
        with self.open(root) as backend:
            return how, contents(backend)

    def close_all(self) -> None:
        for backend in self.opened:
            backend.close()


@pytest.fixture(params=["memory", "rocksdb"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    environment = Env(request.param, tmp_path)
    yield environment
    environment.close_all()
    memory_files.drop_process_cache()


def contents(backend: KeyedStateBackend) -> dict[str, Any]:
    """Everything observable about committed state: version, outputs, entries, timers."""
    entries, timers = [], []
    for kg in backend.key_groups:
        for entry in backend.entries_of_key_group(kg):
            if isinstance(entry, Timer):
                timers.append((entry.domain.value, entry.time_ms, kg, entry.key, entry.namespace))
            else:
                entries.append((kg, entry.state, entry.key, entry.namespace,
                                entry.user_key or b"", repr(entry.value), entry.expires_at_ms))
    version = backend.version()
    outputs = {v: backend.outputs(v) for v in range(1, (version or 0) + 1)}
    return {"version": version, "outputs": {v: o for v, o in outputs.items() if o is not None},
            "entries": sorted(entries), "timers": sorted(timers)}


def epoch(backend: KeyedStateBackend, n: int, keys: range, tag: str = "") -> None:
    """Write a bit of every kind of state for `keys` and commit epoch `n`."""
    for i in keys:
        kg, key = i % 8, encode_key((f"user-{i}",))
        backend.put("value", kg, key, b"", f"{tag}v{n}-{i}")
        backend.put("acc", kg, key, encode_window(n * 1000, n * 1000 + 1000), (n, i * 1.5),
                    expires_at_ms=10**12 + i)
        backend.append("items", kg, key, b"", (tag, n, i))
        backend.map_put("attrs", kg, key, b"", f"k{n}".encode(), i)
        backend.add_timer("event", kg, n * 1000 + i, key)
    backend.add_timer("processing", 3, n, encode_key(("p",)))
    backend.commit(n, f"{tag}out-{n}".encode())


def storage_files(root: Path) -> dict[str, str]:
    """Storage-relative path -> sha256 of every file under `root`."""
    return {str(p.relative_to(root)): sha256_file(p) for p in sorted(root.rglob("*"))
            if p.is_file()}


# ------------------------------------------------------------------------------ round trips
def test_snapshots_restore_exactly_the_committed_state(env: Env) -> None:
    backend = env.open()
    for n in (1, 2, 3):
        epoch(backend, n, range(n * 50))
    backend.delete("value", 1, encode_key(("user-1",)))
    backend.commit(4, None)
    expected1 = contents(backend)
    backend.put("value", 0, encode_key(("uncommitted",)), b"", "buffered")  # not committed
    h1 = env.snapshot(backend, 1, None)
    backend.abort()
    for n in (5, 6):
        epoch(backend, n, range(100, 130), tag="x")
    expected2 = contents(backend)
    h2 = env.snapshot(backend, 2, h1)
    backend.close()

    assert json.loads(json.dumps(h2)) == h2
    assert (h1["backend"], h1["uid"], h1["subtask"], h1["version"], h1["checkpoint_id"]) == \
        (env.kind, "op", 0, 4, 1)
    assert h2["version"] == 6 and h2["key_groups"] == [0, 8] and range(*h2["key_groups"]) == KG
    if env.kind == "memory":  # exact; rocksdb's count is an estimate
        assert h1["keys"] == {"value": 149, "acc": 300, "items": 150, "attrs": 300}
    else:
        assert abs(h1["keys"]["value"] - 149) <= 5 and set(h1["keys"]) == set(h2["keys"])
    assert h1["uploaded_bytes"] == h1["state_size"] == sum(f["size"] for f in h1["files"])
    assert all(f["uploaded"] for f in h1["files"])
    stored = storage_files(env.storage)
    assert referenced_files(h1) | referenced_files(h2) == set(stored)
    for f in h1["files"] + h2["files"]:
        assert stored[f["path"]] == f["sha256"]
        assert f["path"].startswith("shared/op/subtask-0/" if f["shared"] else
                                    f"chk-{1 if f in h1['files'] else 2}/op/subtask-0/")
    if env.kind == "rocksdb":
        reused = [f for f in h2["files"] if not f["uploaded"]]
        assert reused and all(f["shared"] for f in reused)
        assert {f["path"] for f in reused} <= referenced_files(h1)
        assert h2["uploaded_bytes"] == sum(f["size"] for f in h2["files"] if f["uploaded"])
    else:
        assert [f["shared"] for f in h2["files"]] == [False]

    for handle, expected in ((h1, expected1), (h2, expected2)):
        assert env.restored(handle) == ("local", expected)
    shutil.rmtree(env.local)
    for handle, expected in ((h1, expected1), (h2, expected2)):
        assert env.restored(handle) == ("remote", expected)


def test_restore_replaces_what_the_target_holds(env: Env) -> None:
    with env.open() as backend:
        epoch(backend, 1, range(20))
        handle = env.snapshot(backend, 1, None)
        expected = contents(backend)
        epoch(backend, 2, range(20, 40))  # the working state moves on
    assert restore_snapshot(handle, env.url, env.location(), local_copy_root=env.local) == \
        "local"
    with env.open() as backend:
        assert contents(backend) == expected  # not a process-cached copy of version 2
    junk = env.location().path / "junk"
    junk.write_text("left over")
    assert restore_snapshot(handle, env.url, env.location(), local_copy_root=None) == "remote"
    assert not junk.exists()
    with env.open() as backend:
        assert contents(backend) == expected


def test_rocksdb_snapshots_upload_only_new_files(tmp_path: Path) -> None:
    """A small change on a large state uploads a small part of it; data that was only in the
    write-ahead log and memtable when the snapshot was taken is in it.
    """
    env = Env("rocksdb", tmp_path)
    backend = env.open()
    try:
        n = 200_000
        backend.put_many("value", [(i % 8, encode_key((i,)), b"", f"value-{i}" * 4)
                                   for i in range(n)])
        backend.commit(1)
        h1 = env.snapshot(backend, 1, None)
        backend.put_many("value", [(i % 8, encode_key((i,)), b"", "changed") for i in range(10)])
        backend.add_timer("event", 1, 5, encode_key((1,)))
        backend.commit(2, b"out")  # only in the write-ahead log and memtable until snapshotted
        h2 = env.snapshot(backend, 2, h1)
    finally:
        backend.close()
    assert h1["state_size"] > 1_000_000 and h1["keys"] == {
        "acc": 0, "attrs": 0, "items": 0, "value": n}
    assert h2["uploaded_bytes"] < h2["state_size"] / 20
    assert h2["uploaded_bytes"] < 100_000
    shutil.rmtree(env.local)
    how, state = env.restored(h2)
    assert how == "remote" and state["version"] == 2 and state["outputs"] == {2: b"out"}
    assert len(state["entries"]) == n
    values = {e[2]: e[5] for e in state["entries"]}
    assert values[encode_key((3,))] == repr("changed")
    assert values[encode_key((10,))] == repr("value-10" * 4)
    assert state["timers"] == [("event", 5, 1, encode_key((1,)), b"")]


# ------------------------------------------------------------------------------ corruption
def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def largest(handle: dict[str, Any]) -> dict[str, Any]:
    return max(handle["files"], key=lambda f: f["size"])


def test_a_corrupt_remote_file_is_refused(env: Env) -> None:
    with env.open() as backend:
        epoch(backend, 1, range(30))
        handle = env.snapshot(backend, 1, None)
    victim = largest(handle)
    flip_a_byte(env.storage / victim["path"])
    target = env.location(env.tmp / "target")
    with pytest.raises(CorruptSnapshotError) as info:
        restore_snapshot(handle, env.url, target, local_copy_root=None)
    message = str(info.value)
    assert "checkpoint 1 of operator 'op' subtask 0" in message
    assert repr(victim["name"]) in message and "sha256" in message
    assert "restore from an earlier checkpoint" in message
    assert not target.path.exists()
    assert [p.name for p in target.path.parent.iterdir()] == []  # no staging left behind

    (env.storage / victim["path"]).unlink()
    with pytest.raises(CorruptSnapshotError, match=victim["name"]):
        restore_snapshot(handle, env.url, target, local_copy_root=None)
    # the local copy is intact: it is used, and storage is not read
    assert restore_snapshot(handle, env.url, target, local_copy_root=env.local) == "local"


def test_a_corrupt_local_copy_falls_back_to_storage(env: Env) -> None:
    with env.open() as backend:
        epoch(backend, 1, range(30))
        handle = env.snapshot(backend, 1, None)
        expected = contents(backend)
    copy = local_copy_dir(env.local, "job", "op", 0, 1)
    victim = copy / largest(handle)["name"]
    victim.unlink()  # a hard link: break it before damaging the copy's file only
    shutil.copyfile(env.storage / largest(handle)["path"], victim)
    flip_a_byte(victim)
    assert env.restored(handle) == ("remote", expected)
    victim.unlink()
    assert env.restored(handle) == ("remote", expected)


# ------------------------------------------------------------------------------ failures
def test_a_failed_upload_leaves_earlier_checkpoints_intact(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    rules = env.tmp / "faults.json"
    monkeypatch.setenv(FAULTS_ENV, str(rules))
    url = f"faulty://{env.storage}"
    backend = env.open()
    epoch(backend, 1, range(40))
    h1 = env.snapshot(backend, 1, None, url=url)
    expected1 = contents(backend)
    before = storage_files(env.storage)
    epoch(backend, 2, range(40, 80))
    # rocksdb: the new SSTs fail; memory: its one (private) snapshot file; half of it is
    # written to a temporary name first, as by a writer dying mid-upload.
    pattern = "*/shared/*" if env.kind == "rocksdb" else "*/chk-2/*.pkl"
    rules.write_text(json.dumps({"rules": [{"op": "write", "match": pattern,
                                            "partial": True}]}))
    with pytest.raises(SnapshotError, match=r"checkpoint 2 of operator 'op' subtask 0: "
                                            r"cannot upload .*injected fault") as info:
        env.snapshot(backend, 2, h1, url=url)
    assert isinstance(info.value, StateError)
    after = storage_files(env.storage)
    new = {path for path in after.keys() - before.keys()
           if not path.rsplit("/", 1)[1].startswith(".")}  # temporary files are never final
    assert all(path.startswith("chk-2/") and not path.endswith((".sst", ".pkl"))
               for path in new)
    assert any(path.rsplit("/", 1)[1].startswith(".") for path in after)  # the partial one
    assert {p: after[p] for p in before} == before  # checkpoint 1 untouched
    assert not local_copy_dir(env.local, "job", "op", 0, 2).exists()
    assert sorted(p.name for p in local_copy_dir(env.local, "job", "op", 0, 1).parent.iterdir()) \
        == ["chk-1"]
    # the working state is fine: the next checkpoint succeeds once storage is healthy again
    expected2 = contents(backend)
    rules.write_text(json.dumps({"rules": []}))
    h2 = env.snapshot(backend, 2, h1, url=url)
    backend.close()
    shutil.rmtree(env.local)
    assert env.restored(h1, url=url) == ("remote", expected1)
    assert env.restored(h2, url=url) == ("remote", expected2)


def test_a_snapshot_past_its_deadline_is_declined(env: Env) -> None:
    with env.open() as backend:
        epoch(backend, 1, range(10))
        with pytest.raises(SnapshotTimeoutError, match=r"deadline after uploading 0 of"):
            env.snapshot(backend, 1, None, deadline=time.monotonic() - 1)
        uploaded: list[str] = []

        def slow(entry: dict[str, Any]) -> None:  # an upload that takes 0.3 s
            uploaded.append(entry["name"])
            time.sleep(0.3)

        if env.kind == "rocksdb":  # many files: the deadline passes between two uploads
            with pytest.raises(SnapshotTimeoutError, match=r"after uploading 1 of \d+ files"):
                env.snapshot(backend, 1, None, deadline=time.monotonic() + 0.2,
                             after_upload=slow)
            uploaded.clear()
        entries: list[dict[str, Any]] = []
        handle = env.snapshot(backend, 1, None, deadline=time.monotonic() + 60,
                              after_upload=entries.append)
    assert entries == handle["files"]
    assert [p.name for p in local_copy_dir(env.local, "job", "op", 0, 1).parent.iterdir()] == \
        ["chk-1"]  # no staging directory of the declined attempts is left


def test_bad_bases_and_handles_are_refused(env: Env, tmp_path: Path) -> None:
    with env.open() as backend:
        with pytest.raises(SnapshotError, match="commit the epoch"):
            env.snapshot(backend, 1, None)
        epoch(backend, 1, range(5))
        handle = env.snapshot(backend, 1, None)
        with pytest.raises(SnapshotError, match="not of this"):
            env.snapshot(backend, 2, {**handle, "subtask": 3})
        with pytest.raises(SnapshotError, match="does not descend"):
            env.snapshot(backend, 2, {**handle, "version": 9})
    with pytest.raises(SnapshotError, match="format 1"):
        restore_snapshot({**handle, "format": 7}, env.url, env.location(tmp_path / "t"),
                         local_copy_root=None)
    with pytest.raises(SnapshotError, match="malformed file entry"):
        restore_snapshot({**handle, "files": [{"name": "../x", "path": "p", "size": 1,
                                               "sha256": ""}]},
                         env.url, env.location(tmp_path / "t"), local_copy_root=None)
    with pytest.raises(SnapshotError, match="inside the subtask directory"):
        restore_snapshot(handle, env.url, env.location(tmp_path / "t"),
                         local_copy_root=str(tmp_path / "t" / "job" / "op" / "subtask-0"))


# ------------------------------------------------------------------------------ forks
def test_restoring_an_older_checkpoint_forks_without_overwriting_shared_files(env: Env) -> None:
    backend = env.open()
    epoch(backend, 1, range(60))
    h1 = env.snapshot(backend, 1, None)
    expected1 = contents(backend)
    epoch(backend, 2, range(60, 120), tag="a")
    h2 = env.snapshot(backend, 2, h1)
    expected2 = contents(backend)
    epoch(backend, 3, range(0, 30), tag="a")
    h3 = env.snapshot(backend, 3, h2)
    expected3 = contents(backend)
    backend.close()
    before = storage_files(env.storage)

    # fail over to checkpoint 1 and take another path from there
    assert restore_snapshot(h1, env.url, env.location(), local_copy_root=env.local) == "local"
    backend = env.open()
    assert contents(backend) == expected1
    epoch(backend, 2, range(60, 120), tag="b")
    epoch(backend, 3, range(0, 30), tag="b")
    h4 = env.snapshot(backend, 4, h1)
    expected4 = contents(backend)
    backend.close()
    assert expected4 not in (expected2, expected3)

    after = storage_files(env.storage)
    assert {p: after[p] for p in before} == before  # nothing of checkpoints 2 and 3 changed
    if env.kind == "rocksdb":
        earlier = {f["name"]: f["path"] for h in (h2, h3) for f in h["files"]
                   if f["uploaded"] and f["shared"]}
        clashes = [f for f in h4["files"] if f["uploaded"] and f["name"] in earlier]
        assert clashes, "RocksDB reused no SST file number: the fork scenario was not exercised"
        assert all(f["path"] != earlier[f["name"]] for f in clashes)
    shutil.rmtree(env.local)
    for handle, expected in ((h1, expected1), (h2, expected2), (h3, expected3), (h4, expected4)):
        assert env.restored(handle) == ("remote", expected)


def test_a_base_the_state_does_not_descend_from_is_not_trusted(tmp_path: Path) -> None:
    """A base from another lineage whose SSTs have the same names and sizes (two DBs that went
    through the same steps with other values): its files are not reused, since the base's local
    copy shows they are other files with other content.
    """
    env = Env("rocksdb", tmp_path)
    with env.open(tmp_path / "line-a") as backend:
        epoch(backend, 1, range(60), tag="a")
        base = env.snapshot(backend, 1, None)
    with env.open(tmp_path / "line-b") as backend:
        epoch(backend, 1, range(60), tag="b")
        handle = env.snapshot(backend, 2, base)
        expected = contents(backend)
    same = {(f["name"], f["size"]) for f in base["files"] if f["shared"]} & \
        {(f["name"], f["size"]) for f in handle["files"] if f["shared"]}
    assert same, "no SST of the same name and size: the case is not exercised"
    assert all(f["uploaded"] for f in handle["files"])
    shutil.rmtree(env.local)
    assert env.restored(handle) == ("remote", expected)


# ------------------------------------------------------------------------------ local copies
def test_prune_local_copies_keeps_the_given_checkpoints(env: Env) -> None:
    with env.open() as backend:
        for n in (1, 2, 3):
            epoch(backend, n, range(10 * n))
            env.snapshot(backend, n, None)
    parent = local_copy_dir(env.local, "job", "op", 0, 1).parent
    stale = parent / ".chk-9.abc.tmp"
    stale.mkdir()
    assert sorted(p.name for p in parent.iterdir()) == [".chk-9.abc.tmp", "chk-1", "chk-2",
                                                         "chk-3"]
    prune_local_copies(env.local, "job", "op", 0, {2, 3})
    assert sorted(p.name for p in parent.iterdir()) == [".chk-9.abc.tmp", "chk-2", "chk-3"]
    old = time.time() - 7200
    os.utime(stale, (old, old))
    prune_local_copies(env.local, "job", "op", 0, set())
    assert list(parent.iterdir()) == []
    prune_local_copies(env.local, "job", "nobody", 0, set())  # nothing there: fine


def test_a_memory_copy_cached_by_another_process_is_not_mistaken_for_a_restored_dir(
        tmp_path: Path) -> None:
    """Another Python worker may hold a cached copy of the subtask at the very version a
    restored directory reaches again; it must not be used.
    """
    env = Env("memory", tmp_path)
    with env.open() as backend:
        epoch(backend, 1, range(5))
        h1 = env.snapshot(backend, 1, None)
        epoch(backend, 2, range(5), tag="old")
    stale = memory_files._PROCESS_CACHE.copy()  # "another process" keeps version 2 (old)
    restore_snapshot(h1, env.url, env.location(), local_copy_root=env.local)
    with env.open() as backend:
        epoch(backend, 2, range(5), tag="new")
        expected = contents(backend)
    memory_files.drop_process_cache()
    memory_files._PROCESS_CACHE.update(stale)  # that process runs the next task
    with env.open() as backend:
        assert contents(backend) == expected


def test_storage_handles_are_usable_by_url(tmp_path: Path) -> None:
    env = Env("memory", tmp_path)
    with env.open() as backend:
        epoch(backend, 1, range(3))
        handle = env.snapshot(backend, 1, None, local_copy_root=None)
    store = Storage(env.url)
    assert {f"chk-1/op/subtask-0/{f['name']}" for f in handle["files"]} == \
        referenced_files(handle)
    assert all(store.info(path) for path in referenced_files(handle))
    assert not Path(env.local).exists()
    assert sorted(p.name for p in (env.state_root / "job" / "op").iterdir()) == ["subtask-0"]
