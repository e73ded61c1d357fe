"""Keyed subtasks that move between executors (runtime/cluster/placement.py,
checkpoint/task.py): each executor has its own directories; a subtask that finds only an
outdated version of its state where it lands restores the checkpoint's, and one whose state is
really behind still fails with STATE_BEHIND. Real backends on tmp_path, real snapshots."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from streamer.checkpoint import task as checkpointing
from streamer.checkpoint.task import STATE_BEHIND, TaskCheckpointing
from streamer.operators.executor import executor_identity, scoped
from streamer.runtime.cluster.placement import Placement, on_cluster
from streamer.state import StateDescriptor, open_backend
from streamer.state.codec import encode_key
from streamer.state.snapshot import take_snapshot

KG = range(128)


@dataclass(frozen=True)
class Cfg:
    """The two fields of a KeyedConfig that `scoped` changes."""

    state_root: str
    checkpointing: Any


def commit_epochs(root: Path, kind: str, last: int) -> Any:
    """A subtask's state committed through epoch `last` (one key per epoch); left open."""
    backend = open_backend(kind, str(root), "job", "op", 0, KG,
                           states=[StateDescriptor("acc", "value")])
    for n in range(1, last + 1):
        backend.put("acc", 5, encode_key((f"k{n}",)), b"", n)
        backend.commit(n)
    return backend


def config(state_root: Path, epoch: int, last: dict[int, dict[str, Any]], url: str,
           copies: Path) -> Any:
    chk = TaskCheckpointing(url=url, local_copy_root=str(copies), first_epoch=1, last=last)
    return SimpleNamespace(state_root=str(state_root), job="job", uid="op", epoch=epoch,
                           checkpointing=chk, backend="rocksdb")


@pytest.mark.parametrize("kind", ["rocksdb", "memory"])
def test_an_outdated_copy_is_replaced_by_the_checkpoint(tmp_path: Path, kind: str) -> None:
    url, copies = str(tmp_path / "checkpoints"), tmp_path / "copies" / "executor-b"
    # Executor a ran epochs 1-5 and checkpointed epoch 5; executor b last ran epoch 2.
    with commit_epochs(tmp_path / "a", kind, 5) as on_a:
        handle = take_snapshot(on_a, url, 5, base=None, local_copy_root=None)
    commit_epochs(tmp_path / "b", kind, 2).close()
    cfg = config(tmp_path / "b", 6, {0: handle}, url, copies)
    cfg.backend = kind
    assert checkpointing.outdated(cfg, 0, 2)
    info = checkpointing.prepare(cfg, 0, replace=True)
    assert info["restored"] == "remote" and info["restored_from"] == 5
    with open_backend(kind, str(tmp_path / "b"), "job", "op", 0, KG,
                      states=[StateDescriptor("acc", "value")]) as on_b:
        assert on_b.version() == 5
        assert on_b.get("acc", 5, encode_key(("k4",)), b"") == 4
        checkpointing.check_version(cfg, 0, on_b.version())  # no STATE_BEHIND


def test_current_or_unrestorable_state_is_not_outdated(tmp_path: Path) -> None:
    url = str(tmp_path / "checkpoints")
    with commit_epochs(tmp_path / "a", "rocksdb", 3) as on_a:
        handle = take_snapshot(on_a, url, 1, base=None, local_copy_root=None)
    cfg = config(tmp_path / "b", 4, {0: handle}, url, tmp_path / "copies")
    assert not checkpointing.outdated(cfg, 0, 3)  # exactly the epoch before: used as is
    assert not checkpointing.outdated(cfg, 0, None)  # nothing here: `prepare` restores
    # The checkpoint (version 3) is no newer than what is here: state really is behind.
    cfg = config(tmp_path / "b", 6, {0: handle}, url, tmp_path / "copies")
    assert not checkpointing.outdated(cfg, 0, 3)
    with pytest.raises(RuntimeError, match=STATE_BEHIND):
        checkpointing.check_version(cfg, 0, 3)


def test_executors_get_their_own_directories(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_EXECUTOR_DIRS", "/tmp/spark-1/executor-a")
    first = executor_identity()
    monkeypatch.setenv("SPARK_EXECUTOR_DIRS", "/tmp/spark-1/executor-b")
    second = executor_identity()
    assert first != second
    assert executor_identity() == second  # stable within an executor
    placed = scoped(Cfg("/s/job/run", TaskCheckpointing(
        url="u", local_copy_root="/s/.local-recovery", first_epoch=1)), first)
    assert placed.state_root == f"/s/job/run/executor-{first}"
    assert placed.checkpointing.local_copy_root == f"/s/.local-recovery/executor-{first}"


def test_moves_are_counted_per_operator() -> None:
    placement = Placement()
    assert placement.update("w", [{"subtask": 0, "executor": "a"},
                                  {"subtask": 1, "executor": "b"}]) == 0
    assert placement.update("w", [{"subtask": 0, "executor": "b"},
                                  {"subtask": 1, "executor": "a"}]) == 2
    assert placement.update("w", [{"subtask": 0, "executor": "b"},
                                  {"subtask": 1, "executor": "b"}]) == 1
    assert placement.update("other", [{"subtask": 0, "executor": "a"}]) == 0
    assert placement.executors() == {"a", "b"}


def test_which_masters_are_clusters() -> None:
    assert not on_cluster(None) and not on_cluster("local") and not on_cluster("local[2]")
    assert not on_cluster("local[*]")
    assert on_cluster("spark://127.0.0.1:7077") and on_cluster("local-cluster[2,1,1024]")
    assert on_cluster("yarn") and on_cluster("k8s://https://host:6443")
