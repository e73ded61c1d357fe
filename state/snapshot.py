"""Snapshots of one subtask's keyed state to checkpoint storage, and restores from them.

A Spark task calls `take_snapshot` right after `backend.commit(epoch)` on a checkpoint epoch,
with the backend still open; `restore_snapshot` rebuilds a subtask's working directory from the
returned **handle** (a JSON-able dict the coordinator keeps in the checkpoint's `_metadata`).

**Layout** under the storage URL the coordinator passes (the job's checkpoint root,
`<storage>/<job>/checkpoints`)::

    shared/<uid>/subtask-<k>/<name>-<sha256[:16]>.sst   files several checkpoints may reference
    chk-<n>/<uid>/subtask-<k>/<name>                      files only checkpoint n uses

Shared files are immutable RocksDB SSTs. They are named by content, so a shared file is never
overwritten: after a restore from an older checkpoint RocksDB may reuse an SST file number for
different content, which gets a different name. Everything else (RocksDB's MANIFEST, CURRENT,
OPTIONS and write-ahead log; the memory backend's full snapshot file) is private.

**rocksdb is incremental.** `backend.local_checkpoint` makes a consistent local copy (RocksDB's
checkpoint: flush, then hard links). Every SST that the previous completed checkpoint of the
subtask (`base`) already holds under the same name and size is referenced, not uploaded again;
new SSTs go to `shared/`. When the local copy of `base` is still there, "the same SST" is also
checked by identity (same inode, or else the same sha256), which guards against a `base` the
working state does not descend from. **memory** uploads one full snapshot file per checkpoint.

**Local recovery.** With a `local_copy_root`, the local copy stays at
`<local_copy_root>/<job>/<uid>/subtask-<k>/chk-<n>/` (hard links: cheap). `restore_snapshot`
uses it when every file is there with the handle's size and sha256, and otherwise downloads every
file, verifying size and sha256. Keep `local_copy_root` on the file system of the state root
(hard links) and outside it (a restore empties the subtask directory).

**Failures.** Nothing is ever partially written at a final name (see `streamer.storage`). A
failed upload raises `SnapshotError` (the working state and earlier checkpoints are untouched;
files this attempt uploaded are left for the coordinator's clean-up of unreferenced files, since a
concurrent attempt may reference the same content-named file). Uploads past `deadline` raise
`SnapshotTimeoutError`. A damaged or missing file in storage raises `CorruptSnapshotError`
naming the checkpoint, operator, subtask and file.

Handle (format 1)::

    {"format": 1, "backend": "rocksdb", "uid": "counts", "subtask": 0, "version": 12,
     "key_groups": [0, 64],            # [start, stop): range(*handle["key_groups"])
     "checkpoint_id": 3,
     "files": [{"name": "000012.sst",  # the local file name
                "path": "shared/counts/subtask-0/000012-0123456789abcdef.sst",
                "size": 1059, "sha256": "...", "shared": true,
                "uploaded": true}],    # false: referenced from `base`, not sent now
     "state_size": 1059,               # bytes of all files
     "uploaded_bytes": 1059,           # bytes sent by this snapshot
     "keys": {"counts": 1000},         # entries per state (rocksdb: an estimate)
     "duration_ms": 12.5}
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from streamer.state.base import KeyedStateBackend, SubtaskLocation
from streamer.state.exceptions import (
    CorruptSnapshotError,
    SnapshotError,
    SnapshotTimeoutError,
    StateError,
)
from streamer.storage import (
    CorruptFileError,
    MissingFileError,
    Storage,
    StorageError,
    sha256_file,
)

#: The handle format `take_snapshot` writes and `restore_snapshot` reads.
FORMAT = 1
#: The storage directory of files several checkpoints may reference.
SHARED = "shared"

_CHK_DIR = re.compile(r"^chk-(\d+)$")
_STALE_TEMP_S = 3600.0
_HANDLE_KEYS = ("backend", "uid", "subtask", "version", "checkpoint_id", "files")


# ------------------------------------------------------------------------------ paths
def private_dir(checkpoint_id: int, uid: str, subtask: int) -> str:
    """The storage-relative directory of a subtask's files that only one checkpoint uses."""
    return f"chk-{checkpoint_id}/{uid}/subtask-{subtask}"


def shared_dir(uid: str, subtask: int) -> str:
    """The storage-relative directory of a subtask's files several checkpoints may use."""
    return f"{SHARED}/{uid}/subtask-{subtask}"


def shared_name(name: str, sha256: str) -> str:
    """The content-derived name of an uploaded shared file (`000012.sst` ->
    `000012-<first 16 hex of its sha256>.sst`).
    """
    stem, ext = os.path.splitext(name)
    return f"{stem}-{sha256[:16]}{ext}"


