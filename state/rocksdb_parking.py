"""**Parked between tasks, released on request.** PySpark's Python workers are not pinned to
partitions, so the next epoch of a subtask may run in another worker process; an Rdict simply
cached open in a worker holds RocksDB's LOCK and the other process fails (the measured trap in
docs/architecture.md: 82 of 160 tasks). Opening and closing the DB in every task avoided that but
cost 20-55 ms per task (flush, close, open), most of a near-empty keyed epoch. So a task of a
small epoch (`KeyedConfig.park`) that ends well *parks* the backend (`park`): it stays open in
this process, idle, and the next task of the same subtask here takes it back without opening
anything (~0.4 ms per task instead of ~40 ms, measured at load 6). Big epochs close it: there a
handoff to another worker costs more than the open it saves. A process that finds the DB locked
leaves a `RELEASE-REQUEST` file in the subtask directory; a watcher thread of the holding
process closes its parked handle (flushing, as below) within `_WATCH_S` and removes the request,
and the waiter's lock retry then succeeds. A parked handle is also closed when its directory is
gone or was replaced (a restore), and after `_PARK_IDLE_S` unused. It is only ever reused while
this process held the LOCK throughout, so it cannot be stale. The cost of the old way, measured
on the 2-core CI machine kind: opening an
existing DB costs ~7-10 ms for a small DB and ~16-24 ms with 1 M keys (bench/state_backends.py),
an empty epoch (open, commit, close) ~20 ms, against ~0.3 ms for the memory backend's cached
dicts; for a 100 k-key epoch (~420 ms in all) the open is about 5 %. What must not be paid at open
is a write-ahead-log replay: a DB closed right after a 100 k-entry commit without a flush took
~70 ms to reopen (replay + flush of the recovered memtable). So `close()` flushes the column
families written in the task (~20-70 ms for 100 k entries; rocksdict also flushes a column
family when its handle is dropped), and the next open, in whichever process, is back to the
plain open cost. A second opener of a DB that is still open gets RocksDB's lock error ("lock
hold by current process" in the same process, "While lock file ... Resource temporarily
unavailable" from another); it is retried with exponential back-off for `lock_timeout_s` and then
raised as `StateLockedError`.

This module is that mechanism and the open of a subtask's DB that asks for the release; the
backend is `rocksdb.RocksDBBackend`.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from pathlib import Path
from typing import Protocol

from rocksdict import Rdict

from streamer.state.base import wait_for_lock
from streamer.state.exceptions import CorruptStateError, StateError
from streamer.state.rocksdb_format import META, TIMERS, cf_options, db_options

_LOCK_ERROR = re.compile(r"lock file|lock hold", re.IGNORECASE)


class Parkable(Protocol):
    """What parking needs of a backend (a `rocksdb.RocksDBBackend`)."""

    #: The directory opened (a restore replaces it), and when the backend was last parked.
    dir_id: tuple[int, int] | None
    parked_at: float

    @property
    def path(self) -> Path:
        """The subtask directory."""

    def close(self) -> None:
        """Close the DB, releasing its LOCK."""


def _is_lock_error(exc: Exception) -> bool:
    return bool(_LOCK_ERROR.search(str(exc)))


#: A file a process leaves in a subtask directory whose DB another process holds open: the
#: holder's watcher closes its parked handle when it sees it.
RELEASE_REQUEST = "RELEASE-REQUEST"
#: How often the watcher looks for release requests, and how long a parked DB stays open unused.
_WATCH_S = 0.005
_PARK_IDLE_S = 120.0
#: path -> the backend parked open in this process (see the module docstring).
_PARKED: dict[str, Parkable] = {}
_PARKED_LOCK = threading.Lock()
_WATCHER: list[threading.Thread] = []
#: Set when a handle is parked: the watcher sleeps on it while nothing is, instead of waking
#: every `_WATCH_S` for the life of the worker process (0.4% of a core each, measured).
_SOMETHING_PARKED = threading.Event()


def dir_identity(path: Path) -> tuple[int, int] | None:
    """The identity of a directory (device, inode), None when it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _watch() -> None:
    """Close parked handles that another process asked for, whose directory is gone or was
    replaced, or that stayed unused for `_PARK_IDLE_S`."""
    while True:
        with _PARKED_LOCK:
            if not _PARKED:
                _SOMETHING_PARKED.clear()  # under the lock: a park after this sets it again
        _SOMETHING_PARKED.wait()
        time.sleep(_WATCH_S)
        with _PARKED_LOCK:
            parked = list(_PARKED.items())
        now = time.monotonic()
        for key, backend in parked:
            request = backend.path / RELEASE_REQUEST
            if not (os.path.exists(request) or dir_identity(backend.path) != backend.dir_id
                    or now - backend.parked_at > _PARK_IDLE_S):
                continue
            with _PARKED_LOCK:
                if _PARKED.get(key) is not backend:
                    continue  # a task took it back meanwhile
                del _PARKED[key]
            with contextlib.suppress(Exception):
                backend.close()
            with contextlib.suppress(OSError):
                os.unlink(request)


