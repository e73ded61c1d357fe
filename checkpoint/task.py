"""The keyed subtask's side of checkpoints, run inside its Spark task (operators/keyed.py).

Per task, around the epoch's work:
1. `prepare`: a subtask whose working state is missing (a new run attempt, or a task that
   landed where its state is not) restores it from the latest completed checkpoint: from the
   local recovery copy when it is intact, else from checkpoint storage (checksums verified).
   So does one whose state is `outdated`: older than the checkpoint, left by an earlier
   epoch on an executor the subtask has since moved away from (runtime/cluster/placement.py).
2. `check_version`: the working state must be exactly at the previous epoch. If it is behind
   (its state was lost after the last checkpoint), the task fails with `STATE_BEHIND`, and the
   driver restarts the job from that checkpoint: sources rewind, every subtask restores.
3. `snapshot_batch`: on a checkpoint epoch, after the state commit, the subtask snapshots its
   state to checkpoint storage (incremental for rocksdb) and reports the handle in a meta row.
   A failed or timed-out upload is reported in the meta row, not raised: the driver declines
   that checkpoint and the job keeps running.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamer.columns import META, ROW_KIND, ROW_META
from streamer.exceptions import StreamerError

STATE_BEHIND = "streamer-state-behind"
#: Starts the message of a subtask's failed restore. Keyed tasks run inside the Spark job of
#: whatever consumes them (often a sink's write); the driver finds this text in Spark's error
#: and reports the epoch as failed restoring the operator's subtask instead.
RESTORE_ERROR_MARKER = "streamer-restore-error: "


class SubtaskRestoreError(StreamerError):
    """Raised in a keyed task when its subtask's state cannot be restored from a checkpoint
    or savepoint (a file missing or corrupt, storage unreachable). The message names the
    operator uid and subtask and the cause; a corrupt checkpoint makes the job fall back to
    the previous one, otherwise check the storage and run the job again."""


@dataclass(frozen=True)
class TaskCheckpointing:
    """What a keyed task needs to know about checkpoints (picklable, shipped per epoch)."""

    #: The job's checkpoint root (`<storage>/<job>/checkpoints`).
    url: str
    #: Where subtasks keep local recovery copies of their snapshots.
    local_copy_root: str | None
    #: The first epoch of this run attempt (state must be fresh or restored before it).
    first_epoch: int
    #: subtask -> state handle in the latest completed checkpoint (restore source, and the
    #: base of incremental snapshots).
    last: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: The checkpoint this epoch ends, or None.
    snapshot_id: int | None = None
    #: Wall-clock time (s) after which the snapshot gives up.
    deadline: float | None = None
    #: Checkpoint ids whose local copies to keep (besides the new one).
    keep_local: tuple[int, ...] = ()
    #: This epoch also writes a savepoint here (canonical state per key group).
    savepoint_url: str | None = None
    #: Start from a savepoint: {"url": ..., "files": [...]} of this operator.
    savepoint_restore: dict[str, Any] | None = None


def _handle_file(state_root: str, job: str, uid: str, subtask: int, cid: int) -> Path:
    return Path(state_root) / job / uid / f"subtask-{subtask}.snapshots" / f"chk-{cid}.json"


def prepare(cfg: Any, subtask: int, *, replace: bool = False) -> dict[str, Any]:
    """Restore the subtask's working state if it has none (or, with `replace`, over an
    outdated one) and a checkpoint has it."""
    chk: TaskCheckpointing | None = cfg.checkpointing
    if chk is None:
        return {}
    from streamer.state import SubtaskLocation

    location = SubtaskLocation(cfg.state_root, cfg.job, cfg.uid, subtask)
    if not replace and location.path.exists() and any(location.path.iterdir()):
        return {}
    try:
        return _restore(cfg, chk, subtask, location)
    except Exception as exc:
        msg = (f"{RESTORE_ERROR_MARKER}operator {cfg.uid!r} subtask {subtask}: "
               f"{type(exc).__name__}: {exc}")
        raise SubtaskRestoreError(msg) from exc


def _restore(cfg: Any, chk: TaskCheckpointing, subtask: int, location: Any) -> dict[str, Any]:
    """Restore from the subtask's handle in the latest checkpoint, or from a savepoint."""
    handle = chk.last.get(subtask)
    if handle is None and chk.savepoint_restore is not None:
        return _restore_savepoint(cfg, chk, subtask)
    if handle is None:
        return {}
    from streamer.state.snapshot import restore_snapshot

    started = time.monotonic()
    how = restore_snapshot(handle, chk.url, location, local_copy_root=chk.local_copy_root)
    return {"restored": how, "restore_ms": round((time.monotonic() - started) * 1000, 1),
            "restored_from": handle.get("checkpoint_id")}


def _restore_savepoint(cfg: Any, chk: TaskCheckpointing, subtask: int) -> dict[str, Any]:
    """Fill the subtask's empty working state with its key groups from a savepoint (any
    parallelism and backend wrote it) and commit it as the epoch before the first."""
    from streamer.savepoint.format import restore_key_groups
    from streamer.state import key_group_range, open_backend

    assert chk.savepoint_restore is not None
    started = time.monotonic()
    groups = key_group_range(subtask, cfg.parallelism, cfg.max_parallelism)
    with open_backend(cfg.backend, cfg.state_root, cfg.job, cfg.uid, subtask, groups) as backend:
        counts = restore_key_groups(chk.savepoint_restore["url"], chk.savepoint_restore["files"],
                                    backend, groups,
                                    states=chk.savepoint_restore.get("states") or None)
        backend.commit(chk.first_epoch - 1)
    return {"restored": "savepoint", "restore_ms": round((time.monotonic() - started) * 1000, 1),
            "restored_entries": counts}


