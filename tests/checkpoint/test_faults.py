"""The `faulty://` file system: rules from STREAMER_TEST_FAULTS fail chosen operations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import fsspec
import pytest

from streamer.storage import Storage, StorageError
from streamer.testing.storage_faults import FAULTS_ENV, FaultyFileSystem, InjectedFaultError

Rules = Callable[..., None]


@pytest.fixture
def rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Rules:
    """Write the rules file (again to change the rules; counts restart with `reset=True`)."""
    path = tmp_path / "faults.json"
    monkeypatch.setenv(FAULTS_ENV, str(path))

    def write(*rule_list: dict[str, object], reset: bool = False) -> None:
        path.write_text(json.dumps({"rules": list(rule_list)}))
        if reset:
            Path(str(path) + ".counts.json").unlink(missing_ok=True)

    return write


@pytest.fixture
def fs() -> FaultyFileSystem:
    filesystem = fsspec.filesystem("faulty")
    assert isinstance(filesystem, FaultyFileSystem)
    return filesystem


def attempts(action: Callable[[], object], n: int) -> list[bool]:
    """Run `action` n times; True where it failed with an injected fault."""
    out = []
    for _ in range(n):
        try:
            action()
            out.append(False)
        except InjectedFaultError:
            out.append(True)
    return out


def test_without_rules_it_is_the_local_file_system(tmp_path: Path, fs: FaultyFileSystem,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    fs.pipe_file(f"faulty://{tmp_path}/d/a", b"x")
    assert (tmp_path / "d" / "a").read_bytes() == b"x"
    assert fs.cat_file(f"faulty://{tmp_path}/d/a") == b"x"
    assert fs.ls(f"faulty://{tmp_path}/d") == [f"{tmp_path}/d/a"]
    monkeypatch.setenv(FAULTS_ENV, str(tmp_path / "no-such-file.json"))
    assert fs.cat_file(f"{tmp_path}/d/a") == b"x"


def test_times_fails_that_often_then_passes_and_never_creates_the_target(
        tmp_path: Path, fs: FaultyFileSystem, rules: Rules) -> None:
    rules({"op": "write", "match": "*/shared/*", "times": 2})
    target = tmp_path / "shared" / "f"
    assert attempts(lambda: fs.pipe_file(str(target), b"data"), 1) == [True]
    assert not target.exists()
    assert attempts(lambda: fs.pipe_file(str(target), b"data"), 3) == [True, False, False]
    assert target.read_bytes() == b"data"
    fs.pipe_file(str(tmp_path / "private" / "f"), b"ok")  # another path: not matched
    assert [p.name for p in (tmp_path / "shared").iterdir()] == ["f"]


def test_after_passes_the_first_matches_then_fails_for_good(
        tmp_path: Path, fs: FaultyFileSystem, rules: Rules) -> None:
    (tmp_path / "chk-3").mkdir()
    (tmp_path / "chk-3" / "_metadata").write_bytes(b"m")
    rules({"op": "read", "match": "*chk-3/_metadata", "after": 2})
    path = str(tmp_path / "chk-3" / "_metadata")
    assert attempts(lambda: fs.cat_file(path), 4) == [False, False, True, True]
    with pytest.raises(InjectedFaultError, match="injected fault"):
        fs.open(path, "rb")
    with pytest.raises(InjectedFaultError):
        fs.get_file(path, str(tmp_path / "copy"))
    assert not (tmp_path / "copy").exists()


def test_delete_list_and_any(tmp_path: Path, fs: FaultyFileSystem, rules: Rules) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"f")
    rules({"op": "delete", "match": "*/d/f"}, {"op": "list", "match": "*/d"})
    with pytest.raises(InjectedFaultError):
        fs.rm(str(tmp_path / "d" / "f"))
    with pytest.raises(InjectedFaultError):
        fs.ls(str(tmp_path / "d"))
    with pytest.raises(InjectedFaultError):
        fs.exists(str(tmp_path / "d"))
    assert fs.cat_file(str(tmp_path / "d" / "f")) == b"f"
    rules({"op": "any", "match": "*/d/f"})
    for action in (lambda: fs.cat_file(str(tmp_path / "d" / "f")),
                   lambda: fs.pipe_file(str(tmp_path / "d" / "f"), b"g"),
                   lambda: fs.rm_file(str(tmp_path / "d" / "f")),
                   lambda: fs.info(str(tmp_path / "d" / "f"))):
        with pytest.raises(InjectedFaultError):
            action()
    assert (tmp_path / "d" / "f").read_bytes() == b"f"
    rules()
    fs.rm(str(tmp_path / "d"), recursive=True)  # rules are re-read on every operation
    assert not (tmp_path / "d").exists()


def test_a_partial_write_leaves_only_a_temporary_file(tmp_path: Path, fs: FaultyFileSystem,
                                                      rules: Rules) -> None:
    rules({"op": "write", "match": "*/chk-1/*", "partial": True})
    local = tmp_path / "src"
    local.write_bytes(b"x" * 1000)
    with pytest.raises(InjectedFaultError):
        fs.put_file(str(local), str(tmp_path / "chk-1" / "big"))
    leftovers = list((tmp_path / "chk-1").iterdir())
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".big.")
    assert leftovers[0].name.endswith(".tmp") and leftovers[0].stat().st_size == 500


def test_counts_are_shared_by_processes(tmp_path: Path, fs: FaultyFileSystem,
                                        rules: Rules) -> None:
    rules({"op": "write", "match": "*/out/*", "times": 3})
    code = ("import sys, fsspec, streamer.testing.storage_faults as f\n"
            "fs = fsspec.filesystem('faulty'); failed = 0\n"
            "for i in range(2):\n"
            "    try: fs.pipe_file(sys.argv[1] + f'/out/c{i}', b'x')\n"
            "    except f.InjectedFaultError: failed += 1\n"
            "print(failed)\n")
    child = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                           text=True, env=os.environ.copy(), check=True)
    assert child.stdout.strip() == "2"
    assert attempts(lambda: fs.pipe_file(str(tmp_path / "out" / "p"), b"x"), 3) == \
        [True, False, False]
    rules({"op": "write", "match": "*/out/*", "times": 1})  # an edited rule counts afresh
    assert attempts(lambda: fs.pipe_file(str(tmp_path / "out" / "p"), b"x"), 2) == [True, False]


def test_bad_rules_are_reported(tmp_path: Path, fs: FaultyFileSystem, rules: Rules) -> None:
    rules({"op": "wirte", "match": "*"})
    with pytest.raises(ValueError, match="needs 'op'"):
        fs.cat_file(str(tmp_path / "x"))


def test_storage_over_faulty_fails_cleanly(tmp_path: Path, rules: Rules) -> None:
    store = Storage(f"faulty://{tmp_path}/store")
    (tmp_path / "local").write_bytes(b"payload")
    rules({"op": "write", "match": "*/shared/*", "times": 1})
    with pytest.raises(StorageError, match="injected fault") as info:
        store.put_file(tmp_path / "local", "shared/op/subtask-0",
                       name_from_hash=lambda sha: f"local-{sha[:16]}", overwrite=False)
    assert isinstance(info.value.__cause__, InjectedFaultError)
    assert store.ls("shared/op/subtask-0") == []
    ref = store.put_file(tmp_path / "local", "shared/op/subtask-0",
                         name_from_hash=lambda sha: f"local-{sha[:16]}", overwrite=False)
    assert store.read_bytes(ref.path) == b"payload"
    rules({"op": "read", "match": "*/_metadata"})
    store.write_atomic("chk-1/_metadata", b"m")
    with pytest.raises(StorageError, match="cannot read"):
        store.read_bytes("chk-1/_metadata")