def release_parked(path: str | os.PathLike[str] | None = None) -> None:
    """Close this process's parked handle of the subtask directory `path` (or all of them)."""
    with _PARKED_LOCK:
        if path is None:
            backends = list(_PARKED.values())
            _PARKED.clear()
        else:
            found = _PARKED.pop(os.path.abspath(path), None)
            backends = [found] if found is not None else []
    for backend in backends:
        with contextlib.suppress(Exception):
            backend.close()


def parked_paths() -> list[str]:
    """The subtask directories whose DB this process keeps parked open, oldest first."""
    with _PARKED_LOCK:
        return list(_PARKED)


def take_parked(path: Path) -> Parkable | None:
    """The backend this process parked for `path`, no longer parked; None when there is none."""
    with _PARKED_LOCK:
        return _PARKED.pop(os.path.abspath(path), None)


def park_backend(backend: Parkable) -> None:
    """Keep `backend` open in this process for the next task of its subtask (started the
    watcher if needed); a handle it replaces is closed."""
    key = os.path.abspath(backend.path)
    with _PARKED_LOCK:
        previous = _PARKED.get(key)
        _PARKED[key] = backend
        _SOMETHING_PARKED.set()
        if not _WATCHER:
            _WATCHER.append(threading.Thread(target=_watch, name="rocksdb-parking",
                                             daemon=True))
            _WATCHER[0].start()
    if previous is not None and previous is not backend:
        with contextlib.suppress(Exception):
            previous.close()


def open_db(path: Path, timeout_s: float) -> tuple[Rdict, list[str]]:
    """The DB of a subtask directory (created if missing) and its column family names."""
    asked = False

    def attempt() -> tuple[Rdict, list[str]]:
        nonlocal asked
        names = {META, TIMERS}
        try:
            if (path / "CURRENT").exists():
                names.update(Rdict.list_cf(str(path), db_options()))
            names.discard("default")
            families = {name: cf_options() for name in names}
            return Rdict(str(path), db_options(), column_families=families), sorted(names)
        except Exception as exc:
            if _is_lock_error(exc):
                if "current process" in str(exc):
                    release_parked(path)  # parked here (same process): close it now
                else:  # parked in another process: ask its watcher to close it (again, if
                    # the holder took it back for a task and answered an earlier request)
                    with contextlib.suppress(OSError):
                        (path / RELEASE_REQUEST).touch()
                    asked = True
            raise

    try:
        found = wait_for_lock(attempt, _is_lock_error, timeout_s, path)
        if asked:
            with contextlib.suppress(OSError):
                (path / RELEASE_REQUEST).unlink()
        return found
    except StateError:
        raise
    except Exception as exc:
        msg = (f"cannot open the RocksDB state in {str(path)!r}: {exc}; if it is damaged, delete "
               "the subtask directory and restore from a checkpoint")
        raise CorruptStateError(msg) from exc