def has_checkpoint(cfg: Any, subtask: int) -> bool:
    """Whether the latest completed checkpoint holds the subtask's state."""
    chk: TaskCheckpointing | None = cfg.checkpointing
    return chk is not None and subtask in chk.last


def outdated(cfg: Any, subtask: int, done: int | None) -> bool:
    """Whether the working state (at epoch `done`) is older than the epoch before this one
    while the latest checkpoint holds a newer version: the subtask ran elsewhere since it
    left this state (on a cluster, another executor), and restores instead."""
    chk: TaskCheckpointing | None = cfg.checkpointing
    if chk is None or done is None or done >= cfg.epoch - 1:
        return False
    handle = chk.last.get(subtask)
    return handle is not None and int(handle.get("version", -1)) > done


def check_version(cfg: Any, subtask: int, done: int | None) -> None:
    """Fail with STATE_BEHIND unless the working state is at the epoch before this one."""
    chk: TaskCheckpointing | None = cfg.checkpointing
    if chk is None:
        return
    expected: int | None = cfg.epoch - 1
    if cfg.epoch == chk.first_epoch and subtask not in chk.last and (
            chk.savepoint_restore is None):
        expected = None  # a fresh start (or a new operator)
    if done != expected and not (expected == 0 and done is None):
        msg = (f"{STATE_BEHIND}: state of {cfg.uid!r} subtask {subtask} is at epoch {done}, "
               f"epoch {cfg.epoch} needs it at {expected}; restart from the last checkpoint")
        raise RuntimeError(msg)


def snapshot_batch(cfg: Any, backend: Any, subtask: int, info: dict[str, Any]) -> Any:
    """On a checkpoint epoch: snapshot the committed state, return a meta-only batch with
    the handle (or the error); otherwise a meta batch only if there is restore info."""
    chk: TaskCheckpointing | None = cfg.checkpointing
    meta: dict[str, Any] = {"subtask": subtask, **info}
    if chk is not None and chk.snapshot_id is not None:
        cid = chk.snapshot_id
        saved = _handle_file(cfg.state_root, cfg.job, cfg.uid, subtask, cid)
        try:
            if saved.exists():  # a second evaluation of the epoch: report the same handle
                meta["snapshot"] = json.loads(saved.read_text())
            elif backend.version() != cfg.epoch:
                meta["snapshot_error"] = (f"state is at epoch {backend.version()}, not "
                                          f"{cfg.epoch}")
            else:
                from streamer.state.snapshot import prune_local_copies, take_snapshot

                deadline = None
                if chk.deadline is not None:
                    deadline = time.monotonic() + (chk.deadline - time.time())
                began = time.perf_counter()
                handle = take_snapshot(backend, chk.url, cid, base=chk.last.get(subtask),
                                       local_copy_root=chk.local_copy_root, deadline=deadline)
                meta["snapshot_ms"] = round((time.perf_counter() - began) * 1000, 3)
                saved.parent.mkdir(parents=True, exist_ok=True)
                tmp = saved.with_suffix(".tmp")
                tmp.write_text(json.dumps(handle))
                os.replace(tmp, saved)
                meta["snapshot"] = handle
                if chk.local_copy_root:
                    prune_local_copies(chk.local_copy_root, cfg.job, cfg.uid, subtask,
                                       {*chk.keep_local, cid})
        except Exception as exc:  # reported; the driver declines the checkpoint
            meta["snapshot_error"] = f"{type(exc).__name__}: {exc}"
        if chk.savepoint_url is not None and "snapshot" in meta:
            meta.update(_savepoint(cfg, chk, backend, subtask))
    if len(meta) == 1:
        return None
    import pyarrow as pa

    return pa.RecordBatch.from_pylist([{ROW_KIND: META, ROW_META: json.dumps(meta)}],
                                      schema=cfg.out_schema)


def _savepoint(cfg: Any, chk: TaskCheckpointing, backend: Any, subtask: int) -> dict[str, Any]:
    """Write the subtask's key groups into the savepoint (once per savepoint and subtask)."""
    import hashlib

    assert chk.savepoint_url is not None
    tag = hashlib.sha256(chk.savepoint_url.encode()).hexdigest()[:16]
    saved = _handle_file(cfg.state_root, cfg.job, cfg.uid, subtask, 0).with_name(f"sp-{tag}.json")
    try:
        if saved.exists():
            return {"savepoint": json.loads(saved.read_text())}
        if backend.version() != cfg.epoch:
            return {"savepoint_error": f"state is at epoch {backend.version()}, not {cfg.epoch}"}
        from streamer.savepoint.format import write_key_groups

        handle = write_key_groups(backend, chk.savepoint_url, cfg.uid, subtask)
        saved.parent.mkdir(parents=True, exist_ok=True)
        tmp = saved.with_suffix(".tmp")
        tmp.write_text(json.dumps(handle))
        os.replace(tmp, saved)
        return {"savepoint": handle}
    except Exception as exc:
        return {"savepoint_error": f"{type(exc).__name__}: {exc}"}