def local_copy_dir(local_copy_root: str | os.PathLike[str], job: str, uid: str, subtask: int,
                   checkpoint_id: int) -> Path:
    """Where `take_snapshot` keeps the local recovery copy of a subtask's checkpoint."""
    return Path(local_copy_root) / job / uid / f"subtask-{subtask}" / f"chk-{checkpoint_id}"


def referenced_files(handle: dict[str, Any]) -> set[str]:
    """The storage-relative paths of every file a handle references (shared and private)."""
    return {str(entry["path"]) for entry in handle.get("files", [])}


# ------------------------------------------------------------------------------ helpers
def _where(checkpoint_id: Any, uid: Any, subtask: Any) -> str:
    return f"checkpoint {checkpoint_id} of operator {uid!r} subtask {subtask}"


def _backend_class(name: Any) -> type[KeyedStateBackend]:
    if name == "rocksdb":
        from streamer.state.rocksdb import RocksDBBackend

        return RocksDBBackend
    if name == "memory":
        from streamer.state.memory_backend import MemoryBackend

        return MemoryBackend
    msg = f"a state handle names unknown backend {name!r}; use 'memory' or 'rocksdb'"
    raise SnapshotError(msg)


def _check_handle(handle: Any) -> list[dict[str, Any]]:
    """The files of a handle, after checking its shape."""
    if not isinstance(handle, dict) or handle.get("format") != FORMAT:
        found = handle.get("format") if isinstance(handle, dict) else type(handle).__name__
        msg = (f"not a state handle of format {FORMAT} (got format {found!r}); it was written by "
               "another streamer version or is not a handle")
        raise SnapshotError(msg)
    where = _where(handle.get("checkpoint_id"), handle.get("uid"), handle.get("subtask"))
    missing = [key for key in _HANDLE_KEYS if key not in handle]
    files = handle.get("files")
    if missing or not isinstance(files, list):
        msg = f"the state handle of {where} lacks {', '.join(missing) or 'a file list'}"
        raise SnapshotError(msg)
    for entry in files:
        if not isinstance(entry, dict) or not {"name", "path", "size", "sha256"} <= set(entry) \
                or os.path.basename(str(entry["name"])) != entry["name"] \
                or entry["name"] in ("", ".", ".."):
            msg = f"the state handle of {where} has a malformed file entry {entry!r}"
            raise SnapshotError(msg)
    return files


def _check_deadline(deadline: float | None, where: str, done: int, total: int) -> None:
    if deadline is not None and time.monotonic() > deadline:
        msg = (f"{where}: the snapshot ran past its deadline after uploading {done} of {total} "
               "files; the checkpoint is declined (give checkpoints more time)")
        raise SnapshotTimeoutError(msg)


def _remove_tree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _same_content(file: Path, entry: dict[str, Any], base_copy: Path | None) -> bool:
    """Whether the local `file` is the file `entry` of the base handle describes: the same name
    and size, and, when the base's local copy is there, the same inode or else the same sha256.
    """
    if entry.get("name") != file.name or int(entry.get("size", -1)) != file.stat().st_size:
        return False
    if base_copy is None:
        return True
    previous = base_copy / file.name
    try:
        if os.path.samefile(previous, file):
            return True
    except OSError:  # the base copy no longer holds it: fall back to name and size
        return True
    return sha256_file(file) == entry.get("sha256")


