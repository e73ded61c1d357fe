"""Keyed state: key groups, the state-backend contract and its `memory` and `rocksdb` backends.

The runtime opens one backend per keyed subtask and task with `open_backend`, reads and writes
the epoch's state in bulk, and commits it atomically with the epoch number and outputs (see
`streamer.state.base` for the contract and `streamer.state.keygroups` for partitioning).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

from streamer.state.base import (
    BackendOptions,
    BackendStatus,
    KeyedStateBackend,
    KeyGroupEntry,
    StateDescriptor,
    StateEntry,
    StateKind,
    SubtaskLocation,
    TimeDomain,
    Timer,
)
from streamer.state.exceptions import StateError
from streamer.state.keygroups import (
    DEFAULT_MAX_PARALLELISM,
    assign_subtask,
    key_group_range,
    key_group_sql,
)

#: The backend names `open_backend` accepts.
BACKENDS = ("memory", "rocksdb")

__all__ = [
    "BACKENDS",
    "DEFAULT_MAX_PARALLELISM",
    "BackendOptions",
    "BackendStatus",
    "KeyGroupEntry",
    "KeyedStateBackend",
    "StateDescriptor",
    "StateEntry",
    "StateError",
    "StateKind",
    "SubtaskLocation",
    "TimeDomain",
    "Timer",
    "assign_subtask",
    "held_subtasks",
    "key_group_range",
    "key_group_sql",
    "open_backend",
    "release_process_state",
]


def open_backend(kind: str, root_dir: str, job: str, uid: str, subtask: int,
                 key_groups: range, *, states: Iterable[StateDescriptor] = (),
                 options: BackendOptions | None = None) -> KeyedStateBackend:
    """Open the state of subtask `subtask` of keyed operator `uid` of `job`, kept under
    `<root_dir>/<job>/<uid>/subtask-<n>/`, owning `key_groups`; declare `states`. Close it (or use
    it as a context manager) when the task is done: it holds the subtask's lock while open.
    """
    location = SubtaskLocation(str(root_dir), job, uid, subtask)
    if kind == "memory":
        from streamer.state.memory_backend import MemoryBackend

        return MemoryBackend(location, key_groups, options, states)
    if kind == "rocksdb":
        from streamer.state.rocksdb import RocksDBBackend, unpark

        parked = unpark(location.path, key_groups)
        if parked is not None:  # still open from this process's previous task of the subtask
            for descriptor in states:
                parked.declare(descriptor)
            return parked
        return RocksDBBackend(location, key_groups, options, states)
    msg = f"unknown state backend {kind!r}; use one of {', '.join(map(repr, BACKENDS))}"
    raise StateError(msg)


def held_subtasks(root_dir: str, job: str, uid: str) -> list[int]:
    """The subtasks of operator `uid` whose state this process holds open or cached (rocksdb
    handles parked between tasks, the memory backend's committed dicts), most recent last:
    a task that may choose its subtask (`runtime.subtasks.claim_subtask`) prefers these."""
    base = SubtaskLocation(str(root_dir), job, uid, 0).path.parent
    prefix = os.path.join(os.path.abspath(base), "subtask-")
    parked, cached = _held(prefix)
    return [int(path[len(prefix):]) for path in (*parked, *cached)
            if path[len(prefix):].isdigit()]


def release_process_state(root_dir: str) -> None:
    """Close what this process keeps open or cached of the subtasks under `root_dir`
    (rocksdb handles parked between tasks, the memory backend's committed dicts): the
    driver, which runs local epochs' subtasks itself, calls it when a run ends."""
    parked, cached = _held(os.path.join(os.path.abspath(root_dir), ""))
    for path in parked:
        sys.modules["streamer.state.rocksdb_parking"].release_parked(path)
    for path in cached:
        sys.modules["streamer.state.memory_files"].drop_process_cache(path)


def _held(prefix: str) -> tuple[list[str], list[str]]:
    """The subtask directories starting with `prefix` that this process holds: (parked
    rocksdb handles, cached memory-backend states), each in the order they were kept (a
    backend module never imported here holds none)."""
    parked: list[str] = []
    cached: list[str] = []
    parking = sys.modules.get("streamer.state.rocksdb_parking")
    if parking is not None:
        parked = [path for path in parking.parked_paths() if path.startswith(prefix)]
    memory = sys.modules.get("streamer.state.memory_files")
    if memory is not None:
        cached = [path for path in memory.cached_paths() if path.startswith(prefix)]
    return parked, cached