# ------------------------------------------------------------------------------ snapshot
def take_snapshot(backend: KeyedStateBackend, storage_url: str, checkpoint_id: int, *,
                  base: dict[str, Any] | None, local_copy_root: str | None,
                  deadline: float | None = None,
                  after_upload: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Snapshot the committed state of an open backend as part of checkpoint `checkpoint_id`
    and return its handle. `base` is the handle of the subtask's previous completed checkpoint
    (rocksdb reuses its shared files; None uploads everything); `local_copy_root` keeps a local
    recovery copy; `deadline` is a `time.monotonic()` value after which uploads stop with
    `SnapshotTimeoutError`; `after_upload` is called with each file entry once it is uploaded.
    """
    started = time.monotonic()
    location = backend.location
    uid, subtask = location.uid, location.subtask
    where = _where(checkpoint_id, uid, subtask)

    # 1. Check: a committed version, a valid id, a base of this subtask's kind and lineage.
    version = backend.version()
    if version is None:
        msg = f"{where}: the state has no committed version; commit the epoch before snapshotting"
        raise SnapshotError(msg)
    if not isinstance(checkpoint_id, int) or isinstance(checkpoint_id, bool) or checkpoint_id < 0:
        msg = f"checkpoint id must be a non-negative int, got {checkpoint_id!r}"
        raise SnapshotError(msg)
    base_files: dict[str, dict[str, Any]] = {}
    base_copy: Path | None = None
    if base is not None:
        for entry in _check_handle(base):
            if entry.get("shared"):
                base_files[entry["name"]] = entry
        if (base["backend"], base["uid"], base["subtask"]) != (backend.name, uid, subtask):
            msg = (f"{where}: the base handle is of {base['backend']!r} operator "
                   f"{base['uid']!r} subtask {base['subtask']}, not of this {backend.name!r} "
                   "subtask; pass the handle of this subtask's last completed checkpoint")
            raise SnapshotError(msg)
        if base["version"] > version:
            msg = (f"{where}: the state is at version {version}, older than the base checkpoint "
                   f"(version {base['version']}), so it does not descend from it; pass the "
                   "handle of the checkpoint the state was restored from")
            raise SnapshotError(msg)
        if local_copy_root is not None:
            candidate = local_copy_dir(local_copy_root, location.job, uid, subtask,
                                       int(base["checkpoint_id"]))
            base_copy = candidate if candidate.is_dir() else None
    _check_deadline(deadline, where, 0, 0)
    try:
        storage = Storage(storage_url)
    except StorageError as exc:
        msg = f"{where}: {exc}"
        raise SnapshotError(msg) from exc

    # 2. A consistent local copy of the committed state, in a staging directory on the state's
    #    file system (rocksdb hard-links its SSTs).
    if local_copy_root is not None:
        keep = local_copy_dir(local_copy_root, location.job, uid, subtask, checkpoint_id)
        staging = keep.with_name(f".{keep.name}.{uuid.uuid4().hex[:12]}.tmp")
    else:
        keep = None
        staging = location.path.parent / \
            f".snapshot-{location.path.name}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        staging.parent.mkdir(parents=True, exist_ok=True)
        try:
            local_files = backend.local_checkpoint(staging)
            keys = backend.key_counts()
        except SnapshotError:
            raise
        except (StateError, OSError) as exc:
            msg = f"{where}: cannot make a local copy of the state: {exc}"
            raise SnapshotError(msg) from exc

        # 3. Reference what the base already holds; upload the rest (new shared files under a
        #    content name, never overwriting; private files under chk-<n>/).
        entries: list[dict[str, Any]] = []
        uploaded_bytes = 0
        for done, file in enumerate(local_files):
            shared = backend.immutable_file(file.name)
            previous = base_files.get(file.name) if shared else None
            if previous is not None and _same_content(file, previous, base_copy):
                entries.append({"name": file.name, "path": previous["path"],
                                "size": int(previous["size"]), "sha256": previous["sha256"],
                                "shared": True, "uploaded": False})
                continue
            _check_deadline(deadline, where, done, len(local_files))
            try:
                if shared:
                    ref = storage.put_file(file, shared_dir(uid, subtask), overwrite=False,
                                           name_from_hash=functools.partial(shared_name,
                                                                            file.name))
                else:
                    ref = storage.put_file(
                        file, f"{private_dir(checkpoint_id, uid, subtask)}/{file.name}")
            except StorageError as exc:
                msg = f"{where}: cannot upload {file.name!r}: {exc}"
                raise SnapshotError(msg) from exc
            entry = {"name": file.name, "path": ref.path, "size": ref.size,
                     "sha256": ref.sha256, "shared": shared, "uploaded": True}
            entries.append(entry)
            uploaded_bytes += ref.size if ref.written else 0
            if after_upload is not None:
                after_upload(entry)
            from streamer import failpoints  # crash tests: die with a partial upload

            failpoints.reached("mid-upload", checkpoint_id)

        # 4. Keep the local copy for local recovery (replacing one of an earlier attempt).
        if keep is not None:
            try:
                if keep.exists():
                    _remove_tree(keep)
                os.rename(staging, keep)
            except OSError as exc:
                msg = f"{where}: cannot keep the local recovery copy in {str(keep)!r}: {exc}"
                raise SnapshotError(msg) from exc
    finally:
        with contextlib.suppress(OSError):
            if staging.exists():
                _remove_tree(staging)

    # 5. The handle.
    return {
        "format": FORMAT,
        "backend": backend.name,
        "uid": uid,
        "subtask": subtask,
        "version": version,
        "key_groups": [backend.key_groups.start, backend.key_groups.stop],
        "checkpoint_id": checkpoint_id,
        "files": entries,
        "state_size": sum(entry["size"] for entry in entries),
        "uploaded_bytes": uploaded_bytes,
        "keys": keys,
        "duration_ms": round((time.monotonic() - started) * 1000, 1),
    }


# ------------------------------------------------------------------------------ restore
def _local_copy_intact(copy: Path, files: list[dict[str, Any]]) -> bool:
    """Whether `copy` holds every file of the handle with its size and sha256."""
    for entry in files:
        file = copy / entry["name"]
        try:
            if not file.is_file() or file.stat().st_size != int(entry["size"]):
                return False
            if sha256_file(file) != entry["sha256"]:
                return False
        except OSError:
            return False
    return True


def _link_or_copy(source: Path, target: Path, link: bool) -> None:
    if link:
        try:
            os.link(source, target)
            return
        except OSError:
            pass  # another file system, or links not supported: copy
    shutil.copyfile(source, target)


def _download(storage_url: str, files: list[dict[str, Any]], directory: Path,
              where: str) -> None:
    """Download every file of a handle into `directory`, each verified."""
    try:
        storage = Storage(storage_url)
    except StorageError as exc:
        msg = f"{where}: {exc}"
        raise SnapshotError(msg) from exc
    for entry in files:
        try:
            storage.get_file(entry["path"], directory / entry["name"], size=int(entry["size"]),
                             sha256=str(entry["sha256"]))
        except (CorruptFileError, MissingFileError) as exc:
            msg = (f"{where}: file {entry['name']!r} ({entry['path']}) cannot be used: {exc}; "
                   "restore from an earlier checkpoint")
            raise CorruptSnapshotError(msg) from exc
        except StorageError as exc:
            msg = f"{where}: cannot download {entry['name']!r}: {exc}"
            raise SnapshotError(msg) from exc


def restore_snapshot(handle: dict[str, Any], storage_url: str, target: SubtaskLocation, *,
                     local_copy_root: str | None) -> Literal["local", "remote"]:
    """Rebuild the working directory of `target` from a snapshot handle, replacing whatever is
    there (the subtask must not be open). Uses the local recovery copy when it is intact
    ("local"), else downloads every file, verifying size and sha256 ("remote").
    """
    files = _check_handle(handle)
    backend_class = _backend_class(handle["backend"])
    where = _where(handle["checkpoint_id"], handle["uid"], handle["subtask"])
    path = target.path
    copy = None
    if local_copy_root is not None:
        copy = local_copy_dir(local_copy_root, target.job, handle["uid"], handle["subtask"],
                              int(handle["checkpoint_id"]))
        if copy.resolve().is_relative_to(path.resolve()):
            msg = (f"{where}: the local copy root {local_copy_root!r} lies inside the subtask "
                   f"directory {str(path)!r}, which a restore empties; keep local copies apart "
                   "from the state root")
            raise SnapshotError(msg)

    # 1. Empty the target; the new directory is built aside and renamed into place.
    if handle["backend"] == "rocksdb":
        from streamer.state.rocksdb_parking import release_parked

        release_parked(path)  # a handle this process kept open on the directory replaced
    try:
        if path.exists() or path.is_symlink():
            _remove_tree(path)
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        msg = f"{where}: cannot clear the state directory {str(path)!r}: {exc}"
        raise SnapshotError(msg) from exc
    if handle["backend"] == "memory":
        from streamer.state.memory_files import drop_process_cache

        drop_process_cache(path)
    staging = path.with_name(f".restore-{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        staging.mkdir()
        how: Literal["local", "remote"] = "remote"
        # 2. From the local copy: link the immutable files, copy those the backend may change.
        if copy is not None and copy.is_dir() and _local_copy_intact(copy, files):
            try:
                for entry in files:
                    _link_or_copy(copy / entry["name"], staging / entry["name"],
                                  backend_class.immutable_file(entry["name"]))
                how = "local"
            except OSError:
                _remove_tree(staging)
                staging.mkdir()
        # 3. Or from storage, every file verified.
        if how == "remote":
            _download(storage_url, files, staging, where)
        # 4. Into place.
        os.rename(staging, path)
    except OSError as exc:
        msg = f"{where}: cannot restore into {str(path)!r}: {exc}"
        raise SnapshotError(msg) from exc
    finally:
        with contextlib.suppress(OSError):
            if staging.exists():
                _remove_tree(staging)
    return how


def prune_local_copies(local_copy_root: str | os.PathLike[str], job: str, uid: str,
                       subtask: int, keep: set[int]) -> None:
    """Delete a subtask's local recovery copies except those of the checkpoints in `keep` (and
    staging directories left over for more than an hour by attempts that died).
    """
    directory = Path(local_copy_root) / job / uid / f"subtask-{subtask}"
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return
    now = time.time()
    for entry in entries:
        match = _CHK_DIR.match(entry.name)
        with contextlib.suppress(OSError):
            unwanted = match is not None and int(match.group(1)) not in keep
            stale = (entry.name.startswith(".chk-") and entry.name.endswith(".tmp")
                     and now - entry.stat().st_mtime > _STALE_TEMP_S)
            if unwanted or stale:
                _remove_tree(entry)
